"""The route of the ``tools`` function: ``POST /sessions/{id}/tools`` stores answers to yielded calls, then
wakes what waits on them (``Hooks.on_answers``: on AWS, the waiting execution).

An answer the tool's ``answerable_by`` refuses this caller is a 403 (``AnswerRefused``) and writes nothing;
a machine client needs ``dormant/answers.write``.

Answers retried with their ``Idempotency-Key`` after the first attempt stored them but lost its answer (its
function timed out, or waking the execution failed, after the commit; the idempotency record then expires or is
dropped) are found on the ledger, each call answered by this caller with this input and its tool not run yet:
nothing is written again, and what waits on them is woken again (a wake is idempotent), so a lost wake-up is
mended by the client's retry, not left for the sweeper.

On AWS, answers whose caller waits (``Prefer: wait``) and that leave the turn ready to go on (nothing else pending)
are run on here (``Hooks.hand_on``, ``Hooks.end_wait``): this function takes the invocation on (its take-on's
deadline the hold's end), then ends the parked execution (its task token answered ``inline``: the state machine
ends it at once, no second execution), then runs the turn as ``POST /runs`` does (``run_held``: an execution only
if it parks again or outlasts the hold) and answers 200 with it. Take-on first: killed after it, the turn is
``running`` past its deadline and the sweeper's; the parked execution, never ended, times out and its ``Expire``
ends nothing (the turn is not waiting). A take-on that loses (another runner has it) answers as without the hold.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aws_lambda_powertools.event_handler import Response

from ... import metrics
from ...clock import now_ms
from ...errors import ClaimLost, ToolInputError, UnknownCallId
from ...session import Session
from ..bodies import ToolsBody
from ..turns import STORE_REFUSALS, run_held, take_on
from .idempotency import once
from .request import Api, Request, Routes
from .views import finished, unknown_call
from .waits import await_turn, held_for

__all__ = ["routes"]

_ATTEMPTS = 5
_logger = logging.getLogger("dormant.serving")


def routes(api: Api) -> Routes:
    mine = Routes(api)
    mine.add("POST", "/sessions/<session_id>/tools", answer)
    return mine


def answer(request: Request, session_id: str) -> Response[Any]:
    body = request.body(ToolsBody)
    wait = request.prefer_wait()
    tenant_app = request.app()
    answers = [a.model_dump() for a in body.answers]
    me = request.caller()
    hooks = request.api.hooks
    retried = request.idempotency_key() is not None

    def store(session: Session) -> None:
        if retried and _stored_before(session, answers, me.principal):
            return  # this request's answers landed before: nothing to write; what waits is woken below
        try:  # errors are served as raised (their class, their status), named in this body: answers.N
            # the audit says who answered; the tool's answerable_by must admit them (403, nothing written)
            session.input.answers(answers, principal=me.principal, groups=me.groups)
        except UnknownCallId as exc:
            raise unknown_call(session, exc) from None

    def work() -> dict[str, Any]:
        # A version moved by park storing its token is no reason to fail: the answers go on a fresh load.
        session = tenant_app.sessions.write(session_id, store, on_conflict="retry", attempts=_ATTEMPTS).session
        metrics.count("answers", len(answers))
        if wait and session.status == "resumable" and hooks.hand_on is not None and hooks.end_wait is not None:
            went_on = go_on(session)
            if went_on is not None:
                return went_on
        woke = hooks.on_answers(request.tenant(), tenant_app, session) if hooks.on_answers is not None else None
        answered = {"version": session.version, "status": session.status, **(woke or {})}
        if wait and answered["status"] in ("resumable", "running"):
            held = held_for(wait, request.context)  # never past the function's deadline: the answers are stored
            outcome = await_turn(tenant_app, session_id, int(answered["version"]), None, held)
            if outcome is not None:
                return {"status": 200, "body": finished(tenant_app, outcome, me)}
        return {"status": 202, "body": answered}

    def go_on(session: Session) -> dict[str, Any] | None:
        """Run the answered turn here (see the module docstring); ``None``: another runner has it."""
        tenant, invocation = request.tenant(), session.projection.open_invocation
        assert hooks.hand_on is not None and hooks.end_wait is not None and invocation is not None
        hand_on, end_wait = hooks.hand_on, hooks.end_wait
        until = now_ms() + int(held_for(wait, request.context) * 1000)
        try:
            claim = take_on(tenant_app, request.api.served.agent, session, invocation, deadline=until)
        except ClaimLost:
            return None  # another runner took it on first: it carries the turn on
        except STORE_REFUSALS as exc:  # the answers are stored: the parked execution is woken and carries it on
            _logger.warning(
                "dormant: the answered turn of %s was not taken on here: %s: %s", session_id, type(exc).__name__, exc
            )
            return None
        if claim is None:
            return None
        try:  # the parked execution ends at once: this function runs the turn
            end_wait(tenant, tenant_app, claim.session)
        except Exception as exc:  # throttled, refused: it stays parked until its timeout, and its Expire ends nothing
            _logger.warning("dormant: the wait of %s was not ended: %s: %s", session_id, type(exc).__name__, exc)
        outcome = run_held(tenant_app, claim, until=until, hand_on=partial(hand_on, tenant, session_id, invocation))
        if outcome is None or outcome.status == "handed_on":
            return {"status": 202, "body": {"version": claim.session.version, "status": "running", "woke": False}}
        return {"status": 200, "body": finished(tenant_app, outcome, me)}

    return once(request, tenant_app, session_id, work)


def _stored_before(session: Session, answers: list[dict[str, Any]], principal: str | None) -> bool:
    """Whether every one of ``answers`` is on the ledger as given by ``principal``, its tool not run yet: its input
    as the tool checks it (``check_input``, which stored the first attempt's) equal to what is stored."""
    answered = session.projection.answered
    for position, given in enumerate(answers):
        stored = answered.get(given["call_id"])
        tool = session.runtime.tool_named(stored.name) if stored is not None else None
        if stored is None or tool is None or stored.principal != principal:
            return False
        try:
            if tool.check_input(stored.call_id, given["input"], position) != stored.input:
                return False
        except ToolInputError:
            return False  # not what was stored: the answers' usual errors say why
    return True
