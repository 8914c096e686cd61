"""The merge rules: when a writer's new events (R) may go after the events that landed since its base (L).

Pure ledger logic, on events alone (``dormant.writes`` applies it to a session; ``dormant.serving.commit`` and
``app.sessions.write(on_conflict="merge")`` go through there). R goes after L, unchanged, only when all of these hold:

1. no state key is written by both (same scope, same scope id, same key; ``observation``s are reads);
2. no tool call is answered or executed by both (same ``call_id`` in a ``tool_input`` or ``tool_result``);
3. no invocation is continued by both (an ``invocation_id`` present in both R and L);
4. R does not start an invocation while L leaves one open (two open invocations cannot interleave);
5. R's events may follow L's by the ledger rules (``dormant.ledger``: no message while a call waits...),
   checked as they are appended.

Then the merged ledger folds to L's state plus R's writes, and every ``old_value`` R recorded is still
the value it replaced. Reads are not tracked: this is snapshot isolation, not serializability — a run
that decided from a key only it read, which another writer then changed, still merges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .events import Event, InvocationStartEvent, StateChangeEvent, ToolInputEvent, ToolResultEvent

__all__ = ["conflicts"]


def conflicts(
    landed: Iterable[Event],
    mine: Iterable[Event],
    *,
    scope_id: Callable[[str], str | None],
    open_invocation: str | None,
) -> list[str]:
    """Why ``mine`` cannot go after ``landed``: one reason per conflict, none when the rebase is safe (rules 1-4).

    ``scope_id``: the id a shared scope is bound to in the session (for writes that do not name theirs);
    ``open_invocation``: the invocation the stored ledger leaves open, if any."""
    landed, mine = list(landed), list(mine)
    reasons: list[str] = []
    common_keys = _written(scope_id, landed) & _written(scope_id, mine)
    for scope, bound, key in sorted(common_keys):
        reasons.append(f"both wrote {scope}{'/' + bound if bound else ''}.{key}")
    common_calls = _calls(landed) & _calls(mine)
    reasons += [f"both answered or ran tool call {call_id}" for call_id in sorted(common_calls)]
    common_invocations = _invocations(landed) & _invocations(mine)
    reasons += [f"both continued invocation {inv}" for inv in sorted(common_invocations)]
    if open_invocation is not None and any(isinstance(e, InvocationStartEvent) for e in mine):
        reasons.append(f"invocation {open_invocation} is still open in the stored ledger")
    return reasons


def _written(scope_id: Callable[[str], str | None], events: Iterable[Event]) -> set[tuple[str, str, str]]:
    keys: set[tuple[str, str, str]] = set()
    for event in events:
        if isinstance(event, StateChangeEvent) and event.source != "observation":
            bound = event.scope_id or (scope_id(event.scope) if event.scope != "session" else "") or ""
            keys.update((event.scope, bound, change.key) for change in event.changes)
    return keys


def _calls(events: Iterable[Event]) -> set[str]:
    return {e.call_id for e in events if isinstance(e, ToolInputEvent | ToolResultEvent)}


def _invocations(events: Iterable[Event]) -> set[str]:
    return {e.invocation_id for e in events if e.invocation_id is not None}
