"""A busy day in the deployment-fidelity harness: many sessions at once through the template's own functions, with
AWS's capacity enforced as AWS enforces it (``tests/support/fidelity/capacity.py``): each function's reserved
concurrency, API Gateway's stage throttle, Step Functions' API token buckets and DynamoDB's per-partition throughput.

The day (``busy_day``): ``SLEEPING`` sessions are parked on a sign-off across many tenants; then ``TURNING``
sessions post a turn at once, most of them in one hot tenant, each a chat turn (``signoffs=0``) or a turn that
parks and is answered as soon as its sign-off shows (often while it is still parking), and a tenth of the sleepers
are answered meanwhile. Clients behave as a well-written client does: a 429 is retried after its ``Retry-After``,
anything else is recorded. Then two sweeps. The day is scaled by ``DORMANT_BUSY_DAY_TURNING`` and
``DORMANT_BUSY_DAY_SLEEPING`` (200 and 200 by default: the issue's 200 turning; its 2,000 sleeping with the knob).

What the day proves is split in tests by owner: nothing lost, doubled or stuck (the stack's promise); every throttle
a 429 with ``Retry-After`` (``test_every_throttle_is_a_429_with_retry_after``, red while a capped function answers
API Gateway 500); and the hot tenant's index partitions' capacity, measured from the units each turn billed.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fidelity.busy_day import HOT, Day, run_day, start
from tests.support.fidelity.calls import evidence

TURNING = int(os.environ.get("DORMANT_BUSY_DAY_TURNING", "200"))
SLEEPING = int(os.environ.get("DORMANT_BUSY_DAY_SLEEPING", "200"))
"""The issue's day has 2,000 sleepers: in the harness each is a create and a turn through three sandboxes, about
8 minutes more on CI's 2 cores; ``DORMANT_BUSY_DAY_SLEEPING=2000`` runs it (the sweeps' reads of healthy waits are
``test_sweep_waits``'s to count)."""
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def busy_day(dynamodb_endpoint: str) -> Iterator[Day]:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    d = start(dynamodb_endpoint)
    try:
        day = run_day(d, TURNING, SLEEPING)
        print(f"busy day: {TURNING} turning, {SLEEPING} sleeping; phases {day.seconds}; answers {day.client.statuses}")
        yield day
    finally:
        d.close()


