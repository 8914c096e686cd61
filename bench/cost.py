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

import json
import math
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from . import cost_docs
from .commit_bill import commit_bills
from .common import QUICK, Figure
from .cost_docs import aws_total
from .prices import DATE, LONG_POLL_SECONDS, MODEL, PRICES, REGION
from .units import (
    Table,
    call_units,
    item_kind,
    item_size,
    labelled_units,
    read_units,
    transaction_units,
    value_size,
)

__all__ = ["arc_costs", "bill", "figures", "item_size", "report", "run", "transaction_units", "value_size"]

CHAT = "hello"
BOOKING = "I need physio on Tuesday afternoon, for Alex Doe"
ARCS = ("chat", "approval", "approval_day", "approval_timeout", "commit")
WHAT = {
    "chat": "one chat turn",
    "approval": "an approval turn: run, park, answer, resume",
    "approval_day": "the approval answered a day later: run, park, a day of sweeps, answer, resume",
    "approval_timeout": "the approval never answered: run, park, then Expire at the wait's timeout",
    "commit": "a remote runner's turn committed: POST /commit of 2 events; its compute and model are its own",
}
NOT_THE_TURNS = {"sessions", "sweeper"}
"""Functions whose calls in an arc are not the turn's: the test's own (the session's create, the reads of the
outcome); the sweeps an arc makes while its session waits are billed as their difference (``sweeps_while_waiting``)."""
TURN_WAITS = {"chat": 1, "approval": 2, "approval_day": 2, "approval_timeout": 1, "commit": 0}
"""Turns a client waits on in each arc (a long-poll each unless answered inline: ``POST /runs`` and ``POST /tools``
with ``Prefer: wait``): an approval's run and the rest after its answer; not the Expire."""
TIMEOUT_ARC_SECONDS = 8
"""The harness's wait for the timeout arc (the template's default is 7 days: its sweeps are billed at that)."""

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
        default_wait = deployment.template.parameter("WaitTimeoutSeconds")
        for round_ in ("warm", "measured", "captured"):
            for arc in (*ARCS, "sweep"):
                deployment.lambdas.capture(round_ == "captured")
                start = len(deployment.lambdas.dynamodb)
                sweeps: dict[str, tuple[int, int]] = {}
                if arc == "sweep":
                    measured, tenant, sid = _sweep(deployment), "", ""
                else:
                    measured, tenant, sid = _harness_arc(deployment, arc, sweeps)
                deployment.lambdas.capture(False)
                if round_ == "measured":
                    arcs[arc]["harness"] = measured
                if round_ == "captured":
                    records = deployment.lambdas.dynamodb[start:]
                    turns = records if arc == "sweep" else [r for r in records if r["function"] != "sweeper"]
                    arcs[arc]["units"] = _units(turns, tables)
                    arcs[arc]["labelled"] = _labelled(turns, tables)
                    arcs[arc]["floor"] = _floor(turns, TURN_WAITS.get(arc, 0))
                    arcs[arc]["model_calls"] = _model_calls(deployment, tenant, sid) if sid else 0
                    for name, (first, last) in sweeps.items():
                        arcs[arc][name] = _units(deployment.lambdas.dynamodb[first:last], tables)
        arcs["sweep"]["every_minutes"] = _sweep_minutes(deployment)
        arcs["sweep"]["wait_seconds"] = float(default_wait)
        return arcs
    finally:
        deployment.close()


def _transitions(execution: Any) -> int:
    """State transitions Step Functions bills an execution: each state entered, and each retry of a task."""
    kinds = [event["type"] for event in execution.history]
    retries = kinds.count("TaskScheduled") - kinds.count("TaskStateEntered")
    return len(execution.states) + max(0, retries)


LOGGED: dict[str, Callable[[str], bool]] = {
    "ALL": lambda kind: True,
    "ERROR": lambda kind: kind.endswith(("Failed", "TimedOut", "Aborted")) or kind == "FailStateEntered",
    "FATAL": lambda kind: kind in ("ExecutionFailed", "ExecutionAborted", "ExecutionTimedOut"),
    "OFF": lambda kind: False,
}
"""Which history events each of the state machine's log levels sends to its log group, by event type."""


