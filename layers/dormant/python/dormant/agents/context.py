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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigurationError
from ..models.base import Message
from ..state.values import storable_text
from ..transcript import dump_message, history_messages

if TYPE_CHECKING:
    from ..session import Session
    from ..state.view import StateView

__all__ = ["ContextFactory", "RenderContext", "Rendered", "Renderer"]


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
    return Rendered(messages, {"kind": kind, "messages": [dump_message(m) for m in messages]})


class SystemRenderer:
    def __init__(self, text: str | Callable[[RenderContext], str]) -> None:
        if not (isinstance(text, str) or callable(text)):
            raise ConfigurationError("context.system takes a string or a function of the render context")
        self.text = text

    def render(self, ctx: RenderContext) -> Rendered:
        text = self.text(ctx) if callable(self.text) else self.text
        return _inline("system", [Message(role="system", content=storable_text(str(text)))])


class UserRenderer:
    """A rendered user turn (e.g. state the model should see); it writes no event."""

    def __init__(self, fn: Callable[[RenderContext], str | None]) -> None:
        if not callable(fn):
            raise ConfigurationError("context.user takes a function of the render context")
        self.fn = fn

    def render(self, ctx: RenderContext) -> Rendered:
        text = self.fn(ctx)
        return _inline("user", [] if text is None else [Message(role="user", content=storable_text(str(text)))])


class HistoryRenderer:
    """The conversation so far; ``turns=N`` keeps the last N user turns and what followed them."""

    def __init__(self, turns: int | None = None) -> None:
        if turns is not None and (not isinstance(turns, int) or turns < 1):
            raise ConfigurationError(f"history(turns=) is a positive int, not {turns!r}")
        self.turns = turns

    def render(self, ctx: RenderContext) -> Rendered:
        """Renders from the last ``turns`` user turns only, so a session loaded from a snapshot is not
        made to fetch its earlier ledger (``history()`` without a window does fetch it)."""
        events = ctx.session.events
        messages = history_messages(ctx.session.turn_window(self.turns), self.turns)
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
