"""The snapshot tests' app, and a store wrapper that counts what each load reads (the HTTP tests page with it too)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.stores.base import BaseSessionStore, LoadedSession, SessionStore
from dormant.testing import MockAdapter
from tests.support.wrapped_stores import SixMethods, Snapshots


class Notes(BaseModel):
    count: int = 0
    words: list[str] = []


class Profile(BaseModel):
    name: str = "friend"


class Tally(BaseModel):
    n: int


class Ask(BaseModel):
    question: str


class Answer(BaseModel):
    yes: bool


class Counting(SixMethods):
    """A store as a user might wrap one: it forwards everything and records each load's ``after`` and size."""

    def __init__(self, inner: BaseSessionStore) -> None:
        super().__init__(inner)
        self.loads: list[tuple[int, int]] = []

    def load(self, app_name: str, session_id: str, *, after: int | None = None) -> LoadedSession | None:
        loaded = self.inner.load(app_name, session_id, after=after)
        self.loads.append((after or 0, len(loaded.events) if loaded else 0))
        return loaded


class CountingWithSnapshots(Counting, Snapshots):
    """``Counting``, and the inner store's snapshots."""


def build(
    store: SessionStore, *, every: int | None = 10, turns: int | None = 2, name: str = "snap"
) -> tuple[App, Agent, MockAdapter]:
    """An app whose agent tallies numbers in state, asks a human (a yielding tool), and sees ``turns`` turns."""
    model = MockAdapter()
    app = adk(
        name=name,
        schema={"session": Notes, "user": Profile},
        adapters={"openai": model},
        store=store,
        snapshot_every=every,
    )

    def tally(ctx: Any) -> dict[str, int]:
        ctx.state.count = ctx.state.count + ctx.args.n
        ctx.state.words = [*ctx.state.words[-3:], str(ctx.args.n)]
        return {"count": ctx.state.count}

    tools = [
        app.tool(name="tally", description="Add n.", schema=Tally, execute=tally),
        app.tool(name="ask", description="Ask a human.", schema=Ask, execute=None, yield_schema=Answer),
    ]
    agent = app.agent(
        name="helper",
        model=openai("m"),
        context=[app.context.system("Tally what you are told."), app.context.history(turns=turns)],
        tools=tools,
    )
    return app, agent, model
