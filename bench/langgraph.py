"""LangGraph turns through DormantSaver vs SqliteSaver, and on DynamoDB Local vs langgraph-checkpoint-aws (issue 37).

The peer workload: a graph turn adds 5 messages of ~1 KB to a growing list (the user's, then 4 from a node), as
a chat graph does; every turn is ``graph.invoke`` with the checkpointer (a read of the thread, then its
checkpoints and writes). Both savers write a file of their own in one temporary directory; runs alternate, each
on a fresh thread. The floor is the peer: the figure is how many times faster dormant's turn is (target >= 1x).
Bytes stored are the database files' sizes after the turns: dormant stores what each turn appended, SqliteSaver
the whole list at every turn; a second count shows dormant's bytes grow linearly (twice the turns, about twice
the bytes). On DynamoDB Local (``TEST_DYNAMODB_ENDPOINT``, else one started for the run) the same turns go through
DormantSaver on dormant's DynamoDB store and through ``langgraph-checkpoint-aws``'s ``DynamoDBSaver`` on a table of
its layout: the turn time over the first ``DDB_TURNS`` turns, and how many of 200 turns each completes (the peer
stores a whole checkpoint in one item, which DynamoDB refuses past 400 KB).
"""

from __future__ import annotations

import importlib.util
import operator
import os
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from .common import QUICK, Figure, millis, paired, scale

