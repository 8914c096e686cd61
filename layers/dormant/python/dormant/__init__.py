"""dormant: agents whose sessions sleep between turns, on an auditable, append-only ledger.

The names below are imported when first used (PEP 562): ``import dormant`` costs nothing, and a process
that only reads or commits sessions (an API function, a sweeper) never loads the run loop.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors
    from .agents.loop import RunResult
    from .app import App, adk
    from .events import (
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
    from .stores.memory import in_memory_store

_HOMES = {
    "App": ".app",
    "RunResult": ".agents.loop",
    "Session": ".session",
    "adk": ".app",
    "bedrock": ".models.base",
    "errors": ".errors",
    "in_memory_store": ".stores.memory",
    "openai": ".models.base",
}
"""Where each public name lives; every other name of ``__all__`` is an event's (``dormant.events``)."""

__all__ = [
    "App",
    "AssistantEvent",
    "Event",
    "InvocationEndEvent",
    "InvocationResumeEvent",
    "InvocationStartEvent",
    "InvocationYieldEvent",
    "ModelEndEvent",
    "ModelStartEvent",
    "RunResult",
    "Session",
    "SessionForkedEvent",
    "StateChangeEvent",
    "ToolCallEvent",
    "ToolInputEvent",
    "ToolResultEvent",
    "UserEvent",
    "adk",
    "bedrock",
    "errors",
    "in_memory_store",
    "openai",
    "parse_event",
]


if not TYPE_CHECKING:  # a type checker sees the imports above: a misspelt name is an error, not ``Any``

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module 'dormant' has no attribute {name!r}")
        module = importlib.import_module(_HOMES.get(name, ".events"), __name__)
        value = module if name == "errors" else getattr(module, name)
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
