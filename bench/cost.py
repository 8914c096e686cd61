"""What a turn costs on AWS: the Bookings arc (one chat turn; an approval turn of run, park, answer and resume).

Two runs count it, and ``bench/prices.py`` (one table, its date and region) prices it:

* **DynamoDB**, in this process over DynamoDB Local: the functions' handlers (the API's, the workflow's) on
  the Bookings app, every DynamoDB call any client makes metered (``ReturnConsumedCapacity=INDEXES``), by
  function, table and index. Local under-reports transactions, so a ``TransactWriteItems`` is billed here as
  AWS bills it, 2 write units per KB of each item (a Put's item as sent; an Update's, Delete's or
  ConditionCheck's as stored, read first off the meter); an empty ``Query`` at AWS's minimum (0.5 or 1).
  The turn runs in the API request here (no Step Functions in this process): its units are counted under
  ``run``, where on AWS most land in ``resume``.
* **Lambda, API Gateway, Step Functions, logs**, in the deployment-fidelity harness (the synthesized stack's
  functions in their sandboxes, the state machine's stand-in): each arc run once to warm the functions, then
  again, measured: GB-seconds per function (the invocation's time x its memory), API requests, state
  transitions (states entered), and the bytes the functions logged (EMF lines included).

The model's own cost is set beside it at the price ``prices.MODEL`` states, per model call the arc makes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import QUICK, Figure
from .prices import DATE, MODEL, PRICES, REGION

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
TENANT = "cost-tenant"
CHAT = "hello"
BOOKING = "I need physio on Tuesday afternoon, for Alex Doe"
_READS = {"GetItem", "Query", "BatchGetItem", "Scan"}
_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}


# -- DynamoDB: item sizes and the meter -------------------------------------------------------------------


def value_size(value: dict[str, Any]) -> int:
    """A DynamoDB attribute value's billed size in bytes (the developer guide's item size rules)."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        digits = str(inner).lstrip("-").replace(".", "").strip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if kind == "B":
        return len(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(value_size({kind[0]: member}) for member in inner)
    if kind == "L":
        return 3 + sum(1 + value_size(member) for member in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(v) for k, v in inner.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def transaction_units(size: int) -> int:
    """Write units AWS bills for one item of a ``TransactWriteItems``: 2 per KB (rounded up), at least 2."""
    return 2 * max(1, math.ceil(size / 1024))


class Meter:
    """Capacity units by (function, table or ``table/index``, ``read``/``write``) of every DynamoDB call made."""

    def __init__(self) -> None:
        self.units: dict[tuple[str, str, str], float] = defaultdict(float)
        self.function = ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[Meter]:
        from botocore.client import BaseClient

        original = BaseClient._make_api_call
        meter = self

        def metered(client: Any, operation: str, params: dict[str, Any]) -> Any:
            if client.meta.service_model.endpoint_prefix != "dynamodb" or not meter.function:
                return original(client, operation, params)
            if operation == "TransactWriteItems":
                meter._transaction(lambda op, p: original(client, op, p), params)
                return original(client, operation, params)
            if operation not in _READS | _WRITES:
                return original(client, operation, params)
            answer = original(client, operation, {**params, "ReturnConsumedCapacity": "INDEXES"})
            consumed = answer.get("ConsumedCapacity") or []
            for entry in consumed if isinstance(consumed, list) else [consumed]:
                meter._record(operation, params, entry)
            return answer

        BaseClient._make_api_call = metered  # type: ignore[method-assign]
        try:
            yield self
        finally:
            BaseClient._make_api_call = original  # type: ignore[method-assign]

    def _record(self, operation: str, params: dict[str, Any], entry: dict[str, Any]) -> None:
        kind = "read" if operation in _READS else "write"
        table = entry["TableName"]
        own = float((entry.get("Table") or {}).get("CapacityUnits", 0.0))
        if operation == "Query":  # Local answers 0 for an empty query; AWS bills at least this
            own = max(own, 1.0 if params.get("ConsistentRead") else 0.5)
        indexes = {**(entry.get("GlobalSecondaryIndexes") or {}), **(entry.get("LocalSecondaryIndexes") or {})}
        if operation == "Query" and "IndexName" in params:
            # a query on an index is billed to the index
            name = params["IndexName"]
            units = max(float(indexes.get(name, {}).get("CapacityUnits", 0.0)), own, 0.5)
            self.units[(self.function, f"{table}/{name}", kind)] += units
            return
        self.units[(self.function, table, kind)] += own or float(entry.get("CapacityUnits", 0.0))
        for name, index in indexes.items():
            self.units[(self.function, f"{table}/{name}", kind)] += float(index.get("CapacityUnits", 0.0))

    def _transaction(self, call: Callable[[str, dict[str, Any]], Any], params: dict[str, Any]) -> None:
        for entry in params["TransactItems"]:
            ((action, body),) = entry.items()
            if action == "Put":
                size = item_size(body["Item"])
            else:  # billed on the item as stored: read it first, off the meter
                stored = call("GetItem", {"TableName": body["TableName"], "Key": body["Key"], "ConsistentRead": True})
                size = item_size(stored.get("Item") or body["Key"])
            self.units[(self.function, body["TableName"], "write")] += transaction_units(size)

    def take(self) -> dict[tuple[str, str, str], float]:
        taken, self.units = dict(self.units), defaultdict(float)
        return taken


# -- the arcs ---------------------------------------------------------------------------------------------


def api_event(name: str, session_id: str, body: Any, key: str | None = None) -> dict[str, Any]:
    """The sample event of a route (``events/api/``), for this tenant and session, with ``body``."""
    event = copy.deepcopy(json.loads((EVENTS / "api" / f"{name}.json").read_text(encoding="utf-8")))
    event["headers"].pop("Idempotency-Key", None)
    event["multiValueHeaders"].pop("Idempotency-Key", None)
    if key:
        event["headers"]["Idempotency-Key"] = key
    if "{id}" in event["resource"]:
        event["pathParameters"] = {"id": session_id}
        event["path"] = event["resource"].replace("{id}", session_id)
    event["requestContext"]["authorizer"]["claims"]["sub"] = TENANT
    event["body"] = json.dumps(body)
    return event


class _Context:
    function_name = "bench"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


def dynamodb_counts(endpoint: str) -> tuple[dict[str, dict[tuple[str, str, str], float]], dict[str, int]]:
    """Units of each arc (by function, table/index, read/write) and its model calls, in this process."""
    from dormant.serving.api import api_handler
    from dormant.serving.hooks import Hooks
    from dormant.serving.idempotency import DynamoDBIdempotency
    from dormant.serving.workflow import StepFunctions, workflow_handler
    from dormant.stores.dynamodb import create_table
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION, client

    table = f"dormant-cost-{uuid.uuid4().hex[:8]}"
    setup = client(endpoint)
    create_table(table, client=setup)
    saved = {k: os.environ.get(k) for k in ("DORMANT_STORE", "DORMANT_APP", "DORMANT_IDEMPOTENCY_TABLE")}
    os.environ.update(
        {
            "DORMANT_STORE": f"dynamodb://{table}?endpoint={endpoint}&region={REGION}",
            "DORMANT_APP": "bookings:build",
            "DORMANT_IDEMPOTENCY_TABLE": table,
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", ACCESS_KEY),
            "AWS_DEFAULT_REGION": REGION,
        }
    )
    try:
        idempotency = DynamoDBIdempotency(table, client=client(endpoint))  # records in the table, as deployed
        api, context = api_handler(Hooks(), idempotency=idempotency), _Context()
        # park answers its token only when answers came first: not in this arc, so no Step Functions is called
        workflow = workflow_handler(step_functions=StepFunctions(client=object()))
        meter = Meter()
        units: dict[str, dict[tuple[str, str, str], float]] = {}
        calls: dict[str, int] = {}
        with meter.installed():
            for arc in ("chat", "approval"):
                sid = f"cost-{uuid.uuid4().hex[:10]}"
                created = api(api_event("create_session", sid, {"session_id": sid, "scopes": {}}), context)
                assert created["statusCode"] == 201, created
                meter.function = "run"
                ran = api(api_event("run", sid, {"message": CHAT if arc == "chat" else BOOKING}, f"k-{sid}"), context)
                answer = json.loads(ran["body"])
                assert ran["statusCode"] == 200 and answer["status"] == (
                    "completed" if arc == "chat" else "yielded_tool"
                )
                if arc == "approval":
                    (call,) = answer["yielded_tools"]
                    invocation = _open_invocation(api, sid, context)
                    step = {"tenant": TENANT, "session_id": sid, "invocation_id": invocation}
                    meter.function = "park"
                    parked = workflow({**step, "action": "park", "token": "t-" + sid, "wait_seconds": 3600}, context)
                    assert parked["status"] == "awaiting_input", parked
                    meter.function = "tools"
                    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
                    told = api(api_event("tools", sid, answers, f"a-{sid}"), context)
                    assert told["statusCode"] == 202, told
                    meter.function = "resume"
                    resumed = workflow({**step, "action": "run"}, context)
                    assert resumed["status"] == "completed", resumed
                meter.function = ""
                units[arc] = meter.take()
                calls[arc] = _model_calls(api, sid, context)
        return units, calls
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with contextlib.suppress(Exception):
            setup.delete_table(TableName=table)


def _events(api: Any, sid: str, context: Any) -> list[dict[str, Any]]:
    event = api_event("session_events", sid, None)
    event["body"] = None
    event["queryStringParameters"] = {"limit": "1000"}
    answer = api(event, context)
    return json.loads(answer["body"])["events"]  # type: ignore[no-any-return]


def _open_invocation(api: Any, sid: str, context: Any) -> str:
    return next(e["invocation_id"] for e in _events(api, sid, context) if e["type"] == "invocation_start")


def _model_calls(api: Any, sid: str, context: Any) -> int:
    return sum(1 for e in _events(api, sid, context) if e["type"] == "model_end")


def harness_counts(endpoint: str) -> dict[str, dict[str, float]]:
    """Per arc, from the fidelity harness: ``gbs:<function>``, ``api_requests``, ``transitions``, ``log_bytes``."""
    from tests.support.fidelity.deployment import Deployment

    deployment = Deployment.start(dynamodb_endpoint=endpoint)
    try:
        counts: dict[str, dict[str, float]] = {}
        for round_ in ("warm", "measured"):
            for arc in ("chat", "approval"):
                measured = _harness_arc(deployment, arc)
                if round_ == "measured":
                    counts[arc] = measured
        return counts
    finally:
        deployment.close()


def _harness_arc(d: Any, arc: str) -> dict[str, float]:
    invocations, executions = len(d.lambdas.invocations), {e.arn for e in d.executions()}
    logs = {name: len(d.log(name).encode()) for name in d.functions}
    requests = 0

    def api(method: str, path: str, body: Any = None) -> Any:
        nonlocal requests
        requests += 1
        status, _, answer = d.api(method, path, body, tenant=TENANT)
        assert status < 300, (status, answer)
        return answer

    sid = f"cost-{uuid.uuid4().hex[:10]}"
    d.api("POST", "/sessions", {"session_id": sid, "scopes": {}}, tenant=TENANT)  # not the turn's
    api("POST", f"/sessions/{sid}/runs", {"message": CHAT if arc == "chat" else BOOKING})
    d.settle(60)
    if arc == "approval":
        _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=TENANT)
        (call,) = shown["yielded_tools"]
        api("POST", f"/sessions/{sid}/tools", {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]})
        d.settle(60)
    _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=TENANT)
    assert shown["status"] == "completed", shown
    counted: dict[str, float] = defaultdict(float)
    memory = {name: f.memory for name, f in d.functions.items()}
    for invocation in d.lambdas.invocations[invocations:]:
        if invocation.function == "sessions":  # the create and the reads above are not the turn's
            continue
        billed = math.ceil(invocation.seconds * 1000) / 1000  # Lambda bills by the millisecond
        counted[f"gbs:{invocation.function}"] += billed * memory[invocation.function] / 1024
        counted["lambda_requests"] += 1
    counted["api_requests"] = requests
    counted["transitions"] = sum(len(e.states) for e in d.executions() if e.arn not in executions)
    counted["log_bytes"] = sum(len(d.log(name).encode()) - logs[name] for name in d.functions if name != "sessions")
    return dict(counted)


