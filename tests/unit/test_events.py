"""Events: JSON round-trips, forward compatibility, typed parse errors."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dormant.errors import EventValidationError
from dormant.events import (
    AdkEvent,
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    LangGraphEvent,
    ModelEndEvent,
    ModelRef,
    ModelStartEvent,
    OpenAIAgentsEvent,
    PendingCall,
    SessionForkedEvent,
    StateChange,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    Usage,
    UserEvent,
    parse_event,
    parse_event_json,
)

MODEL = ModelRef(provider="openai", name="m")
ONE_OF_EACH: list[Event] = [
    UserEvent(text="hi"),
    AssistantEvent(text="hello", value={"a": [1, 2]}, invocation_id="i", agent_name="a"),
    ToolCallEvent(call_id="c", name="t", args={"x": 1}, invocation_id="i"),
    ToolResultEvent(call_id="c", name="t", result={"ok": True}, invocation_id="i"),
    ToolResultEvent(call_id="c2", name="t", error="boom", invocation_id="i"),
    ToolInputEvent(call_id="c", name="t", input={"approved": True}),
    StateChangeEvent(
        scope="user", scope_id="u-1", source="mutation", changes=[StateChange(key="k", old_value=1, new_value=None)]
    ),
    InvocationStartEvent(invocation_id="i", agent_name="a"),
    InvocationEndEvent(invocation_id="i", status="completed", output_text="done", output_value=[1]),
    InvocationYieldEvent(invocation_id="i", pending=[PendingCall(call_id="c", name="t", args={"y": "z"})]),
    InvocationResumeEvent(invocation_id="i"),
    ModelStartEvent(
        invocation_id="i",
        model=MODEL,
        input=[{"kind": "system", "messages": [{"role": "system", "content": "x"}]}],
        message_count=1,
        digest="d",
        tools=[{"name": "t", "description": "", "parameters": {"type": "object"}}],
    ),
    ModelEndEvent(invocation_id="i", model=MODEL, usage=Usage(input_tokens=3, output_tokens=4, total_tokens=7)),
    SessionForkedEvent(from_session_id="s-1", at_event_id="e-9", reason="both wrote session.stage"),
    AdkEvent(author="user", event={"id": "e-1", "author": "user", "content": {"parts": [{"text": "hi"}]}}),
    LangGraphEvent(kind="checkpoint", checkpoint_ns="child:1", data={"id": "c-1", "parent": None, "metadata": {}}),
    OpenAIAgentsEvent(kind="item", item={"role": "user", "content": "hi"}),
    OpenAIAgentsEvent(kind="pop", popped="e-2"),
]


def test_every_event_type_is_covered() -> None:
    union = get_args(get_args(Event)[0])  # Annotated[A | B | ..., Field(discriminator="type")]
    types = {cls.model_fields["type"].default for cls in union}
    assert len(types) == len(union) >= 13
    assert {e.type for e in ONE_OF_EACH} == types


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: e.type)
def test_json_round_trip_is_lossless(event: Any) -> None:
    data = event.model_dump(mode="json")
    again = parse_event(json.loads(json.dumps(data)))
    assert type(again) is type(event)
    assert again == event
    assert parse_event_json(event.model_dump_json()) == event


def test_every_event_has_id_type_and_created_at_in_ms() -> None:
    event = UserEvent(text="x")
    assert event.id and event.type == "user"
    assert 1_600_000_000_000 < event.created_at < 10_000_000_000_000
    assert UserEvent(text="x").id != event.id


def test_an_unknown_extra_field_from_a_newer_version_is_kept() -> None:
    data = UserEvent(text="hi").model_dump(mode="json") | {"sentiment": {"score": 0.9}}
    event = parse_event(data)
    assert isinstance(event, UserEvent) and event.text == "hi"
    assert event.model_dump(mode="json")["sentiment"] == {"score": 0.9}


def test_events_are_frozen() -> None:
    event = UserEvent(text="hi")
    with pytest.raises(ValidationError, match="frozen") as caught:
        event.text = "changed"  # type: ignore[misc]
    assert caught.value.errors()[0]["type"] == "frozen_instance"
    assert event.text == "hi"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "user"}, "user.text"),
        ({"type": "tool_call", "call_id": "c"}, "tool_call.name"),
        ({"type": "telepathy", "id": "x"}, None),
        ({"text": "no type"}, None),
    ],
)
def test_a_bad_dict_is_a_typed_error_naming_the_field(data: dict[str, Any], field: str | None) -> None:
    with pytest.raises(EventValidationError) as caught:
        parse_event(data)
    if field is not None:
        assert caught.value.field == field


def test_bad_json_is_a_typed_error() -> None:
    with pytest.raises(EventValidationError):
        parse_event_json("{not json")


def test_the_event_classes_and_parser_are_exported() -> None:
    """From ``dormant.events``; ``dormant``'s 0.1 names for them are deprecated aliases for a release."""
    import dormant.events

    for name in ("UserEvent", "AssistantEvent", "ToolCallEvent", "StateChangeEvent", "parse_event", "Event"):
        assert name in dormant.events.__all__
        with pytest.warns(DeprecationWarning, match="dormant.events"):
            assert getattr(dormant, name) is getattr(dormant.events, name)
    assert dormant.events.UserEvent is UserEvent


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(key=st.text(min_size=1), old=json_values, new=json_values, text=st.text())
def test_any_json_payload_round_trips(key: str, old: Any, new: Any, text: str) -> None:
    for event in (
        StateChangeEvent(
            scope="session", source="direct", changes=[StateChange(key=key, old_value=old, new_value=new)]
        ),
        ToolResultEvent(call_id="c", name="t", result=new),
        UserEvent(text=text),
    ):
        assert parse_event_json(event.model_dump_json()) == event
        assert parse_event(json.loads(json.dumps(event.model_dump(mode="json")))) == event


def test_events_carry_their_format_version_and_one_stored_without_it_is_format_1() -> None:
    from dormant.events import FORMAT_VERSION

    data = UserEvent(text="hi").model_dump(mode="json")
    assert data["v"] == FORMAT_VERSION == 1
    del data["v"]
    assert parse_event(data).v == 1
    assert parse_event(data | {"v": 2}).v == 2  # a newer format is kept as written, not refused
