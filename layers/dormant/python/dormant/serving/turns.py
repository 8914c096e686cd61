"""Turns that outlive the request: claim a turn in one call, run it in another, committing as it goes.

A server cannot run a turn inside a request that API Gateway and Lambda stop at 29 s. So a turn is two
acts, which ``advance`` joins for callers that can wait:

* ``claim_turn`` adds the caller's input and opens (or resumes) the invocation, and commits both under
  optimistic concurrency: the *claim*. Of two callers racing on one session, one claim lands; the other
  gets ``ClaimLost`` with nothing run or written. The claim records a ``deadline`` by which a runner must
  have taken the turn on.
* ``run_claimed`` (the same process, the claim's own run; ``run_held``: the request that waits for it) or
  ``resume_turn`` (any process, later: the workflow's ``Run`` task) runs the turn, committing before every
  model call and tool execution, so a runner killed half way loses at most the step in flight. A runner
  records its own deadline when it takes the invocation on, and stops taking steps a little before it
  (status ``handed_on``): the next runner goes on from the last committed step without re-running
  completed tool calls.

A runner whose commit meets another writer stops at once (``ClaimLost``): another runner holds the turn.
Its own last events go through ``serving.commit``'s merge-or-fork at the end, so nothing is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..clock import now_ms
from ..errors import (
    ClaimLost,
    CommitIncomplete,
    ModelUnavailable,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from ..events import InvocationResumeEvent, InvocationStartEvent, ModelEndEvent
from ..ids import new_id
from ..models.base import calls_end_by
from ..projection import Output, YieldedTool
from ..session import Session
from .commit import CommitStatus, commit

if TYPE_CHECKING:
    from ..agents.agent import Agent
    from ..agents.run import RunStatus, RunStream
    from ..app import App

__all__ = [
    "CLAIM_GRACE_MS",
    "RUNNER_TURN_MS",
    "STEP_RESERVE_MS",
    "AdvanceOutcome",
    "Claim",
    "claim_turn",
    "resume_turn",
    "run_claimed",
    "run_held",
    "run_to_end",
    "take_on",
]

RUNNER_TURN_MS = 2 * 60_000
"""How long a runner in a long-lived process (``advance``, ``dormant serve``) holds a turn before it hands on to
itself: the deadline it records, so a runner that died is found within minutes."""
CLAIM_GRACE_MS = 5 * 60_000
"""The deadline a claim records: its runner must have taken the turn on by then (else the sweeper does)."""

_logger = logging.getLogger("dormant.serving")

STEP_RESERVE_MS = 60_000
"""A runner takes no new step with less than this (or a fifth of its time, if less) left before its
deadline: the step's model call or tool must fit in what remains."""


