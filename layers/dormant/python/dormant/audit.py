"""Who changed what: the history of one state key, and the difference between two points of a session.

Both read only the ledger, which is the point: every value can be traced to the event that set it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .events import (
    Event,
    InvocationEndEvent,
    InvocationYieldEvent,
    ModelStartEvent,
    StateChangeEvent,
    StateSource,
    ToolCallEvent,
    ToolResultEvent,
)
from .projection import StateSnapshot
from .state.values import json_equal

__all__ = ["KeyChange", "StateDiff", "key_history", "state_diff"]


@dataclass(frozen=True)
class KeyChange:
    """One change of one key: where in the ledger, when, by which invocation and tool, and how."""

    index: int
    event_id: str
    created_at: int
    scope: str
    scope_id: str | None
    key: str
    old_value: Any
    new_value: Any
    source: StateSource
    invocation_id: str | None
    agent_name: str | None
    tool: str | None
    """The tool whose run made the change (``None``: made outside any tool, e.g. seeded or observed):
    as the event records it, or for a ledger written before events recorded it, as the ledger's order
    shows it."""
    call_id: str | None


class StateDiff(NamedTuple):
    """One key that differs between two snapshots (``None``: absent on that side)."""

    scope: str
    key: str
    before: Any
    after: Any


def key_history(events: Sequence[Event], scope: str, key: str) -> list[KeyChange]:
    """Every change to ``scope.key`` on the ledger, oldest first."""
    return [
        KeyChange(
            index=index,
            event_id=event.id,
            created_at=event.created_at,
            scope=event.scope,
            scope_id=event.scope_id,
            key=change.key,
            old_value=change.old_value,
            new_value=change.new_value,
            source=event.source,
            invocation_id=event.invocation_id,
            agent_name=event.agent_name,
            tool=tool,
            call_id=call_id,
        )
        for index, event, (tool, call_id) in _state_changes(events)
        if event.scope == scope
        for change in event.changes
        if change.key == key
    ]


_NO_TOOL: tuple[str | None, str | None] = (None, None)


def _state_changes(events: Sequence[Event]) -> Iterator[tuple[int, StateChangeEvent, tuple[str | None, str | None]]]:
    """Each state change with the tool (name, call id) whose run made it.

    A change records its tool call (``call_id``, ``tool``) since the release after 0.1. Before, it is
    inferred: the run loop executes one tool at a time and appends its result as soon as it returns,
    so a mutation made by a tool lies after that tool's call and before its result, with no model call,
    yield or end of its invocation in between.
    """
    calls: dict[str, tuple[int, ToolCallEvent]] = {}
    waiting: list[tuple[int, StateChangeEvent]] = []
    for index, event in enumerate(events):
        if isinstance(event, ToolCallEvent):
            calls[event.call_id] = (index, event)
        elif isinstance(event, StateChangeEvent):
            if event.call_id is not None:
                yield index, event, (event.tool, event.call_id)
            elif event.invocation_id is None or event.source != "mutation":
                yield index, event, _NO_TOOL
            else:
                waiting.append((index, event))
            continue
        if not waiting or event.invocation_id != waiting[0][1].invocation_id:
            continue
        if isinstance(event, ToolResultEvent):
            called = calls.get(event.call_id)
            made_by = (
                (called[1].name, called[1].call_id) if called is not None and called[0] < waiting[0][0] else _NO_TOOL
            )
            yield from ((i, change, made_by) for i, change in waiting)
            waiting = []
        elif isinstance(event, ModelStartEvent | InvocationYieldEvent | InvocationEndEvent):
            yield from ((i, change, _NO_TOOL) for i, change in waiting)
            waiting = []
    yield from ((i, change, _NO_TOOL) for i, change in waiting)


def state_diff(before: StateSnapshot, after: StateSnapshot) -> list[StateDiff]:
    """The keys whose values differ between two snapshots, scope by scope (``session`` first)."""
    diffs = []
    for scope, old, new in _scopes(before, after):
        for key in sorted(old.keys() | new.keys()):
            if not json_equal(old.get(key), new.get(key)):
                diffs.append(StateDiff(scope, key, old.get(key), new.get(key)))
    return diffs


def _scopes(before: StateSnapshot, after: StateSnapshot) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    yield "session", before.session_state, after.session_state
    for scope in sorted(before.scoped_states.keys() | after.scoped_states.keys()):
        yield scope, before.scoped_states.get(scope, {}), after.scoped_states.get(scope, {})
