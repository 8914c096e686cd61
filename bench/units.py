"""DynamoDB capacity units as AWS bills them, computed from the items each call touched.

DynamoDB Local's ``ConsumedCapacity`` is not the bill: it reports 2 write units for a transaction of 1, 5 or
20 one-KB puts, and no index units for a transaction at all. So ``bench cost`` bills each call from its
record (``tests/fidelity/capture.py``: the call, and the items before and after it or the items it read,
whole) by AWS's on-demand rules:

* item size: attribute names' UTF-8 bytes plus each value's size (``value_size``; a number's as Local counts
  it, which the guide gives approximately: ``number_size``);
* ``PutItem``/``UpdateItem``: 1 write unit per KB (rounded up, at least 1) of the larger of the item before and
  after; ``DeleteItem``: of the item deleted; ``BatchWriteItem``: each item so; a write refused by its
  condition: of the item as it stands;
* ``TransactWriteItems``: 2 write units per KB of each item written; a ``ConditionCheck`` 2 read units per
  4 KB of the item checked; a cancelled transaction each of its items at the same rate, on the item as it
  stood;
* ``GetItem``/``BatchGetItem``: per item, 0.5 read unit per 4 KB eventually consistent, 1 strongly, and a
  missing item the minimum; ``TransactGetItems`` 2 per 4 KB; ``Query``/``Scan``: the items evaluated,
  whole, summed and then rounded up to 4 KB (at least one block). Projection does not lower a read's units;
* each secondary index (its key attributes and projection read from ``DescribeTable``, never written here):
  an item write adds an entry when the item after has the index's keys (1 write unit per KB of the entry:
  the table's key, the index's key and the projected attributes), removes one when only the item before had
  them, moves one (a delete and a put) when the index key changed, and rewrites one when a projected
  attribute changed; otherwise the index costs nothing. Index writes are standard writes, also in a
  transaction (the index is updated after the transaction, not in it). A query of an index bills the index.

Approximations: a ``BatchWriteItem``'s unprocessed items are billed as written; the storage overhead (100
bytes an item) is not a throughput figure and is left out.
"""

from __future__ import annotations

import base64
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Units = dict[tuple[str, str], float]
"""(place: a table name or ``table/index``, ``read`` or ``write``) -> capacity units."""


def value_size(value: dict[str, Any]) -> int:
    """A DynamoDB attribute value's billed size in bytes (the developer guide's item size rules)."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return number_size(str(inner))
    if kind == "B":
        return _binary_length(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(value_size({kind[0]: member}) for member in inner)
    if kind == "L":
        return 3 + sum(1 + value_size(member) for member in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(v) for k, v in inner.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def number_size(text: str) -> int:
    """A number's size: its significant digits in pairs aligned on the decimal point (base 100, leading and
    trailing zero pairs trimmed), plus 1 byte, plus 1 for a negative number; zero is 1 byte. The guide says
    "approximately 1 byte per two significant digits, plus 1"; this is how DynamoDB Local counts, to the byte
    (``tests/test_bench_cost.py`` holds it at the 1 KB boundary)."""
    number = Decimal(text)
    if number == 0:
        return 1
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits)).rstrip("0")
    exponent += len(digits) - len(shown)
    highest, lowest = exponent + len(shown) - 1, exponent
    return (highest // 2 - lowest // 2 + 1) + 1 + sign


def _binary_length(inner: Any) -> int:
    if isinstance(inner, dict):  # a captured record's binary value
        return len(base64.b64decode(inner["$b64"]))
    return len(inner)


def item_size(item: dict[str, Any] | None) -> int:
    """An item's billed size: each attribute's name (UTF-8 bytes) plus its value's size; 0 for no item."""
    return sum(len(name.encode()) + value_size(value) for name, value in (item or {}).items())


def write_units(size: int) -> int:
    """Write units of one standard write of an item of ``size`` bytes: 1 per KB, rounded up, at least 1."""
    return max(1, math.ceil(size / 1024))


def transaction_units(size: int) -> int:
    """Write units AWS bills for one item of a ``TransactWriteItems``: 2 per KB (rounded up), at least 2."""
    return 2 * write_units(size)


def read_units(size: int, mode: str) -> float:
    """Read units of ``size`` bytes read at once: per 4 KB (rounded up, at least one block), 0.5 ``eventual``,
    1 ``strong``, 2 ``transactional``."""
    return {"eventual": 0.5, "strong": 1.0, "transactional": 2.0}[mode] * max(1, math.ceil(size / 4096))


