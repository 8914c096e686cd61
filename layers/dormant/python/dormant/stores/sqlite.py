"""The SQLite store: a durable file, the embedded default for local work, a CLI, or one machine.

Why one module: it is one store class with its SQL and its connection handling, which change together; what it
shares with Postgres (the tables, the commit plan) is in ``sql_schema`` and ``stores.base``.

One connection per store object, shared by its threads under a lock (so ``":memory:"`` is one database
for every user of the store, not one per connection). WAL mode; each commit is one ``BEGIN IMMEDIATE``
transaction — version check, event appends, scoped upserts — so a rejected commit writes nothing.
Opening a store takes the write lock only when the tables need making, so readers never queue
behind a writer.
Several processes may share a file: OCC picks the winner, and a locked database is waited on for up to
``timeout`` seconds before ``StoreBusy`` is raised (never a raw "database is locked").
Deleted content is zeroed (``secure_delete``, whatever the build's default), and an erasure ends by
truncating the write-ahead log (``scrub``), whose frames hold rows deleted since the last checkpoint.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigurationError, StoreBusy, StoreError
from ..events import Event

try:
    import fcntl
except ImportError:  # Windows: SQLite's own lock alone
    fcntl = None  # type: ignore[assignment]
from .base import (
    BaseSessionStore,
    PreparedCommit,
    Refused,
    RunningSession,
    ScopedWrite,
    SessionListing,
    StoredSession,
    StoredSnapshot,
)
from .sql_schema import (
    DUE_QUERY,
    INDEXES,
    RUNNING_QUERY,
    SET_DUE,
    TABLES,
    WAITING_QUERY,
    bound_id,
    ddl,
    due_of,
    stored_row,
)

__all__ = ["DDL", "SQLiteSessionStore", "sqlite_store"]

DDL = ddl("TEXT")

_new = object.__new__
_setattr = object.__setattr__
_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_SCRUB_WAIT = 2.0  # seconds a scrub waits for other connections to leave the write-ahead log
# Kept only while the row is at the snapshot's version or later, and only over an older snapshot.
_SAVE_SNAPSHOT = (
    "INSERT INTO snapshots (app_name, session_id, version, data)"
    " SELECT app_name, id, ?, ? FROM sessions WHERE app_name = ? AND id = ? AND version >= ?"
    " ON CONFLICT (app_name, session_id) DO UPDATE SET version = excluded.version, data = excluded.data"
    " WHERE excluded.version > snapshots.version"
)
_ROW = "SELECT version, scopes, created_at, status, updated_at, forked_from, fork_reason FROM sessions"
_ROW_WITH_SNAPSHOT = (
    "SELECT s.version, s.scopes, s.created_at, s.status, s.updated_at, s.forked_from, s.fork_reason,"
    " n.version, n.data FROM sessions s LEFT JOIN snapshots n ON n.app_name = s.app_name AND n.session_id = s.id"
    " WHERE s.app_name = ? AND s.id = ?"
)
_EVENTS_AFTER = "SELECT data FROM events WHERE app_name = ? AND session_id = ? AND version > ? ORDER BY version, seq"


class SQLiteSessionStore(BaseSessionStore):
    snapshots_in_commit = True

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 30.0,
        synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "FULL",
        create: bool = True,
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"synchronous is OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        self.path = _resolve(path, create)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._writers: int | None = None  # the file writers queue on, across processes (see _writing)
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            self._conn.execute("PRAGMA secure_delete=ON")  # a deleted row's bytes are zeroed, not left in the page
            self._ensure_tables(create)
            self._writers = _open_writers_lock(self.path)
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise StoreBusy(f"the SQLite database {self.path} stayed locked past the timeout: {exc}") from exc
            raise ConfigurationError(f"cannot open {self.path} as a SQLite database: {exc}") from exc

    def _ensure_tables(self, create: bool) -> None:
        """Make the tables unless they are there, taking the write lock only to make them.

        Checking reads ``sqlite_master``, which a writer's transaction does not block in WAL mode: opening
        a store to read never waits for a writer.
        """
        found, expected = self._columns(), _expected_columns()
        if found == expected and self._indexes() >= set(INDEXES):
            return
        add_due = found["sessions"] == tuple(c for c in expected["sessions"] if c != "due_at")  # made before it
        if add_due:
            found["sessions"] = expected["sessions"]
        if any(columns and columns != expected[table] for table, columns in found.items()):
            raise ConfigurationError(
                f"{self.path} holds tables that are not this version's dormant tables (made by an earlier "
                "version?): move it aside, or point the store at another file"
            )
        if not create and not any(found.values()):
            raise ConfigurationError(f"{self.path} holds no dormant tables (and create=False)")
        # None of the tables, or an earlier file without the snapshots table or an index: make what is missing.
        with self._transaction():
            if add_due:
                self._conn.execute("ALTER TABLE sessions ADD COLUMN due_at BIGINT")
            for statement in DDL.split(";"):
                if statement.strip():
                    self._conn.execute(statement)

    def _indexes(self) -> set[str]:
        return {name for (name,) in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}

    def _columns(self) -> dict[str, tuple[str, ...]]:
        return {table: tuple(row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")) for table in TABLES}

    # -- primitives ---------------------------------------------------------------------------

    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        with self._use(), self._transaction("BEGIN"):
            found = self._conn.execute(f"{_ROW} WHERE app_name = ? AND id = ?", (app_name, session_id)).fetchone()
            if found is None:
                return None
            data = self._conn.execute(
                "SELECT data FROM events WHERE app_name = ? AND session_id = ? AND version > ? ORDER BY version, seq",
                (app_name, session_id, after),
            ).fetchall()
        return stored_row(app_name, session_id, found), [d for (d,) in data]

    def _load_with_snapshot(
        self, app_name: str, session_id: str
    ) -> tuple[StoredSnapshot | None, StoredSession | None, builtins.list[Event]]:
        """The row with its snapshot in one statement (a statement reads one state of the file: no transaction);
        the events after the snapshot, when the row is past it, in one transaction with the row read again.

        What a state read runs, so the row and the snapshot are built here, each with one dict and no frozen
        ``__init__`` (``object.__setattr__`` per field): the read's Python was a third of its time."""
        key = (app_name, session_id)
        with self._lock:
            if self._closed:
                self._check_open()  # raises
            try:
                found = self._conn.execute(_ROW_WITH_SNAPSHOT, key).fetchone()
                if found is not None and (found[7] is None or found[7] < found[0]):
                    with self._transaction("BEGIN"):
                        found = self._conn.execute(_ROW_WITH_SNAPSHOT, key).fetchone()
                        tail = () if found is None else self._conn.execute(_EVENTS_AFTER, (*key, found[7] or 0))
                        data = [d for (d,) in tail]
                else:
                    data = None
            except sqlite3.Error as exc:
                raise _translated(exc) from exc
        if found is None:
            return None, None, []
        version, scopes, created_at, status, updated_at, forked_from, fork_reason, kept, text = found
        row = _new(StoredSession)
        _setattr(
            row,
            "__dict__",
            {
                "id": session_id,
                "app_name": app_name,
                "version": version,
                "scopes": {} if scopes == "{}" else json.loads(scopes),
                "created_at": created_at,
                "status": status,
                "updated_at": updated_at,
                "forked_from": forked_from,
                "fork_reason": fork_reason,
                "retention_ms": None,
            },
        )
        events = [self.decode_event(d) for d in data] if data else []
        if kept is None:
            return None, row, events
        snapshot = _new(StoredSnapshot)
        _setattr(snapshot, "__dict__", {"version": kept, "data": text})
        return snapshot, row, events

    def _write(self, commit: PreparedCommit) -> int | Refused:
        """``_gated`` in its own ``BEGIN IMMEDIATE`` transaction, under the store's lock and the writers' file lock:
        ``_use`` and ``_transaction`` spelled out, as this runs once per commit (four generator-made context
        managers were a tenth of a commit's Python)."""
        conn = self._conn
        with self._lock:
            self._check_open()
            try:
                self._take_writers()
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        outcome = self._gated(commit)
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                finally:
                    self._leave_writers()
            except sqlite3.Error as exc:
                raise _translated(exc) from exc
        return outcome

    def _gated(self, commit: PreparedCommit) -> int | Refused:
        new = commit.row
        app, sid = new.app_name, new.id
        conn = self._conn
        # The gate as one UPDATE, as the floor does it: the expected version and the scopes' stored text.
        # When it matches no row (a conflict, a create, scopes spelled otherwise) the row is read and
        # judged in Python below, which tells a refusal's version and scopes.
        bumped = (
            commit.expected_version > 0
            and conn.execute(
                "UPDATE sessions SET version = ?, status = ?, updated_at = MAX(updated_at, ?), due_at = ?"
                " WHERE app_name = ? AND id = ? AND version = ? AND scopes = ?",
                (
                    new.version,
                    new.status,
                    new.updated_at,
                    due_of(new.status, new.updated_at),
                    app,
                    sid,
                    commit.expected_version,
                    json.dumps(new.scopes) if new.scopes else "{}",
                ),
            ).rowcount
            == 1
        )
        create = False
        if not bumped:
            row = conn.execute(
                "SELECT version, scopes, updated_at FROM sessions WHERE app_name = ? AND id = ?", (app, sid)
            ).fetchone()
            if row is not None and commit.replaces(row[2]):  # an expired session: its id starts afresh
                self._remove(app, sid)
                row = None
            stored = (row[0], json.loads(row[1])) if row is not None else (0, None)
            if not commit.admits(*stored):
                return Refused(*stored)
            create = row is None
        # An id already stored (a retried commit) is skipped by the primary key, not looked up first: one
        # statement less per commit. Its seq is left unused; loads order by (version, seq), gaps and all.
        appended = (
            conn.executemany(
                "INSERT OR IGNORE INTO events (app_name, session_id, event_id, version, seq, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(app, sid, e.id, new.version, n, e.data) for n, e in enumerate(commit.events)],
            ).rowcount
            if commit.events
            else 0
        )
        if create:
            conn.execute(
                "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at, forked_from,"
                " fork_reason, due_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    app,
                    sid,
                    new.version,
                    json.dumps(new.scopes),
                    new.status,
                    new.created_at,
                    new.updated_at,
                    new.forked_from,
                    new.fork_reason,
                    due_of(new.status, new.updated_at),
                ),
            )
        elif not bumped:
            conn.execute(
                "UPDATE sessions SET version = ?, status = ?, updated_at = MAX(updated_at, ?), due_at = ?"
                " WHERE app_name = ? AND id = ?",
                (new.version, new.status, new.updated_at, due_of(new.status, new.updated_at), app, sid),
            )
        self._merge(app, commit.scoped)
        if commit.snapshot is not None and appended == len(commit.events):
            snap = commit.snapshot
            conn.execute(_SAVE_SNAPSHOT, (snap.version, snap.data, app, sid, snap.version))
        return appended

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        with self._use(), self._transaction():
            params = (snapshot.version, snapshot.data, app_name, session_id, snapshot.version)
            return self._conn.execute(_SAVE_SNAPSHOT, params).rowcount == 1

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        with self._use():
            row = self._conn.execute(
                "SELECT version, data FROM snapshots WHERE app_name = ? AND session_id = ?", (app_name, session_id)
            ).fetchone()
        return StoredSnapshot(row[0], row[1]) if row is not None else None

    def _save_scoped(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        with self._use(), self._transaction():
            self._merge(app_name, writes)

    def _load_scoped(self, app_name: str, scope: str, scope_id: str) -> dict[str, str]:
        with self._use():
            rows = self._conn.execute(
                "SELECT key, value FROM scoped_state WHERE app_name = ? AND scope = ? AND scope_id = ?",
                (app_name, scope, scope_id),
            ).fetchall()
        return dict(rows)

    def _delete(self, app_name: str, session_id: str) -> None:
        with self._use(), self._transaction():
            self._remove(app_name, session_id)

    def _remove(self, app_name: str, session_id: str) -> None:
        self._conn.execute("DELETE FROM events WHERE app_name = ? AND session_id = ?", (app_name, session_id))
        self._conn.execute("DELETE FROM sessions WHERE app_name = ? AND id = ?", (app_name, session_id))
        self._conn.execute("DELETE FROM snapshots WHERE app_name = ? AND session_id = ?", (app_name, session_id))

    def _scrub(self) -> str | None:
        """Checkpoint the write-ahead log into the file and truncate it: until then its frames still hold
        the rows deleted since the last checkpoint. Another connection reading or writing the file holds
        the log: SQLite's busy handler retries for up to ``_SCRUB_WAIT`` seconds, then the log is reported
        (an erasure run again once the file is idle finishes the job)."""
        if self.path == ":memory:":
            return None
        with self._use():
            self._conn.execute(f"PRAGMA busy_timeout = {int(min(_SCRUB_WAIT, self._timeout) * 1000)}")
            try:
                busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        if not busy:
            return None
        return (
            f"the write-ahead log {self.path}-wal still holds the erased data: another connection held it;"
            " erase again once the file is idle"
        )

    def _list(
        self, app_name: str, limit: int | None, after: tuple[int, str] | None, status: str | None
    ) -> builtins.list[SessionListing]:
        sql = "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = ?"
        params: builtins.list[Any] = [app_name]
        if status is not None:  # idx_sessions_status: (app_name, status, updated_at, id)
            sql += " AND status = ?"
            params.append(status)
        if after is not None:
            updated_at, after_id = after
            sql += " AND (updated_at < ? OR (updated_at = ? AND id < ?))"
            params += [updated_at, updated_at, after_id]
        sql += " ORDER BY updated_at DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._use():
            rows = self._conn.execute(sql, params).fetchall()
        return SessionListing.from_rows(rows)

    def _running(self, limit: int) -> builtins.list[RunningSession]:
        with self._use():
            rows = self._conn.execute(RUNNING_QUERY.format(mark="?"), (limit,)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        with self._use():
            rows = self._conn.execute(WAITING_QUERY.format(mark="?"), (limit,)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _due(self, before: int, limit: int, after: RunningSession | None) -> builtins.list[RunningSession]:
        start = (-1, "", "") if after is None else (after.due_at, after.app_name, after.session_id)
        with self._use():
            rows = self._conn.execute(DUE_QUERY.format(mark="?"), (before, *start, limit)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _set_due(
        self, app_name: str, session_id: str, version: int, due_at: int, writes: Sequence[ScopedWrite] = ()
    ) -> bool:
        with self._use(), self._transaction():
            if self._conn.execute(SET_DUE.format(mark="?"), (due_at, app_name, session_id, version)).rowcount != 1:
                return False
            self._merge(app_name, writes)
            return True

    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        # No ORDER BY: with one, the planner walks the app's rows in primary-key order instead of the index.
        sql = f"SELECT id FROM sessions WHERE app_name = ? AND {bound_id('TEXT', scope)} = ?"
        with self._use():
            return sorted(sid for (sid,) in self._conn.execute(sql, (app_name, scope_id)))

    def _app_names(self, prefix: str) -> builtins.list[str]:
        # A range on the primary key ('~' sorts after every id character): no LIKE, whose _ is a wildcard.
        sql = "SELECT DISTINCT app_name FROM sessions WHERE app_name >= ? AND app_name < ? ORDER BY app_name"
        with self._use():
            return [name for (name,) in self._conn.execute(sql, (prefix, prefix + "~"))]

    def execute(self, statement: str, params: Sequence[Any]) -> tuple[builtins.list[tuple[Any, ...]], int]:
        """One statement (``{mark}`` for each parameter) in its own write transaction, on a table beside the
        sessions' (the API's idempotency records): its rows and rowcount."""
        with self._use(), self._transaction():
            cursor = self._conn.execute(statement.format(mark="?"), tuple(params))
            return cursor.fetchall(), cursor.rowcount

    def _close(self) -> None:
        with self._lock:
            self._conn.close()
            if self._writers is not None:
                os.close(self._writers)
                self._writers = None

    # -- internals --------------------------------------------------------------------------

    def _merge(self, app: str, writes: Sequence[ScopedWrite]) -> None:
        for scope, scope_id, key, value in writes:
            if value is None:
                self._conn.execute(
                    "DELETE FROM scoped_state WHERE app_name = ? AND scope = ? AND scope_id = ? AND key = ?",
                    (app, scope, scope_id, key),
                )
            else:
                self._conn.execute(
                    "INSERT INTO scoped_state (app_name, scope, scope_id, key, value) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (app_name, scope, scope_id, key) DO UPDATE SET value = excluded.value",
                    (app, scope, scope_id, key, value),
                )

    @contextmanager
    def _use(self) -> Iterator[None]:
        """The connection, under the store's lock, sqlite3's errors as dormant's."""
        with self._lock:
            self._check_open()  # again under the lock: close() may have run since the base checked
            try:
                yield
            except sqlite3.Error as exc:
                raise _translated(exc) from exc

    @contextmanager
    def _transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
        # IMMEDIATE takes the write lock up front: a deferred transaction that later wants to write
        # fails with SQLITE_BUSY at once in WAL mode, without waiting on the busy timeout.
        with self._writing() if begin == "BEGIN IMMEDIATE" else contextlib.nullcontext():
            self._conn.execute(begin)
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Queue for the write lock on ``<path>-lock`` (``flock``) before SQLite's own: processes writing one file
        (``dormant serve``'s workers) then take turns within a millisecond of each other, where SQLite's busy
        handler sleeps up to 100 ms between tries. Without ``fcntl`` (Windows) or a file, SQLite's lock alone."""
        self._take_writers()
        try:
            yield
        finally:
            self._leave_writers()

    def _take_writers(self) -> None:
        writers = self._writers
        if writers is None:
            return
        try:
            fcntl.flock(writers, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        deadline, pause = time.monotonic() + self._timeout, 0.0002
        while True:
            try:
                fcntl.flock(writers, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreBusy(f"another process held {self.path}'s write lock past {self._timeout} s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.002)

    def _leave_writers(self) -> None:
        if self._writers is not None:
            fcntl.flock(self._writers, fcntl.LOCK_UN)


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES or "locked" in str(exc)


def _translated(exc: sqlite3.Error) -> StoreError:
    """sqlite3's errors as dormant's: a lock held past the timeout is ``StoreBusy``, the rest ``StoreError``."""
    if _is_busy(exc):
        return StoreBusy(f"the SQLite database stayed locked past the timeout: {exc}")
    return StoreError(f"SQLite: {exc}")


@functools.cache
def _expected_columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns, as the DDL makes them (read back from a scratch in-memory database)."""
    scratch = sqlite3.connect(":memory:")
    try:
        scratch.executescript(DDL)
        return {table: tuple(row[1] for row in scratch.execute(f"PRAGMA table_info({table})")) for table in TABLES}
    finally:
        scratch.close()


def _open_writers_lock(path: str) -> int | None:
    """The descriptor of ``<path>-lock``, the file writers queue on; ``None`` for ``:memory:`` or without fcntl."""
    if path == ":memory:" or fcntl is None:
        return None
    return os.open(f"{path}-lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)


def _resolve(path: object, create: bool) -> str:
    """``path`` as sqlite3 should open it (``~`` expanded), its directory made when ``create``; else a typed error."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        raise ConfigurationError(f"a SQLite path is a str or a path, not {type(path).__name__}")
    if not text.strip():
        raise ConfigurationError(f"a SQLite path cannot be empty (got {text!r}); use ':memory:' for no file")
    if text == ":memory:":
        if not create:
            raise ConfigurationError(
                "':memory:' is always a new, empty database: it cannot be opened with create=False"
            )
        return text
    resolved = Path(text).expanduser()
    if resolved.is_dir():
        raise ConfigurationError(f"{resolved} is a directory, not a SQLite database file")
    if not create:
        if not resolved.exists():
            raise ConfigurationError(f"no SQLite database at {resolved} (and create=False): check the path")
        return str(resolved)
    try:
        resolved.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError | NotADirectoryError):
            why = "a file is in the way of its directory"
        raise ConfigurationError(f"cannot create the directory {resolved.parent} for {resolved}: {why}") from exc
    return str(resolved)


def sqlite_store(
    path: str | Path,
    *,
    timeout: float = 30.0,
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "FULL",
    create: bool = True,
) -> SQLiteSessionStore:
    """A store in the SQLite file at ``path`` (``~`` expanded), or ``":memory:"``.

    With ``create=True`` (the default) a missing file, its parent directories and the tables are made.
    With ``create=False`` the file must already hold dormant's tables — for a CLI, where a typo in a
    path must not quietly start an empty database. Every problem with the path is a
    ``ConfigurationError`` naming it.
    """
    return SQLiteSessionStore(path, timeout=timeout, synchronous=synchronous, create=create)
