"""Long sessions: snapshots, and loading a session from its snapshot and the tail of its ledger.

The property: for random sessions, in every store that keeps snapshots, a session loaded from its
snapshot and tail has the same state, status, yielded tools, model input — and sends the model the
same messages on its next run — as the session replayed from its whole ledger, at every commit.
"""

from __future__ import annotations

import gc
import json
import sys
import uuid
import weakref
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from dormant import App, Session, adk
from dormant.agents.agent import Agent
from dormant.clock import frozen_clock
from dormant.errors import ConfigurationError, InputError
from dormant.events import ModelStartEvent, UserEvent
from dormant.serving import commit as serving_commit
from dormant.snapshots import FORMAT, load_session, snapshot_of
from dormant.stores.base import (
    SnapshotStore,
    StoredSession,
    StoredSnapshot,
)
from dormant.stores.memory import in_memory_store
from dormant.stores.sqlite import SQLiteSessionStore, sqlite_store
from dormant.testing import MockAdapter
from tests.support.snapshots_app import Counting, CountingWithSnapshots, Notes, Profile, build


def turn(app: App, agent: Agent, model: MockAdapter, session: Session, step: int, plan: str) -> None:
    """One turn: answer what waits, else a message the model answers as ``plan`` says.

    ``hold`` records the answers to waiting calls without running (the tool runs on the next turn);
    ``write`` sets state from outside any run.
    """
    if plan == "write":
        session.state.count = step
        return
    if plan == "hold" and session.yielded_tools:
        session.input.answers([{"call_id": y.call_id, "input": {"yes": True}} for y in session.yielded_tools])
        return
    if session.status == "resumable":
        model.set_responses([{"text": f"resumed {step}"}])
        app.run(agent, session=session)
        return
    if session.yielded_tools:
        answers = [{"call_id": y.call_id, "input": {"yes": step % 2 == 0}} for y in session.yielded_tools]
        model.set_responses([{"text": f"thanks {step}"}])
        app.run(agent, {"answers": answers}, session=session)
        return
    script: list[dict[str, Any]] = {
        "text": [{"text": f"reply {step}"}],
        "tally": [{"tool_calls": [{"name": "tally", "args": {"n": step}, "call_id": f"t{step}"}]}, {"text": "ok"}],
        "ask": [{"tool_calls": [{"name": "ask", "args": {"question": f"q{step}"}, "call_id": f"a{step}"}]}],
    }.get(plan, [{"text": f"reply {step}"}])
    model.set_responses(script)
    app.run(agent, f"message {step}", session=session)


def whole(app: App, session_id: str) -> Session:
    session = load_session(app, session_id, history=None)
    assert session is not None
    return session


def same(tail: Session, full: Session) -> None:
    """Everything a turn reads, and what time travel rebuilds, agree."""
    assert tail.projection.export() == full.projection.export()
    assert (tail.status, tail.yielded_tools, tail.output) == (full.status, full.yielded_tools, full.output)
    assert (tail.state.count, tail.state.words, tail.state.user.name) == (
        full.state.count,
        full.state.words,
        full.state.user.name,
    )
    assert (tail.version, len(tail.events)) == (full.version, len(full.events))
    starts = [n for n, e in enumerate(full.events) if isinstance(e, ModelStartEvent)]
    for index in starts[-2:]:
        assert tail.model_input(index) == full.model_input(index)


# -- the property, in every store -----------------------------------------------------------------------

PLANS = st.sampled_from(["text", "tally", "ask", "hold", "write"])


