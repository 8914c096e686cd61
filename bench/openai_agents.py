"""OpenAI Agents SDK sessions: DormantSession on SQLite vs the SDK's own SQLiteSession (issue 37).

The peer workload: a turn is what the SDK's ``Runner`` asks of its session, ``get_items()`` (the history) and
then ``add_items`` of the turn's 5 items of ~1 KB. Both sessions write a file of their own in one temporary
directory, on one event loop; runs alternate, each on a fresh session. The floor is the peer: the figures are
how many times faster dormant is: the turn, and ``get_items()`` of a whole session by a fresh session object
(another process reading the conversation).
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .common import QUICK, Figure, millis, paired, scale

TURNS = scale(200, 20)
EVENTS_PER_TURN = 5
REPEAT = 3 if QUICK else 7
_TEXT = ("lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20)[:1000]


def run() -> list[Figure]:
    if importlib.util.find_spec("agents") is None:
        print("  skipped: needs openai-agents (pip install 'dormant[openai-agents]')")
        return []
    from agents.memory import SQLiteSession

    from dormant.bridges.openai_agents import DormantSession
    from dormant.stores.sqlite import sqlite_store

    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        store = sqlite_store(Path(tmp) / "dormant.db")
        sdk_path = str(Path(tmp) / "sdk.db")
        made: list[Any] = []

        def ours(session_id: str) -> Any:
            return DormantSession(session_id, store)

        def theirs(session_id: str) -> Any:
            session = SQLiteSession(session_id, sdk_path)
            made.append(session)
            return session

        try:
            return [_turns(loop, ours, theirs), _reads(loop, ours, theirs)]
        finally:
            for session in made:
                session.close()
            store.close()
            loop.close()


async def _session_turns(session: Any) -> float:
    started = time.perf_counter()
    for t in range(TURNS):
        await session.get_items()
        items = [{"role": "user" if i == 0 else "assistant", "content": f"{t}.{i} {_TEXT}"} for i in range(5)]
        await session.add_items(items)
    return time.perf_counter() - started


def _turns(loop: asyncio.AbstractEventLoop, ours: Any, theirs: Any) -> Figure:
    mine, peer = paired(
        lambda _n: loop.run_until_complete(_session_turns(ours(uuid.uuid4().hex))),
        lambda _n: loop.run_until_complete(_session_turns(theirs(uuid.uuid4().hex))),
        REPEAT,
    )
    return Figure(
        "openai_agents",
        f"Agents SDK turn (get_items + add_items of {EVENTS_PER_TURN}), SQLite, vs SQLiteSession",
        f"{millis(mine / TURNS)}/turn",
        f"{millis(peer / TURNS)}/turn",
        peer / mine,
        1.0,
        "higher",
        note=f"{TURNS} turns a session",
    )


def _reads(loop: asyncio.AbstractEventLoop, ours: Any, theirs: Any) -> Figure:
    ours_id, theirs_id = uuid.uuid4().hex, uuid.uuid4().hex
    loop.run_until_complete(_session_turns(ours(ours_id)))
    loop.run_until_complete(_session_turns(theirs(theirs_id)))

    def read(make: Any, session_id: str) -> float:
        started = time.perf_counter()
        items = loop.run_until_complete(make(session_id).get_items())  # a fresh object: nothing kept
        assert len(items) == TURNS * EVENTS_PER_TURN
        return time.perf_counter() - started

    mine, peer = paired(lambda _n: read(ours, ours_id), lambda _n: read(theirs, theirs_id), REPEAT)
    return Figure(
        "openai_agents",
        f"Agents SDK get_items(), {TURNS * EVENTS_PER_TURN} items, a fresh session object",
        millis(mine),
        millis(peer),
        peer / mine,
        1.0,
        "higher",
    )
