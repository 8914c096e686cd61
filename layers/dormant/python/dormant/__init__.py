"""dormant: agents whose sessions sleep between turns, on an auditable, append-only ledger."""

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
