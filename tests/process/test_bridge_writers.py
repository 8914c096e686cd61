"""Two processes writing one LangGraph thread or one Agents SDK session on one SQLite file at once: nothing either
was told it wrote is lost; the LangGraph loser gets ``ThreadChanged``; the SDK's appends all land, in order."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

LANGGRAPH_WRITER = """
import json, sys, time
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from dormant.bridges.langgraph import DormantSaver, ThreadChanged
from dormant.stores.sqlite import sqlite_store

import pathlib
path, name, gate = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
saver = DormantSaver(sqlite_store(path))
config = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
(gate / name).touch()  # ready (imports done); go when both are
while len(list(gate.iterdir())) < 2:
    time.sleep(0.001)
done, lost = [], 0
for i in range(40):
    latest = saver.get_tuple(config)
    parent = dict(config["configurable"])
    if latest is not None:
        parent["checkpoint_id"] = latest.config["configurable"]["checkpoint_id"]
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=-1))
    checkpoint["channel_values"] = {"who": f"{name}-{i}"}
    checkpoint["channel_versions"] = {"who": saver.get_next_version(None, None)}
    time.sleep(0.005)  # the other process may write meanwhile
    try:
        saver.put({"configurable": parent}, checkpoint, {"source": "loop", "step": i, "writer": name},
                  checkpoint["channel_versions"])
        done.append(checkpoint["id"])
    except ThreadChanged as exc:
        assert "another process wrote it" in str(exc), exc
        lost += 1
print(json.dumps({"done": done, "lost": lost}))
"""

AGENTS_WRITER = """
import asyncio, sys, time
from dormant.bridges.openai_agents import DormantSession
from dormant.stores.sqlite import sqlite_store

import pathlib
path, name, gate = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
session = DormantSession("shared", sqlite_store(path))
(gate / name).touch()  # ready (imports done); go when both are
while len(list(gate.iterdir())) < 2:
    time.sleep(0.001)
async def main():
    for i in range(40):
        await session.add_items([{"role": "user", "content": f"{name}-{i}"}])
        time.sleep(0.005)
asyncio.run(main())
"""


def _race(script: str, path: Path) -> list[str]:
    gate = path.parent / f"{path.stem}-gate"  # each writer marks itself ready there, and starts once both are
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), str(path), name, str(gate)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


@pytest.mark.backend("langgraph")
def test_two_processes_on_one_langgraph_thread(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.base")
    from dormant.bridges.langgraph import DormantSaver
    from dormant.stores.sqlite import sqlite_store

    path = tmp_path / "lg.db"
    sqlite_store(path).close()
    results = [json.loads(out) for out in _race(LANGGRAPH_WRITER, path)]
    done = {cid for r in results for cid in r["done"]}
    assert sum(len(r["done"]) + r["lost"] for r in results) == 80
    assert all(r["lost"] > 0 for r in results) or sum(r["lost"] for r in results) > 0  # they did race
    store = sqlite_store(path)
    listed = list(DormantSaver(store).list({"configurable": {"thread_id": "shared"}}))
    assert {t.checkpoint["id"] for t in listed} == done  # every put that returned is stored, nothing a loser tried
    for newer, older in itertools.pairwise(listed):  # one line of history: no write was made on a stale read
        assert newer.parent_config is not None
        assert newer.parent_config["configurable"]["checkpoint_id"] == older.checkpoint["id"]
    store.close()


@pytest.mark.backend("openai-agents")
def test_two_processes_adding_items_to_one_sdk_session(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    import asyncio

    from dormant.bridges.openai_agents import DormantSession
    from dormant.stores.sqlite import sqlite_store

    path = tmp_path / "agents.db"
    sqlite_store(path).close()
    _race(AGENTS_WRITER, path)
    store = sqlite_store(path)
    stored: list[Any] = asyncio.run(DormantSession("shared", store).get_items())
    items: list[str] = [item["content"] for item in stored]
    store.close()
    assert sorted(items) == sorted(f"{name}-{i}" for name in "ab" for i in range(40))
    for name in "ab":
        assert [c for c in items if c.startswith(name)] == [f"{name}-{i}" for i in range(40)]
    runs = sum(1 for before, after in itertools.pairwise(items) if before[0] != after[0])
    assert runs > 1  # the two writers' appends interleaved: they did race
