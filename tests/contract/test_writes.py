"""app.sessions.write, the one write path: fail, retry and merge under a real race, on memory, a SQLite
file and DynamoDB Local.

The race is real: the change function, the first time it runs (or every time), commits through another
handle on the same store (its own connection or client) before the write it belongs to commits.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from dormant import adk, in_memory_store, openai
from dormant.app import App
from dormant.clock import frozen_clock
from dormant.errors import (
    InputError,
    SessionNotFound,
    StoreBusy,
    UnknownCallId,
    VersionConflict,
    http_status,
)
from dormant.events import InvocationEndEvent, SessionForkedEvent, ToolInputEvent, UserEvent
from dormant.session import Session
from dormant.stores.base import ScopedStateChange
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter
from tests.support.stores import store_maker


class Notes(BaseModel):
    a: int = 0
    b: int = 0
    shared: str = ""
    open: bool = True


class Approval(BaseModel):
    approved: bool


class Closed(InputError):
    """What the tests' precondition raises (a typed error of the caller's own)."""


@dataclass
class World:
    """Handles on one store: each ``handle()`` is another app (another connection or client) on it."""

    make_store: Callable[[], Any]
    name: str
    stores: list[Any]

    def handle(self, **options: Any) -> App:
        store = self.make_store()
        self.stores.append(store)
        app = adk(name=self.name, schema={"session": Notes}, store=store, adapters={"openai": MockAdapter()}, **options)
        app.tool(name="approve", description="", execute=None, yield_schema=Approval)
        return app


@pytest.fixture(params=["memory", "sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    made = World(store_maker(request.param, request, tmp_path), f"w-{uuid.uuid4().hex[:10]}", [])
    yield made
    for store in {id(s): s for s in made.stores}.values():
        store.close()


def texts(session: Session) -> list[str]:
    return [e.text for e in session.events if isinstance(e, UserEvent)]


def say(text: str) -> Callable[[Session], str]:
    """A change that appends one user message and returns its text."""

    def change(session: Session) -> str:
        session.input.message(text)
        return text

    return change


def racing(other: App, session_id: str, change: Callable[[Session], Any], *, every: bool = False) -> Any:
    """``change``, but first (on its first run only, or on ``every`` run) another writer commits a message
    through its own handle: the version moves between this write's load and its commit."""
    seen: list[Session] = []

    def raced(session: Session) -> Any:
        seen.append(session)
        if every or len(seen) == 1:
            theirs = other.sessions.require(session_id)
            theirs.input.message(f"theirs {len(seen)}")
            other.sessions.commit(theirs)
        return change(session)

    raced.seen = seen  # type: ignore[attr-defined]
    return raced


# -- fail ---------------------------------------------------------------------------------------------


