"""``dormant serve``: the HTTP API on this machine, through the same handler code that runs on Lambda.

Each request to a route of ``serving.routes`` becomes the proxy event API Gateway (REST API, v1) would
send — the caller in ``requestContext.authorizer.claims.sub``, where the Cognito authorizer puts it —
and goes to the handler ``api.api_handler`` builds for Lambda; its response is written back as API
Gateway would write it. Where Step Functions resumes a sleeping agent on AWS, the answers' own
request resumes it here, in-process (``workflow.in_process_hooks``).

Identity is a development stand-in for the authorizer: the ``X-Dormant-Principal`` header (the token's
``sub``), ``X-Dormant-Tenant`` (its tenant claim, ``DORMANT_TENANT_CLAIM``) and ``X-Dormant-Groups`` (a comma
list: its ``cognito:groups``), each else the server's ``principal``, ``tenant`` and ``groups`` (the groups
only for a request that names no principal: they are the default caller's); without a tenant the principal
is its own tenant, as a token without the claim is on AWS. Nothing here
authenticates anyone, so only loopback clients are served: any other gets a 403. A loopback client may
be a browser running another site's script, so a request a browser marks as cross-site (``Origin`` not
this server, ``Sec-Fetch-Site: cross-site``) or one whose ``Host`` is not a loopback name (DNS
rebinding) gets a 403 too, before it reaches a handler. The pages of the origins given as ``cors_origins``
(``dormant serve --cors-origin``) are let through, and get the ``Access-Control-*`` headers and preflight
answers the deployed API gives them (``serving.api.cors_config``).

**Concurrency.** A ``LocalAPI`` takes one request at a time: Powertools' resolver keeps the current event
on its class (``BaseRouter.current_event``, shared by every instance and thread), so two requests in
threads of one process would read each other's — as Lambda gives each instance one request at a time.
``Workers`` runs requests side by side as Lambda does, one instance each: ``count`` forked processes,
each with its own ``LocalAPI``, app and store connection, each taking one request at a time from the
server, which reads and writes HTTP in threads (a slow client holds up no one) and hands each request
to whichever worker is free. A worker ends when the server closes its pipe, or dies: it reads EOF.

**Following a session.** ``GET /sessions/{id}/events`` with ``Accept: text/event-stream`` is the same feed
as server-sent events: each event as it lands (``id:`` its index in the ledger, ``event:`` its type,
``data:`` its JSON), from ``after=`` or, on a reconnect, the event after ``Last-Event-ID``; a comment every
``heartbeat`` seconds while idle; the stream ends when the client goes (or the server stops). It pins no
worker: the server thread that holds the connection asks the API for the next events with plain requests,
pausing between them, so each look takes a worker for a moment only.

**HTTP.** Any method reaches the routes, as on API Gateway: one a path does not take (TRACE, PATCH, a made-up
token) is a JSON 405 naming ``Allow``; what http.server refuses itself (a malformed request line, an over-long
URI) is JSON too. A client that goes away mid-request or mid-response is one line on stderr (none with
``log_requests`` off), not a traceback. The socket queues ``REQUEST_BACKLOG`` connections, so a burst of
clients waits to be accepted instead of being dropped.

**Pages** (the seam for the session inspector): any path that is not an API route goes to the
``pages`` given to ``LocalAPI``, in order: each is called with a ``PageRequest`` and returns a
``Reply``, or ``None`` to pass it on; a path none takes is a 404 (a 405 if one takes it on GET). A page
calls the API as its caller with ``request.call_api(...)``, so tenants and bad input behave as over HTTP.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import json
import logging
import multiprocessing
import os
import queue
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode, urlsplit

from ..errors import ConfigurationError, InputError
from ..people import parse_groups
from .api import api_handler
from .idempotency import Idempotency
from .routes import PREFLIGHT_FUNCTION, ROUTES
from .runtime import Served, tenant_claim
from .workflow import in_process_hooks

__all__ = [
    "GROUPS_HEADER",
    "MAX_REQUEST_BYTES",
    "PRINCIPAL_HEADER",
    "TENANT_HEADER",
    "Handler",
    "LocalAPI",
    "LocalServer",
    "Page",
    "PageRequest",
    "Reply",
    "Workers",
    "can_fork",
    "proxy_event",
]

PRINCIPAL_HEADER = "X-Dormant-Principal"
TENANT_HEADER = "X-Dormant-Tenant"
GROUPS_HEADER = "X-Dormant-Groups"
_IDENTITY_HEADERS = frozenset(h.lower() for h in (PRINCIPAL_HEADER, TENANT_HEADER, GROUPS_HEADER))
MAX_REQUEST_BYTES = 10 * 1024 * 1024
"""API Gateway's payload limit: a larger body is refused unread (the handler's own limit is lower)."""
_LAMBDA_TIMEOUT_MS = 29_000  # API Gateway's integration timeout
REQUEST_BACKLOG = 1024
"""Connections the listening socket queues before ``accept`` (``listen``'s backlog; the kernel may cap it, as
Linux does at ``net.core.somaxconn``): socketserver's default of 5 refuses or stalls a burst of clients."""
HEARTBEAT_SECONDS = 15.0
"""How often an idle server-sent events stream sends a comment, so proxies and clients know it lives."""
_STREAM_PAGE = "100"  # events per look at the ledger, when the client names no limit
_STREAM_FIRST, _STREAM_LONGEST = 0.1, 1.0  # the stream's pause between looks while nothing lands, growing
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """An HTTP response: what a page returns, and what ``call_api`` gives back."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @classmethod
    def of_json(cls, status: int, payload: Any) -> Reply:
        return cls(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})


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


@dataclass(frozen=True)
class _Route:
    method: str
    resource: str
    pattern: re.Pattern[str]
    function: str


def _compile(resource: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", resource)
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(f"^{regex}$")


_EVENTS_ROUTE = _compile("/sessions/{id}/events")


@dataclass
class _LambdaContext:
    """What the handler reads of Lambda's context object."""

    function_name: str
    aws_request_id: str
    memory_limit_in_mb: int = 512
    deadline: float = 0.0

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:local:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def proxy_event(
    method: str,
    resource: str,
    path: str,
    path_parameters: Mapping[str, str],
    query: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    principal: str,
    source_ip: str,
    request_id: str,
    tenant: str | None = None,
    groups: Sequence[str] = (),
) -> dict[str, Any]:
    """The API Gateway proxy event (REST API, v1) for one request, as the Cognito authorizer passes it on: an
    ID token's claims, ``sub`` the principal, the tenant claim when there is a ``tenant``, ``cognito:groups``
    as the authorizer writes a list (comma-joined) when there are ``groups``.

    Query values arrive decoded, one per name in ``queryStringParameters`` (the last) and all in
    ``multiValueQueryStringParameters``; headers likewise. A body that is not UTF-8 is base64-encoded.
    """
    single_headers: dict[str, str] = {}
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        single_headers[name] = value
        multi_headers.setdefault(name, []).append(value)
    multi_query = parse_qs(query, keep_blank_values=True)
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode("ascii"), True
    now = datetime.now(UTC)
    lower = {name.lower(): value for name, value in single_headers.items()}
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": single_headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {name: values[-1] for name, values in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": dict(path_parameters) or None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local",
            "resourcePath": resource,
            "httpMethod": method,
            "path": path,
            "stage": "local",
            "requestId": request_id,
            "extendedRequestId": request_id,
            "requestTime": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "requestTimeEpoch": int(now.timestamp() * 1000),
            "accountId": "000000000000",
            "apiId": "local",
            "protocol": "HTTP/1.1",
            "domainName": lower.get("host", "localhost"),
            "identity": {"sourceIp": source_ip, "userAgent": lower.get("user-agent")},
            "authorizer": {"claims": _claims(principal, tenant, groups)},
        },
        "body": text if body else None,
        "isBase64Encoded": encoded,
    }


