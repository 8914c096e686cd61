"""A scripted HTTP server on 127.0.0.1, standing in for a model provider in tests.

It answers each POST with the next scripted reply (status, JSON body, headers, an optional delay) and
records every request it got, so a test can assert what the provider *received* — the bytes a real
SDK put on the wire, retries included. Used for the OpenAI Chat Completions API and, as an
``endpoint_url``, for Bedrock's Converse REST API when botocore's own retry handler must run.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body`` is JSON-encoded unless it is ``bytes``."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class FakeModelServer:
    """``script([...])`` the replies, point a client at ``url``, then read ``requests``."""

    def __init__(self) -> None:
        self._script: deque[Reply] = deque()
        self._fallback: Callable[[Received], Reply] | None = None
        self._lock = threading.Lock()
        self.requests: list[Received] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                received = Received(
                    method="POST",
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    raw=self.rfile.read(length),
                )
                reply = server._next(received)
                if reply.delay:
                    time.sleep(reply.delay)
                payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    headers = {"content-type": "application/json", **reply.headers}
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, replies: list[Reply]) -> None:
        with self._lock:
            self._script = deque(replies)

    def always(self, reply: Reply | Callable[[Received], Reply]) -> None:
        """Answer every request past the script with ``reply``."""
        self._fallback = reply if callable(reply) else (lambda _received: reply)

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._script:
                return self._script.popleft()
        if self._fallback is not None:
            return self._fallback(received)
        # Not retryable, so a test that under-scripts fails fast and says why.
        return Reply(400, {"error": {"message": "fake server: no scripted reply"}}, headers={"x-should-retry": "false"})

    def start(self) -> FakeModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@contextmanager
def running() -> Iterator[FakeModelServer]:
    server = FakeModelServer().start()
    try:
        yield server
    finally:
        server.stop()
