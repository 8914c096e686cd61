"""The HTTP API as an OpenAPI 3.1 document, generated from the routes (``serving.routes``) and the pydantic
bodies the handlers read (``serving.bodies``), by Powertools' event handler.

Why one module: it is one table (``OPERATIONS``, most of its lines, one entry per route) and the stand-in views
that turn it into the document; nothing on the serving path imports it.

``OPERATIONS`` says, per route, what the handler takes beyond its body (query parameters, headers) and what
it answers: its success statuses with their shapes, and every error status, each with the one error shape
(``ErrorBody``: ``{"error", "message", "field"?}``). ``document()`` registers one stand-in view per
operation on a resolver of its own, typed so that Powertools derives the parameters and bodies, and asks it
for the document. The serving resolvers never see this module: the Lambda functions import it only when
``GET /openapi.json`` is asked for (it would cost every cold start otherwise).

``python -m dormant.serving.openapi [path]`` prints the document or writes it (``make openapi``: docs/openapi.json);
it is deterministic, so the committed file is compared with a fresh one by the tests.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict

from ..ids import ID_PATTERN, MAX_ID_LENGTH
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

__all__ = ["OPERATIONS", "ErrorBody", "Operation", "document", "document_json", "main"]

TITLE = "dormant"
VERSION = "1"
"""The API's version (the stage, ``v1``), not the library's."""


# -- what the routes answer -------------------------------------------------------------------------------------


class _Shape(BaseModel):
    # Responses may grow fields: a client reads the ones it knows (no additionalProperties: false).
    model_config = ConfigDict(defer_build=True)


class ErrorBody(_Shape):
    """Every error: the error's class (``SessionNotFound``, ``InputError``...), what went wrong, and the field of
    the request at fault when there is one."""

    error: str
    message: str
    field: str | None = None
    actual_version: int | None = None
    """A ``VersionConflict``'s stored version."""


class YieldedTool(_Shape):
    call_id: str
    name: str
    args: Any = None
    answer_schema: dict[str, Any] | None = None
    """The JSON schema an answer must match (the tool's ``yield_schema``)."""
    answerable_by: list[str] | None = None
    """Who may answer (the tool's ``answerable_by``: ``tenant``, ``group:NAME``, ``starter``, ``not_starter``)."""
    answerable: bool | None = None
    """Whether this caller may answer it."""


class SessionView(_Shape):
    id: str
    version: int
    status: str
    scopes: dict[str, str]
    state: dict[str, dict[str, Any]]
    yielded_tools: list[YieldedTool]
    updated_at: int


class ListedSession(_Shape):
    id: str
    updated_at: int
    created_at: int
    version: int
    status: str | None
    calls: list[YieldedTool] | None = None
    """With ``awaiting=me``: the calls this caller may answer."""


class SessionList(_Shape):
    sessions: list[ListedSession]
    cursor: str | None
    """Pass as ``cursor`` for the next page; ``null`` on the last."""


class EventsPage(_Shape):
    events: list[dict[str, Any]]
    next: int | None
    """The index of the first event not sent; ``null`` when none is left."""


class StateAt(_Shape):
    index: int
    since: int
    status: str
    current_agent_name: str | None
    state: dict[str, dict[str, Any]]
    changes: list[dict[str, Any]]
    yielded_tools: list[dict[str, Any]]
    invocations: list[dict[str, Any]]


class KeyHistory(_Shape):
    scope: str
    key: str
    changes: list[dict[str, Any]]


class RunOutput(_Shape):
    text: str | None
    value: Any = None


class TurnEnded(_Shape):
    """A turn that ended within the request (``Prefer: wait=N``, or a run nothing else runs)."""

    status: str
    output: RunOutput
    yielded_tools: list[YieldedTool]
    commit_status: str
    version: int
    fork_id: str | None
    error: Any = None


class TurnStarted(_Shape):
    """A turn claimed and running outside the request: follow it at ``Location`` and its events from ``after``."""

    status: str
    session_id: str
    version: int
    after: int


