"""A state read of a session at its last commit builds only what it reads (issue 26's W3), and stays right.

The snapshot (format 2) is read in part: the count, the scopes' values and the status when the session is
loaded, the rest of the fold and the anchors when first used. What does not parse then is replayed from the
ledger (the fold) or dropped (an anchor: the earlier ledger is then read from an earlier one). A session keeps
no view of itself, so a loaded session is freed by reference counting, with no garbage collection.
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk
from dormant.snapshots import FORMAT, load_session
from dormant.stores.base import StoredSnapshot
from dormant.stores.sqlite import SQLiteSessionStore, sqlite_store
from tests.test_snapshots import Notes as SnapNotes
from tests.test_snapshots import Profile, build, long_session, same, turn, whole


class Notes(BaseModel):
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
        reader = adk(name="snap", schema={"session": SnapNotes, "user": Profile}, store=store, snapshot_every=10)
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
        reader = adk(name="snap", schema={"session": SnapNotes, "user": Profile}, store=store, snapshot_every=10)
        loaded = reader.sessions.require(sid)  # no history window: the tail alone
        assert decoded == [], "read from the snapshot: no event decoded"
        same(loaded, whole(app, sid))


def test_a_snapshot_is_written_in_format_2() -> None:
    with closing(sqlite_store(":memory:")) as store:
        app = adk(name="f", schema={"session": Notes}, store=store)
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
        app = adk(name="read", schema={"session": Notes}, store=store)
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
        app = adk(name="free", schema={"session": Notes}, store=store)
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
        app = adk(name="tail", schema={"session": Notes}, store=store)
        session = app.sessions.create()
        session.state.count = 1
        app.sessions.commit(session)
        if kept is None:
            store._conn.execute("DELETE FROM snapshots")
        extra = app.sessions.require(session.id)
        extra.state.count = 2
        assert store.commit(extra.stored(), extra.uncommitted_events, extra.version).ok  # no snapshot with it
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
