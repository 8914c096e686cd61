"""JSON values as the ledger holds them: strict equality, cheap copies, and the one rule for what is storable.

Every store keeps the same values. JSON has no NaN or Infinity, UTF-8 cannot encode a lone surrogate,
and PostgreSQL refuses NUL in text, so none of them is storable: input holding one is refused
(``check_storable``, a typed ``ValueNotStorable`` naming the field), and text a model or tool produced
is repaired (``repaired``: each such character becomes U+FFFD) so a run never fails at commit.
"""

from __future__ import annotations

import functools
import math
import re
from typing import TYPE_CHECKING, Any

from ..errors import ValueNotStorable

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = ["check_storable", "json_copy", "json_equal", "json_values", "repaired", "storable_text", "unstorable"]

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


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


@functools.cache
def json_values() -> TypeAdapter[Any]:
    """pydantic's validator of JSON values, built on first use: a cold start that never needs it skips it."""
    from pydantic import JsonValue, TypeAdapter

    return TypeAdapter(JsonValue)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (much faster than ``copy.deepcopy`` for this shape)."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


def _text_problem(text: str) -> str | None:
    found = _BAD_TEXT.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"


def unstorable(value: Any) -> tuple[str, str] | None:
    """Where ``value`` holds something no store can keep, and what: ``(".notes.2", "NaN")``, or ``None``."""
    if isinstance(value, str):
        problem = _text_problem(value)
        return ("", problem) if problem else None
    if isinstance(value, float):
        return None if math.isfinite(value) else ("", "NaN" if math.isnan(value) else "Infinity")
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (problem := _text_problem(key)):
                return (f".{storable_text(key)}", f"{problem} in the key")
            found = unstorable(item)
            if found is not None:
                return (f".{key}{found[0]}", found[1])
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unstorable(item)
            if found is not None:
                return (f".{index}{found[0]}", found[1])
    return None


def check_storable(value: Any, field: str) -> None:
    """Raise ``ValueNotStorable`` naming ``field`` (and the path inside it) if ``value`` is not storable."""
    found = unstorable(value)
    if found is not None:
        path, problem = found
        raise ValueNotStorable(
            f"{field}{path} holds {problem}, which no store can keep (NaN, Infinity, NUL and lone "
            "surrogates are refused)",
            field=f"{field}{path}",
        )


def storable_text(text: str) -> str:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD."""
    return _BAD_TEXT.sub(_REPLACEMENT, text) if _BAD_TEXT.search(text) else text


def repaired(value: Any) -> Any:
    """A JSON value with its text (keys too) made storable; non-finite numbers are left for the caller."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k) if isinstance(k, str) else k: repaired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [repaired(v) for v in value]
    return value
