"""What a turn costs on AWS: the Bookings arc (one chat turn; an approval turn of run, park, answer and resume).

Beside it, a remote runner's turn committed through ``POST /commit`` (the ``commit`` function) and one
scheduled sweep (the ``sweeper``, billed per month at the template's schedule, not per turn).

One run in the deployment-fidelity harness counts it (the synthesized stack's functions, each in its own
sandbox process with its template's environment and IAM; the state machine's own ASL; the table made from
the template in DynamoDB Local), and ``bench/prices.py`` (one table, its date and region) prices it:

* each arc runs three times: to warm the functions; measured (Lambda GB-seconds per function: each
  invocation's time, billed by the millisecond, x the function's memory from the template; API requests;
  state transitions, the states each execution entered and its tasks' retries; the bytes the functions logged, EMF lines
  included); and captured (every DynamoDB call each function made, with the items it touched:
  ``tests/fidelity/capture.py``). The capture's own reads never reach a measured duration;
* DynamoDB units are computed from the captured items as AWS bills them (``bench/units.py``), per function
  as deployed (the turn's commits land under ``resume``, which runs it), per table and per index (the
  indexes as ``DescribeTable`` gives them). DynamoDB Local's own figures are not used: it reports 2 write
  units for a transaction of any size and no index units for one.

Then one W1 commit (5 events of 1 KB) on each of the DynamoDB store's commit paths, the one call and the gated
protocol, billed the same way (``bench/commit_bill.py``): the figures ``docs/dynamodb.md`` gives.

The create of the session and the reads that check the arc's outcome are not the turn's (``sessions`` is not
counted). The model's own cost is set beside it at the price ``prices.MODEL`` states, per model call.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import defaultdict
from typing import Any

from .commit_bill import commit_bills
from .common import QUICK, Figure
from .prices import DATE, MODEL, PRICES, REGION
from .units import Table, call_units, item_size, transaction_units, value_size

__all__ = ["bill", "item_size", "report", "run", "transaction_units", "value_size"]

CHAT = "hello"
BOOKING = "I need physio on Tuesday afternoon, for Alex Doe"
ARCS = ("chat", "approval", "commit")
WHAT = {
    "chat": "one chat turn",
    "approval": "an approval turn: run, park, answer, resume",
    "commit": "a remote runner's turn committed: POST /commit of 2 events; its compute and model are its own",
}
NOT_THE_TURNS = {"sessions"}
"""Functions whose calls in an arc are the test's own (the session's create, the reads of the outcome)."""

Arc = dict[str, Any]
"""``units`` {(function, place, read|write): units}, ``harness`` {name: figure}, ``model_calls``, ``table``."""


def harness_counts(endpoint: str) -> dict[str, Arc]:
    """Each arc's counts (see the module docstring) from one deployment of the stack."""
    from tests.support.fidelity.deployment import Deployment

    deployment = Deployment.start(dynamodb_endpoint=endpoint)
    try:
        described = deployment.ddb().describe_table(TableName=deployment.table_name)["Table"]
        tables = {deployment.table_name: Table.described(described)}
        arcs: dict[str, Arc] = {arc: {"table": deployment.table_name} for arc in (*ARCS, "sweep")}
        for round_ in ("warm", "measured", "captured"):
            for arc in (*ARCS, "sweep"):
                deployment.lambdas.capture(round_ == "captured")
                start = len(deployment.lambdas.dynamodb)
                if arc == "sweep":
                    measured, tenant, sid = _sweep(deployment), "", ""
                else:
                    measured, tenant, sid = _harness_arc(deployment, arc)
                deployment.lambdas.capture(False)
                if round_ == "measured":
                    arcs[arc]["harness"] = measured
                if round_ == "captured":
                    records = deployment.lambdas.dynamodb[start:]
                    arcs[arc]["units"] = _units(records, tables)
                    arcs[arc]["model_calls"] = _model_calls(deployment, tenant, sid) if sid else 0
        arcs["sweep"]["every_minutes"] = _sweep_minutes(deployment)
        return arcs
    finally:
        deployment.close()


