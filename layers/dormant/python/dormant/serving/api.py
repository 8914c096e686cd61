"""The HTTP API as Lambda handlers behind API Gateway (REST, proxy integration), with Powertools.

``api_handler()`` builds one function's handler: a Powertools ``APIGatewayRestResolver`` with the
routes of ``serving.routes``, a ``Logger`` that carries the request id as correlation id, the invocation's
``dormant.metrics`` published as EMF, and a ``Tracer`` only when tracing is on (it
imports the X-Ray SDK, which costs a cold start nothing uses otherwise).

What a caller gets: JSON in and out; bad input a 400 naming the field; an unknown session (or another
tenant's) a 404; a body over ``MAX_BODY_BYTES`` a 413; a lost claim or version a 409 — each with
``{"error": <class>, "message", "field"?}``, never a traceback, and with nothing written.

Who calls: the claims the Cognito authorizer verified (``requestContext.authorizer.claims``). The principal
is always ``sub``; the tenant is the ``DORMANT_TENANT_CLAIM`` claim (``custom:tenant``), or ``sub`` when the
token has none (single-user mode); the groups are ``cognito:groups``. Runs, answers, forks and erasures
record the principal. An answer the tool's ``answerable_by`` refuses this caller is a 403 (``AnswerRefused``)
and writes nothing; ``GET /sessions?awaiting=me`` lists the sessions with calls this caller may answer. A
machine client's access token (``token_use`` ``access``, under ``/clients``) must carry the route's scope
(``routes.scope_of``), and ``dormant/answers.write`` for a commit that holds answers (403 otherwise).

Browsers: the origins in ``DORMANT_CORS_ORIGINS`` (none by default) get ``Access-Control-*`` headers on every
answer, errors included, and a preflight ``OPTIONS`` is answered before any route or tenant is looked at.
``GET /openapi.json`` answers the OpenAPI document of every route (``serving.openapi``, built on first ask).

``POST /erasures`` (``{scope, scope_id}``) runs ``app.erase`` and answers its report. Any caller may
erase, and only within its own tenant: the app it erases from is ``{app}@{tenant}``, so another
tenant's sessions and shared state are out of its reach by construction, like everything else here.

``POST /runs`` and ``POST /tools`` retried with the same ``Idempotency-Key`` header return the first
result without running again: Powertools idempotency (``serving.idempotency``), its records kept with the
session's (one partition per session of a tenant: a tenant's keys never meet another's): in the session
table on DynamoDB, expiring through its TTL; in the ``idempotency`` table of a SQLite or Postgres database.

``POST /runs`` claims the turn and answers 202 (``Location``: the session; ``after``: the index of the
turn's first event); the turn runs outside the request (``Hooks``: on AWS a Step Functions execution,
started before the claim; under ``dormant serve`` a thread), committing each step, so ``GET /sessions/{id}``
shows it ``running`` and ``GET /sessions/{id}/events?after=`` its steps. ``Prefer: wait=N`` (N <= 25)
answers 200 with the finished turn when it ends in time. Answers to yielded calls go to ``on_answers``
(on AWS: wake the waiting execution).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, CORSConfig, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from pydantic import ValidationError

from .. import metrics
from ..app import App
from ..audit import key_history, state_diff
from ..clock import now_ms
from ..errors import (
    ClaimLost,
    DormantError,
    EventIndexError,
    InputError,
    NotAuthenticated,
    NotPermitted,
    RequestTooLarge,
    SessionNotFound,
    UnknownCallId,
    VersionConflict,
    http_status,
)
from ..events import Event, InvocationEndEvent, InvocationStartEvent, SessionForkedEvent, ToolInputEvent, parse_event
from ..ids import check_event_id, new_id
from ..people import Caller, may_answer, parse_groups
from ..projection import Projection
from ..session import Session
from ..state.values import check_storable
from ..stores.base import ScopedStateChange, SessionListing
from .bodies import (
    MAX_LIST_LIMIT,
    MAX_WAIT_SECONDS,
    STATUSES,
    CommitBody,
    CreateBody,
    EraseBody,
    ForkBody,
    RunBody,
    ToolsBody,
)
from .hooks import Hooks, Started
from .quota import TurnQuota, quota_from_env
from .routes import CLIENT_PREFIX, ROUTES, SCOPES, scope_of
from .runtime import Served, served_from_env, tenant_claim
from .turns import CLAIM_GRACE_MS, AdvanceOutcome, claim_turn, run_to_end

if TYPE_CHECKING:
    from .idempotency import Idempotency

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_EVENTS_PAGE_BYTES",
    "MAX_LIST_LIMIT",
    "MAX_WAIT_SECONDS",
    "CORS_ORIGINS",
    "Hooks",
    "api_handler",
    "build_resolver",
    "cors_config",
    "idempotency_from_env",
    "records",
    "session_view",
    "state_view",
]

_ATTEMPTS = 5

MAX_BODY_BYTES = 256 * 1024
"""Larger bodies are refused with 413 before they are parsed (an event must fit a DynamoDB item)."""


CORS_ORIGINS = "DORMANT_CORS_ORIGINS"
"""The origins (comma-separated) whose pages may call the API from a browser; none when unset (the stack sets it
from ``-c cors_origins=``, ``dormant serve`` from ``--cors-origin``)."""
CORS_HEADERS = ("Idempotency-Key", "Prefer")
"""Request headers a page may send beyond Powertools' own (Authorization, Content-Type and AWS's)."""
CORS_MAX_AGE = 600
"""Seconds a browser may keep a preflight's answer."""


