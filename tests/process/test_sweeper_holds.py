"""What the sweeper and the ledger promise, each held by a test that fails when it is broken that way: a wait the
sweeper expires is its own execution's, a runner keeps a grace past its deadline, one session's error (or an AWS
throttle) skips that session and not the sweep, every sweep counts its repairs (0 too), a retried Run knows an
invocation that already ended, and the runner's deadline is on the projection (and in its snapshot)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dormant import metrics
from dormant.clock import now_ms, use_clock
from dormant.events import InvocationEndEvent, InvocationResumeEvent, InvocationStartEvent
from dormant.projection import Projection
from dormant.serving.runtime import Served
from dormant.serving.turns import claim_turn, run_to_end
from dormant.serving.workflow import WAIT_GRACE_MS, StepFunctions, sweep_turns, sweeper_handler, wait_record
from dormant.serving.workflow.tasks import run_action
from dormant.stores.memory import in_memory_store
from tests.support.fidelity.fidelity_app import build as build_fidelity


def _served() -> tuple[Any, Served, Any]:
    fidelity = build_fidelity(in_memory_store())
    served = Served(fidelity.app, {fidelity.agent.name: fidelity.agent})
    return fidelity, served, served.for_tenant("local")


class _Machine(StepFunctions):
    """Step Functions as the sweeper sees it, recorded: every execution named is gone unless listed ``alive``;
    ``throttled`` names the sessions whose calls AWS answers with ``ThrottlingException``."""

    def __init__(self, alive: set[str] | None = None, throttled: set[str] | None = None) -> None:
        super().__init__("arn:aws:states:us-east-1:123456789012:stateMachine:sessions", client=object())
        self.alive, self.throttled = alive or set(), throttled or set()
        self.calls: list[tuple[str, str]] = []

    def _throttle(self, operation: str, about: str) -> None:
        self.calls.append((operation, about))
        if any(name in about for name in self.throttled):
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, operation)

    def status(self, execution: str) -> str | None:
        self._throttle("DescribeExecution", execution)
        return "RUNNING" if execution in self.alive else "ABORTED"

    def wake(self, token: str, *, inline: bool = False, error: str | None = None) -> bool:
        self._throttle("SendTaskSuccess" if inline or error is None else "SendTaskFailure", token)
        return True

    def restart(self, tenant: str, session_id: str, invocation_id: str, version: int) -> str:
        self._throttle("StartExecution", session_id)
        return f"{session_id}-r0"


def _parked(view: Any, agent: Any, sid: str, *, at: int, until: int, execution: str) -> str:
    """A session of ``view`` that yielded ``at`` and whose execution parked, its wait timing out ``until``."""
    with use_clock(lambda: at):
        view.sessions.create(sid)
        outcome = run_to_end(view, claim_turn(view, agent, sid, "signoffs=1"), lambda _: agent)
        assert outcome.status == "yielded_tool", outcome
        invocation = view.sessions.require(sid).projection.open_invocation
        assert invocation is not None
        seconds = (until - at) / 1000
        StepFunctions().park(view, sid, invocation, f"token-{sid}", execution=execution, wait_seconds=seconds)
    return str(invocation)


def _answered(view: Any, sid: str, *, at: int) -> None:
    with use_clock(lambda: at):
        (call,) = view.sessions.require(sid).yielded_tools
        view.sessions.write(sid, lambda s: s.input.answers([{"call_id": call.call_id, "input": {"approved": True}}]))


# -- a wait is expired only by a sweep of its own ---------------------------------------------------------------


def test_a_wait_the_sweeper_expires_is_the_one_its_record_was_parked_for() -> None:
    """Two waits of one session: the first parked (its record's timeout long past), answered and run on; the
    second yielded and its execution died before it parked. The record is the first wait's: the sweep must not
    expire the second on the first's timeout, but give it a fresh execution. The wait its record holds, past
    its timeout with its execution gone, is expired."""
    fidelity, served, view = _served()
    now = now_ms()
    day_ago = now - 86_400_000
    _parked(view, fidelity.agent, "twice", at=day_ago, until=day_ago + 60_000, execution="arn:exec:first")
    _answered(view, "twice", at=day_ago + 1_000)
    with use_clock(lambda: day_ago + 2_000):  # the answered turn runs on to its end; the next one yields again
        outcome = run_to_end(view, claim_turn(view, fidelity.agent, "twice", "signoffs=1"), lambda _: fidelity.agent)
        assert outcome.status == "completed"
        outcome = run_to_end(view, claim_turn(view, fidelity.agent, "twice", "signoffs=2"), lambda _: fidelity.agent)
    assert outcome.status == "yielded_tool"
    record = wait_record(view, "twice")
    assert record["wait_version"] < view.sessions.require("twice").version  # the first wait's record
    _parked(view, fidelity.agent, "lapsed", at=day_ago, until=day_ago + 60_000, execution="arn:exec:lapsed")

    lines = sweep_turns(served, fidelity.app, machine=_Machine())
    assert [line for line in lines if line.startswith("twice")] == [
        f"twice@{view.sessions.require('twice').projection.open_invocation}: restarted (execution twice-r0)"
    ]
    assert view.sessions.require("twice").status == "awaiting_input"
    assert [line.split(": ")[1] for line in lines if line.startswith("lapsed")] == ["expired"]
    assert view.sessions.require("lapsed").events[-1].error_type == "SessionExpired"


# -- a runner keeps its grace ------------------------------------------------------------------------------------


def test_a_runner_past_its_deadline_keeps_the_grace_before_it_is_handed_on() -> None:
    """A running turn whose deadline passed 30 s ago is a slow runner still at work (the grace is 60 s): left
    alone. Past deadline and grace, it is handed on (and, the runner here, run to its end)."""
    fidelity, served, view = _served()
    now = now_ms()
    claim = claim_turn(view, fidelity.agent, view.sessions.create("slow"), "steps=1 signoffs=0", deadline=now - 30_000)
    assert claim.session.projection.deadline == now - 30_000
    assert sweep_turns(served, fidelity.app, grace_ms=60_000) == []
    assert view.sessions.require("slow").status == "running"
    with use_clock(lambda: now + 31_000):
        (line,) = sweep_turns(served, fidelity.app, grace_ms=60_000)
    assert line == f"slow@{claim.invocation_id}: handed on (completed)"


# -- one session's trouble skips that session -------------------------------------------------------------------


def test_one_running_sessions_error_does_not_stop_the_sweep_of_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three stuck turns; handing on the middle one raises an error that is no ``ClaimLost`` (a bug, a store's
    refusal): the other two are handed on, the failed one is reported and counted, and the next sweep takes it."""
    fidelity, served, view = _served()
    past = now_ms() - 600_000
    claims = {
        sid: claim_turn(view, fidelity.agent, view.sessions.create(sid), "steps=1 signoffs=0", deadline=past + n)
        for n, sid in enumerate(("first", "broken", "last"))
    }

    class Registry(dict[str, Any]):
        """The app's agents, whose second look-up fails (a bug of the app's, not a ``ClaimLost``)."""

        looked = 0

        def get(self, name: str, default: Any = None) -> Any:
            Registry.looked += 1
            if Registry.looked == 2:
                raise RuntimeError("the agent's registry failed")
            return super().get(name, default)

    served = Served(fidelity.app, Registry(served.agents))
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "sweeper")
    monkeypatch.setattr(metrics, "publish", lambda function, values: None)
    with metrics.collecting("sweeper") as counted:
        lines = sweep_turns(served, fidelity.app)
    handed = {line.split("@")[0] for line in lines if "handed on" in line}
    failed = [line for line in lines if "failed" in line]
    assert len(handed) == 2 and len(failed) == 1 and failed[0].endswith("failed (RuntimeError)"), lines
    assert ("sweep_skips", 1.0, None) in counted
    (skipped,) = set(claims) - handed
    assert view.sessions.require(skipped).status == "running"
    assert sweep_turns(served, fidelity.app) == [f"{skipped}@{claims[skipped].invocation_id}: handed on (completed)"]


