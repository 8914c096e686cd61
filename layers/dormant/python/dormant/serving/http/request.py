"""One request as the routes read it: who calls (the authorizer's claims), the app as its tenant sees it, the
body as a route's model, the query's values and ``Prefer: wait=N``; and how a route is put on a ``Router``.

Who calls: the claims the Cognito authorizer verified (``requestContext.authorizer.claims``), read by
``serving.callers.identify``: a person's ``sub``, tenant claim and groups; a machine client's id, scopes and the
tenant the deployment maps it to. Before any route reads its body, ``Routes`` checks the caller may call it: a
machine client's access token (``token_use`` ``access``, under ``/clients``) must carry the route's scope
(``routes.scope_of``), and an administrative route (``routes.ADMIN_ROUTES``) needs a person in the admin group.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from pydantic import ValidationError

from ...app import App
from ...errors import InputError, NotAuthenticated, NotPermitted, RequestTooLarge
from ...people import Caller
from ..bodies import MAX_LIST_LIMIT, MAX_WAIT_SECONDS
from ..callers import DEFAULT_ADMIN_GROUP, Identity, identify, log_identity
from ..hooks import Hooks
from ..quota import TurnQuota
from ..routes import ADMIN_ROUTES, CLIENT_PREFIX, ROUTES, scope_of
from ..runtime import Served

if TYPE_CHECKING:
    from ..idempotency import Idempotency

__all__ = ["MAX_BODY_BYTES", "Api", "Request", "Routes", "check_wait", "log_keys"]

MAX_BODY_BYTES = 256 * 1024
"""Larger bodies are refused with 413 before they are parsed (an event must fit a DynamoDB item)."""


@dataclass(frozen=True)
class Api:
    """What every route of one function's resolver works with."""

    served: Served
    hooks: Hooks
    logger: Logger
    idempotency: Idempotency | None
    quota: TurnQuota | None
    tenant_claim: str
    clients: Mapping[str, str] | None = None
    """A machine client's id -> its tenant (``serving.callers.machine_clients``); ``None``: each is its own."""
    admin_group: str = DEFAULT_ADMIN_GROUP


_UNREAD: Any = object()
_ROUTES = frozenset((method, path) for method, path, _ in ROUTES)


