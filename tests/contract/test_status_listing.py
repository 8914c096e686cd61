"""``list(status=)`` reads an index in the SQL stores, on a file made before the index as on a new one.

The listing behaviour itself (full pages, cursors, a status change) is ``StoreContract``'s; here, that
SQLite and Postgres answer it from ``idx_sessions_status`` rather than by reading the app's other rows.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from dormant.stores.sqlite import sqlite_store
from tests.support.release_fixtures import APP, DONE, FIXTURES, WAITING


def test_a_sqlite_file_of_release_0_1_gets_the_status_index_and_lists_from_it(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    shutil.copyfile(FIXTURES / "release-0.1" / "sessions.sqlite", path)
    raw = sqlite3.connect(path)
    assert not raw.execute("SELECT name FROM sqlite_master WHERE name = 'idx_sessions_status'").fetchall()
    raw.close()
    store = sqlite_store(path, create=False)
    try:
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)  # the listing's SQL, with its parameters bound
        assert [s.id for s in store.list(APP, status="awaiting_input")] == [WAITING]
        assert [s.id for s in store.list(APP, status="completed", limit=1)] == [DONE]
        store._conn.set_trace_callback(None)
        (query,) = [s for s in statements if s.startswith("SELECT") and "status = " in s][:1]
        plan = str(store._conn.execute(f"EXPLAIN QUERY PLAN {query}").fetchall())
        assert "idx_sessions_status" in plan, plan
    finally:
        store.close()


@pytest.mark.backend("postgres")
def test_postgres_lists_a_status_from_its_index(postgres_schema: str) -> None:
    import psycopg

    from dormant.stores.postgres import postgres_store

    store = postgres_store(postgres_schema)
    try:
        store.list(APP)  # the tables and indexes, made on first use
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")  # a handful of rows: make the planner show it can use it
            conn.execute("SET enable_bitmapscan = off")
            plan = conn.execute(
                "EXPLAIN SELECT id, updated_at, created_at, version, status FROM sessions"
                " WHERE app_name = 'a' AND status = 'idle' AND (updated_at, id) < (5, 'x')"
                " ORDER BY updated_at DESC, id DESC LIMIT 10"
            ).fetchall()
        assert "idx_sessions_status" in str(plan), plan
    finally:
        store.close()