def check_random_session(make_store: Callable[[], Any], plans: list[str], every: int, turns: int, name: str) -> None:
    with closing(make_store()) as store:
        app, agent, model = build(store, every=every, turns=turns, name=name)
        replay, replay_agent, replay_model = build(store, every=None, turns=turns, name=name)
        session = app.sessions.create(scopes={"user": "u-1"})
        session.state.user.name = "Ada"
        app.sessions.commit(session)
        for step, plan in enumerate(plans):
            # A run on the tail-loaded session sends the model what a run on the whole ledger sends.
            tail, full = app.sessions.get(session.id), whole(replay, session.id)
            assert tail is not None
            turn(app, agent, model, tail, step, plan)
            turn(replay, replay_agent, replay_model, full, step, plan)
            assert [r.messages for r in model.requests] == [r.messages for r in replay_model.requests]
            model.requests.clear()
            replay_model.requests.clear()
            app.sessions.commit(tail)
            # At this cut, a fresh tail load agrees with a full replay (``same`` then fetches its ledger).
            last = app.sessions.get(session.id)
            assert last is not None
            same(last, whole(replay, session.id))
        kept = store.load_snapshot(name, session.id)
        if getattr(store, "snapshots_in_commit", False):  # the SQL stores keep it with every commit
            assert kept is not None and kept.version == last.version, "the snapshot is at the last commit"
        else:
            assert (kept is not None) == (len(last.events) >= every), "a snapshot once a multiple of K is crossed"


SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
RANDOM = {
    "plans": st.lists(PLANS, min_size=1, max_size=14),
    "every": st.integers(min_value=1, max_value=12),
    "turns": st.integers(min_value=1, max_value=3),
}


@pytest.mark.backend("memory")
@SETTINGS
@given(**RANDOM)
def test_snapshot_and_tail_match_a_full_replay_in_memory(plans: list[str], every: int, turns: int) -> None:
    check_random_session(in_memory_store, plans, every, turns, "snap")


@pytest.mark.backend("sqlite")
@SETTINGS
@given(**RANDOM)
def test_snapshot_and_tail_match_a_full_replay_on_sqlite(
    tmp_path: Path, plans: list[str], every: int, turns: int
) -> None:
    check_random_session(lambda: sqlite_store(tmp_path / "s.db"), plans, every, turns, f"snap{every}{turns}")


@pytest.mark.backend("postgres")
@SETTINGS
@given(**RANDOM)
def test_snapshot_and_tail_match_a_full_replay_on_postgres(
    postgres_url: str, plans: list[str], every: int, turns: int
) -> None:
    from dormant.stores.postgres import postgres_store

    name = f"snap{every}{turns}-{uuid.uuid4().hex[:8]}"  # its own: the database may be an earlier run's
    check_random_session(lambda: postgres_store(postgres_url, max_size=2), plans, every, turns, name)


# -- what a load reads ------------------------------------------------------------------------------


def long_session(app: App, agent: Agent, model: MockAdapter, turns: int) -> str:
    session = app.sessions.create()
    for step in range(turns):
        turn(app, agent, model, session, step, "tally")
        app.sessions.commit(session)
    return session.id


def test_a_turn_reads_the_tail_and_the_window_not_the_whole_ledger(tmp_path: Path) -> None:
    store = CountingWithSnapshots(sqlite_store(tmp_path / "s.db"))
    app, agent, model = build(store, every=10, turns=2)
    sid = long_session(app, agent, model, 60)  # 12 events a turn: 720 events
    store.loads.clear()
    session = app.sessions.get(sid)
    assert session is not None and len(session.events) == 720
    # The tail after the snapshot, then what the last two turns need of the ledger before it.
    assert len(store.loads) <= 2 and all(after > 50 for after, _ in store.loads), store.loads
    assert sum(read for _, read in store.loads) <= 10 + 2 * 12, store.loads
    reads = len(store.loads)
    turn(app, agent, model, session, 60, "tally")
    app.sessions.commit(session)
    assert len(store.loads) == reads, "running and committing read nothing more"
    assert session.state.count == sum(range(61))
    # Time travel fetches the rest, once.
    assert session.state_at(10).session_state == whole(app, sid).state_at(10).session_state
    assert store.loads[reads][0] == 0
    assert [e.id for e in session.events] == [e.id for e in whole(app, sid).events]


def test_the_api_view_of_a_long_session_reads_only_its_tail(tmp_path: Path) -> None:
    from dormant.serving.api import session_view

    store = CountingWithSnapshots(sqlite_store(tmp_path / "s.db"))
    app, agent, model = build(store, every=10, turns=2)
    sid = long_session(app, agent, model, 60)
    session = app.sessions.get(sid)
    assert session is not None
    reads = len(store.loads)
    view = session_view(app, session)
    assert len(store.loads) == reads, "the view fetched the earlier ledger"
    assert view["updated_at"] == whole(app, sid).events[-1].created_at and view["version"] == session.version