def _log_level(d: Any) -> str:
    """The state machines' log level, from the template (``LoggingConfiguration``; none: ``OFF``): the sessions
    machine and the waits machine log at one level (``-c workflow_log_level``)."""
    machines = d.template.of_type("AWS::StepFunctions::StateMachine").values()
    (level,) = {str(m["Properties"].get("LoggingConfiguration", {}).get("Level", "OFF")) for m in machines}
    return level


def _sfn_log_bytes(execution: Any, level: str = "ALL") -> int:
    """What the state machine's log group ingests for an execution at its log ``level``: one record per history
    event the level logs (``LOGGED``; without execution data), as Step Functions writes them (id, type, details
    without input or output, the previous event's id, the timestamp, the execution's ARN, the redrive count)."""
    total = 0
    for event in execution.history:
        if not LOGGED[level](event["type"]):
            continue
        details = event.get("details") if isinstance(event.get("details"), dict) else {}
        kept = {k: v for k, v in (details or {}).items() if k in ("resource", "error", "name")}
        kept["inputDetails" if "Entered" in event["type"] else "outputDetails"] = {"truncated": False}
        record = {
            "id": str(event["id"]),
            "type": event["type"],
            "details": kept,
            "previous_event_id": str(event["id"] - 1),
            "event_timestamp": str(int(event["timestamp"] * 1000)),
            "execution_arn": execution.arn,
            "redrive_count": "0",
        }
        total += len(json.dumps(record, separators=(",", ":"), default=str).encode())
    return total


def _sweep(d: Any, grace_seconds: float | None = None) -> dict[str, float]:
    """One scheduled sweep (the schedule's event), over the sessions the arcs left: GB-seconds and log bytes."""
    invocations, logs = len(d.lambdas.invocations), len(d.log("sweeper").encode())
    d.sweep(grace_seconds=grace_seconds)
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
        if record["function"] == "sessions":  # the test's own: the create, the reads of the outcome
            continue
        for (place, kind), value in call_units(record, tables).items():
            units[(record["function"], place, kind)] += value
    return dict(units)


def _labelled(records: list[dict[str, Any]], tables: dict[str, Table]) -> dict[tuple[str, str, str, str], float]:
    """The units of the turn's calls by (function, place, read|write, item kind): where each unit went."""
    units: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for record in records:
        if record["function"] == "sessions":
            continue
        for (place, kind, label), value in labelled_units(record, tables).items():
            units[(record["function"], place, kind, label)] += value
    return dict(units)


HEAD = {"pk": {"S": "S#app#session-id"}, "sk": {"S": "#M"}, "version": {"N": "12"}, "status": {"S": "completed"}}
"""The floor's head: what a session's head must hold (its key, version and status) and the time it moved."""


def _floor(records: list[dict[str, Any]], turns: int) -> dict[str, float]:
    """What the turn's writes must cost: the event items it stored (each once, at its size) and the session's
    head, written in one transaction per turn the client waits on (at least one), 2 units per KB of each item;
    no index entry, no id item, no touch, no token record. ``events`` and ``bytes`` say what it holds."""
    events: dict[tuple[str, str], int] = {}
    for record in records:
        if record["function"] == "sessions":
            continue
        for _, after in record.get("images", []):
            if after is not None and item_kind(after) == "event":
                events[(after["pk"]["S"], after["sk"]["S"])] = item_size(after)
    head = {**HEAD, "updated_at": {"N": str(int(time.time() * 1000))}}
    heads = max(1, turns)
    units = sum(transaction_units(size) for size in events.values()) + heads * transaction_units(item_size(head))
    return {"write": float(units), "events": float(len(events)), "bytes": float(sum(events.values())), "heads": heads}


def _model_calls(d: Any, tenant: str, sid: str) -> int:
    _, _, page = d.api("GET", f"/sessions/{sid}/events", tenant=tenant, query={"limit": "1000"})
    return sum(1 for e in page["events"] if e["type"] == "model_end")


