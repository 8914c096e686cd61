"""Long sessions: a turn's cost on sessions of 100, 1,000 and 10,000 events; a new process's state read.

A turn is what a handler does: ``app.sessions.get``, ``app.run`` (an agent showing ``history(turns=3)``,
a scripted model that calls a state-writing tool, then answers: 12 events) and ``app.sessions.commit``.
Each session is built fast (the turns run in memory, committed in batches of about 2,000 events), then
WARMUP turns run on each (until a snapshot written after per-turn commits locates the history window:
right after a big batch the window is read from that batch's start), then the median of MEASURED turns
on each is taken. The sizes take turns, one turn each per round, so load on the shared machine weighs on
all alike; the sessions grow by those turns as they are measured.
Target: the 10,000-event turn costs at most 1.5x the 100-event turn, in time, and on DynamoDB in read
capacity units (``ReturnConsumedCapacity`` on every call, each call counted at no less than AWS's
minimum charge). Read units and bytes are counts, the same on every run: ``--check-counts`` fails on
them (CI runs the section so); the times are printed, never a failure.

The state read is what a new process does to read one value: open the store, build the app, ``get``,
read. Its floor is raw sqlite3 opening the file and reading one row that holds the state as JSON.
Target: at most 10x. Bytes on disk: W1 (200 turns of 5 events of ~1 KB, one commit each) through the
app, with and without snapshots. Target: at most 1.3x.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.session import Session
from dormant.stores.base import SessionStore
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter

from .common import QUICK, Figure, millis, scale
from .workloads import EVENT_BYTES, EVENTS_PER_TURN, TURNS

APP = "long"
SIZES = (100, 1_000, scale(10_000, 2_000))
WARMUP = 12
MEASURED = scale(25, 5)
BATCH = 2_000
EVENTS_A_TURN = 12


class Notes(BaseModel):
    count: int = 0
    last: str = ""


class Note(BaseModel):
    n: int


def build_app(store: SessionStore, snapshot_every: int | None = 100) -> tuple[App, Agent, MockAdapter]:
    model = MockAdapter()
    app = adk(
        name=APP, schema={"session": Notes}, adapters={"openai": model}, store=store, snapshot_every=snapshot_every
    )

    def note(ctx: Any) -> int:
        ctx.state.count = ctx.state.count + 1
        ctx.state.last = f"note {ctx.args.n}"
        return int(ctx.state.count)

    tool = app.tool(name="note", description="Note n.", schema=Note, execute=note)
    agent = app.agent(
        name="helper",
        model=openai("m"),
        context=[app.context.system("Note what you are told."), app.context.history(turns=3)],
        tools=[tool],
    )
    return app, agent, model


def play(app: App, agent: Agent, model: MockAdapter, session: Session, n: int) -> None:
    model.set_responses([{"tool_calls": [{"name": "note", "args": {"n": n}}]}, {"text": f"noted {n}"}])
    result = app.run(agent, f"note {n}", session=session)
    assert result.status == "completed", result.error


def grow(app: App, agent: Agent, model: MockAdapter, events: int) -> str:
    """A session of about ``events`` events, committed in batches of about BATCH events."""
    session = app.sessions.create()
    for n in range(events // EVENTS_A_TURN):
        play(app, agent, model, session, n)
        if len(session.uncommitted_events) >= BATCH:
            app.sessions.commit(session)
    app.sessions.commit(session)
    return session.id


def turn(app: App, agent: Agent, model: MockAdapter, sid: str, n: int) -> None:
    session = app.sessions.get(sid)
    assert session is not None
    play(app, agent, model, session, n)
    app.sessions.commit(session)


def turn_costs(
    app: App, agent: Agent, model: MockAdapter, sids: dict[int, str], meter: ReadMeter | None = None
) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds (and, with ``meter``, read units) of MEASURED turns on each session, after WARMUP ones.

    The sessions take turns, one turn each per round, so a busy spell on the shared machine weighs on
    every size alike instead of on whichever size was being measured then.
    """
    for n in range(WARMUP):
        for sid in sids.values():
            turn(app, agent, model, sid, 10**6 + n)
    times: dict[int, list[float]] = {size: [] for size in sids}
    units: dict[int, list[float]] = {size: [] for size in sids}
    for n in range(MEASURED):
        for size, sid in sids.items():
            if meter is not None:
                meter.units["read"] = 0.0
            started = time.perf_counter()
            turn(app, agent, model, sid, 2 * 10**6 + n)
            times[size].append(time.perf_counter() - started)
            if meter is not None:
                units[size].append(meter.units["read"])
    medians = {size: statistics.median(samples) for size, samples in times.items()}
    return medians, {size: statistics.median(samples) for size, samples in units.items() if samples}


