"""The machine clients of ``-c machine_clients``: who they are, which scopes each may ask for, which tenant each
acts in; and the environment variable that tells the API's functions the tenants.

Two forms of the context value:

* ``billing,crm`` (names): each client gets every scope and is a tenant of its own (the form before scopes and
  tenants could be given; it still works).
* JSON, name -> ``{"scopes": [...], "tenant": ...}``: ``scopes`` of ``sessions.read``, ``runs.write``,
  ``answers.write``, ``admin`` (``dormant/`` may be written before them; default: ``sessions.read`` alone);
  ``tenant`` ``"own"`` (the default: the client is its own tenant, its client id) or a tenant id: a clinic's
  ``custom:tenant`` value, or a person's ``sub`` for a person with no tenant claim. For example
  ``{"billing": {"scopes": ["sessions.read"]}, "intake": {"scopes": ["sessions.read", "runs.write"],
  "tenant": "clinic-7"}}``.

Each client is an app client of the user pool of its own (client-credentials grant, a secret), allowed only its
scopes: Cognito refuses a token asking for any other (``invalid_scope``). The handlers read the client id ->
tenant mapping from ``DORMANT_MACHINE_CLIENTS`` (``dormant.serving.callers``) and refuse a client it does not list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Fn

from dormant.errors import InputError
from dormant.ids import check_name
from dormant.serving.routes import SCOPES

OWN = "own"
"""The tenant of a client that acts for itself: its client id."""
DEFAULT_SCOPES = ("sessions.read",)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CLIENT_ID_LENGTH = 26
"""The length of a Cognito app client id: what the environment's size is reckoned with at synth."""
MAX_MAPPING_BYTES = 2048
"""What ``DORMANT_MACHINE_CLIENTS`` may take of a function's 4 KB environment (the rest is the other variables')."""
_SHORT = {scope.split("/", 1)[1]: scope for scope in SCOPES.values()}


@dataclass(frozen=True)
class MachineClient:
    name: str
    scopes: tuple[str, ...]
    """Full scope names (``dormant/sessions.read``)."""
    tenant: str | None
    """``None``: its own tenant (its client id)."""


def parse_machine_clients(value: object) -> tuple[MachineClient, ...]:
    """``-c machine_clients`` (either form; in ``cdk.json`` also an object or a list of names), or a ``ValueError``
    naming what is wrong."""
    if isinstance(value, dict | list):  # context from cdk.json arrives parsed
        value = json.dumps(value) if isinstance(value, dict) else ",".join(str(name) for name in value)
    text = str(value or "").strip()
    if not text:
        return ()
    if text.startswith("{"):
        try:
            given = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"-c machine_clients= is JSON or name,name: {exc}") from None
        if not isinstance(given, dict):
            raise ValueError("-c machine_clients= JSON is an object: name -> {scopes, tenant}")
        clients = tuple(_client(name, spec) for name, spec in given.items())
    else:
        names = [name.strip() for name in text.split(",") if name.strip()]
        clients = tuple(MachineClient(_name(name), tuple(SCOPES.values()), None) for name in names)
    squashed = [re.sub(r"[_-]", "", c.name).lower() for c in clients]
    if len(set(squashed)) != len(squashed):
        raise ValueError(f"-c machine_clients= names must differ in more than case, '-' and '_': {squashed}")
    return clients


def _name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"-c machine_clients=: a client's name is letters, digits, '-' and '_', not {name!r}")
    return name


def _client(name: str, spec: object) -> MachineClient:
    _name(name)
    if not isinstance(spec, dict) or set(spec) - {"scopes", "tenant"}:
        raise ValueError(f"-c machine_clients=: {name} is {{'scopes': [...], 'tenant': ...}}, not {spec!r}")
    scopes = spec.get("scopes", list(DEFAULT_SCOPES))
    if not isinstance(scopes, list) or not scopes:
        raise ValueError(f"-c machine_clients=: {name}'s scopes are a list of at least one of {sorted(_SHORT)}")
    full = []
    for scope in scopes:
        short = scope.removeprefix("dormant/") if isinstance(scope, str) else scope
        if short not in _SHORT:
            raise ValueError(f"-c machine_clients=: {name}'s scope {scope!r} is not one of {sorted(_SHORT)}")
        full.append(_SHORT[short])
    tenant = spec.get("tenant", OWN)
    if tenant != OWN:
        try:
            check_name(tenant, "tenant", "tenant")
        except InputError as exc:
            raise ValueError(f"-c machine_clients=: {name}'s tenant: {exc}") from None
    return MachineClient(name, tuple(dict.fromkeys(full)), None if tenant == OWN else str(tenant))


def mapping_environment(client_ids: Mapping[str, tuple[str, str | None]]) -> str:
    """``DORMANT_MACHINE_CLIENTS``: ``{client id: tenant}`` (``""``: its own) as a CloudFormation string, from
    client name -> (its id, a token until deployed; its tenant). ``ValueError`` when it would take more than
    ``MAX_MAPPING_BYTES`` of the functions' environment."""
    entries = sorted(client_ids.items())
    reckoned = 2 + sum(len(json.dumps({"x" * CLIENT_ID_LENGTH: tenant or ""})) - 1 for _, (_, tenant) in entries)
    if reckoned > MAX_MAPPING_BYTES:
        raise ValueError(
            f"-c machine_clients=: the client -> tenant mapping takes about {reckoned} bytes of the functions' 4 KB "
            f"environment (at most {MAX_MAPPING_BYTES}): fewer clients, or shorter tenant ids"
        )
    parts: list[str] = ["{"]
    for index, (_, (client_id, tenant)) in enumerate(entries):
        parts += [("," if index else "") + '"', client_id, '":' + json.dumps(tenant or "")]
    parts.append("}")
    return Fn.join("", parts)
