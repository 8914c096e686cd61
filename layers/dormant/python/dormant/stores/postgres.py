"""The Postgres store: several web nodes and workers sharing one session table, OCC as the referee.

Why one module: it is one store class with its pool, its SQL and its two-round-trip commit, which change
together; what it shares with SQLite (the tables, the commit plan) is in ``sql_schema`` and ``stores.base``.

Give it a connection string and it builds (and on ``close()`` closes) a ``psycopg_pool.ConnectionPool``;
give it a pool you manage and it uses that pool as it is — never closing or re-configuring it, and
reading rows as tuples whatever ``row_factory`` the pool's connections carry.

Tables: the same four as the SQLite store (``sql_schema``; JSONB in place of TEXT), unqualified, so they land in the
connection's ``search_path``. They are created on the store's first use, once per store object. A role
without CREATE rights works against tables that already exist; on a database without them it fails on
that first statement with a ``ConfigurationError`` saying so. Concurrent creators — threads, or
processes booting against a fresh database — are serialised by a lock and, across connections, a
transaction-scoped advisory lock (PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe to race).

A commit is one transaction on one connection, in two round trips: first the version gate (a
conditional ``UPDATE ... RETURNING``, or ``INSERT ... ON CONFLICT DO NOTHING`` to create), which takes
the session row's lock; then, pipelined, the event appends, the scoped-state writes and ``COMMIT``.
The appends run after the gate, under its lock, in one ``INSERT ... SELECT ... ON CONFLICT DO
NOTHING``: ids already stored are skipped by the primary key, the new events land at the granted
version. The gate also holds the scopes fixed: the ``UPDATE`` matches only the row's own scopes. On a
refusal the transaction is rolled back and nothing is written.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import itertools
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ..errors import ConfigurationError, DormantError, StoreBusy, StoreError
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

__all__ = ["DDL", "PostgresSessionStore", "postgres_store"]

DDL = ddl("JSONB")
_RELATIONS = TABLES + INDEXES
_DDL_LOCK = 0x646F726D616E74  # "dormant": the advisory lock every store takes around its DDL

_SCHEMA_PRESENT = sql.SQL("SELECT current_user, current_schema(), {}").format(
    sql.SQL(" AND ").join(sql.SQL("to_regclass({}) IS NOT NULL").format(sql.Literal(r)) for r in _RELATIONS)
)
# The commit's statements take positional parameters: psycopg maps named ones to positions again on every call.
_CREATE = (
    "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at, forked_from, fork_reason,"
    " due_at) VALUES (%s, %s, 1, %s::jsonb, %s, %s, %s, %s, %s, %s) ON CONFLICT (app_name, id) DO NOTHING"
    " RETURNING version"
)
# Scopes are part of the gate (JSONB equality ignores key order): a refusal reads them back to say which.
_BUMP = (
    "UPDATE sessions SET version = version + 1, status = %s, updated_at = GREATEST(updated_at, %s), due_at = %s"
    " WHERE app_name = %s AND id = %s AND version = %s AND scopes = %s::jsonb RETURNING version"
)
_REFUSED = "SELECT version, scopes::text FROM sessions WHERE app_name = %s AND id = %s"
# A create with a retention first removes a session of that id past it (PreparedCommit.replaces): its
# events and snapshot with it, in the create's transaction, so the INSERT then takes the id afresh. Two
# such creates racing: the second's DELETE waits for the first's lock, then finds the new row live.
_REPLACE_EXPIRED = (
    "WITH gone AS (DELETE FROM sessions WHERE app_name = %s AND id = %s AND updated_at <= %s"
    " RETURNING app_name, id),"
    " events_gone AS (DELETE FROM events e USING gone WHERE e.app_name = gone.app_name AND e.session_id = gone.id),"
    " snapshot_gone AS (DELETE FROM snapshots s USING gone WHERE s.app_name = gone.app_name"
    " AND s.session_id = gone.id)"
    " SELECT count(*) FROM gone"
)
# The append runs after the gate, holding the row's lock: no other commit can append to this session
# meanwhile. Ids already stored are skipped by the primary key (ON CONFLICT on it: a re-sent id conflicts
# with its stored row, in this session only); the rest are stored at the granted version, each at its
# place in the batch, so a skipped id leaves a gap in ``seq`` that the (version, seq) order does not mind.
#
# A multi-row VALUES, one text per event count (psycopg prepares each after five uses; 6 parameters an
# event, 60,005 at the 10,000-event limit, under PostgreSQL's 65,535). ``INSERT ... SELECT`` from
# ``unnest`` of two arrays (one text for every count) took the server 134 µs for a 5-event append where
# this takes 88 (pg_stat_statements): INSERT ... SELECT, from unnest or from a VALUES list, costs the
# same. Not a probe of the stored ids joined in: a lateral join plans in about as long as the commit's
# two round trips take, and the conflict check is the primary key's own lookup whatever the session's
# length.
_APPEND_ROW = "(%s, %s, %s, %s, %s, %s::jsonb)"
_APPEND_HEAD = "INSERT INTO events (app_name, session_id, event_id, version, seq, data) VALUES "
_APPEND_TAIL = " ON CONFLICT (app_name, session_id, event_id) DO NOTHING"
# With the commit's snapshot, in one statement: the snapshot is kept only when every event was fresh (a
# retried commit leaves the ledger other than the fold the snapshot holds), and only over an older one;
# the statement returns how many events it appended. Its parameters: the append's, then the session's
# app, id and version, the snapshot's data and the number of events.
_SNAPSHOT_TAIL = (
    " RETURNING 1),"
    " counted AS (SELECT count(*) AS n FROM appended),"
    " kept AS (INSERT INTO snapshots (app_name, session_id, version, data)"
    " SELECT %s, %s, %s, %s FROM counted WHERE counted.n = %s"
    " ON CONFLICT (app_name, session_id) DO UPDATE SET version = excluded.version, data = excluded.data"
    " WHERE excluded.version > snapshots.version)"
    " SELECT n FROM counted"
)


@functools.lru_cache(maxsize=64)
def _append(count: int, with_snapshot: bool) -> str:
    """The append of ``count`` events, alone or with the commit's snapshot."""
    append = _APPEND_HEAD + ", ".join([_APPEND_ROW] * count) + _APPEND_TAIL
    return f"WITH appended AS ({append}{_SNAPSHOT_TAIL}" if with_snapshot else append


