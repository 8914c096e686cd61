"""Turns that outlive their runner: committed step by step, handed on near a deadline, rescued by the sweeper.

A runner commits before every model call and tool execution, so one killed half way loses at most the step
in flight; its deadline is on the ledger, so the sweeper can tell it died and hand the turn on, keeping the
steps it committed and not running completed tools again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dormant.clock import frozen_clock, now_ms, use_clock
from dormant.events import InvocationResumeEvent, ToolResultEvent
from dormant.serving.runtime import Served
from dormant.serving.turns import RUNNER_TURN_MS, claim_turn, resume_turn, run_claimed
from dormant.serving.workflow import sweep_turns
from dormant.stores.url import store_from_url
from tests.support.turns_app import Turns, build

ROOT = Path(__file__).resolve().parents[2]


def test_a_runner_killed_half_way_is_handed_on_by_the_sweep_with_its_steps_kept(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    runner = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "turns_app.py"), store_url, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert runner.stdout is not None
        session_id = runner.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while not (folder / "inside").exists():  # the runner is inside its second tool
            assert runner.poll() is None and time.monotonic() < deadline, "the runner never reached its slow tool"
            time.sleep(0.01)
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
    finally:
        runner.kill()
        runner.wait(10)
        if runner.stdout is not None:
            runner.stdout.close()
    (folder / "release").touch()

    turns = build(store_from_url(store_url), folder, script=[{"text": "done"}])
    app = turns.app
    left = app.sessions.require(session_id)
    assert left.status == "running"
    kept = [e.id for e in left.events]
    kinds = [e.type for e in left.events]
    # the first tool's result was committed before the second tool ran: only the step in flight is lost
    assert kinds.count("tool_result") == 1 and kinds[-1] == "tool_call", kinds
    assert left.projection.deadline is not None

    served = Served(app, {turns.agent.name: turns.agent})
    assert sweep_turns(served, app) == []  # its deadline has not passed: a live runner is left alone
    later = left.projection.deadline + 61_000
    with use_clock(lambda: later):
        done = sweep_turns(served, app)
    assert done == [f"{session_id}@{left.projection.open_invocation}: handed on (completed)"], done

    final = app.sessions.require(session_id)
    assert final.status == "completed" and final.output.text == "done"
    assert [e.id for e in final.events][: len(kept)] == kept  # what the dead runner committed is kept
    # the completed tool did not run again; the one in flight did (at least once)
    assert (folder / "log").read_text().split() == ["note", "slow", "slow"]
    results = [e for e in final.events if isinstance(e, ToolResultEvent)]
    assert [r.name for r in results] == ["note", "slow"]
    app.close()


def _released(tmp_path: Path) -> tuple[Path, Turns]:
    """The turns app on a SQLite file, its ``slow`` tool released at once; its folder, where the tools log."""
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "release").touch()
    return folder, build(store_from_url(f"sqlite:///{tmp_path / 'turns.db'}"), folder)


def test_a_runner_near_its_deadline_hands_on_and_the_next_goes_on_without_rerunning_tools(tmp_path: Path) -> None:
    folder, turns = _released(tmp_path)
    app, agent = turns.app, turns.agent
    session = app.sessions.create()
    with frozen_clock(now_ms()) as clock:
        deadline = clock.ms + RUNNER_TURN_MS
        claim = claim_turn(app, agent, session, "go", deadline=deadline)
        turns.model.set_responses([{"tool_calls": [{"name": "note", "args": {}}]}])
        stream_before = len(app.sessions.require(session.id).events)
        clock.advance(RUNNER_TURN_MS)  # the runner's time is up before its first step
        first = run_claimed(app, claim, deadline=deadline)
        assert first.status == "handed_on"
        assert len(app.sessions.require(session.id).events) == stream_before  # it took no step
        assert app.sessions.require(session.id).status == "running"

        turns.model.set_responses([{"tool_calls": [{"name": "note", "args": {}}]}, {"text": "done"}])
        invocation = claim.invocation_id
        assert invocation is not None
        # the next runner: the note runs, then its time is up too, before the next model call
        original = turns.model.complete

        def slow_model(request: object) -> object:
            answer = original(request)  # type: ignore[arg-type]
            clock.advance(RUNNER_TURN_MS)
            return answer

        turns.model.complete = slow_model  # type: ignore[method-assign]
        second = resume_turn(app, lambda name: agent, session.id, invocation, deadline=clock.ms + RUNNER_TURN_MS)
        assert not isinstance(second, type(session)) and second.status == "handed_on"
        third = resume_turn(app, lambda name: agent, session.id, invocation, deadline=clock.ms + 10 * RUNNER_TURN_MS)
        assert not isinstance(third, type(session)) and third.status == "completed"
    final = app.sessions.require(session.id)
    assert final.status == "completed" and final.output.text == "done"
    assert (folder / "log").read_text().split() == ["note"]  # the note ran once across three runners
    resumes = [e for e in final.events if isinstance(e, InvocationResumeEvent)]
    assert len(resumes) == 2 and all(e.deadline for e in resumes)  # each runner recorded its own deadline
    app.close()


@pytest.mark.parametrize("fails", ["unavailable", "provider"])
def test_a_held_run_hands_on_a_model_call_that_ran_out_of_time_and_records_any_other_error(
    tmp_path: Path, fails: str
) -> None:
    """``run_held`` (a request that waits runs its turn): a model call that ends ``ModelUnavailable`` (its time ran
    out) is dropped uncommitted and the turn handed on at its last committed step; any other model error is the
    turn's, on the ledger as a runner with more time would record it, and nothing is handed on."""
    from dormant.errors import ModelUnavailable
    from dormant.events import ModelEndEvent
    from dormant.models.base import ModelRequest, ModelResponse
    from dormant.serving.turns import run_held

    turns = build(store_from_url(f"sqlite:///{tmp_path / 'turns.db'}"), tmp_path)
    app, agent = turns.app, turns.agent
    session = app.sessions.create()
    claim = claim_turn(app, agent, session, "go", deadline=now_ms() + 20_000)
    turns.model.set_responses([])

    def failing(request: ModelRequest) -> ModelResponse:
        raise (
            ModelUnavailable("timed out (the function's remaining time)")
            if fails == "unavailable"
            else ValueError("the provider refused the request")
        )

    turns.model.complete = failing  # type: ignore[method-assign]
    handed: list[int] = []
    outcome = run_held(app, claim, until=now_ms() + 20_000, hand_on=lambda at, parked: handed.append(at))
    stored = app.sessions.require(session.id)
    if fails == "unavailable":
        assert outcome is not None and outcome.status == "handed_on" and handed == [claim.version], (outcome, handed)
        assert stored.version == claim.version and stored.status == "running"  # nothing of the call committed
    else:
        assert outcome is not None and outcome.status == "error" and handed == [], (outcome, handed)
        ends = [e for e in stored.events if isinstance(e, ModelEndEvent)]
        assert stored.status == "error" and ends and ends[-1].error_type == "ValueError"
    app.close()