class AnswersStored(_Shape):
    version: int
    status: str


class Committed(_Shape):
    version: int
    appended: int


class ErasureReport(_Shape):
    scope: str
    scope_id: str
    sessions: list[str]
    scoped_keys: list[str]
    residue: str | None


# -- the operations ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    """A query parameter or header a route reads: its name, type and constraints (pydantic ``Field`` ones)."""

    name: str
    kind: type
    description: str
    constraints: dict[str, Any] = field(default_factory=dict)
    required: bool = False


@dataclass(frozen=True)
class Operation:
    summary: str
    answers: dict[int, tuple[str, type[BaseModel] | None]]
    """Success status -> (description, body shape; ``None``: no body)."""
    errors: dict[int, str]
    """Error status -> when it is answered (the body is an ``ErrorBody``)."""
    body: type[BaseModel] | None = None
    query: tuple[Parameter, ...] = ()
    headers: tuple[Parameter, ...] = ()


_BAD = "bad input (a query value, the body, a header): ``field`` names it"
_MISSING = "no such session in the caller's tenant"
_TOO_LARGE = "a body over 256 KiB (or an event over the store's limit)"
_UNSTORABLE = "a value the store cannot keep (NaN, a lone surrogate) or state the scope's model refuses"
_REFUSED = "an answer the tool's ``answerable_by`` refuses this caller (``field`` names the call), or no scope"
_CONFLICT = "the session moved on: a version, a claim, an answer or an Idempotency-Key in use"
_LIMIT = Parameter("limit", int, "at most this many", {"ge": 1, "le": MAX_LIST_LIMIT})
_WAIT = Parameter("wait", int, "hold the request up to this many seconds", {"ge": 0, "le": MAX_WAIT_SECONDS})
_IDEMPOTENCY = Parameter(
    "Idempotency-Key", str, "a retry with the same key and body answers the first result without running again"
)
_PREFER = Parameter(
    "Prefer",
    str,
    f"``wait=N`` (N <= {MAX_WAIT_SECONDS}): hold the request until the turn ends, up to N seconds (RFC 7240)",
)

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/sessions"): Operation(
        "Create a session",
        {201: ("the session", SessionView)},
        {400: _BAD, 409: "a session with this id exists", 413: _TOO_LARGE},
        body=CreateBody,
    ),
    ("GET", "/sessions"): Operation(
        "List the caller's sessions, most recently updated first",
        {200: ("a page of sessions", SessionList)},
        {400: _BAD},
        query=(
            _LIMIT,
            Parameter("status", str, "only sessions in this status", {"json_schema_extra": {"enum": list(STATUSES)}}),
            Parameter("cursor", str, "the ``cursor`` of the previous page"),
            Parameter(
                "awaiting",
                str,
                "``me``: only the sessions with calls this caller may answer, with those calls",
                {"json_schema_extra": {"enum": ["me"]}},
            ),
        ),
    ),
    ("GET", "/sessions/{id}"): Operation(
        "Show a session: its state in every bound scope and the calls it waits on",
        {200: ("the session", SessionView)},
        {400: _BAD, 404: _MISSING},
    ),
    ("DELETE", "/sessions/{id}"): Operation(
        "Delete a session and its ledger",
        {204: ("deleted", None)},
        {400: _BAD, 404: _MISSING},
    ),
    ("GET", "/sessions/{id}/events"): Operation(
        "A page of the session's ledger",
        {200: ("events from ``after``", EventsPage)},
        {400: _BAD, 404: _MISSING},
        query=(
            Parameter("after", int, "the index of the first event to send", {"ge": 0}),
            _LIMIT,
            _WAIT,
        ),
    ),
    ("GET", "/sessions/{id}/state"): Operation(
        "The session's state as it stood after an event, and what changed since another",
        {200: ("the state at ``at``", StateAt)},
        {400: _BAD, 404: "no such session, or no event at ``at`` or ``since``"},
        query=(
            Parameter("at", int, "the event (default: the last)", {"ge": 0}),
            Parameter("since", int, "the event to compare with (default: the one before ``at``)", {"ge": 0}),
        ),
    ),
    ("GET", "/sessions/{id}/audit"): Operation(
        "The history of one state key: who changed it, when, from what to what",
        {200: ("the key's changes", KeyHistory)},
        {400: _BAD, 404: _MISSING},
        query=(
            Parameter("scope", str, "the state scope (session, user, ...)", {"min_length": 1}, required=True),
            Parameter("key", str, "the state key", {"min_length": 1}, required=True),
        ),
    ),
    ("POST", "/sessions/{id}/forks"): Operation(
        "Fork the session at an event: a new session holding its ledger up to there",
        {201: ("the new session", SessionView)},
        {400: _BAD, 404: "no such session, or no event at ``at``", 409: _CONFLICT, 413: _TOO_LARGE},
        body=ForkBody,
    ),
    ("POST", "/sessions/{id}/runs"): Operation(
        "Run a turn of the session's agent",
        {
            200: ("the turn ended within the request", TurnEnded),
            202: ("the turn runs; ``Location`` is the session", TurnStarted),
        },
        {
            400: _BAD,
            404: _MISSING,
            409: _CONFLICT,
            413: _TOO_LARGE,
            422: _UNSTORABLE,
            429: "the caller's tenant spent its turn quota (``-c turn_quota=``): ``field`` is ``quota``, nothing ran",
        },
        body=RunBody,
        headers=(_IDEMPOTENCY, _PREFER),
    ),
    ("POST", "/sessions/{id}/tools"): Operation(
        "Answer the calls the session waits on (yielded tools)",
        {
            200: ("the turn the answers woke ended within the request", TurnEnded),
            202: ("the answers are stored", AnswersStored),
        },
        {
            400: _BAD,
            403: _REFUSED,
            404: _MISSING,
            409: _CONFLICT,
            413: _TOO_LARGE,
            422: "an answer the tool's schema refuses",
        },
        body=ToolsBody,
        headers=(_IDEMPOTENCY, _PREFER),
    ),
    ("POST", "/sessions/{id}/commit"): Operation(
        "Commit events a runner elsewhere recorded, at an expected version",
        {200: ("committed", Committed)},
        {400: _BAD, 403: _REFUSED, 404: _MISSING, 409: _CONFLICT, 413: _TOO_LARGE, 422: _UNSTORABLE},
        body=CommitBody,
    ),
    ("POST", "/erasures"): Operation(
        "Erase a person: every session bound to a scope id, and that id's shared state",
        {200: ("what was erased", ErasureReport)},
        {400: _BAD, 413: _TOO_LARGE},
        body=EraseBody,
    ),
    ("GET", "/openapi.json"): Operation(
        "This document",
        {200: ("the OpenAPI document", None)},
        {},
    ),
}
"""Every route of ``serving.routes``, and nothing else (a test holds them together)."""