class Request:
    """The request being answered, read through its route's ``Api``."""

    def __init__(self, api: Api, event: APIGatewayProxyEvent, context: Any) -> None:
        self.api = api
        self.event = event
        self.context = context
        self._data: Any = _UNREAD

    def claims(self) -> dict[str, Any]:
        context = self.event.request_context
        found = (context.authorizer.claims or {}) if context.authorizer else {}
        if not found.get("sub"):
            raise NotAuthenticated("no authenticated caller (the authorizer gave no sub claim)")
        return found

    def identity(self) -> Identity:
        """Who calls (``serving.callers``): principal, tenant, client, groups, scopes."""
        return identify(self.claims(), self.api.tenant_claim, self.api.clients)

    def caller(self) -> Caller:
        """Who is acting: the principal, in its groups."""
        who = self.identity()
        return Caller(who.principal, who.groups)

    def tenant(self) -> str:
        """The caller's tenant: a person's tenant claim (else ``sub``), a machine client's mapped tenant."""
        return self.identity().tenant

    def granted(self) -> frozenset[str] | None:
        """The scopes of a machine client's access token; ``None`` for a person's ID token."""
        return self.identity().scopes

    def permit(self, scope: str) -> None:
        scopes = self.granted()
        if scopes is not None and scope not in scopes:
            raise NotPermitted(f"this access token lacks the scope {scope}", rule=scope, field="scope")

    def authorize(self) -> None:
        """Whether the caller may call this route at all (``Routes`` asks before any view runs): the route's scope
        for a machine client; for an administrative route, a person in the admin group. A 403 naming the rule."""
        event = self.event
        method, resource = event.http_method, event.request_context.resource_path.removeprefix(CLIENT_PREFIX)
        who = self.identity()
        if (method, resource) not in _ROUTES:
            return
        self.permit(scope_of(method, resource))
        group = self.api.admin_group
        if (method, resource) in ADMIN_ROUTES and who.scopes is None and group not in who.groups:
            raise NotPermitted(
                f"{method} {resource} needs the role {group!r}: a member of the group {group}", rule=f"group:{group}"
            )

    def app(self) -> App:
        return self.api.served.for_tenant(self.tenant())

    def data(self) -> Any:
        """The body's JSON (``{}`` for none), parsed once per request: the route's model and the idempotency
        record's payload both read this."""
        if self._data is _UNREAD:
            raw = self.event.body or ""
            coding = (self.event.headers.get("content-encoding") or "identity").strip().lower()
            if raw and coding != "identity":  # neither API Gateway (no compression set) nor a handler decodes it
                raise InputError(
                    f"the body is read as sent: send it without Content-Encoding, not {coding!r}",
                    field="Content-Encoding",
                )
            size = len(raw.encode() if isinstance(raw, str) else raw)
            if size > MAX_BODY_BYTES:
                raise RequestTooLarge(size, MAX_BODY_BYTES)
            try:
                self._data = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise InputError(f"the body is not JSON: {exc}", field="body") from None
            except RecursionError:  # a small body can nest deeper than the parser goes: bad input, not a 500
                raise InputError("the body nests too deeply to be read", field="body") from None
        return self._data

    def payload(self) -> str:
        """The body as an idempotency record compares it: its JSON with sorted keys (``""`` for none)."""
        return json.dumps(self.data(), sort_keys=True) if self.event.body else ""

    def body(self, model: type[Any]) -> Any:
        """The body as ``model``; an ``InputError`` naming the first field it refuses."""
        data = self.data()
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "body"
            raise InputError(f"{field}: {first['msg']}", field=field) from None

    def query_int(self, name: str) -> int | None:
        value = self.event.get_query_string_value(name)
        if value is None:
            return None
        if not (value.isascii() and value.isdigit()):  # int() takes "1_000", " 1", "-5" and other scripts' digits
            raise InputError(f"{name} is a whole number written in digits 0-9, not {value!r}", field=name)
        return int(value)

    def query_limit(self, default: int) -> int:
        """A page's ``limit``: 1 to ``MAX_LIST_LIMIT`` (a larger one is a 400, not a table read)."""
        limit = self.query_int("limit")
        if limit == 0 or (limit is not None and limit > MAX_LIST_LIMIT):
            raise InputError(f"limit is 1 to {MAX_LIST_LIMIT}, not {limit}", field="limit")
        return limit or default

    def query_str(self, name: str) -> str:
        value = self.event.get_query_string_value(name)
        if not value:
            raise InputError(f"{name} is required", field=name)
        return value

    def idempotency_key(self) -> str | None:
        """The ``Idempotency-Key`` header: one request however often it is sent (``None``: none given)."""
        return self.event.headers.get("Idempotency-Key") or self.event.headers.get("idempotency-key") or None

    def prefer_wait(self) -> int:
        """``Prefer: wait=N`` (RFC 7240): hold the request up to N seconds for the turn to end."""
        header = self.event.headers.get("Prefer") or self.event.headers.get("prefer") or ""
        for preference in re.split(r"[,;]", header):
            name, _, value = preference.strip().partition("=")
            if name.strip().lower() == "wait":
                return check_wait(value.strip().strip('"'), "Prefer")
        return 0


def check_wait(value: str | None, field: str) -> int:
    """A ``wait=N`` query value or ``Prefer: wait=N``: 0 to ``MAX_WAIT_SECONDS``, digits 0-9 only."""
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_WAIT_SECONDS:
        raise InputError(
            f"{field} is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}, not {value!r}", field=field
        )
    return int(value)


class Routes:
    """A Powertools ``Router`` of one function's routes, each view called with the ``Request`` and the path's
    values; ``paths`` lists them as ``serving.routes`` writes them (``(method, path)``)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.router = APIGatewayRouter()  # type: ignore[no-untyped-call]
        self.paths: set[tuple[str, str]] = set()

    def add(self, method: str, path: str, view: Callable[..., Any]) -> None:
        router, api = self.router, self.api

        @functools.wraps(view)
        def decoded(**keys: str) -> Any:
            # API Gateway's REST API passes the path as the client escaped it (only pathParameters are
            # decoded) and Powertools routes on the path: an id holding ':', '@', '+' or '=' arrives
            # escaped by any client that escapes path segments (a browser's encodeURIComponent).
            request = Request(api, router.current_event, router.lambda_context)
            request.authorize()  # every route: its scope, its role; before the view reads the body
            return view(request, **{name: unquote(value) for name, value in keys.items()})

        router.route(path, method)(decoded)
        self.paths.add((method, re.sub(r"<\w+>", "{id}", path)))


def log_keys(event: dict[str, Any], tenant_claim: str, clients: Mapping[str, str] | None) -> dict[str, Any]:
    """What every log line of a request carries: the tenant, the principal (a person's ``sub``, a machine client's
    id), the client (the app client: a machine's id, a person's ``aud``) and the session; never a token or a
    body."""
    context = event.get("requestContext") or {}
    claims = (context.get("authorizer") or {}).get("claims") or {}
    session = (event.get("pathParameters") or {}).get("id")
    return {**log_identity(claims, tenant_claim, clients), "session_id": session}
