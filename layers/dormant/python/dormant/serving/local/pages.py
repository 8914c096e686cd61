"""``LocalAPI``: each request to a route of ``serving.routes`` through the Lambda handler ``api.api_handler``
builds; any other path to the pages.

Where Step Functions resumes a sleeping agent on AWS, the answers' own request resumes it here, in-process
(``workflow.in_process_hooks``). The caller is the identity headers', each else the server's ``principal``,
``tenant`` and ``groups`` (the groups only for a request that names no principal: they are the default
caller's); without a tenant the principal is its own tenant, as a token without the claim is on AWS. A machine
client is ``X-Dormant-Client`` with ``X-Dormant-Scopes``: an access token, for the routes under ``/clients``
(its tenant is the one ``DORMANT_MACHINE_CLIENTS`` maps it to, as deployed); each route is refused as the
authorizer refuses a token it does not take (``gateway.unauthorized``). The
pages of ``cors_origins`` get the ``Access-Control-*`` headers and preflight answers the deployed API gives
them (``serving.api.cors_config``).

A ``LocalAPI`` takes one request at a time: Powertools' resolver keeps the current event on its class
(``BaseRouter.current_event``, shared by every instance and thread), so two requests in threads of one
process would read each other's — as Lambda gives each instance one request at a time.

**Pages** (the seam for the session inspector): any path that is not an API route goes to the
``pages`` given to ``LocalAPI``, in order: each is called with a ``PageRequest`` and returns a
``Reply``, or ``None`` to pass it on; a path none takes is a 404 (a 405 if one takes it on GET). A page
calls the API as its caller with ``request.call_api(...)``, so tenants and bad input behave as over HTTP.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ...people import parse_groups
from ..api import api_handler
from ..idempotency import Idempotency
from ..routes import CLIENT_PREFIX, PREFLIGHT_FUNCTION, ROUTES, SCOPES
from ..runtime import Served
from ..workflow import in_process_hooks
from .gateway import (
    LAMBDA_TIMEOUT_MS,
    LambdaContext,
    Reply,
    Route,
    compile_route,
    not_allowed,
    proxy_event,
    refuse,
    to_reply,
    unauthorized,
)
from .guard import (
    CLIENT_HEADER,
    GROUPS_HEADER,
    IDENTITY_HEADERS,
    PRINCIPAL_HEADER,
    SCOPES_HEADER,
    TENANT_HEADER,
    cross_site,
    is_loopback,
)

__all__ = ["LocalAPI", "Page", "PageRequest"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PageRequest:
    """A request to a non-API path, from a loopback client, with its caller already decided."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    """Header names in lower case."""
    body: bytes
    principal: str
    api: LocalAPI
    tenant: str | None = None
    groups: tuple[str, ...] = ()

    def call_api(self, method: str, path: str, body: Any = None) -> Reply:
        """Call an API route (``path`` may carry a query) as this request's caller, through the handler."""
        raw = b"" if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        return self.api.call(method, path, headers, raw, self.principal, tenant=self.tenant, groups=self.groups)


Page = Callable[[PageRequest], Reply | None]
"""A handler for non-API paths: a ``Reply``, or ``None`` to leave the path to the next page."""