def cors_config(origins: Sequence[str], headers: Sequence[str] = ()) -> CORSConfig | None:
    """Powertools' CORS for ``origins`` (``None``: no origin is allowed, no ``Access-Control-*`` header is sent).
    A preflight (``OPTIONS``) is answered by the resolver itself, before any route; an answer carries the
    ``Access-Control-*`` headers only when the request's ``Origin`` is one of ``origins``."""
    allowed = [origin.strip().rstrip("/") for origin in origins if origin.strip()]
    if not allowed:
        return None
    first, *rest = allowed
    return CORSConfig(
        allow_origin=first,
        extra_origins=rest,
        allow_headers=[*CORS_HEADERS, *headers],
        expose_headers=["Location"],
        max_age=CORS_MAX_AGE,
    )


def cors_origins_from_env() -> list[str]:
    return [origin for origin in os.environ.get(CORS_ORIGINS, "").split(",") if origin.strip()]


def idempotency_from_env() -> Idempotency | None:
    """``DORMANT_IDEMPOTENCY_TABLE`` (set by the stack) turns idempotency on."""
    table = os.environ.get("DORMANT_IDEMPOTENCY_TABLE")
    if not table:
        return None
    from .idempotency import DynamoDBIdempotency  # Powertools' idempotency: loaded by the first request, not the import

    return DynamoDBIdempotency(table)


def session_view(app: App, session: Session, caller: Caller | None = None) -> dict[str, Any]:
    """What ``GET /sessions/{id}`` answers: the session, its state in every bound scope, its waiting calls (with
    who may answer each, and whether ``caller`` may)."""
    state: dict[str, Any] = {"session": session.state.to_dict()}
    for scope in session.scopes:
        state[scope] = getattr(session.state, scope).to_dict()
    return {
        "id": session.id,
        "version": session.version,
        "status": session.status,
        "scopes": dict(session.scopes),
        "state": state,
        "yielded_tools": _yielded(app, session, caller),
        # The last event, not a scan: on a tail-loaded session a scan would fetch the whole ledger.
        "updated_at": session.events[-1].created_at if len(session.events) else session.created_at,
    }


def state_view(session: Session, at: int | None, since: int | None) -> dict[str, Any]:
    """What ``GET /sessions/{id}/state`` answers: the session as it stood after event ``at`` (default: the
    last), replayed from the ledger, and what differs from event ``since`` (default: the one before ``at``,
    so ``changes`` is what event ``at`` changed)."""
    if not len(session.events):
        raise EventIndexError(at or 0, 0)
    after = session.state_at(len(session.events) - 1 if at is None else at)
    if since is None:
        since = after.index - 1
    before = session.state_at(since) if since >= 0 else Projection().snapshot()
    return {
        "index": after.index,
        "since": before.index,
        "status": after.status,
        "current_agent_name": after.current_agent_name,
        "state": {"session": after.session_state, **after.scoped_states},
        "changes": [diff._asdict() for diff in state_diff(before, after)],
        "yielded_tools": [
            {"call_id": y.call_id, "name": y.name, "args": y.args, "invocation_id": y.invocation_id}
            for y in after.yielded_tools
        ],
        "invocations": [asdict(node) for node in after.invocations],
    }


def _yielded(app: App, session: Session, caller: Caller | None = None) -> list[dict[str, Any]]:
    tools = []
    for call in session.yielded_tools:
        tool = app.tool_named(call.name)
        schema = tool.answer_schema if tool is not None else None
        shown: dict[str, Any] = {"call_id": call.call_id, "name": call.name, "args": call.args, "answer_schema": schema}
        if tool is not None:
            shown["answerable_by"] = list(tool.rules)
            if caller is not None:
                shown["answerable"] = _may_answer(session, tool.rules, call.invocation_id, caller)
        tools.append(shown)
    return tools