def _harness_arc(d: Any, arc: str, sweeps: dict[str, tuple[int, int]]) -> tuple[dict[str, float], str, str]:
    """One arc as a fresh caller (a Cognito ``sub``: the Bookings slots are the tenant's, each booked once).
    ``sweeps`` gets the range of DynamoDB calls (``d.lambdas.dynamodb``) of the sweeps ``approval_day`` and
    ``approval_timeout`` make: one while the session waits (its commits past any grace: as a day later) and one
    once it ended; the difference is what its wait adds to each sweep of the schedule."""
    if arc == "approval_timeout":
        default = d.template.parameter("WaitTimeoutSeconds")
        d.update({"WaitTimeoutSeconds": TIMEOUT_ARC_SECONDS})
        try:
            return _harness_arc_run(d, arc, sweeps)
        finally:
            d.update({"WaitTimeoutSeconds": default})
    return _harness_arc_run(d, arc, sweeps)


def _swept(d: Any, sweeps: dict[str, tuple[int, int]], name: str) -> None:
    start = len(d.lambdas.dynamodb)
    _sweep(d, grace_seconds=0)
    sweeps[name] = (start, len(d.lambdas.dynamodb))


def _harness_arc_run(d: Any, arc: str, sweeps: dict[str, tuple[int, int]]) -> tuple[dict[str, float], str, str]:
    tenant = str(uuid.uuid4())
    invocations, executions = len(d.lambdas.invocations), {e.arn for e in d.executions()}
    logs = {name: len(d.log(name).encode()) for name in d.functions}
    requests = 0
    counted: dict[str, float] = defaultdict(float)

    def api(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        nonlocal requests
        requests += 1
        counted[f"api:{d._route(method, path)[1]}"] += 1  # the function the route invokes
        status, _, answer = d.api(method, path, body, tenant=tenant, headers=headers)
        assert status < 300, (status, answer)
        return status, answer

    sid = f"cost-{uuid.uuid4().hex[:10]}"
    d.api("POST", "/sessions", {"session_id": sid, "scopes": {}}, tenant=tenant)  # not the turn's
    inline_calls = tools_calls = 0
    if arc == "commit":  # the runner's own compute and model are not on this bill
        events = [{"type": "user", "text": BOOKING}, {"type": "user", "text": CHAT}]
        api("POST", f"/sessions/{sid}/commit", {"expected_version": 1, "events": events})
        inline = 0
    else:  # the client waits for the turn anyway: it asks the run function to hold (and so to run it)
        held = {"Prefer": f"wait={LONG_POLL_SECONDS}"}
        status, _ = api("POST", f"/sessions/{sid}/runs", {"message": CHAT if arc == "chat" else BOOKING}, held)
        inline = 1 if status == 200 else 0  # answered with the turn (ended or parked): no long-poll for it
        inline_calls = _model_calls(d, tenant, sid) if inline else 0  # the calls the run function made
    d.settle(60)
    if arc in ("approval", "approval_day"):
        _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=tenant)
        (call,) = shown["yielded_tools"]
        if arc == "approval_day":
            _swept(d, sweeps, "sweep_waiting")
        before = _model_calls(d, tenant, sid)
        # the client waits for the rest of the turn too: the tools function runs it (issue 36)
        answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
        status, _ = api("POST", f"/sessions/{sid}/tools", answers, {"Prefer": f"wait={LONG_POLL_SECONDS}"})
        if status == 200:  # answered with the finished turn: no long-poll for it
            inline += 1
            tools_calls = _model_calls(d, tenant, sid) - before
        d.settle(60)
        if arc == "approval_day":
            _swept(d, sweeps, "sweep_after")
    if arc == "approval_timeout":  # its execution sleeps to the wait's timeout, then Expire ends the turn
        _swept(d, sweeps, "sweep_waiting")  # a sweep while it sleeps: due only at its timeout, not read
        deadline = time.monotonic() + TIMEOUT_ARC_SECONDS + 60
        while d.api("GET", f"/sessions/{sid}", tenant=tenant)[2]["status"] == "awaiting_input":
            assert time.monotonic() < deadline, "the wait never timed out"
            time.sleep(0.25)
        d.settle(60)
        _swept(d, sweeps, "sweep_after")
    _, _, shown = d.api("GET", f"/sessions/{sid}", tenant=tenant)
    ended = "error" if arc == "approval_timeout" else "completed"
    assert shown["status"] == ended or (arc == "commit" and shown["version"] == 2), shown
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
    fresh = [e for e in d.executions() if e.arn not in executions]
    counted["transitions"] = sum(_transitions(e) for e in fresh)
    level = _log_level(d)
    counted["sfn_log_bytes"] = sum(_sfn_log_bytes(e, level) for e in fresh)
    # What the harness's instant model leaves out: the wait on each call in the function that made it (run for
    # a turn it ran inline, resume for the rest), and the client's long-poll (GET /events?wait=25 on
    # ``sessions``) held while a turn it was not answered with runs, a request per 25 s of it.
    calls = _model_calls(d, tenant, sid) if arc != "commit" else 0
    latency = float(MODEL["latency_seconds"])
    waited = (calls - inline_calls - tools_calls) * latency
    counted["model_calls:run"], counted["model_calls:tools"] = inline_calls, tools_calls
    counted["model_calls:resume"] = calls - inline_calls - tools_calls
    held = inline_calls * memory["run"] + tools_calls * memory["tools"]
    counted["model_wait_gbs"] = (held * latency + waited * memory["resume"]) / 1024
    polled = TURN_WAITS[arc] - inline
    counted["poll_turns"] = polled
    counted["poll_requests"] = max(polled, math.ceil(waited / LONG_POLL_SECONDS)) if polled else 0
    counted["poll_gbs"] = waited * memory["sessions"] / 1024 if polled else 0
    looks = polled * _looks(waited / polled) if polled else 0
    counted["poll_looks"] = looks
    counted["poll_read_units"] = looks * read_units(1024, "strong") if looks else 0.0
    for name in d.functions:
        logged = len(d.log(name).encode()) - logs[name]
        if logged and name not in NOT_THE_TURNS:
            counted[f"logs:{name}"] = logged
            counted["log_bytes"] += logged
    return dict(counted), tenant, sid


