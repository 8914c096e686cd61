"""What each DynamoDB call a function made touched, as facts AWS bills on (``bench cost`` prices them).

Imported by the sandbox's bootstrap (``worker.py``) when the harness turns capture on, and by tests. For each
call it records the operation, its parameters, the error code if it failed, and the *full* items behind it:

* a write (``PutItem``, ``UpdateItem``, ``DeleteItem``, ``BatchWriteItem``, ``TransactWriteItems``): each
  target item as stored before and after the call (``images``: ``[before, after]``, ``None`` for absent), read
  with a consistent ``GetItem`` around it, off the books. AWS bills a write on the larger of the two and an
  index on the entries the change adds, moves or removes, which the request alone does not tell;
* a read (``GetItem``, ``BatchGetItem``, ``TransactGetItems``, ``Query``, ``Scan``): the items as stored
  (``items``), re-read without the call's projection or filter, because AWS bills the whole item (or the
  whole index entry) it evaluated, not the attributes returned.

The images are exact when no other writer changes the item between the reads around the call (the arcs
``bench cost`` runs write a session from one function at a time). Values go out JSON-able: binary values as
``{"$b64": ...}``. The extra reads are made only while capturing,
so they never reach a measured duration (``bench cost`` times a round without capture).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

Call = Callable[[str, dict[str, Any]], Any]
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
READS = {"GetItem", "BatchGetItem", "TransactGetItems", "Query", "Scan"}
_schemas: dict[str, list[str]] = {}


def recorded(client: Any, monkeypatch: Any) -> list[dict[str, Any]]:
    """Every DynamoDB call made through ``client`` from now on (until ``monkeypatch`` is undone), recorded as
    ``observe`` records it: what a test bills with ``bench.units``."""
    records: list[dict[str, Any]] = []
    original = client._make_api_call

    def observed(operation: str, params: dict[str, Any]) -> Any:
        return observe(original, operation, params, records.append)

    monkeypatch.setattr(client, "_make_api_call", observed)
    return records


def observe(call: Call, operation: str, params: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> Any:
    """Make the call through ``call`` and ``emit`` its record; the call's answer (or error) is passed on."""
    if operation not in WRITES | READS:
        return call(operation, params)
    record: dict[str, Any] = {"operation": operation, "params": plain(params), "error": None}
    targets = _targets(call, operation, params) if operation in WRITES else []
    before = [_get(call, table, key) for table, key in targets]
    try:
        answer = call(operation, params)
    except Exception as exc:
        record["error"] = str(getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__)
        if operation in WRITES:
            record["images"] = [[b, b] for b in before]  # nothing applied
        emit(record)
        raise
    if operation in WRITES:
        record["images"] = [[b, _get(call, table, key)] for b, (table, key) in zip(before, targets, strict=True)]
    else:
        record["items"] = _read_items(call, operation, params, answer)
        if operation == "BatchGetItem":  # the table of each item found, in the same order
            record["tables"] = [t for t in params["RequestItems"] for _ in answer.get("Responses", {}).get(t, [])]
    emit(record)
    return answer


def plain(value: Any) -> Any:
    """``value`` JSON-able: bytes as ``{"$b64": ...}`` (their raw length is what AWS counts)."""
    if isinstance(value, bytes | bytearray):
        return {"$b64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [plain(v) for v in value]
    return value


def _schema(call: Call, table: str) -> list[str]:
    if table not in _schemas:
        described = call("DescribeTable", {"TableName": table})["Table"]
        _schemas[table] = [k["AttributeName"] for k in described["KeySchema"]]
    return _schemas[table]


def _key(call: Call, table: str, item: dict[str, Any]) -> dict[str, Any]:
    return {name: item[name] for name in _schema(call, table)}


def _get(call: Call, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
    item = call("GetItem", {"TableName": table, "Key": key, "ConsistentRead": True}).get("Item")
    return plain(item) if item is not None else None


def _targets(call: Call, operation: str, params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(table, key) of each item the write names, in the request's order."""
    if operation == "PutItem":
        return [(params["TableName"], _key(call, params["TableName"], params["Item"]))]
    if operation in ("UpdateItem", "DeleteItem"):
        return [(params["TableName"], params["Key"])]
    found: list[tuple[str, dict[str, Any]]] = []
    if operation == "BatchWriteItem":
        for table, requests in params["RequestItems"].items():
            for request in requests:
                if "PutRequest" in request:
                    found.append((table, _key(call, table, request["PutRequest"]["Item"])))
                else:
                    found.append((table, request["DeleteRequest"]["Key"]))
        return found
    for entry in params["TransactItems"]:
        ((action, body),) = entry.items()
        table = body["TableName"]
        found.append((table, _key(call, table, body["Item"]) if action == "Put" else body["Key"]))
    return found


def _read_items(call: Call, operation: str, params: dict[str, Any], answer: dict[str, Any]) -> list[Any]:
    """The stored items behind a read's answer (``None`` for a key found absent)."""
    if operation == "GetItem":
        if "Item" not in answer:
            return [None]
        if "ProjectionExpression" not in params and "AttributesToGet" not in params:
            return [plain(answer["Item"])]
        return [_get(call, params["TableName"], params["Key"])]
    if operation == "BatchGetItem":
        found = []
        for table in params["RequestItems"]:
            returned = answer.get("Responses", {}).get(table, [])
            found += [_get(call, table, _key(call, table, item)) for item in returned]
        return found
    if operation == "TransactGetItems":
        return [_get(call, e["Get"]["TableName"], e["Get"]["Key"]) for e in params["TransactItems"]]
    # Query, Scan: the same page (same key condition, limit and start), without projection or filter, is the set
    # of items the call evaluated, whole (on an index: the index entries with all their projected attributes)
    again = {k: v for k, v in params.items() if k not in _NARROWING and k != "ReturnConsumedCapacity"}
    kept = " ".join(str(again.get(k, "")) for k in ("KeyConditionExpression",))
    for field in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
        if field in again:
            used = {k: v for k, v in again[field].items() if re.search(re.escape(k) + r"\b", kept)}
            if used:
                again[field] = used
            else:
                del again[field]
    return [plain(item) for item in call(operation, again).get("Items", [])]


_NARROWING = {"ProjectionExpression", "AttributesToGet", "FilterExpression", "QueryFilter", "ScanFilter", "Select"}
