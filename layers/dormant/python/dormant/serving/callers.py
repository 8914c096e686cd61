"""Who calls, read from the claims the Cognito authorizer verified: the tenant, the principal, the client, the
groups, the scopes; and the role the destructive routes need.

* A person's ID token: the principal is ``sub``; the tenant is the tenant claim (``DORMANT_TENANT_CLAIM``),
  else ``sub`` (a token without one is a tenant of its own); the groups are ``cognito:groups``; the client is
  ``aud``, the app client the person signed in with.
* A machine client's access token (``token_use`` ``access``, client-credentials grant): the principal and the
  client are ``client_id``; the scopes are ``scope``. Its tenant is the one the deployment maps the client to
  (``DORMANT_MACHINE_CLIENTS``, a JSON object ``{client id: tenant}``, written by the stack from
  ``-c machine_clients``; ``""``: the client is a tenant of its own, its client id). With a mapping, a client
  it does not list is refused (403): each client is in exactly the tenant it was given. Without one
  (``dormant serve``, a handler built by hand) the client is its own tenant, as before there were mappings.

The administrative role: the routes that remove data or change who may do what (``serving.routes.ADMIN_ROUTES``)
need a person to be in the group ``DORMANT_ADMIN_GROUP`` (``-c admin_group``, default ``admins``), and a machine
to hold the scope ``dormant/admin``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, NotAuthenticated, NotPermitted
from ..people import parse_groups

__all__ = [
    "ADMIN_GROUP",
    "DEFAULT_ADMIN_GROUP",
    "MACHINE_CLIENTS",
    "Identity",
    "admin_group",
    "identify",
    "log_identity",
    "machine_clients",
    "parse_clients",
]

ADMIN_GROUP = "DORMANT_ADMIN_GROUP"
DEFAULT_ADMIN_GROUP = "admins"
MACHINE_CLIENTS = "DORMANT_MACHINE_CLIENTS"


@dataclass(frozen=True)
class Identity:
    """One caller: ``scopes`` is ``None`` for a person (an ID token), the access token's scopes for a machine."""

    principal: str
    tenant: str
    client: str | None
    groups: frozenset[str]
    scopes: frozenset[str] | None


def admin_group() -> str:
    """The group whose members may delete and erase (``DORMANT_ADMIN_GROUP``, default ``admins``)."""
    return os.environ.get(ADMIN_GROUP) or DEFAULT_ADMIN_GROUP


def machine_clients() -> Mapping[str, str] | None:
    """The deployment's client id -> tenant (``""``: its own), or ``None`` when it gives none."""
    return parse_clients(os.environ.get(MACHINE_CLIENTS) or "")


@functools.cache
def parse_clients(raw: str) -> Mapping[str, str] | None:
    """``DORMANT_MACHINE_CLIENTS`` read once per value (cached: not per request); the CLI checks
    ``--machine-clients`` with it, so serve refuses what the deployed handlers would."""
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ConfigurationError(f"{MACHINE_CLIENTS} is a JSON object of client id -> tenant, not {raw[:80]!r}")
    return dict(parsed)


def identify(claims: Mapping[str, Any], tenant_claim: str, clients: Mapping[str, str] | None) -> Identity:
    """The caller the claims name; ``NotAuthenticated`` without a ``sub``, ``NotPermitted`` for a machine client
    the deployment's mapping does not list."""
    sub = claims.get("sub")
    if not sub:
        raise NotAuthenticated("no authenticated caller (the authorizer gave no sub claim)")
    if claims.get("token_use") != "access":
        tenant = str(claims.get(tenant_claim) or sub)
        aud = claims.get("aud")
        return Identity(str(sub), tenant, str(aud) if aud else None, parse_groups(claims.get("cognito:groups")), None)
    client = str(claims.get("client_id") or sub)
    scopes = frozenset(str(claims.get("scope") or "").split())
    if clients is None:
        return Identity(client, client, client, frozenset(), scopes)
    mapped = clients.get(client)
    if mapped is None:
        raise NotPermitted(
            f"machine client {client!r} is not one of this deployment's (-c machine_clients)", rule="machine_clients"
        )
    return Identity(client, mapped or client, client, frozenset(), scopes)


def log_identity(claims: Mapping[str, Any], tenant_claim: str, clients: Mapping[str, str] | None) -> dict[str, Any]:
    """The keys a request's log lines carry: ``tenant``, ``principal``, ``client`` (``None`` where unknown); it
    never raises, so a refused caller's lines still say who it was."""
    try:
        who = identify(claims, tenant_claim, clients)
    except (NotAuthenticated, NotPermitted):
        client = claims.get("client_id") or claims.get("aud")
        return {"tenant": None, "principal": claims.get("client_id") or claims.get("sub"), "client": client}
    return {"tenant": who.tenant, "principal": who.principal, "client": who.client}