@pytest.mark.parametrize("operation", ["DescribeExecution", "SendTaskSuccess", "StartExecution"])
def test_a_throttle_skips_one_wait_and_it_is_due_next_sweep(operation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three lost wake-ups (answered ten minutes ago); AWS throttles the sweeper's ``operation`` for the middle
    one: the other two are repaired, the throttled one is reported, counted, still due, and repaired next sweep.
    (``StartExecution``: their executions are gone, so each gets a fresh one; else each is woken.)"""
    fidelity, served, view = _served()
    ago = now_ms() - 600_000
    far = ago + 7 * 86_400_000
    sids = ("wake-a", "wake-b", "wake-c")
    for n, sid in enumerate(sids):
        _parked(view, fidelity.agent, sid, at=ago + n, until=far, execution=f"arn:exec:{sid}")
        _answered(view, sid, at=ago + 10 + n)
    alive = set() if operation == "StartExecution" else {f"arn:exec:{sid}" for sid in sids}
    machine = _Machine(alive, throttled={"wake-b"})
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "sweeper")
    monkeypatch.setattr(metrics, "publish", lambda function, values: None)
    with metrics.collecting("sweeper") as counted:
        lines = sweep_turns(served, fidelity.app, machine=machine)
    repaired = "restarted" if operation == "StartExecution" else "woken"
    assert [line.split("@")[0].split(":")[0] for line in lines if repaired in line] == ["wake-a", "wake-c"], lines
    assert [line for line in lines if line.startswith("wake-b")] == ["wake-b: failed (ClientError)"]
    assert (operation, "arn:exec:wake-b" if operation == "DescribeExecution" else "") in [
        (op, about if op == "DescribeExecution" else "") for op, about in machine.calls
    ] or operation != "DescribeExecution"
    assert ("sweep_skips", 1.0, None) in counted
    due = [r.session_id for r in view.store.due_waits(now_ms() - WAIT_GRACE_MS) if r.app_name == view.name]
    assert due == ["wake-b"]  # the repaired two are not looked at again before a grace; the skipped one is
    machine.throttled = set()
    again = sweep_turns(served, fidelity.app, machine=machine)
    assert [line.split("@")[0].split(":")[0] for line in again] == ["wake-b"] and repaired in again[0], again


# -- every sweep counts its repairs -----------------------------------------------------------------------------


def test_every_sweep_counts_its_repairs_even_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The alarm "repairs > 0 for 3 sweeps" needs a data point from every sweep: one that repaired nothing
    publishes ``repairs`` = 0 (a missing point would leave the alarm in INSUFFICIENT_DATA, never back to OK)."""
    _, served, _ = _served()
    handler = sweeper_handler(served)
    published: list[tuple[str, list[tuple[str, float, str | None]]]] = []
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "sweeper")
    monkeypatch.setattr(metrics, "publish", lambda function, values: published.append((function, list(values))))
    result = handler({}, None)
    assert result["repaired"] == 0
    assert published == [("sweeper", [("repairs", 0.0, None)])]


