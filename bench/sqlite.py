"""SQLite store vs raw sqlite3 running the same statements (W1 commits, W2 loads, W4 create + list)."""

from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from dormant.stores.base import StoredSession
from dormant.stores.sqlite import DDL, sqlite_store

from .common import Figure, median_seconds
from .workloads import LOAD_SIZES, W4_EVENTS, W4_SESSIONS, events, store_figures, turns

APP = "bench"


class Floor:
    """Raw sqlite3: the same DDL, pragmas and statements a correct store needs at the least."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(DDL)

    def create(self, sid: str, rows: list[dict[str, Any]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        now = time.time_ns() // 1_000_000
        conn.execute(
            "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at)"
            " VALUES (?, ?, 1, '{}', NULL, ?, ?)",
            (APP, sid, now, now),
        )
        conn.executemany(
            "INSERT INTO events (app_name, session_id, event_id, version, seq, data) VALUES (?, ?, ?, 1, ?, ?)",
            [(APP, sid, row["id"], n, json.dumps(row)) for n, row in enumerate(rows)],
        )
        conn.execute("COMMIT")

    def commit(self, sid: str, rows: list[dict[str, Any]], version: int) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (app_name, session_id, event_id, version, seq, data) VALUES (?, ?, ?, ?, ?, ?)",
            [(APP, sid, row["id"], version + 1, n, json.dumps(row)) for n, row in enumerate(rows)],
        )
        changed = conn.execute(
            "UPDATE sessions SET version = version + 1, updated_at = ? WHERE app_name = ? AND id = ? AND version = ?",
            (time.time_ns() // 1_000_000, APP, sid, version),
        ).rowcount
        assert changed == 1
        conn.execute("COMMIT")

    def load(self, sid: str) -> list[Any]:
        conn = self.conn
        conn.execute("BEGIN")
        conn.execute("SELECT version, scopes, created_at FROM sessions WHERE app_name = ? AND id = ?", (APP, sid))
        rows = conn.execute(
            "SELECT data FROM events WHERE app_name = ? AND session_id = ? ORDER BY version, seq", (APP, sid)
        ).fetchall()
        conn.execute("COMMIT")
        return [json.loads(data) for (data,) in rows]

    def list(self) -> list[Any]:
        return self.conn.execute(
            "SELECT id, updated_at, created_at, version, status FROM sessions WHERE app_name = ?"
            " ORDER BY updated_at DESC, id DESC",
            (APP,),
        ).fetchall()


def _meta(sid: str, version: int = 0) -> StoredSession:
    return StoredSession(id=sid, app_name=APP, version=version, created_at=1)


def _fresh(work: Callable[[Path], float], repeat: int) -> float:
    """Median of ``work`` on a fresh database file each time."""
    samples = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            samples.append(work(Path(tmp) / "bench.db"))
    return statistics.median(samples)


def run() -> list[Figure]:
    batches = turns()
    rows = [[e.model_dump(mode="json") for e in batch] for batch in batches]

    def w1_store(path: Path) -> float:
        store = sqlite_store(path)
        store.commit(_meta("w1"), [], 0)
        started = time.perf_counter()
        for version, batch in enumerate(batches, start=1):
            assert store.commit(_meta("w1", version), batch, version).ok
        elapsed = time.perf_counter() - started
        store.close()
        return elapsed

    def w1_floor(path: Path) -> float:
        floor = Floor(path)
        floor.create("w1", [])
        started = time.perf_counter()
        for version, batch in enumerate(rows, start=1):
            floor.commit("w1", batch, version)
        elapsed = time.perf_counter() - started
        floor.conn.close()
        return elapsed

    w1 = _fresh(w1_store, 5), _fresh(w1_floor, 5)
    w2: dict[int, tuple[float, float]] = {}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w2.db"
        store, floor = sqlite_store(path), Floor(path)
        for size in LOAD_SIZES:
            sid = f"w2-{size}"
            store.commit(_meta(sid), events(size), 0)
            w2[size] = (
                median_seconds(partial(store.load, APP, sid), repeat=7),
                median_seconds(partial(floor.load, sid), repeat=7),
            )
        store.close()
        floor.conn.close()

    batch_rows = [[e.model_dump(mode="json") for e in events(W4_EVENTS, f"s{n}-")] for n in range(W4_SESSIONS)]
    batch_events = [events(W4_EVENTS, f"s{n}-") for n in range(W4_SESSIONS)]
    list_times: dict[str, list[float]] = {"ours": [], "floor": []}

    def w4_store(path: Path) -> float:
        store = sqlite_store(path)
        started = time.perf_counter()
        for n, batch in enumerate(batch_events):
            store.commit(_meta(f"s{n}"), batch, 0)
        elapsed = time.perf_counter() - started
        list_times["ours"].append(median_seconds(lambda: store.list(APP), repeat=5))
        assert len(store.list(APP)) == W4_SESSIONS
        store.close()
        return elapsed

    def w4_floor(path: Path) -> float:
        floor = Floor(path)
        started = time.perf_counter()
        for n, batch in enumerate(batch_rows):
            floor.create(f"s{n}", batch)
        elapsed = time.perf_counter() - started
        list_times["floor"].append(median_seconds(floor.list, repeat=5))
        floor.conn.close()
        return elapsed

    return store_figures(
        "sqlite",
        w1=w1,
        w2=w2,
        w4_create=(_fresh(w4_store, 3), _fresh(w4_floor, 3)),
        w4_list=(statistics.median(list_times["ours"]), statistics.median(list_times["floor"])),
    )