@dataclass(frozen=True)
class Index:
    name: str
    keys: tuple[str, ...]
    projection: str
    attributes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    """A table's key and secondary indexes, as ``DescribeTable`` gives them."""

    name: str
    keys: tuple[str, ...]
    indexes: tuple[Index, ...]

    @classmethod
    def described(cls, description: dict[str, Any]) -> Table:
        """From a ``DescribeTable`` answer's ``Table`` (or a ``CreateTable`` request)."""
        indexes = []
        for field in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
            for index in description.get(field) or []:
                projection = index["Projection"]
                indexes.append(
                    Index(
                        index["IndexName"],
                        tuple(k["AttributeName"] for k in index["KeySchema"]),
                        projection["ProjectionType"],
                        tuple(projection.get("NonKeyAttributes") or ()),
                    )
                )
        keys = tuple(k["AttributeName"] for k in description["KeySchema"])
        return cls(description["TableName"], keys, tuple(indexes))

    def index(self, name: str) -> Index:
        return next(index for index in self.indexes if index.name == name)

    def entry(self, index: Index, item: dict[str, Any] | None) -> dict[str, Any] | None:
        """The item's entry in ``index`` (the table's key, the index's key, the projected attributes), or None when
        the item lacks one of the index's key attributes (a sparse index holds no entry for it)."""
        if item is None or any(key not in item for key in index.keys):
            return None
        if index.projection == "ALL":
            return dict(item)
        kept = {*self.keys, *index.keys, *(index.attributes if index.projection == "INCLUDE" else ())}
        return {name: value for name, value in item.items() if name in kept}


def index_write_units(table: Table, index: Index, before: dict[str, Any] | None, after: dict[str, Any] | None) -> int:
    """Write units ``index`` costs for an item going from ``before`` to ``after`` (either None: absent)."""
    old, new = table.entry(index, before), table.entry(index, after)
    if old is None and new is None:
        return 0
    if old is None or new is None:
        return write_units(item_size(old if new is None else new))
    if any(old[key] != new[key] for key in index.keys):
        return write_units(item_size(old)) + write_units(item_size(new))  # moved: a delete and a put
    if old == new:
        return 0
    return write_units(max(item_size(old), item_size(new)))


Partitions = dict[tuple[str, str, str], float]
"""(place, partition key value, ``read`` or ``write``) -> capacity units: what one partition was billed."""


def call_units(record: dict[str, Any], tables: dict[str, Table]) -> Units:
    """The units one captured call (``capture.py``'s record) is billed, by place and kind."""
    units: Units = defaultdict(float)
    for (place, _, kind, _), value in _billed(record, tables).items():
        units[(place, kind)] += value
    return dict(units)


def _partition(item: dict[str, Any] | None, keys: tuple[str, ...]) -> str:
    """The partition key value of ``item`` (its first key attribute's value, as text)."""
    if item is None or keys[0] not in item:
        return ""
    ((_, value),) = item[keys[0]].items()
    return str(value)


def item_kind(item: dict[str, Any] | None) -> str:
    """What an item of dormant's table is, from its key (``dormant.stores.dynamodb.keys``): a session's meta item,
    event, id item, touch (its listing entry) or snapshot; scoped state (the workflow scope's: a task token
    record), a scope binding, an idempotency record; ``other`` for the rest (the layout record, progress)."""
    if not item or "pk" not in item:
        return "other"
    pk, sk = item["pk"].get("S", ""), item.get("sk", {}).get("S", "")
    if pk.startswith("S#"):
        return {"#M": "meta", "#S": "snapshot", "E#": "event", "I#": "id item", "T#": "touch"}.get(sk[:2], "other")
    if pk.startswith("X#"):
        return "token record" if pk.split("#")[2:3] == ["workflow"] else "scoped state"
    return {"B#": "binding", "I#": "idempotency record"}.get(pk[:2], "other")


def partition_units(record: dict[str, Any], tables: dict[str, Table]) -> Partitions:
    """The units one captured call is billed, by place, partition key and kind: a table's item by its partition
    key, an index entry by the index's partition key (a moved entry bills its old key's partition for the delete
    and its new key's for the put), a query by the partition its key condition names. AWS throttles each partition
    key at its own rate (about 1,000 write units and 3,000 read units a second)."""
    units: Partitions = defaultdict(float)
    for (place, key, kind, _), value in _billed(record, tables).items():
        units[(place, key, kind)] += value
    return dict(units)


def labelled_units(record: dict[str, Any], tables: dict[str, Table]) -> dict[tuple[str, str, str], float]:
    """As ``call_units``, each unit also labelled with the kind of item it was billed for (``item_kind``); a
    Query's or Scan's units with the kind of the first item it evaluated (its items are of one kind), or ``none
    found``."""
    units: dict[tuple[str, str, str], float] = defaultdict(float)
    for (place, _, kind, label), value in _billed(record, tables).items():
        units[(place, kind, label)] += value
    return dict(units)


