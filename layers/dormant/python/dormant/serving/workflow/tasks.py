"""The workflow's tasks, one Lambda handler for them all: ``run``, ``park``, ``expire`` and ``fail`` of one
invocation (see ``serving.workflow`` for what each does and how the state machine strings them together)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ... import metrics
from ...app import App
from ...clock import now_ms
from ...errors import ClaimLost, InputError, TurnNotClaimed
from ...events import InvocationEndEvent
from ...models.base import calls_end_by
from ...session import Session
from ...stores.base import RepairableStore
from ..runtime import Served, served_from_env
from ..turns import AdvanceOutcome, resume_turn
from .stepfunctions import _ATTEMPTS, StepFunctions, wait_record

MODEL_END_RESERVE_MS = 10_000
"""What a run keeps of its function's time after a model call gave up: to record the error and commit."""

CLAIM_GRACE_S = (0.05, 0.1, 0.2, 0.4)
"""Pauses before a ``run`` reads the session again for a claim not on the ledger yet (the API starts the
execution just before it commits the claim): a few reads within a second cost less than the state machine's
retry of ``TurnNotClaimed`` (a state transition, an invocation and its back-off)."""


def end_invocation(
    app: App,
    session_id: str,
    invocation_id: str,
    error: str,
    error_type: str,
    *,
    only_waiting: bool = False,
    holder: str | None = None,
) -> dict[str, Any]:
    """End invocation ``invocation_id`` as an ``error`` with the reason, if it is still open (and, with
    ``only_waiting``, still waiting on answers; with ``holder``, an execution's ARN, only while no other
    execution holds the wait); report the session's status either way."""
    if holder is not None:
        parked = wait_record(app, session_id).get("execution")
        if parked and parked != holder:  # the sweeper gave the wait to another execution: that one ends it
            return {"status": "superseded"}

    def end(session: Session) -> None:
        if session.projection.open_invocation != invocation_id:
            return  # ended already, or another invocation's: nothing to end
        if only_waiting and session.status != "awaiting_input":
            return  # answered as the wait timed out: honoured, the state machine runs it on
        session.append(
            InvocationEndEvent(invocation_id=invocation_id, status="error", error=error, error_type=error_type)
        )

    written = app.sessions.write(session_id, end, on_conflict="retry", attempts=_ATTEMPTS)
    if written.status == "skipped":
        return {"status": written.session.status}
    metrics.count("expiries" if error_type == "SessionExpired" else "failures")
    return {"status": written.session.status, "version": written.version}


def run_action(
    served: Served, app: App, session_id: str, invocation_id: str, deadline: int | None, *, retried: bool = False
) -> dict[str, Any]:
    """The workflow's ``run``: take the invocation on and run it; report where it stands. A ``retried`` run
    (Step Functions' retry of ``Run``) first frees the session of a commit its dead predecessor left pending."""
    if retried:
        repair_after_lost_runner(app, session_id, invocation_id)
    for pause in (*CLAIM_GRACE_S, None):
        try:
            outcome = resume_turn(app, served.agent, session_id, invocation_id, deadline=deadline)
        except ClaimLost:  # another runner holds the turn: that runner's execution carries it on
            return {"status": "superseded"}
        if isinstance(outcome, AdvanceOutcome):
            return {"status": outcome.status, "version": outcome.version}
        session = outcome
        if session.projection.open_invocation == invocation_id:  # waiting on answers: park (again)
            return {"status": "yielded_tool", "version": session.version}
        node = session.projection.invocations.get(invocation_id)
        if node is not None or _ended_before(session, invocation_id):
            return {"status": node.status if node is not None else "ended", "version": session.version}
        if pause is not None:  # the claim may be landing right now: read again before costing a retry
            time.sleep(pause)
    raise TurnNotClaimed(f"invocation {invocation_id!r} of session {session_id!r} is not on the ledger yet")


def repair_after_lost_runner(app: App, session_id: str, invocation_id: str) -> bool:
    """Finish or undo the commit a killed runner of this turn left pending (stores that gate commits): its
    retry must not wait on a dead writer's marker until it turns stale (``StoreBusy`` again and again, each
    costing a retry). Only for a claimed turn still running: a retry of ``TurnNotClaimed`` may meet the API's
    claim in flight, which is no dead writer's."""
    store = app.store
    if not isinstance(store, RepairableStore):
        return False
    session = app.sessions.get(session_id)
    if session is None or session.status != "running" or session.projection.open_invocation != invocation_id:
        return False
    return store.repair_session(app.name, session_id) is not None


def _ended_before(session: Session, invocation_id: str) -> bool:
    """Whether ``invocation_id`` is on the ledger (a snapshot keeps only open invocations; read the events)."""
    return any(event.invocation_id == invocation_id for event in session.events)


def workflow_handler(
    served: Served | None = None, step_functions: StepFunctions | None = None, function: str | None = None
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler the state machine calls (see the module docstring for its actions). ``park`` needs
    ``step_functions`` (a client; no ARN) to wake itself when answers came first. ``function``: the function's
    name its metrics carry (``None``: named by the action, park's or resume's)."""
    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    logger = Logger()
    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # the library's loggers write through this one, keys and all
        copy_config_to_registered_loggers(source_logger=logger, include={"dormant"})

    @logger.inject_lambda_context(log_event=False, clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        logger.append_keys(
            tenant=event.get("tenant"),
            principal="workflow",  # the state machine acts for the tenant who claimed the turn
            session_id=event.get("session_id"),
            invocation_id=event.get("invocation_id"),
            action=event.get("action"),
        )
        # One function parks and records Run's failures (park), another runs, expires and records Park's (resume).
        with metrics.collecting(function or ("park" if event.get("action") == "park" else "resume")):
            return _act(event, context)

    def _act(event: dict[str, Any], context: Any) -> dict[str, Any]:
        chosen = served or served_from_env()
        app = chosen.for_tenant(str(event["tenant"]))
        session_id = str(event["session_id"])
        invocation_id = str(event["invocation_id"])
        action = event["action"]
        if action == "run":
            remaining = int(context.get_remaining_time_in_millis())
            deadline = now_ms() + remaining
            retried = int(event.get("retry") or 0) > 0  # Step Functions' $$.State.RetryCount
            with calls_end_by(time.time() + (remaining - MODEL_END_RESERVE_MS) / 1000):
                return run_action(chosen, app, session_id, invocation_id, deadline, retried=retried)
        if action == "park":
            if step_functions is None:
                raise InputError("this function is not wired to answer task tokens", field="action")
            execution, wait, error = event.get("execution"), event.get("wait_seconds"), event.get("answer_error")
            return step_functions.park(
                app,
                session_id,
                invocation_id,
                str(event["token"]),
                execution=None if execution is None else str(execution),
                wait_seconds=None if wait is None else float(wait),
                answer_error=None if error is None else str(error),
            )
        if action == "expire":
            holder = event.get("execution")
            return end_invocation(
                app,
                session_id,
                invocation_id,
                "the wait for answers timed out",
                "SessionExpired",
                only_waiting=True,
                holder=None if holder is None else str(holder),
            )
        if action == "fail":
            error = event.get("error") or {}
            cause, kind = str(error.get("Cause") or error), str(error.get("Error", "Failed"))
            return end_invocation(app, session_id, invocation_id, cause, kind)
        raise InputError(f"unknown workflow action {action!r}", field="action")

    return handler
