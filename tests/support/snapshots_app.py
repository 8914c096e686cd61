"""The snapshot tests' app, and a store wrapper that counts what each load reads (the HTTP tests page with it too)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.events import Event
from dormant.stores.base import (
    CommitResult,
    LoadedSession,
    ScopedStateChange,
    SessionListing,
    SessionStore,
    SnapshotStore,
    StoredSession,
    StoredSnapshot,
)
from dormant.testing import MockAdapter


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


class Counting:
    """A store as a user might wrap one: it forwards everything and records each load's ``after`` and size."""

    def __init__(self, inner: SessionStore) -> None:
        self.inner = inner
        self.loads: list[tuple[int, int]] = []

    def load(self, app_name: str, session_id: str, *, after: int | None = None) -> LoadedSession | None:
        loaded = self.inner.load(app_name, session_id, after=after)
        self.loads.append((after or 0, len(loaded.events) if loaded else 0))
        return loaded

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        return self.inner.commit(session, new_events, expected_version, scoped_changes)

    def delete(self, app_name: str, session_id: str) -> None:
        self.inner.delete(app_name, session_id)

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        return self.inner.load_scoped_state(app_name, scope, scope_id)

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> builtins.list[SessionListing]:
        return self.inner.list(app_name, limit=limit, cursor=cursor)

    def close(self) -> None:
        self.inner.close()


class CountingWithSnapshots(Counting):
    def save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        assert isinstance(self.inner, SnapshotStore)
        return self.inner.save_snapshot(app_name, session_id, snapshot)

    def load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        assert isinstance(self.inner, SnapshotStore)
        return self.inner.load_snapshot(app_name, session_id)


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
