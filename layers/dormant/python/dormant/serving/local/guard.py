"""Who may call ``dormant serve``, and as whom: loopback clients only, no other site's page, the caller
named by development headers.

Identity is a development stand-in for the authorizer: the ``X-Dormant-Principal`` header (the token's ``sub``),
``X-Dormant-Tenant`` (its tenant claim, ``DORMANT_TENANT_CLAIM``) and ``X-Dormant-Groups`` (a comma list: its
``cognito:groups``); a machine client's access token is ``X-Dormant-Client`` (its ``client_id``) and
``X-Dormant-Scopes`` (its ``scope``, space-separated), instead of the three. Nothing here authenticates anyone, so
only loopback clients are served: any other gets a 403. A loopback client may be a browser running another site's
script, so a request a browser marks as cross-site (``Origin`` not this server, ``Sec-Fetch-Site: cross-site``) or
one whose ``Host`` is not a loopback name (DNS rebinding) gets a 403 too, before it reaches a handler. The pages of
the origins given as ``cors_origins`` (``dormant serve --cors-origin``) are let through.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = [
    "CLIENT_HEADER",
    "GROUPS_HEADER",
    "IDENTITY_HEADERS",
    "PRINCIPAL_HEADER",
    "SCOPES_HEADER",
    "TENANT_HEADER",
    "cross_site",
    "is_loopback",
]

PRINCIPAL_HEADER = "X-Dormant-Principal"
TENANT_HEADER = "X-Dormant-Tenant"
GROUPS_HEADER = "X-Dormant-Groups"
CLIENT_HEADER = "X-Dormant-Client"
SCOPES_HEADER = "X-Dormant-Scopes"
IDENTITY_HEADERS = frozenset(
    h.lower() for h in (PRINCIPAL_HEADER, TENANT_HEADER, GROUPS_HEADER, CLIENT_HEADER, SCOPES_HEADER)
)


def is_loopback(address: str) -> bool:
    """Whether a client address is this machine's loopback (IPv4, IPv6, or IPv4 mapped into IPv6)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def cross_site(headers: Sequence[tuple[str, str]], allowed: frozenset[str] = frozenset()) -> str | None:
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
