"""Scope-model migrations: how state written under an older model is read under the current one.

An app lists, per scope, the steps its model went through (``migrations={"user": [RenameKey(...), ...]}``):
step ``n`` takes a value from schema version ``n - 1`` to ``n``, so a scope's version is the number of
its steps. Every ``state_change`` event records the version it was written under (``schema_version``;
events from before migrations existed count as version 0), and so does every stored shared-scope value
(``stored_form``). Reading upcasts: the ledger keeps what was written (audit shows it), while derived
state, ``state_at`` and anything folded from the ledger see the current shape.

Steps work on one key at a time, so an event's change is upcast on its own, in the order the ledger
holds it. A deletion (``None``) upcasts to deletions of the keys the step produces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = ["ConvertKey", "MigrationStep", "RenameKey", "SplitKey", "apply_step"]


@dataclass(frozen=True)
class RenameKey:
    """Key ``old`` is now called ``new`` (its value unchanged)."""

    old: str
    new: str


@dataclass(frozen=True)
class ConvertKey:
    """Key ``key`` changed type: ``convert`` takes the old value and returns the new one."""

    key: str
    convert: Callable[[Any], Any]


@dataclass(frozen=True)
class SplitKey:
    """Key ``key`` became the keys ``into``: ``split`` takes the old value and returns ``{new key: value}``.

    ``split`` may return only some of ``into`` (the others are left unset); a key outside ``into`` makes
    the read fail with ``StateMigrationError``.
    """

    key: str
    into: tuple[str, ...]
    split: Callable[[Any], Mapping[str, Any]]


MigrationStep: TypeAlias = RenameKey | ConvertKey | SplitKey


def apply_step(step: MigrationStep, key: str, value: Any) -> dict[str, Any]:
    """``{key: value}`` after ``step`` (``value`` ``None``: the key was deleted). Raises what the step raises."""
    if isinstance(step, RenameKey):
        return {step.new if key == step.old else key: value}
    if key != step.key:
        return {key: value}
    if isinstance(step, ConvertKey):
        return {key: None if value is None else step.convert(value)}
    if value is None:
        return dict.fromkeys(step.into)
    return dict(step.split(value))
