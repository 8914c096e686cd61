"""The clock every timestamp in dormant comes from (event ``created_at``, session rows, listings).

One seam, so a test or a sweeper deciding what is stale can set the time instead of sleeping:
``frozen_clock(ms)`` stops it (``advance`` moves it on), ``use_clock(fn)`` installs any function. Both
are process-wide (every thread sees them) and restore the previous clock on exit. Durations such as a
model call's ``latency_ms`` are measured with ``time.perf_counter``, not with this clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import ConfigurationError

__all__ = ["FrozenClock", "frozen_clock", "now_ms", "system_ms", "use_clock"]


def system_ms() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000


_lock = threading.Lock()
_installed: list[Callable[[], int]] = [system_ms]  # the last one installed is in use


def now_ms() -> int:
    """Milliseconds since the epoch, from the clock in use."""
    return _installed[-1]()


@contextmanager
def use_clock(clock: Callable[[], int]) -> Iterator[None]:
    """Take timestamps from ``clock`` (a function returning epoch milliseconds) inside the block."""
    if not callable(clock):
        raise ConfigurationError(f"use_clock takes a function returning milliseconds, not {clock!r}")
    with _lock:
        _installed.append(clock)
    try:
        yield
    finally:
        with _lock:
            del _installed[len(_installed) - 1 - _installed[::-1].index(clock)]


class FrozenClock:
    """A clock that stands still until told to move."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` milliseconds on; return the new time."""
        self.ms += ms
        return self.ms


@contextmanager
def frozen_clock(ms: int) -> Iterator[FrozenClock]:
    """Stop the clock at ``ms`` (epoch milliseconds) inside the block; ``advance`` it to let time pass."""
    clock = FrozenClock(ms)
    with use_clock(clock):
        yield clock
