"""Deployment fidelity of an answer whose caller waits (``POST /tools`` with ``Prefer: wait``, issue 36): the tools
function takes the answered turn on, ends the parked execution (its task succeeds: it ends at ``Park``) and runs
the rest of the turn itself; Step Functions again only if it parks or outlasts the hold.

* The rest of the turn: 200 with the finished turn; the parked execution ends at ``Park`` (no
  ``Continue``, no second execution, ``resume`` not invoked).
* It parks again: 200 with the parked view; the tools function starts the one execution that waits.
* ``SendTaskSuccess`` refused, and the wait timing out while the inline run goes on: the turn still ends here,
  and the parked execution's ``Expire`` ends nothing (the turn is not waiting).
* Park's token not stored yet when the answer arrives: park finds the turn taken on and ends its execution; an
  answer without ``Prefer: wait`` in the same race: park fails its task with ``Answered``, the turn continues.
* A refused answer (the tool's ``answerable_by``) runs nothing.
* The tools function killed after its take-on: the turn is the sweeper's once the hold's end passed; the parked
  execution, never ended, ends nothing when it times out.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bench.cost import _transitions
from tests.support.fidelity.calls import (
    TENANT,
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


def _parked(d: Any, sid: str, message: str) -> dict[str, Any]:
    """Run ``message`` inline until it parks; its execution asleep in ``Park``; the session as shown."""
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": message}, headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    d.settle()
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.status == "RUNNING" and execution.states[-1] == "Park", (execution.states, evidence(d))
    return show(d, sid)


def _answers(shown: dict[str, Any]) -> dict[str, Any]:
    (call,) = shown["yielded_tools"]
    return {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}


@pytest.mark.backend("dynamodb")
def test_an_answer_whose_caller_waits_runs_the_rest_of_the_turn_in_the_tools_function(deployment: Any) -> None:
    d, sid = deployment, fresh("ansinline")
    create(d, sid)
    shown = _parked(d, sid, "signoffs=1")
    resumed = invocations(d, "resume")
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT)
    assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
    assert body["output"]["text"] == "All steps signed off.", body
    d.settle()
    (execution,) = d.executions_of(TENANT, sid)  # no second execution
    # started at the wait (the waits machine) and ended by the answer at Park itself: 1 transition, where 9 were
    assert execution.status == "SUCCEEDED" and execution.states == ["Park"], (execution.states, evidence(d))
    assert execution.machine_arn == d.wait_machine_arn and _transitions(execution) == 1, execution.history
    kinds = [e["type"] for e in execution.history]
    assert "TaskSucceeded" in kinds and "TaskFailed" not in kinds, kinds  # SendTaskSuccess: Park's success ends it
    assert invocations(d, "resume") == resumed, "resume ran the answered turn"
    types = event_types(d, sid)
    assert types.count("tool_result") == 1 and types.count("invocation_resume") == 1, types  # the tools' take-on
    assert show(d, sid)["status"] == "completed"


@pytest.mark.backend("dynamodb")
def test_an_answered_turn_that_parks_again_is_handed_to_one_execution_by_the_tools_function(deployment: Any) -> None:
    d, sid = deployment, fresh("ansagain")
    create(d, sid)
    shown = _parked(d, sid, "signoffs=2")
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    assert sum(1 for c in d.calls("tools") if c.action == "states:StartExecution") >= 1, evidence(d)
    d.settle()
    first, second = sorted(d.executions_of(TENANT, sid), key=lambda e: e.status)
    assert first.status == "RUNNING" and second.status == "SUCCEEDED", (first.states, second.states)
    assert first.states[-1] == "Park" and second.states[-1] == "Park", (first.states, second.states)
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(show(d, sid)), headers=WAIT)
    assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
    d.settle()
    executions = d.executions_of(TENANT, sid)
    assert len(executions) == 2 and all(e.status == "SUCCEEDED" for e in executions), evidence(d)
    assert event_types(d, sid).count("tool_result") == 2


@pytest.mark.backend("dynamodb")
def test_a_refused_answer_runs_nothing_inline_and_an_approvers_runs_the_turn(deployment: Any) -> None:
    """A colleague in the same tenant whom the tool's ``answerable_by`` refuses: 403, nothing written, nothing
    taken on, the execution still parked. An approver's answer then runs the turn inline, recorded as theirs."""
    from tests.support.fidelity.deployment import Token

    d, sid = deployment, fresh("ansrefused")
    carol = Token.person(fresh("carol"), TENANT)
    bob = Token.person(fresh("bob"), TENANT, groups=["approvers"])
    create(d, sid)
    shown = _parked(d, sid, "signoffs=1 tool=approve")
    before = shown["version"]
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT, token=carol)
    assert status == 403 and body["error"] == "AnswerRefused", (status, body, evidence(d))
    assert show(d, sid)["version"] == before and show(d, sid)["status"] == "awaiting_input"
    assert "invocation_resume" not in event_types(d, sid) and "tool_input" not in event_types(d, sid)
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.status == "RUNNING" and execution.states[-1] == "Park", execution.states
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT, token=bob)
    assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
    (answered,) = [e for e in ledger(d, sid) if e["type"] == "tool_input"]
    assert answered["principal"] == bob.sub


