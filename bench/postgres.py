"""Postgres store vs raw psycopg running the same statements on one server (W1 commits, W2 loads, W4 create + list).

The server is ``TEST_DATABASE_URL`` when set, else a throwaway cluster (``tests.servers.postgres``) with
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
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from dormant.stores.base import StoredSession

from .common import QUICK, Figure
from .workloads import LOAD_SIZES, W4_EVENTS, W4_SESSIONS, events, store_figures, turns

APP = "bench"
REPEAT = 3 if QUICK else 7


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


def _meta(app: str, sid: str, version: int = 0) -> StoredSession:
    return StoredSession(id=sid, app_name=app, version=version, created_at=1)


def _paired(ours: Callable[[int], float], floor: Callable[[int], float], repeat: int) -> tuple[float, float]:
    """Medians of timed runs, dormant and floor alternating (run ``n`` gets fresh ids), after one warm-up each."""
    samples: dict[str, list[float]] = {"ours": [], "floor": []}
    for n in range(repeat + 1):
        for name, work in (("ours", ours), ("floor", floor)):
            elapsed = work(n)
            if n:
                samples[name].append(elapsed)
    return statistics.median(samples["ours"]), statistics.median(samples["floor"])


@contextlib.contextmanager
def _server() -> Iterator[str]:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    from tests.servers.postgres import throwaway_postgres

    with throwaway_postgres(durable=os.environ.get("BENCH_PG_DURABLE") == "1") as started:
        yield started


@contextlib.contextmanager
def _schema(url: str) -> Iterator[str]:
    """A schema for this run; the URL returned puts it first on the search_path."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"dormant_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield make_conninfo(url, options=f"-c search_path={schema}")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def run() -> list[Figure]:
    try:
        import psycopg

        from dormant.errors import DormantError
        from dormant.stores.postgres import postgres_store
    except ImportError as exc:
        print(f"  skipped: the Postgres store needs psycopg (pip install 'dormant[postgres]'): {exc}")
        return []
    try:
        with _server() as server, _schema(server) as url:
            store, floor = postgres_store(url), Floor(url)
            try:
                return _measure(store, floor)
            finally:
                store.close()
                floor.conn.close()
    except (DormantError, psycopg.OperationalError) as exc:
        print(f"  skipped: no PostgreSQL server to measure against ({exc})")
        return []


def _measure(store: Any, floor: Floor) -> list[Figure]:
    batches = turns()
    rows = [[e.model_dump(mode="json") for e in batch] for batch in batches]

    def w1_ours(n: int) -> float:
        app = f"w1-ours-{n}"
        started = time.perf_counter()
        for version, batch in enumerate(batches):
            assert store.commit(_meta(app, "w1", version), batch, version).ok
        return time.perf_counter() - started

    def w1_floor(n: int) -> float:
        app = f"w1-floor-{n}"
        started = time.perf_counter()
        for version, batch in enumerate(rows):
            floor.commit(app, "w1", batch, version)
        return time.perf_counter() - started

    w1 = _paired(w1_ours, w1_floor, REPEAT)
    w2: dict[int, tuple[float, float]] = {}

    for size in LOAD_SIZES:
        sid = f"w2-{size}"
        assert store.commit(_meta(APP, sid), events(size), 0).ok
        assert len(floor.load(APP, sid)) == size

        def w2_ours(_: int, sid: str = sid) -> float:
            started = time.perf_counter()
            store.load(APP, sid)
            return time.perf_counter() - started

        def w2_floor(_: int, sid: str = sid) -> float:
            started = time.perf_counter()
            floor.load(APP, sid)
            return time.perf_counter() - started

        w2[size] = _paired(w2_ours, w2_floor, REPEAT)

    batch_events = [events(W4_EVENTS, f"s{n}-") for n in range(W4_SESSIONS)]
    batch_rows = [[e.model_dump(mode="json") for e in batch] for batch in batch_events]

    def w4_ours(n: int) -> float:
        app = f"w4-ours-{n}"
        started = time.perf_counter()
        for s, batch in enumerate(batch_events):
            assert store.commit(_meta(app, f"s{s}"), batch, 0).ok
        return time.perf_counter() - started

    def w4_floor(n: int) -> float:
        app = f"w4-floor-{n}"
        started = time.perf_counter()
        for s, batch in enumerate(batch_rows):
            floor.commit(app, f"s{s}", batch, 0)
        return time.perf_counter() - started

    create_ours, create_raw = _paired(w4_ours, w4_floor, 3 if QUICK else 5)
    # Both list the same app's sessions (the store made them: the listing is the store's own data).
    assert len(store.list("w4-ours-1")) == len(floor.list("w4-ours-1")) == W4_SESSIONS

    def w4_list_ours(_: int) -> float:
        started = time.perf_counter()
        store.list("w4-ours-1")
        return time.perf_counter() - started

    def w4_list_floor(_: int) -> float:
        started = time.perf_counter()
        floor.list("w4-ours-1")
        return time.perf_counter() - started

    return store_figures(
        "postgres",
        w1=w1,
        w2=w2,
        w4_create=(create_ours, create_raw),
        w4_list=_paired(w4_list_ours, w4_list_floor, REPEAT),
    )
