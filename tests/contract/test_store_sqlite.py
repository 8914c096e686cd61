"""SQLite beyond the shared contract: files, WAL, one shared ":memory:" database, and a locked database."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dormant.errors import ConfigurationError, StoreBusy
from dormant.events import UserEvent
from dormant.stores.base import StoredSession, StoredSnapshot
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
    assert tables == {"sessions", "events", "scoped_state", "snapshots", "idempotency"}


def test_a_file_made_before_snapshots_gains_their_table_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "before.db"
    sqlite_store(path).commit(META, [UserEvent(id="e1", text="hi")], 0)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE snapshots")  # the file as the release before snapshots left it
    store = sqlite_store(path, create=False)
    loaded = store.load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["e1"]
    assert store.save_snapshot("app", "s-1", StoredSnapshot(1, "{}"))
    assert store.load_snapshot("app", "s-1") == StoredSnapshot(1, "{}")


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
    thread.join(30)
    loaded = store.load("app", "s-1")
    assert seen == [1] and loaded is not None and [e.id for e in loaded.events] == ["e1", "e2"]
    assert sqlite_store(":memory:").load("app", "s-1") is None  # another store object: another database


WAIT = 30  # seconds: a bound on every wait in these tests, never reached when the code is right


@contextmanager
def _write_lock_held(path: Path) -> Iterator[threading.Event]:
    """Another connection holds the write lock (an open write transaction) until the block ends.

    Yields an Event: set it to release the lock early, from another thread.
    """
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")  # takes the write lock at once
            locked.set()
            release.wait(WAIT)
            conn.execute("ROLLBACK")
            conn.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            locked.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(WAIT) and not errors
    try:
        yield release
    finally:
        release.set()
        holder.join(WAIT)
        assert not holder.is_alive() and errors == []


def test_a_database_locked_past_the_timeout_is_store_busy_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = sqlite_store(path, timeout=0.2)
    store.commit(META, [], 0)
    # The lock is held until the assertion is done: the commit cannot have got through.
    with _write_lock_held(path), pytest.raises(StoreBusy, match="locked"):
        store.commit(META, [UserEvent(text="blocked")], 1)
    loaded = store.load("app", "s-1")
    assert loaded is not None and loaded.events == [] and loaded.row.version == 1
    assert store.commit(META, [UserEvent(text="after")], 1).ok  # and the store goes on


def test_every_write_meeting_a_lock_held_past_the_timeout_is_store_busy(tmp_path: Path) -> None:
    # Not only the commit: a scoped save, a snapshot and a delete fail typed too (never sqlite3's own error).
    path = tmp_path / "s.db"
    store = sqlite_store(path, timeout=0.2)
    store.commit(META, [], 0)
    with _write_lock_held(path):
        with pytest.raises(StoreBusy, match="locked"):
            store.save_scoped_state("app", "user", "u-1", {"k": 1})
        with pytest.raises(StoreBusy, match="locked"):
            store.save_snapshot("app", "s-1", StoredSnapshot(1, "{}"))
        with pytest.raises(StoreBusy, match="locked"):
            store.delete("app", "s-1")
    assert store.load_scoped_state("app", "user", "u-1") == {} and store.load("app", "s-1") is not None


def test_a_lock_released_within_the_timeout_is_waited_out(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = sqlite_store(path, timeout=WAIT)
    store.commit(META, [], 0)
    with _write_lock_held(path) as release:
        threading.Timer(0.3, release.set).start()
        result = store.commit(META, [UserEvent(text="after the wait")], 1)
    assert result.ok and result.version == 2


def test_reading_never_waits_for_a_writer(tmp_path: Path) -> None:
    """Opening a store and reading while another process holds a write transaction: no write lock taken.

    The busy timeout is tiny, so any attempt to take the write lock would raise StoreBusy at once.
    """
    path = tmp_path / "s.db"
    writer = sqlite_store(path)
    writer.commit(META, [UserEvent(id="e1", text="hi")], 0)
    writer.close()
    with _write_lock_held(path):
        reader = sqlite_store(path, timeout=0.01)
        assert [s.id for s in reader.list("app")] == ["s-1"]
        loaded = reader.load("app", "s-1")
        assert loaded is not None and [e.id for e in loaded.events] == ["e1"]
        assert reader.load_scoped_state("app", "user", "u-1") == {}
        with pytest.raises(StoreBusy):  # writing does need the lock: the test would notice a lock-free write
            reader.commit(META, [UserEvent(text="no")], 1)
        reader.close()


def test_a_new_database_is_made_under_the_write_lock(tmp_path: Path) -> None:
    """The tables of a file that lacks them are created under the lock: a held lock makes that StoreBusy."""
    path = tmp_path / "s.db"
    sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()  # a database, no dormant tables
    with _write_lock_held(path), pytest.raises(StoreBusy):
        sqlite_store(path, timeout=0.01)
    assert sqlite_store(path).list("app") == []


# -- paths ----------------------------------------------------------------------------------------


def test_a_home_path_is_expanded_once_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    store = sqlite_store("~/data/s.db")
    store.commit(META, [], 0)
    store.close()
    assert (tmp_path / "home" / "data" / "s.db").is_file()
    assert not (tmp_path / "~").exists()
    assert store.path == str(tmp_path / "home" / "data" / "s.db")


@pytest.mark.parametrize("path", ["", "   "])
def test_an_empty_path_is_a_configuration_error(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="cannot be empty"):
        sqlite_store(path)
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_is_not_a_path_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not int"):
        sqlite_store(3)  # type: ignore[arg-type]


def test_a_parent_that_is_a_file_is_a_configuration_error_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    target = tmp_path / "file" / "sub" / "s.db"
    with pytest.raises(ConfigurationError, match=f"{re.escape(str(target))}: a file is in the way"):
        sqlite_store(target)


def test_a_parent_that_cannot_be_made_is_a_configuration_error_naming_the_path(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root may write anywhere a mode allows: sysfs refuses even root
        target = Path("/sys/dormant-test/s.db")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "sub" / "s.db"
    with pytest.raises(ConfigurationError, match=re.escape(str(target))):
        sqlite_store(target)


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory"):
        sqlite_store(tmp_path)


def test_a_file_that_is_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not SQLite " * 100)
    with pytest.raises(ConfigurationError, match=re.escape(str(path))):
        sqlite_store(path)


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "dat" / "bookings.db"
    with pytest.raises(ConfigurationError, match=f"no SQLite database at {re.escape(str(typo))}"):
        sqlite_store(typo, create=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigurationError, match="memory"):
        sqlite_store(":memory:", create=False)


def test_create_false_opens_an_existing_store_and_refuses_a_foreign_database(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    sqlite_store(path).commit(META, [UserEvent(id="e1", text="hi")], 0)
    loaded = sqlite_store(path, create=False).load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["e1"]
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE other (x)").connection.close()
    with pytest.raises(ConfigurationError, match="no dormant tables"):
        sqlite_store(empty, create=False)


def test_tables_of_another_shape_are_refused_not_mixed_with(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # an earlier version's events table: no version/seq columns
        conn.execute("CREATE TABLE events (app_name, session_id, event_id, idx, data)")
    with pytest.raises(ConfigurationError, match="not this version's dormant tables"):
        sqlite_store(path)


def test_a_bad_synchronous_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        sqlite_store(tmp_path / "s.db", synchronous="SOMETIMES")  # type: ignore[arg-type]


def test_writers_of_one_file_queue_on_its_lock_file_and_give_up_past_the_timeout(tmp_path: Path) -> None:
    """Writers in other processes (here: another process's lock, held by a child) take turns on ``<db>-lock``
    before SQLite's lock: a commit waits while it is held, lands once it is released, and is ``StoreBusy``
    (nothing written) when it stays held past the store's timeout."""
    import subprocess
    import sys
    import time

    path = tmp_path / "queue.db"
    store = sqlite_store(path, timeout=0.5)
    store.commit(META, [UserEvent(id="e1", text="hi")], 0)
    assert (tmp_path / "queue.db-lock").exists()
    hold = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path / "queue.db-lock"), "5"], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy, match="write lock"):
            store.commit(META, [UserEvent(id="e2", text="blocked")], 1)
        holder.kill()
    loaded = store.load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["e1"]  # the refused commit wrote nothing

    with subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path / "queue.db-lock"), "0.3"], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        store.close()
        store = sqlite_store(path, timeout=10)
        store.commit(META, [UserEvent(id="e2", text="after")], 1)  # waits for the holder, then lands
        assert holder.wait(10) == 0 and time.monotonic() - started >= 0.1
    loaded = store.load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["e1", "e2"]
    store.close()