def _may_answer(session: Session, rules: Sequence[str], invocation_id: str | None, caller: Caller) -> bool:
    node = session.projection.invocations.get(invocation_id or "")
    return may_answer(rules, caller.principal, caller.groups, node.principal if node is not None else None)


def check_wait(value: str | None, field: str) -> int:
    """A ``wait=N`` query value or ``Prefer: wait=N``: 0 to ``MAX_WAIT_SECONDS``, digits 0-9 only."""
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_WAIT_SECONDS:
        raise InputError(
            f"{field} is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}, not {value!r}", field=field
        )
    return int(value)


MAX_EVENTS_PAGE_BYTES = 5 * 1024 * 1024
"""What one events page's events may take in the Lambda response (each as the JSON string the body is in it),
safely under Lambda's 6 MB: a page always holds at least one event, and an event (at most 1 MiB stored) takes
at most 3 MiB there, escaped."""
_WAIT_MARGIN = 3.0  # seconds a held request keeps before the function's deadline, to answer
_WAIT_FIRST, _WAIT_LONGEST = 0.1, 1.0  # the held request's pause between reads of the tail, growing


def _await_events(
    app: App, session_id: str, version: int, count: int, after: int, wait: float
) -> tuple[list[Event], int]:
    """The events from index ``after`` that land within ``wait`` seconds, and the ledger's length then.

    ``count`` events are stored as of ``version``: each look reads only what was stored after the last
    version seen (the tail), never the whole ledger, pausing a little longer each time.
    """
    deadline = time.monotonic() + wait
    pause = _WAIT_FIRST
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(pause, left))
        pause = min(pause * 2, _WAIT_LONGEST)
        loaded = app.store.load(app.name, session_id, after=version)
        if loaded is None:  # deleted (or erased) while we waited
            raise SessionNotFound(session_id)
        version, start = loaded.session.version, count
        count += len(loaded.events)
        if count > after:
            return loaded.events[after - start :], count
    return [], count


def _events_page(events: Sequence[Event], first: int, limit: int, total: int) -> Response[Any]:
    """``{"events", "next"}`` for ``events`` (from ledger index ``first``, of ``total``): at most ``limit``
    of them and ``MAX_EVENTS_PAGE_BYTES`` of them as they travel, but at least one; ``next`` is the index of
    the first event not sent, ``None`` when none is left."""
    parts: list[str] = []
    size = 0
    for event in events[:limit]:
        text = event.model_dump_json()
        # As the Lambda response carries it: inside the body's JSON string, quotes and non-ASCII escaped.
        size += len(json.dumps(text)) - 2 + 1  # and a comma
        if parts and size > MAX_EVENTS_PAGE_BYTES:
            break
        parts.append(text)
    following = first + len(parts)
    after = following if following < total else None
    body = f'{{"events":[{",".join(parts)}],"next":{json.dumps(after)}}}'
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=body)


