"""Commit with conflict resolution, for handlers that commit on the caller's behalf.

``commit(app, session)`` is ``app.sessions.write(session=session, on_conflict="merge")`` with nothing
more to change, reported the way it was before that existed, in ``status``:

* ``committed`` — the first try went through (or every event was already stored: a retry after a
  lost response).
* ``merged`` — the version had moved; the run's new events were rebased after what landed and committed.
* ``skipped`` — there was nothing new to write.
* ``orphaned`` — what landed conflicts with the run; the run's ledger was saved as a new session (a fork)
  whose id is returned. Nothing is lost. (The write's ``forked``: the run is orphaned from its session,
  the fork is what was stored.)

When a rebase is safe (``dormant.merge``, which holds the rules; ``dormant.writes`` applies them). The run's
new events (R) go after the events that landed since the run's base (L), unchanged, only when all of these hold:

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

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

    The first try is ``app.sessions.commit``; then up to ``attempts`` merges, each of which loads the
    stored session (snapshot and tail, like ``app.sessions.get``), appends the run's events to it, commits
    that through ``app.sessions.commit`` too, and hands it to ``session``.
    """
    result = app.sessions.write(session=session, change=_nothing, on_conflict="merge", attempts=attempts + 1)
    status: CommitStatus = "orphaned" if result.status == "forked" else result.status
    return CommitOutcome(status, session.id, result.version, result.appended, result.fork_id, result.conflicts)


def _nothing(session: Session) -> None:
    """The run already appended its events: the write only places them."""