def _billed(record: dict[str, Any], tables: dict[str, Table]) -> dict[tuple[str, str, str, str], float]:
    """The one count behind the three views: (place, partition key, ``read``/``write``, item kind) -> units."""
    units: dict[tuple[str, str, str, str], float] = defaultdict(float)
    operation, params, failed = record["operation"], record["params"], record.get("error") is not None

    def key_of(body: dict[str, Any], item: Any) -> Any:
        return item or body.get("Key") or body.get("Item")

    def write(table_name: str, before: Any, after: Any, factor: int) -> None:
        table = tables[table_name]
        if failed:
            after = before
        label = item_kind(after or before)
        key = _partition(after if after is not None else before, table.keys)
        units[(table_name, key, "write", label)] += factor * write_units(max(item_size(before), item_size(after)))
        for index in table.indexes:
            cost = index_write_units(table, index, before, after)
            if not cost:
                continue
            place = f"{table_name}/{index.name}"
            old, new = table.entry(index, before), table.entry(index, after)
            old_key, new_key = _partition(old, index.keys), _partition(new, index.keys)
            if old is not None and new is not None and old_key != new_key:
                units[(place, old_key, "write", label)] += write_units(item_size(old))
                units[(place, new_key, "write", label)] += write_units(item_size(new))
            else:
                units[(place, new_key if new is not None else old_key, "write", label)] += cost

    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        ((before, after),) = record["images"]
        write(params["TableName"], before, after, 1)
    elif operation == "BatchWriteItem":
        names = [t for t, requests in params["RequestItems"].items() for _ in requests]
        for name, (before, after) in zip(names, record["images"], strict=True):
            write(name, before, after, 1)
    elif operation == "TransactWriteItems":
        for entry, (before, after) in zip(params["TransactItems"], record["images"], strict=True):
            ((action, body),) = entry.items()
            if action == "ConditionCheck":
                key = _partition(body.get("Key"), tables[body["TableName"]].keys)
                label = item_kind(key_of(body, before))
                units[(body["TableName"], key, "read", label)] += read_units(item_size(before), "transactional")
            else:
                write(body["TableName"], before, after, 2)
    elif operation in ("GetItem", "TransactGetItems"):
        mode = "transactional" if operation == "TransactGetItems" else _mode(params)
        bodies = [params] if operation == "GetItem" else [e["Get"] for e in params["TransactItems"]]
        for body, item in zip(bodies, record["items"], strict=True):
            key = _partition(body.get("Key"), tables[body["TableName"]].keys)
            units[(body["TableName"], key, "read", item_kind(key_of(body, item)))] += read_units(item_size(item), mode)
    elif operation == "BatchGetItem":
        for name, item in zip(record["tables"], record["items"], strict=True):
            key = _partition(item, tables[name].keys)
            units[(name, key, "read", item_kind(item))] += read_units(
                item_size(item), _mode(params["RequestItems"][name])
            )
    elif operation in ("Query", "Scan"):
        table = tables[params["TableName"]]
        keys = table.index(params["IndexName"]).keys if "IndexName" in params else table.keys
        place = params["TableName"] + (f"/{params['IndexName']}" if "IndexName" in params else "")
        key = _queried(params, keys[0]) if operation == "Query" else ""
        label = item_kind(record["items"][0]) if record["items"] else "none found"
        units[(place, key, "read", label)] += read_units(sum(item_size(i) for i in record["items"]), _mode(params))
    return dict(units)


def _queried(params: dict[str, Any], attribute: str) -> str:
    """The partition key value a ``Query``'s key condition names (``attr = :v``, the name maybe a ``#n``)."""
    names = {v: k for k, v in (params.get("ExpressionAttributeNames") or {}).items()}
    spelled = [attribute, names.get(attribute, attribute)]
    condition = params.get("KeyConditionExpression") or ""
    for name in spelled:
        match = re.search(rf"(?:^|[\s(]){re.escape(name)}\s*=\s*(:\w+)", condition)
        if match:
            return _partition({"k": params["ExpressionAttributeValues"][match.group(1)]}, ("k",))
    return ""


def _mode(params: dict[str, Any]) -> str:
    return "strong" if params.get("ConsistentRead") else "eventual"


def total(records: Iterable[dict[str, Any]], tables: dict[str, Table]) -> Units:
    """The units of many calls, summed by place and kind."""
    summed: Units = defaultdict(float)
    for record in records:
        for place, value in call_units(record, tables).items():
            summed[place] += value
    return dict(summed)
