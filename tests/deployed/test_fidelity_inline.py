"""Deployment fidelity of a turn whose caller waits (``POST /runs`` with ``Prefer: wait``): the run function runs it
itself, and Step Functions is started only when the turn parks or cannot end within the hold.

* A chat turn: 200 with the finished turn, no execution, ``resume`` never invoked, two commits (the claim, the end).
* A turn that parks: 200 with the parked view, then one execution (started after the park) asleep in ``Park``; the
  answer wakes it and the turn ends, the answer's result on the ledger once.
* A hold that runs short: the run function stops taking steps, starts the execution, answers 202; the execution
  goes on from the last committed step (each step once).
* A model call that would outlast the hold: dropped uncommitted (no error on the ledger), handed on, made again
  by the execution.
* The run function killed mid-turn (no execution exists): the sweeper hands the turn on once the claim's deadline
  (the hold's end) passed; the steps committed are kept, none is run twice.
* A step's transaction throttled by the table mid-turn: re-sent by the store; past its re-sends, handed on (202) and
  the execution goes on from the last committed step (and in the workflow, the next ``Run``), each step once. An
  answers' commit throttled past them: 429, nothing written, the retry runs the turn.
* ``StartExecution`` refused after the park: the client still gets the parked turn (never a 500), and the sweeper
  gives the wait an execution.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fidelity.calls import (
    STORE_RESENDS,
    TENANT,
    answer,
    create,
    event_types,
    evidence,
    fidelity_stack,
    fresh,
    invocations,
    ledger,
    show,
    until,
)

WAIT = {"Prefer": "wait=20"}


@pytest.fixture(scope="module")
def deployment(dynamodb_endpoint: str) -> Iterator[Any]:
    with fidelity_stack(dynamodb_endpoint, time_scale=0.01) as started:
        yield started


def _started(d: Any) -> int:
    """How many ``StartExecution`` calls the run function made so far."""
    return sum(1 for c in d.calls("run") if c.action == "states:StartExecution")


def _swept(result: dict[str, Any], sid: str) -> list[str]:
    return [line for line in result["turns"] if line.startswith(f"{sid}@") or line.startswith(f"{sid}:")]


@pytest.mark.backend("dynamodb")
def test_a_chat_turn_whose_caller_waits_runs_in_the_run_function(deployment: Any) -> None:
    d, sid = deployment, fresh("inline")
    create(d, sid)
    created = show(d, sid)["version"]
    resumed, started = invocations(d, "resume"), _started(d)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=0"}, headers=WAIT)
    assert status == 200, (status, body, evidence(d))
    assert body["status"] == "completed" and body["output"]["text"] == "All steps signed off.", body
    assert not d.executions_of(TENANT, sid) and _started(d) == started, "an execution was started for it"
    assert invocations(d, "resume") == resumed, "resume was invoked"
    types = event_types(d, sid)
    assert types.count("user") == 1 and types.count("invocation_start") == 1, types
    assert "invocation_resume" not in types, types  # no runner took it on: the claim's runner ran it
    assert body["version"] - created == 2, (body["version"], created)  # the claim and the end, no take-on commit


@pytest.mark.backend("dynamodb")
def test_a_turn_that_parks_is_handed_to_an_execution_that_parks_and_the_answer_wakes(deployment: Any) -> None:
    d, sid = deployment, fresh("inpark")
    create(d, sid)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"}, headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    assert len(body["yielded_tools"]) == 1, body
    d.settle()
    (execution,) = d.executions_of(TENANT, sid)
    # started at the wait: no Run to find it parked (issue 36)
    assert execution.status == "RUNNING" and execution.states == ["Park"], (execution.states, evidence(d))
    assert execution.machine_arn == d.wait_machine_arn, execution.machine_arn  # the waits machine: Park first
    shown = show(d, sid)
    assert shown["status"] == "awaiting_input", shown
    done = answer(d, sid, shown)
    assert done["status"] == "completed", (done["status"], evidence(d))
    types = event_types(d, sid)
    assert types.count("tool_result") == 1 and types.count("user") == 1, types
    assert not [e for e in ledger(d, sid) if e["type"] == "model_end" and e.get("error")], evidence(d)


@pytest.mark.backend("dynamodb")
def test_a_hold_that_runs_short_hands_the_turn_on_from_its_last_step(deployment: Any) -> None:
    d, sid = deployment, fresh("inshort")
    create(d, sid)
    began = time.monotonic()
    status, _, body = d.api(
        "POST", f"/sessions/{sid}/runs", {"message": "steps=8 sleep=1 signoffs=0"}, headers={"Prefer": "wait=6"}
    )
    took = time.monotonic() - began
    assert status == 202 and body["status"] == "running", (status, body, evidence(d))
    assert took < 9, took  # the hold's 6 s and the hand-on, not the turn's 9 model calls
    assert len(d.executions_of(TENANT, sid)) == 1, evidence(d)
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    events = ledger(d, sid)
    steps = [e["result"] for e in events if e["type"] == "tool_result"]
    assert steps == [{"noted": n} for n in range(1, 9)], steps  # each step once, in order: none lost, none doubled
    assert [e["type"] for e in events].count("invocation_resume") == 1  # the execution took it on where it stood
    assert f"outlasted the hold of {sid}" not in d.log("run"), "the run stopped by a call's timeout, not its hold"
    assert not [e for e in events if e["type"] == "model_end" and e.get("error")], evidence(d)


@pytest.mark.backend("dynamodb")
def test_a_model_call_that_would_outlast_the_hold_is_dropped_and_made_again_by_the_execution(
    deployment: Any,
) -> None:
    d, sid = deployment, fresh("inslow")
    create(d, sid)
    status, _, body = d.api(
        "POST", f"/sessions/{sid}/runs", {"message": "signoffs=0 sleep=5"}, headers={"Prefer": "wait=2"}
    )
    assert status == 202 and body["status"] == "running", (status, body, evidence(d))
    d.settle()
    shown = show(d, sid)
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    events = ledger(d, sid)
    assert not [e for e in events if e["type"] == "model_end" and e.get("error")], events  # no error the SFN path lacks
    types = [e["type"] for e in events]
    assert types.count("model_start") == 1 and types.count("model_end") == 1, types  # the dropped call left nothing
    assert len(d.executions_of(TENANT, sid)) == 1
    assert f"a model call outlasted the hold of {sid}" in d.log("run"), d.log("run")[-2000:]


@pytest.mark.backend("dynamodb")
def test_startexecution_refused_after_a_park_answers_the_park_and_the_sweeper_repairs(deployment: Any) -> None:
    d, sid = deployment, fresh("inrefused")
    create(d, sid)
    d.lambdas.fail_next("run", "StartExecution", [sid], {"__type": "ThrottlingException", "message": "Rate exceeded"})
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"}, headers=WAIT)
    assert not d.lambdas.fault_armed("run"), "no StartExecution met the fault"
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    d.settle()
    assert not d.executions_of(TENANT, sid), "an execution was started although StartExecution was refused"
    lines = _swept(d.sweep(), sid)
    assert len(lines) == 1 and "restarted (execution" in lines[0], (lines, evidence(d))
    d.settle()
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.status == "RUNNING" and execution.states[-1] == "Park", (execution.states, evidence(d))
    assert answer(d, sid, show(d, sid))["status"] == "completed", evidence(d)
    assert event_types(d, sid).count("tool_result") == 1


THROTTLED_INDEX = {
    "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
    "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [None, ThrottlingError]",
    "CancellationReasons": [
        {"Code": "None"},
        {
            "Code": "ThrottlingError",
            "Message": "Throughput exceeds the current capacity for one or more global "
            "secondary indexes. DynamoDB is automatically scaling your index so please be patient.",
        },
    ],
}
"""What DynamoDB answers a transaction whose index partition is over its rate: botocore does not retry it, the store
re-sends it as often as its client retries a throttle (``STORE_RESENDS``)."""


@pytest.mark.backend("dynamodb")
def test_a_brief_index_throttle_mid_turn_is_resent_and_the_turn_ends_in_the_request(deployment: Any) -> None:
    """A step's transaction cancelled for throttling three times: the store re-sends it and the turn ends inline
    (200, no execution); each step once."""
    d, sid = deployment, fresh("inbrief")
    create(d, sid)
    d.lambdas.fail_next("run", "TransactWriteItems", [sid, '\\"noted\\":2'], THROTTLED_INDEX, 3)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=0 signoffs=0"}, headers=WAIT)
    assert not d.lambdas.fault_armed("run"), "the throttle did not meet three calls"
    assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
    assert not d.executions_of(TENANT, sid)
    assert [e["result"] for e in ledger(d, sid) if e["type"] == "tool_result"] == [{"noted": n} for n in range(1, 4)]


@pytest.mark.backend("dynamodb")
def test_a_table_throttle_mid_turn_hands_the_turn_on_from_its_last_committed_step(deployment: Any) -> None:
    """A step's commit in the run function is throttled by the table (``StoreThrottled``: an index partition's
    back-pressure cancels the transaction, which no SDK retry re-sends): the held run stops there as at its deadline,
    hands the turn on and answers 202 (never a 500, never the turn ended in error); the execution goes on, and the
    ledger has each step once, no error, and the caller's message once."""
    d, sid = deployment, fresh("inthrottled")
    create(d, sid)
    d.lambdas.fail_next("run", "TransactWriteItems", [sid, '\\"noted\\":2'], THROTTLED_INDEX, 1 + STORE_RESENDS)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=0 signoffs=0"}, headers=WAIT)
    assert not d.lambdas.fault_armed("run"), "no commit met the throttle"
    assert status == 202 and body["status"] == "running", (status, body, evidence(d))
    assert f"a step's commit of {sid} was refused (StoreThrottled" in d.log("run"), d.log("run")[-2000:]
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    (execution,) = d.executions_of(TENANT, sid)
    assert "Run" in execution.states, execution.states
    events = ledger(d, sid)
    steps = [e["result"] for e in events if e["type"] == "tool_result"]
    assert steps == [{"noted": n} for n in range(1, 4)], steps
    assert not [e for e in events if e.get("error")], events
    assert [e["type"] for e in events].count("user") == 1


