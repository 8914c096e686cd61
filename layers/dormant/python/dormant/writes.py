"""One write path: how a stored session is changed (``app.sessions.write``), and the merge rules.

A write loads the session (snapshot and tail, as ``app.sessions.get``), checks ``precondition`` on it,
applies ``change`` to it (append events, set state, answer calls), and commits what that added through
``app.sessions.commit`` under optimistic concurrency. ``on_conflict`` says what a lost race does:

* ``fail``: raise ``VersionConflict``; nothing written. For a claim: the loser must not act.
* ``retry``: load the session afresh and run ``precondition`` and ``change`` again on the new object,
  up to ``attempts`` tries in all, then raise ``StoreBusy`` naming the session. For a change that is a
  pure function of the stored session: answers, ending an invocation, storing a task token.
* ``merge``: ``change`` runs once; its events (everything the session holds uncommitted) are rebased
  onto a fresh load when the rules below allow, else the session's whole ledger is stored as a fork.
  For a run whose tools already acted: its events cannot be made again, only placed.

Every outcome is one ``WriteResult``: ``committed``, ``merged``, ``skipped`` (``change`` appended nothing
and there are no shared-scope writes: no store call) or ``forked``. ``precondition`` and ``change`` may
raise typed errors; they propagate unchanged and nothing is written. An unknown or expired session is
``SessionNotFound`` (404 over HTTP).

When a rebase is safe is in ``dormant.merge`` (the rules, on events alone); the fifth is the ledger's own:
R's events must follow L's by ``dormant.ledger`` (no message while a call waits...), checked as they are
appended.

Shared-scope writes a caller names (``scoped_changes=``) are not part of the rules: they are written
as given, the last writer's value winning. A forked run's shared-scope writes are not applied (its fork
is parked for someone to review); the session object it came from is left as it was. The fork says what
it is, on its row (``forked_from``, ``fork_reason``: the conflicts) and in its ledger (a final
``session_forked`` event naming the session, the last event both share as stored, and the reason).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeAlias, TypeVar

from . import metrics
from .errors import (
    AwaitingInput,
    EventOutOfOrder,
    InputError,
    SessionNotFound,
    StoreBusy,
    UnknownCallId,
    VersionConflict,
)
from .events import Event
from .merge import conflicts
from .session import Session
from .stores.base import CommitResult, ScopedStateChange

__all__ = ["ON_CONFLICT", "OnConflict", "SessionWriter", "WriteResult", "WriteStatus", "merge_conflicts", "write"]

OnConflict: TypeAlias = Literal["fail", "retry", "merge"]
WriteStatus: TypeAlias = Literal["committed", "merged", "skipped", "forked"]
ON_CONFLICT: tuple[OnConflict, ...] = ("fail", "retry", "merge")

T = TypeVar("T")


@dataclass(frozen=True)
class WriteResult(Generic[T]):
    """How a write went. ``session`` holds the ledger as stored after it; for ``forked`` that is the fork
    (``fork_id``), stored as a session of its own, and ``version`` is the fork's."""

    status: WriteStatus
    session: Session = field(repr=False, compare=False)
    version: int
    value: T
    """What ``change`` returned (on its last run)."""
    attempts: int
    """Commits tried, the first included (a ``skipped`` write counts the load it looked at)."""
    appended: int = 0
    """Events the store added (a re-sent event it already held is not counted)."""
    fork_id: str | None = None
    conflicts: list[str] = field(default_factory=list)
    """Why the run could not join its session (``forked``), one reason per conflict."""


class SessionWriter(Protocol):
    """What a write needs of ``app.sessions``: its loads (retention applied) and its checked commit."""

    def get(self, session_id: str) -> Session | None: ...

    def commit(
        self, session: Session, *, scoped_changes: Sequence[ScopedStateChange] | None = None
    ) -> CommitResult: ...


def write(
    sessions: SessionWriter,
    session_id: str | None,
    change: Callable[[Session], T] | None,
    *,
    session: Session | None = None,
    on_conflict: OnConflict = "fail",
    precondition: Callable[[Session], None] | None = None,
    scoped_changes: Callable[[Session], Sequence[ScopedStateChange]] | None = None,
    attempts: int = 5,
) -> WriteResult[T]:
    """Change a stored session (see the module docstring; ``app.sessions.write`` is this on the app).

    ``session``, instead of loading ``session_id``, is the object the first attempt works on (a claim's
    run already holds it, with its input appended); later attempts load afresh. With ``retry`` it must
    hold nothing uncommitted: what it holds would not be made again on a reload. ``scoped_changes``, when
    given, returns the shared-scope writes of the commit, in place of those the session's state changes
    make (``app.sessions.commit(scoped_changes=)``): park's task token, a remote runner's named writes.
    """
    if on_conflict not in ON_CONFLICT:
        raise InputError(f"on_conflict is one of {', '.join(ON_CONFLICT)}, not {on_conflict!r}", field="on_conflict")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise InputError(f"attempts is an int >= 1, not {attempts!r}", field="attempts")
    if not callable(change):
        raise InputError(f"change is a function of the session, not {change!r}", field="change")
    if session is None:
        if session_id is None:
            raise InputError("write takes a session id, or a loaded session as session=", field="session_id")
        current = _load(sessions, session_id)
    else:
        if session_id is not None and session_id != session.id:
            raise InputError(f"session_id {session_id!r} is not the given session's ({session.id!r})", field="session")
        if on_conflict == "retry" and session.uncommitted_events:
            raise InputError(
                "retry runs change again on a fresh load; the given session holds uncommitted events it would "
                "lose (commit them first, or use on_conflict='merge')",
                field="session",
            )
        current = session
    target = current.id

    for attempt in range(1, attempts + 1):
        if attempt > 1:
            current = _load(sessions, target)  # never the stale object: the ledger as stored now
        if precondition is not None:
            precondition(current)
        value = change(current)
        scoped = None if scoped_changes is None else list(scoped_changes(current))
        pending = current.scoped_changes() if scoped is None else scoped
        if not current.uncommitted_events and not pending and current.version > 0:
            return WriteResult("skipped", _handed(session, current), current.version, value, attempt)
        try:
            result = sessions.commit(current, scoped_changes=scoped)
        except VersionConflict:
            metrics.count("conflicts")
            if on_conflict == "fail":
                raise
            if on_conflict == "merge":
                return _merge(sessions, current, value, precondition, scoped_changes, attempt, attempts)
            continue
        return WriteResult("committed", _handed(session, current), result.version, value, attempt, result.appended)
    raise StoreBusy(
        f"session {target!r} kept moving: {attempts} attempts to write it lost the race to other writers; try again",
        session_id=target,
    )