def _claims(principal: str, tenant: str | None, groups: Sequence[str]) -> dict[str, str]:
    claims = {"sub": principal, "cognito:username": principal, "token_use": "id"}
    if tenant:
        claims[tenant_claim()] = tenant
    if groups:
        claims["cognito:groups"] = ",".join(groups)
    return claims


def is_loopback(address: str) -> bool:
    """Whether a client address is this machine's loopback (IPv4, IPv6, or IPv4 mapped into IPv6)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


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
        self._routes = [_Route(m, r, _compile(r), f) for m, r, f in ROUTES]
        self._lock = threading.Lock()

    def handle(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str) -> Reply:
        """Answer one HTTP request from the client at address ``client``."""
        if not is_loopback(client):
            return _refuse(403, "dormant serve answers loopback clients only: it authenticates no one")
        foreign = _cross_site(headers, self.cors_origins)
        if foreign is not None:
            return _refuse(403, f"dormant serve answers its own pages and local tools only, not {foreign}")
        given = [value for name, value in headers if name.lower() == PRINCIPAL_HEADER.lower()]
        principal = given[-1].strip() if given else self.principal
        if not principal:
            return _refuse(400, f"{PRINCIPAL_HEADER} is empty", field=PRINCIPAL_HEADER)
        named = [value for name, value in headers if name.lower() == TENANT_HEADER.lower()]
        tenant = named[-1].strip() if named else self.tenant
        if named and not tenant:
            return _refuse(400, f"{TENANT_HEADER} is empty", field=TENANT_HEADER)
        listed = [value for name, value in headers if name.lower() == GROUPS_HEADER.lower()]
        # the server's groups are its default caller's: a request naming another principal names its groups too
        groups = tuple(sorted(parse_groups(listed[-1]))) if listed else () if given else self.groups
        split = urlsplit(target)
        if self._match(split.path) is not None:
            return self.call(method, target, headers, body, principal, client, tenant=tenant, groups=groups)
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
                return _refuse(500, "the page failed; the server's log says why")
            if reply is not None:
                return reply
        if method not in {"GET", "HEAD"} and self._page_serves(request):
            return _not_allowed(method, split.path, "GET, HEAD")
        return _refuse(404, f"no route {split.path}")

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
    ) -> Reply:
        """One API request as ``principal`` (of ``tenant``, in ``groups``), through the Lambda handler (a 404 or
        405 when no route fits)."""
        split = urlsplit(target)
        matched = self._match(split.path)
        if matched is None:
            return _refuse(404, f"no route {split.path}")
        route = next((r for r in matched[0] if r.method == method.upper()), None)
        if route is None and method.upper() == "OPTIONS" and self.cors_origins:  # a preflight, as API Gateway routes it
            route = _Route("OPTIONS", matched[0][0].resource, matched[0][0].pattern, PREFLIGHT_FUNCTION)
        if route is None:
            return _not_allowed(method, split.path, ", ".join(sorted({r.method for r in matched[0]})))
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        forwarded = [(name, value) for name, value in pairs if name.lower() not in _IDENTITY_HEADERS]
        request_id = str(uuid.uuid4())
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
        )
        if route.method == "OPTIONS":  # no authorizer runs on a preflight: it carries no token
            event["requestContext"].pop("authorizer")
        context = _LambdaContext(f"dormant-{route.function}", request_id)
        with self._lock:
            context.deadline = time.monotonic() + _LAMBDA_TIMEOUT_MS / 1000
            response = self._handler(event, context)
        return _reply(response)

    def _match(self, path: str) -> tuple[list[_Route], dict[str, str]] | None:
        routes: list[_Route] = []
        params: dict[str, str] = {}
        for route in self._routes:
            found = route.pattern.match(path)
            if found is not None:
                routes.append(route)
                params = found.groupdict()
        return (routes, params) if routes else None


def _cross_site(headers: Sequence[tuple[str, str]], allowed: frozenset[str] = frozenset()) -> str | None:
    """What marks a request as sent by another site's page in a browser on this machine, or ``None``.

    Such a page can reach a loopback port (a simple POST needs no preflight) and, through a host name it
    rebinds to 127.0.0.1, read the answers: its ``Host`` is its own name, and its ``Origin`` not ours.
    A page of an ``allowed`` origin is let through (its ``Host`` must still be loopback).
    """
    given = {name.lower(): value.strip() for name, value in headers}
    host = given.get("host")
    if host is not None and not _loopback_host(host):
        return f"Host {host!r}"
    origin = given.get("origin")
    if origin is not None and origin in allowed:
        return None
    if origin is not None and (
        host is None or origin.lower() not in {f"http://{host.lower()}", f"https://{host.lower()}"}
    ):
        return f"Origin {origin!r}"
    site = given.get("sec-fetch-site")
    if site is not None and site not in {"same-origin", "none"}:
        return f"Sec-Fetch-Site {site!r}"
    return None


def _loopback_host(host: str) -> bool:
    """Whether a ``Host`` header (``name[:port]``) names this machine's loopback."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
    except ValueError:  # a malformed IPv6 literal
        return False
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def _reply(response: Mapping[str, Any]) -> Reply:
    headers: dict[str, str] = dict(response.get("headers") or {})
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name] = ", ".join(values)
    raw = response.get("body") or ""
    body = base64.b64decode(raw) if response.get("isBase64Encoded") else raw.encode()
    return Reply(int(response["statusCode"]), body, headers)


