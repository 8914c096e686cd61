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
"""

from __future__ import annotations

from ..errors import InputError
from ..state.schema import BOUND_SCOPES

__all__ = ["INDEXES", "RUNNING_QUERY", "TABLES", "WAITING_QUERY", "bound_id", "ddl"]

TABLES = ("sessions", "events", "scoped_state", "snapshots")
INDEXES = (
    "idx_sessions_updated",
    "idx_events_order",
    "idx_sessions_running",
    "idx_sessions_waiting",
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
  PRIMARY KEY (app_name, id)
);
CREATE INDEX IF NOT EXISTS idx_sessions_updated ON sessions (app_name, updated_at, id);
CREATE INDEX IF NOT EXISTS idx_sessions_running ON sessions (updated_at, app_name, id) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS idx_sessions_waiting ON sessions (updated_at, app_name, id)
  WHERE status IN ('awaiting_input', 'resumable');
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
"""


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
    return _DDL.format(json=json_type) + bound
