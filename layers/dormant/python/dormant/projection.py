"""What a session's ledger adds up to, folded one event at a time.

``Projection`` never looks at the event list: it is a pure fold (``apply`` one event, in order), so
the same code keeps a live session current (one event per append), replays a prefix for time
travel, and can later be saved as a snapshot and resumed from one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from .events import (
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelStartEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
)
from .state.values import json_copy

__all__ = ["InvocationNode", "Output", "Projection", "SessionStatus", "StateSnapshot", "YieldedTool"]

SessionStatus: TypeAlias = Literal[
    "idle",  # no invocation yet
    "running",  # an invocation started and has not ended (in progress, or interrupted mid-run)
    "awaiting_input",  # paused on yielded tool calls, at least one still unanswered
    "resumable",  # paused, every yielded call answered: run the agent to continue
    "completed",
    "error",
    "max_steps",
]


@dataclass(frozen=True)
class YieldedTool:
    """A yielded tool call waiting for its answer."""

    call_id: str
    name: str
    args: dict[str, Any]
    invocation_id: str | None


@dataclass(frozen=True)
class Output:
    """What the agent last said: its text, and its structured value when the agent declares one."""

    text: str | None = None
    value: Any = None


@dataclass
class InvocationNode:
    """One invocation: its agent, its status, where it starts and ends in the ledger."""

    invocation_id: str
    agent_name: str
    status: str
    start_index: int
    end_index: int | None = None
    model_calls: int = 0
    """``model_start`` events so far (an agent's ``max_steps`` counts them across resumes)."""


@dataclass(frozen=True)
class StateSnapshot:
    """The session as it stood after event ``index`` (inclusive)."""

    index: int
    session_state: dict[str, Any]
    scoped_states: dict[str, dict[str, Any]]
    status: SessionStatus
    current_agent_name: str | None
    yielded_tools: list[YieldedTool]
    invocations: list[InvocationNode]
    """Every invocation so far, in the order they started."""


class Projection:
    """Derived session state: scoped values, status, pending tool calls, the invocation tree."""

    __slots__ = (
        "answered",
        "count",
        "current_agent_name",
        "invocations",
        "open_calls",
        "open_invocation",
        "output",
        "pending",
        "scoped_states",
        "session_state",
        "status",
        "upcast",
    )

    def __init__(self, upcast: Callable[[StateChangeEvent], StateChangeEvent] | None = None) -> None:
        # State written under an older scope model is folded in the current shape (``Schema.upcast``).
        self.upcast = upcast
        self.count = 0
        self.session_state: dict[str, Any] = {}
        self.scoped_states: dict[str, dict[str, Any]] = {}
        self.status: SessionStatus = "idle"
        self.current_agent_name: str | None = None
        self.output = Output()
        self.invocations: dict[str, InvocationNode] = {}
        self.open_invocation: str | None = None
        # Calls of the open invocation that have no result yet, in the order the model made them.
        self.open_calls: dict[str, ToolCallEvent] = {}
        # Yielded calls without an answer, and answered ones whose tool has not run yet.
        self.pending: dict[str, YieldedTool] = {}
        self.answered: dict[str, ToolInputEvent] = {}

    def apply(self, event: Event) -> None:
        index = self.count
        self.count += 1
        if isinstance(event, StateChangeEvent):
            if self.upcast is not None:
                event = self.upcast(event)
            target = self.session_state if event.scope == "session" else self.scoped_states.setdefault(event.scope, {})
            for change in event.changes:
                if change.new_value is None:
                    target.pop(change.key, None)
                else:
                    target[change.key] = change.new_value
        elif isinstance(event, ToolCallEvent):
            self.open_calls[event.call_id] = event
        elif isinstance(event, ToolResultEvent):
            self.open_calls.pop(event.call_id, None)
            self.answered.pop(event.call_id, None)
        elif isinstance(event, ToolInputEvent):
            if self.pending.pop(event.call_id, None) is not None:
                self.answered[event.call_id] = event
                if not self.pending and self.status == "awaiting_input":
                    self.status = "resumable"
        elif isinstance(event, AssistantEvent):
            if event.text is not None or event.value is not None:
                self.output = Output(event.text, event.value)
        elif isinstance(event, ModelStartEvent):
            node = self.invocations.get(event.invocation_id)
            if node is not None:
                node.model_calls += 1
        elif isinstance(event, InvocationStartEvent):
            node = InvocationNode(event.invocation_id, event.agent_name, "running", index)
            self.invocations[event.invocation_id] = node
            self.open_invocation = event.invocation_id
            self.open_calls = {}
            self.current_agent_name = event.agent_name
            self.status = "running"
        elif isinstance(event, InvocationYieldEvent):
            self.pending = {
                c.call_id: YieldedTool(c.call_id, c.name, dict(c.args), event.invocation_id)
                for c in event.pending
                if c.call_id not in self.answered
            }
            self.status = "awaiting_input" if self.pending else "resumable"
            self._set_node(event.invocation_id, self.status, index)
        elif isinstance(event, InvocationResumeEvent):
            self.open_invocation = event.invocation_id
            resumed = self.invocations.get(event.invocation_id)
            if resumed is not None:
                self.current_agent_name = resumed.agent_name
            self.status = "awaiting_input" if self.pending else "running"
            self._set_node(event.invocation_id, self.status, None)
        elif isinstance(event, InvocationEndEvent):
            self.status = event.status
            self._set_node(event.invocation_id, event.status, index)
            self.open_invocation = None
            self.open_calls = {}
            self.pending = {}
            self.answered = {}

    def _set_node(self, invocation_id: str, status: str, end_index: int | None) -> None:
        node = self.invocations.get(invocation_id)
        if node is not None:
            node.status = status
            node.end_index = end_index

    @property
    def yielded_tools(self) -> list[YieldedTool]:
        return list(self.pending.values())

    def unexecuted_calls(self) -> list[ToolCallEvent]:
        """Calls of the open invocation that can run now: non-yielding ones, and answered yielded ones."""
        return [c for c in self.open_calls.values() if c.call_id not in self.pending]

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            index=self.count - 1,
            session_state=json_copy(self.session_state),
            scoped_states=json_copy(self.scoped_states),
            status=self.status,
            current_agent_name=self.current_agent_name,
            yielded_tools=self.yielded_tools,
            invocations=[replace(node) for node in self.invocations.values()],
        )