# -- a retried Run knows an ended invocation -------------------------------------------------------------------


def test_a_retried_run_recognises_an_invocation_that_already_ended() -> None:
    """Step Functions retries ``Run`` after its first attempt finished the turn (the answer lost on the way). The
    retry reports the invocation as ended, at once: no ``TurnNotClaimed`` (which the state machine would retry,
    then fail the execution), nothing run twice. Held where the session loads from a snapshot (an app whose
    agents render a window of history), whose projection no longer lists ended invocations."""
    from dormant import adk
    from tests.support.fidelity.fidelity_app import OrderedModel

    app = adk(name="retried", store=in_memory_store(), adapters={"ordered": OrderedModel()}, snapshot_every=2)
    agent = app.agent(name="a", model={"provider": "ordered", "name": "script"}, context=[app.context.history(2)])
    served = Served(app, {agent.name: agent})
    view = served.for_tenant("local")
    first = claim_turn(view, agent, view.sessions.create("done"), "signoffs=0")
    assert first.invocation_id is not None
    for n in range(4):  # later turns: the session's snapshot is taken well after the first ended
        outcome = run_to_end(view, first if n == 0 else claim_turn(view, agent, "done", "signoffs=0"), lambda _: agent)
        assert outcome.status == "completed"
    session = view.sessions.require("done")
    assert first.invocation_id not in session.projection.invocations  # loaded from a snapshot: ended ones gone
    count = session.version
    answer = run_action(served, view, "done", first.invocation_id, now_ms() + 60_000, retried=True)
    assert answer["status"] in ("completed", "ended"), answer
    assert view.sessions.require("done").version == count  # nothing run again, nothing written


