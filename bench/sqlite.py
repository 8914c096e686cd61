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

from pydantic import BaseModel

from dormant import adk
from dormant.stores.sqlite import sqlite_store

from .common import Figure, micros, paired, per_second, scale, timed
from .workloads import EVENTS_PER_TURN, REPEAT, TURNS, _meta, event, store_workloads, turns


class Floor:
    """Raw sqlite3: the statements a correct store needs at the least."""

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")

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


class Tally(BaseModel):
    count: int = 0
    last: str = ""


W3_READS = scale(500, 50)
W3_TURNS = TURNS + 9
"""Turns in W3's session: its ledger (5 events a turn) ends 45 events past a multiple of 100, where a store
that snapshots only every 100 events keeps its last snapshot."""


def state_read(store: Any, floor: Floor) -> Figure:
    """W3: read one state value of a session loaded afresh (``app.sessions.get``), after W3_TURNS turns of 5
    events and one state change, one commit each; the floor reads the one row that holds the state as JSON."""
    app = adk(name="w3", schema={"session": Tally}, store=store)  # not closed: it would close the store
    session = app.sessions.create()
    for t in range(W3_TURNS):
        for n in range(EVENTS_PER_TURN):
            session.append(event(t * EVENTS_PER_TURN + n, "w3-"))
        session.state.count = t + 1
        app.sessions.commit(session)
    floor.conn.execute(
        "CREATE TABLE IF NOT EXISTS floor_state (app_name TEXT, id TEXT, data TEXT, PRIMARY KEY (app_name, id))"
    )
    floor.conn.execute(
        "INSERT OR REPLACE INTO floor_state VALUES (?, ?, ?)",
        ("w3", session.id, json.dumps(session.projection.session_state)),
    )
    sid = session.id

    def ours() -> int:
        loaded = app.sessions.get(sid)
        assert loaded is not None
        return int(loaded.state.count)

    def raw() -> int:
        (data,) = floor.conn.execute(
            "SELECT data FROM floor_state WHERE app_name = ? AND id = ?", ("w3", sid)
        ).fetchone()
        return int(json.loads(data)["count"])

    assert ours() == raw() == W3_TURNS

    def many(read: Any) -> Any:
        return lambda _: timed(lambda: [read() for _ in range(W3_READS)])

    mine, floor_time = paired(many(ours), many(raw), REPEAT)
    return Figure(
        "sqlite",
        f"W3 state read, session of {W3_TURNS * EVENTS_PER_TURN:,} events, time",
        micros(mine / W3_READS),
        micros(floor_time / W3_READS),
        mine / floor_time,
        3,
        "lower",
    )


def w1_normal(path: Path) -> Figure:
    """W1 with ``synchronous=NORMAL`` on both sides: no fsync per commit, so the ratio is the CPU's."""
    store, floor = sqlite_store(path, synchronous="NORMAL"), Floor(path, "NORMAL")
    batches = turns()
    rows = [[e.model_dump(mode="json") for e in batch] for batch in batches]
    try:

        def ours(n: int) -> float:
            return timed(lambda: [store.commit(_meta(f"n-ours-{n}", "w1", v), b, v) for v, b in enumerate(batches)])

        def raw(n: int) -> float:
            return timed(lambda: [floor.commit(f"n-floor-{n}", "w1", b, v) for v, b in enumerate(rows)])

        mine, floor_time = paired(ours, raw, REPEAT)
    finally:
        store.close()
        floor.conn.close()
    return Figure(
        "sqlite",
        "W1 commits, synchronous=NORMAL, throughput",
        per_second(TURNS, mine),
        per_second(TURNS, floor_time),
        floor_time / mine,
        0.7,
        "higher",
    )


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = sqlite_store(path)
        floor = Floor(path)
        try:
            return [
                *store_workloads("sqlite", store, floor),
                w1_normal(Path(tmp) / "normal.db"),
                state_read(store, floor),
            ]
        finally:
            store.close()
            floor.conn.close()
