"""Sleeping costs nothing: a sweep reads the waits that are due, never the healthy ones.

A parked wait is due only at its timeout (``StepFunctions.park`` sets it), so a sweep's reads and Step Functions
calls are the same with 20 healthy waits and 2,000, and a lost wake-up newer than every one of them is repaired
by the first sweep (the sweeper once read the oldest 1,000 waits, every one of them, each sweep). On SQLite and
DynamoDB Local, with the harness's Step Functions (``tests/support/fidelity/stepfunctions.py``) on loopback.
"""

from __future__ import annotations

import collections
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dormant.clock import now_ms, use_clock
from dormant.serving.runtime import Served
from dormant.serving.turns import claim_turn, run_to_end
from dormant.serving.workflow import StepFunctions, sweep_turns
from dormant.stores.base import StoredSession, SweepableStore
from dormant.stores.url import store_from_url
from tests.support.fidelity.fidelity_app import build as build_fidelity

DAY_MS = 86_400_000
WAIT_S = 7 * 86_400


class _Counted:
    """The calls a sweep makes: the store's (DynamoDB API operations and the items they returned, or SQLite's
    statements) and Step Functions' operations."""

    def __init__(self) -> None:
        self.store: collections.Counter[str] = collections.Counter()
        self.items = 0
        self.sfn: collections.Counter[str] = collections.Counter()
        self.on = False

    def dynamodb(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if self.on:
            self.store[model.name] += 1
            self.items += len(parsed.get("Items", [])) + sum(len(v) for v in parsed.get("Responses", {}).values())
            self.items += 1 if "Item" in parsed else 0

    def statement(self, sql: str) -> None:
        if self.on and not sql.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            self.store[sql.split(maxsplit=1)[0].upper()] += 1

    def step_functions(self, model: Any, **_: Any) -> None:
        if self.on:
            self.sfn[model.name] += 1

    @contextmanager
    def counting(self) -> Iterator[_Counted]:
        self.store.clear()
        self.sfn.clear()
        self.items, self.on = 0, True
        try:
            yield self
        finally:
            self.on = False

    def seen(self) -> tuple[dict[str, int], int, dict[str, int]]:
        return dict(self.store), self.items, dict(self.sfn)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StepFunctions, dict[str, str], Any]]:
    """A state machine that parks (``waitForTaskToken``) and ends when woken; the tokens it handed out, by session."""
    import botocore.session

    from tests.support.fidelity.stepfunctions import StepFunctions as Interpreter
    from tests.support.fidelity.template import ACCOUNT, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    tokens: dict[str, str] = {}

    def invoke(function: str, payload: Any) -> tuple[bool, Any]:
        tokens[payload["session_id"]] = payload["token"]
        return True, {}

    interpreter = Interpreter(invoke)
    arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:sessions"
    park = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {"FunctionName": "park", "Payload": {"token.$": "$$.Task.Token", "session_id.$": "$.session_id"}},
        "End": True,
    }
    interpreter.create_state_machine(arn, {"StartAt": "Park", "States": {"Park": park}})
    endpoint = interpreter.serve()
    client = botocore.session.get_session().create_client("stepfunctions", region_name=REGION, endpoint_url=endpoint)
    try:
        yield StepFunctions(arn, client), tokens, client
    finally:
        interpreter.close()


def _healthy(view: Any, prefix: str, n: int, at: int) -> None:
    """``n`` waits parked a day ago, each due at its 7-day timeout: what a park's commit and ``set_due`` leave."""
    store = view.store
    with use_clock(lambda: at):
        for k in range(n):
            sid = f"{prefix}-{k:05d}"
            row = StoredSession(sid, view.name, 0, {}, at, "awaiting_input", at)
            assert store.commit(row, [], 0).ok
            assert store.set_due(view.name, sid, 1, at + WAIT_S * 1000)


