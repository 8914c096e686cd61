"""dormant: agents whose sessions sleep between turns, on an auditable, append-only ledger.

The everyday names are here: the app (``adk``, the same class as ``App``), the agent and its tools' context, the
session and a run's result, the model providers, the stores and their protocol, and the errors. The events are
in ``dormant.events``.

The names below are imported when first used (PEP 562): ``import dormant`` costs nothing, and a process
that only reads or commits sessions (an API function, a sweeper) never loads the run loop.

Deprecated in 0.2: the event classes and ``parse_event`` as names of ``dormant`` (0.1). They still work for that
release, each access warning (``DeprecationWarning``) to import them from ``dormant.events``; 0.3 drops them.
"""

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors, events
    from .agents.agent import Agent
    from .agents.run import RunResult
    from .agents.tools import ToolContext
    from .app import App, adk

    # Deprecated here (import them from dormant.events); not re-exported, so a strict type checker flags their use.
    from .events import (  # noqa: F401
        AssistantEvent,
        Event,
        InvocationEndEvent,
        InvocationResumeEvent,
        InvocationStartEvent,
        InvocationYieldEvent,
        ModelEndEvent,
        ModelStartEvent,
        SessionForkedEvent,
        StateChangeEvent,
        ToolCallEvent,
        ToolInputEvent,
        ToolResultEvent,
        UserEvent,
        parse_event,
    )
    from .models.base import bedrock, openai
    from .session import Session
    from .stores.base import SessionStore
    from .stores.dynamodb import dynamo_store
    from .stores.memory import in_memory_store
    from .stores.postgres import postgres_store
    from .stores.sqlite import sqlite_store
    from .stores.url import store_from_url

_HOMES = {
    "Agent": ".agents.agent",
    "App": ".app",
    "RunResult": ".agents.run",
    "Session": ".session",
    "SessionStore": ".stores.base",
    "ToolContext": ".agents.tools",
    "adk": ".app",
    "bedrock": ".models.base",
    "dynamo_store": ".stores.dynamodb",
    "errors": ".errors",
    "events": ".events",
    "in_memory_store": ".stores.memory",
    "openai": ".models.base",
    "postgres_store": ".stores.postgres",
    "sqlite_store": ".stores.sqlite",
    "store_from_url": ".stores.url",
}
"""Where each public name lives."""
_MODULES = frozenset({"errors", "events"})
"""The public names that are modules: ``dormant.errors`` and ``dormant.events`` work after ``import dormant``."""

_MOVED_TO_EVENTS = frozenset(
    {
        "AssistantEvent",
        "Event",
        "InvocationEndEvent",
        "InvocationResumeEvent",
        "InvocationStartEvent",
        "InvocationYieldEvent",
        "ModelEndEvent",
        "ModelStartEvent",
        "SessionForkedEvent",
        "StateChangeEvent",
        "ToolCallEvent",
        "ToolInputEvent",
        "ToolResultEvent",
        "UserEvent",
        "parse_event",
    }
)
"""Names of ``dormant`` in 0.1, of ``dormant.events`` since: deprecated aliases for one release (0.2)."""

__all__ = [
    "Agent",
    "App",
    "RunResult",
    "Session",
    "SessionStore",
    "ToolContext",
    "adk",
    "bedrock",
    "dynamo_store",
    "errors",
    "events",
    "in_memory_store",
    "openai",
    "postgres_store",
    "sqlite_store",
    "store_from_url",
]


if not TYPE_CHECKING:  # a type checker sees the imports above: a misspelt name is an error, not ``Any``

    def __getattr__(name: str) -> Any:
        if name in _MOVED_TO_EVENTS:
            warnings.warn(
                f"dormant.{name} is deprecated: import it from dormant.events (dormant drops it in 0.3)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(".events", __name__), name)  # not cached: it warns each time
        if name not in _HOMES:
            raise AttributeError(f"module 'dormant' has no attribute {name!r}")
        module = importlib.import_module(_HOMES[name], __name__)
        value = module if name in _MODULES else getattr(module, name)
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
