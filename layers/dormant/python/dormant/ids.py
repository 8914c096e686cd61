"""Ids (and ``now_ms``, re-exported from ``dormant.clock``, where every timestamp comes from).

Ids end up inside storage keys (``S#{app}#{session}`` on DynamoDB), so they are restricted to a
character set that can never collide with a key separator: letters, digits and ``_ . : @ + = -``.
"""

from __future__ import annotations

import re
import uuid

from .clock import now_ms
from .errors import InvalidSessionId

__all__ = ["MAX_ID_LENGTH", "check_id", "new_id", "now_ms"]

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]*")


def new_id(prefix: str = "") -> str:
    return f"{prefix}{uuid.uuid4().hex}"


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
