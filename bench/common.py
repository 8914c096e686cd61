"""What every benchmark section shares: paired medians of repeated runs, and figures printed as ratios.

Each figure compares dormant with a *floor* measured in the same run (raw sqlite3, raw psycopg, a
full ledger replay, ...), so the ratio carries over between machines where absolute numbers do not.
``BENCH_QUICK=1`` shrinks every workload (a smoke run: the code works, the numbers mean little).

A store's section (``bench/<store>.py``, listed in ``__main__.SECTIONS``) has a ``run() -> list[Figure]``
that skips itself, printing why, when its backend is missing. It builds a ``Floor`` — the raw client
doing the same writes and reads — and times both sides with ``paired`` (interleaved, warmed up). The
workloads and their figures are shared (``workloads.store_workloads`` runs W1, W2 and W4 on any store
and floor), so each store's section holds only what is its own: the server and the floor.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

QUICK = os.environ.get("BENCH_QUICK") == "1"


def scale(full: int, quick: int) -> int:
    return quick if QUICK else full


def paired(
    ours: Callable[[int], float], floor: Callable[[int], float], repeat: int, *, warmup: int = 1
) -> tuple[float, float]:
    """Medians of timed runs of dormant and its floor, alternating, after ``warmup`` discarded runs of each.

    Each callable gets the run number (fresh ids for fresh data) and returns the seconds it measured.
    Alternating puts both sides under the same machine load, which drifts on a shared machine; the side
    going first alternates too, so neither always meets the state the other leaves (a server's dirty
    buffers, a warm or cold CPU cache). A full garbage collection before each run keeps a collection of the
    benchmark's own heap (the workloads' events, held for the whole section) from landing inside whichever
    side happens to trigger it.
    """
    samples: dict[str, list[float]] = {"ours": [], "floor": []}
    for n in range(warmup + repeat):
        pair = (("ours", ours), ("floor", floor))
        for name, work in pair if n % 2 == 0 else pair[::-1]:
            gc.collect()
            elapsed = work(n)
            if n >= warmup:
                samples[name].append(elapsed)
    return statistics.median(samples["ours"]), statistics.median(samples["floor"])


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` took."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@dataclass(frozen=True)
class Figure:
    """One measured ratio and its target.

    ``better`` says which way is good: ``"higher"`` (ratio must be >= target), ``"lower"`` (<= target) or
    ``"within"`` (``|ratio - 1| <= target``: a figure that should match its floor, where a ratio far below it
    says as much as one above, e.g. something left unbilled).
    ``counted``: a ratio of counts (read units, bytes), the same on every run whatever the machine's load,
    so ``--check-counts`` fails on it; a time ratio swings with a shared machine, and is only printed.
    """

    section: str
    name: str
    ours: str
    floor: str
    ratio: float
    target: float
    better: Literal["higher", "lower", "within"]
    note: str = ""
    counted: bool = False

    @property
    def ok(self) -> bool:
        if self.better == "within":
            return abs(self.ratio - 1) <= self.target
        return self.ratio >= self.target if self.better == "higher" else self.ratio <= self.target

    def line(self) -> str:
        sign = ">=" if self.better == "higher" else "<="
        target = f"1 ± {self.target:g}x" if self.better == "within" else f"{sign} {self.target:g}x"
        verdict = "ok  " if self.ok else "MISS"
        return (
            f"  {verdict} {self.name:<50} {self.ratio:>9.2f}x (target {target})"
            f"   dormant {self.ours:<18} floor {self.floor}{'   ' + self.note if self.note else ''}"
        )


def cpu_timed(fn: Callable[[], object]) -> float:
    """CPU seconds this thread spent in one call of ``fn``: for work that does no I/O, on a shared machine."""
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def per_second(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s"


def millis(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def micros(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"