class LocalAPI:
    """The API's routes over ``served``, each request through the Lambda handler; other paths to ``pages``."""

    def __init__(
        self,
        served: Served,
        *,
        principal: str = "local",
        pages: Sequence[Page] = (),
        idempotency: Idempotency | None = None,
        tenant: str | None = None,
        groups: Sequence[str] = (),
        cors_origins: Sequence[str] = (),
    ) -> None:
        self.served = served
        self.principal = principal
        self.tenant = tenant
        self.groups = tuple(groups)
        self.pages = list(pages)
        self.cors_origins = frozenset(origin.strip().rstrip("/") for origin in cors_origins if origin.strip())
        self._handler = api_handler(
            in_process_hooks(served),
            served,
            idempotency,
            cors_origins=sorted(self.cors_origins),
            cors_headers=(PRINCIPAL_HEADER, TENANT_HEADER, GROUPS_HEADER),
        )
        # each route twice, as deployed: for people, and under /clients for machine clients' access tokens
        self._routes = [Route(m, p + r, compile_route(p + r), f) for m, r, f in ROUTES for p in ("", CLIENT_PREFIX)]
        self._lock = threading.Lock()

    def handle(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str) -> Reply:
        """Answer one HTTP request from the client at address ``client``."""
        if not is_loopback(client):
            return refuse(403, "dormant serve answers loopback clients only: it authenticates no one")
        foreign = cross_site(headers, self.cors_origins)
        if foreign is not None:
            return refuse(403, f"dormant serve answers its own pages and local tools only, not {foreign}")
        given = [value for name, value in headers if name.lower() == PRINCIPAL_HEADER.lower()]
        principal = given[-1].strip() if given else self.principal
        if not principal:
            return refuse(400, f"{PRINCIPAL_HEADER} is empty", field=PRINCIPAL_HEADER)
        named = [value for name, value in headers if name.lower() == TENANT_HEADER.lower()]
        tenant = named[-1].strip() if named else self.tenant
        if named and not tenant:
            return refuse(400, f"{TENANT_HEADER} is empty", field=TENANT_HEADER)
        listed = [value for name, value in headers if name.lower() == GROUPS_HEADER.lower()]
        # the server's groups are its default caller's: a request naming another principal names its groups too
        groups = tuple(sorted(parse_groups(listed[-1]))) if listed else () if given else self.groups
        machine = _machine(headers, bool(given or named or listed))
        if isinstance(machine, Reply):
            return machine
        split = urlsplit(target)
        if self._match(split.path) is not None:
            return self.call(
                method, target, headers, body, principal, client, tenant=tenant, groups=groups, machine=machine
            )
        request = PageRequest(
            method=method,
            path=split.path,
            query={name: values[-1] for name, values in parse_qs(split.query, keep_blank_values=True).items()},
            headers={name.lower(): value for name, value in headers},
            body=body,
            principal=principal,
            api=self,
            tenant=tenant,
            groups=groups,
        )
        for page in self.pages:
            try:
                reply = page(request)
            except Exception:  # a page's bug: logged here, a plain 500 to the client
                logger.exception("page %r failed on %s %s", page, method, split.path)
                return refuse(500, "the page failed; the server's log says why")
            if reply is not None:
                return reply
        if method not in {"GET", "HEAD"} and self._page_serves(request):
            return not_allowed(method, split.path, "GET, HEAD")
        return refuse(404, f"no route {split.path}")

    def _page_serves(self, request: PageRequest) -> bool:
        """Whether a page serves this path on GET (a request with another method then gets a 405, not a 404)."""
        probe = dataclasses.replace(request, method="GET", body=b"")
        for page in self.pages:
            try:
                if page(probe) is not None:
                    return True
            except Exception:  # the page's bug shows on its own GET; here the path is simply not served
                return False
        return False

    def call(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] | Mapping[str, str],
        body: bytes,
        principal: str,
        client: str = "127.0.0.1",
        *,
        tenant: str | None = None,
        groups: Sequence[str] = (),
        machine: tuple[str, tuple[str, ...]] | None = None,
    ) -> Reply:
        """One API request as ``principal`` (of ``tenant``, in ``groups``), or as a ``machine`` client (its id and
        scopes), through the Lambda handler (a 404 or 405 when no route fits, a 401 when the authorizer would
        not take the token)."""
        split = urlsplit(target)
        matched = self._match(split.path)
        if matched is None:
            return refuse(404, f"no route {split.path}")
        route = next((r for r in matched[0] if r.method == method.upper()), None)
        if route is None and method.upper() == "HEAD":  # HEAD is GET without the body (the server drops it)
            route = next((r for r in matched[0] if r.method == "GET"), None)
        if route is None and method.upper() == "OPTIONS" and self.cors_origins:  # a preflight, as API Gateway routes it
            route = Route("OPTIONS", matched[0][0].resource, matched[0][0].pattern, PREFLIGHT_FUNCTION)
        if route is None:
            allowed = {r.method for r in matched[0]}
            allowed |= {"HEAD"} if "GET" in allowed else set()
            return not_allowed(method, split.path, ", ".join(sorted(allowed)))
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        forwarded = [(name, value) for name, value in pairs if name.lower() not in IDENTITY_HEADERS]
        request_id = str(uuid.uuid4())
        robot, scopes = machine if machine is not None else (None, ())
        refused = None if route.method == "OPTIONS" else unauthorized(route.method, route.resource, robot, scopes)
        if refused is not None:
            return refused
        event = proxy_event(
            route.method,
            route.resource,
            split.path,
            matched[1],
            split.query,
            forwarded,
            body,
            principal,
            client,
            request_id,
            tenant=tenant,
            groups=groups,
            client=robot,
            scopes=scopes,
        )
        if route.method == "OPTIONS":  # no authorizer runs on a preflight: it carries no token
            event["requestContext"].pop("authorizer")
        context = LambdaContext(f"dormant-{route.function}", request_id)
        with self._lock:
            context.deadline = time.monotonic() + LAMBDA_TIMEOUT_MS / 1000
            response = self._handler(event, context)
        return to_reply(response)

    def _match(self, path: str) -> tuple[list[Route], dict[str, str]] | None:
        routes: list[Route] = []
        params: dict[str, str] = {}
        for route in self._routes:
            found = route.pattern.match(path)
            if found is not None:
                routes.append(route)
                params = found.groupdict()
        return (routes, params) if routes else None


def _machine(headers: Sequence[tuple[str, str]], person: bool) -> tuple[str, tuple[str, ...]] | Reply | None:
    """The machine client ``X-Dormant-Client`` and ``X-Dormant-Scopes`` name (its id, its scopes), ``None`` for a
    person, or a 400 naming the header: an access token names no person (``person``: a person's header is
    there too), and Cognito grants only the resource server's scopes."""
    clients = [value.strip() for name, value in headers if name.lower() == CLIENT_HEADER.lower()]
    scoped = [value for name, value in headers if name.lower() == SCOPES_HEADER.lower()]
    if not clients:
        if scoped:
            return refuse(400, f"{SCOPES_HEADER} are a machine client's: name it with {CLIENT_HEADER}", SCOPES_HEADER)
        return None
    if not clients[-1]:
        return refuse(400, f"{CLIENT_HEADER} is empty", field=CLIENT_HEADER)
    if person:
        message = (
            f"{CLIENT_HEADER} is a machine client's access token, which names no person: send it without "
            f"{PRINCIPAL_HEADER}, {TENANT_HEADER} and {GROUPS_HEADER}"
        )
        return refuse(400, message, field=CLIENT_HEADER)
    scopes = tuple(scoped[-1].split()) if scoped else ()
    unknown = [scope for scope in scopes if scope not in SCOPES.values()]
    if unknown:
        message = f"{SCOPES_HEADER}: no scope {unknown[0]!r}; the scopes are {', '.join(SCOPES.values())}"
        return refuse(400, message, field=SCOPES_HEADER)
    return clients[-1], scopes