def turn_figures(
    store: str,
    times: dict[int, float],
    unit: str = "time",
    show: Callable[[float], str] = millis,
    *,
    counted: bool = False,
) -> list[Figure]:
    small, large = times[SIZES[0]], times[SIZES[-1]]
    return [
        Figure(
            f"long/{store}",
            f"{store}: turn on {SIZES[-1]:,} vs {SIZES[0]:,} events, {unit}",
            show(large),
            show(small),
            large / small,
            1.5,
            "lower",
            f"{SIZES[1]:,} events: {show(times[SIZES[1]])}",
            counted=counted,
        )
    ]


# -- SQLite ---------------------------------------------------------------------------------------------


def _sqlite() -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.db"
        store = sqlite_store(path)
        app, agent, model = build_app(store)
        sids = {size: grow(app, agent, model, size) for size in SIZES}
        figures += turn_figures("sqlite", turn_costs(app, agent, model, sids)[0])
        store.close()
        figures += _state_read(path, sids[SIZES[-1]])
    figures.append(_w1_bytes())
    return figures


def _state_read(path: Path, sid: str) -> list[Figure]:
    """A new process reading one state value, against raw sqlite3 reading the state row.

    Twice: with the app's agent defined (its ``history(turns=3)`` makes ``get`` read that window too), and
    as a reader process that defines no agents (``get`` reads the snapshot and the events after it).
    """
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE IF NOT EXISTS floor_state (id TEXT PRIMARY KEY, data TEXT NOT NULL)")
        store = sqlite_store(path)
        app, _, _ = build_app(store)
        session = app.sessions.get(sid)
        assert session is not None
        expected, state = session.state.count, json.dumps(session.projection.session_state)
        store.close()
        conn.execute("INSERT OR REPLACE INTO floor_state VALUES (?, ?)", (sid, state))

    def reader(agents: bool) -> Callable[[], int]:
        def read() -> int:
            store = sqlite_store(path)
            try:
                app = build_app(store)[0] if agents else adk(name=APP, schema={"session": Notes}, store=store)
                session = app.sessions.get(sid)
                assert session is not None
                return int(session.state.count)
            finally:
                store.close()

        return read

    def floor() -> int:
        conn = sqlite3.connect(path)
        try:
            (data,) = conn.execute("SELECT data FROM floor_state WHERE id = ?", (sid,)).fetchone()
            return int(json.loads(data)["count"])
        finally:
            conn.close()

    figures = []
    for agents, label in ((True, "app with its agent"), (False, "reader app, no agents")):
        ours = reader(agents)
        assert ours() == floor() == expected
        mine, raw = _paired(ours, floor, scale(41, 9))
        name = f"sqlite: state read, new process, {SIZES[-1]:,}+ events ({label})"
        figures.append(Figure("long/sqlite", name, millis(mine), millis(raw), mine / raw, 10, "lower"))
    return figures