# -- the runner's deadline is on the projection ----------------------------------------------------------------


def test_the_runners_deadline_is_on_the_projection_and_in_its_snapshot() -> None:
    """The sweeper tells a dead runner from a live one by the deadline the ledger records: the claim's, then
    each resume's (a runner handing on to itself), none once the invocation ends; and a snapshot keeps it."""
    projection = Projection()
    projection.apply(InvocationStartEvent(invocation_id="inv-1", agent_name="a", deadline=1_000))
    assert projection.deadline == 1_000
    projection.apply(InvocationResumeEvent(invocation_id="inv-1", deadline=2_000))
    assert projection.deadline == 2_000
    restored = Projection.restore(json.loads(json.dumps(projection.export())))
    assert restored.deadline == 2_000 and restored.open_invocation == "inv-1"
    projection.apply(InvocationEndEvent(invocation_id="inv-1", status="completed"))
    assert projection.deadline is None


# -- a healthy wait costs nothing ---------------------------------------------------------------------------------


def test_a_parked_wait_is_not_looked_at_before_its_timeout() -> None:
    """Parked ten minutes ago with a 7-day wait: a sweep neither reads it nor asks Step Functions about it (the
    park made it due at its timeout). Past the timeout and the grace, with its execution gone, it is expired."""
    fidelity, served, view = _served()
    ago = now_ms() - 600_000
    until = ago + 7 * 86_400_000
    _parked(view, fidelity.agent, "asleep", at=ago, until=until, execution="arn:exec:asleep")
    machine = _Machine()
    assert sweep_turns(served, fidelity.app, machine=machine) == [] and machine.calls == []
    assert [r.due_at for r in view.store.due_waits(until) if r.session_id == "asleep"] == [until]
    with use_clock(lambda: until + WAIT_GRACE_MS + 1):
        (line,) = sweep_turns(served, fidelity.app, machine=machine)
    assert line.endswith(": expired") and machine.calls == [("DescribeExecution", "arn:exec:asleep")]


def test_off_aws_a_wait_for_answers_is_looked_at_once() -> None:
    """Off AWS nobody need wake a wait until its answers come: the first sweep past its grace looks at it once and
    leaves it out of every later sweep; the answer's commit makes it due again, and a lost resume is repaired."""
    fidelity, served, view = _served()
    ago = now_ms() - 600_000
    with use_clock(lambda: ago):
        view.sessions.create("asks")
        assert run_to_end(view, claim_turn(view, fidelity.agent, "asks", "signoffs=1"), lambda _: fidelity.agent)
    assert [r.session_id for r in view.store.due_waits(now_ms() - WAIT_GRACE_MS)] == ["asks"]
    assert sweep_turns(served, fidelity.app) == []
    assert view.store.due_waits(now_ms() + 30 * 86_400_000) == []  # looked at once: due no more
    _answered(view, "asks", at=ago + 1)
    invocation = view.sessions.require("asks").projection.open_invocation
    assert sweep_turns(served, fidelity.app) == [f"asks@{invocation}: resumed (completed)"]