def test_history_without_a_window_loads_the_whole_ledger(tmp_path: Path) -> None:
    store = CountingWithSnapshots(sqlite_store(tmp_path / "s.db"))
    app, agent, model = build(store, every=10, turns=None)
    sid = long_session(app, agent, model, 5)
    store.loads.clear()
    session = app.sessions.get(sid)
    assert session is not None and store.loads == [(0, 60)]


def test_a_store_without_snapshots_works_with_full_loads() -> None:
    store = Counting(in_memory_store())
    assert not isinstance(store, SnapshotStore)
    app, agent, model = build(store, every=3, turns=1)
    sid = long_session(app, agent, model, 6)
    store.loads.clear()
    session = app.sessions.get(sid)
    assert session is not None and session.state.count == sum(range(6))
    assert store.loads == [(0, 72)]
    turn(app, agent, model, session, 6, "ask")
    app.sessions.commit(session)
    resumed = app.sessions.get(sid)
    assert resumed is not None and resumed.status == "awaiting_input"


def test_snapshots_off_never_writes_one() -> None:
    store = in_memory_store()
    app, agent, model = build(store, every=None)
    sid = long_session(app, agent, model, 5)
    assert store.load_snapshot("snap", sid) is None


def test_snapshot_every_is_checked() -> None:
    for bad in (0, -1, True, 2.5, "10"):
        with pytest.raises(ConfigurationError, match="snapshot_every"):
            adk(name="x", snapshot_every=bad)  # type: ignore[arg-type]


def test_a_snapshot_is_written_every_k_events_and_on_demand() -> None:
    store = in_memory_store()
    app, agent, model = build(store, every=30)
    session = app.sessions.create()
    versions = []
    for step in range(8):  # 12 events a turn
        turn(app, agent, model, session, step, "tally")
        app.sessions.commit(session)
        snap = store.load_snapshot("snap", session.id)
        versions.append(snap.version if snap else None)
    # Turns end at 12, 24, 36, 48, 60, 72, 84, 96 events: multiples of 30 are crossed at 36, 60 and 96.
    assert versions == [None, None, 4, 4, 6, 6, 6, 9]
    session.input.message("one more")
    with pytest.raises(InputError):
        app.sessions.snapshot(session)
    app.sessions.commit(session)
    assert app.sessions.snapshot(session)
    assert store.load_snapshot("snap", session.id).version == 10  # type: ignore[union-attr]


# -- a snapshot is never trusted -----------------------------------------------------------------------


def test_a_snapshot_of_an_unknown_format_is_ignored_and_rebuilt() -> None:
    store = CountingWithSnapshots(in_memory_store())
    app, agent, model = build(store, every=10)
    without, plain_agent, plain_model = build(store, every=None)
    sid = long_session(without, plain_agent, plain_model, 4)  # 48 events, no snapshot
    session = whole(app, sid)
    data = json.loads(snapshot_of(session).data)
    lying = {**data, "format": FORMAT + 1, "projection": {**data["projection"], "session_state": {"count": -1}}}
    assert store.save_snapshot("snap", sid, StoredSnapshot(session.version, json.dumps(lying)))
    store.loads.clear()
    loaded = app.sessions.get(sid)
    assert loaded is not None and loaded.state.count == sum(range(4))
    assert store.loads == [(0, 48)], "read whole"
    turn(app, agent, model, loaded, 4, "text")
    app.sessions.commit(loaded)  # 54 events: no multiple of 10 crossed, but the snapshot is due
    rebuilt = store.load_snapshot("snap", sid)
    assert rebuilt is not None and rebuilt.version == loaded.version
    assert json.loads(rebuilt.data)["format"] == FORMAT


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: "not json",
        lambda d: json.dumps([1, 2]),
        lambda d: json.dumps({**d, "projection": {**d["projection"], "count": "many"}}),
        lambda d: json.dumps({**d, "projection": {**d["projection"], "open_calls": [{"type": "user", "text": "x"}]}}),
        lambda d: json.dumps({**d, "count": d["count"] + 1}),
        lambda d: json.dumps({k: v for k, v in d.items() if k != "anchors"}),
        json.dumps,  # an earlier version's snapshot, stored under the later version: its own disagrees
    ],
)
def test_a_snapshot_that_does_not_parse_is_ignored(corrupt: Callable[[dict[str, Any]], str]) -> None:
    store = in_memory_store()
    app, agent, model = build(store, every=10)
    sid = long_session(app, agent, model, 3)
    data = json.loads(store.load_snapshot("snap", sid).data)  # type: ignore[union-attr]
    without, plain_agent, plain_model = build(store, every=None)
    session = without.sessions.get(sid)
    assert session is not None
    turn(without, plain_agent, plain_model, session, 3, "tally")
    without.sessions.commit(session)
    assert store.save_snapshot("snap", sid, StoredSnapshot(session.version, corrupt(data)))
    loaded = app.sessions.get(sid)
    assert loaded is not None and loaded.state.count == sum(range(4))
    same(loaded, whole(app, sid))


