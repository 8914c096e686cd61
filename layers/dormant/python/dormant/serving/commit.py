"""Commit with conflict resolution, for handlers that commit on the caller's behalf.

``commit(app, session)`` reports how it went in ``status``:

* ``committed`` — the first try went through (or every event was already stored: a retry after a
  lost response).
* ``merged`` — the version had moved; the run's new events were rebased after what landed and committed.
* ``skipped`` — there was nothing new to write.
* ``orphaned`` — what landed conflicts with the run; the run's ledger was saved as a new session (a fork)
  whose id is returned. Nothing is lost.

When a rebase is safe. The run's new events (R) go after the events that landed since the run's base
(L), unchanged, only when all of these hold:

1. no state key is written by both (same scope, same scope id, same key; ``observation``s are reads);
2. no tool call is answered or executed by both (same ``call_id`` in a ``tool_input`` or ``tool_result``);
3. no invocation is continued by both (an ``invocation_id`` present in both R and L);
4. R does not start an invocation while L leaves one open (two open invocations cannot interleave).

Then the merged ledger folds to L's state plus R's writes, and every ``old_value`` R recorded is still
the value it replaced. Reads are not tracked: this is snapshot isolation, not serializability — a run
that decided from a key only it read, which another writer then changed, still merges.

An orphaned run's shared-scope writes are not applied (its fork is parked for someone to review);
the session object passed in is left as it was. The fork says what it is, on its row
(``forked_from``, ``fork_reason``: the conflicts) and in its ledger (a final ``session_forked`` event
naming the session, the last event both share as stored, and the reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from ..errors import SessionNotFound, VersionConflict
from ..events import (
    Event,
    InvocationStartEvent,
    StateChangeEvent,
    ToolInputEvent,
    ToolResultEvent,
)
from ..session import Session

if TYPE_CHECKING:
    from ..app import App

__all__ = ["CommitOutcome", "CommitStatus", "commit"]

CommitStatus: TypeAlias = Literal["committed", "merged", "skipped", "orphaned"]


@dataclass(frozen=True)
class CommitOutcome:
    status: CommitStatus
    session_id: str
    """The session committed to (for ``orphaned``, the one the run could not join)."""
    version: int
    """The stored version of ``session_id`` after the call (of the fork, for ``orphaned``)."""
    appended: int = 0
    fork_id: str | None = None
    conflicts: list[str] = field(default_factory=list)
    """Why the run was orphaned, one reason per conflict."""


def commit(app: App, session: Session, *, attempts: int = 5) -> CommitOutcome:
    """Commit ``session``'s new events, merging or forking instead of failing on a version conflict.

    The first try is ``app.sessions.commit``; a merge loads the stored session (snapshot and tail, like
    ``app.sessions.get``), appends the run's events to it, commits that through ``app.sessions.commit``
    too, and hands it to ``session``.
    """
    new = session.uncommitted_events
    if not new and session.version > 0:
        return CommitOutcome("skipped", session.id, session.version)
    try:
        result = app.sessions.commit(session)
    except VersionConflict:
        pass
    else:
        return CommitOutcome("committed", session.id, result.version, result.appended)

    count = session.committed_count
    last = session.events[count - 1].id if count else None
    new_ids = {e.id for e in new}
    for _ in range(attempts):
        # The stored session as a load gives it (snapshot and tail); what landed after this session's
        # version is read from there on, using what this session knows of the stored ledger.
        merged = app.sessions.get(session.id)
        if merged is None:
            return _orphan(app, session, ["the session was deleted"])
        merged.note_anchors(session.anchors)
        try:
            starts = len(merged.events) >= count and (not count or merged.events[count - 1].id == last)
            stored = merged.events[count:]
        except SessionNotFound:
            starts = False
        if not starts:
            return _orphan(app, session, ["the stored ledger no longer starts with this session's"])
        stored_ids = {e.id for e in stored}
        mine = [e for e in new if e.id not in stored_ids]
        if not mine:  # every event already landed: an earlier attempt went through
            session.replace_ledger(merged)
            return CommitOutcome("committed", session.id, merged.version)
        landed = [e for e in stored if e.id not in new_ids]
        conflicts = _conflicts(session, merged, landed, mine)
        if conflicts:
            return _orphan(app, session, conflicts)
        for event in mine:
            merged.append(event)
        try:
            result = app.sessions.commit(merged)
        except VersionConflict:
            continue
        session.replace_ledger(merged)
        return CommitOutcome("merged", session.id, result.version, result.appended)
    return _orphan(app, session, [f"the session kept moving: {attempts} merge attempts lost the race"])


def _conflicts(session: Session, stored: Session, landed: list[Event], mine: list[Event]) -> list[str]:
    reasons: list[str] = []
    common_keys = _written(session, landed) & _written(session, mine)
    for scope, scope_id, key in sorted(common_keys):
        reasons.append(f"both wrote {scope}{'/' + scope_id if scope_id else ''}.{key}")
    common_calls = _calls(landed) & _calls(mine)
    reasons += [f"both answered or ran tool call {call_id}" for call_id in sorted(common_calls)]
    common_invocations = _invocations(landed) & _invocations(mine)
    reasons += [f"both continued invocation {inv}" for inv in sorted(common_invocations)]
    open_invocation = stored.projection.open_invocation
    if open_invocation is not None and any(isinstance(e, InvocationStartEvent) for e in mine):
        reasons.append(f"invocation {open_invocation} is still open in the stored ledger")
    return reasons


def _written(session: Session, events: Iterable[Event]) -> set[tuple[str, str, str]]:
    keys: set[tuple[str, str, str]] = set()
    for event in events:
        if isinstance(event, StateChangeEvent) and event.source != "observation":
            scope_id = event.scope_id or (session.scope_id(event.scope) if event.scope != "session" else "") or ""
            keys.update((event.scope, scope_id, change.key) for change in event.changes)
    return keys


def _calls(events: Iterable[Event]) -> set[str]:
    return {e.call_id for e in events if isinstance(e, ToolInputEvent | ToolResultEvent)}


def _invocations(events: Iterable[Event]) -> set[str]:
    return {e.invocation_id for e in events if e.invocation_id is not None}


def _orphan(app: App, session: Session, conflicts: list[str]) -> CommitOutcome:
    fork = session.fork("; ".join(conflicts))
    # Straight to the store, without the fork's scoped changes: its writes are parked, not applied.
    result = app.store.commit(fork.stored(), fork.uncommitted_events, 0)
    return CommitOutcome("orphaned", session.id, result.version, result.appended, fork.id, conflicts)