def _transitions(execution: Any) -> int:
    """State transitions Step Functions bills an execution: each state entered, and each retry of a task."""
    kinds = [event["type"] for event in execution.history]
    retries = kinds.count("TaskScheduled") - kinds.count("TaskStateEntered")
    return len(execution.states) + max(0, retries)


def _sweep(d: Any) -> dict[str, float]:
    """One scheduled sweep (the schedule's event), over the sessions the arcs left: GB-seconds and log bytes."""
    invocations, logs = len(d.lambdas.invocations), len(d.log("sweeper").encode())
    d.sweep(grace_seconds=None)
    counted: dict[str, float] = defaultdict(float)
    for invocation in d.lambdas.invocations[invocations:]:
        billed = math.ceil(invocation.seconds * 1000) / 1000
        counted[f"gbs:{invocation.function}"] += billed * d.functions[invocation.function].memory / 1024
        counted[f"invocations:{invocation.function}"] += 1
        counted["lambda_requests"] += 1
    counted["logs:sweeper"] = counted["log_bytes"] = len(d.log("sweeper").encode()) - logs
    return dict(counted)


def _sweep_minutes(d: Any) -> int:
    """The sweeper's schedule, from the template's rule (``rate(N minutes)``)."""
    for rule in d.template.of_type("AWS::Events::Rule").values():
        match = re.fullmatch(r"rate\((\d+) minutes?\)", str(rule["Properties"].get("ScheduleExpression", "")))
        if match:
            return int(match[1])
    raise ValueError("no rate(N minutes) schedule in the template")


def _units(records: list[dict[str, Any]], tables: dict[str, Table]) -> dict[tuple[str, str, str], float]:
    units: dict[tuple[str, str, str], float] = defaultdict(float)
    for record in records:
        if record["function"] in NOT_THE_TURNS:
            continue
        for (place, kind), value in call_units(record, tables).items():
            units[(record["function"], place, kind)] += value
    return dict(units)


def _model_calls(d: Any, tenant: str, sid: str) -> int:
    _, _, page = d.api("GET", f"/sessions/{sid}/events", tenant=tenant, query={"limit": "1000"})
    return sum(1 for e in page["events"] if e["type"] == "model_end")


def _harness_arc(d: Any, arc: str) -> tuple[dict[str, float], str, str]:
    """One arc as a fresh caller (a Cognito ``sub``: the Bookings slots are the tenant's, each booked once)."""
    tenant = str(uuid.uuid4())
    invocations, executions = len(d.lambdas.invocations), {e.arn for e in d.executions()}
    logs = {name: len(d.log(name).encode()) for name in d.functions}
    requests = 0
    counted: dict[str, float] = defaultdict(float)

    def api(method: str, path: str, body: Any = None) -> Any:
        nonlocal requests
        requests += 1
        counted[f"api:{d._route(method, path)[1]}"] += 1  # the function the route invokes
        status, _, answer = d.api(method, path, body, tenant=tenant)
        assert status < 300, (status, answer)
        return answer

    sid = f"cost-{uuid.uuid4().hex[:10]}"
    d.api("POST", "/sessions", {"session_id": sid, "scopes": {}}, tenant=tenant)  # not the turn's
    if arc == "commit":  # the runner's own compute and model are not on this bill
        events = [{"type": "user", "text": BOOKING}, {"type": "user", "text": CHAT}]
        api("POST", f"/sessions/{sid}/commit", {"expected_version": 1, "events": events})
    else:
        api("POST", f"/sessions/{sid}/runs", {"message": CHAT if arc == "chat" else BOOKING})
    d.settle(60)
    if arc == "approval":
        _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=tenant)
        (call,) = shown["yielded_tools"]
        api("POST", f"/sessions/{sid}/tools", {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]})
        d.settle(60)
    _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=tenant)
    assert shown["status"] == "completed" or (arc == "commit" and shown["version"] == 2), shown
    memory = {name: f.memory for name, f in d.functions.items()}
    for invocation in d.lambdas.invocations[invocations:]:
        if invocation.function in NOT_THE_TURNS:
            continue
        billed = math.ceil(invocation.seconds * 1000) / 1000  # Lambda bills by the millisecond
        counted[f"gbs:{invocation.function}"] += billed * memory[invocation.function] / 1024
        counted[f"invocations:{invocation.function}"] += 1
        if not invocation.ok:  # billed all the same; the state machine's retry is another invocation
            counted[f"failed:{invocation.function}"] += 1
        counted["lambda_requests"] += 1
    counted["api_requests"] = requests
    counted["transitions"] = sum(_transitions(e) for e in d.executions() if e.arn not in executions)
    for name in d.functions:
        logged = len(d.log(name).encode()) - logs[name]
        if logged and name not in NOT_THE_TURNS:
            counted[f"logs:{name}"] = logged
            counted["log_bytes"] += logged
    return dict(counted), tenant, sid


