"""The session inspector: a web page over the HTTP API, served by ``dormant serve`` at ``/``.

The page is static (HTML, CSS and JavaScript modules in ``static/``, shipped with the package: no CDN,
no build step) and reads and acts only through the API routes, so a tenant sees and does in the page
exactly what it could over curl. Every page URL answers the same document, which routes on the path
(``/inspect/sessions/{id}``, ``?at=`` for time travel): a link to any view can be shared.

The page shows who it acts as (``GET /inspect/me``: ``dormant serve``'s caller, its principal, tenant and
groups) and offers no answer form for a call the API would refuse this caller (``answerable`` is false in
the session's ``yielded_tools``); the API refuses it anyway (403), as over curl.

A session that is ``running`` is followed live: the page opens ``dormant serve``'s event stream
(``GET /sessions/{id}/events`` as ``text/event-stream``) and appends each step as the turn commits it.

The page renders data only as text (``textContent``), and is served with a Content-Security-Policy
that runs no inline script, so HTML in a message or a state value is shown, never run.

It is left out of the Lambda layer (``infra.bundle``): nothing on Lambda serves it.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import NamedTuple

from ..serving.local import PageRequest, Reply

__all__ = ["ASSET_PREFIX", "ME_PATH", "Asset", "asset", "page"]

ASSET_PREFIX = "/inspect/assets/"
ME_PATH = "/inspect/me"
"""Who the page acts as, as JSON: ``{"principal", "tenant", "groups"}``."""
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class Asset(NamedTuple):
    """What to answer for a page path: the file's bytes and the response headers."""

    body: bytes
    headers: dict[str, str]


def asset(path: str) -> Asset | None:
    """The inspector's answer for a GET of ``path`` (``None``: not one of its paths).

    ``/`` and every ``/inspect`` path are the page; ``/inspect/assets/<name>`` its scripts and styles.
    """
    if path.startswith(ASSET_PREFIX):
        name = path[len(ASSET_PREFIX) :]
    elif path in {"/", "/inspect"} or path.startswith("/inspect/"):
        name = "index.html"
    else:
        return None
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in _TYPES:
        return None
    resource = files(__package__).joinpath("static", name)
    if not resource.is_file():
        return None
    return Asset(resource.read_bytes(), {"Content-Type": _TYPES[suffix], **_HEADERS})


def page(request: PageRequest) -> Reply | None:
    """``dormant serve``'s page for the inspector: its paths on GET and HEAD, anything else passed on."""
    if request.method not in {"GET", "HEAD"}:
        return None
    if request.path == ME_PATH:
        me = {"principal": request.principal, "tenant": request.tenant, "groups": list(request.groups)}
        return Reply(200, json.dumps(me).encode(), {"Content-Type": "application/json", **_HEADERS})
    found = asset(request.path)
    return None if found is None else Reply(200, found.body, found.headers)