# -- the bill ---------------------------------------------------------------------------------------------


def bill(units: dict[tuple[str, str, str], float], harness: dict[str, float], model_calls: int) -> dict[str, float]:
    """USD of one arc, by line."""
    writes = sum(u for (_, _, kind), u in units.items() if kind == "write")
    reads = sum(u for (_, _, kind), u in units.items() if kind == "read")
    gbs = sum(v for k, v in harness.items() if k.startswith("gbs:"))
    model = model_calls * (
        MODEL["input_tokens_per_call"] * MODEL["input_per_million"]
        + MODEL["output_tokens_per_call"] * MODEL["output_per_million"]
    )
    return {
        "dynamodb writes": writes * PRICES["dynamodb_write_unit"],
        "dynamodb reads": reads * PRICES["dynamodb_read_unit"],
        "lambda": gbs * PRICES["lambda_gb_second"] + harness.get("lambda_requests", 0) * PRICES["lambda_request"],
        "api gateway": harness.get("api_requests", 0) * PRICES["api_request"],
        "step functions": harness.get("transitions", 0) * PRICES["state_transition"],
        "logs": harness.get("log_bytes", 0) / 1e9 * PRICES["log_gb"],
        "model": float(model) / 1e6,
    }


def report(
    units: dict[str, dict[tuple[str, str, str], float]],
    harness: dict[str, dict[str, float]],
    calls: dict[str, int],
) -> list[str]:
    lines = [
        f"  prices: bench/prices.py, {REGION}, as of {DATE}; model: {MODEL['name']} at "
        f"${MODEL['input_per_million']}/M in, ${MODEL['output_per_million']}/M out, "
        f"{MODEL['input_tokens_per_call']} in + {MODEL['output_tokens_per_call']} out tokens per call"
    ]
    for arc in ("chat", "approval"):
        lines.append(f"  {arc} turn ({calls[arc]} model calls):")
        for (function, place, kind), value in sorted(units[arc].items()):
            shown = f"index {place.split('/', 1)[1]}" if "/" in place else "table"
            lines.append(f"    dynamodb {function:<8} {shown:<24} {kind:<5} {value:8.1f} units")
        for key, value in sorted(harness[arc].items()):
            shown = f"{value:10.4f}" if key.startswith("gbs:") else f"{value:10.0f}"
            lines.append(f"    {key:<46} {shown}")
        costs = bill(units[arc], harness[arc], calls[arc])
        aws = sum(v for k, v in costs.items() if k != "model")
        for name, usd in costs.items():
            lines.append(f"    {name:<16} ${usd * 1e6:>10,.2f} per million turns")
        lines.append(
            f"    {'AWS total':<16} ${aws * 1e6:>10,.2f} per million turns (model: ${costs['model'] * 1e6:,.2f})"
        )
    return lines


def run() -> list[Figure]:
    try:
        from tests.support.servers.dynamodb import LocalUnavailable
    except ImportError as exc:
        print(f"  skipped: needs boto3 and the test servers: {exc}")
        return []
    from .dynamodb import _endpoint

    try:
        with _endpoint() as endpoint:
            units, calls = dynamodb_counts(endpoint)
            try:
                harness = harness_counts(endpoint)
            except ImportError as exc:  # the harness synthesizes the stack: the infra extra
                print(f"  (no fidelity harness: {exc}; Lambda, API, Step Functions and logs not counted)")
                harness = {arc: {} for arc in units}
    except LocalUnavailable as exc:
        print(f"  skipped: no DynamoDB to count on ({exc})")
        return []
    for line in report(units, harness, calls):
        print(line)
    if QUICK:
        print("  (BENCH_QUICK: the arcs are the same size; only the warm-up differs)")
    return []