def test_a_snapshot_of_a_deleted_session_is_not_trusted_by_one_made_again() -> None:
    store = in_memory_store()
    app, agent, model = build(store, every=10)
    without, plain_agent, plain_model = build(store, every=None)
    with frozen_clock(1_800_000_000_000) as clock:
        sid = long_session(app, agent, model, 3)
        old = store.load_snapshot("snap", sid)
        assert old is not None and old.version == 4
        app.sessions.delete(sid)
        clock.advance(1)
        again = Session(without, session_id=sid)
        for step in range(4):
            turn(without, plain_agent, plain_model, again, 10 + step, "text")
            without.sessions.commit(again)
    assert store.save_snapshot("snap", sid, old)  # a store that kept it (or a late writer) planted it
    loaded = app.sessions.get(sid)
    assert loaded is not None and loaded.state.count == 0
    same(loaded, whole(app, sid))


# -- merges and forks on a tail-loaded session ---------------------------------------------------------


def test_serving_commit_merges_onto_a_tail_loaded_session() -> None:
    store = CountingWithSnapshots(in_memory_store())
    app, agent, model = build(store, every=5)
    sid = long_session(app, agent, model, 5)
    mine, theirs = app.sessions.get(sid), app.sessions.get(sid)
    assert mine is not None and theirs is not None
    theirs.state.user.name = "Bo"  # unbound user scope: ledger only, on another key than the run's
    app.sessions.commit(theirs)
    turn(app, agent, model, mine, 5, "tally")
    store.loads.clear()
    outcome = serving_commit(app, mine)
    assert outcome.status == "merged"
    assert all(after > 0 for after, _ in store.loads), store.loads
    assert mine.state.count == sum(range(6)) and mine.state.user.name == "Bo"
    same(mine, whole(app, sid))


def test_fork_at_on_a_tail_loaded_session_holds_the_whole_prefix() -> None:
    store = in_memory_store()
    app, agent, model = build(store, every=5)
    sid = long_session(app, agent, model, 4)
    session = app.sessions.get(sid)
    assert session is not None
    fork = session.fork_at(20)
    *copied, marker = fork.events
    assert [e.id for e in copied[:21]] == [e.id for e in whole(app, sid).events[:21]]
    assert [e.type for e in copied[21:]] in ([], ["invocation_yield"])  # paused, when cut inside a running turn
    assert marker.type == "session_forked" and fork.forked_from == sid
    app.sessions.commit(fork)
    assert fork.state.count == whole(app, sid).state_at(20).session_state.get("count", 0)


@pytest.mark.backend("dynamodb")
@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(**RANDOM)
def test_snapshot_and_tail_match_a_full_replay_on_dynamodb(
    dynamodb_endpoint: str, dynamodb_table: str, plans: list[str], every: int, turns: int
) -> None:
    pytest.importorskip("boto3")
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    ddb = client(dynamodb_endpoint)
    try:
        name = f"snap-{uuid.uuid4().hex[:8]}"
        check_random_session(lambda: dynamo_store(dynamodb_table, client=ddb), plans, every, turns, name)
    finally:
        ddb.close()


class Renamed(BaseModel):
    total: int = 0
    words: list[str] = []


