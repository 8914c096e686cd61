"""What the API answers: the session, its state, a ledger page, a finished turn, and errors as JSON.

``{"error": <class>, "message", "field"?}`` for every refusal, never a traceback; a 5xx says only that the
request failed (the logs hold why, under the request id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types

from ...app import App
from ...audit import state_diff
from ...errors import (
    DormantError,
    EventIndexError,
    SessionNotFound,
    UnknownCallId,
    VersionConflict,
    http_status,
    throttle_code,
)
from ...events import Event, ToolInputEvent
from ...people import Caller, may_answer
from ...projection import Projection
from ...session import Session
from ..turns import AdvanceOutcome

__all__ = [
    "MAX_EVENTS_PAGE_BYTES",
    "answer_errors",
    "error",
    "events_page",
    "finished",
    "json_response",
    "session_view",
    "state_view",
    "unknown_call",
    "yielded",
]

MAX_EVENTS_PAGE_BYTES = 5 * 1024 * 1024
"""What one events page's events may take in the Lambda response (each as the JSON string the body is in it),
safely under Lambda's 6 MB: a page always holds at least one event, and an event (at most 1 MiB stored) takes
at most 3 MiB there, escaped."""


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
        "yielded_tools": yielded(app, session, caller),
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


def yielded(app: App, session: Session, caller: Caller | None = None) -> list[dict[str, Any]]:
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


def events_page(events: Sequence[Event], first: int, limit: int, total: int) -> Response[Any]:
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


def finished(app: App, outcome: AdvanceOutcome, caller: Caller | None = None) -> dict[str, Any]:
    """The body of a turn that ended within the request (whether ``caller`` may answer each waiting call)."""
    return {
        "status": outcome.status,
        "output": {"text": outcome.output.text, "value": outcome.output.value},
        "yielded_tools": yielded(app, outcome.session, caller),
        "commit_status": outcome.commit_status,
        "version": outcome.version,
        "fork_id": outcome.fork_id,
        "error": outcome.error,
    }


def unknown_call(session: Session, exc: UnknownCallId) -> UnknownCallId:
    """``exc``, saying so when the call was answered already (another caller's answer landed first)."""
    if _answered(session, exc.call_id):
        exc.args = (f"{exc.args[0]}; it was answered already",)
    return exc


def _answered(session: Session, call_id: str) -> bool:
    """Whether ``call_id`` was answered on ``session`` already (read only when an answer is refused)."""
    return any(isinstance(e, ToolInputEvent) and e.call_id == call_id for e in session.events)


def json_response(status: int, payload: dict[str, Any]) -> Response[Any]:
    """A JSON answer, compact as Powertools writes a route's returned value: every answer reads the same."""
    body = json.dumps(payload, separators=(",", ":"))
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


def error(status: int, kind: str, message: str, field: str | None = None, **extra: Any) -> Response[Any]:
    payload: dict[str, Any] = {"error": kind, "message": message, **extra}
    if field is not None:
        payload["field"] = field
    return json_response(status, payload)


def answer_errors(resolver: APIGatewayRestResolver, logger: Logger) -> None:
    """Answer what the routes raise, and a path no route takes, as the JSON errors above."""

    def dormant_error(exc: DormantError) -> Response[Any]:
        status = http_status(exc)
        if status >= 500:
            logger.exception("request failed")
            return error(status, type(exc).__name__, "the request failed; see the logs for its request id")
        extra = {"actual_version": exc.actual_version} if isinstance(exc, VersionConflict) else {}
        field = getattr(exc, "field", None)
        if field is None and isinstance(exc, SessionNotFound):  # the path's id, named as a body names it
            field = "session_id"
        answer = error(status, type(exc).__name__, str(exc), field, **extra)
        if status == 429:  # a throttle or a quota says when to come back, as API Gateway's own 429s do
            answer.headers["Retry-After"] = str(getattr(exc, "retry_after", None) or 1)
        return answer

    def unexpected(exc: Exception) -> Response[Any]:
        code = throttle_code(exc)
        if code is not None:  # an AWS service (Step Functions waking a wait, ...) refused us for its rate: a 429
            logger.warning("throttled by an AWS service: %s", code)
            answer = error(429, "Throttled", f"an AWS service refused the request for its rate ({code}); try again")
            answer.headers["Retry-After"] = "1"
            return answer
        logger.exception("unexpected error")
        return error(500, "InternalError", "the request failed; see the logs for its request id")

    def no_route(exc: Exception) -> Response[Any]:
        # A path no route takes: one whose id holds what no route's segment matches (a NUL, a lone surrogate,
        # a newline) once API Gateway decoded it. A 404 as dormant serve answers it, not the catch-all's 500.
        return error(404, "NotFound", "no route for this path")

    resolver.not_found(no_route)
    for kind, on_error in ((DormantError, dormant_error), (Exception, unexpected)):
        resolver.exception_handler(kind)(on_error)
