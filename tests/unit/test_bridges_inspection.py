"""``dormant.bridges.inspection.inspected``: the app ``dormant serve`` shows another framework's sessions with,
whose agent refuses to run them, naming the framework and where to run them (one module the bridges share)."""

from __future__ import annotations

import pytest

from dormant import in_memory_store
from dormant.bridges.inspection import inspected
from dormant.errors import ConfigurationError
from dormant.models.base import ModelRequest


def _refusal(built: object) -> str:
    agent_app = built.app  # type: ignore[attr-defined]
    adapter = agent_app.adapters[built.agent.model.provider]  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError) as refused:
        adapter.complete(ModelRequest.model_construct(messages=[]))  # the adapter reads none of it
    return str(refused.value)


def test_the_inspected_agent_runs_nothing_and_names_the_framework() -> None:
    built = inspected("graphs", "LangGraph")(in_memory_store())
    assert built.app.name == "graphs" and built.agent.name == "langgraph"
    assert _refusal(built) == "the sessions of 'graphs' are LangGraph sessions: run them through LangGraph"


def test_a_bridge_gives_its_own_app_and_advice() -> None:
    made = []

    def app(store: object) -> object:
        from dormant import App

        made.append(App(name="adk-app", schema={}, store=store, snapshot_every=None))  # type: ignore[arg-type]
        return made[-1]

    built = inspected("adk-app", "ADK", app=app, how="send their messages through ADK's Runner")(in_memory_store())  # type: ignore[arg-type]
    assert built.app is made[0] and built.agent.name == "adk"
    assert _refusal(built) == "the sessions of 'adk-app' are ADK sessions: send their messages through ADK's Runner"
