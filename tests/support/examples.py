"""The triage example (the README's tour uses the same shape), built fresh per test."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.agents.tools import Tool
from dormant.models.base import ModelAdapter, ModelSpec
from dormant.stores.base import SessionStore
from dormant.testing import MockAdapter


class TriageSession(BaseModel):
    stage: Literal["intake", "collecting", "triaged"] = "intake"
    concerns: list[str] = []


class UserState(BaseModel):
    display_name: str = "friend"


class NoteConcern(BaseModel):
    concern: str


@dataclass
class Triage:
    app: App
    model: MockAdapter
    """The scripted model (unused when the app was given other adapters)."""
    note_concern: Tool
    agent: Agent


def triage(
    store: SessionStore | None = None,
    *,
    model: ModelSpec | Mapping[str, Any] | None = None,
    adapters: Mapping[str, ModelAdapter] | None = None,
    tools: bool = True,
    **agent_options: Any,
) -> Triage:
    """The triage app; by default on a MockAdapter standing in for openai("gpt-5.6-luna")."""
    scripted = MockAdapter()
    app = adk(
        name="triage",
        schema={"session": TriageSession, "user": UserState},
        adapters={"openai": scripted} if adapters is None else adapters,
        store=store,
    )

    def note(ctx: Any) -> dict[str, Any]:
        ctx.state.concerns = [*ctx.state.concerns, ctx.args.concern]
        ctx.state.stage = "collecting"
        return {"concerns": ctx.state.concerns}

    note_concern = app.tool(name="note_concern", description="Record one concern.", schema=NoteConcern, execute=note)
    agent = app.agent(
        name="triage",
        model=model or openai("gpt-5.6-luna"),
        context=[app.context.system("Log every concern with note_concern."), app.context.history()],
        tools=[note_concern] if tools else [],
        **agent_options,
    )
    return Triage(app, scripted, note_concern, agent)


SORE_THROAT = [
    {"tool_calls": [{"name": "note_concern", "args": {"concern": "sore throat"}}]},
    {"text": "Noted a sore throat. Anything else?"},
]
SEED = {"session": {}, "user": {"display_name": "Ada"}}


def of_type(events: Any, kind: type[Any]) -> list[Any]:
    """The events of ``kind``, in order."""
    return [e for e in events if isinstance(e, kind)]


def noted_a_sore_throat(run: Any, call_id: str) -> Any:
    """Check a triage run that made one ``note_concern`` call (``call_id``) for "sore throat" and then answered
    "Noted a sore throat.": its status, text, state, the call and its result; the result event, for more checks."""
    from dormant.events import ToolCallEvent, ToolResultEvent

    assert run.status == "completed"
    assert run.output.text == "Noted a sore throat."
    assert (run.state.stage, run.state.concerns) == ("collecting", ["sore throat"])
    [tool_call] = of_type(run.events, ToolCallEvent)
    assert (tool_call.call_id, tool_call.name, tool_call.args, tool_call.error) == (
        call_id,
        "note_concern",
        {"concern": "sore throat"},
        None,
    )
    [result] = of_type(run.events, ToolResultEvent)
    assert (result.call_id, result.result) == (call_id, {"concerns": ["sore throat"]})
    return result
