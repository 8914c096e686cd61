"""The ledger's events: pydantic models, one class per ``type``, parsed through one discriminated union.

Events are frozen and JSON round-trip losslessly (``Event -> model_dump(mode="json") -> parse_event``
gives an equal event). A field this version does not know, written by a newer one, is kept rather than
refused, so an older process can load, fork and re-save a newer session without losing anything.

Every event carries ``v``, the version of the event format it was written in (``FORMAT_VERSION``; an
event stored without one is format 1). A release that changes the format raises ``FORMAT_VERSION`` and
upgrades older events where they are parsed; the stored fixtures of every release (tests/fixtures)
prove they still load.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from .clock import now_ms
from .errors import EventValidationError
from .ids import new_id

__all__ = [
    "FORMAT_VERSION",
    "AdkEvent",
    "AssistantEvent",
    "Event",
    "EventBase",
    "InvocationEndEvent",
    "InvocationResumeEvent",
    "InvocationStartEvent",
    "InvocationYieldEvent",
    "LangGraphEvent",
    "ModelEndEvent",
    "ModelRef",
    "OpenAIAgentsEvent",
    "ModelStartEvent",
    "PendingCall",
    "SessionForkedEvent",
    "StateChange",
    "StateChangeEvent",
    "StateSource",
    "ToolCallEvent",
    "ToolInputEvent",
    "ToolResultEvent",
    "Usage",
    "UserEvent",
    "parse_event",
    "parse_event_json",
]

StateSource: TypeAlias = Literal["direct", "mutation", "observation"]
InvocationStatus: TypeAlias = Literal["completed", "error", "max_steps"]


class _Record(BaseModel):
    # No NaN or Infinity anywhere in an event: JSON cannot hold them (see ``state.values``). The validators
    # are built when first used, not at import: a cold start builds only the models its requests touch.
    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False, defer_build=True)


FORMAT_VERSION = 1
"""The event format this release writes."""


class EventBase(_Record):
    v: int = FORMAT_VERSION
    """The event format version the event was written in."""
    id: str = Field(default_factory=new_id)
    created_at: int = Field(default_factory=now_ms, description="milliseconds since the epoch")
    invocation_id: str | None = None
    agent_name: str | None = None


class UserEvent(EventBase):
    """A user's message."""

    type: Literal["user"] = "user"
    text: str


class AssistantEvent(EventBase):
    """What the model said; ``value`` holds structured output when the agent asks for it."""

    type: Literal["assistant"] = "assistant"
    text: str | None = None
    value: JsonValue = None


class ToolCallEvent(EventBase):
    """The model asked for a tool. ``error`` says why its arguments could not be decoded, if so."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)
    error: str | None = None


class ToolResultEvent(EventBase):
    """What a tool returned, or the error the model will see instead."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    result: JsonValue = None
    error: str | None = None


class ToolInputEvent(EventBase):
    """The answer to a yielded tool call, from a human or another system.

    ``principal`` is who gave it, as authenticated where it came in (the API's caller), so the audit says
    who approved; ``None`` for an answer given in-process, and in ledgers written before it was recorded.
    ``groups``: the groups the tool's ``answerable_by`` names that the answerer was in when it answered
    (``None``: the rule names none), so the ledger alone says why the rule admitted it.
    """

    type: Literal["tool_input"] = "tool_input"
    call_id: str
    name: str
    input: JsonValue = None
    principal: str | None = None
    groups: list[str] | None = None


class StateChange(_Record):
    key: str
    old_value: JsonValue = None
    new_value: JsonValue = None


