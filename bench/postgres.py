"""Postgres store vs raw psycopg running the same statements on one server (W1 commits, W2 loads, W4 create + list).

The server is ``TEST_DATABASE_URL`` when set, else a throwaway cluster (``tests.support.servers.postgres``) with
fsync off, so the figures compare driver and store work rather than this machine's disk
(``BENCH_PG_DURABLE=1`` turns fsync and synchronous commit on). Everything runs in a
schema made for the run and dropped after it. The floor is the least a correct store must do, done as
well as psycopg allows: one connection, and each commit one transaction pipelined into two round trips
like the store's (BEGIN + the version-checked UPDATE, whose answer decides; then the multi-row INSERT
of the events + COMMIT); a load pipelines its two SELECTs and ``json.loads`` each event.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from .common import Figure
from .workloads import SQL_TARGETS, store_workloads


class Floor:
    """Raw psycopg on one autocommit connection, over the tables the store made."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self._inserts: dict[int, str] = {}

    def commit(self, app: str, sid: str, rows: list[dict[str, Any]], version: int) -> None:
        """``version=0`` creates the row; otherwise the UPDATE must find ``version``."""
        conn, now = self.conn, time.time_ns() // 1_000_000
        with conn.pipeline():
            conn.execute("BEGIN")
            if version == 0:
                gate = conn.execute(
                    "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at)"
                    " VALUES (%s, %s, 1, '{}', NULL, %s, %s) ON CONFLICT DO NOTHING RETURNING version",
                    (app, sid, now, now),
                )
            else:
                gate = conn.execute(
                    "UPDATE sessions SET version = version + 1, updated_at = %s"
                    " WHERE app_name = %s AND id = %s AND version = %s RETURNING version",
                    (now, app, sid, version),
                )
            if gate.fetchone() is None:
                conn.execute("ROLLBACK")
                raise AssertionError("the floor's commit conflicted")
            params: list[Any] = []
            for n, row in enumerate(rows):
                params += [app, sid, row["id"], version + 1, n, json.dumps(row)]
            conn.execute(self._insert(len(rows)), params)
            conn.execute("COMMIT")

    def load(self, app: str, sid: str) -> list[Any]:
        conn = self.conn
        with conn.pipeline():
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(
                "SELECT version, scopes::text, created_at FROM sessions WHERE app_name = %s AND id = %s", (app, sid)
            )
            data = conn.execute(
                "SELECT data::text FROM events WHERE app_name = %s AND session_id = %s ORDER BY version, seq",
                (app, sid),
            )
            conn.execute("COMMIT")
        return [json.loads(text) for (text,) in data.fetchall()]

    def list(self, app: str) -> list[Any]:
        return self.conn.execute(
            "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = %s"
            " ORDER BY updated_at DESC, id DESC",
            (app,),
        ).fetchall()

    def _insert(self, count: int) -> str:
        if count not in self._inserts:
            values = ", ".join(["(%s, %s, %s, %s, %s, %s::jsonb)"] * count)
            self._inserts[count] = (
                f"INSERT INTO events (app_name, session_id, event_id, version, seq, data) VALUES {values}"
            )
        return self._inserts[count]


@contextlib.contextmanager
def _server() -> Iterator[str]:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    from tests.support.servers.postgres import throwaway_postgres

    with throwaway_postgres(durable=os.environ.get("BENCH_PG_DURABLE") == "1") as started:
        yield started


def run() -> list[Figure]:
    try:
        import psycopg

        from dormant.errors import DormantError
        from dormant.stores.postgres import postgres_store
        from tests.support.servers.postgres import throwaway_schema
    except ImportError as exc:
        print(f"  skipped: the Postgres store needs psycopg (pip install 'dormant[postgres]'): {exc}")
        return []
    try:
        with _server() as server, throwaway_schema(server, "dormant_bench_") as url:
            store, floor = postgres_store(url), Floor(url)
            try:
                return store_workloads("postgres", store, floor, targets=SQL_TARGETS)
            finally:
                store.close()
                floor.conn.close()
    except (DormantError, psycopg.OperationalError) as exc:
        print(f"  skipped: no PostgreSQL server to measure against ({exc})")
        return []
