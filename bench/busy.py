"""A busy day at AWS's capacity: per function, a turn's latency (p50, p99), the throttles, and the cost per turn.

The day of ``tests/support/fidelity/busy_day.py`` in the deployment-fidelity harness, with AWS's capacity enforced
(``capacity.py``: reserved concurrency, the stage's throttle, Step Functions' API buckets, DynamoDB's partitions):
sleepers parked, then many turns at once, most in one hot tenant, answers arriving while sessions park. What the
busy phase alone did is counted:

* per function: its invocations' durations (p50, p99: in the harness's sandboxes on this machine, so the figures
  compare functions and loads, not AWS's absolute times) and the times Lambda refused it (its concurrency);
* throttles elsewhere: the stage (429 before any function), Step Functions' API actions, DynamoDB partitions;
* the AWS cost per turn at that load (``cost.bill``, ``prices.py``): Lambda GB-seconds and requests, API requests
  (retries of throttled ones included), state transitions (retries included), DynamoDB units per partition as
  billed; a turn is an accepted ``POST /runs`` or an answer (each runs a turn on to its end).

Sizes: ``BENCH_QUICK`` 20 turning and 40 sleeping; else ``DORMANT_BUSY_DAY_TURNING``/``_SLEEPING`` (200, 2,000).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter, defaultdict
from typing import Any

from .common import Figure, scale
from .cost import _transitions, bill


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest-rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def report(day: Any) -> list[str]:
    """The printed lines: per function, then the throttles, then the cost per turn at load."""
    d, load = day.d, day.load
    invocations = load.invocations(d)
    turns = sum(day.turned.values()) + sum(day.answered.values())
    lines = [
        f"  {sum(day.turned.values())} turns posted at once ({sum(n for (t, _), n in day.turned.items() if t == 'hot')}"
        f" in the hot tenant), {sum(day.answered.values())} answers, {len(day.sleepers)} sleeping; "
        f"phases: {', '.join(f'{k} {v:.0f} s' for k, v in day.seconds.items())}",
        f"  {'function':<10} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'throttled':>9}",
    ]
    by_function: dict[str, list[float]] = defaultdict(list)
    throttled: Counter[str] = Counter()
    gbs: dict[str, float] = defaultdict(float)
    for invocation in invocations:
        if invocation.throttled:
            throttled[invocation.function] += 1
            continue
        by_function[invocation.function].append(invocation.seconds)
        gbs[f"gbs:{invocation.function}"] += invocation.seconds * d.functions[invocation.function].memory / 1024
    for name in sorted(set(by_function) | set(throttled)):
        seconds = by_function.get(name) or [0.0]
        lines.append(
            f"  {name:<10} {len(by_function.get(name, [])):>6} {percentile(seconds, 0.5) * 1000:>8.0f} "
            f"{percentile(seconds, 0.99) * 1000:>8.0f} {throttled[name]:>9}"
        )
    if day.turn_seconds:
        lines.append(
            f"  POST /runs accepted after: p50 {statistics.median(day.turn_seconds) * 1000:.0f} ms, "
            f"p99 {percentile(day.turn_seconds, 0.99) * 1000:.0f} ms (throttles waited out)"
        )
    others = Counter({what: n for (who, what), n in load.throttles().items() if who in ("gateway", "states")})
    partitions: Counter[str] = Counter()
    for (who, what), n in load.throttles().items():
        if ":" in what:  # a DynamoDB partition, as the function that met it
            partitions[f"{_short(d, who)} on {what.split('/', 1)[-1] if '/' in what else 'table'}"] += n
    lines.append(
        "  throttles: "
        + (", ".join(f"{what} {n}" for what, n in sorted((others + partitions).items())) or "none")
        + f"; client answers: {dict(sorted(day.client.statuses.items()))}"
    )
    units: Counter[tuple[str, str, str]] = Counter()
    for (place, _, kind), billed in load.units().items():  # every partition's units, summed by place and kind
        units[("all", place, kind)] += billed
    harness = {
        **gbs,
        "lambda_requests": float(len(invocations)),
        "api_requests": float(load.requests()),
        "transitions": float(sum(_transitions(e) for e in load.executions(d))),
    }
    lines_bill = bill(units, harness, 0)
    total = sum(v for k, v in lines_bill.items() if k != "model")
    per_turn = {k: v / max(1, turns) for k, v in lines_bill.items() if k not in ("model", "logs")}
    lines.append(
        f"  AWS cost per turn at load: ${total / max(1, turns) * 1e6:,.0f} per million turns ("
        + ", ".join(f"{k} ${v * 1e6:,.0f}" for k, v in per_turn.items())
        + "; logs not counted here)"
    )
    return lines


def _short(d: Any, function: str) -> str:
    try:
        return str(d.lambdas.name_of(function))
    except KeyError:
        return function


def run() -> list[Figure]:
    try:
        from tests.support.fidelity.busy_day import run_day, start
        from tests.support.servers.dynamodb import LocalUnavailable
    except ImportError as exc:
        print(f"  skipped: needs boto3 and the test servers: {exc}")
        return []
    from .dynamodb import _endpoint

    turning = scale(int(os.environ.get("DORMANT_BUSY_DAY_TURNING", "200")), 20)
    sleeping = scale(int(os.environ.get("DORMANT_BUSY_DAY_SLEEPING", "2000")), 40)
    try:
        with _endpoint() as endpoint:
            try:
                d = start(endpoint)
            except ImportError as exc:  # the harness synthesizes the stack: the infra extra
                print(f"  skipped: no fidelity harness ({exc})")
                return []
            try:
                day = run_day(d, turning, sleeping)
                for line in report(day):
                    print(line)
            finally:
                d.close()
    except LocalUnavailable as exc:
        print(f"  skipped: no DynamoDB to run on ({exc})")
    return []
