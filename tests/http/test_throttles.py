"""A throttle over HTTP is a 429 with ``Retry-After``, as API Gateway's own throttles are, never a 5xx: a client
that waits out a 429 then comes back, where a 503 or a 500 says nothing of when. Here DynamoDB Local's answers are
throttles (a botocore event hook) past the client's retries, deterministically."""

from __future__ import annotations

import copy
import json
import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
pytest.importorskip("boto3")

from dormant.serving.api import api_handler
from dormant.serving.runtime import load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.dynamodb import DynamoDBSessionStore
from tests.support.dynamodb_faults import Faults
from tests.support.lambda_events import TENANT_A, Client, LambdaContext, create, load_event
from tests.support.servers.dynamodb import client as local_client

pytestmark = pytest.mark.backend("dynamodb")


def _answer(handler: Any, name: str, session_id: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, body) of one request, as API Gateway's proxy integration passes the handler's answer on."""
    event = copy.deepcopy(load_event(f"api/{name}.json"))
    event["headers"].pop("Idempotency-Key", None)
    event["pathParameters"] = {"id": session_id}
    event["path"] = event["resource"].replace("{id}", session_id)
    event["requestContext"]["authorizer"]["claims"]["sub"] = TENANT_A
    if body is not None:
        event["body"] = json.dumps(body)
    response = handler(event, LambdaContext())
    headers = {**(response.get("headers") or {})}
    headers.update({k: ",".join(v) for k, v in (response.get("multiValueHeaders") or {}).items()})
    return response["statusCode"], headers, json.loads(response.get("body") or "null")


@pytest.mark.parametrize("operation", ["Query", "UpdateItem"])
def test_a_table_throttled_past_the_retries_is_a_429_with_retry_after(
    dynamodb_endpoint: str, dynamodb_table: str, operation: str
) -> None:
    """The session's read (a ``Query``) or a turn's claim (its commit's gate, an ``UpdateItem``) throttled on every
    attempt botocore makes: 429 ``StoreThrottled`` with ``Retry-After``, nothing run; once the throttle passes, the
    same request is taken."""
    store = DynamoDBSessionStore(
        local_client(dynamodb_endpoint, retries={"mode": "standard", "max_attempts": 2}),
        dynamodb_table,
        single_call_items=0,  # every commit through its gate
    )
    served = load_served("bookings:build", store)
    handler = api_handler(in_process_hooks(served), served)
    sid = f"s-{uuid.uuid4().hex[:8]}"
    create(Client(handler), sid)
    name, body = ("get_session", None) if operation == "Query" else ("run", {"message": "hello"})
    Faults(store._client).throttle(operation, 3)  # every attempt of the next call: its first and botocore's 2 retries
    status, headers, answer = _answer(handler, name, sid, body)
    assert (status, answer["error"]) == (429, "StoreThrottled"), (status, answer)
    assert headers.get("Retry-After") == "1", headers
    assert served.for_tenant(TENANT_A).sessions.require(sid).version == 1  # the claim did not land: nothing ran
    status, _, answer = _answer(handler, name, sid, body)
    assert status in (200, 202), (status, answer)


def test_an_idempotency_record_throttled_past_the_retries_is_store_throttled() -> None:
    """Powertools wraps a throttled record's ``ClientError`` in its persistence error: the request is refused as
    the table's throttle (429), not as a store fault (500), and ``work`` never ran."""
    from botocore.exceptions import ClientError

    from dormant.errors import StoreThrottled, http_status
    from dormant.serving.idempotency import MemoryIdempotency, MemoryPersistenceLayer

    class Throttled(MemoryPersistenceLayer):
        def _put_record(self, data_record: Any) -> None:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "PutItem")

    class ThrottledRecords(MemoryIdempotency):
        def layer(self, partition: str) -> Any:
            return Throttled({}, threading.Lock(), partition)

    ran: list[bool] = []

    def work() -> dict[str, Any]:
        ran.append(True)
        return {}

    with pytest.raises(StoreThrottled) as info:
        ThrottledRecords().once("p", "key-1", "POST /sessions/s-1/runs", work, LambdaContext())
    assert http_status(info.value) == 429 and not ran
