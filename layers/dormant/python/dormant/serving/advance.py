"""Move a stored session on for a caller, claiming it before anything acts.

``advance(app, agent, session, input)`` is how a command runs a session in one call: it claims the turn
(``serving.turns.claim_turn``: the input and the invocation's start committed under optimistic
concurrency, before any tool runs) and then runs it here (``run_to_end``), committing before every model
call and tool execution, with a deadline on the ledger renewed every ``RUNNER_TURN_MS``: a process that
dies mid-turn is found by the sweeper, which hands the turn on. Of two callers racing on one session only
the one whose claim lands runs tools; the other gets ``ClaimLost`` (HTTP 409), having run and written
nothing. The winner's last events go through ``serving.commit``.

A run that opens no invocation (``state`` set while every call still waits) is claimed by the same strict
commit: nothing ran, so a loser again has nothing to undo.

A session whose invocation is open and not paused (status ``running``) is held by a run in progress,
or by one whose process died. ``advance`` refuses it with ``ClaimLost``; ``takeover=True`` resumes it,
for a caller who knows that run is dead. Its unfinished tool calls then run again (at-least-once).

A server runs the two acts apart (the HTTP API answers 202 once the claim landed): see ``serving.turns``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..clock import now_ms
from ..session import Session
from .turns import RUNNER_TURN_MS, AdvanceOutcome, claim_turn, run_to_end

if TYPE_CHECKING:
    from ..agents.agent import Agent
    from ..app import App

__all__ = ["AdvanceOutcome", "advance"]


def advance(
    app: App, agent: Agent, session: Session | str, input: Any = None, *, takeover: bool = False
) -> AdvanceOutcome:
    """Add ``input`` to ``session`` (a ``Session`` or a stored session's id) and run ``agent`` on it.

    ``input`` is what ``app.run`` takes. Raises ``SessionNotFound`` for an unknown id, the typed input
    errors of ``app.run`` (nothing written), and ``ClaimLost`` when another writer holds the session or
    claimed it first (nothing run, nothing written).
    """
    claim = claim_turn(app, agent, session, input, takeover=takeover, deadline=now_ms() + RUNNER_TURN_MS)
    return run_to_end(app, claim, lambda name: agent)