# -- the bill ---------------------------------------------------------------------------------------------


def bill(units: dict[tuple[str, str, str], float], harness: dict[str, float], model_calls: int) -> dict[str, float]:
    """USD of one arc, by line. ``units`` by (function, place, kind): a place with a ``/`` is an index."""
    writes = sum(u for (_, place, kind), u in units.items() if kind == "write" and "/" not in place)
    index_writes = sum(u for (_, place, kind), u in units.items() if kind == "write" and "/" in place)
    reads = sum(u for (_, _, kind), u in units.items() if kind == "read")
    gbs = sum(v for k, v in harness.items() if k.startswith("gbs:"))
    model = model_calls * (
        MODEL["input_tokens_per_call"] * MODEL["input_per_million"]
        + MODEL["output_tokens_per_call"] * MODEL["output_per_million"]
    )
    return {
        "dynamodb writes": writes * PRICES["dynamodb_write_unit"],
        "dynamodb index writes": index_writes * PRICES["dynamodb_write_unit"],
        "dynamodb reads": reads * PRICES["dynamodb_read_unit"],
        "lambda": gbs * PRICES["lambda_gb_second"] + harness.get("lambda_requests", 0) * PRICES["lambda_request"],
        "api gateway": harness.get("api_requests", 0) * PRICES["api_request"],
        "step functions": harness.get("transitions", 0) * PRICES["state_transition"],
        "logs": harness.get("log_bytes", 0) / 1e9 * PRICES["log_gb"],
        "model": float(model) / 1e6,
    }


def report(arcs: dict[str, Arc]) -> list[str]:
    """The printed table: per arc, per function, then the bill per million turns."""
    lines = [
        f"  prices: bench/prices.py, {REGION}, as of {DATE}; model: {MODEL['name']} at "
        f"${MODEL['input_per_million']}/M in, ${MODEL['output_per_million']}/M out, "
        f"{MODEL['input_tokens_per_call']} in + {MODEL['output_tokens_per_call']} out tokens per call",
        "  DynamoDB units as AWS bills them, from the items each call wrote and read (bench/units.py)",
    ]
    for name in ARCS:
        arc = _arc(arcs[name])
        units, harness = arc["units"], arc["harness"]
        lines.append(f"  {name} turn ({WHAT[name]}; {arc['model_calls']} model calls):")
        functions = sorted({k.split(":", 1)[1] for k in harness if k.startswith("gbs:")} | {f for f, _, _ in units})
        lines.append(
            f"    {'function':<9} {'invocations':>11} {'GB-s':>8} {'API requests':>12} {'log bytes':>9}"
            f" {'DDB read':>9} {'DDB write':>9}"
        )
        for function in functions:
            read = sum(v for (f, _, k), v in units.items() if f == function and k == "read")
            write = sum(v for (f, _, k), v in units.items() if f == function and k == "write")
            lines.append(
                f"    {function:<9} {harness.get(f'invocations:{function}', 0):>11.0f}"
                f" {harness.get(f'gbs:{function}', 0):>8.4f} {harness.get(f'api:{function}', 0):>12.0f}"
                f" {harness.get(f'logs:{function}', 0):>9.0f} {read:>9.1f} {write:>9.1f}"
            )
        lines.append(
            f"    state machine: {harness.get('transitions', 0):.0f} state transitions; "
            f"{harness.get('api_requests', 0):.0f} API requests, {harness.get('log_bytes', 0):.0f} log bytes in all"
        )
        failed = {k.split(":", 1)[1]: v for k, v in harness.items() if k.startswith("failed:")}
        if failed:  # a loaded machine's timeouts: counted, as AWS bills them, and named so a figure is read right
            lines.append("    failed invocations (retried): " + ", ".join(f"{f} {n:.0f}" for f, n in failed.items()))
        for (function, place, kind), value in sorted(units.items()):
            table, _, index = place.partition("/")
            shown = ("table" if table == arc["table"] else f"table {table}") + (f" index {index}" if index else "")
            shown = f"index {index}" if index and table == arc["table"] else shown
            lines.append(f"    dynamodb {function:<8} {shown:<24} {kind:<5} {value:8.1f} units")
        costs = bill(units, harness, arc["model_calls"])
        aws = sum(v for k, v in costs.items() if k != "model")
        for line, usd in costs.items():
            lines.append(f"    {line:<22} ${usd * 1e6:>10,.2f} per million turns")
        lines.append(
            f"    {'AWS total':<22} ${aws * 1e6:>10,.2f} per million turns (model: ${costs['model'] * 1e6:,.2f})"
        )
    if "sweep" in arcs:
        lines += _sweep_lines(_arc(arcs["sweep"]))
    return lines