def _looks(seconds: float) -> int:
    """The reads a held ``GET /events`` makes while a turn runs ``seconds``, and the one that finds it ended:
    ``serving.http.waits.await_events`` looks after 0.1 s, then at a pause doubling to 1 s."""
    from dormant.serving.http import waits

    looks, at, pause = 0, 0.0, waits._WAIT_FIRST
    while True:
        at, looks = at + pause, looks + 1
        pause = min(pause * 2, waits._WAIT_LONGEST)
        if at >= seconds:
            return looks


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
    polls = harness.get("poll_requests", 0)
    return {
        "dynamodb writes": writes * PRICES["dynamodb_write_unit"],
        "dynamodb index writes": index_writes * PRICES["dynamodb_write_unit"],
        "dynamodb reads": reads * PRICES["dynamodb_read_unit"],
        "lambda": gbs * PRICES["lambda_gb_second"] + harness.get("lambda_requests", 0) * PRICES["lambda_request"],
        "lambda model wait": harness.get("model_wait_gbs", 0) * PRICES["lambda_gb_second"],
        "api gateway": harness.get("api_requests", 0) * PRICES["api_request"],
        "client long-poll": polls * (PRICES["api_request"] + PRICES["lambda_request"])
        + harness.get("poll_gbs", 0) * PRICES["lambda_gb_second"]
        + harness.get("poll_read_units", 0) * PRICES["dynamodb_read_unit"],
        "step functions": harness.get("transitions", 0) * PRICES["state_transition"],
        "step functions logs": harness.get("sfn_log_bytes", 0) / 1e9 * PRICES["log_gb"],
        "logs": harness.get("log_bytes", 0) / 1e9 * PRICES["log_gb"],
        "sweeps while waiting": harness.get("sweeps_while_waiting", 0),
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
    totals: dict[str, float] = {}
    for name in ARCS:
        arc = _arc(arcs[name])
        units, harness = arc["units"], _arc_harness(arcs, name)
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
        lines += _kind_lines(arc)
        lines.append(
            f"    not in the harness, added: the wait on {arc['model_calls']} model calls at a stated "
            f"{MODEL['latency_seconds']} s each ({harness.get('model_wait_gbs', 0):.3f} GB-s: "
            f"{harness.get('model_calls:run', 0):.0f} in run, a turn it ran inline, "
            f"{harness.get('model_calls:tools', 0):.0f} in tools, an answered turn it ran inline, "
            f"{harness.get('model_calls:resume', 0):.0f} in resume); the client's long-poll of the "
            f"{harness.get('poll_turns', 0):.0f} turns not answered inline "
            f"(GET /events?wait={LONG_POLL_SECONDS}, {harness.get('poll_requests', 0):.0f} "
            f"requests held {harness.get('poll_gbs', 0):.3f} GB-s of sessions, {harness.get('poll_looks', 0):.0f} "
            "looks each a strongly consistent read of the meta item, as load(after=) reads while nothing moved, and"
            f" the last the turn's events: {harness.get('poll_read_units', 0):.0f} read units);"
            " the state machine's log records "
            f"({harness.get('sfn_log_bytes', 0):.0f} bytes)"
        )
        if name in SLEEPS:
            per_sweep, every, wait_s = _waiting_sweep(arcs, name)
            slept = _slept(name, wait_s)
            lines.append(
                f"    sweeps while it waits: {slept / (every * 60):,.0f} at rate({every} minutes) over"
                f" {slept / 86_400:g} days, each ${per_sweep:.2e} more than a sweep without it (the DynamoDB units"
                " of its own sweep while it waits, less one after it ended)"
            )
        costs = bill(units, harness, arc["model_calls"])
        aws = aws_total(costs)
        totals[name] = aws
        floors = _floor_costs(arc)
        for line, usd in costs.items():
            beside = f"   floor ${floors[line] * 1e6:,.2f}" if line in floors else ""
            lines.append(f"    {line:<22} ${usd * 1e6:>10,.2f} per million turns{beside}")
        at_floor = cost_docs.at_floor(costs, floors)
        lines.append(
            f"    {'AWS total':<22} ${aws * 1e6:>10,.2f} per million turns (model: ${costs['model'] * 1e6:,.2f});"
            f" with DynamoDB at its floor ${at_floor * 1e6:,.2f}"
        )
    if totals.get("approval"):
        lines += _late_lines(arcs, totals)
    if "sweep" in arcs:
        lines += _sweep_lines(_arc(arcs["sweep"]))
    return lines


SLEEPS = ("approval_day", "approval_timeout")
"""The arcs whose session sleeps longer on AWS than in the harness: a day, and the template's wait timeout."""


def _slept(name: str, wait_seconds: float) -> float:
    """How long the arc's session sleeps on AWS: a day, or the template's wait timeout (7 days by default)."""
    return 86_400.0 if name == "approval_day" else wait_seconds


def _arc_harness(arcs: dict[str, Arc], name: str, *, asleep: bool = True) -> dict[str, float]:
    """The arc's counts with what the bench adds by rule: the sweeps of the schedule while its session sleeps
    on AWS (``asleep``; without: its wait ends at once, as in the harness) and the long-poll's last look, which
    reads the turn's events."""
    arc = _arc(arcs[name])
    harness = dict(arc["harness"])
    if name in SLEEPS:
        per_sweep, every, wait_s = _waiting_sweep(arcs, name)
        harness["sweeps_while_waiting"] = per_sweep * _slept(name, wait_s) / (every * 60) if asleep else 0.0
    waits, floor = TURN_WAITS[name], arc.get("floor") or {}
    polled = int(harness.get("poll_turns", waits))  # the turns a long-poll followed (not answered inline)
    if polled and floor:  # the look that finds a turn ended reads its events too (the tail)
        harness["poll_read_units"] = harness.get("poll_read_units", 0) + polled * read_units(
            int(floor["bytes"] / waits), "strong"
        )
    return harness


def arc_costs(arcs: dict[str, Arc], name: str, *, asleep: bool = True) -> dict[str, float]:
    """USD of one arc, by bill line (``bill``), its session asleep for as long as on AWS or (not ``asleep``)
    waking at once."""
    arc = _arc(arcs[name])
    return bill(arc["units"], _arc_harness(arcs, name, asleep=asleep), arc["model_calls"])


def _late_lines(arcs: dict[str, Arc], totals: dict[str, float]) -> list[str]:
    """Late answers, each against the same work done at once (``figures`` holds the targets): the day-late
    answer against one answered at once; the timed-out wait against its own path ending at once, since it does
    less work than an answered one (one turn, not two), which is named line by line beside it."""
    at_once, day, timeout = totals["approval"], totals["approval_day"], totals["approval_timeout"]
    ended_at_once = aws_total(arc_costs(arcs, "approval_timeout", asleep=False))
    _, _, wait_s = _waiting_sweep(arcs, "approval_timeout")
    fewer = {
        line: usd - arc_costs(arcs, "approval_timeout")[line]
        for line, usd in arc_costs(arcs, "approval").items()
        if line != "model"
    }
    named = ", ".join(
        f"{line} ${usd * 1e6:,.2f}" for line, usd in sorted(fewer.items(), key=lambda kv: -kv[1]) if usd * 1e6 >= 0.5
    )
    more = ", ".join(
        f"{line} ${-usd * 1e6:,.2f}" for line, usd in sorted(fewer.items(), key=lambda kv: kv[1]) if -usd * 1e6 >= 0.5
    )
    why = (
        "not a cost left out but work not done, one turn instead of two (no POST /tools, no second Run, its model"
        f" calls, long-poll and transitions); what the answered one pays more: {named}"
        if timeout < at_once
        else "less work at a higher bill: its Expire runs in the workflow (a resume invocation and the transitions"
        f" after Park), where the answered turn ran inline on one transition; what it pays more: {more}; what the"
        f" answered one pays more: {named}"
    )
    return [
        "  late answers (AWS, per million turns), each against the same work done at once:",
        f"    {'answered after a day':<22} ${day * 1e6:>10,.2f} against ${at_once * 1e6:,.2f} answered at once"
        f" ({(day / at_once - 1) * 100:+.1f}%)",
        f"    {'reaches its timeout':<22} ${timeout * 1e6:>10,.2f} against ${ended_at_once * 1e6:,.2f}, its path"
        f" (run, park, Expire) with the wait ending at once ({(timeout / ended_at_once - 1) * 100:+.1f}%;"
        f" {wait_s / 86_400:g} days asleep)",
        f"      and against one answered at once ${at_once * 1e6:,.2f} ({(timeout / at_once - 1) * 100:+.1f}%): {why}",
    ]


def figures(arcs: dict[str, Arc]) -> list[Figure]:
    """The section's targets (``python -m bench cost --check``): a late answer costs what one at once does,
    within 10% (issue 34), each against the same work; a chat turn's DynamoDB write units at most 2x its floor's
    (issue 36). The dollar ratios include measured Lambda time (it moves with the machine's load), so they are
    not ``counted``; the write units are."""
    out: list[Figure] = []
    if all(name in arcs and arcs[name].get("harness") for name in ("approval", *SLEEPS)):
        at_once = aws_total(arc_costs(arcs, "approval"))
        day = aws_total(arc_costs(arcs, "approval_day"))
        timeout = aws_total(arc_costs(arcs, "approval_timeout"))
        ended = aws_total(arc_costs(arcs, "approval_timeout", asleep=False))
        out.append(
            Figure(
                "cost",
                "approval answered a day late / at once ($)",
                f"${day * 1e6:,.2f}/M",
                f"${at_once * 1e6:,.2f}/M",
                day / at_once,
                0.10,
                "within",
            )
        )
        out.append(
            Figure(
                "cost",
                "approval timed out / its path ending at once ($)",
                f"${timeout * 1e6:,.2f}/M",
                f"${ended * 1e6:,.2f}/M",
                timeout / ended,
                0.10,
                "within",
                note=f"{(timeout / at_once - 1) * 100:+.1f}% against one answered at once: one turn, not two",
            )
        )
    out += cost_docs.target_figures(bills(arcs))
    chat = _arc(arcs.get("chat", {}))
    floor = chat.get("floor") or {}
    if floor and chat["labelled"]:
        written = sum(v for (_, _, kind, _), v in chat["labelled"].items() if kind == "write")
        out.append(
            Figure(
                "cost",
                "DynamoDB write units of a chat turn / its floor",
                f"{written:.0f} WCU",
                f"{floor['write']:.0f} WCU",
                written / floor["write"],
                2.0,
                "lower",
                counted=True,
            )
        )
    return out


def bills(arcs: dict[str, Arc]) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Per measured arc, its bill (``arc_costs``) and its floor's DynamoDB lines (``_floor_costs``)."""
    return {
        name: (arc_costs(arcs, name), _floor_costs(_arc(arcs[name])))
        for name in ARCS
        if name in arcs and arcs[name].get("harness")
    }


def docs_table(arcs: dict[str, Arc]) -> list[str]:
    """docs/operating.md's cost table from this run (``cost_docs.table``)."""
    facts: dict[str, dict[str, Any]] = {}
    for name in ARCS:
        arc = _arc(arcs.get(name, {}))
        facts[name] = {
            "written": sum(v for (_, _, kind, _), v in arc["labelled"].items() if kind == "write"),
            "floor": (arc.get("floor") or {}).get("write", 0.0),
        }
    if arcs.get("approval_timeout", {}).get("harness"):
        facts["approval_timeout"]["ended_at_once"] = aws_total(arc_costs(arcs, "approval_timeout", asleep=False))
    return cost_docs.table(facts, bills(arcs))


def _floor_costs(arc: Arc) -> dict[str, float]:
    """The floor's USD for the DynamoDB bill lines (``_floor``): its writes; no index entry."""
    floor = arc.get("floor")
    if not floor:
        return {}
    return {"dynamodb writes": floor["write"] * PRICES["dynamodb_write_unit"], "dynamodb index writes": 0.0}


def _kind_lines(arc: Arc) -> list[str]:
    """Where the arc's units went, by function and kind of item (``units.item_kind``): table writes, each index's
    writes, reads; then the floor (``_floor``) beside the arc's write units."""
    labelled: dict[tuple[str, str, str, str], float] = arc.get("labelled") or {}
    if not labelled:
        return []
    table = arc["table"]
    lines = ["    by kind of item: write units (table + each index), read units:"]
    for function, label in sorted({(f, lab) for f, _, _, lab in labelled}):
        mine = {(p, k): v for (f, p, k, lab), v in labelled.items() if f == function and lab == label}
        written = mine.get((table, "write"), 0.0)
        indexes = {p.partition("/")[2]: v for (p, k), v in mine.items() if k == "write" and "/" in p}
        read = sum(v for (_, k), v in mine.items() if k == "read")
        shown = ", ".join(f"{index} {v:.0f}" for index, v in sorted(indexes.items()))
        lines.append(
            f"      {function:<8} {label:<18} write {written:6.1f}"
            f" + index {sum(indexes.values()):5.1f}{f' ({shown})' if shown else ''}; read {read:5.1f}"
        )
    floor = arc.get("floor")
    if floor:
        writes = sum(v for (_, _, k, _), v in labelled.items() if k == "write")
        lines.append(
            f"    floor: its {floor['events']:.0f} event items ({floor['bytes'] / 1024:.1f} KB) and the session's head,"
            f" one transaction for each of {floor['heads']:.0f} turns: {floor['write']:.0f} write units, against"
            f" {writes:.0f} ({writes / floor['write']:.1f}x)"
        )
    return lines


def _waiting_sweep(arcs: dict[str, Arc], name: str) -> tuple[float, int, float]:
    """What the arc's waiting session adds to a sweep (USD: the DynamoDB units of its own sweep while it waits,
    less its sweep once it ended; never below 0), the schedule's minutes and the template's wait."""
    arc = arcs.get(name, {})
    sweep = arcs.get("sweep", {})
    every, wait_s = int(sweep.get("every_minutes", 5)), float(sweep.get("wait_seconds", 7 * 86_400))
    if "sweep_waiting" not in arc:
        return 0.0, every, wait_s

    def usd(units: dict[tuple[str, str, str], float]) -> float:
        return aws_total(bill(units, {}, 0))

    return max(0.0, usd(arc["sweep_waiting"]) - usd(arc.get("sweep_after", {}))), every, wait_s


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
    return {"units": {}, "harness": {}, "model_calls": 0, "table": "", "labelled": {}, "floor": {}, **arc}


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
    checked = figures(arcs)
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
    if os.environ.get("BENCH_WRITE_DOCS") == "1":
        cost_docs.write(docs_table(arcs))
        print(f"  wrote the cost table of {cost_docs.DOCS.relative_to(cost_docs.DOCS.parents[1])}")
    return checked
