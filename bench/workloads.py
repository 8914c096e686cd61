"""The store workloads (issue 4 and 5 name them W1, W2, W4), shared by every store's section.

W1  one session, TURNS turns of 5 events of ~1 KB each, one commit per turn.
W2  load a 1,000-event and a 10,000-event session: ``store.load``, and what a user pays,
    ``app.sessions.get`` (the load plus the fold of every event into the session's state).
W4  create W4_SESSIONS sessions of 10 events (one commit each), then list them.

A store's floor runs the same statements through the raw driver: the same DDL, one transaction per
commit (version-checked UPDATE of the row, multi-row insert of the events), and on load the same
SELECTs with ``json.loads`` of each row — what any correct code must do at least.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

from dormant import adk
from dormant.events import UserEvent
from dormant.stores.base import SessionStore, StoredSession

from .common import QUICK, Figure, millis, paired, per_second, scale, timed

TURNS = scale(200, 20)
EVENTS_PER_TURN = 5
EVENT_BYTES = 1024
LOAD_SIZES = (scale(1_000, 100), scale(10_000, 1_000))
W4_SESSIONS = scale(2_000, 100)
W4_EVENTS = 10

_FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20


def event(n: int, prefix: str = "e") -> UserEvent:
    """A user event of about EVENT_BYTES bytes of JSON."""
    return UserEvent(id=f"{prefix}{n:08d}", created_at=1_700_000_000_000 + n, text=_FILLER[: EVENT_BYTES - 110])


def turns(prefix: str = "e") -> list[list[UserEvent]]:
    return [[event(t * EVENTS_PER_TURN + i, prefix) for i in range(EVENTS_PER_TURN)] for t in range(TURNS)]


def events(count: int, prefix: str = "e") -> list[UserEvent]:
    return [event(n, prefix) for n in range(count)]


REPEAT = 3 if QUICK else 7


class Floor(Protocol):
    """The raw client doing what the store must do at least, on the same tables or items."""

    def commit(self, app: str, sid: str, rows: list[dict[str, Any]], version: int) -> None:
        """Store ``rows`` (events as JSON-ready dicts) as version ``version + 1``; ``version=0`` creates."""

    def load(self, app: str, sid: str) -> list[Any]:
        """The row and the events, each ``json.loads``-ed; returns the events."""

    def list(self, app: str) -> list[Any]:
        """The app's rows, most recently updated first."""


def _row(app: str, sid: str, version: int = 0) -> StoredSession:
    return StoredSession(id=sid, app_name=app, version=version, created_at=1)


@dataclass(frozen=True)
class Targets:
    """A store's targets: ratios against its floor (issues 4 and 5 set the defaults)."""

    w1: float = 0.5
    w2: float = 2
    w4_create: float = 0.5
    w4_list: float = 2


SQL_TARGETS = Targets(w1=0.8, w2=1.5, w4_create=0.8, w4_list=2)
"""Issue 26's, for the SQL stores: W1 >= 0.8x, W2 <= 1.5x, W4 create >= 0.8x, list <= 2x."""