class StateChangeEvent(EventBase):
    """One key of one scope changed (or, for ``observation``, was seen to hold a new value).

    ``scope_id`` is the id a shared scope is bound to (``None`` for ``session``, or for a
    shared scope that was seeded while unbound). ``new_value`` ``None`` means the key was deleted.
    ``schema_version`` is the scope's schema version the values were written under (0: before any
    migration, and every event written before versions existed); reads upcast older ones.
    ``call_id`` and ``tool`` name the tool call whose ``execute`` made a ``mutation`` (through its
    ``ctx.state``), so the audit can say which approved call set a value; ``None`` for any other write
    (from outside, by a context renderer), for an ``observation``, and in ledgers written before they
    were recorded (``dormant.audit`` infers them there). Optional: the event format stays 1.
    """

    type: Literal["state_change"] = "state_change"
    scope: str
    scope_id: str | None = None
    source: StateSource
    changes: list[StateChange]
    schema_version: int = 0
    call_id: str | None = None
    tool: str | None = None


class InvocationStartEvent(EventBase):
    type: Literal["invocation_start"] = "invocation_start"
    invocation_id: str
    agent_name: str
    deadline: int | None = None
    """When the runner that opened it stops (ms since the epoch): past it, with the invocation still open, the
    runner is gone and the sweeper ends or hands on the turn. ``None``: a runner with no deadline (``app.run``)."""
    principal: str | None = None
    """Who started it, as authenticated where the run came in (``answerable_by="starter"`` and four eyes read
    it); ``None`` for a run started in-process, and in ledgers written before it was recorded."""


class InvocationEndEvent(EventBase):
    type: Literal["invocation_end"] = "invocation_end"
    invocation_id: str
    status: InvocationStatus
    output_text: str | None = None
    output_value: JsonValue = None
    error: str | None = None
    error_type: str | None = None


class PendingCall(_Record):
    call_id: str
    name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)


class InvocationYieldEvent(EventBase):
    """The invocation paused: these calls wait for answers."""

    type: Literal["invocation_yield"] = "invocation_yield"
    invocation_id: str
    pending: list[PendingCall]


class InvocationResumeEvent(EventBase):
    type: Literal["invocation_resume"] = "invocation_resume"
    invocation_id: str
    deadline: int | None = None
    """The deadline of the runner that took the invocation on (see ``InvocationStartEvent.deadline``)."""


class ModelRef(_Record):
    provider: str
    name: str


class Usage(_Record):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class ModelStartEvent(EventBase):
    """A model call is about to be made.

    ``input`` records what each context renderer contributed: inline messages for what is not in
    the ledger (system prompts, rendered user turns) and, for history, the range of ledger events it
    was rendered from — so the exact messages can be rebuilt (``Session.model_input``) without the
    ledger holding the whole conversation again on every call. ``digest`` is the sha256 of the
    messages as sent, to check a rebuild against. ``tools`` are the tool definitions as sent.

    Nor the same prompt again on every call of an invocation: a system or user part identical to one an
    earlier ``model_start`` of the invocation holds is recorded as ``{"kind", "as_in": that event's id,
    "part": its position there}``, and tools identical to an earlier call's as ``tools_as_in`` (``tools``
    then empty). ``transcript.request_of`` resolves both; a reference always names the event holding the
    content, never another reference.
    """

    type: Literal["model_start"] = "model_start"
    invocation_id: str
    model: ModelRef
    input: list[dict[str, JsonValue]]
    message_count: int
    digest: str
    tools: list[dict[str, JsonValue]] = Field(default_factory=list)
    tools_as_in: str | None = None
    """The id of the earlier ``model_start`` of this invocation whose ``tools`` these were, the same list
    (``None``: ``tools`` holds them)."""


class SessionForkedEvent(EventBase):
    """This session began as a copy of another's ledger: which session, up to which event, and why.

    Appended to the fork (by ``Session.fork_at``, and by ``serving.commit`` when a run cannot join its
    session), after the copied events. ``at_event_id`` is the last event both ledgers share as stored
    (``None``: none).
    """

    type: Literal["session_forked"] = "session_forked"
    from_session_id: str
    at_event_id: str | None = None
    reason: str
    principal: str | None = None
    """Who forked it (``None``: in-process, a runner's own fork, or a ledger written before it was recorded)."""


class ModelEndEvent(EventBase):
    type: Literal["model_end"] = "model_end"
    invocation_id: str
    model: ModelRef
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    error: str | None = None
    error_type: str | None = None
    latency_ms: int | None = None


