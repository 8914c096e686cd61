"""A load and a commit ask the store for its snapshot capabilities through protocols (``SnapshotInCommitStore``,
``OneReadSnapshotStore``), never its class: a store of the user's own that has one gets what a built-in store gets."""

from __future__ import annotations

from pathlib import Path

from dormant import adk
from dormant.events import UserEvent
from dormant.stores.base import BaseSessionStore, OneReadSnapshotStore, SnapshotInCommitStore, SnapshotStore
from dormant.stores.sqlite import sqlite_store
from tests.support.wrapped_stores import OneReadSnapshots, SnapshotInCommit, Snapshots


def test_a_store_of_ones_own_that_keeps_snapshots_in_commit_is_handed_one_with_every_commit(tmp_path: Path) -> None:
    store = SnapshotInCommit(sqlite_store(tmp_path / "s.db"))
    assert isinstance(store, SnapshotInCommitStore) and not isinstance(store, BaseSessionStore)
    app = adk(name="a", store=store)  # snapshot_every=100: only a snapshot kept in the commit lands this early
    session = app.sessions.create("s1")
    session.append(UserEvent(text="hello"))
    app.sessions.commit(session)
    kept = store.inner.load_snapshot("a", "s1")
    assert kept is not None and kept.version == app.sessions.require("s1").version


def test_a_store_whose_commit_takes_no_snapshot_is_handed_none(tmp_path: Path) -> None:
    """The flag decides, not the method: a store on SQLite that declares nothing gets a commit without a snapshot."""
    store = Snapshots(sqlite_store(tmp_path / "s.db"))
    assert not isinstance(store, SnapshotInCommitStore)
    app = adk(name="a", store=store)
    session = app.sessions.create("s1")
    session.append(UserEvent(text="hello"))
    app.sessions.commit(session)
    assert store.inner.load_snapshot("a", "s1") is None


def test_a_store_of_ones_own_that_reads_the_snapshot_with_the_tail_loads_in_one_read(tmp_path: Path) -> None:
    store = OneReadSnapshots(sqlite_store(tmp_path / "s.db"))
    assert isinstance(store, OneReadSnapshotStore) and isinstance(store, SnapshotStore)
    app = adk(name="a", store=store)
    session = app.sessions.create("s1")
    session.append(UserEvent(text="hello"))
    app.sessions.commit(session)
    assert app.sessions.snapshot(app.sessions.require("s1"))
    store.one_reads = store.snapshot_reads = 0
    loaded = app.sessions.require("s1")
    assert [event.text for event in loaded.events if isinstance(event, UserEvent)] == ["hello"]
    assert loaded.snapshot_at == 1  # loaded from the snapshot, not whole
    assert (store.one_reads, store.snapshot_reads) == (1, 0)


def test_a_snapshot_store_without_the_one_read_reads_the_snapshot_then_the_tail(tmp_path: Path) -> None:
    store = Snapshots(sqlite_store(tmp_path / "s.db"))
    assert isinstance(store, SnapshotStore) and not isinstance(store, OneReadSnapshotStore)
    app = adk(name="a", store=store)
    session = app.sessions.create("s1")
    session.append(UserEvent(text="hello"))
    app.sessions.commit(session)
    assert app.sessions.snapshot(app.sessions.require("s1"))
    store.snapshot_reads = 0
    assert app.sessions.require("s1").snapshot_at == 1
    assert store.snapshot_reads == 1
