"""API Gateway as ``dormant serve`` plays it: the proxy event (REST API, v1) a request becomes, the Lambda
context the handler reads, and the handler's response written back as API Gateway would write it.

The caller goes in ``requestContext.authorizer.claims`` (``sub``, the tenant claim, ``cognito:groups``; for a
machine client ``client_id`` and ``scope``), where the Cognito authorizer puts it, and is refused as the
authorizer refuses it (``unauthorized``). Refusals made before a handler is reached are the API's JSON errors.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from ..routes import CLIENT_PREFIX, scope_of
from ..runtime import tenant_claim

__all__ = [
    "EVENTS_ROUTE",
    "LAMBDA_TIMEOUT_MS",
    "LambdaContext",
    "Reply",
    "Route",
    "compile_route",
    "not_allowed",
    "phrase",
    "proxy_event",
    "refuse",
    "to_reply",
    "unauthorized",
]

LAMBDA_TIMEOUT_MS = 29_000  # API Gateway's integration timeout


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
        return cls(status, json.dumps(payload, separators=(",", ":")).encode(), {"Content-Type": "application/json"})


@dataclass(frozen=True)
class Route:
    method: str
    resource: str
    pattern: re.Pattern[str]
    function: str


def compile_route(resource: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", resource)
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(f"^{regex}$")


EVENTS_ROUTE = compile_route("/sessions/{id}/events")


@dataclass
class LambdaContext:
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
    client: str | None = None,
    scopes: Sequence[str] = (),
) -> dict[str, Any]:
    """The API Gateway proxy event (REST API, v1) for one request, as the Cognito authorizer passes it on: an
    ID token's claims, ``sub`` the principal, the tenant claim when there is a ``tenant``, ``cognito:groups``
    as the authorizer writes a list (comma-joined) when there are ``groups``; with a ``client``, a machine
    client's access token instead (``sub`` and ``client_id`` the client, ``scope`` the ``scopes``).

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
            "authorizer": {"claims": _claims(principal, tenant, groups, client, scopes)},
        },
        "body": text if body else None,
        "isBase64Encoded": encoded,
    }


def _claims(
    principal: str, tenant: str | None, groups: Sequence[str], client: str | None, scopes: Sequence[str]
) -> dict[str, str]:
    if client is not None:  # the client-credentials grant's access token: no person, no tenant claim, no groups
        return {"sub": client, "client_id": client, "token_use": "access", "scope": " ".join(scopes)}
    claims = {"sub": principal, "cognito:username": principal, "token_use": "id"}
    if tenant:
        claims[tenant_claim()] = tenant
    if groups:
        claims["cognito:groups"] = ",".join(groups)
    return claims


def unauthorized(method: str, resource: str, client: str | None, scopes: Sequence[str]) -> Reply | None:
    """The Cognito authorizer's 401, or ``None`` when it lets the token through: a method under ``/clients`` takes
    only an access token holding the route's scope, any other method only an ID token (``infra.api``)."""
    base = resource.removeprefix(CLIENT_PREFIX)
    if base == resource:  # a person's method
        if client is None:
            return None
        why = f"{resource} takes a person's ID token, not a machine client's: call {CLIENT_PREFIX}{resource}"
    else:
        needed = scope_of(method, base)
        if client is not None and needed in scopes:
            return None
        why = f"{resource} takes a machine client's access token with the scope {needed}"
    # API Gateway's own refusal, in the shape of the stack's gateway response (infra.api.ERROR_TEMPLATE)
    return Reply.of_json(401, {"error": "UNAUTHORIZED", "message": f"Unauthorized (dormant serve: {why})"})


def to_reply(response: Mapping[str, Any]) -> Reply:
    headers: dict[str, str] = dict(response.get("headers") or {})
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name] = ", ".join(values)
    raw = response.get("body") or ""
    body = base64.b64decode(raw) if response.get("isBase64Encoded") else raw.encode()
    return Reply(int(response["statusCode"]), body, headers)


def not_allowed(method: str, path: str, allowed: str) -> Reply:
    """A 405 for a method the path does not take (any method: TRACE, PATCH, a made-up token), naming those it does."""
    message = f"{method} {path}: use {allowed}"
    return Reply(
        405,
        json.dumps({"error": "MethodNotAllowed", "message": message}, separators=(",", ":")).encode(),
        {
            "Content-Type": "application/json",
            "Allow": allowed,
        },
    )


def refuse(status: int, message: str, field: str | None = None) -> Reply:
    kinds = {
        400: "InputError",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        500: "InternalError",
        503: "ServiceUnavailable",
    }
    kind = kinds.get(status) or phrase(status).replace(" ", "").replace("-", "")
    payload = {"error": kind, "message": message, **({"field": field} if field else {})}
    return Reply.of_json(status, payload)


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
