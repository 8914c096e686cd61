"""What the fidelity tests do through a ``Deployment``'s API, as a client would: create, run, answer, read
the ledger; each failed step's message carries the deployment's evidence (function errors, denied calls)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

from dormant.stores.dynamodb.calls import CLIENT_RETRIES

STORE_RESENDS = CLIENT_RETRIES
"""A transaction DynamoDB cancels for throttling is re-sent by the deployed store as often as its client retries a
throttled call: a throttle that outlasts them meets the first call and every re-send."""
TENANT = "tenant-a"
APP_PACKAGE = "tests/support/fidelity/fidelity_app"


@contextlib.contextmanager
def fidelity_stack(dynamodb_endpoint: str, **options: Any) -> Iterator[Any]:
    """The stack with the fidelity app (``Deployment.start``'s ``options``: context, timeouts, capacity...), closed
    on the way out; skipped without the extras the harness needs."""
    import pytest

    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    from .deployment import Deployment

    started = Deployment.start(
        dynamodb_endpoint=dynamodb_endpoint, app="fidelity_app:build", app_packages=[APP_PACKAGE], **options
    )
    try:
        yield started
    finally:
        started.close()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def evidence(d: Any) -> str:
    """What went wrong inside the deployment: function errors and denied calls (the assertion message)."""
    denied = sorted({(c.function, c.action, c.resource.rsplit(":", 1)[-1]) for c in d.denied()})
    return f"function errors: {d.errors()[-6:]}; denied calls: {denied}"


def create(d: Any, sid: str, scopes: dict[str, str] | None = None, tenant: str = TENANT) -> None:
    status, _, body = d.api("POST", "/sessions", {"session_id": sid, "scopes": scopes or {}}, tenant=tenant)
    assert status == 201, (status, body, evidence(d))


def show(d: Any, sid: str, tenant: str = TENANT) -> dict[str, Any]:
    status, _, body = d.api("GET", f"/sessions/{sid}", tenant=tenant)
    assert status == 200, (status, body, evidence(d))
    return body  # type: ignore[no-any-return]


def ledger(d: Any, sid: str, tenant: str = TENANT) -> list[dict[str, Any]]:
    status, _, body = d.api("GET", f"/sessions/{sid}/events", tenant=tenant, query={"limit": "1000"})
    assert status == 200, (status, body, evidence(d))
    return body["events"]  # type: ignore[no-any-return]


def run(d: Any, sid: str, message: str, tenant: str = TENANT, settle: float = 180) -> dict[str, Any]:
    """``POST /runs`` (200 today, 202 in the target contract), then the session once the workflow settled."""
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": message}, tenant=tenant)
    assert status in (200, 202), (status, body, evidence(d))
    d.settle(settle)
    return show(d, sid, tenant)


def answer(d: Any, sid: str, shown: dict[str, Any], tenant: str = TENANT) -> dict[str, Any]:
    (call,) = shown["yielded_tools"]
    body = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, _, answered = d.api("POST", f"/sessions/{sid}/tools", body, tenant=tenant)
    assert status == 202, (status, answered, evidence(d))
    d.settle()
    return show(d, sid, tenant)


def invocations(d: Any, function: str) -> int:
    """How many times ``function`` was invoked so far."""
    return sum(1 for i in d.lambdas.invocations if i.function == function)


def event_types(d: Any, sid: str, tenant: str = TENANT) -> list[str]:
    """The types of the session's events, in order."""
    return [e["type"] for e in ledger(d, sid, tenant)]


def until(condition: Any, what: str, d: Any, timeout: float = 60) -> None:
    """Wait for ``condition()``, failing with the deployment's evidence after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; {evidence(d)}")
        time.sleep(0.05)