def _paired(ours: Callable[[], object], floor: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Medians of ``ours`` and ``floor`` run in turns, so a busy machine weighs on both alike."""
    samples: dict[Callable[[], object], list[float]] = {ours: [], floor: []}
    for _ in range(repeat):
        for fn, times in samples.items():
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(samples[ours]), statistics.median(samples[floor])


def _w1_bytes() -> Figure:
    """W1 through the app on a SQLite file, with snapshots (the default) and without."""
    text = ("lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20)[: EVENT_BYTES - 110]
    sizes: dict[bool, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for snapshots in (True, False):
            path = Path(tmp) / f"w1-{snapshots}.db"
            store = sqlite_store(path)
            app, _, _ = build_app(store, snapshot_every=100 if snapshots else None)
            session = app.sessions.create()
            for _ in range(TURNS):
                for _ in range(EVENTS_PER_TURN):
                    session.input.message(text)
                app.sessions.commit(session)
            assert (store.load_snapshot(APP, session.id) is not None) == snapshots
            store.close()  # the last connection checkpoints the WAL into the file
            sizes[snapshots] = sum(p.stat().st_size for p in Path(tmp).glob(f"w1-{snapshots}.db*"))
    return Figure(
        "long/sqlite",
        "sqlite: W1 bytes on disk, snapshots vs none",
        f"{sizes[True]:,} B",
        f"{sizes[False]:,} B",
        sizes[True] / sizes[False],
        1.3,
        "lower",
        counted=True,
    )


# -- Postgres -------------------------------------------------------------------------------------------


def _postgres() -> list[Figure]:
    try:
        from dormant.stores.postgres import postgres_store
        from tests.support.servers.postgres import throwaway_schema

        from .postgres import _server
    except ImportError as exc:
        _skip("postgres", exc)
        return []
    with _server() as server, throwaway_schema(server, "dormant_bench_") as url:
        store = postgres_store(url)
        try:
            app, agent, model = build_app(store)
            sids = {size: grow(app, agent, model, size) for size in SIZES}
            times = turn_costs(app, agent, model, sids)[0]
        finally:
            store.close()
    return turn_figures("postgres", times)


# -- DynamoDB Local ---------------------------------------------------------------------------------------


class ReadMeter:
    """Read capacity units of every call a client makes (``ReturnConsumedCapacity=TOTAL`` added to reads).

    DynamoDB bills a ``GetItem`` or ``Query`` at least 1 unit (strongly consistent) or 0.5 (eventually),
    even when it finds nothing; DynamoDB Local reports 0 for an empty ``Query``, so each call is counted at
    no less than that minimum (an id lookup that finds no stored id costs its unit here as on AWS).
    """

    READS = frozenset({"GetItem", "Query", "BatchGetItem", "Scan", "TransactGetItems"})
    SINGLE = frozenset({"GetItem", "Query", "Scan"})

    def __init__(self, client: Any) -> None:
        self.units: defaultdict[str, float] = defaultdict(float)
        self._consistent = False
        client.meta.events.register("before-parameter-build.dynamodb", self._params)
        client.meta.events.register("after-call.dynamodb", self._answer)

    def _params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in self.READS:
            params["ReturnConsumedCapacity"] = "TOTAL"
            self._consistent = bool(params.get("ConsistentRead"))

    def _answer(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in self.READS:
            consumed = parsed.get("ConsumedCapacity") or []
            units = sum(
                entry.get("CapacityUnits", 0.0) for entry in (consumed if isinstance(consumed, list) else [consumed])
            )
            if model.name in self.SINGLE:
                units = max(units, 1.0 if self._consistent else 0.5)
            self.units["read"] += units


@contextlib.contextmanager
def _dynamodb() -> Iterator[tuple[Any, Any]]:
    from dormant.stores.dynamodb import create_table, dynamo_store
    from tests.support.servers.dynamodb import client

    from .dynamodb import _endpoint

    with _endpoint() as endpoint:
        table = f"dormant-long-{uuid.uuid4().hex[:8]}"
        ddb = client(endpoint)
        try:
            create_table(table, client=ddb)
            meter = ReadMeter(ddb)
            yield dynamo_store(table, client=ddb), meter
        finally:
            with contextlib.suppress(Exception):
                ddb.delete_table(TableName=table)
            ddb.close()


def _dynamo() -> list[Figure]:
    try:
        from tests.support.servers.dynamodb import LocalUnavailable
    except ImportError as exc:
        _skip("dynamodb", exc)
        return []
    try:
        with _dynamodb() as (store, meter):
            app, agent, model = build_app(store)
            sids = {size: grow(app, agent, model, size) for size in SIZES}
            times, units = turn_costs(app, agent, model, sids, meter)
    except LocalUnavailable as exc:
        _skip("dynamodb", exc)
        return []
    return [
        *turn_figures("dynamodb", times),
        *turn_figures("dynamodb", units, "read units", lambda u: f"{u:g} RCU", counted=True),
    ]


def _skip(backend: str, why: object) -> None:
    """Print why a store is left out, or stop when ``DORMANT_REQUIRE_BACKENDS`` names it (CI: a gate that
    silently measured nothing would pass)."""
    if backend in os.environ.get("DORMANT_REQUIRE_BACKENDS", "").split(","):
        raise SystemExit(f"long-session bench: {backend} is required (DORMANT_REQUIRE_BACKENDS) but unavailable: {why}")
    print(f"  skipped {backend}: {why}")


def run() -> list[Figure]:
    figures = _sqlite()
    if os.environ.get("BENCH_LONG_SKIP_POSTGRES") != "1":
        figures += _postgres()
    figures += _dynamo()
    if QUICK:
        print("  (BENCH_QUICK: the largest session is 2,000 events)")
    return figures