_LOAD_ROW = (
    "SELECT version, scopes::text, created_at, status, updated_at, forked_from, fork_reason FROM sessions"
    " WHERE app_name = %s AND id = %s"
)
_LOAD_EVENTS = (
    "SELECT data::text FROM events WHERE app_name = %s AND session_id = %s AND version > %s ORDER BY version, seq"
)
# A load from the snapshot (what a state read runs): the row with its snapshot, then the events after the
# snapshot's version, in one read-only transaction sent as one pipeline (one round trip).
_ROW_WITH_SNAPSHOT = (
    "SELECT s.version, s.scopes::text, s.created_at, s.status, s.updated_at, s.forked_from, s.fork_reason,"
    " n.version, n.data FROM sessions s LEFT JOIN snapshots n ON n.app_name = s.app_name AND n.session_id = s.id"
    " WHERE s.app_name = %s AND s.id = %s"
)
_EVENTS_AFTER_SNAPSHOT = (
    "SELECT data::text FROM events WHERE app_name = %s AND session_id = %s AND version > COALESCE("
    "(SELECT version FROM snapshots WHERE app_name = %s AND session_id = %s), 0) ORDER BY version, seq"
)
_UPSERT_SCOPED = (
    "INSERT INTO scoped_state (app_name, scope, scope_id, key, value)"
    " SELECT %(app)s, %(scope)s, %(scope_id)s, item.key, item.value::jsonb"
    " FROM unnest(%(keys)s::text[], %(values)s::text[]) AS item (key, value)"
    " ON CONFLICT (app_name, scope, scope_id, key) DO UPDATE SET value = excluded.value"
)
_DELETE_SCOPED = (
    "DELETE FROM scoped_state WHERE app_name = %(app)s AND scope = %(scope)s AND scope_id = %(scope_id)s"
    " AND key = ANY(%(keys)s::text[])"
)
# Kept only while the row is at the snapshot's version or later (the SELECT reads it; a delete racing
# this leaves at worst a snapshot whose created_at no longer matches, which loads ignore), and only
# over an older snapshot.
_SAVE_SNAPSHOT = (
    "INSERT INTO snapshots (app_name, session_id, version, data)"
    " SELECT app_name, id, %(version)s, %(data)s FROM sessions"
    " WHERE app_name = %(app)s AND id = %(sid)s AND version >= %(version)s"
    " ON CONFLICT (app_name, session_id) DO UPDATE SET version = excluded.version, data = excluded.data"
    " WHERE excluded.version > snapshots.version"
)
_LOAD_SNAPSHOT = "SELECT version, data FROM snapshots WHERE app_name = %s AND session_id = %s"
_LOAD_SCOPED = "SELECT key, value::text FROM scoped_state WHERE app_name = %s AND scope = %s AND scope_id = %s"