def build_resolver(
    served: Served,
    hooks: Hooks,
    logger: Logger,
    idempotency: Idempotency | None = None,
    function: str | None = None,
    quota: TurnQuota | None = None,
    cors: CORSConfig | None = None,
) -> APIGatewayRestResolver:
    """The routes of ``function`` (``serving.routes``; ``None``: every route), over ``served``; each request
    works on the app as its tenant sees it. A function answers only its own routes, as API Gateway sends it
    only those: any other is a 404."""
    resolver = APIGatewayRestResolver(cors=cors, strip_prefixes=[CLIENT_PREFIX])
    mine = {(m, p.replace("{id}", "<session_id>")) for m, p, f in ROUTES if function is None or f == function}

    def route(method: str, path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(view: Callable[..., Any]) -> Callable[..., Any]:
            if (method, path) in mine:

                @functools.wraps(view)
                def decoded(**keys: str) -> Any:
                    # API Gateway's REST API passes the path as the client escaped it (only pathParameters are
                    # decoded) and Powertools routes on the path: an id holding ':', '@', '+' or '=' arrives
                    # escaped by any client that escapes path segments (a browser's encodeURIComponent).
                    return view(**{name: unquote(value) for name, value in keys.items()})

                resolver.route(path, method)(decoded)
            return view

        return register

    def once(tenant_app: App, session_id: str, work: Callable[[], dict[str, Any]]) -> Response[Any]:
        """``work()`` (-> ``{"status": code, "body": ...}``) once per Idempotency-Key, when one is given; the
        record is kept with the session (``records``), so it goes when the session is deleted or erased."""
        key = resolver.current_event.headers.get("Idempotency-Key") or resolver.current_event.headers.get(
            "idempotency-key"
        )
        event = resolver.current_event
        if key and idempotency is not None:
            route = f"{event.http_method} {event.path}"
            payload = json.dumps(json.loads(event.body), sort_keys=True) if event.body else ""  # parsed already
            partition = records(tenant_app, session_id)
            result = idempotency.once(partition, key, route, work, resolver.lambda_context, payload)
        else:
            result = work()
        response = _json(result["status"], result["body"])
        response.headers.update(result.get("headers") or {})
        return response

    claim = tenant_claim()

    def claims() -> dict[str, Any]:
        context = resolver.current_event.request_context
        found = (context.authorizer.claims or {}) if context.authorizer else {}
        if not found.get("sub"):
            raise NotAuthenticated("no authenticated caller (the authorizer gave no sub claim)")
        return found

    def caller() -> Caller:
        """Who is acting: the ``sub`` claim, in the groups of ``cognito:groups``."""
        found = claims()
        return Caller(str(found["sub"]), parse_groups(found.get("cognito:groups")))

    def tenant() -> str:
        """The tenant claim, else ``sub``: a token without a tenant is a tenant of its own (single-user mode)."""
        found = claims()
        return str(found.get(claim) or found["sub"])

    def granted() -> frozenset[str] | None:
        """The scopes of a machine client's access token; ``None`` for a person's ID token."""
        found = claims()
        if found.get("token_use") != "access":
            return None
        return frozenset(str(found.get("scope") or "").split())

    def permit(scope: str) -> None:
        scopes = granted()
        if scopes is not None and scope not in scopes:
            raise NotPermitted(f"this access token lacks the scope {scope}", rule=scope, field="scope")

    def app() -> App:
        event = resolver.current_event
        resource = event.request_context.resource_path.removeprefix(CLIENT_PREFIX)
        if resource in {p for _, p, _ in ROUTES}:
            permit(scope_of(event.http_method, resource))
        return served.for_tenant(tenant())

    def body(model: type[Any]) -> Any:
        raw = resolver.current_event.body or ""
        size = len(raw.encode() if isinstance(raw, str) else raw)
        if size > MAX_BODY_BYTES:
            raise RequestTooLarge(size, MAX_BODY_BYTES)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise InputError(f"the body is not JSON: {exc}", field="body") from None
        except RecursionError:  # a small body can nest deeper than the parser goes: bad input, not a 500
            raise InputError("the body nests too deeply to be read", field="body") from None
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "body"
            raise InputError(f"{field}: {first['msg']}", field=field) from None

    def query_int(name: str) -> int | None:
        value = resolver.current_event.get_query_string_value(name)
        if value is None:
            return None
        if not (value.isascii() and value.isdigit()):  # int() takes "1_000", " 1", "-5" and other scripts' digits
            raise InputError(f"{name} is a whole number written in digits 0-9, not {value!r}", field=name)
        return int(value)

    def query_limit(default: int) -> int:
        """A page's ``limit``: 1 to ``MAX_LIST_LIMIT`` (a larger one is a 400, not a table read)."""
        limit = query_int("limit")
        if limit == 0 or (limit is not None and limit > MAX_LIST_LIMIT):
            raise InputError(f"limit is 1 to {MAX_LIST_LIMIT}, not {limit}", field="limit")
        return limit or default

    def query_str(name: str) -> str:
        value = resolver.current_event.get_query_string_value(name)
        if not value:
            raise InputError(f"{name} is required", field=name)
        return value

    @route("POST", "/sessions")
    def create() -> Response[Any]:
        request = body(CreateBody)
        tenant_app = app()
        try:
            session = tenant_app.sessions.create(request.session_id, request.scopes)
        except VersionConflict as exc:  # the id is taken
            exc.field = "session_id"
            raise
        return _json(201, session_view(tenant_app, session, caller()))

    @route("GET", "/sessions")
    def listing() -> dict[str, Any]:
        limit = query_limit(50)
        status = resolver.current_event.get_query_string_value("status")
        if status is not None and status not in STATUSES:  # a typo is a 400, not an empty listing
            raise InputError(f"status is one of {', '.join(STATUSES)}, not {status!r}", field="status")
        awaiting = resolver.current_event.get_query_string_value("awaiting")
        if awaiting is not None and awaiting != "me":
            raise InputError(f"awaiting is 'me' (the calls this caller may answer), not {awaiting!r}", field="awaiting")
        cursor = resolver.current_event.get_query_string_value("cursor")
        tenant_app = app()
        sessions = tenant_app.sessions
        if awaiting is not None:
            status = "awaiting_input"
            me = caller()

            def mine(row: SessionListing) -> list[dict[str, Any]]:
                session = sessions.get(row.id) if row.status == status else None
                if session is None:
                    return []
                return [c for c in _yielded(tenant_app, session, me) if c.get("answerable")]

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

    @route("GET", "/sessions/<session_id>")
    def show(session_id: str) -> dict[str, Any]:
        tenant_app = app()
        return session_view(tenant_app, tenant_app.sessions.require(session_id), caller())

    @route("DELETE", "/sessions/<session_id>")
    def delete(session_id: str) -> Response[Any]:
        tenant_app = app()
        tenant_app.sessions.require(session_id)
        tenant_app.sessions.delete(session_id)
        if idempotency is not None:  # the answers kept for retries hold what the session held
            idempotency.forget(records(tenant_app, session_id))
        return Response(status_code=204, content_type=content_types.APPLICATION_JSON, body="")

    @route("GET", "/sessions/<session_id>/events")
    def ledger(session_id: str) -> Response[Any]:
        """A page of the ledger from event ``after``; with ``wait=S``, held up to S seconds until one lands."""
        after = query_int("after") or 0
        limit = query_limit(100)
        wait = check_wait(resolver.current_event.get_query_string_value("wait"), "wait")
        tenant_app = app()
        session = tenant_app.sessions.require(session_id)
        total = len(session.events)
        if after >= total and wait:
            held = float(wait)
            context = resolver.lambda_context
            if context is not None:  # never past the function's own deadline, whatever its timeout
                held = min(held, max(0.0, context.get_remaining_time_in_millis() / 1000 - _WAIT_MARGIN))
            tail, total = _await_events(tenant_app, session_id, session.version, total, after, held)
            return _events_page(tail, after, limit, total)
        return _events_page(session.events[after : after + limit], after, limit, total)  # no older ledger read

    @route("GET", "/sessions/<session_id>/state")
    def state(session_id: str) -> dict[str, Any]:
        at, since = query_int("at"), query_int("since")
        session = app().sessions.require(session_id)
        try:
            return state_view(session, at, since)
        except EventIndexError as exc:  # name the parameter, not the ledger's index
            exc.field = "since" if since is not None and exc.index == since and exc.index != at else "at"
            raise

    @route("GET", "/sessions/<session_id>/audit")
    def audit(session_id: str) -> dict[str, Any]:
        scope, key = query_str("scope"), query_str("key")
        tenant_app = app()
        if scope not in tenant_app.schema:
            raise InputError(f"scope {scope!r} is not one of the app's scopes", field="scope")
        session = tenant_app.sessions.require(session_id)
        changes = key_history(session.events, scope, key)
        # vars(), not asdict(): the values are the ledger's JSON, and a deep copy of each was most of the time
        return {"scope": scope, "key": key, "changes": [dict(vars(change)) for change in changes]}

    @route("POST", "/sessions/<session_id>/forks")
    def fork(session_id: str) -> Response[Any]:
        request = body(ForkBody)
        tenant_app = app()
        try:
            session = tenant_app.sessions.require(session_id)
            forked = session.fork_at(request.at, reason=request.reason, principal=caller().principal)
        except EventIndexError as exc:
            exc.field = "at"
            raise
        tenant_app.sessions.commit(forked)
        return _json(201, session_view(tenant_app, forked, caller()))

    def prefer_wait() -> int:
        """``Prefer: wait=N`` (RFC 7240): hold the request up to N seconds for the turn to end."""
        header = resolver.current_event.headers.get("Prefer") or resolver.current_event.headers.get("prefer") or ""
        for preference in re.split(r"[,;]", header):
            name, _, value = preference.strip().partition("=")
            if name.strip().lower() == "wait":
                return check_wait(value.strip().strip('"'), "Prefer")
        return 0

    @route("POST", "/sessions/<session_id>/runs")
    def run(session_id: str) -> Response[Any]:
        request = body(RunBody)
        wait = prefer_wait()
        tenant_app = app()
        agent = served.agent(request.agent)
        run_input = {k: v for k, v in (("message", request.message), ("state", request.state)) if v is not None}
        me = caller()

        def work() -> dict[str, Any]:
            session = tenant_app.sessions.require(session_id)
            invocation_id = session.projection.open_invocation or new_id("inv_")
            logger.append_keys(invocation_id=invocation_id)
            # No execution for a claim that must fail, nor for input that opens no invocation (state set while
            # calls wait: the execution parked on them goes on waiting).
            starts = hooks.before_claim is not None and session.status != "awaiting_input"
            if starts and session.status == "running" and not request.takeover:
                raise _held(session)
            if quota is not None:  # before anything is started or claimed: past it, a 429 and nothing run
                quota.take(tenant_app.store, served.app.name, tenant())
            if starts and hooks.before_claim is not None:
                hooks.before_claim(tenant(), session_id, invocation_id, session.version)
            claim = claim_turn(
                tenant_app,
                agent,
                session,
                run_input or None,
                takeover=request.takeover,
                invocation_id=invocation_id,
                deadline=now_ms() + CLAIM_GRACE_MS,
                principal=me.principal,  # who started it: the ledger says so, and the starter rules read it
                groups=me.groups,
            )
            metrics.count("turns", agent=agent.name)
            if claim.invocation_id is None or (hooks.run is None and hooks.before_claim is None):
                outcome: AdvanceOutcome | None = run_to_end(tenant_app, claim, served.agent)  # this request runs it
            else:
                started = hooks.run(tenant(), tenant_app, claim) if hooks.run is not None else None
                outcome = _await(tenant_app, session_id, claim.version, started, wait)
            if outcome is not None:
                return {"status": 200, "body": _finished(tenant_app, outcome, me)}
            return {
                "status": 202,
                "body": {"status": "running", "session_id": session_id, "version": claim.version, "after": claim.after},
                "headers": {"Location": f"/sessions/{session_id}"},
            }

        return once(tenant_app, session_id, work)

    @route("POST", "/sessions/<session_id>/tools")
    def answer(session_id: str) -> Response[Any]:
        request = body(ToolsBody)
        wait = prefer_wait()
        tenant_app = app()
        answers = [a.model_dump() for a in request.answers]
        me = caller()

        def store(session: Session) -> None:
            try:  # errors are served as raised (their class, their status), named in this body: answers.N
                # the audit says who answered; the tool's answerable_by must admit them (403, nothing written)
                session.input.answers(answers, principal=me.principal, groups=me.groups)
            except UnknownCallId as exc:
                raise _unknown_call(session, exc) from None

        def work() -> dict[str, Any]:
            # A version moved by park storing its token is no reason to fail: the answers go on a fresh load.
            session = tenant_app.sessions.write(session_id, store, on_conflict="retry", attempts=_ATTEMPTS).session
            metrics.count("answers", len(answers))
            woke = hooks.on_answers(tenant(), tenant_app, session) if hooks.on_answers is not None else None
            answered = {"version": session.version, "status": session.status, **(woke or {})}
            if wait and answered["status"] in ("resumable", "running"):
                outcome = _await(tenant_app, session_id, int(answered["version"]), None, wait)
                if outcome is not None:
                    return {"status": 200, "body": _finished(tenant_app, outcome, me)}
            return {"status": 202, "body": answered}

        return once(tenant_app, session_id, work)

    @route("POST", "/sessions/<session_id>/commit")
    def remote_commit(session_id: str) -> Response[Any]:
        request = body(CommitBody)
        tenant_app = app()
        me = caller()
        session = tenant_app.sessions.require(session_id)
        events = []
        for position, raw in enumerate(request.events):
            try:
                event = parse_event(raw)
            except InputError as exc:
                raise InputError(str(exc), field=f"events.{position}") from None
            if isinstance(event, ToolInputEvent):
                permit(SCOPES["answer"])  # a machine client that may only run may not answer through a commit
            check_event_id(event.id, f"events.{position}.id")  # the key rule first: an id is a key on every store
            check_storable(event.model_dump(), f"events.{position}")  # named here, not by the store's encoder
            events.append(event)
        # What a run could not record, no commit records (dormant.ledger): each event where it stands, state
        # changes against their scope's model, answers as strict as POST /tools takes them. Before appending.
        rules = session.rules(caller=me)
        for position, event in enumerate(events):
            try:
                rules.check(event, position)  # answers, starts and forks are the caller's, answers by its rules
            except UnknownCallId as exc:
                raise _unknown_call(session, exc) from None
            session.append(_as_caller(event, me.principal))
        named = [ScopedStateChange(c.scope, c.scope_id, c.key, c.value) for c in request.scoped_changes or []]
        changes = session.check_scoped_changes(named)
        if request.expected_version != session.version:  # a 409, as the store would answer (nothing written)
            conflict = VersionConflict(
                session_id, expected_version=request.expected_version, actual_version=session.version
            )
            conflict.field = "expected_version"
            raise conflict
        # Through the write path, as a run's: the bound-scope and retention checks (before anything is
        # written), and the snapshots that keep a load of a session only remote runners write from growing.
        result = tenant_app.sessions.write(
            session=session, change=lambda _: None, on_conflict="fail", scoped_changes=lambda _: changes
        )
        return _json(200, {"version": result.version, "appended": result.appended})

    @route("POST", "/erasures")
    def erase() -> dict[str, Any]:
        request = body(EraseBody)
        tenant_app = app()
        report = tenant_app.erase(scope=request.scope, scope_id=request.scope_id, principal=caller().principal)
        if idempotency is not None:  # the answers kept for retries hold what the sessions held
            for session_id in report.sessions:
                idempotency.forget(records(tenant_app, session_id))
        # What was erased, counted, for the audit; the person's id stays out of the logs.
        logger.info(
            "erased",
            extra={
                "scope": report.scope,
                "sessions": len(report.sessions),
                "keys": len(report.scoped_keys),
                "principal": report.principal,  # who erased (the erased person's id stays out)
            },
        )
        return dataclasses.asdict(report)

    @route("GET", "/openapi.json")
    def openapi() -> Response[Any]:
        tenant()  # behind the authorizer, as every route
        from .openapi import document_json  # built when first asked for: no cold start pays for it

        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=document_json())

    def dormant_error(exc: DormantError) -> Response[Any]:
        status = http_status(exc)
        if status >= 500:
            logger.exception("request failed")
            return _error(status, type(exc).__name__, "the request failed; see the logs for its request id")
        extra = {"actual_version": exc.actual_version} if isinstance(exc, VersionConflict) else {}
        field = getattr(exc, "field", None)
        if field is None and isinstance(exc, SessionNotFound):  # the path's id, named as a body names it
            field = "session_id"
        return _error(status, type(exc).__name__, str(exc), field, **extra)

    def unexpected(exc: Exception) -> Response[Any]:
        logger.exception("unexpected error")
        return _error(500, "InternalError", "the request failed; see the logs for its request id")

    def no_route(exc: Exception) -> Response[Any]:
        # A path no route takes: one whose id holds what no route's segment matches (a NUL, a lone surrogate,
        # a newline) once API Gateway decoded it. A 404 as dormant serve answers it, not the catch-all's 500.
        return _error(404, "NotFound", "no route for this path")

    resolver.not_found(no_route)
    for kind, on_error in ((DormantError, dormant_error), (Exception, unexpected)):
        resolver.exception_handler(kind)(on_error)

    return resolver


