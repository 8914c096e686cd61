"""The route of the ``run`` function: ``POST /sessions/{id}/runs`` claims the turn and answers 202.

``Location``: the session; ``after``: the index of the turn's first event. The turn runs outside the request
(``Hooks``: on AWS a Step Functions execution, started before the claim; under ``dormant serve`` a thread),
committing each step, so ``GET /sessions/{id}`` shows it ``running`` and ``GET /sessions/{id}/events?after=``
its steps. ``Prefer: wait=N`` (N <= 25) answers 200 with the finished turn when it ends in time.

On AWS a request with ``Prefer: wait`` runs its turn itself (``Hooks.hand_on``): no execution is started before
the claim, and none at all for a turn that ends within the hold. The claim's deadline is the hold's end; a turn
that parks, runs past the hold or meets a model call that would outlast it is handed to an execution then
(``run_held``); a run function that dies mid-turn leaves it to the sweeper, once that deadline passed.

With an ``Idempotency-Key``, a new turn's invocation id is derived from it (``keyed_invocation``): a retry whose
first attempt's claim landed but whose answer was lost (its function timed out, and the idempotency record it left
in progress expired with it) finds that invocation on the ledger and answers for it (202, the turn's ``after``),
claiming nothing: a turn is claimed once per key, not once per attempt.
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

from aws_lambda_powertools.event_handler import Response

from ... import metrics
from ...clock import now_ms
from ...errors import ClaimLost, DormantError
from ...ids import new_id
from ...session import Session
from ..bodies import RunBody
from ..turns import CLAIM_GRACE_MS, AdvanceOutcome, claim_turn, run_held, run_to_end
from .idempotency import once
from .request import Api, Request, Routes
from .views import finished
from .waits import await_turn, held_for

__all__ = ["keyed_invocation", "routes"]


def routes(api: Api) -> Routes:
    mine = Routes(api)
    mine.add("POST", "/sessions/<session_id>/runs", run)
    return mine


def run(request: Request, session_id: str) -> Response[Any]:
    body = request.body(RunBody)
    wait = request.prefer_wait()
    tenant_app = request.app()
    api = request.api
    hooks, quota, served = api.hooks, api.quota, api.served
    agent = served.agent(body.agent)
    run_input = {k: v for k, v in (("message", body.message), ("state", body.state)) if v is not None}
    me = request.caller()
    key = request.idempotency_key()
    keyed = keyed_invocation(request.tenant(), session_id, key) if key else None

    def work() -> dict[str, Any]:
        session = tenant_app.sessions.require(session_id)
        projection = session.projection
        if keyed is not None and (keyed in projection.invocations or keyed in projection.recent_invocations):
            return _claimed_before(session, keyed)  # an earlier attempt's claim landed: this turn, not another
        invocation_id = projection.open_invocation or keyed or new_id("inv_")
        api.logger.append_keys(invocation_id=invocation_id)
        # A caller that waits has its turn run here, until the hold ends: its claim's deadline (the sweeper's cue).
        held = wait > 0 and hooks.hand_on is not None
        until = now_ms() + int(held_for(wait, request.context) * 1000) if held else None
        # No execution for a claim that must fail, nor for input that opens no invocation (state set while
        # calls wait: the execution parked on them goes on waiting), nor yet for a turn run here.
        starts = hooks.before_claim is not None and session.status != "awaiting_input" and not held
        if starts and session.status == "running" and not body.takeover:
            raise _held(session)
        # Before anything is started or claimed: past it, a 429 and nothing run. A claim refused after it
        # (409 AwaitingInput, ClaimLost, a 4xx: nothing claimed) gives the turn back: claims are counted.
        taken = quota.take(tenant_app.store, served.app.name, request.tenant()) if quota is not None else None
        try:
            if starts and hooks.before_claim is not None:
                hooks.before_claim(request.tenant(), session_id, invocation_id, session.version)
            claim = claim_turn(
                tenant_app,
                agent,
                session,
                run_input or None,
                takeover=body.takeover,
                invocation_id=invocation_id,
                deadline=until or now_ms() + CLAIM_GRACE_MS,
                principal=me.principal,  # who started it: the ledger says so, and the starter rules read it
                groups=me.groups,
            )
        except DormantError as refused:
            if quota is not None and taken is not None and refused.http_status < 500:
                quota.give_back(tenant_app.store, taken)
            raise
        metrics.count("turns", agent=agent.name)
        if claim.invocation_id is None or (hooks.run is None and hooks.before_claim is None):
            outcome: AdvanceOutcome | None = run_to_end(tenant_app, claim, served.agent)  # this request runs it
        elif until is not None and hooks.hand_on is not None:
            tenant, invocation, hand_on = request.tenant(), claim.invocation_id, hooks.hand_on
            outcome = run_held(tenant_app, claim, until=until, hand_on=partial(hand_on, tenant, session_id, invocation))
            if outcome is not None and outcome.status == "handed_on":
                outcome = None  # it runs on in its execution: 202
        else:
            started = hooks.run(request.tenant(), tenant_app, claim) if hooks.run is not None else None
            # never past the function's deadline: the claim landed, the answer must too (a 202 if it runs on)
            outcome = await_turn(tenant_app, session_id, claim.version, started, held_for(wait, request.context))
        if outcome is not None:
            return {"status": 200, "body": finished(tenant_app, outcome, me)}
        return {
            "status": 202,
            "body": {"status": "running", "session_id": session_id, "version": claim.version, "after": claim.after},
            "headers": {"Location": f"/sessions/{session_id}"},
        }

    return once(request, tenant_app, session_id, work)


def keyed_invocation(tenant: str, session_id: str, key: str) -> str:
    """The invocation id a new turn claimed under ``key`` opens: the same for every attempt of one request."""
    digest = hashlib.sha256(f"{tenant}\n{session_id}\nPOST runs\n{key}".encode()).hexdigest()[:32]
    return f"inv_k{digest}"


def _claimed_before(session: Session, invocation_id: str) -> dict[str, Any]:
    """The answer to a retry whose turn is on the ledger: where it started, and where the session stands now."""
    projection = session.projection
    node = projection.invocations.get(invocation_id)
    after = node.start_index if node is not None else projection.recent_invocations[invocation_id]
    return {
        "status": 202,
        "body": {"status": session.status, "session_id": session.id, "version": session.version, "after": after},
        "headers": {"Location": f"/sessions/{session.id}"},
    }


def _held(session: Session) -> ClaimLost:
    return ClaimLost(
        session.id,
        expected_version=session.version,
        actual_version=session.version,
        reason="an invocation is running on it (or its process died: resume it with takeover)",
    )