def test_a_snapshot_folded_before_a_migration_is_ignored() -> None:
    """State in a snapshot is in the shape of the scope versions it was folded under: a release that adds
    a migration must not read it as current."""
    from dormant.state.migrations import RenameKey

    store = in_memory_store()
    app, agent, model = build(store, every=10)
    sid = long_session(app, agent, model, 3)
    assert store.load_snapshot("snap", sid) is not None
    later = adk(
        name="snap",
        schema={"session": Renamed, "user": Profile},
        store=store,
        migrations={"session": [RenameKey("count", "total")]},
        snapshot_every=10,
    )
    loaded = later.sessions.get(sid)
    assert loaded is not None and loaded.state.total == sum(range(3))
    loaded.state.total = 100
    later.sessions.commit(loaded)  # the next commit stores a snapshot of the current shape
    kept = store.load_snapshot("snap", sid)
    assert kept is not None and json.loads(kept.data)["schema"] == {"session": 1}
    again = later.sessions.get(sid)
    assert again is not None and again.state.total == 100 and "count" not in again.projection.session_state


def test_no_snapshot_follows_a_commit_in_which_the_store_skipped_re_sent_ids() -> None:
    """A tail-loaded session does not hold the events before its snapshot: one of their ids appended again is
    skipped by the store (idempotency by id), so this session's fold counts an event the ledger does not hold
    where it says. No snapshot is taken of it: a load still matches the whole ledger replayed."""
    from dormant.events import UserEvent

    store = in_memory_store()
    app, agent, model = build(store, every=10)
    sid = long_session(app, agent, model, 3)  # 36 events, snapshots at 10-event crossings
    early = whole(app, sid).events[0]
    kept = store.load_snapshot("snap", sid)
    assert kept is not None
    session = app.sessions.get(sid)
    assert session is not None
    session.append(UserEvent(id=early.id, created_at=early.created_at, text="sent again"))
    for n in range(11):  # crosses a multiple of 10
        session.append(UserEvent(text=f"note {n}"))
    result = app.sessions.commit(session)
    assert result.appended == 11  # the re-sent id was skipped
    assert store.load_snapshot("snap", sid) == kept  # none of this session's fold
    reloaded = app.sessions.get(sid)
    assert reloaded is not None
    same(reloaded, whole(app, sid))


def check_snapshot_kept_only_whole(make_store: Callable[[], Any]) -> None:
    """The SQL stores keep the snapshot in the commit's transaction, but not when some of the commit's events
    were already stored (a retry): the ledger then differs from the fold the snapshot holds. Its own app name:
    a database an earlier run used (``TEST_DATABASE_URL``) holds that run's session."""

    def event(n: int) -> UserEvent:
        return UserEvent(id=f"e{n}", created_at=1, text=f"m{n}")

    app = f"a-{uuid.uuid4().hex[:12]}"
    with closing(make_store()) as store:
        row = StoredSession(id="s", app_name=app, version=0, created_at=1)
        assert store.commit(row, [event(1)], 0, snapshot=StoredSnapshot(1, '{"at":1}')).ok
        kept = store.load_snapshot(app, "s")
        assert kept is not None and kept.version == 1
        retry = store.commit(row, [event(1), event(2)], 1, snapshot=StoredSnapshot(2, '{"at":2}'))
        assert retry.ok and retry.appended == 1
        assert store.load_snapshot(app, "s") == kept, "a partly stored commit keeps no snapshot"
        assert store.commit(row, [event(3)], 2, snapshot=StoredSnapshot(2, '{"at":2}')).ok  # not its version
        assert store.load_snapshot(app, "s") == kept
        assert store.commit(row, [event(4)], 3, snapshot=StoredSnapshot(4, '{"at":4}')).ok
        assert store.load_snapshot(app, "s") == StoredSnapshot(4, '{"at":4}')


def test_a_commit_keeps_its_snapshot_only_when_it_lands_whole(tmp_path: Path) -> None:
    check_snapshot_kept_only_whole(lambda: sqlite_store(tmp_path / "s.db"))


@pytest.mark.backend("postgres")
def test_a_commit_keeps_its_snapshot_only_when_it_lands_whole_on_postgres(postgres_url: str) -> None:
    from dormant.stores.postgres import postgres_store

    check_snapshot_kept_only_whole(lambda: postgres_store(postgres_url, max_size=2))