@pytest.mark.parametrize("refusal", ["StoreThrottled", "StoreUnavailable", "CommitIncomplete"])
@pytest.mark.parametrize("runner", ["held", "resumed"])
def test_a_steps_commit_refused_by_the_store_hands_the_turn_on_with_the_step_kept(
    tmp_path: Path, refusal: str, runner: str
) -> None:
    """The store refuses a step's commit for now (a throttle past the client's retries, a lost connection, a partial
    write): the runner stops there and hands the turn on, as at its deadline, instead of ending the turn in error;
    the step is committed by the runner's last write, so its tool is not run again. Held (``run_held``: handed on)
    and resumed (``resume_turn``: a workflow's Run, which runs again)."""
    from dormant import errors
    from dormant.serving.turns import run_held

    folder, turns = _released(tmp_path)
    app, agent = turns.app, turns.agent
    session = app.sessions.create()
    claim = claim_turn(app, agent, session, "go", deadline=now_ms() + 60_000)
    write, refused = app.sessions.write, []

    def refusing(**kwargs: object) -> object:
        held = kwargs["session"].uncommitted_events  # type: ignore[attr-defined]
        if not refused and any(isinstance(e, ToolResultEvent) for e in held):
            refused.append(1)
            raise getattr(errors, refusal)("refused for now")
        return write(**kwargs)  # type: ignore[arg-type]

    app.sessions.write = refusing  # type: ignore[method-assign]
    handed: list[int] = []
    if runner == "held":
        outcome = run_held(app, claim, until=now_ms() + 60_000, hand_on=lambda at, parked: handed.append(at))
        assert outcome is not None and outcome.status == "handed_on" and len(handed) == 1, (outcome, handed)
    else:
        assert claim.invocation_id is not None
        resumed = resume_turn(app, lambda name: agent, session.id, claim.invocation_id, deadline=now_ms() + 60_000)
        assert not isinstance(resumed, type(session)) and resumed.status == "handed_on", resumed
    assert refused, "no step's commit met the refusal"
    stored = app.sessions.require(session.id)
    assert stored.status == "running" and not any(getattr(e, "error", None) for e in stored.events), stored.events
    assert any(isinstance(e, ToolResultEvent) for e in stored.events)  # the step, kept by the runner's last write
    assert claim.invocation_id is not None
    last = resume_turn(app, lambda name: agent, session.id, claim.invocation_id, deadline=now_ms() + 60_000)
    assert not isinstance(last, type(session)) and last.status == "completed", last
    assert (folder / "log").read_text().split() == ["note", "slow"]  # each tool once across the runners
    app.close()


