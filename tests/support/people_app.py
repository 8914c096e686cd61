"""An app whose yielding tools each declare who may answer them, for the tests of ``answerable_by``
(``--app tests.support.people_app:build``). The model calls the tool its user's message names (``approve``:
group ``approvers``; ``review``: anyone but who started the run; ``confirm``: only who started it;
``note``: anyone in the tenant; ``check``: an approver who did not start it; ``feedback``: anyone, an answer
whose model keeps fields it does not declare), then says what the answer was.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from dormant import App, adk
from dormant.agents.agent import Agent
from dormant.models.base import ModelRequest, ModelResponse, ToolCall
from dormant.stores.base import SessionStore

RULES: dict[str, str | tuple[str, ...]] = {
    "approve": "group:approvers",
    "review": "not_starter",
    "confirm": "starter",
    "note": "tenant",
    "check": ("group:approvers", "not_starter"),
}


class Step(BaseModel):
    step: int = 1


class Approval(BaseModel):
    approved: bool
    note: str | None = None


class Feedback(BaseModel):
    """An answer that keeps what it does not declare: its model says so (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")
    score: int


class NamedToolModel:
    """Calls the tool the last user message names; after its result, says it."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "tool":
            return ModelResponse(text=f"answered: {last.content}", finish_reason="stop")
        name = (last.content or "").strip()
        return ModelResponse(tool_calls=[ToolCall(name=name, args={"step": 1})], finish_reason="tool_calls")


@dataclass
class PeopleApp:
    app: App
    agent: Agent


def build(store: SessionStore | None = None) -> PeopleApp:
    app = adk(name="people", adapters={"named": NamedToolModel()}, store=store)
    tools = [
        app.tool(
            name=name,
            description=f"Ask for a {name}.",
            schema=Step,
            execute=None,
            yield_schema=Approval,
            answerable_by=rule,
        )
        for name, rule in RULES.items()
    ]
    tools.append(
        app.tool(name="feedback", description="Ask for feedback.", schema=Step, execute=None, yield_schema=Feedback)
    )
    agent = app.agent(
        name="asker", model={"provider": "named", "name": "x"}, context=[app.context.history(turns=5)], tools=tools
    )
    return PeopleApp(app, agent)
