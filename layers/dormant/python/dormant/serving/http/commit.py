"""The route of the ``commit`` function: ``POST /sessions/{id}/commit`` appends a remote runner's events.

What a run could not record, no commit records (``dormant.ledger``): each event where it stands, state
changes against their scope's model, answers as strict as ``POST /tools`` takes them; a commit that holds
answers needs ``dormant/answers.write`` of a machine client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import Response

from ...errors import InputError, UnknownCallId, VersionConflict
from ...events import Event, InvocationStartEvent, SessionForkedEvent, ToolInputEvent, parse_event
from ...ids import check_event_id
from ...ledger import AnswerCheck
from ...people import Caller, answering_groups
from ...state.values import check_storable
from ...stores.base import ScopedStateChange
from ..bodies import CommitBody
from ..routes import SCOPES
from .request import Api, Request, Routes
from .views import json_response, unknown_call

__all__ = ["routes"]


def routes(api: Api) -> Routes:
    mine = Routes(api)
    mine.add("POST", "/sessions/<session_id>/commit", remote_commit)
    return mine


def remote_commit(request: Request, session_id: str) -> Response[Any]:
    body = request.body(CommitBody)
    tenant_app = request.app()
    me = request.caller()
    session = tenant_app.sessions.require(session_id)
    events = []
    for position, raw in enumerate(body.events):
        try:
            event = parse_event(raw)
        except InputError as exc:
            raise InputError(str(exc), field=f"events.{position}") from None
        if isinstance(event, ToolInputEvent):
            request.permit(SCOPES["answer"])  # a machine client that may only run may not answer through a commit
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
            raise unknown_call(session, exc) from None
        session.append(_as_caller(event, me, tenant_app.tool_named))
    named = [ScopedStateChange(c.scope, c.scope_id, c.key, c.value) for c in body.scoped_changes or []]
    changes = session.check_scoped_changes(named)
    if body.expected_version != session.version:  # a 409, as the store would answer (nothing written)
        conflict = VersionConflict(session_id, expected_version=body.expected_version, actual_version=session.version)
        conflict.field = "expected_version"
        raise conflict
    # Through the write path, as a run's: the bound-scope and retention checks (before anything is
    # written), and the snapshots that keep a load of a session only remote runners write from growing.
    result = tenant_app.sessions.write(
        session=session, change=lambda _: None, on_conflict="fail", scoped_changes=lambda _: changes
    )
    return json_response(200, {"version": result.version, "appended": result.appended})


def _as_caller(event: Event, me: Caller, tool_named: Callable[[str], AnswerCheck | None]) -> Event:
    """``event`` recorded as the caller when it is an answer, a start or a fork that names no one (the rules
    refused one naming someone else); an answer with the groups its rule names that the caller is in."""
    if isinstance(event, ToolInputEvent | InvocationStartEvent | SessionForkedEvent) and event.principal is None:
        event = event.model_copy(update={"principal": me.principal})
    if isinstance(event, ToolInputEvent) and event.groups is None:
        tool = tool_named(event.name)
        if tool is not None:
            event = event.model_copy(update={"groups": answering_groups(tool.rules, me.groups)})
    return event
