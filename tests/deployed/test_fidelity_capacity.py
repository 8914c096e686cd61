"""The harness's capacity pieces (``tests/support/fidelity/capacity.py``), each held to AWS's behaviour on its own:
token buckets, Lambda's concurrency caps, Step Functions' API throttles, and DynamoDB's partitions metered from the
calls a sandbox makes (a throttled partition answers as DynamoDB does; another partition is not slowed)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.units import Table, partition_units
from dormant.stores.dynamodb.table import LISTING_INDEX, TABLE
from tests.support.fidelity.capacity import Accountant, Capacity, TokenBucket
from tests.support.fidelity.stepfunctions import ApiError, StepFunctions

ROOT = Path(__file__).resolve().parents[2]
ARN = "arn:aws:lambda:eu-west-1:123456789012:function:Dormant-Probe"

_HANDLER = """
import os, time
import botocore.session
from botocore.config import Config

def handler(event, context):
    if event["kind"] == "sleep":
        time.sleep(event["seconds"])
        return {"slept": True}
    client = botocore.session.get_session().create_client(
        "dynamodb", config=Config(retries={"mode": "standard", "max_attempts": event.get("attempts", 3)})
    )
    done = 0
    try:
        for i in range(event["puts"]):
            item = {"pk": {"S": event["pk"]}, "sk": {"S": f"i{i}"}, "body": {"S": "x" * 900}}
            client.put_item(TableName=event["table"], Item=item)
            done += 1
    except client.exceptions.ClientError as exc:
        return {"done": done, "error": exc.response["Error"]["Code"], "reasons": exc.response.get("ThrottlingReasons")}
    return {"done": done, "error": None}