@pytest.mark.backend("dynamodb")
def test_a_table_throttle_mid_turn_in_the_workflow_runs_it_on_in_the_next_run(deployment: Any) -> None:
    """The same throttle in the workflow's ``Run`` (the resume function; the caller does not wait): the run stops
    there, comes back ``handed_on`` and the execution's next ``Run`` goes on; each step once, no error."""
    d, sid = deployment, fresh("inthrottledrun")
    create(d, sid)
    d.lambdas.fail_next("resume", "TransactWriteItems", [sid, '\\"noted\\":2'], THROTTLED_INDEX, 1 + STORE_RESENDS)
    status, _, _ = d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=0 signoffs=0"})
    assert status == 202, status
    d.settle()
    assert not d.lambdas.fault_armed("resume"), "no commit met the throttle"
    assert show(d, sid)["status"] == "completed", evidence(d)
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.states.count("Run") == 2, execution.states
    events = ledger(d, sid)
    assert [e["result"] for e in events if e["type"] == "tool_result"] == [{"noted": n} for n in range(1, 4)]
    assert not [e for e in events if e.get("error")], events


@pytest.mark.backend("dynamodb")
def test_an_answers_commit_throttled_writes_nothing_and_its_retry_runs_the_turn(deployment: Any) -> None:
    """``POST /tools`` with ``Prefer: wait`` commits its answers and its take-on together: that commit throttled by
    the table is a 429 with nothing written (no answer stored, the execution still parked, nothing taken on), and the
    client's retry with the same ``Idempotency-Key`` stores them and runs the turn; the tool once."""
    d, sid = deployment, fresh("intakeon")
    create(d, sid)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"}, headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    d.settle()
    (call,) = show(d, sid)["yielded_tools"]
    d.lambdas.fail_next("tools", "TransactWriteItems", [sid, "invocation_resume"], THROTTLED_INDEX, 1 + STORE_RESENDS)
    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    headers = {**WAIT, "Idempotency-Key": f"{sid}-answer"}
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", answers, headers=headers)
    assert not d.lambdas.fault_armed("tools"), "no commit met the throttle"
    assert status == 429 and body["error"] == "StoreThrottled", (status, body, evidence(d))
    shown = show(d, sid)
    assert shown["status"] == "awaiting_input" and shown["yielded_tools"], shown
    (parked,) = d.executions_of(TENANT, sid)
    assert parked.status == "RUNNING" and parked.states[-1] == "Park", parked.states
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", answers, headers=headers)
    assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
    d.settle()
    assert event_types(d, sid).count("tool_result") == 1


