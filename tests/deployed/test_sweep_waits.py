"""The sweeper's repair of waits: a session that waits (``awaiting_input``, ``resumable``) is never left with no one
to wake it.

Off AWS (``dormant serve --sweep-every``, in-process hooks) the sweep resumes a ``resumable`` session whose
in-process resume was lost. On AWS it asks Step Functions whether the wait's execution lives, and starts a
fresh one, wakes it, or expires the wait: the deployment-fidelity harness (``tests/deployed/test_fidelity.py``) runs
those; here, the pieces it is built from, on SQLite and DynamoDB Local.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from dormant.clock import now_ms, use_clock
from dormant.serving.runtime import Served
from dormant.serving.turns import claim_turn, run_to_end
from dormant.serving.workflow import TOKEN_SCOPE, StepFunctions, end_invocation, sweep_turns, wait_record
from dormant.stores.base import ErasableStore
from dormant.stores.url import store_from_url
from tests.support.fidelity.fidelity_app import build as build_fidelity


def _yielded(view: Any, agent: Any, sid: str, signoffs: int = 1) -> Any:
    """A session of ``view`` run in this process until it waits on a sign-off."""
    view.sessions.create(sid)
    outcome = run_to_end(view, claim_turn(view, agent, sid, f"signoffs={signoffs}"), lambda _: agent)
    assert outcome.status == "yielded_tool", outcome
    return outcome


def _answer(view: Any, sid: str) -> None:
    """Store the answer and nothing else: the resume that should follow is lost."""
    (call,) = view.sessions.require(sid).yielded_tools
    view.sessions.write(sid, lambda s: s.input.answers([{"call_id": call.call_id, "input": {"approved": True}}]))
    assert view.sessions.require(sid).status == "resumable"


def test_the_sweep_resumes_an_answered_session_whose_resume_was_lost(store_url: str) -> None:
    """Answers stored ten minutes ago, and the process that should have resumed the turn died: the sweep resumes
    it (the sign-off's result recorded once). One answered just now is left to its own resume (the grace), and
    one that awaits answers needs no one off AWS: both stay as they are."""
    fidelity = build_fidelity(store_from_url(store_url))
    served = Served(fidelity.app, {fidelity.agent.name: fidelity.agent})
    view = served.for_tenant("local")
    ten_minutes_ago = now_ms() - 600_000
    with use_clock(lambda: ten_minutes_ago):
        _yielded(view, fidelity.agent, "lost")
        _answer(view, "lost")
    _yielded(view, fidelity.agent, "fresh")
    _answer(view, "fresh")
    with use_clock(lambda: ten_minutes_ago):
        _yielded(view, fidelity.agent, "asks")
    invocation = view.sessions.require("lost").projection.open_invocation

    assert sweep_turns(served, fidelity.app) == [f"lost@{invocation}: resumed (completed)"]
    lost = view.sessions.require("lost")
    assert lost.status == "completed" and lost.output.text == "All steps signed off.", lost.status
    kinds = [e.type for e in lost.events]
    assert kinds.count("tool_input") == 1 and kinds.count("tool_result") == 1, kinds
    assert view.sessions.require("fresh").status == "resumable"
    assert view.sessions.require("asks").status == "awaiting_input"
    assert sweep_turns(served, fidelity.app) == []  # nothing left to do: a second sweep runs nothing again
    assert [e.type for e in view.sessions.require("lost").events].count("tool_result") == 1
    fidelity.app.close()


def test_dormant_serve_resumes_a_session_whose_resume_was_lost(store_url: str, tmp_path: Path) -> None:
    """``dormant serve --sweep-every`` does the same: a session answered ten minutes ago with no resume after
    (the serving process died in between) completes under the next sweep."""
    from tests.support.servers.serve import dormant_serve, fidelity_app_env, shown_once_past

    store = store_from_url(store_url)
    fidelity = build_fidelity(store)
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    ten_minutes_ago = now_ms() - 600_000
    with use_clock(lambda: ten_minutes_ago):
        _yielded(view, fidelity.agent, "lost")
        _answer(view, "lost")
    store.close()

    args = ("--store", store_url, "--app", "fidelity_app:build", "--sweep-every", "0.2", "--quiet")
    with dormant_serve(*args, env=fidelity_app_env(), cwd=tmp_path) as server:
        # a generous bound: the wait ends as soon as the sweep has run
        shown = shown_once_past(server.url, "lost", ("resumable", "running"), timeout=120)
    assert shown["status"] == "completed", shown
    assert "resumed (completed)" in server.output()


def test_an_expire_ends_only_the_wait_its_execution_holds(store_url: str) -> None:
    """The sweeper gave a wait to a fresh execution, and the execution it superseded times out later: that
    ``Expire`` ends nothing (the wait is the other's). The holder's own ``Expire`` does."""
    fidelity = build_fidelity(store_from_url(store_url))
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    outcome = _yielded(view, fidelity.agent, "held")
    invocation = view.sessions.require("held").projection.open_invocation
    assert invocation is not None and outcome.status == "yielded_tool"
    view.store.save_scoped_state(view.name, TOKEN_SCOPE, "held", {"execution": "arn:exec:fresh"})
    expired = ("the wait for answers timed out", "SessionExpired")
    old = end_invocation(view, "held", invocation, *expired, only_waiting=True, holder="arn:exec:superseded")
    assert old == {"status": "superseded"}
    assert view.sessions.require("held").status == "awaiting_input"
    own = end_invocation(view, "held", invocation, *expired, only_waiting=True, holder="arn:exec:fresh")
    assert own["status"] == "error" and view.sessions.require("held").events[-1].error_type == "SessionExpired"
    fidelity.app.close()


def test_park_records_the_wait_it_holds(store_url: str) -> None:
    """``park`` stores, with the token, which execution parked, the version its commit makes and when the wait
    times out: what lets the sweeper tell this wait's execution from an earlier wait's."""
    fidelity = build_fidelity(store_from_url(store_url))
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    _yielded(view, fidelity.agent, "parked")
    invocation = view.sessions.require("parked").projection.open_invocation
    assert invocation is not None
    before = now_ms()
    answer = StepFunctions().park(
        view, "parked", invocation, "token-1", execution="arn:exec:1", wait_seconds=60, answer_error="Answered"
    )
    assert answer == {"woke": False, "status": "awaiting_input"}
    record = wait_record(view, "parked")
    assert record["task_token"] == "token-1" and record["execution"] == "arn:exec:1"
    assert record["wait_version"] == view.sessions.require("parked").version
    assert before + 60_000 <= record["wait_until"] <= now_ms() + 60_000
    assert record["invocation"] == invocation
    assert record["answer_error"] == "Answered"  # how an answer left to the workflow wakes this machine's wait
    # one key (one item on DynamoDB: a park writes 2 units for it, not 10): the record whole under it
    assert view.store.load_scoped_state(view.name, TOKEN_SCOPE, "parked") == {"wait": record}
    fidelity.app.close()


def test_a_wait_record_of_an_earlier_release_is_read_as_it_was(store_url: str) -> None:
    """A session parked by a release that kept a key a field (``task_token``, ``execution``...) is read the
    same; once it parks again, its one-key record is the one read."""
    fidelity = build_fidelity(store_from_url(store_url))
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    _yielded(view, fidelity.agent, "old")
    invocation = view.sessions.require("old").projection.open_invocation
    assert invocation is not None
    flat = {"task_token": "token-0", "execution": "arn:exec:0", "wait_version": 3, "invocation": invocation}
    store = view.store
    assert isinstance(store, ErasableStore)  # every built-in store: it saves a scope's state whole
    store.save_scoped_state(view.name, TOKEN_SCOPE, "old", flat)
    assert wait_record(view, "old") == flat
    StepFunctions().park(view, "old", invocation, "token-1", execution="arn:exec:1", wait_seconds=60)
    assert wait_record(view, "old")["task_token"] == "token-1"
    fidelity.app.close()


def test_a_restart_never_reuses_an_ended_executions_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps of one wait start one execution (the same name, the same input); a restart whose execution
    ended before it parked (stopped, failed) is not taken for a live one: the next sweep starts ``-r1``."""
    import botocore.session

    from tests.support.fidelity.stepfunctions import StepFunctions as Interpreter
    from tests.support.fidelity.template import ACCOUNT, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    interpreter = Interpreter(lambda function, payload: (True, {}))
    machine = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:sessions"
    interpreter.create_state_machine(
        machine, {"StartAt": "Sleep", "States": {"Sleep": {"Type": "Wait", "Seconds": 60, "End": True}}}
    )
    endpoint = interpreter.serve()
    try:
        client = botocore.session.get_session().create_client(
            "stepfunctions", region_name=REGION, endpoint_url=endpoint
        )
        sfn = StepFunctions(machine, client)
        first = sfn.restart("t", "s", "inv", 3)
        assert sfn.restart("t", "s", "inv", 3) == first and first.endswith("-r0")
        assert sfn.status(first) == "RUNNING" and sfn.status("no-such-execution") is None
        interpreter.stop_execution(f"arn:aws:states:{REGION}:{ACCOUNT}:execution:sessions:{first}")
        assert sfn.status(first) == "ABORTED"
        second = sfn.restart("t", "s", "inv", 3)
        assert second == first[:-1] + "1" and sfn.status(second) == "RUNNING"
        assert len(interpreter.executions) == 2
    finally:
        interpreter.close()


def test_a_wake_fails_the_wait_with_its_machines_error_and_answers_an_earlier_machines_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answers left to the workflow fail the wait's task with the error its record names (``Answered``: the machine
    catches it into ``Continue``); an inline answer, and any answer to a wait whose record names none (parked by
    the machine before ``Answered``, whose ``Went on?`` continues on a plain success), are sent as a success."""
    import json
    import time

    import botocore.session

    from dormant.serving.workflow.stepfunctions import ANSWERED
    from tests.support.fidelity.stepfunctions import StepFunctions as Interpreter
    from tests.support.fidelity.template import ACCOUNT, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    tokens: dict[str, str] = {}

    def park(function: str, payload: Any) -> tuple[bool, Any]:
        tokens[payload["name"]] = payload["token"]
        return True, {}

    interpreter = Interpreter(park)
    machine = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:sessions"
    wait = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {"FunctionName": "park", "Payload": {"name.$": "$$.Execution.Name", "token.$": "$$.Task.Token"}},
        "Catch": [{"ErrorEquals": [ANSWERED], "Next": "Continued"}, {"ErrorEquals": ["States.ALL"], "Next": "Failed"}],
        "End": True,
    }
    states = {"Park": wait, "Continued": {"Type": "Succeed"}, "Failed": {"Type": "Fail", "Error": "Recorded"}}
    interpreter.create_state_machine(machine, {"StartAt": "Park", "States": states})
    endpoint = interpreter.serve()
    try:
        client = botocore.session.get_session().create_client(
            "stepfunctions", region_name=REGION, endpoint_url=endpoint
        )
        sfn = StepFunctions(machine, client)
        for name in ("left", "inline", "earlier"):
            interpreter.start_execution(machine, name, "{}")
        deadline = now_ms() + 10_000
        while len(tokens) < 3 and now_ms() < deadline:
            time.sleep(0.01)
        assert sfn.wake(tokens["left"], error=ANSWERED) and sfn.wake(tokens["inline"], inline=True, error=ANSWERED)
        assert sfn.wake(tokens["earlier"])
        assert not sfn.wake(tokens["left"], error=ANSWERED)  # spent: woken already
        ended = {}
        for name in ("left", "inline", "earlier"):
            execution = interpreter.executions[f"arn:aws:states:{REGION}:{ACCOUNT}:execution:sessions:{name}"]
            while execution.status == "RUNNING" and now_ms() < deadline:
                time.sleep(0.01)
            ended[name] = (execution.status, execution.states, json.loads(execution.output or "null"))
        assert ended["left"][:2] == ("SUCCEEDED", ["Park", "Continued"]), ended  # caught: the turn continues
        assert ended["inline"] == ("SUCCEEDED", ["Park"], {"answered": True, "inline": True}), ended
        assert ended["earlier"] == ("SUCCEEDED", ["Park"], {"answered": True}), ended
    finally:
        interpreter.close()


@pytest.mark.backend("dynamodb")
def test_a_retried_run_frees_the_session_of_its_dead_runners_commit(
    dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner dies between a commit's gate and its events: its marker holds the session. The workflow's retried
    ``Run`` repairs it at once (a fresh marker, far from stale) for the turn it runs, and the next write goes
    through; for another invocation (a retry of ``TurnNotClaimed``, whose claim may be in flight) it repairs
    nothing."""
    from dormant.events import UserEvent
    from dormant.serving.workflow import repair_after_lost_runner
    from tests.support.dynamodb_faults import Died, Faults
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    store = store_from_url(f"dynamodb://held-{uuid.uuid4().hex[:12]}?endpoint={dynamodb_endpoint}&region={REGION}")
    fidelity = build_fidelity(store)
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    view.sessions.create("held")
    claim = claim_turn(view, fidelity.agent, "held", "steps=2 signoffs=0")
    assert claim.invocation_id is not None and claim.session.status == "running"
    loaded = store.load(view.name, "held")
    assert loaded is not None
    Faults(store._client).die("BatchWriteItem", nth=1)  # type: ignore[attr-defined]
    with pytest.raises(Died):
        # more events than one transaction takes: the gated commit, whose marker a dead writer leaves behind
        store.commit(loaded.row, [UserEvent(text="lost") for _ in range(120)], loaded.row.version)

    assert not repair_after_lost_runner(view, "held", "inv_someone_else")
    assert repair_after_lost_runner(view, "held", claim.invocation_id)
    # held, this write would wait 10 s on the marker and raise StoreBusy (it turns stale only after 30 s)
    view.sessions.write("held", lambda s: s.append(UserEvent(text="after the repair")), on_conflict="fail")
    texts = [getattr(e, "text", None) for e in view.sessions.require("held").events]
    assert "lost" not in texts and "after the repair" in texts
    fidelity.app.close()


def test_the_answers_reply_says_the_turn_runs_even_when_it_ended_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dormant serve`` resumes an answered session in a thread; the reply is read from the claim, before that
    thread starts: a turn that ends before the reply is built must still reply ``running`` (so ``Prefer: wait``
    waits on it), not the ended turn's status with a 202."""
    from dormant.serving.workflow import threads as workflow  # the local waker's module, where _Thread is looked up

    class Finished(workflow._Thread):
        def __init__(self, work: Any) -> None:
            super().__init__(work)
            self._thread.join()  # the turn ends before on_answers returns: the race, every time

    monkeypatch.setattr(workflow, "_Thread", Finished)
    fidelity = build_fidelity(store_from_url(f"sqlite:///{tmp_path / 'reply.db'}"))
    served = Served(fidelity.app, {fidelity.agent.name: fidelity.agent})
    view = served.for_tenant("local")
    _yielded(view, fidelity.agent, "s")
    _answer(view, "s")
    reply = workflow.in_process_hooks(served).on_answers("local", view, view.sessions.require("s"))  # type: ignore[misc]
    assert reply["status"] == "running", reply
    assert view.sessions.require("s").status == "completed"  # it did end first
    fidelity.app.close()
