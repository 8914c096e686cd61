"""Move a stored session on for a caller, claiming it before anything acts.

``advance(app, agent, session, input)`` is how a command or an HTTP handler runs a session: it adds
the input (a user message, answers to yielded calls) and runs the agent as a stream. When the run
opens its invocation (``invocation_start`` or ``invocation_resume``) the input and that event are on
the ledger and no tool has run yet (tools run only after it, in the run loop). That moment it commits
them under optimistic concurrency, a strict ``app.sessions.write`` (``on_conflict="fail"``): the *claim*.
Of two callers racing on one session only the one whose claim lands runs tools; the other gets
``ClaimLost`` (HTTP 409), having run and written nothing. The winner runs on and commits the rest
through ``serving.commit`` (the same write, merging).

A run that opens no invocation (``state`` set while every call still waits) is claimed by the same strict
commit at its end: nothing ran, so a loser again has nothing to undo.

A session whose invocation is open and not paused (status ``running``) is held by a run in progress,
or by one whose process died. ``advance`` refuses it with ``ClaimLost``; ``takeover=True`` resumes it,
for a caller who knows that run is dead. Its unfinished tool calls then run again (at-least-once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ClaimLost, VersionConflict
from ..events import InvocationResumeEvent, InvocationStartEvent
from ..projection import Output, YieldedTool
from ..session import Session
from ..writes import WriteResult
from .commit import CommitStatus, commit

if TYPE_CHECKING:
    from ..agents.agent import Agent
    from ..agents.loop import RunStatus
    from ..app import App

__all__ = ["AdvanceOutcome", "advance"]


@dataclass(frozen=True)
class AdvanceOutcome:
    """What a claimed run came to, and how it was stored."""

    status: RunStatus
    """The run's status: ``completed``, ``yielded_tool``, ``error`` or ``max_steps``."""
    session_id: str
    output: Output
    yielded_tools: list[YieldedTool]
    commit_status: CommitStatus
    """How the run's events after the claim were committed (``serving.commit``)."""
    version: int
    """The stored version after the run (of the fork, when ``commit_status`` is ``orphaned``)."""
    session: Session = field(repr=False, compare=False)
    """The session as it stands after the commit (read its state, its ledger)."""
    fork_id: str | None = None
    """Where the run was saved when it could not join the session (``orphaned``)."""
    error: str | None = None


def advance(
    app: App, agent: Agent, session: Session | str, input: Any = None, *, takeover: bool = False
) -> AdvanceOutcome:
    """Add ``input`` to ``session`` (a ``Session`` or a stored session's id) and run ``agent`` on it.

    ``input`` is what ``app.run`` takes. Raises ``SessionNotFound`` for an unknown id, the typed input
    errors of ``app.run`` (nothing written), and ``ClaimLost`` when another writer holds the session or
    claimed it first (nothing run, nothing written).
    """
    if isinstance(session, str):
        session = app.sessions.require(session)
    if session.status == "running" and not takeover:
        raise ClaimLost(
            session.id,
            expected_version=session.version,
            actual_version=session.version,
            reason="an invocation is running on it (or its process died: resume it with takeover)",
        )
    stream = app.stream(agent, input, session=session)
    claimed = False
    for event in stream:
        if not claimed and isinstance(event, InvocationStartEvent | InvocationResumeEvent):
            _claim(app, session)
            claimed = True
    result = stream.result
    assert result is not None
    if claimed:
        outcome = commit(app, session)
        commit_status, version, fork_id = outcome.status, outcome.version, outcome.fork_id
    else:
        claim = _claim(app, session)  # strict: only committed or skipped come back
        commit_status, version, fork_id = ("skipped" if claim.status == "skipped" else "committed"), claim.version, None
    return AdvanceOutcome(
        status=result.status,
        session_id=session.id,
        output=session.output,
        yielded_tools=session.yielded_tools,
        commit_status=commit_status,
        version=version,
        fork_id=fork_id,
        error=result.error,
        session=session,
    )


def _claim(app: App, session: Session) -> WriteResult[None]:
    """Commit what the session holds now (a strict write: no retry, no merge), or raise ``ClaimLost``:
    another writer got there first."""
    expected = session.version
    try:
        return app.sessions.write(session=session, change=_as_run, on_conflict="fail")
    except VersionConflict as conflict:
        raise ClaimLost(
            session.id,
            expected_version=expected,
            actual_version=conflict.actual_version,
            reason=f"another writer moved it from version {expected} to {conflict.actual_version} first",
        ) from None


def _as_run(session: Session) -> None:
    """The claim's change is what the run appended already (its input and the invocation's start)."""
