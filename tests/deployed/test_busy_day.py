"""A busy day in the deployment-fidelity harness: many sessions at once through the template's own functions, with
AWS's capacity enforced as AWS enforces it (``tests/support/fidelity/capacity.py``): each function's reserved
concurrency, API Gateway's stage throttle, Step Functions' API token buckets and DynamoDB's per-partition throughput.

The day (``busy_day``): ``SLEEPING`` sessions are parked on a sign-off across many tenants; then ``TURNING``
sessions post a turn at once, most of them in one hot tenant, each a chat turn (``signoffs=0``) or a turn that
parks and is answered as soon as its sign-off shows (often while it is still parking), and one sleeper in fifty
is answered meanwhile; one turning client in three waits for its turn (``Prefer: wait``: run inline by ``run`` and
``tools``). Clients behave as a well-written client does: a 429 is retried after its ``Retry-After``,
anything else is recorded. Then two sweeps. The day is scaled by ``DORMANT_BUSY_DAY_TURNING`` and
``DORMANT_BUSY_DAY_SLEEPING`` (the issue's 200 and 2,000 by default). A tenth of the sleepers are parked through the
API, the others seeded as what a parked session is (``tests/support/fidelity/sleepers.py`` says what a seeded
sleeper does and does not exercise): each still parked by its own execution through the park function.

What the day proves is split in tests by owner: nothing lost, doubled or stuck (the stack's promise); every throttle
a 429 with ``Retry-After`` (``test_every_throttle_is_a_429_with_retry_after``, red while a capped function answers
API Gateway 500); and the hot tenant's index partitions' capacity, measured from the units each turn billed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fidelity.busy_day import HOT, Day, run_day, start
from tests.support.fidelity.calls import evidence

TURNING = int(os.environ.get("DORMANT_BUSY_DAY_TURNING", "200"))
SLEEPING = int(os.environ.get("DORMANT_BUSY_DAY_SLEEPING", "2000"))
"""The issue's day has 2,000 sleepers: one in ten a create and a turn through the gateway and four sandboxes, the
others seeded (a ledger written by the library, an execution parked through the park function: two sandboxes)."""
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def busy_day(dynamodb_endpoint: str) -> Iterator[Day]:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    d = start(dynamodb_endpoint)
    try:
        day = run_day(d, TURNING, SLEEPING)
        print(
            f"busy day: {TURNING} turning, {SLEEPING} sleeping; phases {day.seconds}; answers {day.client.statuses};"
            f" held (Prefer: wait) {day.held}"
        )
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
def test_after_two_sweeps_no_session_is_running_or_waiting_unwatched(busy_day: Day) -> None:
    """No session is left ``running``; every waiting one has an execution parked on it, to be woken, and none is
    left ``resumable``: its answers are in, so the wake-up (the answer's, else the sweeper's) is past due."""
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
        if status == "resumable":  # answered, and two sweeps later still parked: nobody is left to wake it
            unwatched.append((who, status, [(e.status, e.states[-1:]) for e in d.executions_of(*who)]))
        elif status == "awaiting_input":
            live = [e for e in d.executions_of(who[0], who[1]) if e.status == "RUNNING"]
            if len(live) != 1 or live[0].states[-1] != "Park":
                unwatched.append((who, status, [(e.status, e.states[-1:]) for e in d.executions_of(*who)]))
    assert not unwatched, (len(unwatched), unwatched[:5], day.sweeps)


@pytest.mark.backend("dynamodb")
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
def test_a_client_that_waits_gets_its_turn_inline_or_handed_on(busy_day: Day) -> None:
    """The clients that wait (``Prefer: wait``) were each answered 200 (the turn run inline: ended or parked) or 202
    (handed on), and a session whose held requests were all answered 200 ran its turn in ``run`` and ``tools``, not
    in the workflow: none of its executions entered ``Run``. Some did, on both routes, so the day's other tests held
    the inline paths to the same promises at the held routes' throttles."""
    day, d = busy_day, busy_day.d
    statuses = Counter(answer for answers in day.held.values() for answer in answers)
    assert {status for _, status in statuses} <= {200, 202, 409}, statuses
    inline = [who for who, answers in day.held.items() if all(status == 200 for _, status in answers)]
    ran = {who: [e.states for e in d.executions_of(*who) if "Run" in e.states] for who in inline}
    assert not any(ran.values()), [(who, states) for who, states in ran.items() if states][:3]
    answered_inline = [who for who in inline if ("tools", 200) in day.held[who]]
    assert len(inline) > len(answered_inline) > 0, (statuses, len(inline), len(answered_inline))


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


@pytest.mark.backend("dynamodb")
def test_every_sleeper_sleeps_on_through_the_day_and_no_sweep_reads_one(busy_day: Day) -> None:
    """Every sleeper nobody answered, seeded or parked through the API, is still waiting after the day and its two
    sweeps, with one execution alive in ``Park``; and the sweeps read none of them (no unit billed on a sleeper's
    partitions while they ran, by the sweeper or by anything it started): sleeping costs nothing."""
    from tests.support.fidelity.sleepers import stored_statuses, through_api

    day, d = busy_day, busy_day.d
    asleep = [who for who in day.sleepers if who not in day.answered]
    assert asleep and any(through_api(int(sid.split("-")[1])) for _, sid in asleep)

    statuses = stored_statuses(d, asleep)  # read off the table here: 2,000 GETs through the sandboxes take minutes
    assert Counter(statuses.values()) == {"awaiting_input": len(asleep)}, Counter(statuses.values())
    sample = asleep[:: max(1, len(asleep) // 40)]  # and as a client sees them
    assert [day.client.call("GET", f"/sessions/{sid}", tenant=t)[1]["status"] for t, sid in sample] == [
        statuses[who] for who in sample
    ]
    parked: Counter[tuple[str, str]] = Counter()
    for execution in d.executions():
        if execution.status == "RUNNING" and execution.parked is not None:
            parked[(json.loads(execution.input)["tenant"], json.loads(execution.input)["session_id"])] += 1
    unwatched = [who for who in asleep if parked[who] != 1]
    assert not unwatched, (len(unwatched), unwatched[:5])
    names = {sid for _, sid in asleep}
    read = {key for (_, key, _), units in day.swept.items() if units and set(re.findall(r"sleep-\d+", key)) & names}
    assert not read, sorted(read)[:5]
