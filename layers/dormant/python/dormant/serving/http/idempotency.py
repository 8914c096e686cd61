"""``Idempotency-Key`` on the API's routes: which records a request's key lives in, and its answer replayed.

``POST /runs`` and ``POST /tools`` retried with the same ``Idempotency-Key`` header return the first
result without running again: Powertools idempotency (``serving.idempotency``), its records kept with the
session's (one partition per session of a tenant: a tenant's keys never meet another's), keyed on the method
and the route with its decoded id (``/sessions/i%2D1/runs`` is ``/sessions/i-1/runs``): in the session
table on DynamoDB, expiring through its TTL; in the ``idempotency`` table of a SQLite or Postgres database.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import Response

from ...app import App
from ..routes import CLIENT_PREFIX
from .request import Request
from .views import json_response

if TYPE_CHECKING:
    from ..idempotency import Idempotency

__all__ = ["idempotency_from_env", "once", "records"]


def idempotency_from_env() -> Idempotency | None:
    """``DORMANT_IDEMPOTENCY_TABLE`` (set by the stack) turns idempotency on."""
    table = os.environ.get("DORMANT_IDEMPOTENCY_TABLE")
    if not table:
        return None
    from ..idempotency import DynamoDBIdempotency  # Powertools idempotency: loaded by the first request, not import

    return DynamoDBIdempotency(table)


def records(app: App, session_id: str) -> str:
    """The partition of a session's idempotency records (ids hold no ``#``: one partition per session)."""
    return f"{app.name}#{session_id}"


def once(request: Request, tenant_app: App, session_id: str, work: Callable[[], dict[str, Any]]) -> Response[Any]:
    """``work()`` (-> ``{"status": code, "body": ...}``) once per Idempotency-Key, when one is given; the
    record is kept with the session (``records``), so it goes when the session is deleted or erased."""
    idempotency = request.api.idempotency
    event = request.event
    key = request.idempotency_key()
    if key and idempotency is not None:
        # The request as this handler understands it, not as it was spelt: the route with the decoded id (the
        # tenant is the partition's). Keyed on the raw path, /sessions/i%2D1/runs would run i-1's turn again.
        resource = event.request_context.resource_path.removeprefix(CLIENT_PREFIX)
        route = f"{event.http_method.upper()} {resource.replace('{id}', session_id)}"
        partition = records(tenant_app, session_id)
        result = idempotency.once(partition, key, route, work, request.context, request.payload())
    else:
        result = work()
    response = json_response(result["status"], result["body"])
    response.headers.update(result.get("headers") or {})
    return response