def test_a_state_read_at_the_last_commit_reads_one_row_and_folds_nothing(tmp_path: Path) -> None:
    """On SQLite the snapshot is kept with every commit: ``get`` reads the row with its snapshot in one
    statement, decodes no event, and shows the state and the ledger a full replay shows."""
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app = adk(name="read", schema={"session": Notes}, store=store)
        session = app.sessions.create()
        for n in range(7):  # 7 commits, none at a multiple of snapshot_every (100)
            session.input.message(f"m{n}")
            session.state.count = n + 1
            app.sessions.commit(session)
        decoded: list[object] = []
        decode = store.decode_event
        store.decode_event = lambda data: decoded.append(data) or decode(data)  # type: ignore[method-assign]
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        loaded = app.sessions.get(session.id)
        store._conn.set_trace_callback(None)
        assert loaded is not None and loaded.state.count == 7 and loaded.version == session.version
        assert decoded == [], "no event is decoded: the snapshot is at the last commit"
        assert [s.split()[0] for s in statements] == ["SELECT"], "one statement: the row joined with its snapshot"
        replay = load_session(app, session.id, history=None)
        assert replay is not None
        assert [e.id for e in loaded.events] == [e.id for e in replay.events]
        assert loaded.projection.export() == replay.projection.export()


# -- a state read builds only what it reads (issue 26's W3), and stays right ------------------------------------
# The snapshot (format 2) is read in part: the count, the scopes' values and the status when the session is
# loaded, the rest of the fold and the anchors when first used. What does not parse then is replayed from the
# ledger (the fold) or dropped (an anchor: the earlier ledger is then read from an earlier one). A session keeps
# no view of itself, so a loaded session is freed by reference counting, with no garbage collection.


class Counter(BaseModel):
    count: int = 0