_ID = {"pattern": ID_PATTERN, "maxLength": MAX_ID_LENGTH}
"""An id (a session's, a scope's): what ``dormant.ids.check_id`` accepts; anything else is a 400 naming it."""
_IDS_IN_BODIES = {"CreateBody": "session_id", "EraseBody": "scope_id"}
_EVERY_ROUTE = {
    401: "no valid token: API Gateway's authorizer answers, in the same shape",
    403: "a machine client's access token without the route's scope (under ``/clients``), or of a client the "
    "deployment does not list; on an administrative route (deleting, erasing) a person not in the admin group",
}
_SECURITY = "cognito"


def _view(method: str, path: str, operation: Operation) -> Any:
    """A stand-in for the route's handler, with the signature Powertools reads the parameters and body from."""
    from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query

    an_id: Any = Annotated[str, Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)]
    parameters = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=an_id) for name in _path_parameters(path)
    ]
    for spec, where in [*((q, Query) for q in operation.query), *((h, Header) for h in operation.headers)]:
        marker = where(description=spec.description, **spec.constraints)
        if where is Header:
            marker.alias = spec.name  # as written, not Powertools' underscore-to-dash guess
        # Optional without ``| None``: a query value or header is absent or a value, never JSON null.
        default = inspect.Parameter.empty if spec.required else None
        name = spec.name.lower().replace("-", "_")
        annotation = Annotated[spec.kind, marker]  # type: ignore[name-defined]
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        )
    if operation.body is not None:
        body: Any = Annotated[operation.body, Body(embed=False, media_type="application/json")]
        parameters.append(inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=body))

    def view(**_: Any) -> None:
        """Never called: only its signature is read."""

    view.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    view.__name__ = f"{method.lower()}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}"
    return view


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _responses(operation: Operation) -> dict[int, Any]:
    responses: dict[int, Any] = {}
    for status, (description, shape) in operation.answers.items():
        responses[status] = {"description": description}
        if shape is not None:
            responses[status]["content"] = {"application/json": {"model": shape}}
        elif status != 204:
            responses[status]["content"] = {"application/json": {"schema": {"type": "object"}}}
    for status, description in {**operation.errors, **_EVERY_ROUTE}.items():
        responses[status] = {"description": description, "content": {"application/json": {"model": ErrorBody}}}
    return dict(sorted(responses.items()))


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every operation in ``OPERATIONS``."""
    from aws_lambda_powertools.event_handler import APIGatewayRestResolver
    from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn

    resolver = APIGatewayRestResolver()
    for (method, path), operation in OPERATIONS.items():
        view = _view(method, path, operation)
        resolver.route(
            path.replace("{", "<").replace("}", ">"),
            method,
            summary=operation.summary,
            responses=_responses(operation),
            operation_id=view.__name__,
        )(view)
    cognito = APIKey(
        in_=APIKeyIn.header,
        name="Authorization",
        description="A Cognito ID token of the stack's user pool (API Gateway's authorizer checks it; "
        "`dormant serve` takes X-Dormant-Principal instead)",
    )
    schema = resolver.get_openapi_schema(
        title=TITLE,
        version=VERSION,
        description="Agents whose sessions sleep between turns: the HTTP API of a dormant deployment. Every error "
        "is an ErrorBody; bad input is a 4xx naming the field.",
        security_schemes={_SECURITY: cognito},
        security=[{_SECURITY: []}],
    )
    raw: dict[str, Any] = json.loads(schema.model_dump_json(by_alias=True, exclude_none=True))
    return _tidied(raw)


def _tidied(raw: dict[str, Any]) -> dict[str, Any]:
    """Drop what Powertools adds for its own request validation (off here: the handlers validate, and answer 400)."""
    schemas = raw.get("components", {}).get("schemas", {})
    for model, name in _IDS_IN_BODIES.items():  # check_id's rule, stated (a pattern applies to strings only)
        schemas[model]["properties"][name].update(_ID)
    text = json.dumps(raw["paths"])
    for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        if f'/{unused}"' not in text:
            schemas.pop(unused, None)
    for item in raw["paths"].values():
        for operation in item.values():
            if "204" in operation["responses"]:  # no body: Powertools gives every response a content
                operation["responses"]["204"].pop("content", None)
    raw.pop("servers", None)  # "/" says nothing: the stage URL is the stack's ApiUrl output
    return raw


def document_json() -> str:
    """``document()`` as the text ``make openapi`` writes (and ``GET /openapi.json`` answers)."""
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the document, or write it to the path given (whole or not at all: a failed run leaves the old one)."""
    args = sys.argv[1:] if argv is None else argv
    text = document_json()
    if not args:
        sys.stdout.write(text)
        return 0
    target = Path(args[0])
    partial = target.with_name(f".{target.name}.tmp")
    partial.write_text(text)
    partial.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