class AdkEvent(EventBase):
    """An event of a Google ADK agent, kept whole (``dormant.bridges.adk``, the ``dormant[adk]`` extra).

    ``event`` is ADK's ``Event`` as JSON (its ``model_dump(mode="json", exclude_none=True)``: ADK's own
    stored form), ``author`` its author. dormant's ``id`` is its own: ADK lets two different events share
    an id, a ledger does not. The state its ``actions.state_delta`` changed is recorded beside it as
    ``state_change`` events, so audit, time travel and erasure see ADK state like any other. Added in
    0.2 without a format change: no earlier event reads differently.
    """

    type: Literal["adk_event"] = "adk_event"
    author: str
    event: dict[str, JsonValue]


class LangGraphEvent(EventBase):
    """A LangGraph checkpointer's record (``dormant.bridges.langgraph``, the ``dormant[langgraph]`` extra).

    ``kind`` says which: a ``checkpoint`` (its id, parent, metadata and the checkpoint without its channel
    values), a ``blob`` (one channel's value at one channel version, serialized by the saver's serde: written
    once, when that version is new), the pending ``writes`` of one task, or the checkpoints ``removed`` by
    ``delete_for_runs`` or ``prune``. Added without a format change: no earlier event reads differently.
    """

    type: Literal["langgraph"] = "langgraph"
    kind: Literal["checkpoint", "blob", "writes", "removed"]
    checkpoint_ns: str = ""
    data: dict[str, JsonValue]


class OpenAIAgentsEvent(EventBase):
    """An OpenAI Agents SDK session item (``dormant.bridges.openai_agents``, the ``dormant[openai-agents]``
    extra): ``kind == "item"`` holds one item whole (or, with ``parts``, joins the JSON of the ``parts`` ``part``
    events before it: an item too large for one event); ``kind == "pop"`` removes the item event ``popped``
    (``pop_item``: the ledger keeps what was said, the session no longer shows it)."""

    type: Literal["openai_agents"] = "openai_agents"
    kind: Literal["item", "part", "pop"]
    item: JsonValue = None
    parts: int | None = None
    popped: str | None = None


Event: TypeAlias = Annotated[
    UserEvent
    | AssistantEvent
    | ToolCallEvent
    | ToolResultEvent
    | ToolInputEvent
    | StateChangeEvent
    | InvocationStartEvent
    | InvocationEndEvent
    | InvocationYieldEvent
    | InvocationResumeEvent
    | ModelStartEvent
    | ModelEndEvent
    | SessionForkedEvent
    | AdkEvent
    | LangGraphEvent
    | OpenAIAgentsEvent,
    Field(discriminator="type"),
]


@functools.cache
def _adapter() -> TypeAdapter[Event]:
    """The union's validator, built on the first parse (with the event models': they are deferred)."""
    return TypeAdapter(Event)


def parse_event(data: Any) -> Event:
    """Parse a dict (e.g. ``event.model_dump(mode="json")``) into its event class."""
    if isinstance(data, EventBase):
        return data  # type: ignore[return-value]
    try:
        return _adapter().validate_python(data)
    except ValidationError as exc:
        raise EventValidationError(_describe(exc, data), field=_loc(exc)) from exc


def parse_event_json(data: str | bytes) -> Event:
    """Parse an event from its JSON text (what the stores keep)."""
    try:
        return _adapter().validate_json(data)
    except ValidationError as exc:
        raise EventValidationError(_describe(exc, None), field=_loc(exc)) from exc


def _loc(exc: ValidationError) -> str | None:
    errors = exc.errors()
    if not errors:
        return None
    return ".".join(str(part) for part in errors[0]["loc"]) or None


def _describe(exc: ValidationError, data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else None
    first = exc.errors()[0] if exc.errors() else None
    where = _loc(exc)
    detail = first["msg"] if first else str(exc)
    what = f"event of type {kind!r}" if kind else "event"
    return f"not a valid {what}: {where + ': ' if where else ''}{detail}"