def _stop_at(deadline: int | None) -> int | None:
    """When a runner with ``deadline`` stops taking steps."""
    if deadline is None:
        return None
    return deadline - min(STEP_RESERVE_MS, max(0, deadline - now_ms()) // 5)


_STORE_REFUSALS: tuple[type[StoreError], ...] = (StoreBusy, StoreUnavailable, CommitIncomplete)
"""A store's transient refusals of a step's commit (a throttle, a lock, a lost connection, a partial write): the
runner stops there, as at its deadline, instead of ending the turn in error; the step stays uncommitted."""


class _Checkpoint:
    """The run's checkpoint: commit what the run holds; stop near the deadline, once another writer won, or when the
    store refused the step's commit for now (``refused``)."""

    def __init__(self, app: App, session: Session) -> None:
        self.app, self.session = app, session
        self.stop_at: int | None = None
        self.lost: VersionConflict | None = None
        self.refused: StoreError | None = None

    def __call__(self) -> bool:
        if self.session.uncommitted_events:
            try:
                self.app.sessions.write(session=self.session, change=_as_run, on_conflict="fail")
            except VersionConflict as conflict:
                self.lost = conflict
                return False
            except _STORE_REFUSALS as exc:  # the step stays the run's; the runner hands the turn on
                self.refused = exc
                return False
        return self.stop_at is None or now_ms() < self.stop_at


@dataclass(frozen=True)
class AdvanceOutcome:
    """What a claimed run came to, and how it was stored."""

    status: RunStatus
    """The run's status: ``completed``, ``yielded_tool``, ``error``, ``max_steps``, or ``handed_on`` (the runner
    stopped near its deadline; the next one goes on)."""
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


@dataclass
class Claim:
    """A claimed turn: its input and invocation start are stored; nothing has run yet."""

    session: Session
    invocation_id: str | None
    """The invocation the turn runs in; ``None`` when the input opened none (state set while calls wait)."""
    version: int
    """The stored version after the claim."""
    after: int
    """The index of the turn's first event in the ledger."""
    wrote: bool = True
    """Whether the claim stored anything (an input that opened no invocation may change nothing)."""
    stream: RunStream | None = None
    checkpoint: _Checkpoint | None = None


def claim_turn(
    app: App,
    agent: Agent,
    session: Session | str,
    input: Any = None,
    *,
    takeover: bool = False,
    invocation_id: str | None = None,
    deadline: int | None = None,
    principal: str | None = None,
    groups: Iterable[str] = (),
) -> Claim:
    """Add ``input`` to ``session`` and open its invocation, committed as one claim, or raise ``ClaimLost``.

    ``invocation_id`` names the invocation a new turn opens (a server starts its runner, named after it,
    before claiming); ``deadline`` (ms since the epoch) is recorded on the invocation: by then a runner must
    have taken it on, else the sweeper hands it on. ``principal`` (a member of ``groups``) is the caller: recorded
    on the invocation's start and on the input's answers. Raises the typed input errors of ``app.run`` (nothing
    written).
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
    after = len(session.events)
    invocation_id = session.projection.open_invocation or invocation_id or new_id("inv_")
    checkpoint = _Checkpoint(app, session)
    stream = app.stream(
        agent,
        input,
        session=session,
        invocation_id=invocation_id,
        deadline=deadline,
        checkpoint=checkpoint,
        principal=principal,
        groups=groups,
    )
    for event in stream:
        if isinstance(event, InvocationStartEvent | InvocationResumeEvent):
            version = _claim(app, session)
            return Claim(session, event.invocation_id, version, after, True, stream, checkpoint)
    wrote = bool(session.uncommitted_events) or session.version == 0
    return Claim(session, None, _claim(app, session), after, wrote, stream)


def run_claimed(
    app: App, claim: Claim, *, deadline: int | None = None, hand_on_unavailable: bool = False
) -> AdvanceOutcome:
    """Run a turn this process claimed, on from its claim, committing before every step. With
    ``hand_on_unavailable``, a model call that ends ``ModelUnavailable`` (its time ran out) is not committed:
    the run stops ``handed_on`` at its last committed step, for a runner with more time to make the call again."""
    assert claim.stream is not None, "a claim is run once"
    stream, checkpoint, claim.stream = claim.stream, claim.checkpoint, None
    if checkpoint is not None:
        checkpoint.stop_at = _stop_at(deadline)
    claimed = claim.invocation_id is not None
    outcome = _finish(
        app,
        claim.session,
        stream,
        checkpoint,
        claimed=claimed,
        agent=claim.session.current_agent_name,
        hand_on_unavailable=hand_on_unavailable,
    )
    if not claimed and claim.wrote:
        return replace(outcome, commit_status="committed", version=claim.version)
    return outcome


def run_to_end(
    app: App, claim: Claim, agent_for: Callable[[str | None], Agent], *, turn_ms: int = RUNNER_TURN_MS
) -> AdvanceOutcome:
    """Run a claim here to its end, as a runner with ``turn_ms`` at a time: each time its deadline nears it
    hands on to itself (a resume, recorded with a new deadline), so a sweeper can tell a live runner from one
    that died, whatever the turn's length."""
    outcome = run_claimed(app, claim, deadline=now_ms() + turn_ms)
    while outcome.status == "handed_on" and claim.invocation_id is not None:
        resumed = resume_turn(app, agent_for, claim.session.id, claim.invocation_id, deadline=now_ms() + turn_ms)
        if not isinstance(resumed, AdvanceOutcome):
            break
        outcome = resumed
    return outcome


def run_held(app: App, claim: Claim, *, until: int, hand_on: Callable[[int, bool], object]) -> AdvanceOutcome | None:
    """Run a claimed turn in the request that waits for it, until ``until`` (ms since the epoch: the end of the
    request's hold, which the claim records as its deadline), and hand it on where it cannot end here.

    ``hand_on(version, parked)`` starts the runner that carries the turn on (on AWS: a Step Functions execution):
    when it parks (``parked``: its execution starts at the wait), when the hold runs short (``handed_on``: the next
    runner goes on from the last committed step), when a model call would outlast the hold (that step is dropped
    uncommitted and the call is made again by the next runner: its tokens are paid twice), and when the run fails
    here in any other way (``None``: the caller answers with what is on the ledger). A ``hand_on`` that fails is
    logged and left to the sweeper: a running turn past its deadline is handed on, a wait with no execution gets one.
    """
    try:
        with calls_end_by(until / 1000):
            outcome: AdvanceOutcome | None = run_claimed(app, claim, deadline=until, hand_on_unavailable=True)
    except ClaimLost:
        return None  # another runner took the turn on (a sweep, a takeover): it carries it on
    except Exception as exc:  # a store's refusal mid-turn: the steps committed stand, the next runner goes on
        _logger.warning("dormant: the held run of %s stopped: %s: %s", claim.session.id, type(exc).__name__, exc)
        outcome = None
    if outcome is not None and outcome.status not in ("yielded_tool", "handed_on"):
        return outcome
    if outcome is not None and outcome.status == "handed_on" and outcome.error is not None:
        _logger.warning(
            "dormant: a model call outlasted the hold of %s; made again: %s", claim.session.id, outcome.error
        )
    version = claim.session.version if outcome is None else outcome.version
    parked = outcome is not None and outcome.status == "yielded_tool"  # its runner starts at the wait (Park)
    try:
        hand_on(version, parked)
    except Exception as exc:  # throttled, refused: the sweeper repairs it (the claim's deadline is the hold's end)
        _logger.warning("dormant: %s was not handed on: %s: %s", claim.session.id, type(exc).__name__, exc)
    return outcome


def resume_turn(
    app: App, agent_for: Callable[[str | None], Agent], session_id: str, invocation_id: str, *, deadline: int | None
) -> AdvanceOutcome | Session:
    """Take invocation ``invocation_id`` of a stored session on and run it, committing before every step.

    Returns the ``Session`` unchanged when there is nothing to run: the invocation ended, waits for answers,
    or is not on the ledger (yet). A runner whose own take-over loses to another writer gets ``ClaimLost``.
    """
    session = app.sessions.require(session_id)
    if session.projection.open_invocation != invocation_id or session.status == "awaiting_input":
        return session
    checkpoint = _Checkpoint(app, session)
    checkpoint.stop_at = _stop_at(deadline)
    agent = agent_for(session.current_agent_name)
    if session.status == "resumable":  # its answers are in: the turn goes on after its wait
        metrics.count("resumes", agent=agent.name)
    stream = app.stream(agent, None, session=session, deadline=deadline, checkpoint=checkpoint)
    # The resume event is this runner's claim: committed before anything runs.
    for event in stream:
        if isinstance(event, InvocationResumeEvent):
            _claim(app, session)
            break
    return _finish(app, session, stream, checkpoint, claimed=True, agent=agent.name)


def take_on(
    app: App,
    agent_for: Callable[[str | None], Agent],
    session: Session,
    invocation_id: str,
    *,
    deadline: int,
    commit: bool = True,
) -> Claim | None:
    """Take invocation ``invocation_id`` of ``session`` (loaded) on as ``resume_turn`` does, committing its take-on
    with ``deadline`` (ms since the epoch: the sweeper's cue), and return it as a claim ``run_held`` runs, not yet
    run. ``None`` when there is nothing to run (the invocation ended or still waits for answers); ``ClaimLost``
    when another writer moved the session first (another runner took it on).

    ``commit=False``: the take-on is appended to ``session`` and not committed; the caller commits it with what it
    appended before (``POST /tools``: the answers, one commit for both) and sets the claim's ``version``."""
    if session.projection.open_invocation != invocation_id or session.status == "awaiting_input":
        return None
    after = len(session.events)
    checkpoint = _Checkpoint(app, session)
    agent = agent_for(session.current_agent_name)
    if session.status == "resumable":
        metrics.count("resumes", agent=agent.name)
    stream = app.stream(agent, None, session=session, deadline=deadline, checkpoint=checkpoint)
    for event in stream:
        if isinstance(event, InvocationResumeEvent):
            version = _claim(app, session) if commit else session.version
            return Claim(session, invocation_id, version, after, True, stream, checkpoint)
    return None


def _finish(
    app: App,
    session: Session,
    stream: RunStream,
    checkpoint: _Checkpoint | None,
    *,
    claimed: bool,
    agent: str | None = None,
    hand_on_unavailable: bool = False,
) -> AdvanceOutcome:
    started = time.perf_counter()
    result = stream.finish()
    if hand_on_unavailable and claimed and result.status == "error" and _unavailable(session):
        # Nothing of the failed call is committed: the ledger stands at the last step, still running.
        return AdvanceOutcome(
            status="handed_on",
            session_id=session.id,
            output=session.output,
            yielded_tools=[],
            commit_status="skipped",
            version=session.version,
            session=session,
            error=result.error,  # the call's, for the log: not on the ledger
        )
    if claimed:
        metrics.count("turn_ms", (time.perf_counter() - started) * 1000, agent=agent)
        if result.status == "yielded_tool":
            metrics.count("yields", agent=agent)
        elif result.status == "error":
            metrics.count("failures")
    if checkpoint is not None and checkpoint.refused is not None:  # its step's commit is tried once more, below
        refused = checkpoint.refused
        _logger.warning(
            "dormant: a step's commit of %s was refused (%s: %s): the turn is handed on from it",
            session.id,
            type(refused).__name__,
            refused,
        )
    if checkpoint is not None and checkpoint.lost is not None:
        lost = checkpoint.lost
        raise ClaimLost(
            session.id,
            expected_version=lost.expected_version,
            actual_version=lost.actual_version,
            reason="another runner took the turn on; this one stopped before its next step",
        )
    if claimed:
        outcome = commit(app, session)
        commit_status, version, fork_id = outcome.status, outcome.version, outcome.fork_id
    else:
        commit_status, version, fork_id = "skipped", session.version, None
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


def _unavailable(session: Session) -> bool:
    """Whether the run's last model call, uncommitted, ended ``ModelUnavailable`` (an adapter's subclass of it)."""
    for event in reversed(session.uncommitted_events):
        if isinstance(event, ModelEndEvent):
            return event.error_type is not None and event.error_type in _names(ModelUnavailable)
    return False


def _names(kind: type) -> set[str]:
    """The names of ``kind`` and of its subclasses loaded (an adapter that raised one has loaded it)."""
    names, todo = set(), [kind]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _claim(app: App, session: Session) -> int:
    """Commit what the session holds now (a strict write: no retry, no merge), or raise ``ClaimLost``:
    another writer got there first."""
    expected = session.version
    try:
        return app.sessions.write(session=session, change=_as_run, on_conflict="fail").version
    except VersionConflict as conflict:
        raise ClaimLost(
            session.id,
            expected_version=expected,
            actual_version=conflict.actual_version,
            reason=f"another writer moved it from version {expected} to {conflict.actual_version} first",
        ) from None


def _as_run(session: Session) -> None:
    """A claim's or a step's change is what the run appended already (its input, its steps)."""
