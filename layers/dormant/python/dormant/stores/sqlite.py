"""The SQLite store: a durable file, the embedded default for local work, a CLI, or one machine.

One connection per store object, shared by its threads under a lock (so ``":memory:"`` is one database
for every user of the store, not one per connection). WAL mode; each commit is one ``BEGIN IMMEDIATE``
transaction — version check, event appends, scoped upserts — so a rejected commit writes nothing.
Several processes may share a file: OCC picks the winner, and a locked database is waited on for up to
``timeout`` seconds before ``StoreBusy`` is raised (never a raw "database is locked").
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigurationError, StoreBusy, StoreClosed, StoreError
from ..events import Event
from ..ids import check_id, now_ms
from .base import (
    CommitResult,
    LoadedSession,
    ScopedStateChange,
    SessionListing,
    StoredSession,
    check_commit,
    decode_cursor,
    encode_values,
    event_from_json,
    event_to_json,
    merge_scoped_changes,
    unique_new,
)

__all__ = ["DDL", "SQLiteSessionStore", "sqlite_store"]

DDL = """
CREATE TABLE IF NOT EXISTS sessions (
  app_name TEXT NOT NULL,
  id TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 0,
  scopes TEXT NOT NULL DEFAULT '{}',
  status TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (app_name, id)
);
CREATE INDEX IF NOT EXISTS idx_sessions_updated ON sessions (app_name, updated_at, id);
CREATE TABLE IF NOT EXISTS events (
  app_name TEXT NOT NULL,
  session_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY (app_name, session_id, event_id)
);
CREATE INDEX IF NOT EXISTS idx_events_order ON events (app_name, session_id, idx);
CREATE TABLE IF NOT EXISTS scoped_state (
  app_name TEXT NOT NULL,
  scope TEXT NOT NULL,
  scope_id TEXT NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (app_name, scope, scope_id, key)
);
"""

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_ID_CHUNK = 500  # event ids per "IN (...)" lookup, well under SQLite's variable limit


class SQLiteSessionStore:
    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 30.0,
        synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "FULL",
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(f"synchronous is OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        self.path = str(path)
        self._lock = threading.RLock()
        self._closed = False
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        with _translate():
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            with self._transaction():
                for statement in DDL.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)

    # -- the contract -----------------------------------------------------------------------

    def load(self, app_name: str, session_id: str) -> LoadedSession | None:
        with self._use(), self._transaction("BEGIN"):
            row = self._conn.execute(
                "SELECT version, scopes, created_at, status, updated_at FROM sessions WHERE app_name = ? AND id = ?",
                (app_name, session_id),
            ).fetchone()
            if row is None:
                return None
            data = self._conn.execute(
                "SELECT data FROM events WHERE app_name = ? AND session_id = ? ORDER BY idx",
                (app_name, session_id),
            ).fetchall()
        version, scopes, created_at, status, updated_at = row
        meta = StoredSession(session_id, app_name, version, json.loads(scopes), created_at, status, updated_at)
        return LoadedSession(meta, [event_from_json(d) for (d,) in data])

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        check_commit(session, new_events, expected_version)
        scoped = [(target, encode_values(values)) for target, values in merge_scoped_changes(scoped_changes).items()]
        encoded = {event.id: event_to_json(event) for event in new_events}
        app, sid = session.app_name, session.id
        with self._use(), self._transaction():
            conn = self._conn
            row = conn.execute("SELECT version FROM sessions WHERE app_name = ? AND id = ?", (app, sid)).fetchone()
            actual = row[0] if row is not None else 0
            if actual != expected_version:
                return CommitResult(ok=False, version=actual, appended=0)
            fresh = unique_new(new_events, self._stored_ids(app, sid, list(encoded)) if row else frozenset())
            if fresh:
                (last,) = conn.execute(
                    "SELECT COALESCE(MAX(idx), -1) FROM events WHERE app_name = ? AND session_id = ?", (app, sid)
                ).fetchone()
                conn.executemany(
                    "INSERT INTO events (app_name, session_id, event_id, idx, data) VALUES (?, ?, ?, ?, ?)",
                    [(app, sid, e.id, last + 1 + n, encoded[e.id]) for n, e in enumerate(fresh)],
                )
            now = now_ms()
            scopes = json.dumps(session.scopes)
            if row is None:
                conn.execute(
                    "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at)"
                    " VALUES (?, ?, 1, ?, ?, ?, ?)",
                    (app, sid, scopes, session.status, session.created_at or now, now),
                )
            else:
                conn.execute(
                    "UPDATE sessions SET version = ?, scopes = ?, status = ?, updated_at = ?"
                    " WHERE app_name = ? AND id = ?",
                    (expected_version + 1, scopes, session.status, now, app, sid),
                )
            for (scope, scope_id), values in scoped:
                self._merge(app, scope, scope_id, values)
            return CommitResult(ok=True, version=expected_version + 1, appended=len(fresh))

    def delete(self, app_name: str, session_id: str) -> None:
        with self._use(), self._transaction():
            self._conn.execute("DELETE FROM events WHERE app_name = ? AND session_id = ?", (app_name, session_id))
            self._conn.execute("DELETE FROM sessions WHERE app_name = ? AND id = ?", (app_name, session_id))

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        with self._use():
            rows = self._conn.execute(
                "SELECT key, value FROM scoped_state WHERE app_name = ? AND scope = ? AND scope_id = ?",
                (app_name, scope, scope_id),
            ).fetchall()
        return {key: json.loads(value) for key, value in rows}

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None:
        check_id(scope_id, "scope id")
        values = encode_values(state)
        with self._use(), self._transaction():
            self._merge(app_name, scope, scope_id, values)

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> builtins.list[SessionListing]:
        sql = "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = ?"
        params: builtins.list[Any] = [app_name]
        if cursor:
            updated_at, after_id = decode_cursor(cursor)
            sql += " AND (updated_at < ? OR (updated_at = ? AND id < ?))"
            params += [updated_at, updated_at, after_id]
        sql += " ORDER BY updated_at DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._use():
            rows = self._conn.execute(sql, params).fetchall()
        return [SessionListing._make(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    # -- internals --------------------------------------------------------------------------

    def _stored_ids(self, app: str, sid: str, ids: builtins.list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), _ID_CHUNK):
            chunk = ids[start : start + _ID_CHUNK]
            marks = ",".join("?" * len(chunk))
            found.update(
                r[0]
                for r in self._conn.execute(
                    f"SELECT event_id FROM events WHERE app_name = ? AND session_id = ? AND event_id IN ({marks})",
                    (app, sid, *chunk),
                )
            )
        return found

    def _merge(self, app: str, scope: str, scope_id: str, values: Mapping[str, str | None]) -> None:
        for key, value in values.items():
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
        with self._lock, _translate():
            if self._closed:
                raise StoreClosed("this store was closed")
            yield

    @contextmanager
    def _transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
        # IMMEDIATE takes the write lock up front: a deferred transaction that later wants to write
        # fails with SQLITE_BUSY at once in WAL mode, without waiting on the busy timeout.
        self._conn.execute(begin)
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise


@contextmanager
def _translate() -> Iterator[None]:
    """sqlite3's errors as dormant's: a lock held past the timeout is ``StoreBusy``, the rest ``StoreError``."""
    try:
        yield
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES or "locked" in str(exc):
            raise StoreBusy(f"the SQLite database stayed locked past the timeout: {exc}") from exc
        raise StoreError(f"SQLite: {exc}") from exc


def sqlite_store(
    path: str | Path,
    *,
    timeout: float = 30.0,
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "FULL",
) -> SQLiteSessionStore:
    """A store in the SQLite file at ``path`` (parent directories created), or ``":memory:"``."""
    return SQLiteSessionStore(path, timeout=timeout, synchronous=synchronous)