def store_workloads(
    section: str,
    store: SessionStore,
    floor: Floor,
    *,
    repeat: int = REPEAT,
    create_repeat: int | None = None,
    w1_target: float | None = None,
    w1_interleaved: bool = False,
    targets: Targets = Targets(),
) -> list[Figure]:
    """Run W1, W2 and W4 on ``store`` and ``floor`` (paired, fresh app ids each run); return the figures.

    ``repeat`` (and ``create_repeat`` for W4's creates) shrink the runs for a slow engine (DynamoDB Local);
    ``w1_interleaved`` pairs W1 commit by commit instead of run by run (for an engine whose latency drifts).
    Each side gets its input ready before its clock starts: the floor its rows as dicts, the store its events
    and its rows' metadata (``StoredSession``), so each side times the commit alone.
    """
    batches = turns()
    rows = [[e.model_dump(mode="json") for e in batch] for batch in batches]

    def w1_ours(n: int) -> float:
        session_rows = [_row(f"w1-ours-{n}", "w1", version) for version in range(len(batches))]

        def work() -> None:
            for version, batch in enumerate(batches):
                assert store.commit(session_rows[version], batch, version).ok

        return timed(work)

    def w1_floor(n: int) -> float:
        def work() -> None:
            for version, batch in enumerate(rows):
                floor.commit(f"w1-floor-{n}", "w1", batch, version)

        return timed(work)

    def w1_interleaved(n: int) -> tuple[float, float]:
        """One run of both sides commit by commit (the side going first alternating): on an engine whose
        latency drifts with the machine's load (DynamoDB Local's JVM), each pair meets the same moment."""
        session_rows = [_row(f"w1-ours-{n}", "w1", version) for version in range(len(batches))]
        spent = [0.0, 0.0]
        for version, (batch, row) in enumerate(zip(batches, rows, strict=True)):
            for side in (0, 1) if version % 2 == 0 else (1, 0):
                started = time.perf_counter()
                if side == 0:
                    assert store.commit(session_rows[version], batch, version).ok
                else:
                    floor.commit(f"w1-floor-{n}", "w1", row, version)
                spent[side] += time.perf_counter() - started
        return spent[0], spent[1]

    if w1_interleaved:
        runs = [w1_interleaved(n) for n in range(1 + repeat)][1:]  # the first run warms both sides up
        w1 = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
    else:
        w1 = paired(w1_ours, w1_floor, repeat)

    users = adk(name="w2", store=store)  # not closed: closing the app would close the section's store
    w2: dict[int, tuple[float, float]] = {}
    w2_get: dict[int, tuple[float, float]] = {}
    for size in LOAD_SIZES:
        sid = f"w2-{size}"
        assert store.commit(_row("w2", sid), events(size), 0).ok
        assert len(floor.load("w2", sid)) == size
        session = users.sessions.get(sid)
        assert session is not None and len(session.events) == size

        def w2_load(_: int, sid: str = sid) -> float:
            return timed(lambda: store.load("w2", sid))

        def w2_users(_: int, sid: str = sid) -> float:
            return timed(lambda: users.sessions.get(sid))

        def w2_floor(_: int, sid: str = sid) -> float:
            return timed(lambda: floor.load("w2", sid))

        w2[size] = paired(w2_load, w2_floor, repeat)
        w2_get[size] = paired(w2_users, w2_floor, repeat)

    batch_events = [events(W4_EVENTS, f"s{n}-") for n in range(W4_SESSIONS)]
    batch_rows = [[e.model_dump(mode="json") for e in batch] for batch in batch_events]

    def w4_ours(n: int) -> float:
        session_rows = [_row(f"w4-ours-{n}", f"s{s}") for s in range(len(batch_events))]

        def work() -> None:
            for s, batch in enumerate(batch_events):
                assert store.commit(session_rows[s], batch, 0).ok

        return timed(work)

    def w4_floor(n: int) -> float:
        def work() -> None:
            for s, batch in enumerate(batch_rows):
                floor.commit(f"w4-floor-{n}", f"s{s}", batch, 0)

        return timed(work)

    w4_create = paired(w4_ours, w4_floor, create_repeat or (3 if QUICK else 5))
    # Both list the same app's sessions (the store made them: the listing is the store's own data).
    assert len(store.list("w4-ours-1")) == len(floor.list("w4-ours-1")) == W4_SESSIONS
    w4_list = paired(
        lambda _: timed(lambda: store.list("w4-ours-1")), lambda _: timed(lambda: floor.list("w4-ours-1")), repeat
    )
    figures = store_figures(section, w1=w1, w2=w2, w2_get=w2_get, w4_create=w4_create, w4_list=w4_list, targets=targets)
    if w1_target is not None:
        figures[0] = dataclasses.replace(figures[0], target=w1_target)
    return figures


def _rate(section: str, name: str, count: int, seconds: tuple[float, float], target: float) -> Figure:
    """A throughput figure: ``count`` operations in (dormant, floor) seconds; the ratio is dormant's rate over the
    floor's."""
    ours, raw = seconds
    return Figure(section, name, per_second(count, ours), per_second(count, raw), raw / ours, target, "higher")


def _time(section: str, name: str, seconds: tuple[float, float], target: float) -> Figure:
    """A time figure: (dormant, floor) seconds; the ratio is dormant's time over the floor's."""
    ours, raw = seconds
    return Figure(section, name, millis(ours), millis(raw), ours / raw, target, "lower")


def store_figures(
    section: str,
    *,
    w1: tuple[float, float],
    w2: dict[int, tuple[float, float]],
    w2_get: dict[int, tuple[float, float]] | None = None,
    w4_create: tuple[float, float],
    w4_list: tuple[float, float],
    targets: Targets = Targets(),
) -> list[Figure]:
    """Every store's figures from (dormant, floor) seconds, against ``targets`` (issues 4 and 5's by default)."""
    return [
        _rate(section, f"W1 commits ({TURNS} turns x {EVENTS_PER_TURN} x 1 KB) throughput", TURNS, w1, targets.w1),
        *(_time(section, f"W2 store.load {size:,} events, time", both, targets.w2) for size, both in w2.items()),
        *(
            _time(section, f"W2 sessions.get {size:,} events (load + fold), time", both, targets.w2)
            for size, both in (w2_get or {}).items()
        ),
        _rate(
            section,
            f"W4 create {W4_SESSIONS:,} sessions x {W4_EVENTS} events",
            W4_SESSIONS,
            w4_create,
            targets.w4_create,
        ),
        _time(section, f"W4 list {W4_SESSIONS:,} sessions, time", w4_list, targets.w4_list),
    ]