def _not_allowed(method: str, path: str, allowed: str) -> Reply:
    """A 405 for a method the path does not take (any method: TRACE, PATCH, a made-up token), naming those it does."""
    message = f"{method} {path}: use {allowed}"
    return Reply(
        405,
        json.dumps({"error": "MethodNotAllowed", "message": message}).encode(),
        {
            "Content-Type": "application/json",
            "Allow": allowed,
        },
    )


def _refuse(status: int, message: str, field: str | None = None) -> Reply:
    kinds = {
        400: "InputError",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        500: "InternalError",
        503: "ServiceUnavailable",
    }
    kind = kinds.get(status) or _phrase(status).replace(" ", "").replace("-", "")
    payload = {"error": kind, "message": message, **({"field": field} if field else {})}
    return Reply.of_json(status, payload)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class Handler(Protocol):
    """What ``LocalServer`` hands each request to: a ``LocalAPI`` in this process, or ``Workers``."""

    def handle(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str
    ) -> Reply: ...


def can_fork() -> bool:
    """Whether this platform forks processes (``Workers`` needs it; Windows does not)."""
    return "fork" in multiprocessing.get_all_start_methods()


@dataclass(frozen=True)
class _Worker:
    process: multiprocessing.process.BaseProcess
    connection: Connection


