"""Ids and the one key rule (and ``now_ms``, re-exported from ``dormant.clock``, where every timestamp comes from).

The key rule. Every key a caller can send is checked here, before any store writes anything, the same way for
every store (``BaseSessionStore`` calls these checks; ``StoreContract`` holds every store to them):

=================  ====================================================  ============================
key                characters                                            refused with (``field``)
=================  ====================================================  ============================
session id         letters, digits and ``_ . : @ + = -``, starting       ``InvalidSessionId``
scope id           with a letter or digit                                (``session_id``, ``scope_id``)
event id           the same                                              ``InvalidKey`` (``new_events.N.id``)
app name, tenant   the same, without ``@``: the tenant separator         ``InvalidKey`` (``app_name``,
                                                                         ``tenant``)
scope              the same as a session id                              ``InvalidKey`` (``scope``)
scoped key         any text without NUL or a lone surrogate              ``InvalidKey`` (empty, too long);
                                                                         ``ValueNotStorable`` (NUL, surrogate)
listing cursor     what ``encode_cursor`` made, at most                  ``InvalidKey`` (``cursor``)
                   ``MAX_CURSOR_LENGTH`` characters
=================  ====================================================  ============================

Every one of them is 1 to ``MAX_KEY_LENGTH`` (128) characters: the one length limit. It fits DynamoDB's
key sizes with every prefix the store adds: the longest partition key is a scoped item's
``X#{app}@{tenant}#{scope}#{scope id}`` (516 bytes of the 2,048 allowed: ids are ASCII); the longest sort
key a scoped key (at most 512 bytes in UTF-8, of 1,024) or the running index's ``S#{app}@{tenant}#{session}``
(388 bytes).

Tenants. The app name a store is given is the app's own name, or ``{app}@{tenant}`` for a tenant's view of
it (``tenant_app_name``; ``dormant.serving.runtime.for_tenant`` builds the view). Neither an app name nor a
tenant may hold ``@``, so that name has exactly one reading: no app can be named like another's tenant
(``clinic@eu`` is tenant ``eu`` of ``clinic``, never an app), and a purge or erasure of one cannot reach the
other. Sessions written before the rule keep their keys: a tenant's view was already ``{app}@{tenant}``.

Ids end up inside storage keys (``S#{app}#{session}`` on DynamoDB), so no key holds ``#``, the separator.

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
from .errors import InvalidKey, InvalidSessionId, ValueNotStorable

__all__ = [
    "ID_PATTERN",
    "MAX_CURSOR_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_KEY_LENGTH",
    "TENANT_SEPARATOR",
    "check_app_key",
    "check_event_id",
    "check_id",
    "check_name",
    "check_scoped_key",
    "new_id",
    "now_ms",
    "split_app_name",
    "tenant_app_name",
]

MAX_KEY_LENGTH = 128
"""Characters in any key: an id, app name, tenant, scope or scoped key (the one length limit)."""
MAX_ID_LENGTH = MAX_KEY_LENGTH
MAX_CURSOR_LENGTH = -(-4 * (MAX_KEY_LENGTH + 25) // 3)  # unpadded base64 of MAX_KEY_LENGTH + 25 bytes
"""Characters in a listing cursor (204): the base64 of ``[time, "id"]`` with the greatest time (19 digits) and a
``MAX_KEY_LENGTH`` id, what ``encode_cursor`` makes of the longest it is given. A longer one is refused unread."""
TENANT_SEPARATOR = "@"
"""Between an app's name and a tenant in the app name a tenant's view is stored under; in neither of them."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]*")
ID_PATTERN = f"^{_ID.pattern}$"
"""What ``check_id`` accepts, as a JSON-schema pattern (with ``MAX_ID_LENGTH``): the API document states it."""
ID_MATCH = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:@+=-]{{0,{MAX_KEY_LENGTH - 1}}}").fullmatch
"""``check_id``'s and ``check_event_id``'s rule as one C-level call for a ``str`` (a match, or ``None``): what a
commit runs per event and a load per session, calling the check only to word a refusal."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+=-]*")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, and surrogates (in a str, always lone ones)


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


def check_id(value: object, what: str = "session id", field: str | None = None) -> str:
    """Return ``value`` if it is a usable id (a session or scope id), else raise ``InvalidSessionId`` saying why."""
    return _check(value, what, field, _ID, "_ . : @ + = -", InvalidSessionId)


def check_event_id(value: object, field: str) -> str:
    """Return ``value`` if it is a usable event id (a key too: DynamoDB's id index sorts on it), else ``InvalidKey``."""
    return _check(value, "event id", field, _ID, "_ . : @ + = -", InvalidKey)


def check_name(value: object, what: str = "app name", field: str | None = None) -> str:
    """Return ``value`` if it is a usable app name or tenant (an id without ``@``), else raise ``InvalidKey``."""
    return _check(value, what, field, _NAME, "_ . : + = - (no @: it separates an app from its tenant)", InvalidKey)


def check_app_key(value: object, field: str = "app_name") -> str:
    """Return ``value`` if it is an app name a store may be given: an app's name, or ``{app}@{tenant}``."""
    if isinstance(value, str) and TENANT_SEPARATOR in value:
        app, _, tenant = value.partition(TENANT_SEPARATOR)
        check_name(app, "app name", field)
        check_name(tenant, "tenant", field)
        return value
    return check_name(value, "app name", field)


def tenant_app_name(app_name: str, tenant: str) -> str:
    """The app name ``tenant``'s view of app ``app_name`` is stored under: ``{app}@{tenant}``, both checked."""
    return f"{check_name(app_name)}{TENANT_SEPARATOR}{check_name(tenant, 'tenant')}"


def split_app_name(app_name: str) -> tuple[str, str | None]:
    """``(app, tenant)`` back from a stored app name (``tenant`` is ``None`` for an app's own sessions); the
    inverse of ``tenant_app_name``. ``InvalidKey`` for a name no app or tenant view may have."""
    check_app_key(app_name)
    app, separator, tenant = app_name.partition(TENANT_SEPARATOR)
    return app, (tenant if separator else None)


def check_scoped_key(value: object, field: str) -> str:
    """Return ``value`` if it is a usable state key (of a shared scope, where it is a store's key, or of any
    other: one rule for every scope): text of 1 to ``MAX_KEY_LENGTH`` characters,
    with no NUL or lone surrogate (``ValueNotStorable``, as for any text no store can keep)."""
    if not isinstance(value, str):
        raise InvalidKey(f"a state key is a string, not {type(value).__name__}", field=field)
    if not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise InvalidKey(f"a state key is 1 to {MAX_KEY_LENGTH} characters long, not {len(value):,}", field=field)
    if _UNSTORABLE.search(value):
        raise ValueNotStorable(f"a state key may not hold NUL or a lone surrogate: {value!r}", field=field)
    return value


def _check(
    value: object, what: str, field: str | None, pattern: re.Pattern[str], allowed: str, error: type[InvalidKey]
) -> str:
    named = field or what.replace(" ", "_")
    if not isinstance(value, str):
        raise error(f"{what} must be a string, not {type(value).__name__}", field=named)
    if not value or len(value) > MAX_KEY_LENGTH:
        raise error(f"{what} must be 1 to {MAX_KEY_LENGTH} characters long (got {len(value):,})", field=named)
    if not pattern.fullmatch(value):
        raise error(
            f"{what} {value!r} may only hold letters, digits and {allowed}, and must start with a letter or digit",
            field=named,
        )
    return value