def test_fail_raises_version_conflict_and_writes_nothing(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")
    change = racing(other, "s-1", say("mine"))
    with pytest.raises(VersionConflict) as caught:
        mine.sessions.write("s-1", change, on_conflict="fail")
    assert (caught.value.expected_version, caught.value.actual_version) == (1, 2) and http_status(caught.value) == 409
    stored = other.sessions.require("s-1")
    assert (texts(stored), stored.version) == (["theirs 1"], 2)  # nothing of the loser's
    assert len(change.seen) == 1  # no second try


def test_fail_commits_when_nobody_raced(world: World) -> None:
    app = world.handle()
    app.sessions.create("s-1")
    result = app.sessions.write("s-1", say("mine"))  # fail is the default
    assert (result.status, result.version, result.value, result.attempts, result.appended) == (
        "committed",
        2,
        "mine",
        1,
        1,
    )
    assert texts(result.session) == ["mine"] and result.session.uncommitted_events == []
    assert texts(world.handle().sessions.require("s-1")) == ["mine"]


def test_a_given_session_is_the_first_attempt_and_is_handed_back(world: World) -> None:
    """The claim's case: the caller holds the loaded session with its input already appended."""
    app, other = world.handle(), world.handle()
    app.sessions.create("s-1")
    held = app.sessions.require("s-1")
    held.input.message("claimed")
    result = app.sessions.write(session=held, change=lambda s: None)
    assert result.status == "committed" and result.session is held and held.version == 2
    stale = app.sessions.require("s-1")
    stale.input.message("late")
    theirs = other.sessions.require("s-1")
    theirs.input.message("first")
    other.sessions.commit(theirs)
    with pytest.raises(VersionConflict):
        app.sessions.write("s-1", lambda s: None, session=stale)
    assert texts(other.sessions.require("s-1")) == ["claimed", "first"]


# -- retry --------------------------------------------------------------------------------------------


def test_retry_runs_the_change_again_on_a_fresh_load(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")

    def count(session: Session) -> int:
        session.input.message("mine")
        session.state.a = session.state.a + 1
        return session.version

    change = racing(other, "s-1", count)
    result = mine.sessions.write("s-1", change, on_conflict="retry")
    assert (result.status, result.attempts, result.version, result.value) == ("committed", 2, 3, 2)
    first, second = change.seen
    assert second is not first and result.session is second  # never the stale object
    assert first.version == 1 and len(first.uncommitted_events) == 2  # left as it was, not committed
    stored = other.sessions.require("s-1")
    assert (texts(stored), stored.state.a, stored.version) == (["theirs 1", "mine"], 1, 3)


def test_retry_checks_the_precondition_again_after_the_reload(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")
    checked: list[bool] = []

    def still_open(session: Session) -> None:
        checked.append(session.state.open)
        if not session.state.open:
            raise Closed("the session was closed", field="open")

    def close_it(session: Session) -> None:  # the other writer closes it in between
        theirs = other.sessions.require("s-1")
        theirs.state.open = False
        other.sessions.commit(theirs)
        session.input.message("mine")

    with pytest.raises(Closed):
        mine.sessions.write("s-1", close_it, on_conflict="retry", precondition=still_open)
    assert checked == [True, False]
    stored = other.sessions.require("s-1")
    assert (texts(stored), stored.version, stored.state.open) == ([], 2, False)  # nothing of mine


def test_retry_exhausted_raises_store_busy_naming_the_session(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")
    change = racing(other, "s-1", say("mine"), every=True)
    with pytest.raises(StoreBusy) as caught:
        mine.sessions.write("s-1", change, on_conflict="retry", attempts=3)
    assert caught.value.session_id == "s-1" and "'s-1'" in str(caught.value) and http_status(caught.value) == 503
    assert len(change.seen) == 3
    stored = other.sessions.require("s-1")
    assert (texts(stored), stored.version) == (["theirs 1", "theirs 2", "theirs 3"], 4)


def test_retry_refuses_a_given_session_holding_uncommitted_events(world: World) -> None:
    app = world.handle()
    held = app.sessions.create("s-1")
    held.input.message("pending")
    with pytest.raises(InputError) as caught:
        app.sessions.write(session=held, change=say("more"), on_conflict="retry")
    assert caught.value.field == "session"
    assert world.handle().sessions.require("s-1").version == 1


# -- merge --------------------------------------------------------------------------------------------


def test_merge_rebases_what_does_not_overlap(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")

    runs: list[Session] = []

    def change(session: Session) -> str:
        runs.append(session)
        theirs = other.sessions.require("s-1")  # another writer sets b in between
        theirs.state.b = 2
        other.sessions.commit(theirs)
        session.input.message("mine")
        session.state.a = 1
        return "set a"

    result = mine.sessions.write("s-1", change, on_conflict="merge")
    assert (result.status, result.version, result.value, result.attempts, result.appended) == (
        "merged",
        3,
        "set a",
        2,
        2,
    )
    assert len(runs) == 1  # merge places the change's events, it does not run it again
    assert result.session is runs[0] and result.session.uncommitted_events == []
    stored = other.sessions.require("s-1")
    assert (stored.state.a, stored.state.b, texts(stored), stored.version) == (1, 2, ["mine"], 3)


def test_merge_forks_on_a_conflict_and_stores_the_fork(world: World) -> None:
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")
    runs: list[Session] = []

    def change(session: Session) -> str:
        runs.append(session)
        theirs = other.sessions.require("s-1")
        theirs.state.shared = "theirs"
        other.sessions.commit(theirs)
        session.input.message("mine")
        session.state.shared = "mine"
        return "wrote shared"

    result = mine.sessions.write("s-1", change, on_conflict="merge")
    assert (result.status, result.value, result.conflicts) == ("forked", "wrote shared", ["both wrote session.shared"])
    assert result.fork_id not in (None, "s-1") and result.session.id == result.fork_id
    assert result.version == result.session.version == 1 and result.session.uncommitted_events == []
    fork = other.sessions.require(result.fork_id)  # stored, seen through another handle
    assert (fork.state.shared, texts(fork), fork.forked_from) == ("mine", ["mine"], "s-1")
    assert isinstance(fork.events[-1], SessionForkedEvent)
    stored = other.sessions.require("s-1")
    assert (stored.state.shared, texts(stored), stored.version) == ("theirs", [], 2)  # the winner's, untouched
    assert runs[0].version == 1 and runs[0].uncommitted_events  # the object it came from is left as it was


# -- skipped, not found, errors, scoped writes -----------------------------------------------------------


def test_a_change_that_writes_nothing_is_skipped_with_no_store_call(world: World, monkeypatch: Any) -> None:
    app = world.handle()
    app.sessions.create("s-1")
    commits: list[object] = []
    real = app.store.commit
    monkeypatch.setattr(app.store, "commit", lambda *a, **k: commits.append(a) or real(*a, **k))
    for mode in ("fail", "retry", "merge"):
        result = app.sessions.write("s-1", lambda s: s.state.a, on_conflict=mode)  # a read: no event
        assert (result.status, result.version, result.value, result.attempts) == ("skipped", 1, 0, 1)
    assert commits == []
    assert app.sessions.write("s-1", say("x")).status == "committed" and len(commits) == 1  # the spy sees commits


def test_an_unknown_or_expired_session_is_session_not_found(world: World) -> None:
    app = world.handle(retention=timedelta(days=1))
    ran: list[Session] = []
    with pytest.raises(SessionNotFound) as caught:
        app.sessions.write("s-none", ran.append, on_conflict="retry")
    assert http_status(caught.value) == 404
    with frozen_clock(1_767_225_600_000) as clock:
        app.sessions.create("s-old")
        clock.advance(2 * 24 * 3600 * 1000)
        for mode in ("fail", "retry", "merge"):
            with pytest.raises(SessionNotFound):
                app.sessions.write("s-old", ran.append, on_conflict=mode)
    assert ran == []
    assert app.store.load(app.name, "s-old") is None or app.store.load(app.name, "s-old").row.version == 1


def test_errors_from_the_change_propagate_and_nothing_is_written(world: World) -> None:
    app = world.handle()
    app.sessions.create("s-1")

    def answer(session: Session) -> None:
        session.input.message("before the answer")
        session.input.answer("no-such-call", {"ok": True})  # nothing waits on it

    for mode in ("fail", "retry", "merge"):
        with pytest.raises(UnknownCallId):
            app.sessions.write("s-1", answer, on_conflict=mode)
    stored = world.handle().sessions.require("s-1")
    assert (stored.version, texts(stored)) == (1, [])


def test_scoped_changes_ride_on_the_commit_and_are_retried_with_it(world: World) -> None:
    """Park's case: a task token stored with the session, gated on its version, with no event."""
    mine, other = world.handle(), world.handle()
    mine.sessions.create("s-1")

    def token(session: Session) -> list[ScopedStateChange]:
        return [ScopedStateChange("workflow", session.id, "task_token", f"tok@{session.version}")]

    change = racing(other, "s-1", lambda s: None)
    result = mine.sessions.write("s-1", change, on_conflict="retry", scoped_changes=token)
    assert (result.status, result.attempts, result.version, result.appended) == ("committed", 2, 3, 0)
    assert other.store.load_scoped_state(other.name, "workflow", "s-1") == {"task_token": "tok@2"}


def test_bad_arguments_are_input_errors_naming_them(world: World) -> None:
    app = world.handle()
    app.sessions.create("s-1")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"on_conflict": "overwrite"}, "on_conflict"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": True}, "attempts"),
    ]
    for options, named in cases:
        with pytest.raises(InputError) as caught:
            app.sessions.write("s-1", say("x"), **options)
        assert caught.value.field == named
    with pytest.raises(InputError) as missing:
        app.sessions.write("s-1")
    assert missing.value.field == "change"
    with pytest.raises(InputError, match="write takes a Session") as not_a_session:
        app.sessions.write(change=say("x"), session="s-1")  # type: ignore[arg-type]
    assert not_a_session.value.field == "session"
    with pytest.raises(InputError) as other_session:
        app.sessions.write("s-2", say("x"), session=app.sessions.require("s-1"))
    assert other_session.value.field == "session"
    assert app.sessions.require("s-1").version == 1


# -- the integrator's callers: answers, park's token, ending a wait ------------------------------------------


def waiting_session(app: App) -> str:
    """A stored session whose invocation waits on the yielded call ``ask``."""
    model = app.adapters["openai"]
    assert isinstance(model, MockAdapter)
    agent = app.agent(name="agent", model=openai("m"), tools=[app.tool_named("approve")])  # type: ignore[list-item]
    model.set_responses([{"tool_calls": [{"name": "approve", "args": {}, "call_id": "ask"}]}])
    session = app.sessions.create("s-1")
    assert app.run(agent, "may I?", session=session).status == "yielded_tool"
    app.sessions.commit(session)
    return session.id


def answered(session: Session) -> list[bool]:
    return [e.input["approved"] for e in session.events if isinstance(e, ToolInputEvent)]


def test_a_second_answer_to_one_call_is_refused_after_the_reload(world: World) -> None:
    """POST /tools: answers retry past a version moved by anything, but not past the same call answered."""
    mine, other = world.handle(), world.handle()
    sid = waiting_session(mine)
    runs: list[Session] = []

    def answer(session: Session) -> None:
        runs.append(session)
        if len(runs) == 1:
            theirs = other.sessions.require(sid)
            theirs.input.answer("ask", {"approved": False})
            other.sessions.commit(theirs)
        session.input.answer("ask", {"approved": True})

    with pytest.raises(UnknownCallId) as caught:
        mine.sessions.write(sid, answer, on_conflict="retry")
    assert caught.value.call_id == "ask" and len(runs) == 2
    stored = other.sessions.require(sid)
    assert (answered(stored), stored.status) == ([False], "resumable")


def token(value: str) -> Callable[[Session], list[ScopedStateChange]]:
    """Park's write: the task token, only while the session still waits for answers."""

    def changes(session: Session) -> list[ScopedStateChange]:
        if session.status != "awaiting_input":
            return []
        return [ScopedStateChange("workflow", session.id, "task_token", value)]

    return changes


def test_park_stores_its_token_unless_answers_landed_first(world: World) -> None:
    """The park-vs-answer race: answers that land between park's load and its commit move the version; the
    retry sees them, stores no token (``skipped``) and tells park so (``value``), which wakes itself."""
    mine, other = world.handle(), world.handle()
    sid = waiting_session(mine)
    parked = mine.sessions.write(sid, lambda s: s.status, on_conflict="retry", scoped_changes=token("t-1"))
    assert (parked.status, parked.value, parked.appended) == ("committed", "awaiting_input", 0)
    assert other.store.load_scoped_state(other.name, "workflow", sid) == {"task_token": "t-1"}

    runs: list[Session] = []

    def status(session: Session) -> str:
        runs.append(session)
        if len(runs) == 1:  # the answer lands while the second wait parks
            theirs = other.sessions.require(sid)
            theirs.input.answer("ask", {"approved": True})
            other.sessions.commit(theirs)
        return session.status

    late = mine.sessions.write(sid, status, on_conflict="retry", scoped_changes=token("t-2"))
    assert (late.status, late.value, late.attempts, late.version) == ("skipped", "resumable", 2, parked.version + 1)
    assert other.store.load_scoped_state(other.name, "workflow", sid) == {"task_token": "t-1"}


def test_ending_a_wait_is_refused_once_answers_landed(world: World) -> None:
    """Expire ends a wait only while the session still waits on that invocation: answers that land as the
    wait times out are honoured (the precondition, checked again after the reload, refuses the end)."""
    mine, other = world.handle(), world.handle()
    sid = waiting_session(mine)
    invocation = mine.sessions.require(sid).projection.open_invocation
    assert invocation is not None

    def still_waiting(session: Session) -> None:
        if session.status != "awaiting_input" or session.projection.open_invocation != invocation:
            raise Closed(f"session {session.id!r} no longer waits on {invocation}", field="invocation_id")

    runs: list[Session] = []

    def end(session: Session) -> None:
        runs.append(session)
        if len(runs) == 1:
            theirs = other.sessions.require(sid)
            theirs.input.answer("ask", {"approved": True})
            other.sessions.commit(theirs)
        session.append(InvocationEndEvent(invocation_id=invocation, status="error", error="timed out"))

    with pytest.raises(Closed):
        mine.sessions.write(sid, end, on_conflict="retry", precondition=still_waiting)
    stored = other.sessions.require(sid)
    assert (stored.status, answered(stored), len(runs)) == ("resumable", [True], 1)


# -- N interleaved writers ------------------------------------------------------------------------------


class Interleaving:
    """N writers, each a thread running one ``write(on_conflict="retry")`` that appends its message; only
    one runs at a time. A writer pauses inside its change (after its load, before its commit); each step of
    the schedule lets one writer on to its next pause or its end. So the schedule decides who loads and who
    commits when, and the run is the same every time for the same schedule."""

    def __init__(self, apps: list[App], session_id: str) -> None:
        self.apps, self.session_id = apps, session_id
        self.go = [threading.Semaphore(0) for _ in apps]
        self.back = threading.Semaphore(0)
        self.started = [False] * len(apps)
        self.done = [False] * len(apps)
        self.results: list[Any] = [None] * len(apps)
        self.threads = [threading.Thread(target=self.writer, args=(n,), daemon=True) for n in range(len(apps))]

    def writer(self, n: int) -> None:
        def change(session: Session) -> int:
            self.back.release()  # paused: loaded, not yet committed
            assert self.go[n].acquire(timeout=60)
            session.input.message(f"w{n}")
            return n

        try:
            self.results[n] = self.apps[n].sessions.write(
                self.session_id, change, on_conflict="retry", attempts=len(self.apps)
            )
        except Exception as exc:  # reported by the test, never swallowed
            self.results[n] = exc
        self.done[n] = True
        self.back.release()

    def step(self, n: int) -> None:
        if self.done[n]:
            return
        if self.started[n]:
            self.go[n].release()
        else:
            self.started[n] = True
            self.threads[n].start()
        assert self.back.acquire(timeout=60), "a writer hung"

    def run(self, schedule: list[int]) -> None:
        for n in schedule:
            self.step(n % len(self.apps))
        while not all(self.done):
            for n in range(len(self.apps)):
                self.step(n)
        for thread in self.threads:
            thread.join(timeout=60)


def check_interleaved_writers(make_store: Callable[[], Any], writers: int, schedule: list[int]) -> list[Any]:
    name = f"iw-{uuid.uuid4().hex[:10]}"
    stores = [make_store() for _ in range(writers)]
    apps = [adk(name=name, schema={"session": Notes}, store=store) for store in stores]
    try:
        apps[0].sessions.create("s-1")
        race = Interleaving(apps, "s-1")
        race.run(schedule)
        failed = [r for r in race.results if isinstance(r, BaseException)]
        assert not failed, failed
        # Every write landed exactly once, each at a version of its own, the versions contiguous.
        assert sorted(r.version for r in race.results) == list(range(2, writers + 2))
        assert all(r.status == "committed" and 1 <= r.attempts <= writers for r in race.results)
        stored = apps[0].sessions.require("s-1")
        assert sorted(texts(stored)) == sorted(f"w{n}" for n in range(writers)) and stored.version == writers + 1
        loaded = stores[0].load(name, "s-1")
        assert [e.id for e in loaded.events] == [e.id for e in stored.events]
        return race.results
    finally:
        for store in {id(s): s for s in stores}.values():
            store.close()


def test_the_interleaving_makes_writers_lose_races() -> None:
    """All three load version 1 before anyone commits: the second loses once, the third twice."""
    shared = in_memory_store()
    results = check_interleaved_writers(lambda: shared, 3, [0, 1, 2])
    assert [r.attempts for r in results] == [1, 2, 3]
    assert [r.version for r in results] == [2, 3, 4]


SCHEDULES = st.integers(2, 5).flatmap(lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n - 1), max_size=30)))


@settings(max_examples=40)
@given(plan=SCHEDULES)
def test_interleaved_retrying_writers_each_land_exactly_once_in_memory(plan: tuple[int, list[int]]) -> None:
    shared = in_memory_store()
    check_interleaved_writers(lambda: shared, *plan)


@settings(max_examples=25)
@given(plan=SCHEDULES)
def test_interleaved_retrying_writers_each_land_exactly_once_on_sqlite(plan: tuple[int, list[int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "race.db"
        check_interleaved_writers(lambda: sqlite_store(path), *plan)


@pytest.mark.backend("dynamodb")
def test_interleaved_retrying_writers_each_land_exactly_once_on_dynamodb(
    dynamodb_table: str, dynamodb_endpoint: str
) -> None:
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    @settings(max_examples=10)
    @given(plan=SCHEDULES)
    def check(plan: tuple[int, list[int]]) -> None:
        check_interleaved_writers(lambda: dynamo_store(dynamodb_table, client=client(dynamodb_endpoint)), *plan)

    check()
