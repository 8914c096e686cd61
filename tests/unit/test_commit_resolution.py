"""dormant.serving.commit: committed, merged, skipped and orphaned, with two writers racing on one SQLite file."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, openai
from dormant.events import SessionForkedEvent, StateChangeEvent, UserEvent
from dormant.serving import commit
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter


class Notes(BaseModel):
    a: int = 0
    b: int = 0
    shared: str = ""


class Approval(BaseModel):
    approved: bool


def writer(path: Path) -> Any:
    """One 'process': its own store connection, app and scripted model, on the same SQLite file."""
    scripted = MockAdapter()
    app = adk(
        name="race", schema={"session": Notes, "user": Notes}, store=sqlite_store(path), adapters={"openai": scripted}
    )

    def set_key(ctx: Any) -> str:
        scope, _, key = ctx.args.key.rpartition(".")  # "a" is session state, "user.a" the user scope
        setattr(ctx.state.user if scope == "user" else ctx.state, key, ctx.args.value)
        return "set"

    class SetKey(BaseModel):
        key: str
        value: Any

    tools = [
        app.tool(name="set_key", description="", schema=SetKey, execute=set_key),
        app.tool(name="approve", description="", execute=None, yield_schema=Approval),
    ]
    agent = app.agent(name="agent", model=openai("m"), context=[app.context.history()], tools=tools)
    return app, scripted, agent


def turn(app: Any, scripted: MockAdapter, agent: Any, session: Any, message: str, key: str | None, value: Any) -> None:
    calls = [{"tool_calls": [{"name": "set_key", "args": {"key": key, "value": value}}]}] if key else []
    scripted.set_responses([*calls, {"text": f"done: {message}"}])
    assert app.run(agent, message, session=session).status == "completed"


@pytest.fixture
def two_writers(tmp_path: Path) -> Any:
    path = tmp_path / "race.db"
    first, second = writer(path), writer(path)
    first[0].sessions.create("s-1", scopes={"user": "u-1"})
    yield first, second
    first[0].close()
    second[0].close()


def texts(events: Any) -> list[str]:
    return [e.text for e in events if isinstance(e, UserEvent)]


def test_committed_on_the_first_try_and_skipped_when_nothing_is_new(two_writers: Any) -> None:
    (app, scripted, agent), _ = two_writers
    session = app.sessions.get("s-1")
    turn(app, scripted, agent, session, "hello", "a", 1)
    outcome = commit(app, session)
    assert (outcome.status, outcome.version, outcome.appended) == ("committed", 2, len(session.events))
    again = commit(app, session)
    assert (again.status, again.version, again.appended) == ("skipped", 2, 0)


def test_merged_when_the_version_moved_and_the_writes_do_not_overlap(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    mine, theirs = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    turn(app1, model1, agent1, mine, "from one", "a", 1)
    turn(app2, model2, agent2, theirs, "from two", "b", 2)
    assert commit(app2, theirs).status == "committed"
    outcome = commit(app1, mine)
    assert (outcome.status, outcome.version, outcome.session_id) == ("merged", 3, "s-1")
    stored = app1.sessions.get("s-1")
    assert texts(stored.events) == ["from two", "from one"]  # what landed first, then the run, unchanged
    assert (stored.state.a, stored.state.b) == (1, 2)
    assert [e.id for e in mine.events] == [e.id for e in stored.events] and mine.version == 3
    assert mine.uncommitted_events == []
    # Every old_value the rebased run recorded is still the value it replaced.
    for index, event in enumerate(stored.events):
        if isinstance(event, StateChangeEvent) and index:
            before = stored.state_at(index - 1).session_state
            assert all(before.get(c.key) == c.old_value for c in event.changes)


def test_orphaned_when_both_wrote_the_same_key_and_nothing_is_lost(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    mine, theirs = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    turn(app1, model1, agent1, mine, "from one", "shared", "one")
    turn(app2, model2, agent2, theirs, "from two", "shared", "two")
    commit(app2, theirs)
    outcome = commit(app1, mine)
    assert outcome.status == "orphaned" and outcome.fork_id not in (None, "s-1")
    assert outcome.conflicts == ["both wrote session.shared"]
    stored = app1.sessions.get("s-1")
    assert texts(stored.events) == ["from two"] and stored.state.shared == "two"
    fork = app1.sessions.get(outcome.fork_id)
    assert [e.id for e in fork.events[:-1]] == [e.id for e in mine.events]  # the run's whole ledger, parked
    assert fork.state.shared == "one" and outcome.version == fork.version == 1
    assert mine.version == 1 and len(mine.uncommitted_events) > 0  # the object passed in is left as it was
    # The fork says so, on its row and in its ledger: the session it came from, where, and why.
    assert (fork.forked_from, fork.fork_reason) == ("s-1", "both wrote session.shared")
    row = app1.store.load("race", outcome.fork_id).row
    assert (row.forked_from, row.fork_reason) == ("s-1", "both wrote session.shared")
    marker = fork.events[-1]
    assert isinstance(marker, SessionForkedEvent)
    assert (marker.from_session_id, marker.at_event_id, marker.reason) == ("s-1", None, "both wrote session.shared")
    assert app1.store.load("race", "s-1").row.forked_from is None


def test_a_merged_run_applies_its_shared_scope_writes(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    mine, theirs = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    turn(app1, model1, agent1, mine, "from one", "user.a", 1)
    turn(app2, model2, agent2, theirs, "from two", "user.b", 2)
    assert commit(app2, theirs).status == "committed"
    assert commit(app1, mine).status == "merged"
    assert app1.store.load_scoped_state("race", "user", "u-1") == {"a": 1, "b": 2}
    assert app2.sessions.get("s-1").state.user.to_dict() == {"a": 1, "b": 2}


def test_an_orphaned_run_leaves_the_winners_shared_scope_writes_alone(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    mine, theirs = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    model1.set_responses(
        [
            {"tool_calls": [{"name": "set_key", "args": {"key": "user.shared", "value": "one"}}]},
            {"tool_calls": [{"name": "set_key", "args": {"key": "user.a", "value": 1}}]},
            {"text": "done"},
        ]
    )
    assert app1.run(agent1, "from one", session=mine).status == "completed"
    turn(app2, model2, agent2, theirs, "from two", "user.shared", "two")
    assert commit(app2, theirs).status == "committed"
    outcome = commit(app1, mine)
    assert outcome.status == "orphaned" and outcome.conflicts == ["both wrote user/u-1.shared"]
    assert app1.store.load_scoped_state("race", "user", "u-1") == {"shared": "two"}  # nothing of the loser's


def test_a_new_invocation_is_orphaned_while_the_stored_ledger_has_one_open(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    mine, theirs = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    model2.set_responses([{"tool_calls": [{"name": "approve", "args": {}, "call_id": "ask"}]}])
    assert app2.run(agent2, "may I?", session=theirs).status == "yielded_tool"
    assert commit(app2, theirs).status == "committed"  # stored: an invocation waits for its answer
    turn(app1, model1, agent1, mine, "something else", "a", 1)  # no key, call or invocation in common
    outcome = commit(app1, mine)
    assert outcome.status == "orphaned"
    [reason] = outcome.conflicts
    assert reason.startswith("invocation ") and reason.endswith(" is still open in the stored ledger")
    assert app1.sessions.get("s-1").status == "awaiting_input"


def test_orphaned_when_two_writers_answer_the_same_yielded_call(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, model2, agent2) = two_writers
    session = app1.sessions.get("s-1")
    model1.set_responses([{"tool_calls": [{"name": "approve", "args": {}, "call_id": "ask"}]}])
    assert app1.run(agent1, "may I?", session=session).status == "yielded_tool"
    app1.sessions.commit(session)
    yes, no = app1.sessions.get("s-1"), app2.sessions.get("s-1")
    model1.set_responses([{"text": "approved"}])
    model2.set_responses([{"text": "denied"}])
    app1.run(agent1, {"answers": [{"call_id": "ask", "input": {"approved": True}}]}, session=yes)
    app2.run(agent2, {"answers": [{"call_id": "ask", "input": {"approved": False}}]}, session=no)
    assert commit(app1, yes).status == "committed"
    outcome = commit(app2, no)
    assert outcome.status == "orphaned"
    assert "both answered or ran tool call ask" in outcome.conflicts
    assert any(reason.startswith("both continued invocation") for reason in outcome.conflicts)
    assert app1.sessions.get("s-1").output.text == "approved"


def test_orphaned_when_the_session_was_deleted(two_writers: Any) -> None:
    (app1, model1, agent1), (app2, _, _) = two_writers
    session = app1.sessions.get("s-1")
    turn(app1, model1, agent1, session, "hello", None, None)
    app2.sessions.delete("s-1")
    outcome = commit(app1, session)
    assert (outcome.status, outcome.conflicts) == ("orphaned", ["the session was deleted"])
    assert texts(app1.sessions.get(outcome.fork_id).events) == ["hello"]


def test_committed_when_an_earlier_attempt_landed_but_its_answer_was_lost(two_writers: Any) -> None:
    (app, scripted, agent), _ = two_writers
    session = app.sessions.get("s-1")
    turn(app, scripted, agent, session, "hello", "a", 5)
    # The commit reached the store, but the caller never heard back (a timeout): same events again.
    app.store.commit(session.row(), session.uncommitted_events, session.version, session.scoped_changes())
    outcome = commit(app, session)
    assert (outcome.status, outcome.version) == ("committed", 2)
    assert len(app.sessions.get("s-1").events) == len(session.events)  # nothing doubled


def test_many_concurrent_turns_all_land_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    writer(path)[0].sessions.create("s-1")
    outcomes: list[str] = []
    lock = threading.Lock()

    def run_turns(w: int) -> None:
        app, scripted, agent = writer(path)
        for n in range(5):
            session = app.sessions.get("s-1")
            turn(app, scripted, agent, session, f"w{w}-{n}", None, None)
            status = commit(app, session, attempts=50).status
            with lock:
                outcomes.append(status)
        app.close()

    threads = [threading.Thread(target=run_turns, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert set(outcomes) <= {"committed", "merged"} and len(outcomes) == 20
    final = writer(path)[0].sessions.get("s-1")
    said = texts(final.events)
    assert sorted(said) == sorted(f"w{w}-{n}" for w in range(4) for n in range(5))
    assert final.version == 21
    for w in range(4):
        assert [t for t in said if t.startswith(f"w{w}-")] == [f"w{w}-{n}" for n in range(5)]


def test_a_merge_on_a_session_read_from_its_last_commits_snapshot(tmp_path: Path) -> None:
    """A SQL store keeps a snapshot at every commit, so a loaded session holds no stored event: what it holds are
    its writer's own new events. A racing writer's commit must then be merged, not taken for a deleted session
    (the lazy ledger compared the store's next event with the first one held, which was never stored)."""
    path = tmp_path / "race.db"
    mine = adk(name="race", store=sqlite_store(path), adapters={"openai": MockAdapter()})
    other = adk(name="race", store=sqlite_store(path), adapters={"openai": MockAdapter()})
    mine.sessions.create("s-1")
    for text in ("one", "two"):
        other.sessions.write("s-1", lambda s, text=text: s.input.message(text))

    def change(session: Any) -> None:
        other.sessions.write("s-1", lambda s: s.input.message("theirs"))  # lands while this write is in hand
        session.input.message("mine")

    result = mine.sessions.write("s-1", change, on_conflict="merge")
    assert result.status == "merged", result
    texts = [e.text for e in mine.sessions.require("s-1").events if isinstance(e, UserEvent)]
    assert texts == ["one", "two", "theirs", "mine"]