class Workers:
    """``count`` forked processes, each with the ``LocalAPI`` that ``build()`` opens, each taking one request at
    a time: requests run side by side, each in a free worker (``handle`` waits for one).

    ``build`` runs in each worker after the fork (a store connection must not cross one) and is a context
    manager: the worker closes what it opened when it ends. Every worker has built its API when the
    constructor returns; one that could not is a ``ConfigurationError`` with its message. Workers ignore
    SIGINT (Ctrl-C in a terminal reaches the whole process group): the server stops them with ``close``,
    after the requests in flight. A worker whose server dies reads EOF on its pipe and ends too.
    """

    def __init__(
        self, build: Callable[[], AbstractContextManager[LocalAPI]], count: int, *, timeout: float = 60
    ) -> None:
        if count < 1:
            raise InputError(f"workers is >= 1, not {count}", field="workers")
        if not can_fork():
            raise ConfigurationError("this platform cannot fork worker processes: serve with one LocalAPI")
        context = multiprocessing.get_context("fork")
        self._workers: list[_Worker] = []
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._alive = count
        self._alive_lock = threading.Lock()
        try:
            for n in range(count):
                ours, theirs = context.Pipe()
                others = [ours, *(worker.connection for worker in self._workers)]
                process = context.Process(target=_work, args=(build, theirs, others), name=f"dormant-worker-{n}")
                process.start()
                theirs.close()
                self._workers.append(_Worker(process, ours))
            for worker in self._workers:
                failed = _started(worker, timeout)
                if failed is not None:
                    raise ConfigurationError(f"a worker process could not start: {failed}")
        except BaseException:
            self.close(timeout=0)
            raise
        for worker in self._workers:
            self._idle.put(worker)

    def handle(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str) -> Reply:
        """Answer one request in the first free worker; a worker that dies on it makes it a 500."""
        request = (method, target, list(headers), body, client)
        while (worker := self._idle.get()) is not None:
            try:
                worker.connection.send(request)
            except OSError:  # it died while idle: the request never reached it, so another may take it
                self._lost(worker)
                continue
            try:
                reply: Reply = worker.connection.recv()
            except (EOFError, OSError):
                self._lost(worker)
                return _refuse(500, "the worker process serving this request died; the server's log says why")
            self._idle.put(worker)
            return reply
        self._idle.put(None)  # for the next request waiting
        return _refuse(503, "every worker process of this server has died; its log says why: restart it")

    def _lost(self, worker: _Worker) -> None:
        worker.process.join(timeout=5)
        logger.error("dormant serve: worker %s died (exit code %s)", worker.process.pid, worker.process.exitcode)
        with self._alive_lock:
            self._alive -= 1
            if self._alive == 0:
                self._idle.put(None)

    def close(self, timeout: float = 30) -> None:
        """Stop every worker: each ends its request, reads EOF and exits; one still running after ``timeout``
        seconds is killed. Call it once no request is in flight (after ``LocalServer.close``)."""
        for worker in self._workers:
            worker.connection.close()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(timeout=5)


