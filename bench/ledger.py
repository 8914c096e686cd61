"""Ledger: a load's fold and first state read vs a bare replay, and append cost as the session grows.

Reading state from a loaded session is a dict lookup, but every load folds the whole ledger first
(``sessions.get`` builds the session's projection from its events): that fold is what a state read
costs a caller who has just loaded the session, so it is measured, against a bare ``Projection`` replay.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from pydantic import BaseModel

from dormant import Session, adk
from dormant.projection import Projection

from .common import Figure, micros, millis, paired, scale, timed

SIZE = scale(10_000, 2_000)
SMALL = scale(1_000, 200)
APPENDS = 200


class Chart(BaseModel):
    stage: str = "intake"
    counter: int = 0
    notes: list[str] = []


def _session(events: int) -> Any:
    """A session of ``events`` events: state writes (each one event) and user messages, alternating."""
    app = adk(name="bench-ledger", schema={"session": Chart})
    session = app.sessions.ephemeral()
    for n in range(events):
        if n % 2:
            session.state.counter = n
        else:
            session.input.message(f"message {n}")
    return session


def _append_cost(session: Any) -> float:
    """Seconds per append, over APPENDS state writes onto ``session``."""
    start = session.state.counter
    started = time.perf_counter()
    for n in range(APPENDS):
        session.state.counter = start + n + 1
    return (time.perf_counter() - started) / APPENDS


def run() -> list[Figure]:
    session = _session(SIZE)
    app, events = session.runtime, list(session.events)

    def load_then_read() -> None:
        """What a load costs before its first state read: the fold of every event (as ``sessions.get`` does)."""
        loaded = Session(app, session_id=session.id, version=1, events=events)
        _ = loaded.state.counter

    def replay_then_read() -> None:
        """The least any reader of an event ledger does: one bare replay, then a lookup."""
        projection = Projection()
        for event in events:
            projection.apply(event)
        _ = projection.session_state["counter"]

    ours, floor = paired(lambda _: timed(load_then_read), lambda _: timed(replay_then_read), 7)

    # Append cost at 1k and at 10k events: fresh sessions each round, so every sample starts at the size.
    small = [_append_cost(_session(SMALL)) for _ in range(5)]
    large = [_append_cost(_session(SIZE)) for _ in range(5)]
    at_small, at_large = statistics.median(small), statistics.median(large)
    return [
        Figure(
            "ledger",
            f"load's fold + state read vs bare replay ({SIZE:,} ev)",
            millis(ours),
            f"replay {millis(floor)}",
            floor / ours,
            0.5,
            "higher",
        ),
        Figure(
            "ledger",
            f"append cost at {SIZE:,} vs at {SMALL:,} events",
            micros(at_large),
            f"at {SMALL:,}: {micros(at_small)}",
            at_large / at_small,
            1.5,
            "lower",
        ),
    ]
