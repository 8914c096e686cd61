"""What ``dormant serve`` needs to show another framework's sessions in the inspector: ``inspected(app, framework)``.

Why a module of its own: the LangGraph and Agents SDK bridges share it, and it imports no framework, so a served
app that only shows those sessions loads none. An ``Inspected`` names the app and an agent the inspector can
name; the agent runs nothing (the framework runs its sessions), and ``dormant erase`` and audit read the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..agents.agent import Agent
from ..app import App
from ..errors import ConfigurationError
from ..models.base import ModelRequest, ModelResponse
from ..stores.base import SessionStore

__all__ = ["Inspected", "inspected"]


class _RunsElsewhere:
    """The model adapter of ``inspected``'s agent: the framework runs these sessions, not dormant."""

    def __init__(self, app_name: str, framework: str, how: str) -> None:
        self.app_name, self.framework, self.how = app_name, framework, how

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise ConfigurationError(f"the sessions of {self.app_name!r} are {self.framework} sessions: {self.how}")


@dataclass(frozen=True)
class Inspected:
    """What ``DORMANT_APP`` names: the app, and an agent the inspector can name (it runs nothing)."""

    app: App
    agent: Agent


def inspected(
    app_name: str,
    framework: str,
    *,
    app: Callable[[SessionStore], App] | None = None,
    how: str | None = None,
) -> Callable[[SessionStore], Inspected]:
    """For ``DORMANT_APP=module:attr`` with ``attr = inspected("langgraph", "LangGraph")``: ``dormant serve`` then
    shows the sessions of the dormant app ``app_name`` in the inspector, and ``dormant erase`` finds them. ``app``
    builds the dormant app over ``store`` (default: one with untyped scopes); ``how`` says where to run them."""
    provider = framework.lower().replace(" ", "-")
    advice = how or f"run them through {framework}"

    def build(store: SessionStore) -> Inspected:
        made = app(store) if app is not None else App(name=app_name, schema={}, store=store, snapshot_every=None)
        made.adapters[provider] = _RunsElsewhere(app_name, framework, advice)
        agent = made.agent(name=provider, model={"provider": provider, "name": app_name})
        return Inspected(made, agent)

    return build
