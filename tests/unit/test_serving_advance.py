"""dormant.serving.advance: claim before acting. Of two callers on one session only the claimant runs tools."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, openai
from dormant.errors import AwaitingInput, ClaimLost, InputError, SessionNotFound, VersionConflict, http_status
from dormant.events import InvocationResumeEvent, InvocationStartEvent
from dormant.serving import advance
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter


class Approval(BaseModel):
    approved: bool


class Slot(BaseModel):
    slot: str


class Process:
    """One 'process': its own store handle, app and scripted model on a shared SQLite file."""

    def __init__(self, path: Path, on_tool: Any = None) -> None:
        self.model = MockAdapter()
        self.app = adk(name="claims", store=sqlite_store(path), adapters={"openai": self.model})
        self.ran: list[str] = []
        self.stored_when_run: list[list[str]] = []

        def act(ctx: Any) -> str:
            loaded = self.app.store.load("claims", ctx.session.id)
            self.stored_when_run.append([e.type for e in loaded.events] if loaded else [])
            self.ran.append(ctx.call_id)
            if on_tool is not None:
                on_tool()
            return "done"

        tools = [
            self.app.tool(name="book", description="", schema=Slot, execute=act, yield_schema=Approval),
            self.app.tool(name="note", description="", schema=Slot, execute=act),
        ]
        self.agent = self.app.agent(name="agent", model=openai("m"), context=[self.app.context.history()], tools=tools)

    def answers(self, session_id: str) -> dict[str, Any]:
        session = self.app.sessions.get(session_id)
        assert session is not None
        return {"answers": [{"call_id": c.call_id, "input": {"approved": True}} for c in session.yielded_tools]}


def waiting_session(proc: Process, calls: int = 1) -> str:
    proc.model.set_responses(
        [{"tool_calls": [{"name": "book", "args": {"slot": f"s{n}"}, "call_id": f"c{n}"} for n in range(calls)]}]
    )
    outcome = advance(proc.app, proc.agent, proc.app.sessions.ephemeral(), "book it")
    assert (outcome.status, outcome.commit_status) == ("yielded_tool", "committed")
    return outcome.session_id


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "claims.db"


def test_the_claim_is_stored_before_any_tool_runs(path: Path) -> None:
    proc = Process(path)
    sid = waiting_session(proc)
    proc.model.set_responses([{"text": "booked"}])
    outcome = advance(proc.app, proc.agent, sid, proc.answers(sid))
    assert (outcome.status, outcome.commit_status, outcome.output.text) == ("completed", "committed", "booked")
    assert proc.ran == ["c0"]
    # When the tool ran, the store already held the answer and the resume: the claim.
    assert proc.stored_when_run[0][-2:] == ["tool_input", "invocation_resume"]
    stored = proc.app.sessions.get(sid)
    # Versions: 3 the claim, 4 the tool's result (committed before the model's next call), 5 the end.
    assert stored is not None and stored.status == "completed" and stored.version == outcome.version == 5


def test_a_new_turn_is_claimed_with_its_message(path: Path) -> None:
    proc = Process(path)
    proc.model.set_responses([{"tool_calls": [{"name": "note", "args": {"slot": "x"}}]}, {"text": "ok"}])
    outcome = advance(proc.app, proc.agent, proc.app.sessions.ephemeral(), "note x")
    assert outcome.status == "completed" and len(proc.ran) == 1
    # The claim, then the model's step committed before its tool ran: a runner killed now loses no step.
    assert proc.stored_when_run[0] == ["invocation_start", "user", "model_start", "model_end", "tool_call"]


def test_a_stale_caller_loses_the_claim_and_runs_nothing(path: Path) -> None:
    winner, loser = Process(path), Process(path)
    sid = waiting_session(winner)
    stale = loser.app.sessions.get(sid)  # both read version 2
    assert stale is not None
    winner.model.set_responses([{"text": "booked"}])
    assert advance(winner.app, winner.agent, sid, winner.answers(sid)).status == "completed"

    loser.model.set_responses([{"text": "booked too"}])
    with pytest.raises(ClaimLost) as lost:
        advance(loser.app, loser.agent, stale, {"answers": [{"call_id": "c0", "input": {"approved": False}}]})
    assert isinstance(lost.value, VersionConflict) and http_status(lost.value) == 409
    assert (lost.value.expected_version, lost.value.actual_version) == (2, 5)
    assert loser.ran == [] and loser.model.requests == []
    stored = winner.app.sessions.get(sid)
    assert stored is not None and stored.version == 5
    assert next(e for e in stored.events if e.type == "tool_input").input == {"approved": True}  # type: ignore[union-attr]
    assert len(winner.app.sessions.list()) == 1  # no fork


def test_a_session_held_by_a_running_invocation_is_refused_until_taken_over(path: Path) -> None:
    release, entered = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        assert release.wait(timeout=30)

    holder, other = Process(path, on_tool=hold), Process(path)
    sid = waiting_session(other)
    holder.model.set_responses([{"text": "booked"}])
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(advance(holder.app, holder.agent, sid, holder.answers(sid))))
    thread.start()
    try:
        assert entered.wait(timeout=30)  # the holder claimed and is inside its tool
        with pytest.raises(ClaimLost, match="an invocation is running"):
            advance(other.app, other.agent, sid, "hello?")
        assert other.ran == []
    finally:
        release.set()
        thread.join(timeout=30)
    assert done and done[0].status == "completed" and holder.ran == ["c0"]


def test_takeover_resumes_a_run_whose_process_died(path: Path) -> None:
    proc = Process(path)
    sid = waiting_session(proc)
    session = proc.app.sessions.get(sid)
    assert session is not None
    stream = proc.app.stream(proc.agent, proc.answers(sid), session=session)
    for event in stream:  # claim, then 'die' before the tool runs
        if isinstance(event, InvocationResumeEvent):
            proc.app.sessions.commit(session)
            break
    assert proc.app.sessions.get(sid).status == "running"  # type: ignore[union-attr]
    with pytest.raises(ClaimLost):
        advance(proc.app, proc.agent, sid)
    proc.model.set_responses([{"text": "booked"}])
    outcome = advance(proc.app, proc.agent, sid, takeover=True)
    assert (outcome.status, outcome.commit_status) == ("completed", "committed") and proc.ran == ["c0"]


def test_input_that_opens_no_invocation_is_claimed_at_the_end(path: Path) -> None:
    first, second = Process(path), Process(path)
    sid = waiting_session(first, calls=2)
    first.model.set_responses([])
    outcome = advance(first.app, first.agent, sid, {"answers": [{"call_id": "c0", "input": {"approved": True}}]})
    assert (outcome.status, outcome.commit_status, outcome.version) == ("yielded_tool", "committed", 4)
    assert [t.call_id for t in outcome.yielded_tools] == ["c1"] and first.ran == ["c0"]

    with pytest.raises(AwaitingInput):  # c1 still waits: a message is refused, with nothing written
        advance(first.app, first.agent, sid, "any news?")
    stale = second.app.sessions.get(sid)
    note = advance(first.app, first.agent, sid, {"state": {"note": "call back"}})  # no invocation opens, nothing runs
    assert (note.status, note.commit_status, note.version) == ("yielded_tool", "committed", 5)
    with pytest.raises(ClaimLost):
        advance(second.app, second.agent, stale, {"state": {"note": "me too"}})  # type: ignore[arg-type]
    stored = first.app.sessions.get(sid)
    assert stored is not None and stored.projection.session_state["note"] == "call back"
    assert [e.text for e in stored.events if e.type == "user"] == ["book it"]  # type: ignore[union-attr]
    nothing = advance(first.app, first.agent, sid)
    assert (nothing.commit_status, nothing.version) == ("skipped", 5)


def test_racing_threads_one_claim_wins(path: Path) -> None:
    procs = [Process(path) for _ in range(4)]
    sid = waiting_session(procs[0])
    barrier = threading.Barrier(len(procs), timeout=30)
    outcomes: list[str] = []

    def race(proc: Process) -> None:
        session, answers = proc.app.sessions.get(sid), proc.answers(sid)  # everyone reads version 2 first
        proc.model.set_responses([{"text": "booked"}])
        barrier.wait()
        try:
            advance(proc.app, proc.agent, session, answers)  # type: ignore[arg-type]
            outcomes.append("won")
        except ClaimLost:
            outcomes.append("lost")

    threads = [threading.Thread(target=race, args=(p,)) for p in procs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    assert sum(len(p.ran) for p in procs) == 1
    assert len(procs[0].app.sessions.list()) == 1


def test_bad_input_and_unknown_ids_write_nothing(path: Path) -> None:
    proc = Process(path)
    with pytest.raises(SessionNotFound):
        advance(proc.app, proc.agent, "s_missing", "hi")
    sid = waiting_session(proc)
    with pytest.raises(InputError):
        advance(proc.app, proc.agent, sid, {"answers": [{"call_id": "c0", "input": {"approved": "maybe"}}]})
    stored = proc.app.sessions.get(sid)
    assert stored is not None and stored.version == 2 and proc.ran == []


def test_the_claim_event_is_the_first_invocation_event(path: Path) -> None:
    """Guards the assumption advance rests on: the loop yields the invocation event before any tool result."""
    proc = Process(path)
    sid = waiting_session(proc)
    session = proc.app.sessions.get(sid)
    proc.model.set_responses([{"text": "ok"}])
    kinds = [type(e) for e in proc.app.stream(proc.agent, proc.answers(sid), session=session)]
    first_invocation = next(i for i, k in enumerate(kinds) if k in (InvocationStartEvent, InvocationResumeEvent))
    assert first_invocation < [k.__name__ for k in kinds].index("ToolResultEvent")


def test_writes_committed_by_the_claim_stay_visible_to_the_run(tmp_path: Path) -> None:
    """Seeds of a bound shared scope are committed with the claim; the run must still read them."""

    class Patient(BaseModel):
        name: str | None = None

    model = MockAdapter([{"tool_calls": [{"name": "greet", "args": {}}]}, {"text": "ok"}])
    store = sqlite_store(tmp_path / "s.db")
    app = adk(name="seeded", schema={"user": Patient}, store=store, adapters={"openai": model})
    seen: list[str | None] = []
    greet = app.tool(name="greet", description="", execute=lambda ctx: seen.append(ctx.state.user.name))
    agent = app.agent(name="agent", model=openai("m"), context=[app.context.history()], tools=[greet])
    session = app.sessions.ephemeral(scopes={"user": "u-1"})
    outcome = advance(app, agent, session, {"message": "hi", "initial_state": {"user": {"name": "Ada"}}})
    assert outcome.status == "completed" and seen == ["Ada"]
    assert not [e for e in outcome.session.events if e.type == "state_change" and e.source == "observation"]  # type: ignore[union-attr]
    assert app.store.load_scoped_state("seeded", "user", "u-1") == {"name": "Ada"}