@pytest.mark.slow
def test_a_sixty_second_turn_completes_through_dormant_serve(store_url: str, tmp_path: Path) -> None:
    """The scripted model takes 60 s (past API Gateway's 29 s): the run answers 202 at once, the session shows
    ``running`` while the turn goes on in the server, then ``completed``."""
    import json
    import urllib.request

    from tests.support.servers.serve import dormant_serve, fidelity_app_env, shown_once_past

    env = fidelity_app_env()

    def call(url: str, method: str = "GET", body: object = None) -> tuple[int, dict[str, object]]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())

    with dormant_serve("--store", store_url, "--app", "fidelity_app:build", "--quiet", env=env, cwd=tmp_path) as server:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "slow"})[0] == 201
        started = time.monotonic()
        status, accepted = call(f"{server.url}/sessions/slow/runs", "POST", {"message": "sleep=60 signoffs=0"})
        assert (status, accepted["status"]) == (202, "running") and time.monotonic() - started < 29
        assert call(f"{server.url}/sessions/slow")[1]["status"] == "running"
        shown = shown_once_past(server.url, "slow", ("running",), timeout=150, every=1)
        assert shown["status"] == "completed" and time.monotonic() - started >= 60, shown
    assert "Traceback" not in server.output()


def test_dormant_serve_hands_on_a_turn_whose_runner_died(store_url: str, tmp_path: Path) -> None:
    """A turn claimed ten minutes ago by a runner that died before its first step: ``dormant serve``'s sweeper
    (``--sweep-every``) finds it among the store's running sessions (an index on DynamoDB), sees its deadline
    passed and runs it to its end."""
    from tests.support.fidelity.fidelity_app import build as build_fidelity
    from tests.support.servers.serve import dormant_serve, fidelity_app_env, shown_once_past

    store = store_from_url(store_url)
    fidelity = build_fidelity(store)
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    ten_minutes_ago = now_ms() - 600_000
    with use_clock(lambda: ten_minutes_ago):
        session = view.sessions.create("orphan")
        claim = claim_turn(view, fidelity.agent, session, "steps=2 signoffs=0", deadline=ten_minutes_ago + 60_000)
    assert claim.invocation_id is not None and view.sessions.require("orphan").status == "running"
    store.close()  # the runner dies: nothing ever runs the claim

    args = ("--store", store_url, "--app", "fidelity_app:build", "--sweep-every", "0.2", "--quiet")
    with dormant_serve(*args, env=fidelity_app_env(), cwd=tmp_path) as server:
        shown = shown_once_past(server.url, "orphan", ("running",), timeout=60)
    assert shown["status"] == "completed", shown
    assert "handed on (completed)" in server.output()


def test_running_turns_are_the_apps_and_its_tenants_only() -> None:
    """The store lists every app's running sessions: the sweeper of app ``a`` takes its own and its tenants',
    never those of ``ab`` or ``a.t`` (names ``a`` prefixes), nor those of a tenant of ``ab``."""
    from dormant import adk, in_memory_store
    from dormant.events import InvocationStartEvent
    from dormant.serving.runtime import for_tenant
    from dormant.serving.workflow import running_turns

    store = in_memory_store()
    app = adk(name="a", store=store)
    for view in (app, for_tenant(app, "t"), adk(name="ab", store=store), adk(name="a.t", store=store)):
        session = view.sessions.create(f"s-{view.name}")
        session.append(InvocationStartEvent(invocation_id=f"inv-{view.name}", agent_name="agent"))
        view.sessions.commit(session)
    assert sorted((view.name, sid) for view, sid in running_turns(app)) == [("a", "s-a"), ("a@t", "s-a@t")]
