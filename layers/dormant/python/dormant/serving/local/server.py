"""``LocalServer``: HTTP on a socket, each request handed to a ``LocalAPI`` or to ``Workers``.

**Following a session.** ``GET /sessions/{id}/events`` with ``Accept: text/event-stream`` is the same feed
as server-sent events: each event as it lands (``id:`` its index in the ledger, ``event:`` its type,
``data:`` its JSON), from ``after=`` or, on a reconnect, the event after ``Last-Event-ID``; a comment every
``heartbeat`` seconds while idle; the stream ends when the client goes (or the server stops). It pins no
worker: the server thread that holds the connection asks the API for the next events with plain requests,
pausing between them, so each look takes a worker for a moment only.

**Long-polls.** ``GET /sessions/{id}/events?wait=S`` pins no worker either: the server thread asks with
``wait=0`` and, while the page is empty, pauses and asks again until ``S`` has passed (``_park``), so open
long-polls leave every worker to the other requests.

**HTTP.** ``HEAD`` on a GET route is the GET without its body. Two differing ``Content-Length`` headers are a
400 (which frames the body?). Any method reaches the routes, as on API Gateway: one a path does not take
(TRACE, PATCH, a made-up token) is a JSON 405 naming ``Allow``; what http.server refuses itself (a malformed
request line, an over-long URI) is JSON too. A client that goes away mid-request or mid-response is one line
on stderr (none with ``log_requests`` off), not a traceback. The socket queues ``REQUEST_BACKLOG``
connections, so a burst of clients waits to be accepted instead of being dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from ..bodies import MAX_WAIT_SECONDS
from ..http.waits import WAIT_MARGIN
from .gateway import EVENTS_ROUTE, LAMBDA_TIMEOUT_MS, Reply, phrase, refuse

__all__ = ["HEARTBEAT_SECONDS", "MAX_REQUEST_BYTES", "REQUEST_BACKLOG", "Handler", "LocalServer"]

MAX_REQUEST_BYTES = 10 * 1024 * 1024
"""API Gateway's payload limit: a larger body is refused unread (the handler's own limit is lower)."""
REQUEST_BACKLOG = 1024
"""Connections the listening socket queues before ``accept`` (``listen``'s backlog; the kernel may cap it, as
Linux does at ``net.core.somaxconn``): socketserver's default of 5 refuses or stalls a burst of clients."""
HEARTBEAT_SECONDS = 15.0
"""How often an idle server-sent events stream sends a comment, so proxies and clients know it lives."""
_STREAM_PAGE = "100"  # events per look at the ledger, when the client names no limit
_STREAM_FIRST, _STREAM_LONGEST = 0.1, 1.0  # the stream's pause between looks while nothing lands, growing
logger = logging.getLogger(__name__)


class Handler(Protocol):
    """What ``LocalServer`` hands each request to: a ``LocalAPI`` in this process, or ``Workers``."""

    def handle(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str
    ) -> Reply: ...


def _wants_stream(target: str, accept: Sequence[str]) -> bool:
    """Whether a GET asks for the events route as server-sent events (``Accept: text/event-stream``)."""
    if EVENTS_ROUTE.match(urlsplit(target).path) is None:
        return False
    return any(
        kind.split(";")[0].strip().lower() == "text/event-stream" for value in accept for kind in value.split(",")
    )


def _held_wait(method: str, target: str) -> tuple[str, float] | None:
    """For a long-poll (a GET of the events route with ``wait=S``, 1 to ``MAX_WAIT_SECONDS``): the same request
    with ``wait=0``, and how long the server holds it (``S``, within the Lambda's deadline as the handler caps
    it). ``None`` for any other request, or a ``wait`` the route refuses (it answers its own 400)."""
    split = urlsplit(target)
    if method != "GET" or EVENTS_ROUTE.match(split.path) is None:
        return None
    pairs = parse_qsl(split.query, keep_blank_values=True)
    waits = [value for name, value in pairs if name == "wait"]
    if not waits or not (waits[-1].isascii() and waits[-1].isdigit()):
        return None
    seconds = int(waits[-1])
    if not 0 < seconds <= MAX_WAIT_SECONDS:
        return None
    query = urlencode([(name, "0" if name == "wait" else value) for name, value in pairs])
    return urlunsplit(split._replace(query=query)), min(seconds, LAMBDA_TIMEOUT_MS / 1000 - WAIT_MARGIN)


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
            self._write(refuse(411, "send the body with a Content-Length"), close=True)
            return
        lengths = self.headers.get_all("Content-Length") or []
        if len({value.strip() for value in lengths}) > 1:  # which one frames the body? (RFC 9112 6.3: an error)
            message = f"Content-Length is given {len(lengths)} times, differently: {', '.join(lengths)}"
            self._write(refuse(400, message, field="Content-Length"), close=True)
            return
        try:
            size = int(length) if length else 0
        except ValueError:
            self._write(refuse(400, f"Content-Length is a number, not {length!r}", field="Content-Length"), True)
            return
        if size < 0:
            self._write(refuse(400, f"Content-Length is >= 0, not {size}", field="Content-Length"), close=True)
            return
        if size > MAX_REQUEST_BYTES:
            self._write(refuse(413, f"the body is {size} bytes, over {MAX_REQUEST_BYTES}"), close=True)
            return
        body = self.rfile.read(size)
        if len(body) < size:  # the client went away (or the server is stopping) mid-body
            self.close_connection = True
            return
        if self.command == "GET" and _wants_stream(self.path, self.headers.get_all("Accept") or []):
            self._stream()
            return
        held = _held_wait(self.command, self.path)
        if held is not None:
            parked = self._park(*held, body)
            if parked is not None:
                self._write(parked)
            return
        reply = self.server.api.handle(
            self.command, self.path, list(self.headers.items()), body, self.client_address[0]
        )
        self._write(reply)

    def _park(self, target: str, seconds: float, body: bytes) -> Reply | None:
        """A long-poll (``GET /sessions/{id}/events?wait=S``) held here, not in a worker: this server thread asks
        the API for the page with ``wait=0`` (a worker's moment), and while it is empty and ``S`` has not passed,
        pauses (0.1 s, growing to 1 s, as the handler's own wait does) and asks again. The reply is the first
        page with events, any refusal, or the empty page at the end of the wait; ``None`` if the client went."""
        headers, client = list(self.headers.items()), self.client_address[0]
        deadline, pause = time.monotonic() + seconds, _STREAM_FIRST
        while True:
            reply = self.server.api.handle("GET", target, headers, body, client)
            if reply.status != 200 or (reply.json() or {}).get("events"):
                return reply
            left = deadline - time.monotonic()
            if left <= 0:
                return reply
            if self._client_gone(min(pause, left)):
                self.close_connection = True
                return None
            pause = min(pause * 2, _STREAM_LONGEST)

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
                self._write(refuse(400, message, field="Last-Event-ID"))
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
        self._write(refuse(code, message or explain or phrase(code)), close=True)

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

    def forget(self) -> None:
        """In a process forked from this server (a worker started later): close its copies of the listening socket
        and of every client connection, without a shutdown (the server's own stay open): a worker holding them
        would keep the port bound, and each connection open, for as long as it lives."""
        self.socket.close()
        for connection in list(self._connections):  # no lock: the fork left this process one thread
            connection.close()

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
