"""``dormant serve``: the HTTP API on this machine, through the same handler code that runs on Lambda.

By job: ``gateway`` (the proxy event API Gateway would send, its answer written back), ``guard`` (loopback
clients only, no other site's page, the caller from development headers), ``pages`` (``LocalAPI``: API
routes to the Lambda handler, other paths to the pages), ``workers`` (forked processes, one request at a
time each, as Lambda instances) and ``server`` (``LocalServer``: HTTP on a socket, server-sent events).
"""

from __future__ import annotations

from .gateway import Reply, proxy_event
from .guard import CLIENT_HEADER, GROUPS_HEADER, PRINCIPAL_HEADER, SCOPES_HEADER, TENANT_HEADER, is_loopback
from .pages import LocalAPI, Page, PageRequest
from .server import HEARTBEAT_SECONDS, MAX_REQUEST_BYTES, REQUEST_BACKLOG, Handler, LocalServer
from .workers import Workers, can_fork

__all__ = [
    "CLIENT_HEADER",
    "GROUPS_HEADER",
    "HEARTBEAT_SECONDS",
    "MAX_REQUEST_BYTES",
    "PRINCIPAL_HEADER",
    "REQUEST_BACKLOG",
    "SCOPES_HEADER",
    "TENANT_HEADER",
    "Handler",
    "LocalAPI",
    "LocalServer",
    "Page",
    "PageRequest",
    "Reply",
    "Workers",
    "can_fork",
    "is_loopback",
    "proxy_event",
]
