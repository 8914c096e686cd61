"""Ids (and ``now_ms``, re-exported from ``dormant.clock``, where every timestamp comes from).

Ids end up inside storage keys (``S#{app}#{session}`` on DynamoDB), so they are restricted to a
character set that can never collide with a key separator: letters, digits and ``_ . : @ + = -``.

``new_id`` mints 32 hex digits that sort in the order they were made: the time in milliseconds and a
counter (strictly increasing within a process), then 60 random bits. A store can then tell an event
id it has never seen without reading the history: one greater than every id it holds is new
(the DynamoDB store's id filter keeps that greatest id). Order is only a speed-up; nothing relies on
it for correctness, and ids from other processes (other clocks) or from callers may come in any order.
"""

from __future__ import annotations

import re
import secrets
import threading
import time

from .clock import now_ms
from .errors import InvalidSessionId

__all__ = ["ID_PATTERN", "MAX_ID_LENGTH", "check_id", "new_id", "now_ms"]

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]*")
ID_PATTERN = f"^{_ID.pattern}$"
"""What ``check_id`` accepts, as a JSON-schema pattern (with ``MAX_ID_LENGTH``): the API document states it."""


_COUNTER_BITS = 20  # ids a millisecond before the counter borrows from the next one


class _Stamps:
    """Time in milliseconds and a counter, as one int: each greater than the one before, in this process."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(time.time_ns() // 1_000_000 << _COUNTER_BITS, self._last + 1)
            return self._last


_stamps = _Stamps()


def new_id(prefix: str = "") -> str:
    """A fresh id: 68 bits of time and counter, 60 random bits, as 32 hex digits (after ``prefix``).

    The system clock, not ``now_ms``: a clock frozen or set back by a test must not make ids repeat an order.
    """
    return f"{prefix}{_stamps.next():017x}{secrets.randbits(60):015x}"


def check_id(value: object, what: str = "session id") -> str:
    """Return ``value`` if it is a usable id, else raise ``InvalidSessionId`` saying why."""
    if not isinstance(value, str):
        raise InvalidSessionId(f"{what} must be a string, not {type(value).__name__}", field=_field(what))
    if not value or len(value) > MAX_ID_LENGTH:
        raise InvalidSessionId(
            f"{what} must be 1 to {MAX_ID_LENGTH} characters long (got {len(value)})", field=_field(what)
        )
    if not _ID.fullmatch(value):
        raise InvalidSessionId(
            f"{what} {value!r} may only hold letters, digits and _ . : @ + = - (and must start with a letter or digit)",
            field=_field(what),
        )
    return value


def _field(what: str) -> str:
    return what.replace(" ", "_")
