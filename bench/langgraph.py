"""LangGraph turns through DormantSaver on SQLite vs LangGraph's own SqliteSaver (issue 37).

The peer workload: a graph turn adds 5 messages of ~1 KB to a growing list (the user's, then 4 from a node), as
a chat graph does; every turn is ``graph.invoke`` with the checkpointer (a read of the thread, then its
checkpoints and writes). Both savers write a file of their own in one temporary directory; runs alternate, each
on a fresh thread. The floor is the peer: the figure is how many times faster dormant's turn is (target >= 1x).
Bytes stored are the database files' sizes after the turns: dormant stores what each turn appended, SqliteSaver
the whole list at every turn; a second count shows dormant's bytes grow linearly (twice the turns, about twice
the bytes).
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
