"""SQLite store vs raw sqlite3 running the same statements (W1 commits, W2 loads, W4 create + list).

Both sides work on one database file, the floor on the tables the store made, each through its own
connection with the same pragmas (WAL, ``synchronous=FULL``); runs alternate and use fresh ids.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from dormant.stores.sqlite import sqlite_store

from .common import Figure
from .workloads import store_workloads


class Floor:
    """Raw sqlite3: the statements a correct store needs at the least."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")

    def commit(self, app: str, sid: str, rows: list[dict[str, Any]], version: int) -> None:
        conn, now = self.conn, time.time_ns() // 1_000_000
        conn.execute("BEGIN IMMEDIATE")
        if version == 0:
            conn.execute(
                "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at)"
                " VALUES (?, ?, 1, '{}', NULL, ?, ?)",
                (app, sid, now, now),
            )
        else:
            changed = conn.execute(
                "UPDATE sessions SET version = version + 1, updated_at = ?"
                " WHERE app_name = ? AND id = ? AND version = ?",
                (now, app, sid, version),
            ).rowcount
            assert changed == 1
        conn.executemany(
            "INSERT INTO events (app_name, session_id, event_id, version, seq, data) VALUES (?, ?, ?, ?, ?, ?)",
            [(app, sid, row["id"], version + 1, n, json.dumps(row)) for n, row in enumerate(rows)],
        )
        conn.execute("COMMIT")

    def load(self, app: str, sid: str) -> list[Any]:
        conn = self.conn
        conn.execute("BEGIN")
        conn.execute("SELECT version, scopes, created_at FROM sessions WHERE app_name = ? AND id = ?", (app, sid))
        rows = conn.execute(
            "SELECT data FROM events WHERE app_name = ? AND session_id = ? ORDER BY version, seq", (app, sid)
        ).fetchall()
        conn.execute("COMMIT")
        return [json.loads(data) for (data,) in rows]

    def list(self, app: str) -> list[Any]:
        return self.conn.execute(
            "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = ?"
            " ORDER BY updated_at DESC, id DESC",
            (app,),
        ).fetchall()


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = sqlite_store(path)
        floor = Floor(path)
        try:
            return store_workloads("sqlite", store, floor)
        finally:
            store.close()
            floor.conn.close()
