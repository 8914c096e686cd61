"""ADK turns through DormantSessionService on SQLite vs ADK's own DatabaseSessionService on SQLite (issue 28).

The peer workload (perf-anchors): a turn is what ADK's ``Runner`` asks of its session service, ``get_session``
and then one ``append_event`` per event, 5 events of ~1 KB with one state change. Both services write a
file of their own in one temporary directory, on one event loop; runs alternate, each on a fresh session.
The floor here is the peer: the figure is how many times faster dormant's turn is (target >= 5x).
A second figure times a real ADK ``Runner`` turn (a scripted model, a tool that writes state) on both.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine
from pathlib import Path
from typing import Any

from .common import QUICK, Figure, millis, paired, scale

TURNS = scale(40, 4)
RUNNER_TURNS = scale(20, 3)
EVENTS_PER_TURN = 5
REPEAT = 3 if QUICK else 7
_TEXT = ("lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20)[:1000]


def run() -> list[Figure]:
    missing = [name for name in ("google.adk", "sqlalchemy", "aiosqlite") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"  skipped: needs {', '.join(missing)} (pip install 'dormant[adk]' and sqlalchemy[asyncio])")
        return []
    from google.adk.sessions.database_session_service import DatabaseSessionService

    from dormant.bridges.adk import DormantSessionService
    from dormant.stores.sqlite import sqlite_store

    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        store = sqlite_store(Path(tmp) / "dormant.db")
        ours = DormantSessionService(store)
        theirs = DatabaseSessionService(f"sqlite+aiosqlite:///{Path(tmp) / 'adk.db'}")
        try:
            return [_turns(loop, ours, theirs), _runner_turns(loop, ours, theirs)]
        finally:
            loop.run_until_complete(theirs.close())
            store.close()
            loop.close()


def _timing(loop: asyncio.AbstractEventLoop, work: Callable[[], Coroutine[Any, Any, float]]) -> Callable[[int], float]:
    return lambda _n: loop.run_until_complete(work())


def _turns(loop: asyncio.AbstractEventLoop, ours: Any, theirs: Any) -> Figure:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    async def turns(service: Any) -> float:
        session = await service.create_session(app_name="bench", user_id="u", session_id=uuid.uuid4().hex)
        started = time.perf_counter()
        for t in range(TURNS):
            session = await service.get_session(app_name="bench", user_id="u", session_id=session.id)
            for i in range(EVENTS_PER_TURN):
                author = "user" if i == 0 else "agent"
                state = {"turn": t} if i == EVENTS_PER_TURN - 1 else {}
                event = Event(
                    invocation_id=f"inv-{t}",
                    author=author,
                    content=types.Content(role="user" if i == 0 else "model", parts=[types.Part(text=_TEXT)]),
                    actions=EventActions(state_delta=state),
                )
                await service.append_event(session, event)
        return time.perf_counter() - started

    mine, peer = paired(_timing(loop, lambda: turns(ours)), _timing(loop, lambda: turns(theirs)), REPEAT)
    return Figure(
        "adk",
        f"ADK turn (get + {EVENTS_PER_TURN} appends), SQLite, vs DatabaseSessionService",
        f"{millis(mine / TURNS)}/turn",
        f"{millis(peer / TURNS)}/turn",
        peer / mine,
        5.0,
        "higher",
        note=f"{TURNS} turns a session; the floor is ADK's DatabaseSessionService (sqlite+aiosqlite)",
    )


def _runner_turns(loop: asyncio.AbstractEventLoop, ours: Any, theirs: Any) -> Figure:
    from google.adk.agents import LlmAgent
    from google.adk.models import BaseLlm, LlmRequest, LlmResponse
    from google.adk.runners import Runner
    from google.adk.tools import ToolContext
    from google.genai import types

    class Scripted(BaseLlm):
        """Two tool calls, then an answer: user message, call, result, call, result, answer (6 events)."""

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            results = 0
            for content in reversed(llm_request.contents):
                parts = content.parts or []
                if content.role == "user" and any(p.text for p in parts):
                    break  # this turn's message: count the tool results since
                results += sum(1 for p in parts if p.function_response)
            if results < 2:
                part = types.Part(function_call=types.FunctionCall(name="note", args={"text": _TEXT[:200]}))
            else:
                part = types.Part(text=_TEXT)
            usage = types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            )
            yield LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)

    def note(text: str, tool_context: ToolContext) -> dict[str, int]:
        """Count notes in session state."""
        tool_context.state["notes"] = tool_context.state.get("notes", 0) + 1
        return {"notes": tool_context.state["notes"]}

    agent = LlmAgent(name="bench", model=Scripted(model="scripted"), tools=[note])

    async def turns(service: Any) -> float:
        runner = Runner(app_name="bench-runner", agent=agent, session_service=service)
        session = await service.create_session(app_name="bench-runner", user_id="u", session_id=uuid.uuid4().hex)
        started = time.perf_counter()
        for _ in range(RUNNER_TURNS):
            message = types.Content(role="user", parts=[types.Part(text=_TEXT)])
            async for _event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
                pass
        return time.perf_counter() - started

    mine, peer = paired(_timing(loop, lambda: turns(ours)), _timing(loop, lambda: turns(theirs)), REPEAT)
    return Figure(
        "adk",
        "ADK Runner turn (scripted model, a tool), SQLite",
        f"{millis(mine / RUNNER_TURNS)}/turn",
        f"{millis(peer / RUNNER_TURNS)}/turn",
        peer / mine,
        2.0,
        "higher",
        note="the Runner's own work (the same on both sides) is inside both times",
    )