"""


def test_a_token_bucket_refills_at_its_rate_and_a_charge_leaves_a_debt() -> None:
    bucket = TokenBucket(2, 20)
    assert bucket.take() and bucket.take() and not bucket.take()  # two in the bucket, then empty
    time.sleep(0.06)
    assert bucket.take()  # refilled at 20 a second
    debt = TokenBucket(1, 10)
    debt.charge(3)  # billed after the call: 2 in debt
    assert not debt.open()
    time.sleep(0.3)
    assert debt.open()  # paid off at 10 a second


def test_step_functions_throttles_an_api_action_past_its_bucket() -> None:
    sfn = StepFunctions(lambda *_: (True, {}))
    sfn.accountant = Accountant(Capacity(sfn_buckets={"DescribeExecution": (2, 0.001)}))
    arn = "arn:aws:states:eu-west-1:123456789012:execution:M:none"
    for _ in range(2):
        with pytest.raises(ApiError) as found:
            sfn.dispatch("DescribeExecution", {"executionArn": arn})
        assert found.value.code == "ExecutionDoesNotExist"  # admitted: the API answered
    with pytest.raises(ApiError) as throttled:
        sfn.dispatch("DescribeExecution", {"executionArn": arn})
    assert throttled.value.code == "ThrottlingException"
    assert sfn.accountant.throttles[("states", "DescribeExecution")] == 1


def test_partition_units_bill_each_partition_key_and_a_moved_index_entry_on_both() -> None:
    table = Table.described(TABLE.create_table_request("t"))
    touch = {"pk": {"S": "S#a#1"}, "sk": {"S": "touch"}, "lpk": {"S": "app#0"}, "lsk": {"S": "1"}}
    put = {"operation": "PutItem", "params": {"TableName": "t"}, "images": [[None, touch]], "error": None}
    assert partition_units(put, {"t": table}) == {
        ("t", "S#a#1", "write"): 1,
        (f"t/{LISTING_INDEX}", "app#0", "write"): 1,
    }
    moved = {**touch, "lpk": {"S": "app#1"}}
    update = {"operation": "UpdateItem", "params": {"TableName": "t"}, "images": [[touch, moved]], "error": None}
    units = partition_units(update, {"t": table})
    assert units[(f"t/{LISTING_INDEX}", "app#0", "write")] == 1  # the delete, on the old key's partition
    assert units[(f"t/{LISTING_INDEX}", "app#1", "write")] == 1  # the put, on the new one's
    query = {
        "operation": "Query",
        "params": {
            "TableName": "t",
            "IndexName": LISTING_INDEX,
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": "lpk"},
            "ExpressionAttributeValues": {":p": {"S": "app#1"}},
        },
        "items": [moved],
        "error": None,
    }
    assert partition_units(query, {"t": table}) == {(f"t/{LISTING_INDEX}", "app#1", "read"): 0.5}


@pytest.fixture
def metered(tmp_path: Path, dynamodb_endpoint: str) -> Iterator[tuple[Any, Accountant, str]]:
    """A probe function whose DynamoDB calls are metered by an accountant with 3 write units a second a partition."""
    import boto3

    from tests.support.fidelity.lambda_ import Concurrency, LambdaService
    from tests.support.fidelity.template import REGION, Function
    from tests.support.servers.dynamodb import ACCESS_KEY

    name = f"metered-{uuid.uuid4().hex[:8]}"
    request = TABLE.create_table_request(name)
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=ACCESS_KEY,
    )
    ddb.create_table(**request)
    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text(_HANDLER)
    table_arn = f"arn:aws:dynamodb:eu-west-1:123456789012:table/{name}"
    function = Function(
        name="probe",
        logical_id="Probe",
        function_name="Dormant-Probe",
        arn=ARN,
        handler="app.handler",
        timeout=60,
        memory=256,
        environment={},
        code_dir=code,
        layers=[],
        role="ProbeRole",
        statements=[{"Effect": "Allow", "Action": ["dynamodb:PutItem"], "Resource": [table_arn]}],
    )
    accountant = Accountant(Capacity(partition_write_units=3))
    config = {
        "capacity_url": accountant.serve(),
        "units_file": str(ROOT / "bench" / "units.py"),
        "tables": [request],
    }
    service = LambdaService(
        {"probe": function},
        {},
        {"AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint},
        tmp_path,
        concurrency=Concurrency({"probe": 1}, 0, accountant),
        capacity_config=config,
    )
    try:
        yield service, accountant, name
    finally:
        service.close()
        accountant.close()
        ddb.delete_table(TableName=name)


@pytest.mark.backend("dynamodb")
def test_a_hot_partition_is_throttled_as_dynamodb_throttles_and_another_is_not(metered: Any) -> None:
    service, accountant, table = metered
    # the partition is 2 units past its rate (3 a second): the put is throttled until it is paid off, and botocore's
    # retries carry it through
    assert service.invoke("probe", {"kind": "sleep", "seconds": 0}).ok  # warm: no cold start pays the debt off
    accountant.charge({(table, "hot", "write"): 12})
    done = service.invoke("probe", {"kind": "put", "table": table, "pk": "hot", "puts": 1, "attempts": 10})
    assert done.ok and done.payload == {"done": 1, "error": None}, done.payload
    assert accountant.throttles[("Dormant-Probe", f"{table}:write")] > 0
    assert accountant.units[(table, "hot", "write")] == 13  # the put billed 1 unit (900 bytes) on its partition
    # with no retry, the throttle reaches the caller as DynamoDB's own error, naming the partition's key range
    accountant.charge({(table, "hot", "write"): 1000})
    refused = service.invoke("probe", {"kind": "put", "table": table, "pk": "hot", "puts": 1, "attempts": 1})
    assert refused.payload["error"] == "ProvisionedThroughputExceededException", refused.payload
    assert refused.payload["reasons"][0]["reason"] == "TableWriteKeyRangeThroughputExceeded"
    # another partition key has its own rate: not slowed by the hot one
    before = sum(n for (_, what), n in accountant.throttles.items())
    cold = service.invoke("probe", {"kind": "put", "table": table, "pk": "cold", "puts": 2, "attempts": 1})
    assert cold.payload == {"done": 2, "error": None}
    assert sum(n for (_, what), n in accountant.throttles.items()) == before


@pytest.mark.backend("dynamodb")
def test_a_function_at_its_reserved_concurrency_is_throttled(metered: Any) -> None:
    service, accountant, _ = metered
    slow: list[Any] = []
    worker = threading.Thread(target=lambda: slow.append(service.invoke("probe", {"kind": "sleep", "seconds": 2})))
    worker.start()
    deadline = time.monotonic() + 60
    while not service.busy("probe") and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = service.invoke("probe", {"kind": "sleep", "seconds": 0})
    assert (refused.ok, refused.throttled, refused.error_type) == (False, True, "TooManyRequestsException")
    worker.join()
    assert slow[0].ok  # the one within the cap ran
    assert service.invoke("probe", {"kind": "sleep", "seconds": 0}).ok  # the cap is free again
    assert accountant.throttles[("probe", "concurrency")] == 1
