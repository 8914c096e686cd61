"""The routes of the ``sessions`` function: create, list, show and delete sessions; page a session's ledger,
its state and a key's audit; fork; erase a person (``POST /erasures``); the OpenAPI document.

``POST /erasures`` (``{scope, scope_id}``) runs ``app.erase`` and answers its report. Erasing and deleting
are administrative (``routes.ADMIN_ROUTES``: a person in the admin group, a machine client with ``dormant/admin``;
``http.request`` checks before the view runs), and only within the caller's own tenant: the app it erases from
is ``{app}@{tenant}``, so another tenant's sessions and shared state are out of its reach by construction.
``GET /openapi.json`` answers the OpenAPI document of every route (``serving.openapi``, built on first ask).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types

from ...audit import key_history
from ...errors import EventIndexError, InputError, VersionConflict
from ...stores.base import SessionListing
from ..bodies import STATUSES, CreateBody, EraseBody, ForkBody
from .idempotency import records
from .request import Api, Request, Routes, check_wait
from .views import events_page, json_response, session_view, state_view, yielded
from .waits import await_events, held_for

__all__ = ["routes"]


def routes(api: Api) -> Routes:
    mine = Routes(api)
    mine.add("POST", "/sessions", create)
    mine.add("GET", "/sessions", listing)
    mine.add("GET", "/sessions/<session_id>", show)
    mine.add("DELETE", "/sessions/<session_id>", delete)
    mine.add("GET", "/sessions/<session_id>/events", ledger)
    mine.add("GET", "/sessions/<session_id>/state", state)
    mine.add("GET", "/sessions/<session_id>/audit", audit)
    mine.add("POST", "/sessions/<session_id>/forks", fork)
    mine.add("POST", "/erasures", erase)
    mine.add("GET", "/openapi.json", openapi)
    return mine


def create(request: Request) -> Response[Any]:
    body = request.body(CreateBody)
    tenant_app = request.app()
    try:
        session = tenant_app.sessions.create(body.session_id, body.scopes)
    except VersionConflict as exc:  # the id is taken
        exc.field = "session_id"
        raise
    return json_response(201, session_view(tenant_app, session, request.caller()))


def listing(request: Request) -> dict[str, Any]:
    limit = request.query_limit(50)
    status = request.event.get_query_string_value("status")
    if status is not None and status not in STATUSES:  # a typo is a 400, not an empty listing
        raise InputError(f"status is one of {', '.join(STATUSES)}, not {status!r}", field="status")
    awaiting = request.event.get_query_string_value("awaiting")
    if awaiting is not None and awaiting != "me":
        raise InputError(f"awaiting is 'me' (the calls this caller may answer), not {awaiting!r}", field="awaiting")
    cursor = request.event.get_query_string_value("cursor")
    tenant_app = request.app()
    sessions = tenant_app.sessions
    if awaiting is not None:
        status = "awaiting_input"
        me = request.caller()

        def mine(row: SessionListing) -> list[dict[str, Any]]:
            session = sessions.get(row.id) if row.status == status else None
            if session is None:
                return []
            return [c for c in yielded(tenant_app, session, me) if c.get("answerable")]

    # The status filter is the store's (an index of app, status, updated_at): one store page, full unless
    # no more match. ``awaiting=me`` keeps, of a page of awaiting_input sessions, those with a call this
    # caller may answer; the cursor goes on after the last session looked at.
    rows = sessions.list(limit=limit, cursor=cursor, status=status)
    cursor = rows[-1].cursor if len(rows) == limit else None
    if awaiting is None:
        return {"sessions": [s._asdict() for s in rows], "cursor": cursor}
    # only the sessions with a call this caller may answer, with those calls
    calls = {row.id: found for row in rows if (found := mine(row))}
    return {"sessions": [{**s._asdict(), "calls": calls[s.id]} for s in rows if s.id in calls], "cursor": cursor}


def show(request: Request, session_id: str) -> dict[str, Any]:
    tenant_app = request.app()
    return session_view(tenant_app, tenant_app.sessions.require(session_id), request.caller())


def delete(request: Request, session_id: str) -> Response[Any]:
    tenant_app = request.app()
    tenant_app.sessions.require(session_id)
    tenant_app.sessions.delete(session_id)
    idempotency = request.api.idempotency
    if idempotency is not None:  # the answers kept for retries hold what the session held
        idempotency.forget(records(tenant_app, session_id))
    return Response(status_code=204, content_type=content_types.APPLICATION_JSON, body="")


def ledger(request: Request, session_id: str) -> Response[Any]:
    """A page of the ledger from event ``after``; with ``wait=S``, held up to S seconds until one lands."""
    after = request.query_int("after") or 0
    limit = request.query_limit(100)
    wait = check_wait(request.event.get_query_string_value("wait"), "wait")
    tenant_app = request.app()
    session = tenant_app.sessions.require(session_id)
    total = len(session.events)
    if after >= total and wait:
        held = held_for(float(wait), request.context)  # never past the function's own deadline
        tail, total = await_events(tenant_app, session_id, session.version, total, after, held)
        return events_page(tail, after, limit, total)
    return events_page(session.events[after : after + limit], after, limit, total)  # no older ledger read


def state(request: Request, session_id: str) -> dict[str, Any]:
    at, since = request.query_int("at"), request.query_int("since")
    session = request.app().sessions.require(session_id)
    try:
        return state_view(session, at, since)
    except EventIndexError as exc:  # name the parameter, not the ledger's index
        exc.field = "since" if since is not None and exc.index == since and exc.index != at else "at"
        raise


def audit(request: Request, session_id: str) -> dict[str, Any]:
    scope, key = request.query_str("scope"), request.query_str("key")
    tenant_app = request.app()
    if scope not in tenant_app.schema:
        raise InputError(f"scope {scope!r} is not one of the app's scopes", field="scope")
    session = tenant_app.sessions.require(session_id)
    changes = key_history(session.events, scope, key)
    # vars(), not asdict(): the values are the ledger's JSON, and a deep copy of each was most of the time
    return {"scope": scope, "key": key, "changes": [dict(vars(change)) for change in changes]}


def fork(request: Request, session_id: str) -> Response[Any]:
    body = request.body(ForkBody)
    tenant_app = request.app()
    try:
        session = tenant_app.sessions.require(session_id)
        forked = session.fork_at(body.at, reason=body.reason, principal=request.caller().principal)
    except EventIndexError as exc:
        exc.field = "at"
        raise
    tenant_app.sessions.commit(forked)
    return json_response(201, session_view(tenant_app, forked, request.caller()))


def erase(request: Request) -> dict[str, Any]:
    body = request.body(EraseBody)
    tenant_app = request.app()
    report = tenant_app.erase(scope=body.scope, scope_id=body.scope_id, principal=request.caller().principal)
    idempotency = request.api.idempotency
    if idempotency is not None:  # the answers kept for retries hold what the sessions held
        for session_id in report.sessions:
            idempotency.forget(records(tenant_app, session_id))
    # What was erased, counted, for the audit; the person's id stays out of the logs.
    request.api.logger.info(
        "erased",
        extra={
            "scope": report.scope,
            "sessions": len(report.sessions),
            "keys": len(report.scoped_keys),
            "principal": report.principal,  # who erased (the erased person's id stays out)
        },
    )
    return dataclasses.asdict(report)


def openapi(request: Request) -> Response[Any]:
    request.tenant()  # behind the authorizer, as every route
    from ..openapi import document_json  # built when first asked for: no cold start pays for it

    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=document_json())