@pytest.mark.backend("dynamodb")
def test_startexecution_refused_at_a_hand_on_leaves_the_turn_to_the_sweeper(deployment: Any) -> None:
    """The hold runs short and the hand-on's ``StartExecution`` is refused (throttled past the SDK's retries): the
    client gets 202 (never a 500), the turn stays ``running`` with the hold's end as its deadline, and the sweeper
    hands it on once that passed by its grace (here: an operator's sweep with none); each step once."""
    d, sid = deployment, fresh("inhandon")
    create(d, sid)
    d.lambdas.fail_next("run", "StartExecution", [sid], {"__type": "ThrottlingException", "message": "Rate exceeded"})
    message = {"message": "steps=8 sleep=1 signoffs=0"}
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", message, headers={"Prefer": "wait=6"})
    assert not d.lambdas.fault_armed("run"), "no StartExecution met the fault"
    assert status == 202 and body["status"] == "running", (status, body, evidence(d))
    d.settle()
    assert not d.executions_of(TENANT, sid) and show(d, sid)["status"] == "running", evidence(d)
    assert not _swept(d.sweep(grace_seconds=None), sid), "handed on within the sweeper's grace"
    (deadline,) = [e["deadline"] for e in ledger(d, sid) if e["type"] == "invocation_start"]
    time.sleep(max(0.0, deadline / 1000 - time.time()) + 0.2)  # the hold's end, recorded as the claim's deadline
    lines = _swept(d.sweep(), sid)
    assert len(lines) == 1 and "handed on (execution" in lines[0], (lines, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    steps = [e["result"] for e in ledger(d, sid) if e["type"] == "tool_result"]
    assert steps == [{"noted": n} for n in range(1, 9)], steps


@pytest.mark.backend("dynamodb")
def test_zz_the_run_function_killed_mid_turn_leaves_it_to_the_sweeper_after_the_holds_end(deployment: Any) -> None:
    """Last in the module: it moves dormant's clock on (past the hold) in every sandbox."""
    d, sid = deployment, fresh("inkilled")
    create(d, sid)
    answers: list[Any] = []
    message = {"message": "steps=4 sleep=1 signoffs=0"}
    request = threading.Thread(
        target=lambda: answers.append(d.api("POST", f"/sessions/{sid}/runs", message, headers=WAIT))
    )
    request.start()
    until(lambda: event_types(d, sid).count("tool_result") >= 1, "a first step committed", d)
    assert d.kill("run") == 1, "no run function was running the turn"
    request.join(30)
    assert answers and answers[0][0] == 502, answers
    assert not d.executions_of(TENANT, sid) and show(d, sid)["status"] == "running"
    assert not _swept(d.sweep(), sid), "handed on before the hold's end: its runner may be alive"
    d.advance(30)  # past the claim's deadline, the end of the 20 s hold
    lines = _swept(d.sweep(), sid)
    assert len(lines) == 1 and "handed on (execution" in lines[0], (lines, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    events = ledger(d, sid)
    steps = [e["result"] for e in events if e["type"] == "tool_result"]
    assert steps == [{"noted": n} for n in range(1, 5)], steps  # the committed steps kept, none run twice
    assert [e["type"] for e in events].count("user") == 1