def _started(worker: _Worker, timeout: float) -> str | None:
    """Wait for a new worker's first word: ``None`` once its API is built, else why it could not start."""
    if not worker.connection.poll(timeout):
        return f"worker {worker.process.pid} was not ready in {timeout} s"
    try:
        failed: str | None = worker.connection.recv()
    except (EOFError, OSError):
        worker.process.join(timeout=5)
        return f"worker {worker.process.pid} exited with {worker.process.exitcode}"
    return failed


def _work(
    build: Callable[[], AbstractContextManager[LocalAPI]], connection: Connection, others: list[Connection]
) -> None:
    """A worker's life: build its API, say so, answer requests one at a time until the server's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for other in others:  # the server's ends of the pipes, ours and the earlier workers': held by the server
        other.close()  # alone, a pipe reads EOF in its worker when the server goes, even killed
    with contextlib.ExitStack() as stack:
        try:
            api = stack.enter_context(build())
        except Exception as exc:
            connection.send(f"{type(exc).__name__}: {exc}")
            return
        connection.send(None)
        while True:
            try:
                method, target, headers, body, client = connection.recv()
            except EOFError:  # the server closed the pipe, or died
                return
            try:
                reply = api.handle(method, target, headers, body, client)
            except Exception:  # a bug past the handler's error handling: this request's 500, not the worker's end
                logger.exception("dormant serve: worker %s failed on %s %s", os.getpid(), method, target)
                reply = _refuse(500, "the request failed; the server's log says why")
            try:
                connection.send(reply)
            except OSError:  # the server is gone
                return


def _wants_stream(target: str, accept: Sequence[str]) -> bool:
    """Whether a GET asks for the events route as server-sent events (``Accept: text/event-stream``)."""
    if _EVENTS_ROUTE.match(urlsplit(target).path) is None:
        return False
    return any(
        kind.split(";")[0].strip().lower() == "text/event-stream" for value in accept for kind in value.split(",")
    )


def _frame(index: int, event: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``id:`` the event's index in the ledger, ``event:`` its type, ``data:`` its JSON."""
    kind = re.sub(r"[^A-Za-z0-9_.-]", "_", str(event.get("type", "message")))  # one line, whatever it holds
    data = json.dumps(event, separators=(",", ":"))  # JSON text holds no line break
    return f"id: {index}\nevent: {kind}\ndata: {data}\n\n".encode()


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every reply carries its Content-Length
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle would hold the body for the ACK
    server: LocalServer

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self._write(_refuse(411, "send the body with a Content-Length"), close=True)
            return
        try:
            size = int(length) if length else 0
        except ValueError:
            self._write(_refuse(400, f"Content-Length is a number, not {length!r}", field="Content-Length"), True)
            return
        if size < 0:
            self._write(_refuse(400, f"Content-Length is >= 0, not {size}", field="Content-Length"), close=True)
            return
        if size > MAX_REQUEST_BYTES:
            self._write(_refuse(413, f"the body is {size} bytes, over {MAX_REQUEST_BYTES}"), close=True)
            return
        body = self.rfile.read(size)
        if len(body) < size:  # the client went away (or the server is stopping) mid-body
            self.close_connection = True
            return
        if self.command == "GET" and _wants_stream(self.path, self.headers.get_all("Accept") or []):
            self._stream()
            return
        reply = self.server.api.handle(
            self.command, self.path, list(self.headers.items()), body, self.client_address[0]
        )
        self._write(reply)

    def _write(self, reply: Reply, close: bool = False) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            if name.lower() not in {"content-length", "connection"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _stream(self) -> None:
        """``GET /sessions/{id}/events`` as server-sent events: each event as it lands, until the client goes.

        The stream holds no worker: this server thread asks the API (a worker, when there are workers) for
        the ledger after the last event sent, a plain request that answers at once, and pauses between
        looks (0.1 s, growing to 1 s while nothing lands). Each look is an ordinary request as this caller,
        so the loopback, cross-site and tenant rules are the JSON route's; the first look's error (a 404,
        a 400 naming ``after``) is answered as JSON, not as a stream.
        """
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        headers = [(n, v) for n, v in self.headers.items() if n.lower() not in {"accept", "last-event-id"}]
        headers.append(("Accept", "application/json"))
        resumed = self.headers.get("Last-Event-ID")
        if resumed is not None:  # a reconnecting EventSource: on from the event after the last it got
            resumed = resumed.strip()
            if not (resumed.isascii() and resumed.isdigit()):
                message = f"Last-Event-ID is the index of an event (digits 0-9), not {resumed!r}"
                self._write(_refuse(400, message, field="Last-Event-ID"))
                return
            after = str(int(resumed) + 1)
        else:
            after = query.get("after", ["0"])[-1]  # checked by the route: a bad one is its 400
        limit = query.get("limit", [_STREAM_PAGE])[-1]

        def look(position: str) -> Reply:
            target = f"{split.path}?{urlencode({'after': position, 'limit': limit})}"
            return self.server.api.handle("GET", target, headers, b"", self.client_address[0])

        reply = look(after)
        if reply.status != 200:
            self._write(reply)
            return
        self.close_connection = True  # the stream ends with the connection
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        position, pause = int(after), _STREAM_FIRST
        beat = time.monotonic() + self.server.heartbeat
        try:
            while True:
                page = reply.json()
                frames = [_frame(position + n, event) for n, event in enumerate(page["events"])]
                if frames:
                    self.wfile.write(b"".join(frames))
                    self.wfile.flush()
                    position, pause = position + len(frames), _STREAM_FIRST
                    beat = time.monotonic() + self.server.heartbeat
                if page["next"] is None:  # nothing more yet: pause, beating while idle, ending if the client went
                    now = time.monotonic()
                    if now >= beat:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        beat = now + self.server.heartbeat
                    if self._client_gone(min(pause, max(0.0, beat - now))):
                        return
                    pause = min(pause * 2, _STREAM_LONGEST)
                reply = look(str(position))
                if reply.status != 200:  # the session was deleted, or the server is failing: the stream ends
                    logger.info("dormant serve: event stream of %s ended: %s", split.path, reply.status)
                    return
        except OSError:  # the client went away mid-write
            return

    def _client_gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; whether the client closed its end meanwhile (or the server is stopping:
        ``LocalServer.close`` shuts every connection for reading)."""
        readable, _, _ = select.select([self.connection], [], [], timeout)
        if not readable:
            return False
        try:
            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        except OSError:
            return True
        time.sleep(timeout)  # the client sent something (a stream expects nothing): ignore it, and pause anyway
        return False

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve  # noqa: N815 (http.server names)

    def parse_request(self) -> bool:
        """Any method token reaches the API, as on API Gateway: TRACE, CONNECT or a made-up one gets the route's
        JSON 405 naming ``Allow`` (or the path's 404), never http.server's HTML 501."""
        if not super().parse_request():
            return False
        name = f"do_{self.command}"
        if not hasattr(self, name):
            setattr(self, name, self._serve)
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, an over-long URI or header line) in the API's
        JSON, not its HTML page; the connection closes after them."""
        self.log_error("code %d, message %s", code, message)
        if self.request_version == "HTTP/0.9":  # a line too malformed to name a version: answer with a status line
            self.request_version = self.protocol_version
        self._write(_refuse(code, message or explain or _phrase(code)), close=True)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)


class LocalServer(ThreadingHTTPServer):
    """A ``LocalAPI`` (or ``Workers``) on a socket. ``close()`` lets requests in flight finish, then closes idle
    connections."""

    daemon_threads = False
    block_on_close = True
    request_queue_size = REQUEST_BACKLOG

    def __init__(
        self,
        api: Handler,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        log_requests: bool = True,
        heartbeat: float = HEARTBEAT_SECONDS,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.api = api
        self.log_requests = log_requests
        self.heartbeat = heartbeat
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((host, port), _RequestHandler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request or mid-response (a reset, a broken pipe, a timeout) is one quiet
        line, as a request is (none with ``log_requests`` off); anything else is a bug: its traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError | TimeoutError):
            super().handle_error(request, client_address)
            return
        if self.log_requests:
            host, port = (client_address[0], client_address[1]) if isinstance(client_address, tuple) else ("?", "?")
            sys.stderr.write(f"dormant serve: client {host}:{port} went away ({type(error).__name__})\n")

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._connections_lock:
            self._connections.add(connection)
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close(self) -> None:
        """Stop reading from every connection (a reply being written still goes out), then join their threads."""
        with self._connections_lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RD)
        self.server_close()

    @contextlib.contextmanager
    def running(self) -> Iterator[LocalServer]:
        """Serve in a background thread for the ``with`` block (tests and benchmarks in one process)."""
        thread = threading.Thread(target=self.serve_forever, name="dormant-serve", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.shutdown()
            thread.join(timeout=30)
            self.close()