def _load(sessions: SessionWriter, session_id: str) -> Session:
    loaded = sessions.get(session_id)
    if loaded is None:
        raise SessionNotFound(session_id)
    return loaded


def _handed(given: Session | None, stored: Session) -> Session:
    """The session to hand back: the caller's own object, brought up to the stored ledger, when it gave one."""
    if given is None or given is stored:
        return stored
    given.replace_ledger(stored)
    return given


def _merge(
    sessions: SessionWriter,
    session: Session,
    value: T,
    precondition: Callable[[Session], None] | None,
    scoped_changes: Callable[[Session], Sequence[ScopedStateChange]] | None,
    tried: int,
    attempts: int,
) -> WriteResult[T]:
    """Rebase ``session``'s uncommitted events onto what landed, or fork; ``tried`` commits are spent."""
    new = session.uncommitted_events
    count = session.committed_count
    last = session.events[count - 1].id if count else None
    new_ids = {e.id for e in new}
    while tried < attempts:
        tried += 1
        # The stored session as a load gives it (snapshot and tail); what landed after this session's
        # version is read from there on, using what this session knows of the stored ledger.
        merged = sessions.get(session.id)
        if merged is None:
            return _fork(session, ["the session was deleted"], value, tried)
        merged.note_anchors(session.anchors)
        try:
            starts = len(merged.events) >= count and (not count or merged.events[count - 1].id == last)
            stored = merged.events[count:]
        except SessionNotFound:
            starts = False
        if not starts:
            return _fork(session, ["the stored ledger no longer starts with this session's"], value, tried)
        stored_ids = {e.id for e in stored}
        mine = [e for e in new if e.id not in stored_ids]
        if not mine:  # every event already landed: an earlier attempt went through
            session.replace_ledger(merged)
            return WriteResult("committed", session, merged.version, value, tried)
        if precondition is not None:
            precondition(merged)
        landed = [e for e in stored if e.id not in new_ids]
        conflicts = merge_conflicts(session, merged, landed, mine)
        if conflicts:
            return _fork(session, conflicts, value, tried)
        try:
            for event in mine:
                merged.append(event)
        except (AwaitingInput, EventOutOfOrder, UnknownCallId) as exc:  # the ledger rules: they cannot go there
            return _fork(session, [f"its events cannot follow what landed: {exc}"], value, tried)
        scoped = None if scoped_changes is None else list(scoped_changes(merged))
        try:
            result = sessions.commit(merged, scoped_changes=scoped)
        except VersionConflict:
            metrics.count("conflicts")
            continue
        session.replace_ledger(merged)
        metrics.count("merges")
        return WriteResult("merged", session, result.version, value, tried, result.appended)
    return _fork(session, [f"the session kept moving: all {attempts} attempts to commit lost the race"], value, tried)


def merge_conflicts(session: Session, stored: Session, landed: list[Event], mine: list[Event]) -> list[str]:
    """Why ``mine`` (new events of ``session``) cannot go after ``landed`` (what landed on ``stored`` since
    ``session``'s base): one reason per conflict, none when the rebase is safe (``dormant.merge``'s rules)."""
    return conflicts(landed, mine, scope_id=session.scope_id, open_invocation=stored.projection.open_invocation)


def _fork(session: Session, conflicts: list[str], value: T, tried: int) -> WriteResult[T]:
    fork = session.fork("; ".join(conflicts))
    # Straight to the store, without the fork's scoped changes: its writes are parked, not applied.
    result = session.runtime.store.commit(fork.row(), fork.uncommitted_events, 0)
    if not result.ok:  # a fresh random id already taken: nothing was written
        raise VersionConflict(fork.id, expected_version=0, actual_version=result.version)
    fork.mark_committed(result.version)
    metrics.count("forks")
    return WriteResult("forked", fork, result.version, value, tried, result.appended, fork.id, conflicts)
