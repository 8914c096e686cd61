"""The tables of the SQL stores, written once: SQLite and Postgres differ only in the JSON column type.

Events are keyed by id (re-sent ids are found by the primary key) and ordered by ``(version, seq)``:
the commit that stored them and their position in it, the position ``load(..., after=)`` reads from.
``snapshots`` keeps one derived snapshot per session (a cache: text, overwritten, never authoritative).
``idx_sessions_bound_{scope}``: one partial expression index per bindable scope, on the id the session's
``scopes`` names, so ``bound_sessions`` (what ``app.erase`` reads) finds one person's sessions without
reading the app's; built from the rows themselves, so a file made before them is indexed whole.
``idx_sessions_running``: a partial index of the sessions whose status is ``running``, ordered by
``updated_at``, so ``running_sessions`` (the sweeper's question, across apps) reads only those; made with
``IF NOT EXISTS`` when a store opens, so a database made before it gets it, indexed whole, on first open.
``idx_sessions_waiting``: the same for the waiting statuses (``awaiting_input``, ``resumable``): where the
sweeper finds waits whose wake-up may have been lost (``waiting_sessions``).
``idx_sessions_due``: the waits by ``due_at`` (``DueStore``: each commit into a waiting status sets it to its
time, ``set_due`` moves it), so a sweep reads the due waits and never the healthy ones. A database made before
the column gets it on first open (Postgres's DDL, SQLite's store), each wait due at once.
``idx_sessions_status``: (app_name, status, updated_at, id), so ``list(status=)`` reads only the rows it
lists, in order, and a filtered page is as full as an unfiltered one. Made on open like the others.
``idempotency``: the API's ``Idempotency-Key`` records (``serving.idempotency``), in the sessions' database
so a retry behaves as deployed on every store; one partition per session (``records``), which deleting or
erasing the session through the API or the CLI removes with it. Made like the other tables.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InputError
from ..state.schema import BOUND_SCOPES
from .types import WAITING_STATUSES, StoredSession

__all__ = [
    "DUE_QUERY",
    "IDEMPOTENCY",
    "INDEXES",
    "RUNNING_QUERY",
    "SET_DUE",
    "TABLES",
    "WAITING_QUERY",
    "bound_id",
    "ddl",
    "due_of",
    "stored_row",
]

TABLES = ("sessions", "events", "scoped_state", "snapshots", "idempotency")
INDEXES = (
    "idx_sessions_updated",
    "idx_events_order",
    "idx_sessions_running",
    "idx_sessions_waiting",
    "idx_sessions_due",
    "idx_sessions_status",
    *(f"idx_sessions_bound_{scope}" for scope in BOUND_SCOPES),
)

RUNNING_QUERY = (
    "SELECT app_name, id, updated_at FROM sessions WHERE status = 'running'"
    " ORDER BY updated_at, app_name, id LIMIT {mark}"
)
"""``running_sessions``: spelled as the partial index's predicate, so the planner uses it (``{mark}``: the
driver's parameter mark)."""
WAITING_QUERY = (
    "SELECT app_name, id, updated_at, status FROM sessions WHERE status IN ('awaiting_input', 'resumable')"
    " ORDER BY updated_at, app_name, id LIMIT {mark}"
)
"""``waiting_sessions``: spelled as its partial index's predicate (``WAITING_STATUSES``), so the planner uses it."""

_WAITING = "status IN ('awaiting_input', 'resumable')"
DUE_QUERY = (
    f"SELECT app_name, id, updated_at, status, due_at, version FROM sessions WHERE {_WAITING} AND due_at <= {{mark}}"
    " AND (due_at, app_name, id) > ({mark}, {mark}, {mark}) ORDER BY due_at, app_name, id LIMIT {mark}"
)
"""``due_waits``: a range of ``idx_sessions_due`` (its predicate spelled as the index's), after the cursor row."""
SET_DUE = (
    f"UPDATE sessions SET due_at = {{mark}} WHERE app_name = {{mark}} AND id = {{mark}} AND version = {{mark}}"
    f" AND {_WAITING}"
)
"""``set_due``: only while the session waits at the version the sweeper (or the park) read."""


def due_of(status: str | None, updated_at: int) -> int | None:
    """The ``due_at`` a commit stores: a wait is due from its commit (``DueStore``); any other status, never."""
    return updated_at if status in WAITING_STATUSES else None