def _sweep_lines(arc: Arc) -> list[str]:
    """The sweeper's bill: per sweep, and per month at the template's schedule (not per turn)."""
    every = arc.get("every_minutes", 5)
    month = 30 * 24 * 60 // every
    units, harness = arc["units"], arc["harness"]
    read = sum(v for (_, _, k), v in units.items() if k == "read")
    write = sum(v for (_, _, k), v in units.items() if k == "write")
    costs = bill(units, harness, 0)
    usd = sum(v for k, v in costs.items() if k != "model")
    lines = [
        f"  sweeper (one scheduled sweep, over the arcs' sessions; not per turn: rate({every} minutes), "
        f"{month:,} sweeps a month):",
        f"    sweeper {harness.get('gbs:sweeper', 0):.4f} GB-s, {harness.get('log_bytes', 0):.0f} log bytes, "
        f"DynamoDB {read:.1f} read and {write:.1f} write units",
    ]
    for (function, place, kind), value in sorted(units.items()):
        index = place.partition("/")[2]
        shown = f"index {index}" if index else "table"
        lines.append(f"    dynamodb {function:<8} {shown:<24} {kind:<5} {value:8.1f} units")
    lines.append(f"    {'AWS total':<22} ${usd * month:>10,.2f} a month (${usd * 1e6:,.2f} per million sweeps)")
    return lines


def _arc(arc: Arc) -> Arc:
    return {"units": {}, "harness": {}, "model_calls": 0, "table": "", **arc}


def run() -> list[Figure]:
    try:
        from tests.support.servers.dynamodb import LocalUnavailable
    except ImportError as exc:
        print(f"  skipped: needs boto3 and the test servers: {exc}")
        return []
    from .dynamodb import _endpoint

    try:
        with _endpoint() as endpoint:
            try:
                arcs = harness_counts(endpoint)
            except ImportError as exc:  # the harness synthesizes the stack: the infra extra
                print(f"  skipped: no fidelity harness ({exc}); it runs the deployed functions this counts")
                return []
            paths = commit_bills(endpoint)
    except LocalUnavailable as exc:
        print(f"  skipped: no DynamoDB to count on ({exc})")
        return []
    for line in report(arcs):
        print(line)
    from .workloads import EVENTS_PER_TURN, TURNS

    print(f"  write units of a W1 commit ({EVENTS_PER_TURN} events of 1 KB, the last of {TURNS}), by commit path:")
    for path, commit in paths.items():
        places = ", ".join(f"{k} {v:.0f}" for k, v in commit.units.items())
        print(
            f"    {path:<9} {commit.calls} calls: {places}; {commit.total:.0f} WCU, "
            f"${commit.total * PRICES['dynamodb_write_unit'] * 1e6:.2f} per million commits"
        )
    if QUICK:
        print("  (BENCH_QUICK: the arcs are the same size; only the warm-up differs)")
    return []