def _lost_wake_up(view: Any, agent: Any, machine: StepFunctions, tokens: dict[str, str], sid: str, at: int) -> str:
    """A session that yielded, whose execution parked and sleeps on, and whose answer landed ``at`` without the
    wake-up (``tools`` died before ``SendTaskSuccess``). Its execution's name."""
    with use_clock(lambda: at):
        view.sessions.create(sid)
        outcome = run_to_end(view, claim_turn(view, agent, sid, "signoffs=1"), lambda _: agent)
        assert outcome.status == "yielded_tool", outcome
        session = view.sessions.require(sid)
        invocation = session.projection.open_invocation
        assert invocation is not None
        name = machine.start("local", sid, invocation, session.version)
        execution = f"{machine.state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while sid not in tokens and time.monotonic() < deadline:  # the execution reaches its Park
            time.sleep(0.01)
        parked = machine.park(view, sid, invocation, tokens[sid], execution=execution, wait_seconds=WAIT_S)
        assert parked == {"woke": False, "status": "awaiting_input"}
        (call,) = view.sessions.require(sid).yielded_tools
        view.sessions.write(sid, lambda s: s.input.answers([{"call_id": call.call_id, "input": {"approved": True}}]))
    assert view.sessions.require(sid).status == "resumable"
    assert machine.status(execution) == "RUNNING"
    return name


def test_a_sweep_reads_the_same_with_20_healthy_waits_and_2000(
    store_url: str, machine: tuple[StepFunctions, dict[str, str], Any]
) -> None:
    """20 waits parked a day ago and one lost wake-up ten minutes ago: the first sweep wakes it. Then 1,980 more
    healthy waits and another lost wake-up, newer than all: the first sweep wakes it too, with the same store
    calls, the same items read and the same Step Functions calls (one DescribeExecution, one SendTaskSuccess):
    no healthy wait is read. A sweep with nothing due reads the same with 20 and 2,000."""
    sfn, tokens, client = machine
    store = store_from_url(store_url)
    fidelity = build_fidelity(store)
    served = Served(fidelity.app, {fidelity.agent.name: fidelity.agent})
    view = served.for_tenant("local")
    counted = _Counted()
    client.meta.events.register("after-call.sfn", counted.step_functions)
    dynamodb = getattr(store, "_client", None)
    if dynamodb is not None:
        dynamodb.meta.events.register("after-call.dynamodb", counted.dynamodb)
    else:
        conn = store._conn  # type: ignore[attr-defined]
        assert isinstance(conn, sqlite3.Connection)
        conn.set_trace_callback(counted.statement)
    now = now_ms()
    run = uuid.uuid4().hex[:6]

    def sweep() -> tuple[list[str], tuple[dict[str, int], int, dict[str, int]]]:
        with counted.counting():
            lines = sweep_turns(served, fidelity.app, machine=sfn)
        return lines, counted.seen()

    _healthy(view, f"h{run}", 20, now - DAY_MS)
    idle_20 = sweep()
    assert idle_20[0] == []
    first = _lost_wake_up(view, fidelity.agent, sfn, tokens, f"lost1-{run}", now - 600_000)
    woke_20 = sweep()
    assert woke_20[0] == [f"lost1-{run}: woken (execution {first})"]
    assert woke_20[1][2] == {"DescribeExecution": 1, "SendTaskSuccess": 1}, woke_20

    _healthy(view, f"h{run}x", 1_980, now - DAY_MS)
    assert isinstance(store, SweepableStore)
    assert len([r for r in store.waiting_sessions(5_000) if r.app_name == view.name]) >= 2_000
    idle_2000 = sweep()
    assert idle_2000 == idle_20, (idle_20, idle_2000)
    second = _lost_wake_up(view, fidelity.agent, sfn, tokens, f"lost2-{run}", now - 300_000)
    woke_2000 = sweep()
    assert woke_2000[0] == [f"lost2-{run}: woken (execution {second})"]
    assert woke_2000[1] == woke_20[1], (woke_20, woke_2000)
    fidelity.app.close()


