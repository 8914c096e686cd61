"""API Gateway and Step Functions events for the handlers, built from the samples in ``events/``."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS = Path(__file__).resolve().parents[2] / "events"
TENANT_A = "tenant-a"
TENANT_B = "tenant-b"


@dataclass
class LambdaContext:
    function_name: str = "dormant-test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:eu-west-1:123456789012:function:dormant-test"
    aws_request_id: str = "req-test"

    def get_remaining_time_in_millis(self) -> int:
        return 29_000


def load_event(path: str) -> dict[str, Any]:
    return json.loads((EVENTS / path).read_text())  # type: ignore[no-any-return]


class Client:
    def __init__(self, handler: Callable[[dict[str, Any], Any], Any]) -> None:
        self.handler = handler
        self.headers: dict[str, str] = {}
        """The last answer's headers."""

    def call(
        self,
        name: str,
        *,
        tenant: str | None = TENANT_A,
        session_id: str | None = None,
        body: Any = ...,
        raw_body: str | None = None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        event = copy.deepcopy(load_event(f"api/{name}.json"))
        event["headers"].pop("Idempotency-Key", None)
        if name == "run" and not any(h.lower() == "prefer" for h in headers or {}):
            # The turn runs outside the request (a 202); these tests read its result, as a client that can wait
            # says so. Tests of the 202 itself send their own Prefer (or none: headers={"Prefer": ""}).
            event["headers"]["Prefer"] = "wait=25"
        event["headers"].update({k: v for k, v in (headers or {}).items() if v != ""})
        if session_id is not None:
            event["pathParameters"] = {"id": session_id}
            event["path"] = event["resource"].replace("{id}", session_id)
        if tenant is None:
            event["requestContext"].pop("authorizer")
        else:
            event["requestContext"]["authorizer"]["claims"]["sub"] = tenant
        if body is not ...:
            event["body"] = json.dumps(body)
        if raw_body is not None:
            event["body"] = raw_body
        if query is not None:
            event["queryStringParameters"] = query
            event["multiValueQueryStringParameters"] = {k: [v] for k, v in query.items()}
        response = self.handler(event, LambdaContext())
        multi = response.get("multiValueHeaders") or {}  # the REST resolver's, as API Gateway passes them on
        self.headers = {**(response.get("headers") or {}), **{k: v[-1] for k, v in multi.items() if v}}
        text = response.get("body") or ""
        return response["statusCode"], json.loads(text) if text else None


def create(client: Client, session_id: str = "s-1", tenant: str = TENANT_A) -> dict[str, Any]:
    status, body = client.call(
        "create_session", tenant=tenant, body={"session_id": session_id, "scopes": {"user": "alex-doe"}}
    )
    assert status == 201, body
    return body  # type: ignore[no-any-return]