_PIPELINE = psycopg.Pipeline.is_supported()


class PostgresSessionStore(BaseSessionStore):
    snapshots_in_commit = True

    def __init__(self, pool: ConnectionPool[Any], *, owns_pool: bool) -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self._schema_lock = threading.Lock()
        self._schema_ready = False

    # -- primitives ---------------------------------------------------------------------------

    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        with self._connection() as conn:
            # One snapshot for the row and its events: a commit landing between the two reads must not
            # give a version older (or newer) than the events shown with it.
            with _atomic(conn):
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                found = conn.cursor(row_factory=tuple_row).execute(_LOAD_ROW, (app_name, session_id))
                data = conn.cursor(row_factory=tuple_row).execute(_LOAD_EVENTS, (app_name, session_id, after))
            fetched = found.fetchone()
            events = data.fetchall()
        if fetched is None:
            return None
        return stored_row(app_name, session_id, fetched), [text for (text,) in events]

    def _read_with_snapshot(
        self, app_name: str, session_id: str
    ) -> tuple[StoredSnapshot | None, tuple[StoredSession, Sequence[str]] | None]:
        """The snapshot, the row and the events after the snapshot, in one snapshot of the database (a commit
        landing meanwhile shows in none of them or in all) and one round trip."""
        key = (app_name, session_id)
        with self._connection() as conn:
            with _atomic(conn):
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                found = conn.cursor(row_factory=tuple_row).execute(_ROW_WITH_SNAPSHOT, key)
                data = conn.cursor(row_factory=tuple_row).execute(_EVENTS_AFTER_SNAPSHOT, key + key)
            fetched = found.fetchone()
            events = data.fetchall()
        if fetched is None:
            return None, None
        kept, text = fetched[7:]
        snapshot = StoredSnapshot(kept, text) if kept is not None else None
        return snapshot, (stored_row(app_name, session_id, fetched), [item for (item,) in events])

    def _write(self, commit: PreparedCommit) -> int | Refused:
        new, expected = commit.row, commit.expected_version
        app, sid, scopes = new.app_name, new.id, json.dumps(new.scopes)
        if expected == 0:
            gate: tuple[Any, ...] = (app, sid, scopes, new.status, new.created_at, new.updated_at)
            gate += (new.forked_from, new.fork_reason, due_of(new.status, new.updated_at))
        else:
            gate = (new.status, new.updated_at, due_of(new.status, new.updated_at), app, sid, expected, scopes)
        version, events = new.version, commit.events
        append = [item for n, (event_id, data) in enumerate(events) for item in (app, sid, event_id, version, n, data)]
        with self._connection() as conn:
            appended = counted = None
            with _atomic(conn):
                if expected == 0 and new.retention_ms is not None:
                    conn.execute(_REPLACE_EXPIRED, (app, sid, new.updated_at - new.retention_ms))
                granted = conn.cursor(row_factory=tuple_row).execute(_CREATE if expected == 0 else _BUMP, gate)
                if granted.fetchone() is None:  # in a pipeline, this fetch is the first round trip's end
                    raise _Refuse
                if events and commit.snapshot is not None:
                    append += (app, sid, version, commit.snapshot.data, len(events))
                    counted = conn.cursor(row_factory=tuple_row).execute(_append(len(events), True), append)
                elif events:
                    appended = conn.cursor().execute(_append(len(events), False), append)
                for statement, params in _scoped_statements(app, commit.scoped):
                    conn.execute(statement, params)
            if granted.rowcount != 1:
                current = conn.cursor(row_factory=tuple_row).execute(_REFUSED, (app, sid)).fetchone()
                return Refused(current[0], json.loads(current[1])) if current else Refused(0)
            if counted is not None:
                (count,) = counted.fetchone() or (0,)
                return int(count)
        return appended.rowcount if appended else 0

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        params = {"app": app_name, "sid": session_id, "version": snapshot.version, "data": snapshot.data}
        with self._connection() as conn:
            with _atomic(conn):
                saved = conn.cursor().execute(_SAVE_SNAPSHOT, params)
            return saved.rowcount == 1

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(_LOAD_SNAPSHOT, (app_name, session_id)).fetchone()
        return StoredSnapshot(row[0], row[1]) if row is not None else None

    def _save_scoped(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        with self._connection() as conn, _atomic(conn):
            for statement, params in _scoped_statements(app_name, writes):
                conn.execute(statement, params)

    def _load_scoped(self, app_name: str, scope: str, scope_id: str) -> dict[str, str]:
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(_LOAD_SCOPED, (app_name, scope, scope_id)).fetchall()
        return dict(rows)

    def _delete(self, app_name: str, session_id: str) -> None:
        # The row first: that waits for a commit holding its lock, so the events DELETE (a later
        # snapshot) sees that commit's events, and no later commit can append to a deleted session.
        with self._connection() as conn, _atomic(conn):
            conn.execute("DELETE FROM sessions WHERE app_name = %s AND id = %s", (app_name, session_id))
            conn.execute("DELETE FROM events WHERE app_name = %s AND session_id = %s", (app_name, session_id))
            conn.execute("DELETE FROM snapshots WHERE app_name = %s AND session_id = %s", (app_name, session_id))

    def _list(
        self, app_name: str, limit: int | None, after: tuple[int, str] | None, status: str | None
    ) -> builtins.list[SessionListing]:
        query = "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = %s"
        params: builtins.list[Any] = [app_name]
        if status is not None:  # idx_sessions_status: (app_name, status, updated_at, id)
            query += " AND status = %s"
            params.append(status)
        if after is not None:
            query += " AND (updated_at, id) < (%s, %s)"
            params += list(after)
        query += " ORDER BY updated_at DESC, id DESC"
        if limit is not None:
            query += " LIMIT %s"
            params.append(limit)
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()
        return SessionListing.from_rows(rows)

    def _running(self, limit: int) -> builtins.list[RunningSession]:
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(RUNNING_QUERY.format(mark="%s"), (limit,)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(WAITING_QUERY.format(mark="%s"), (limit,)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _due(self, before: int, limit: int, after: RunningSession | None) -> builtins.list[RunningSession]:
        start = (-1, "", "") if after is None else (after.due_at, after.app_name, after.session_id)
        with self._connection() as conn:
            query = DUE_QUERY.format(mark="%s")
            rows = conn.cursor(row_factory=tuple_row).execute(query, (before, *start, limit)).fetchall()
        return [RunningSession(*row) for row in rows]

    def _set_due(
        self, app_name: str, session_id: str, version: int, due_at: int, writes: Sequence[ScopedWrite] = ()
    ) -> bool:
        if not writes:
            with self._connection() as conn, _atomic(conn):
                done = conn.cursor().execute(SET_DUE.format(mark="%s"), (due_at, app_name, session_id, version))
            return done.rowcount == 1
        # The writes only if the due time was set: a plain transaction, whose rowcount is known before them (a
        # pipelined one's is not).
        with self._connection() as conn, conn.transaction():
            done = conn.cursor().execute(SET_DUE.format(mark="%s"), (due_at, app_name, session_id, version))
            if done.rowcount != 1:
                return False
            for statement, params in _scoped_statements(app_name, writes):
                conn.execute(statement, params)
        return True

    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        # No ORDER BY: it could tempt the planner into the primary key's order instead of the binding index.
        query = f"SELECT id FROM sessions WHERE app_name = %s AND {bound_id('JSONB', scope)} = %s"
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(query, (app_name, scope_id)).fetchall()
        return sorted(sid for (sid,) in rows)

    def _app_names(self, prefix: str) -> builtins.list[str]:
        # Byte order (COLLATE "C"), where '~' sorts after every id character, whatever the database's collation.
        query = (
            'SELECT DISTINCT app_name FROM sessions WHERE app_name COLLATE "C" >= %s AND app_name COLLATE "C" < %s'
            " ORDER BY 1"
        )
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(query, (prefix, prefix + "~")).fetchall()
        return [name for (name,) in rows]

    def _scrub(self) -> str | None:
        # Not VACUUM here: VACUUM FULL locks the tables, and when to pay for it is the operator's call.
        return (
            "PostgreSQL keeps deleted row versions in the table files until they are rewritten: run"
            " VACUUM FULL on sessions, events, snapshots and scoped_state (WAL and backups keep them until they expire)"
        )

    def execute(self, statement: str, params: Sequence[Any]) -> tuple[builtins.list[tuple[Any, ...]], int]:
        """One statement (``{mark}`` for each parameter) in its own transaction, on a table beside the
        sessions' (the API's idempotency records): its rows and rowcount."""
        with self._connection() as conn:
            with _atomic(conn):
                cursor = conn.cursor(row_factory=tuple_row).execute(statement.format(mark="%s"), tuple(params))
            return (cursor.fetchall() if cursor.description else []), cursor.rowcount

    def _close(self) -> None:
        """Close the pool the store built; a pool given to the store is left open, for its owner."""
        if self._owns_pool:
            self._pool.close()

    # -- internals --------------------------------------------------------------------------

    def _connection(self) -> _Lease:
        """A pooled connection, with dormant's tables in place, and psycopg's errors as dormant's."""
        return _Lease(self)

    def _ensure_tables(self, conn: psycopg.Connection[Any]) -> None:
        with self._schema_lock:  # the first caller makes the tables; the others wait for it
            if not self._schema_ready:
                self._create_tables(conn)
                self._schema_ready = True

    def _create_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Create the tables unless they are all there (then a role without CREATE rights is fine)."""
        cur = conn.cursor(row_factory=tuple_row)
        with conn.transaction():
            user, schema, present = cur.execute(_SCHEMA_PRESENT).fetchone() or (None, None, False)
        if present:
            return
        try:
            # Concurrent CREATE TABLE IF NOT EXISTS can fail with a unique violation in pg_type:
            # every store takes the same advisory lock first, so creators queue instead.
            with conn.transaction():
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                for statement in DDL.split(";"):
                    if statement.strip():
                        cur.execute(statement)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidSchemaName) as exc:
            where = f"schema {schema!r}" if schema else "a schema of its search_path (none it may use exists)"
            raise ConfigurationError(
                f"role {user!r} needs CREATE rights on {where} on first use: the Postgres store creates its "
                "tables the first time it meets a database without them. Grant the rights, or create the "
                f"tables once with a role that has them (dormant.stores.postgres.DDL). PostgreSQL said: {exc}"
            ) from exc


def _scoped_statements(app_name: str, writes: Sequence[ScopedWrite]) -> builtins.list[tuple[str, dict[str, Any]]]:
    """The statements that apply ``writes`` (sorted by the base, so concurrent commits touching the same
    keys lock them in the same order and cannot deadlock): one upsert and one delete per scope id."""
    statements: builtins.list[tuple[str, dict[str, Any]]] = []
    for (scope, scope_id), group in itertools.groupby(writes, key=lambda w: (w.scope, w.scope_id)):
        target = {"app": app_name, "scope": scope, "scope_id": scope_id}
        items = list(group)
        upserts = [(w.key, w.value) for w in items if w.value is not None]
        deletes = [w.key for w in items if w.value is None]
        if upserts:
            keys, texts = zip(*upserts, strict=True)
            statements.append((_UPSERT_SCOPED, {**target, "keys": list(keys), "values": list(texts)}))
        if deletes:
            statements.append((_DELETE_SCOPED, {**target, "keys": deletes}))
    return statements


class _Lease:
    """One call's connection from the store's pool: what ``pool.connection()`` does, psycopg's errors as
    dormant's, and the tables made on first use.

    A class rather than three generator context managers: every store call takes one, and on a commit of a
    few hundred microseconds their frames showed. A connection of a pool given to the store that is not in
    autocommit ends its transaction here as ``pool.connection()`` would: committed, or rolled back on an error.
    """

    __slots__ = ("_conn", "_store")

    def __init__(self, store: PostgresSessionStore) -> None:
        self._store = store

    def __enter__(self) -> psycopg.Connection[Any]:
        store = self._store
        try:
            conn: psycopg.Connection[Any] = store._pool.getconn()
        except psycopg.Error as exc:
            raise _translated(exc) from exc
        if not store._schema_ready:
            try:
                store._ensure_tables(conn)
            except BaseException as exc:
                store._pool.putconn(conn)
                if isinstance(exc, psycopg.Error):
                    raise _translated(exc) from exc
                raise
        self._conn = conn
        return conn

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: Any) -> None:
        conn = self._conn
        try:
            if not conn.autocommit and not conn.closed:
                if error is None:
                    conn.commit()
                else:
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()
        except psycopg.Error as exc:
            raise _translated(exc) from exc
        finally:
            self._store._pool.putconn(conn)
        if isinstance(error, psycopg.Error):
            raise _translated(error) from error


class _Refuse(Exception):
    """Raised inside ``_atomic`` to roll its transaction back on purpose (a version conflict)."""


@contextmanager
def _atomic(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One transaction; raise ``_Refuse`` inside to roll it back.

    On the store's own (autocommit) connections it is pipelined: BEGIN leaves with the first statement
    and COMMIT with the last, where psycopg's ``transaction()`` would sync the pipeline (a round trip)
    on entering and leaving. A pool's non-autocommit connections get ``transaction()`` as it is.
    """
    if not (_PIPELINE and conn.autocommit):
        with contextlib.suppress(_Refuse), conn.transaction():
            yield
        return
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            try:
                yield
            except _Refuse:
                conn.execute("ROLLBACK")
            else:
                conn.execute("COMMIT")
    except BaseException:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        raise


# Most specific first is not needed: _translated walks the raised error's MRO and takes the first match.
_TRANSLATION: dict[type[BaseException], tuple[type[DormantError], str]] = {
    psycopg.errors.InsufficientPrivilege: (ConfigurationError, "the database role lacks a privilege the store needs"),
    psycopg.errors.UndefinedTable: (StoreError, "a dormant table is missing (dropped after the store created it?)"),
    psycopg.errors.LockNotAvailable: (StoreBusy, "a lock stayed held past lock_timeout"),
    psycopg.errors.QueryCanceled: (StoreBusy, "the statement ran past statement_timeout"),
    psycopg.errors.DeadlockDetected: (StoreBusy, "deadlock detected; retrying may succeed"),
    psycopg.errors.SerializationFailure: (StoreBusy, "serialization failure; retrying may succeed"),
    psycopg.errors.TooManyConnections: (StoreBusy, "the server has no connection slots left"),
    PoolTimeout: (StoreBusy, "no database connection came free in time (pool exhausted, or server unreachable)"),
    PoolClosed: (StoreError, "its connection pool is closed"),
    psycopg.OperationalError: (StoreError, "the database could not be reached or dropped the connection"),
    psycopg.Error: (StoreError, "PostgreSQL refused the operation"),
}


def _translated(exc: psycopg.Error) -> DormantError:
    """psycopg's and psycopg_pool's errors as dormant's: the entry in the table above of the first class of the
    error's MRO found there (psycopg.Error, at the latest)."""
    error, meaning = next(_TRANSLATION[kind] for kind in type(exc).__mro__ if kind in _TRANSLATION)
    return error(f"Postgres store: {meaning}: {exc}")


def postgres_store(
    connection_string: str | None = None,
    *,
    pool: ConnectionPool[Any] | None = None,
    max_size: int | None = None,
) -> PostgresSessionStore:
    """A store on PostgreSQL: from ``connection_string`` (the store builds, owns and closes a pool of up to
    ``max_size`` connections, 10 by default) or on ``pool``, which it uses as is and never closes."""
    if (connection_string is None) == (pool is None):
        raise ConfigurationError("postgres_store() takes either a connection_string or a pool (exactly one)")
    if pool is not None:
        if max_size is not None:
            raise ConfigurationError("max_size sizes the pool the store builds; size your own pool yourself")
        return PostgresSessionStore(pool, owns_pool=False)
    assert connection_string is not None
    try:
        conninfo_to_dict(connection_string)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"not a PostgreSQL connection string: {exc}") from exc
    if max_size is not None and max_size < 1:
        raise ConfigurationError(f"max_size must be at least 1, not {max_size}")
    # min_size=0: connections open on demand. With 1, the first call finds the pool still opening its
    # connection and psycopg_pool grows a second one for it; a single-threaded process (a Lambda function)
    # then held two connections and took them in turn, each statement meeting a colder server process.
    owned: ConnectionPool[Any] = ConnectionPool(
        connection_string,
        min_size=0,
        max_size=max_size or 10,
        kwargs={"autocommit": True},
        name="dormant",
        open=True,
    )
    return PostgresSessionStore(owned, owns_pool=True)