_DDL = """
CREATE TABLE IF NOT EXISTS sessions (
  app_name TEXT NOT NULL,
  id TEXT NOT NULL,
  version INTEGER NOT NULL DEFAULT 0,
  scopes {json} NOT NULL DEFAULT '{{}}',
  status TEXT,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  forked_from TEXT,
  fork_reason TEXT,
  due_at BIGINT,
  PRIMARY KEY (app_name, id)
);{add_due}
CREATE INDEX IF NOT EXISTS idx_sessions_updated ON sessions (app_name, updated_at, id);
CREATE INDEX IF NOT EXISTS idx_sessions_running ON sessions (updated_at, app_name, id) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS idx_sessions_waiting ON sessions (updated_at, app_name, id)
  WHERE status IN ('awaiting_input', 'resumable');
CREATE INDEX IF NOT EXISTS idx_sessions_due ON sessions (due_at, app_name, id)
  WHERE status IN ('awaiting_input', 'resumable');
UPDATE sessions SET due_at = updated_at WHERE due_at IS NULL AND status IN ('awaiting_input', 'resumable');
CREATE INDEX IF NOT EXISTS idx_sessions_status ON sessions (app_name, status, updated_at, id);
CREATE TABLE IF NOT EXISTS events (
  app_name TEXT NOT NULL,
  session_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  data {json} NOT NULL,
  PRIMARY KEY (app_name, session_id, event_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_events_order ON events (app_name, session_id, version, seq);
CREATE TABLE IF NOT EXISTS scoped_state (
  app_name TEXT NOT NULL,
  scope TEXT NOT NULL,
  scope_id TEXT NOT NULL,
  key TEXT NOT NULL,
  value {json} NOT NULL,
  PRIMARY KEY (app_name, scope, scope_id, key)
);
CREATE TABLE IF NOT EXISTS snapshots (
  app_name TEXT NOT NULL,
  session_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY (app_name, session_id)
);
CREATE TABLE IF NOT EXISTS idempotency (
  partition_key TEXT NOT NULL,
  record_key TEXT NOT NULL,
  status TEXT NOT NULL,
  expires_at BIGINT NOT NULL,
  in_progress_expires_at BIGINT,
  response TEXT,
  payload_hash TEXT,
  PRIMARY KEY (partition_key, record_key)
);
"""

_RECORD = "partition_key = {mark} AND record_key = {mark}"
IDEMPOTENCY = {
    "get": "SELECT status, expires_at, in_progress_expires_at, response, payload_hash FROM idempotency"
    " WHERE " + _RECORD,
    # Taken when absent, expired, or in progress past its own deadline (what Powertools' DynamoDB layer's
    # condition allows): rowcount 0 means another request holds the key.
    "put": (
        "INSERT INTO idempotency (partition_key, record_key, status, expires_at, in_progress_expires_at, response,"
        " payload_hash) VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark})"
        " ON CONFLICT (partition_key, record_key) DO UPDATE SET status = excluded.status,"
        " expires_at = excluded.expires_at, in_progress_expires_at = excluded.in_progress_expires_at,"
        " response = excluded.response, payload_hash = excluded.payload_hash"
        " WHERE idempotency.expires_at < {mark} OR (idempotency.status = 'INPROGRESS'"
        " AND idempotency.in_progress_expires_at IS NOT NULL AND idempotency.in_progress_expires_at < {mark})"
    ),
    "update": "UPDATE idempotency SET status = {mark}, expires_at = {mark}, response = {mark} WHERE " + _RECORD,
    "delete": "DELETE FROM idempotency WHERE " + _RECORD,
    "forget": "DELETE FROM idempotency WHERE partition_key = {mark}",
}
"""The statements of ``serving.idempotency``'s SQL persistence layer (``{mark}``: the driver's parameter mark)."""


def bound_id(json_type: str, scope: str) -> str:
    """The SQL expression of the id ``scopes`` binds ``scope`` to, as the index spells it (a query must match)."""
    if scope not in BOUND_SCOPES:  # spliced into SQL: only the known names
        raise InputError(f"sessions are bound by id to {', '.join(BOUND_SCOPES)}, not {scope!r}", field="scope")
    return f"(scopes ->> '{scope}')" if json_type == "JSONB" else f"json_extract(scopes, '$.{scope}')"


def ddl(json_type: str) -> str:
    """The statements, ``;``-separated, with ``json_type`` for JSON columns (SQLite needs TEXT affinity)."""
    bound = "".join(
        f"CREATE INDEX IF NOT EXISTS idx_sessions_bound_{scope} ON sessions (app_name, {bound_id(json_type, scope)})"
        f" WHERE {bound_id(json_type, scope)} IS NOT NULL;\n"
        for scope in BOUND_SCOPES
    )
    # Postgres adds the column to a table made before it (SQLite has no IF NOT EXISTS there: its store adds it);
    # the UPDATE then makes an earlier release's waits due at once, each looked at by the first sweep.
    add_due = "\nALTER TABLE sessions ADD COLUMN IF NOT EXISTS due_at BIGINT;" if json_type == "JSONB" else ""
    return _DDL.format(json=json_type, add_due=add_due) + bound


def stored_row(app_name: str, session_id: str, columns: tuple[Any, ...]) -> StoredSession:
    """The row a load read: ``columns`` start with the sessions table's version, scopes (JSON text), created_at,
    status, updated_at, forked_from and fork_reason, in that order (a load may read more after them)."""
    version, scopes, created_at, status, updated_at, forked_from, fork_reason = columns[:7]
    return StoredSession(
        session_id, app_name, version, json.loads(scopes), created_at, status, updated_at, forked_from, fork_reason
    )