def _rewrite_snapshot(store: SQLiteSessionStore, app: str, sid: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Overwrite the kept snapshot's text with ``change(parsed text)`` (as JSON), at the same version."""
    kept = store.load_snapshot(app, sid)
    assert kept is not None
    text = json.dumps(change(json.loads(kept.data)))
    with store._lock:
        store._conn.execute("UPDATE snapshots SET data = ? WHERE app_name = ? AND session_id = ?", (text, app, sid))


def _decoded(store: SQLiteSessionStore) -> list[object]:
    """Every event the store decodes from now on."""
    seen: list[object] = []
    decode = store.decode_event
    store.decode_event = lambda data: seen.append(data) or decode(data)  # type: ignore[method-assign]
    return seen


def test_a_snapshot_whose_fold_does_not_parse_is_replayed_from_the_ledger_on_first_use(tmp_path: Path) -> None:
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app, agent, model = build(store, every=10)
        sid = long_session(app, agent, model, 4)  # an ask turn leaves calls pending in the fold's rest
        turn(app, agent, model, app.sessions.require(sid), 4, "ask")
        session = app.sessions.require(sid)
        turn(app, agent, model, session, 4, "ask")
        app.sessions.commit(session)

        def corrupt(data: dict[str, Any]) -> Any:
            data["projection"]["recent_turns"] = "1 two 3"  # the rest: read on first use
            data["projection"]["pending"] = [["only", "three", "fields"]]
            return data

        _rewrite_snapshot(store, "snap", sid, corrupt)
        # An app with no history window reads no turn at load: the rest is read on first use, after the load.
        reader = adk(name="snap", schema={"session": Notes, "user": Profile}, store=store, snapshot_every=10)
        loaded = reader.sessions.require(sid)
        assert loaded.state.count == sum(range(4)), "the state is read from the snapshot's checked part"
        assert loaded.snapshot_at > 0 and loaded.projection._deferred is not None
        same(loaded, whole(app, sid))  # reads the rest: it does not parse, so the ledger is replayed
        assert loaded.snapshot_at == 0, "the next commit keeps a fresh snapshot"
        # An app whose agents show the last turns reads the rest at load (the window), and replays it there.
        at_load = app.sessions.require(sid)
        same(at_load, whole(app, sid))
        turn(app, agent, model, at_load, 5, "text")
        app.sessions.commit(at_load)
        again = reader.sessions.require(sid)
        assert again.projection._deferred is not None
        same(again, whole(app, sid))


def test_anchors_that_do_not_parse_are_dropped_and_the_earlier_ledger_still_reads(tmp_path: Path) -> None:
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app, agent, model = build(store, every=10)
        sid = long_session(app, agent, model, 6)

        def corrupt(data: dict[str, Any]) -> Any:
            data["anchors"] = "3,x y 7,-1 ,"
            return data

        _rewrite_snapshot(store, "snap", sid, corrupt)
        loaded = app.sessions.require(sid)  # its history window reads the earlier ledger from the anchors
        full = whole(app, sid)
        assert [e.id for e in loaded.events] == [e.id for e in full.events]
        assert loaded.anchors[0] == (0, 0)
        assert all(type(v) is int and type(c) is int and v >= 0 and c >= 0 for v, c in loaded.anchors)
        fork = app.sessions.require(sid).fork_at(20)
        assert [e.id for e in fork.events][:21] == [e.id for e in full.events[:21]]


def test_a_format_1_snapshot_is_still_read(tmp_path: Path) -> None:
    """Snapshots stored by the release before format 2 (lists, every field written) load without a replay."""
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app, agent, model = build(store, every=10)
        sid = long_session(app, agent, model, 3)
        session = whole(app, sid)

        def as_format_1(data: dict[str, Any]) -> Any:
            exported = session.projection.export()
            anchors = [[int(v), int(c)] for v, c in (pair.split(",") for pair in data["anchors"].split())]
            return {**data, "format": 1, "schema": {}, "projection": exported, "anchors": anchors}

        _rewrite_snapshot(store, "snap", sid, as_format_1)
        decoded = _decoded(store)
        reader = adk(name="snap", schema={"session": Notes, "user": Profile}, store=store, snapshot_every=10)
        loaded = reader.sessions.require(sid)  # no history window: the tail alone
        assert decoded == [], "read from the snapshot: no event decoded"
        same(loaded, whole(app, sid))


def test_a_snapshot_is_written_in_format_2() -> None:
    with closing(sqlite_store(":memory:")) as store:
        app = adk(name="f", schema={"session": Counter}, store=store)
        session = app.sessions.create()
        session.input.message("hi")
        session.state.count = 1
        app.sessions.commit(session)
        kept = store.load_snapshot("f", session.id)
        assert kept is not None
        data = json.loads(kept.data)
        assert FORMAT == 2 and data["format"] == 2
        assert data["projection"]["recent_turns"] == "0" and data["anchors"] == "1,0"
        assert "schema" not in data and "open_calls" not in data["projection"], "fields at their unset value left out"


def _python_calls(fn: Callable[[], object]) -> int:
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_a_state_read_at_the_last_commit_builds_no_more_than_it_reads(tmp_path: Path) -> None:
    """W3's path: the row and its snapshot in one statement, the snapshot's checked part, one session, one value.
    The fold's rest (invocations, calls, turns) is not built, and the whole read makes a handful of Python calls
    (167 before issue 26's second round; 12 after it)."""
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app = adk(name="read", schema={"session": Counter}, store=store)
        session = app.sessions.create()
        for n in range(120):
            session.input.message(f"m{n}")
            session.state.count = n + 1
            app.sessions.commit(session)
        sid = session.id
        assert app.sessions.require(sid).state.count == 120
        calls = _python_calls(lambda: app.sessions.require(sid).state.count)
        assert calls <= 20, calls
        loaded = app.sessions.require(sid)
        assert loaded.state.count == 120
        assert loaded.projection._deferred is not None, "the fold's rest is not read for a state read"
        assert loaded.projection.user_turns == 120 and loaded.projection._deferred is None
        replay = load_session(app, sid, history=None)
        assert replay is not None and loaded.projection.export() == replay.projection.export()


def test_a_loaded_session_is_freed_without_the_garbage_collector(tmp_path: Path) -> None:
    """A session kept views of itself (state, access, input, its state host) and a replay that held it: each
    loaded session sat in a reference cycle, and a process reading sessions ran a collection every few dozen."""
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app = adk(name="free", schema={"session": Counter}, store=store)
        session = app.sessions.create()
        session.input.message("hi")
        session.state.count = 3
        app.sessions.commit(session)
        gc.collect()
        gc.disable()
        try:
            loaded = app.sessions.require(session.id)
            assert loaded.state.count == 3 and loaded.input is not None and loaded.access is not None
            assert loaded.state.to_dict() == {"count": 3}
            gone = weakref.ref(loaded)
            del loaded
            assert gone() is None, "freed when the last reference went"
            assert gc.collect() == 0, "nothing of it was left in a cycle for the collector"
        finally:
            gc.enable()


@pytest.mark.parametrize("kept", [None, StoredSnapshot(1, "{}")])
def test_a_session_past_its_snapshot_reads_its_tail_in_one_transaction(tmp_path: Path, kept: Any) -> None:
    """A commit made without the app (store.commit) leaves the snapshot behind: the load then reads the row again
    and the events after the snapshot in one transaction, and folds them."""
    with closing(sqlite_store(tmp_path / "s.db")) as store:
        app = adk(name="tail", schema={"session": Counter}, store=store)
        session = app.sessions.create()
        session.state.count = 1
        app.sessions.commit(session)
        if kept is None:
            store._conn.execute("DELETE FROM snapshots")
        extra = app.sessions.require(session.id)
        extra.state.count = 2
        assert store.commit(extra.row(), extra.uncommitted_events, extra.version).ok  # no snapshot with it
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        loaded = app.sessions.require(session.id)
        store._conn.set_trace_callback(None)
        assert loaded.state.count == 2 and loaded.version == 3
        assert [s.split()[0] for s in statements] == ["SELECT", "BEGIN", "SELECT", "SELECT", "COMMIT"]


def test_a_commit_whose_batch_repeats_an_id_keeps_no_snapshot(tmp_path: Path) -> None:
    """The batch's second copy is skipped, so the ledger stored is not the one the snapshot folded."""
    from dormant.events import UserEvent
    from dormant.stores.base import StoredSession

    with closing(sqlite_store(tmp_path / "s.db")) as store:
        row = StoredSession(id="s", app_name="a", version=0, created_at=1)
        first = UserEvent(id="e1", created_at=1, text="one")
        result = store.commit(row, [first, first], 0, snapshot=StoredSnapshot(1, '{"at":1}'))
        assert result.ok and result.appended == 1
        assert store.load_snapshot("a", "s") is None
        assert store.commit(row, [UserEvent(id="e2", created_at=1, text="two")], 1, snapshot=StoredSnapshot(2, "{}")).ok
        assert store.load_snapshot("a", "s") == StoredSnapshot(2, "{}")


def test_a_snapshot_remembers_the_last_invocations_so_a_reused_id_is_refused(tmp_path: Path) -> None:
    """A retried request re-sends the invocation id its first attempt claimed (derived from its Idempotency-Key):
    loaded from a snapshot that ended invocations are left out of, the session still knows the last
    ``RECENT_INVOCATIONS`` started, so the ledger refuses that id a second start and the API finds the turn."""
    from dormant.errors import EventOutOfOrder
    from dormant.events import InvocationStartEvent
    from dormant.projection import RECENT_INVOCATIONS

    store = CountingWithSnapshots(sqlite_store(tmp_path / "s.db"))
    app, agent, model = build(store, every=10, turns=2)
    session = app.sessions.create()
    for step in range(RECENT_INVOCATIONS + 4):
        model.set_responses([{"text": f"turn {step}"}])
        for _ in app.stream(agent, f"turn {step}", session=session, invocation_id=f"inv-{step}"):
            pass
        app.sessions.commit(session)
    store.loads.clear()
    loaded = app.sessions.get(session.id)
    assert loaded is not None and store.loads and store.loads[0][0] > 0, "loaded from a snapshot and its tail"
    projection = loaded.projection
    assert list(projection.recent_invocations) == [f"inv-{i}" for i in range(4, RECENT_INVOCATIONS + 4)]
    assert "inv-5" not in projection.invocations  # ended before the snapshot: only the recent list has it
    assert projection.recent_invocations["inv-5"] == whole(app, session.id).projection.invocations["inv-5"].start_index
    with pytest.raises(EventOutOfOrder, match="already ran"):
        loaded.append(InvocationStartEvent(invocation_id="inv-5", agent_name=agent.name, deadline=None))
    assert loaded.uncommitted_events == []