@pytest.mark.backend("dynamodb")
def test_a_refused_colleague_reaches_the_answer_by_no_other_route(deployment: Any) -> None:
    """The colleague ``answerable_by`` refuses tries every other route to the same wait on the deployed stack: the
    answer without waiting (the workflow's path), a remote commit of the answer (``POST /commit``), a takeover with
    a message, and a fork of the waiting session answered there (the fork copies the pending call, and the rule
    with it). Each is refused, nothing written, the execution still parked."""
    from tests.support.fidelity.deployment import Token

    d, sid = deployment, fresh("ansroutes")
    carol = Token.person(fresh("carol"), TENANT)
    create(d, sid)
    shown = _parked(d, sid, "signoffs=1 tool=approve")
    before, (call,) = shown["version"], shown["yielded_tools"]
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), token=carol)
    assert status == 403 and body["error"] == "AnswerRefused", (status, body)
    forged = {"type": "tool_input", "call_id": call["call_id"], "name": call["name"], "input": {"approved": True}}
    status, _, body = d.api(
        "POST", f"/sessions/{sid}/commit", {"expected_version": before, "events": [forged]}, token=carol
    )
    assert status == 403 and body["error"] == "AnswerRefused", (status, body)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "approve it", "takeover": True}, token=carol)
    assert status == 409, (status, body)
    at = len(event_types(d, sid)) - 1
    status, _, fork = d.api("POST", f"/sessions/{sid}/forks", {"at": at, "reason": "mine now"}, token=carol)
    assert status == 201 and fork["status"] == "awaiting_input", (status, fork)
    copy, (copied,) = fork["id"], fork["yielded_tools"]
    assert copied["call_id"] == call["call_id"]
    status, _, body = d.api("POST", f"/sessions/{copy}/tools", _answers(fork), token=carol, headers=WAIT)
    assert status == 403 and body["error"] == "AnswerRefused", (status, body)
    status, _, body = d.api(
        "POST", f"/sessions/{copy}/commit", {"expected_version": fork["version"], "events": [forged]}, token=carol
    )
    assert status == 403 and body["error"] == "AnswerRefused", (status, body)
    assert show(d, copy)["version"] == fork["version"] and "tool_input" not in event_types(d, copy)
    assert d.executions_of(TENANT, copy) == []
    assert show(d, sid)["version"] == before and show(d, sid)["status"] == "awaiting_input"
    assert "tool_input" not in event_types(d, sid)
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.status == "RUNNING" and execution.states[-1] == "Park", execution.states