@pytest.mark.backend("dynamodb")
def test_a_table_made_before_the_due_index_is_told_how_to_add_it_and_its_waits_are_adopted(
    dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of the layout before the ``due`` index: the store refuses it, naming the index and how to add it
    in place (no copy). Added, the store opens; a wait an earlier release stored (on the running index's ``W#``
    partitions, no due time) is read as due from its last commit, and ``set_due`` moves it to the due index."""
    import boto3

    from dormant.errors import ConfigurationError
    from dormant.stores.dynamodb import DUE_INDEX, TABLE, TableShape
    from dormant.stores.dynamodb.keys import running_key
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    ddb = boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, region_name=REGION)
    name = f"before-due-{uuid.uuid4().hex[:10]}"
    before = TableShape(indexes=tuple(i for i in TABLE.indexes if i.name != DUE_INDEX))
    ddb.create_table(**before.create_table_request(name))
    url = f"dynamodb://{name}?endpoint={dynamodb_endpoint}&region={REGION}"
    with pytest.raises(ConfigurationError) as refused:
        store_from_url(url).load("a", "s")
    assert "'due'" in str(refused.value) and "update-table" in str(refused.value)
    due = TABLE.index(DUE_INDEX)
    ddb.update_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "dpk", "AttributeType": "S"},
            {"AttributeName": "due", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexUpdates=[{"Create": due.definition()}],
    )
    store = store_from_url(url)
    assert isinstance(store, SweepableStore)
    at = now_ms() - DAY_MS
    with use_clock(lambda: at):
        assert store.commit(StoredSession("old", "a", 0, {}, at, "awaiting_input", at), [], 0).ok
    shards = store._pending_shards  # type: ignore[attr-defined]
    ddb.update_item(  # as the release before left it: on the running index's W# partition, no due time
        TableName=name,
        Key={"pk": {"S": "S#a#old"}, "sk": {"S": "#M"}},
        UpdateExpression="SET rpk = :w REMOVE dpk, #du",
        ExpressionAttributeNames={"#du": "due"},
        ExpressionAttributeValues={":w": {"S": running_key("a", "old", shards, waiting=True)}},
    )
    (row,) = [r for r in store.due_waits(now_ms()) if r.app_name == "a"]  # type: ignore[attr-defined]
    assert (row.session_id, row.due_at, row.version, row.status) == ("old", at, 1, "awaiting_input")
    assert [r.session_id for r in store.waiting_sessions() if r.app_name == "a"] == ["old"]
    assert store.set_due("a", "old", 1, now_ms() + DAY_MS)  # type: ignore[attr-defined]
    assert [r for r in store.due_waits(now_ms()) if r.app_name == "a"] == []  # type: ignore[attr-defined]
    item = ddb.get_item(TableName=name, Key={"pk": {"S": "S#a#old"}, "sk": {"S": "#M"}})["Item"]
    assert "rpk" not in item and item["dpk"]["S"].startswith("W#")
    assert [r.session_id for r in store.waiting_sessions() if r.app_name == "a"] == ["old"]
    store.close()


def _before_due_at(json_type: str) -> list[str]:
    """The tables as the release before ``due_at`` made them: this DDL without the column, its index, its fill."""
    from dormant.stores.sql_schema import ddl

    text = (
        ddl(json_type)
        .replace("  due_at BIGINT,\n", "")
        .replace("\nALTER TABLE sessions ADD COLUMN IF NOT EXISTS due_at BIGINT;", "")
    )
    return [
        statement
        for statement in text.split(";")
        if statement.strip() and "idx_sessions_due" not in statement and "SET due_at" not in statement
    ]


_OLD_WAIT = (
    "INSERT INTO sessions (app_name, id, version, scopes, status, created_at, updated_at)"
    " VALUES ('a', 'old', 1, '{}', 'awaiting_input', 1000, 1000)"
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_sql_database_made_before_due_at_gets_it_and_its_waits_are_due(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """A database of the release before: opening it adds ``due_at`` and its index, and a session that waited
    then is due from its last commit (the first sweep looks at it); ``set_due`` then moves it."""
    if kind == "sqlite":
        path = tmp_path / "old.db"
        conn = sqlite3.connect(path)
        for statement in _before_due_at("TEXT"):
            conn.execute(statement)
        conn.execute(_OLD_WAIT)
        conn.commit()
        conn.close()
        url = f"sqlite:///{path}"
    else:
        pytest.importorskip("psycopg")
        import psycopg

        url = request.getfixturevalue("postgres_schema")
        with psycopg.connect(url, autocommit=True) as pg:
            for statement in _before_due_at("JSONB"):
                pg.execute(statement)
            pg.execute(_OLD_WAIT)
    if kind == "sqlite":
        store: Any = store_from_url(url)
    else:
        from dormant.stores.postgres import postgres_store

        store = postgres_store(url)  # a conninfo with the schema's search_path
    assert [(r.session_id, r.due_at, r.version) for r in store.due_waits(now_ms())] == [("old", 1000, 1)]
    assert store.set_due("a", "old", 1, now_ms() + DAY_MS)
    assert store.due_waits(now_ms()) == []
    assert store.load("a", "old") is not None
    store.close()
