"""JSON values as the ledger holds them: strict equality and cheap copies."""

from __future__ import annotations

from typing import Any

__all__ = ["json_copy", "json_equal"]


def json_equal(a: Any, b: Any) -> bool:
    """Deep equality that, unlike ``==``, tells ``True`` from ``1`` and ``1`` from ``1.0``.

    A write is recorded only when the value really changes, so ``1 -> True`` must count as a change.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (much faster than ``copy.deepcopy`` for this shape)."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value
