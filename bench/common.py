"""What every benchmark section shares: medians of repeated runs, and figures printed as ratios.

Each figure compares dormant with a *floor* measured in the same run (raw sqlite3, raw psycopg, a
full ledger replay, ...), so the ratio carries over between machines where absolute numbers do not.
``BENCH_QUICK=1`` shrinks every workload (a smoke run: the code works, the numbers mean little).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

QUICK = os.environ.get("BENCH_QUICK") == "1"


def scale(full: int, quick: int) -> int:
    return quick if QUICK else full


def median_seconds(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeat`` runs, after ``warmup`` discarded ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


@dataclass(frozen=True)
class Figure:
    """One measured ratio and its target.

    ``better`` says which way is good: ``"higher"`` (ratio must be >= target) or ``"lower"`` (<= target).
    """

    section: str
    name: str
    ours: str
    floor: str
    ratio: float
    target: float
    better: Literal["higher", "lower"]
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio >= self.target if self.better == "higher" else self.ratio <= self.target

    def line(self) -> str:
        sign = ">=" if self.better == "higher" else "<="
        verdict = "ok  " if self.ok else "MISS"
        return (
            f"  {verdict} {self.name:<44} {self.ratio:>9.2f}x (target {sign} {self.target:g}x)"
            f"   dormant {self.ours:<18} floor {self.floor}{'   ' + self.note if self.note else ''}"
        )


def per_second(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s"


def millis(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def micros(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"
