"""SQLite beyond the shared contract: files, WAL, one shared ":memory:" database, and a locked database."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from dormant.errors import ConfigurationError, StoreBusy
from dormant.events import UserEvent
from dormant.stores.base import StoredSession
from dormant.stores.sqlite import sqlite_store

META = StoredSession(id="s-1", app_name="app", created_at=1)


def test_the_file_and_its_parent_directories_are_created_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "sessions.db"
    store = sqlite_store(path)
    store.commit(META, [UserEvent(text="hi")], 0)
    store.close()
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"sessions", "events", "scoped_state"}


def test_opening_an_existing_file_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    sqlite_store(path).commit(META, [UserEvent(id="e1", text="hi")], 0)
    again = sqlite_store(path)  # the DDL runs again, IF NOT EXISTS
    loaded = again.load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["e1"]


def test_memory_is_one_database_shared_by_every_user_of_the_store() -> None:
    store = sqlite_store(":memory:")
    store.commit(META, [UserEvent(id="e1", text="hi")], 0)
    seen: list[int] = []

    def other_thread() -> None:
        loaded = store.load("app", "s-1")
        seen.append(len(loaded.events) if loaded else -1)
        store.commit(META, [UserEvent(id="e2", text="there")], 1)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    loaded = store.load("app", "s-1")
    assert seen == [1] and loaded is not None and [e.id for e in loaded.events] == ["e1", "e2"]
    assert sqlite_store(":memory:").load("app", "s-1") is None  # another store object: another database


def _hold_write_lock(path: Path, seconds: float, locked: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    locked.set()
    time.sleep(seconds)
    conn.execute("ROLLBACK")
    conn.close()


def test_a_database_locked_past_the_timeout_is_store_busy_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = sqlite_store(path, timeout=0.2)
    store.commit(META, [], 0)
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 1.5, locked))
    holder.start()
    locked.wait()
    started = time.monotonic()
    with pytest.raises(StoreBusy, match="locked"):
        store.commit(META, [UserEvent(text="blocked")], 1)
    assert 0.15 < time.monotonic() - started < 1.4
    holder.join()
    loaded = store.load("app", "s-1")
    assert loaded is not None and loaded.events == [] and loaded.session.version == 1


def test_a_lock_released_within_the_timeout_is_waited_out(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = sqlite_store(path, timeout=10)
    store.commit(META, [], 0)
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 0.3, locked))
    holder.start()
    locked.wait()
    result = store.commit(META, [UserEvent(text="after the wait")], 1)
    holder.join()
    assert result.ok and result.version == 2


def test_a_bad_synchronous_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        sqlite_store(tmp_path / "s.db", synchronous="SOMETIMES")  # type: ignore[arg-type]