TURNS = scale(200, 20)
DDB_TURNS = scale(40, 5)
LONG_TURNS = 200
REPEAT = 1 if QUICK else 3
_TEXT = ("lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20)[:1000]


def run() -> list[Figure]:
    missing = [n for n in ("langgraph", "langgraph.checkpoint.sqlite") if importlib.util.find_spec(n) is None]
    if missing:
        print(f"  skipped: needs {', '.join(missing)} (pip install 'dormant[langgraph]' langgraph-checkpoint-sqlite)")
        return []
    from langgraph.checkpoint.sqlite import SqliteSaver

    from dormant.bridges.langgraph import DormantSaver
    from dormant.stores.sqlite import sqlite_store

    with tempfile.TemporaryDirectory() as tmp:

        def ours(n: int, turns: int = TURNS) -> tuple[float, int]:
            path = Path(tmp) / f"dormant-{n}-{turns}.db"
            store = sqlite_store(path)
            try:
                return _turns(DormantSaver(store), turns), 0
            finally:
                store.close()
                size = _size(path)
                _last_sizes["ours"] = size

        def theirs(n: int, turns: int = TURNS) -> tuple[float, int]:
            path = Path(tmp) / f"langgraph-{n}-{turns}.db"
            conn = sqlite3.connect(path, check_same_thread=False)
            try:
                return _turns(SqliteSaver(conn), turns), 0
            finally:
                conn.close()
                _last_sizes["theirs"] = _size(path)

        mine, peer = paired(lambda n: ours(n)[0], lambda n: theirs(n)[0], REPEAT)
        ours_bytes, theirs_bytes = _last_sizes["ours"], _last_sizes["theirs"]
        ours(99, TURNS // 2)
        half = _last_sizes["ours"]
    return [
        *_sqlite_figures(mine, peer, ours_bytes, theirs_bytes, half),
        *_dynamodb(),
    ]


def _sqlite_figures(mine: float, peer: float, ours_bytes: int, theirs_bytes: int, half: int) -> list[Figure]:
    return [
        Figure(
            "langgraph",
            "LangGraph turn (5 messages), SQLite, vs SqliteSaver",
            f"{millis(mine / TURNS)}/turn",
            f"{millis(peer / TURNS)}/turn",
            peer / mine,
            1.0,
            "higher",
            note=f"{TURNS} turns a thread, a list growing to {5 * TURNS} messages of 1 KB",
        ),
        Figure(
            "langgraph",
            f"LangGraph bytes stored after {TURNS} turns, vs SqliteSaver",
            f"{ours_bytes / 1e6:,.1f} MB",
            f"{theirs_bytes / 1e6:,.1f} MB",
            theirs_bytes / ours_bytes,
            1.0,
            "higher",
            counted=True,
        ),
        Figure(
            "langgraph",
            f"LangGraph bytes stored, {TURNS} turns / {TURNS // 2} (linear: 2x)",
            f"{ours_bytes / 1e6:,.1f} MB",
            f"{half / 1e6:,.1f} MB",
            ours_bytes / half,
            2.5,
            "lower",
            note="dormant's file after twice the turns, against its file after half of them",
            counted=True,
        ),
    ]


_last_sizes: dict[str, int] = {}


def _size(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


class _Chat(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def agent(state: _Chat) -> dict[str, list[dict[str, str]]]:
        return {"messages": [{"role": "assistant", "content": _TEXT} for _ in range(4)]}

    builder = StateGraph(_Chat)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def _turns(saver: Any, turns: int) -> float:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    started = time.perf_counter()
    for _ in range(turns):
        graph.invoke({"messages": [{"role": "user", "content": _TEXT}]}, config)
    return time.perf_counter() - started


def _dynamodb() -> list[Figure]:
    missing = [n for n in ("boto3", "langgraph_checkpoint_aws") if importlib.util.find_spec(n) is None]
    if missing:
        print(f"  DynamoDB skipped: needs {', '.join(missing)} (pip install langgraph-checkpoint-aws)")
        return []
    from langgraph_checkpoint_aws import DynamoDBSaver  # type: ignore[import-untyped,unused-ignore]

    from dormant.bridges.langgraph import DormantSaver
    from dormant.stores.dynamodb import create_table, dynamo_store
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION, LocalUnavailable, client

    from .dynamodb import _endpoint

    os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    try:
        with _endpoint() as endpoint:
            ddb = client(endpoint)
            ours_table, theirs_table = (f"lg-bench-{uuid.uuid4().hex[:8]}" for _ in range(2))
            create_table(ours_table, client=ddb)
            ddb.create_table(
                TableName=theirs_table,
                KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                AttributeDefinitions=[
                    {"AttributeName": "PK", "AttributeType": "S"},
                    {"AttributeName": "SK", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
            store = dynamo_store(ours_table, client=ddb)

            def ours() -> Any:
                return DormantSaver(store, app_name=f"lg-{uuid.uuid4().hex[:8]}")

            def theirs() -> Any:
                return DynamoDBSaver(theirs_table, region_name=REGION, endpoint_url=endpoint)

            mine, peer = paired(lambda _n: _turns(ours(), DDB_TURNS), lambda _n: _turns(theirs(), DDB_TURNS), REPEAT)
            ours_reached, theirs_reached = _reached(ours()), _reached(theirs())
            store.close()
    except LocalUnavailable as exc:
        print(f"  DynamoDB skipped: no DynamoDB Local ({exc})")
        return []
    return [
        Figure(
            "langgraph",
            "LangGraph turn, DynamoDB Local, vs langgraph-checkpoint-aws",
            f"{millis(mine / DDB_TURNS)}/turn",
            f"{millis(peer / DDB_TURNS)}/turn",
            peer / mine,
            1.0,
            "higher",
            note=f"the first {DDB_TURNS} turns of a thread (the peer's checkpoints still fit its items)",
        ),
        Figure(
            "langgraph",
            f"LangGraph turns completed of {LONG_TURNS}, DynamoDB Local",
            str(ours_reached),
            str(theirs_reached),
            ours_reached / max(theirs_reached, 1),
            1.0,
            "higher",
            note="the peer writes a whole checkpoint per item: DynamoDB refuses it past 400 KB",
            counted=True,
        ),
    ]


def _reached(saver: Any) -> int:
    """How many of ``LONG_TURNS`` turns a thread completes before the saver fails."""
    graph = _graph(saver)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    for turn in range(LONG_TURNS):
        try:
            graph.invoke({"messages": [{"role": "user", "content": _TEXT}]}, config)
        except Exception:
            return turn
    return LONG_TURNS
