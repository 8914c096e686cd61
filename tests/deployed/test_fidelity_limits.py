"""Deployment fidelity at AWS's limits: what the stack promises where a limit or a failure path meets it, run in the
harness (``tests/support/fidelity``) as AWS runs it.

* ``Prefer: wait`` is capped by the run function's remaining time: a wait that would outlast the function answers
  202 before the function's deadline, never a 5xx after the turn's claim landed.
* A sweeper invocation that fails (EventBridge invokes it asynchronously) reaches the sweeper's on-failure
  destination after Lambda's retries, and the queue's alarm fires (``async_invoke``).
* The stage's throttle answers 429 with ``Retry-After`` (the template's ``THROTTLED`` gateway response), and the
  request made again after it goes through.

One deployment, with AWS's capacity enforced at a twentieth of its rates (the stage takes a burst of 5 requests,
2.5 a second) and the run function deployed with a 12 s timeout (as if: a hold capped at its remaining time
answers within it).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fidelity.calls import TENANT, evidence, fidelity_stack, fresh

RUN_TIMEOUT = 12.0
RATE_SCALE = 0.05


@pytest.fixture(scope="module")
def deployment(dynamodb_endpoint: str) -> Iterator[Any]:
    from tests.support.fidelity.capacity import Capacity

    with fidelity_stack(
        dynamodb_endpoint, time_scale=0.01, timeouts={"run": RUN_TIMEOUT}, capacity=Capacity(rate_scale=RATE_SCALE)
    ) as started:
        yield started


def _call(d: Any, method: str, path: str, body: Any = None, **options: Any) -> tuple[int, dict[str, str], Any]:
    """A request, its 429s waited out for their ``Retry-After`` (the stage here takes 2.5 requests a second)."""
    for _ in range(60):
        status, headers, answer = d.api(method, path, body, tenant=TENANT, **options)
        if status != 429:
            return status, headers, answer
        time.sleep(float(headers.get("Retry-After") or 1))
    raise AssertionError(f"{method} {path}: throttled 60 times")


@pytest.mark.backend("dynamodb")
def test_a_wait_longer_than_the_run_functions_time_answers_202_before_its_deadline(deployment: Any) -> None:
    """``Prefer: wait=25`` on a turn whose model takes 20 s, with the run function's 12 s: the hold ends
    ``WAIT_MARGIN`` before the function's deadline and answers 202 (the turn runs on in its execution), never a
    timed-out function's 502 (nor, past API Gateway's 29 s, a 504) after the claim landed. The run function runs
    the turn itself (its caller waits) until the hold ends: the 20 s call would outlast it, so it is dropped and
    made again in the execution it hands the turn to. The turn then completes once: its message on the ledger
    once, no model error on it."""
    d, sid = deployment, fresh("held")
    assert _call(d, "POST", "/sessions", {"session_id": sid, "scopes": {}})[0] == 201
    began = time.monotonic()
    status, _, body = _call(
        d, "POST", f"/sessions/{sid}/runs", {"message": "signoffs=0 sleep=20"}, headers={"Prefer": "wait=25"}
    )
    took = time.monotonic() - began
    assert status == 202, (status, body, round(took, 1), evidence(d))
    assert body["status"] == "running" and took < RUN_TIMEOUT, (body, took)
    assert not d.errors("run"), d.errors("run")  # the function answered; it did not time out
    deadline = time.monotonic() + 180
    shown: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shown = _call(d, "GET", f"/sessions/{sid}")[2]
        if shown["status"] != "running":
            break
        time.sleep(1)
    assert shown["status"] == "completed", (shown.get("status"), evidence(d))
    events = _call(d, "GET", f"/sessions/{sid}/events", query={"limit": "1000"})[2]["events"]
    assert [e["type"] for e in events].count("user") == 1, [e["type"] for e in events]
    assert not [e for e in events if e["type"] == "model_end" and e.get("error")], events


@pytest.mark.backend("dynamodb")
def test_a_sweep_that_fails_its_retries_reaches_the_sweepers_queue_and_its_alarm_fires(deployment: Any) -> None:
    """The schedule invokes the sweeper asynchronously: a sweep that fails (here: it times out, as a sweep of a
    huge backlog would) is retried twice by Lambda, then its invocation record reaches the on-failure destination,
    the queue whose depth the ``sweeper-dlq`` alarm watches, and the alarm fires. A sweep that succeeds sends
    nothing."""
    from tests.support.fidelity.async_invoke import AsyncLambda
    from tests.support.fidelity.template import ROOT

    d = deployment
    scheduled = json.loads((ROOT / "events/schedule/sweeper.json").read_text())
    lam = AsyncLambda(d)
    ok = lam.invoke("sweeper", scheduled)
    assert len(ok.attempts) == 1 and ok.attempts[0].ok and ok.destination is None, ok
    sweeper = d.functions["sweeper"]
    deployed = sweeper.timeout
    sweeper.timeout = 0.01  # as if every attempt ran out of time
    try:
        failed = lam.invoke("sweeper", scheduled)
    finally:
        sweeper.timeout = deployed
    assert [a.error_type for a in failed.attempts] == ["Sandbox.Timedout"] * 3, failed.attempts
    assert failed.condition == "RetriesExhausted" and failed.destination is not None, (failed, lam.config("sweeper"))
    (record,) = lam.queues[failed.destination]
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 3 and record["requestPayload"] == scheduled
    assert record["responsePayload"]["errorType"] == "Sandbox.Timedout"
    states = lam.alarm_states(failed.destination)
    assert states and set(states.values()) == {"ALARM"}, states


@pytest.mark.backend("dynamodb")
def test_the_stage_throttle_answers_429_with_retry_after_and_the_retry_goes_through(deployment: Any) -> None:
    """Past the stage's burst, API Gateway answers its ``THROTTLED`` gateway response before any function runs: a 429
    whose ``Retry-After`` says when to come back and whose body says why; the request made again after it
    succeeds."""
    d = deployment
    time.sleep(2)  # the bucket full again (2.5 tokens a second, 5 at most)
    invocations = len(d.lambdas.invocations)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:  # at once: the burst runs out before any is answered
        answers = list(pool.map(lambda _: d.api("GET", "/sessions", tenant=TENANT), range(12)))
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) == {200, 429} and statuses[200] <= 5, statuses
    for _, headers, body in (a for a in answers if a[0] == 429):
        assert headers.get("x-amzn-ErrorType") == "THROTTLED", headers
        assert headers.get("Retry-After") == "1", headers
        assert "Too Many Requests" in json.dumps(body), body
    assert len(d.lambdas.invocations) - invocations == statuses[200]  # a throttled request reached no function
    time.sleep(float(next(h for s, h, _ in answers if s == 429)["Retry-After"]))
    assert d.api("GET", "/sessions", tenant=TENANT)[0] == 200  # came back after Retry-After: taken
