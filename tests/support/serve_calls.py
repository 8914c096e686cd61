"""Calls to a served API over real sockets (urllib), as the ``dormant serve`` tests make them."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.support.bookings_cli import REQUEST

__all__ = ["REQUEST", "TIMEOUT", "call", "eventually"]

TIMEOUT = 60


def call(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    raw: bytes | None = None,
    principal: str | None = None,
    extra: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(extra or {})}
    if method == "POST" and url.endswith("/runs") and "Prefer" not in headers:
        headers["Prefer"] = "wait=25"  # these tests read the turn's result; a turn runs after a 202 otherwise
    headers = {name: value for name, value in headers.items() if value}
    if principal is not None:
        headers["X-Dormant-Principal"] = principal
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    return status, json.loads(text) if text else None


def eventually(check: Callable[[], Any], timeout: float = 30) -> Any:
    """``check()``'s first truthy value, asked again every 20 ms for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.02)
    return value
