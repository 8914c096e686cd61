"""Context renderers: what the model sees, re-rendered from the ledger before every model call.

The ledger is the durable record; the prompt is a rendering of it. Renderers run in the order the
agent lists them. ``history`` maps conversation events (user, assistant, tool calls and results) to
messages; nothing else in the ledger — no ``state_change`` — reaches the prompt unless a renderer
puts it there (``system(fn)`` and ``user(fn)`` get the invocation's state to do so).

Each renderer also returns a compact *record* of what it contributed, kept on ``model_start``:
inline messages for ``system``/``user``, and for ``history`` the ledger position and window it
rendered — so the exact input can be rebuilt later without storing the conversation on every call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigurationError, EventValidationError
from ..events import AssistantEvent, Event, ModelStartEvent, ToolCallEvent, ToolResultEvent, UserEvent
from ..models.base import Message, ToolCall

if TYPE_CHECKING:
    from ..session import Session
    from ..state.view import StateView

__all__ = ["ContextFactory", "RenderContext", "Rendered", "Renderer", "digest", "history_messages", "rebuild_input"]


@dataclass(frozen=True)
class RenderContext:
    """What a renderer can look at: the invocation's state, the session, the agent's name."""

    state: StateView
    session: Session
    agent_name: str
    invocation_id: str


@dataclass(frozen=True)
class Rendered:
    messages: list[Message]
    record: dict[str, Any]


class Renderer(Protocol):
    def render(self, ctx: RenderContext) -> Rendered: ...


def _inline(kind: str, messages: list[Message]) -> Rendered:
    return Rendered(messages, {"kind": kind, "messages": [_dump(m) for m in messages]})


class SystemRenderer:
    def __init__(self, text: str | Callable[[RenderContext], str]) -> None:
        if not (isinstance(text, str) or callable(text)):
            raise ConfigurationError("context.system takes a string or a function of the render context")
        self.text = text

    def render(self, ctx: RenderContext) -> Rendered:
        text = self.text(ctx) if callable(self.text) else self.text
        return _inline("system", [Message(role="system", content=str(text))])


class UserRenderer:
    """A rendered user turn (e.g. state the model should see); it writes no event."""

    def __init__(self, fn: Callable[[RenderContext], str | None]) -> None:
        if not callable(fn):
            raise ConfigurationError("context.user takes a function of the render context")
        self.fn = fn

    def render(self, ctx: RenderContext) -> Rendered:
        text = self.fn(ctx)
        return _inline("user", [] if text is None else [Message(role="user", content=str(text))])


class HistoryRenderer:
    """The conversation so far; ``turns=N`` keeps the last N user turns and what followed them."""

    def __init__(self, turns: int | None = None) -> None:
        if turns is not None and (not isinstance(turns, int) or turns < 1):
            raise ConfigurationError(f"history(turns=) is a positive int, not {turns!r}")
        self.turns = turns

    def render(self, ctx: RenderContext) -> Rendered:
        events = ctx.session.events
        messages = history_messages(events, self.turns)
        upto = events[-1].id if len(events) else None
        return Rendered(messages, {"kind": "history", "turns": self.turns, "upto": upto, "count": len(messages)})


class ContextFactory:
    """``app.context``: builds the renderers an agent's ``context=[...]`` lists."""

    def system(self, text: str | Callable[[RenderContext], str]) -> SystemRenderer:
        return SystemRenderer(text)

    def history(self, turns: int | None = None) -> HistoryRenderer:
        return HistoryRenderer(turns)

    def user(self, fn: Callable[[RenderContext], str | None]) -> UserRenderer:
        return UserRenderer(fn)


def history_messages(events: Sequence[Event], turns: int | None = None) -> list[Message]:
    """Map conversation events to messages. Tool calls that have no result yet are left out."""
    answered = {e.call_id for e in events if isinstance(e, ToolResultEvent)}
    messages: list[Message] = []
    turn_starts: list[int] = []
    open_assistant = False  # the last message is an assistant turn tool calls may still join
    for event in events:
        if isinstance(event, UserEvent):
            turn_starts.append(len(messages))
            messages.append(Message(role="user", content=event.text))
            open_assistant = False
        elif isinstance(event, AssistantEvent):
            text = event.text if event.text is not None else json.dumps(event.value)
            messages.append(Message(role="assistant", content=text))
            open_assistant = True
        elif isinstance(event, ToolCallEvent):
            if event.call_id not in answered:
                continue
            call = ToolCall(call_id=event.call_id, name=event.name, args=dict(event.args))
            if open_assistant:
                last = messages[-1]
                messages[-1] = last.model_copy(update={"tool_calls": [*last.tool_calls, call]})
            else:
                messages.append(Message(role="assistant", tool_calls=[call]))
                open_assistant = True
        elif isinstance(event, ModelStartEvent):
            open_assistant = False  # a new model response starts a new assistant turn
        elif isinstance(event, ToolResultEvent):
            content = json.dumps({"error": event.error} if event.error is not None else event.result)
            messages.append(Message(role="tool", content=content, tool_call_id=event.call_id, name=event.name))
            open_assistant = False
    if turns is not None and len(turn_starts) > turns:
        messages = messages[turn_starts[-turns] :]
    return messages


def digest(messages: Sequence[Message]) -> str:
    payload = json.dumps([_dump(m) for m in messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def rebuild_input(session: Session, index: int) -> list[Message]:
    """The messages the model got at the ``model_start`` event at ``index``, rebuilt from the ledger."""
    event = session.events[index]
    if not isinstance(event, ModelStartEvent):
        raise EventValidationError(f"event {index} is a {event.type!r} event, not model_start", field="index")
    messages: list[Message] = []
    for part in event.input:
        if part.get("kind") == "history":
            upto = part.get("upto")
            end = session.event_index_of(str(upto)) + 1 if upto is not None else 0
            turns = part.get("turns")
            messages.extend(history_messages(session.events[:end], turns if isinstance(turns, int) else None))
        else:
            raw = part.get("messages")
            messages.extend(Message.model_validate(m) for m in (raw if isinstance(raw, list) else []))
    return messages


def _dump(message: Message) -> dict[str, Any]:
    return message.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
