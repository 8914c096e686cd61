"""``dormant migrate-table`` as a user runs it, killed (SIGKILL) in the middle of a copy and run again: the rerun
resumes from the last page written and ends with what one uninterrupted run copies; a pass after that puts the
same items again, no more (DynamoDB Local)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")

from dormant.events import UserEvent
from dormant.stores.base import StoredSession
from dormant.stores.dynamodb import create_table, dynamo_store
from dormant.stores.dynamodb.migrate import PROGRESS_PK, migrate_table
from tests.support.servers.dynamodb import store_for_process

pytestmark = [pytest.mark.backend("dynamodb"), pytest.mark.slow]

SESSIONS, EVENTS, TEXT = 40, 10, "x" * 10_000  # about 4 MB: several 1 MB scan pages


@pytest.fixture
def tables(ddb: Any) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for table in made:
        ddb.delete_table(TableName=table)


def _items(ddb: Any, table: str) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = ddb.scan(**kwargs)
        found |= {(i["pk"]["S"], i["sk"]["S"]): i for i in page["Items"] if i["pk"]["S"] != PROGRESS_PK}
        if "LastEvaluatedKey" not in page:
            return found
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _migrate(endpoint: str, source: str, target: str) -> subprocess.Popen[str]:
    _, env = store_for_process(endpoint, target)
    argv = [sys.executable, "-m", "dormant.cli", "migrate-table", "--from", source, "--to", target]
    return subprocess.Popen(
        [*argv, "--endpoint", endpoint],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_copy_killed_mid_run_resumes_and_completes(ddb: Any, dynamodb_endpoint: str, tables: list[str]) -> None:
    source, target, whole = (f"{what}-{uuid.uuid4().hex[:8]}" for what in ("big", "killed", "whole"))
    tables += [source]
    create_table(source, client=ddb)
    store = dynamo_store(source, client=ddb)
    for n in range(SESSIONS):
        row = StoredSession(id=f"s-{n:03d}", app_name="big", created_at=1, status="awaiting_input")
        events = [UserEvent(id=f"e-{n:03d}-{k:02d}", created_at=1, text=TEXT) for k in range(EVENTS)]
        assert store.commit(row, events, 0).ok

    first = _migrate(dynamodb_endpoint, source, target)
    tables += [target]
    progress_key = {"pk": {"S": PROGRESS_PK}, "sk": {"S": source}}
    deadline = time.monotonic() + 120
    while True:  # the first page is written (its position kept): stop the process there and look
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "no page written in 120 s"
        try:
            progress = ddb.get_item(TableName=target, Key=progress_key, ConsistentRead=True).get("Item")
        except ddb.exceptions.ResourceNotFoundException:
            progress = None  # the new table is still being made
        if progress is not None:
            first.send_signal(signal.SIGSTOP)
            break
        time.sleep(0.005)
    progress = ddb.get_item(TableName=target, Key=progress_key, ConsistentRead=True)["Item"]
    assert progress["done"] == {"BOOL": False}  # midway: pages left to copy
    first.kill()
    first.communicate()
    killed_at = len(_items(ddb, target))

    rerun = _migrate(dynamodb_endpoint, source, target)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    resumed = json.loads(out)
    assert resumed["resumed"] and 0 < resumed["items_read"] < SESSIONS * (1 + 2 * EVENTS + 1)

    migrate_table(ddb, source, whole)
    tables += [whole]
    copied = _items(ddb, target)
    assert len(copied) > killed_at and copied == _items(ddb, whole)
    assert len(dynamo_store(target, client=ddb).waiting_sessions()) == SESSIONS

    again = _migrate(dynamodb_endpoint, source, target)  # a second full pass
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    second = json.loads(out)
    assert not second["resumed"] and second["written"] == len(copied) - 1  # every item once, the layout aside
    assert _items(ddb, target) == copied
