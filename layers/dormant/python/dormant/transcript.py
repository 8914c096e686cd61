"""The conversation as model messages, derived from the ledger.

``history_messages`` maps conversation events (user, assistant, tool calls and results) to messages;
``rebuild_input`` rebuilds what a ``model_start`` event recorded the model was sent (``request_of`` resolves
the parts and tools it holds by reference, ``by_reference`` makes those references). They read events only,
so the session (which offers ``model_input``) and the context renderers (which build the prompt) share them
without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import JsonValue

from .errors import EventValidationError
from .events import AssistantEvent, Event, ModelStartEvent, ToolCallEvent, ToolResultEvent, UserEvent
from .models.base import Message, ToolCall

Record = dict[str, JsonValue]
"""A ``model_start``'s input part or tool definition, as JSON."""

__all__ = [
    "by_reference",
    "digest",
    "dump_message",
    "history_messages",
    "rebuild_input",
    "rebuild_tools",
    "request_of",
]


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
    """The sha256 of messages as sent, kept on ``model_start`` to check a rebuild against."""
    payload = json.dumps([dump_message(m) for m in messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def rebuild_input(events: Sequence[Event], index: int, index_of: Callable[[str], int]) -> list[Message]:
    """The messages the model got at the ``model_start`` event at ``index``, rebuilt from ``events``.

    ``index_of`` maps an event id to its position (the session keeps that index).
    """
    parts, _ = _request_at(events, index, index_of)
    messages: list[Message] = []
    for part in parts:
        if part.get("kind") == "history":
            upto = part.get("upto")
            end = index_of(str(upto)) + 1 if upto is not None else 0
            turns = part.get("turns")
            messages.extend(history_messages(events[:end], turns if isinstance(turns, int) else None))
        else:
            raw = part.get("messages")
            messages.extend(Message.model_validate(m) for m in (raw if isinstance(raw, list) else []))
    return messages


def rebuild_tools(events: Sequence[Event], index: int, index_of: Callable[[str], int]) -> list[Record]:
    """The tool definitions the model got at the ``model_start`` event at ``index`` (``rebuild_input``'s
    arguments)."""
    return _request_at(events, index, index_of)[1]


def _request_at(
    events: Sequence[Event], index: int, index_of: Callable[[str], int]
) -> tuple[list[Record], list[Record]]:
    event = events[index]
    if not isinstance(event, ModelStartEvent):
        raise EventValidationError(f"event {index} is a {event.type!r} event, not model_start", field="index")
    return request_of(event, lambda event_id: events[index_of(event_id)])


def dump_message(message: Message) -> dict[str, Any]:
    """A message as JSON, without the fields left at their defaults (the form digests are taken of)."""
    return message.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def request_of(event: ModelStartEvent, lookup: Callable[[str], Event]) -> tuple[list[Record], list[Record]]:
    """The input records and tools ``event`` recorded, those it holds by reference taken from the earlier
    ``model_start`` that holds them (``lookup``: an event id to that event, fetching it if need be)."""

    def holder(event_id: str) -> ModelStartEvent:
        found = lookup(event_id)
        if not isinstance(found, ModelStartEvent):
            raise EventValidationError(
                f"model_start {event.id!r} refers to {event_id!r}, a {found.type!r} event, not model_start",
                field="as_in",
            )
        return found

    parts: list[Record] = []
    for part in event.input:
        source, n = part.get("as_in"), part.get("part")
        if source is None:
            parts.append(part)
            continue
        held = holder(str(source)).input
        if type(n) is not int or not 0 <= n < len(held) or "as_in" in held[n]:
            raise EventValidationError(
                f"model_start {event.id!r} refers to part {n!r} of {source!r}, which holds no such part", field="part"
            )
        parts.append(held[n])
    tools = list(event.tools) if event.tools_as_in is None else list(holder(event.tools_as_in).tools)
    return parts, tools


def by_reference(
    records: list[Record], tools: list[Record], previous: ModelStartEvent, held: Callable[[str], Event | None]
) -> tuple[list[Record], str | None]:
    """``records`` and ``tools`` of a model call with what the invocation's ``previous`` call already holds (or
    refers to) as references: ``(records, tools_as_in)``. A part is referred to only where the reference is
    shorter than the part; ``held`` finds an event the session holds (``None``: not held, so not compared)."""

    def source(event_id: str) -> ModelStartEvent | None:
        found = previous if event_id == previous.id else held(event_id)
        return found if isinstance(found, ModelStartEvent) else None

    holder, tools_as_in = source(previous.tools_as_in or previous.id), None
    if tools and holder is not None and holder.tools_as_in is None and holder.tools == tools:
        tools_as_in = holder.id
    shared: list[Record] = []
    for n, record in enumerate(records):
        before = previous.input[n] if n < len(previous.input) else None
        if "messages" not in record or before is None or before.get("kind") != record.get("kind"):
            shared.append(record)
            continue
        at, part = (str(before["as_in"]), before.get("part")) if "as_in" in before else (previous.id, n)
        stored = source(at)
        if stored is None or type(part) is not int or not 0 <= part < len(stored.input) or stored.input[part] != record:
            shared.append(record)
            continue
        reference: Record = {"kind": record["kind"], "as_in": at, "part": part}
        shorter = len(json.dumps(reference)) < len(json.dumps(record))
        shared.append(reference if shorter else record)
    return shared, tools_as_in
