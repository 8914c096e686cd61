"""Ledger: reading derived state vs replaying the ledger, and append cost as the session grows."""

from __future__ import annotations

import statistics
import time
from typing import Any

from pydantic import BaseModel

from dormant import adk
from dormant.projection import Projection

from .common import Figure, micros, millis, scale

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
    reads = 2_000

    def read_state() -> None:
        state = session.state
        for _ in range(reads):
            _ = state.counter

    def replay() -> None:
        projection = Projection()
        for event in session.events:
            projection.apply(event)

    read_samples, replay_samples = [], []
    for _ in range(7):
        started = time.perf_counter()
        read_state()
        read_samples.append((time.perf_counter() - started) / reads)
        started = time.perf_counter()
        replay()
        replay_samples.append(time.perf_counter() - started)
    read, full = statistics.median(read_samples), statistics.median(replay_samples)

    # Append cost at 1k and at 10k events: fresh sessions each round, so every sample starts at the size.
    small = [_append_cost(_session(SMALL)) for _ in range(5)]
    large = [_append_cost(_session(SIZE)) for _ in range(5)]
    at_small, at_large = statistics.median(small), statistics.median(large)
    return [
        Figure(
            "ledger",
            f"state read vs full replay ({SIZE:,} events)",
            micros(read),
            f"replay {millis(full)}",
            full / read,
            100,
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
