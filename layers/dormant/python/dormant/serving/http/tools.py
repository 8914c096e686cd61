"""The route of the ``tools`` function: ``POST /sessions/{id}/tools`` stores answers to yielded calls, then
wakes what waits on them (``Hooks.on_answers``: on AWS, the waiting execution).

An answer the tool's ``answerable_by`` refuses this caller is a 403 (``AnswerRefused``) and writes nothing;
a machine client needs ``dormant/answers.write``.

Answers retried with their ``Idempotency-Key`` after the first attempt stored them but lost its answer (its
function timed out, or waking the execution failed, after the commit; the idempotency record then expires or is
dropped) are found on the ledger, each call answered by this caller with this input and its tool not run yet:
nothing is written again, and what waits on them is woken again (a wake is idempotent), so a lost wake-up is
mended by the client's retry, not left for the sweeper.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response

from ... import metrics
from ...errors import ToolInputError, UnknownCallId
from ...session import Session
from ..bodies import ToolsBody
from .idempotency import once
from .request import Api, Request, Routes
from .views import finished, unknown_call
from .waits import await_turn, held_for

__all__ = ["routes"]

_ATTEMPTS = 5


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
        woke = hooks.on_answers(request.tenant(), tenant_app, session) if hooks.on_answers is not None else None
        answered = {"version": session.version, "status": session.status, **(woke or {})}
        if wait and answered["status"] in ("resumable", "running"):
            held = held_for(wait, request.context)  # never past the function's deadline: the answers are stored
            outcome = await_turn(tenant_app, session_id, int(answered["version"]), None, held)
            if outcome is not None:
                return {"status": 200, "body": finished(tenant_app, outcome, me)}
        return {"status": 202, "body": answered}

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