@pytest.mark.backend("dynamodb")
def test_sendtasksuccess_refused_and_the_wait_timing_out_mid_run_leave_the_turn_to_the_tools_function(
    deployment: Any,
) -> None:
    d, sid = deployment, fresh("ansexpire")
    default = d.template.parameter("WaitTimeoutSeconds")
    d.update({"WaitTimeoutSeconds": 3})
    try:
        create(d, sid)
        shown = _parked(d, sid, "signoffs=1 sleep=5")
        d.lambdas.fail_next(
            "tools", "SendTaskSuccess", ["inline"], {"__type": "ThrottlingException", "message": "Rate exceeded"}
        )
        status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT)
        assert not d.lambdas.fault_armed("tools"), "no SendTaskSuccess met the fault"
        assert status == 200 and body["status"] == "completed", (status, body, evidence(d))
        d.settle()
    finally:
        d.update({"WaitTimeoutSeconds": default})
    (execution,) = d.executions_of(TENANT, sid)
    assert execution.status == "SUCCEEDED" and execution.states[-4:] == [
        "Park",
        "Expire",
        "Answered as it expired?",
        "Expired",
    ], (execution.states, evidence(d))
    shown = show(d, sid)
    assert shown["status"] == "completed", shown  # the timed-out wait did not end the turn that went on
    events = ledger(d, sid)
    assert not [e for e in events if e["type"] == "invocation_end" and e.get("error_type")], events
    assert [e["type"] for e in events].count("tool_result") == 1


@pytest.mark.backend("dynamodb")
def test_an_answer_before_parks_token_is_stored_is_run_inline_and_park_ends_its_execution(deployment: Any) -> None:
    d, sid = deployment, fresh("ansearly")
    create(d, sid)
    d.lambdas.hold_after("park", "dynamodb:Query")  # park has read the session, not yet stored its token
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1 sleep=2"}, headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    until(lambda: d.lambdas.holding("park"), "park held before its token's write", d)
    answers: list[Any] = []
    request = threading.Thread(
        target=lambda: answers.append(d.api("POST", f"/sessions/{sid}/tools", _answers(show(d, sid)), headers=WAIT))
    )
    request.start()
    until(lambda: "invocation_resume" in event_types(d, sid), "the tools function took the turn on", d)
    d.lambdas.release("park")  # park now finds the turn running: taken on by the tools function
    request.join(30)
    assert answers and answers[0][0] == 200 and answers[0][2]["status"] == "completed", (answers, evidence(d))
    d.settle()
    (execution,) = d.executions_of(TENANT, sid)  # park started no second runner
    assert execution.status == "SUCCEEDED" and execution.states[-1] == "Park", (execution.states, evidence(d))
    types = event_types(d, sid)
    assert types.count("tool_result") == 1 and types.count("invocation_resume") == 1, types


@pytest.mark.backend("dynamodb")
def test_an_answer_left_to_the_workflow_before_parks_token_is_stored_continues_in_a_fresh_execution(
    deployment: Any,
) -> None:
    """The same race without ``Prefer: wait``: nobody takes the answered turn on, so park fails its own task with
    ``Answered`` (``SendTaskFailure``), caught into ``Continue``: the turn runs on in the next execution, once."""
    d, sid = deployment, fresh("ansearlyq")
    create(d, sid)
    d.lambdas.hold_after("park", "dynamodb:Query")  # park has read the session, not yet stored its token
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"}, headers=WAIT)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    until(lambda: d.lambdas.holding("park"), "park held before its token's write", d)
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(show(d, sid)))
    assert status == 202 and body["woke"] is False, (status, body, evidence(d))  # no token to wake yet
    d.lambdas.release("park")  # park finds the answers in, no runner: the turn goes on in the next execution
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    first, then = sorted(d.executions_of(TENANT, sid), key=lambda e: e.started)
    assert first.status == "SUCCEEDED" and first.states == ["Park", "Next loop", "Continue", "Continued"], (
        first.states,
        evidence(d),
    )
    assert (first.machine_arn, then.machine_arn) == (d.wait_machine_arn, d.machine_arn)  # Continue: sessions
    failed = [e["details"] for e in first.history if e["type"] == "TaskFailed"]
    assert [f["error"] for f in failed] == ["Answered"], first.history  # one failure, not retried
    assert then.status == "SUCCEEDED" and then.states[-1] == "Done", then.states
    assert any(c.action == "states:SendTaskFailure" for c in d.calls("park")), evidence(d)
    assert event_types(d, sid).count("tool_result") == 1