def log_keys(event: dict[str, Any]) -> dict[str, str | None]:
    """What every log line of a request carries: the tenant, the principal (a machine client's ``client_id``, else
    the user's ``sub``) and the session; never a token or a body."""
    context = event.get("requestContext") or {}
    claims = (context.get("authorizer") or {}).get("claims") or {}
    sub = claims.get("sub")
    session = (event.get("pathParameters") or {}).get("id")
    return {"tenant": sub, "principal": claims.get("client_id") or sub, "session_id": session}


def records(app: App, session_id: str) -> str:
    """The partition of a session's idempotency records (ids hold no ``#``: one partition per session)."""
    return f"{app.name}#{session_id}"


def _as_caller(event: Event, principal: str) -> Event:
    """``event`` recorded as ``principal`` when it is an answer, a start or a fork that names no one (the rules
    refused one naming someone else)."""
    if isinstance(event, ToolInputEvent | InvocationStartEvent | SessionForkedEvent) and event.principal is None:
        return event.model_copy(update={"principal": principal})
    return event


def _held(session: Session) -> ClaimLost:
    return ClaimLost(
        session.id,
        expected_version=session.version,
        actual_version=session.version,
        reason="an invocation is running on it (or its process died: resume it with takeover)",
    )


_RUN_STATUS = {"awaiting_input": "yielded_tool", "resumable": "yielded_tool"}