def _ledgers(day: Day, sessions: list[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    def read(who: tuple[str, str]) -> list[dict[str, Any]]:
        status, body = day.client.call("GET", f"/sessions/{who[1]}/events", tenant=who[0], query={"limit": "1000"})
        assert status == 200, status
        return body["events"]  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(zip(sessions, pool.map(read, sessions), strict=True))


@pytest.mark.backend("dynamodb")
@pytest.mark.xfail(
    strict=False,
    reason="a known defect, not the harness: a POST /runs whose function times out after its claim landed (under "
    "load, Sandbox.Timedout) leaves Powertools' INPROGRESS idempotency record, which expires with the function's "
    "timeout; the client's retry with the same Idempotency-Key then claims a second turn (its message twice). "
    "The fix keys the claim on the ledger (the invocation id derived from the key), so a retry finds its turn",
)
def test_no_event_is_lost_or_doubled(busy_day: Day) -> None:
    """Every accepted turn's message is on its session's ledger once, every answer's result once, no event twice."""
    day = busy_day
    sessions = sorted(set(day.turned) | set(day.answered))
    for who, events in _ledgers(day, sessions).items():
        ids = [e.get("id") or e.get("event_id") for e in events]
        assert len(ids) == len(set(ids)), (who, "an event twice")
        users = [e for e in events if e["type"] == "user"]
        assert len(users) == day.turned.get(who, 0) + (1 if who[1].startswith("sleep-") else 0), (who, users)
        answers = [e for e in events if e["type"] == "tool_input"]
        assert len(answers) == day.answered.get(who, 0), (who, [e["type"] for e in events])  # each answer once
        results = [e for e in events if e["type"] == "tool_result"]
        assert len(results) <= len(answers), (who, [e["type"] for e in events])  # acted on once at most


@pytest.mark.backend("dynamodb")
@pytest.mark.xfail(
    strict=False,
    reason="open (issue 34): at 200 turning, resume (25) and park (5) at their reserved concurrency answer "
    "thousands of TooManyRequestsException; sessions are still left `running` after two sweeps with the throttle "
    "retrier and RecordFailure on park in the stack (3 runs on main); the cause is not yet isolated",
)
def test_after_two_sweeps_no_session_is_running_or_waiting_unwatched(busy_day: Day) -> None:
    """No session is left ``running``; every waiting one has an execution parked on it, to be woken."""
    day, d = busy_day, busy_day.d
    everyone = sorted({*day.turned, *day.sleepers})

    def state(who: tuple[str, str]) -> tuple[tuple[str, str], str]:
        status, shown = day.client.call("GET", f"/sessions/{who[1]}", tenant=who[0])
        assert status == 200, status
        return who, shown["status"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = dict(pool.map(state, everyone))
    running = [w for w, s in statuses.items() if s == "running"]
    assert not running, (len(running), running[:5], [s["turns"][:5] for s in day.sweeps], evidence(d))
    unwatched = []
    for who, status in statuses.items():
        if status in ("awaiting_input", "resumable"):
            live = [e for e in d.executions_of(who[0], who[1]) if e.status == "RUNNING"]
            if len(live) != 1 or live[0].states[-1] != "Park":
                unwatched.append((who, status, [(e.status, e.states[-1:]) for e in d.executions_of(*who)]))
    assert not unwatched, (len(unwatched), unwatched[:5], day.sweeps)


@pytest.mark.backend("dynamodb")
@pytest.mark.xfail(
    strict=False,
    reason="open (issue 34): a Task whose function is at its reserved concurrency (park: 5) can exhaust its Retry "
    "of Lambda.TooManyRequestsException in the harness's scaled time; RecordFailure then ends the turn in error",
)
def test_every_turn_and_every_answer_completes(busy_day: Day) -> None:
    day, d = busy_day, busy_day.d
    finished = sorted({*day.turned, *(w for w in day.answered if w[1].startswith("sleep-"))})

    def state(who: tuple[str, str]) -> tuple[tuple[str, str], str]:
        return who, day.client.call("GET", f"/sessions/{who[1]}", tenant=who[0])[1]["status"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = dict(pool.map(state, finished))
    undone = [
        w
        for w, s in statuses.items()
        if s != "completed" and not (w in day.turned and w not in day.answered and int(w[1].split("-")[1]) % 2 == 1)
    ]
    errors = Counter(
        (e.error, e.states[-1] if e.states else "") for w in undone for e in d.executions_of(*w) if e.error
    )
    assert not undone, (len(undone), Counter(statuses[w] for w in undone), errors, day.client.refused_answers[:2])


@pytest.mark.backend("dynamodb")
@pytest.mark.xfail(
    strict=False,
    reason="open (issue 34), cause found: a Park task that exhausts its Retry of Lambda.TooManyRequestsException "
    "at park's cap (5) in the harness's scaled time goes to RecordParkFailure, which ends the waiting turn in error "
    "(execution states Park, RecordParkFailure, Failed): the answer to the call the session showed waiting a moment "
    "before is then 409 UnknownCallId, 'no call is waiting'. The Park's retry and what RecordParkFailure ends (a "
    "wait whose token was never stored could be left to the sweeper) are the workflow's to change",
)
def test_an_answer_to_the_call_a_session_shows_waiting_is_taken(busy_day: Day) -> None:
    day = busy_day
    refused = day.client.refused_answers
    assert not refused, (
        len(refused),
        [
            (sid, status, str(body), shown, [(e.status, e.error, e.states[-3:]) for e in day.d.executions_of(t, sid)])
            for t, sid, status, body, shown, _ in refused[:3]
        ],
    )


@pytest.mark.backend("dynamodb")
def test_every_throttle_is_a_429_with_retry_after(busy_day: Day) -> None:
    """No 5xx (a throttled function behind a proxy integration is API Gateway's 500, a timed-out one its 502 or 504):
    every refusal for load is a 429 with ``Retry-After``; counted by route, and the failed invocations by function."""
    client, d = busy_day.client, busy_day.d
    refused = client.throttles
    failed = Counter((f, kind) for f, kind, _ in d.errors() if f in ("sessions", "run", "tools", "commit"))
    assert not [s for s, _, _ in refused if s >= 500], (client.refusals, failed)
    assert all(s == 429 and {k.lower() for k in h} >= {"retry-after"} for s, h, _ in refused), refused[:3]


@pytest.mark.backend("dynamodb")
def test_the_hot_tenants_index_partitions_stay_under_a_partitions_rate(busy_day: Day) -> None:
    """From the units the day billed each partition in the hot tenant (its sessions' creates, turns and answers, per
    accepted turn): the turns a second the tenant can take before its busiest listing or status partition reaches
    1,000 write units a second, with the stack's default listing shards, against one shard; and that it is well
    above what the stage's default throttle lets through for the whole stack."""
    from tests.support.fidelity.capacity import PARTITION_WRITE_UNITS, stage_throttle

    day = busy_day
    accountant = day.d.accountant
    hot = [(p, u) for p, u in accountant.units.items() if p[2] == "write" and f"@{HOT}" in p[1] and "/" in p[0]]
    listing = [(p, u) for p, u in hot if p[0].endswith("/listing")]
    status = [(p, u) for p, u in hot if p[0].endswith("/status")]
    turns = sum(n for (tenant, _), n in day.turned.items() if tenant == HOT)
    assert turns and listing and status
    per_turn_hottest = max(u for _, u in listing + status) / turns
    # with one shard, each index's entries of a tenant (of a status) would all be one partition
    unsharded: Counter[tuple[str, str]] = Counter()
    for (place, key, _), units in listing + status:
        unsharded[(place, re.sub(r"#\d+$", "", key))] += units
    per_turn_one_shard = max(unsharded.values()) / turns
    capacity = PARTITION_WRITE_UNITS / per_turn_hottest
    one_shard = PARTITION_WRITE_UNITS / per_turn_one_shard
    print(f"hot tenant: {turns} turns; {capacity:.0f} turns/s per tenant (one listing shard: {one_shard:.0f})")
    assert len({p[1] for p, _ in listing}) > 1  # the default spreads a tenant's listing over shards
    assert capacity >= 2 * one_shard, (capacity, one_shard)
    throttle = stage_throttle(day.d.template)
    assert throttle is not None and capacity >= 3 * throttle[0], (capacity, throttle)