@pytest.mark.backend("dynamodb")
def test_zz_the_tools_function_killed_after_its_take_on_leaves_the_turn_to_the_sweeper(deployment: Any) -> None:
    """Last in the module: it moves dormant's clock on (past the hold) in every sandbox."""
    d, sid = deployment, fresh("anskilled")
    create(d, sid)
    shown = _parked(d, sid, "signoffs=1")
    d.lambdas.crash_before("tools", "states:SendTaskSuccess")  # after the take-on, before the execution is ended
    status, _, body = d.api("POST", f"/sessions/{sid}/tools", _answers(shown), headers=WAIT)
    assert status == 502, (status, body, evidence(d))
    assert show(d, sid)["status"] == "running" and "invocation_resume" in event_types(d, sid)
    assert not [line for line in d.sweep()["turns"] if sid in line], "handed on before the hold's end"
    d.advance(30)  # past the take-on's deadline, the end of the 20 s hold
    lines = [line for line in d.sweep()["turns"] if sid in line]
    assert len(lines) == 1 and "handed on (execution" in lines[0], (lines, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    assert event_types(d, sid).count("tool_result") == 1
    parked = [e for e in d.executions_of(TENANT, sid) if e.states[-1] == "Park"]
    assert len(parked) == 1 and parked[0].status == "RUNNING", "the parked execution, never ended, still waits"


def test_only_the_granted_functions_reach_the_waits_machine(deployment: Any) -> None:
    """A waits machine's task token is authorized against the waits machine: park, tools and the sweeper may fail it
    (``Answered``), park and tools succeed it, and run, tools and the sweeper start its executions; any other
    function is refused, as AWS would (the harness checks every call a function makes on the same statements).
    The waits machine's own role starts only the sessions machine (its ``Continue``)."""
    from tests.support.fidelity import iam

    d = deployment
    waits_token = base64.urlsafe_b64encode(json.dumps({"m": d.wait_machine_arn, "t": "x"}).encode()).decode()
    may = {}
    for action, params in (
        ("SendTaskFailure", {"taskToken": waits_token}),
        ("SendTaskSuccess", {"taskToken": waits_token}),
        ("StartExecution", {"stateMachineArn": d.wait_machine_arn}),
    ):
        ((needed, resource),) = iam.required("states", action, params, token_owner=d.sfn.token_owner)
        assert resource == d.wait_machine_arn, resource
        may[action] = {name for name, f in d.functions.items() if iam.allowed(f.statements, needed, resource)}
    assert may == {
        "SendTaskFailure": {"park", "tools", "sweeper"},
        "SendTaskSuccess": {"park", "tools"},
        "StartExecution": {"run", "tools", "sweeper"},
    }, may
    role = d.sfn.roles[d.wait_machine_arn]
    assert iam.allowed(role, "states:StartExecution", d.machine_arn)
    assert not iam.allowed(role, "states:StartExecution", d.wait_machine_arn)


def test_each_machine_acts_with_its_own_role_in_the_harness(deployment: Any) -> None:
    """The harness checks a machine's task calls on that machine's role: a machine with the waits machine's role
    may not start an execution of the waits machine (only the sessions machine's, its Continue)."""
    d = deployment
    arn = d.wait_machine_arn + "-probe"
    start = {"Type": "Task", "Resource": "arn:aws:states:::states:startExecution", "End": True}
    start["Parameters"] = {"StateMachineArn": d.wait_machine_arn, "Input": {}}
    d.sfn.create_state_machine(arn, {"StartAt": "Start", "States": {"Start": start}}, d.sfn.roles[d.wait_machine_arn])
    started = d.sfn.start_execution(arn, fresh("probe"), "{}")["executionArn"]
    until(lambda: d.sfn.executions[started].status != "RUNNING", "the probe ended", d)
    probe = d.sfn.executions[started]
    assert probe.status == "FAILED" and "AccessDenied" in (probe.cause or ""), (probe.error, probe.cause)
