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
are run on here (``Hooks.hand_on``, ``Hooks.end_wait``): this function takes the invocation on in the answers' own
commit (the take-on appended after them, its deadline the hold's end: one conditional commit, after every answer
rule ran, so a refused answer writes and runs nothing), then ends the parked execution (its task token answered
``inline``: the state machine ends it at once, no second execution), then runs the turn as ``POST /runs`` does
(``run_held``: an execution only if it parks again or outlasts the hold) and answers 200 with it. Take-on first:
killed after it, the turn is ``running`` past its deadline and the sweeper's; the parked execution, never ended,
times out and its ``Expire`` ends nothing (the turn is not waiting). The commit that loses a race (another answerer,
the wait's end) is made again on a fresh load, rules and all, as the answers alone were; a turn whose agent is not
served here is stored answered and woken, as without the hold.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aws_lambda_powertools.event_handler import Response

from ... import metrics
from ...clock import now_ms
from ...errors import InputError, ToolInputError, UnknownCallId
from ...session import Session
from ..bodies import ToolsBody
from ..turns import Claim, run_held, take_on
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
    runs_here = bool(wait) and hooks.hand_on is not None and hooks.end_wait is not None
    until = now_ms() + int(held_for(wait, request.context) * 1000) if runs_here else 0
    taken: list[Claim | None] = [None]  # the take-on of the attempt that landed

    def store(session: Session) -> None:
        taken[0] = None
        if not (retried and _stored_before(session, answers, me.principal)):
            # (stored before: this request's answers landed; nothing to write, what waits is woken below)
            try:  # errors are served as raised (their class, their status), named in this body: answers.N
                # the audit says who answered; the tool's answerable_by must admit them (403, nothing written)
                session.input.answers(answers, principal=me.principal, groups=me.groups)
            except UnknownCallId as exc:
                raise unknown_call(session, exc) from None
        if runs_here and session.status == "resumable":
            taken[0] = _take_on(session)  # appended after the answers, committed with them

    def _take_on(session: Session) -> Claim | None:
        invocation = session.projection.open_invocation
        try:
            agent = request.api.served.agent(session.current_agent_name)
        except InputError:
            return None  # no agent here to run it: the answers are stored alone, and what waits is woken
        assert invocation is not None
        return take_on(tenant_app, lambda _: agent, session, invocation, deadline=until, commit=False)

    def work() -> dict[str, Any]:
        # One commit for the answers and, when this request runs the turn on, its take-on: a version moved by
        # another writer (another answerer, the wait's end) is no reason to fail: both go on a fresh load.
        written = tenant_app.sessions.write(session_id, store, on_conflict="retry", attempts=_ATTEMPTS)
        session = written.session
        metrics.count("answers", len(answers))
        claim = taken[0]
        if claim is not None:
            claim.version = written.version
            return go_on(claim)
        woke = hooks.on_answers(request.tenant(), tenant_app, session) if hooks.on_answers is not None else None
        answered = {"version": session.version, "status": session.status, **(woke or {})}
        if wait and answered["status"] in ("resumable", "running"):
            held = held_for(wait, request.context)  # never past the function's deadline: the answers are stored
            outcome = await_turn(tenant_app, session_id, int(answered["version"]), None, held)
            if outcome is not None:
                return {"status": 200, "body": finished(tenant_app, outcome, me)}
        return {"status": 202, "body": answered}

    def go_on(claim: Claim) -> dict[str, Any]:
        """Run the answered turn here, taken on with its answers (see the module docstring)."""
        tenant, invocation = request.tenant(), claim.invocation_id
        assert hooks.hand_on is not None and hooks.end_wait is not None and invocation is not None
        hand_on, end_wait = hooks.hand_on, hooks.end_wait
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
