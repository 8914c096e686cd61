"""An agent for the turn tests: ``note`` logs each run of itself, then ``slow`` waits for a release file.

Files, because the turn runs in another process the test kills: ``FOLDER/log`` gets a line per tool run,
``FOLDER/inside`` appears once ``slow`` is running, and ``slow`` returns once ``FOLDER/release`` exists (or
after 60 s, a bound on a failing test, not a window a passing one depends on).

``python tests/support/turns_app.py STORE_URL FOLDER`` is the runner the test kills: it creates a session, prints
its id, claims a turn with a deadline (as a server does) and runs it to its end.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.testing import MockAdapter

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "note", "args": {}}]},
    {"tool_calls": [{"name": "slow", "args": {}}]},
    {"text": "done"},
]


class Empty(BaseModel):
    pass


@dataclass
class Turns:
    app: App
    agent: Agent
    model: MockAdapter


def build(store: Any, folder: Path, script: list[dict[str, Any]] | None = None) -> Turns:
    model = MockAdapter(script if script is not None else list(SCRIPT))
    app = adk(name="turns", store=store, adapters={"openai": model})

    def log(what: str) -> None:
        with (folder / "log").open("a", encoding="utf-8") as out:
            out.write(what + "\n")

    def note(ctx: Any) -> str:
        log("note")
        return "noted"

    def slow(ctx: Any) -> str:
        log("slow")
        (folder / "inside").touch()
        deadline = time.monotonic() + 60
        while not (folder / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "slow done"

    tools = [
        app.tool(name="note", description="note", schema=Empty, execute=note),
        app.tool(name="slow", description="slow", schema=Empty, execute=slow),
    ]
    agent = app.agent(name="turns", model=openai("m"), context=[app.context.history()], tools=tools)
    return Turns(app, agent, model)


def main(url: str, folder: str) -> None:
    from dormant.clock import now_ms
    from dormant.serving.turns import RUNNER_TURN_MS, claim_turn, run_to_end
    from dormant.stores.url import store_from_url

    turns = build(store_from_url(url), Path(folder))
    session = turns.app.sessions.create()
    print(session.id, flush=True)
    claim = claim_turn(turns.app, turns.agent, session, "go", deadline=now_ms() + RUNNER_TURN_MS)
    run_to_end(turns.app, claim, lambda name: turns.agent)


if __name__ == "__main__":
    main(*sys.argv[1:])