def _await(app: App, session_id: str, version: int, started: Started | None, seconds: int) -> AdvanceOutcome | None:
    """The turn's outcome once it ended, waiting up to ``seconds``; ``None`` while it still runs. A turn this
    process runs is waited on; one that runs elsewhere (a Step Functions execution) is read from the store,
    re-read with a growing pause (0.1 s to 1 s)."""
    if started is not None:
        return started.wait(seconds)
    deadline, pause = time.monotonic() + seconds, 0.1
    while seconds:
        session = app.sessions.require(session_id)
        if session.version > version and session.status not in ("running", "resumable"):
            end = next((e for e in reversed(session.events) if isinstance(e, InvocationEndEvent)), None)
            return AdvanceOutcome(
                status=_RUN_STATUS.get(session.status, session.status),  # type: ignore[arg-type]
                session_id=session_id,
                output=session.output,
                yielded_tools=session.yielded_tools,
                commit_status="committed",
                version=session.version,
                session=session,
                error=end.error if end is not None and session.status == "error" else None,
            )
        if time.monotonic() + pause > deadline:
            return None
        time.sleep(pause)
        pause = min(1.0, pause * 2)
    return None


def _finished(app: App, outcome: AdvanceOutcome, caller: Caller | None = None) -> dict[str, Any]:
    """The body of a turn that ended within the request (whether ``caller`` may answer each waiting call)."""
    return {
        "status": outcome.status,
        "output": {"text": outcome.output.text, "value": outcome.output.value},
        "yielded_tools": _yielded(app, outcome.session, caller),
        "commit_status": outcome.commit_status,
        "version": outcome.version,
        "fork_id": outcome.fork_id,
        "error": outcome.error,
    }


