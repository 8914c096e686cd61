"""An agent whose one tool holds its run until the test says go, for ``dormant serve`` concurrency tests
(``--app tests.support.serve_app:build``, with ``HOLD_DIR`` set to a directory of the test's).

The tool creates ``HOLD_DIR/inside`` (the run is now in the middle of its turn, inside a worker), then waits
for ``HOLD_DIR/release`` to appear, up to ``HOLD_SECONDS`` (default 30: a bound on a failing test's time,
not a window a passing one depends on; the benchmark sets it, to stand for a slow model), and returns
whether it did. Files, because the run is in another process: the server's worker. The model answers
with the tool's result, so the run's output says whether it was released while it held.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dormant import App, adk
from dormant.agents.agent import Agent
from dormant.models.base import ModelRequest, ModelResponse, ToolCall
from dormant.stores.base import SessionStore


class Empty(BaseModel):
    pass


class HoldModel:
    """Calls ``hold`` on a user's message, then says what the tool returned."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "tool":
            return ModelResponse(text=last.content, finish_reason="stop")
        return ModelResponse(tool_calls=[ToolCall(name="hold", args={})], finish_reason="tool_calls")


def hold(ctx: Any) -> dict[str, bool]:
    folder = Path(os.environ["HOLD_DIR"])
    (folder / "inside").touch()
    deadline = time.monotonic() + float(os.environ.get("HOLD_SECONDS", "30"))
    while not (released := (folder / "release").exists()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"released": released}


@dataclass
class HoldApp:
    app: App
    agent: Agent


def build(store: SessionStore) -> HoldApp:
    app = adk(name="hold", adapters={"scripted": HoldModel()}, store=store)
    tool = app.tool(name="hold", description="Wait for the test.", schema=Empty, execute=hold)
    model = {"provider": "scripted", "name": "hold"}
    return HoldApp(app, app.agent(name="holder", model=model, context=[app.context.history()], tools=[tool]))


def build_until_broken(store: SessionStore) -> HoldApp:
    """``build``, until ``HOLD_DIR/broken`` exists: then a worker started afterwards cannot build its app."""
    if (Path(os.environ["HOLD_DIR"]) / "broken").exists():
        raise RuntimeError("the app is broken on purpose (HOLD_DIR/broken)")
    return build(store)
