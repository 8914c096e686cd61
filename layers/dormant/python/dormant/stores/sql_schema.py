"""The tables of the SQL stores, written once: SQLite and Postgres differ only in the JSON column type.

Events are keyed by id (re-sent ids are found by the primary key) and ordered by ``(version, seq)``:
the commit that stored them and their position in it, the position ``load(..., after=)`` reads from.
``snapshots`` keeps one derived snapshot per session (a cache: text, overwritten, never authoritative).
"""

from __future__ import annotations

__all__ = ["INDEXES", "TABLES", "ddl"]

TABLES = ("sessions", "events", "scoped_state", "snapshots")
INDEXES = ("idx_sessions_updated", "idx_events_order")

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


def ddl(json_type: str) -> str:
    """The statements, ``;``-separated, with ``json_type`` for JSON columns (SQLite needs TEXT affinity)."""
    return _DDL.format(json=json_type)