def _unknown_call(session: Session, exc: UnknownCallId) -> UnknownCallId:
    """``exc``, saying so when the call was answered already (another caller's answer landed first)."""
    if _answered(session, exc.call_id):
        exc.args = (f"{exc.args[0]}; it was answered already",)
    return exc


def _answered(session: Session, call_id: str) -> bool:
    """Whether ``call_id`` was answered on ``session`` already (read only when an answer is refused)."""
    return any(isinstance(e, ToolInputEvent) and e.call_id == call_id for e in session.events)


def _json(status: int, payload: dict[str, Any]) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(payload))


def _error(status: int, kind: str, message: str, field: str | None = None, **extra: Any) -> Response[Any]:
    payload: dict[str, Any] = {"error": kind, "message": message, **extra}
    if field is not None:
        payload["field"] = field
    return _json(status, payload)


def api_handler(
    hooks: Hooks | None = None,
    served: Served | None = None,
    idempotency: Idempotency | None = None,
    *,
    function: str | None = None,
    cors_origins: Sequence[str] | None = None,
    cors_headers: Sequence[str] = (),
) -> Callable[[dict[str, Any], Any], Any]:
    """A Lambda handler serving the routes of ``function`` (``functions/<name>``; ``None``: every route), with
    ``served`` defaulting to ``DORMANT_APP`` on ``DORMANT_STORE`` and ``idempotency`` to
    ``DORMANT_IDEMPOTENCY_TABLE``; it builds its routes over the app on its first request. ``hooks`` say who
    runs a claimed turn (``None``: the request itself) and what answers wake. ``cors_origins`` (default:
    ``DORMANT_CORS_ORIGINS``) may call it from a browser, sending ``cors_headers`` too (``cors_config``)."""
    logger = Logger()
    cors = cors_config(cors_origins_from_env() if cors_origins is None else cors_origins, cors_headers)

    @functools.cache
    def resolver() -> APIGatewayRestResolver:
        # Built by the first request, as the workflow's handlers build theirs: importing the function
        # module stays cheap, and the app and its store client are made where they are first needed.
        return build_resolver(
            served or served_from_env(),
            hooks or Hooks(),
            logger,
            idempotency or idempotency_from_env(),
            function,
            quota_from_env(),
            cors,
        )

    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # not under dormant serve: its logging is the user's
        # The library's own loggers (dormant.*) write through this one: the same JSON and keys on every line.
        copy_config_to_registered_loggers(source_logger=logger, include={"dormant"})

    # clear_state: a warm sandbox's next request starts without the last one's keys
    @logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> Any:
        logger.append_keys(**log_keys(event))
        with metrics.collecting(function or "api"):
            response = resolver().resolve(event, context)
        if cors is not None:  # the answer differs by Origin: a cache must not give one origin's to another
            response.setdefault("multiValueHeaders", {})["Vary"] = ["Origin"]
        return response

    return _traced(handler)


def _traced(handler: Callable[[dict[str, Any], Any], Any]) -> Callable[[dict[str, Any], Any], Any]:
    """Wrap ``handler`` in a Powertools Tracer only on Lambda with tracing on (importing it costs a cold start)."""
    off = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in {"1", "true"}
    if off or "AWS_LAMBDA_FUNCTION_NAME" not in os.environ:
        return handler
    from aws_lambda_powertools import Tracer

    traced: Callable[[dict[str, Any], Any], Any] = Tracer().capture_lambda_handler(handler)
    return traced
