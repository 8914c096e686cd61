"""Agents, tools and the run loop: the ledger of a run, renderers, yielding tools, and every failure path."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from dormant import adk, in_memory_store, openai
from dormant.audit import key_history
from dormant.errors import (
    AgentMismatch,
    AwaitingInput,
    ConfigurationError,
    InputError,
    StateValidationError,
    ToolInputError,
    UnknownCallId,
    ValueNotStorable,
    http_status,
)
from dormant.events import (
    InvocationEndEvent,
    InvocationResumeEvent,
    ModelEndEvent,
    ModelStartEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    UserEvent,
    parse_event_json,
)
from dormant.models.base import ModelRequest, ModelResponse, Usage
from dormant.testing import MockAdapter
from dormant.transcript import digest
from tests.support.examples import SEED, SORE_THROAT, triage


def types(events: Any) -> list[str]:
    return [e.type for e in events]


def results(session: Any) -> list[ToolResultEvent]:
    return [e for e in session.events if isinstance(e, ToolResultEvent)]


# -- the ledger of a run ----------------------------------------------------------------------


def test_a_run_records_every_step_in_order() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    run = t.app.run(t.agent, {"message": "I have a sore throat.", "initial_state": SEED})
    assert types(run.session.events) == [
        *["state_change"] * 3,
        "invocation_start",
        "user",
        "model_start",
        "model_end",
        "tool_call",
        "state_change",
        "state_change",
        "tool_result",
        "model_start",
        "model_end",
        "assistant",
        "invocation_end",
    ]
    assert run.events == list(run.session.events)
    invocation_events = [e for e in run.session.events if e.type not in ("state_change",) or e.invocation_id]
    assert {e.invocation_id for e in invocation_events} == {run.invocation_id}
    assert {e.agent_name for e in invocation_events} == {"triage"}
    assert run.session.status == "completed" and run.session.current_agent_name == "triage"


def test_model_start_and_end_record_what_was_sent_and_what_came_back() -> None:
    t = triage()
    t.model.set_responses(
        [
            {**SORE_THROAT[0], "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}},
            {**SORE_THROAT[1], "usage": {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25}},
        ]
    )
    run = t.app.run(t.agent, "I have a sore throat.")
    starts = [(i, e) for i, e in enumerate(run.session.events) if isinstance(e, ModelStartEvent)]
    ends = [e for e in run.session.events if isinstance(e, ModelEndEvent)]
    assert [e.message_count for _, e in starts] == [2, 4]
    assert starts[0][1].tools == [t.note_concern.definition()]
    assert starts[0][1].model.name == "gpt-5.6-luna"
    assert [(e.finish_reason, e.usage.total_tokens) for e in ends] == [("tool_calls", 13), ("stop", 25)]
    assert run.usage == Usage(input_tokens=30, output_tokens=8, total_tokens=38)
    # The exact messages the model got can be rebuilt from the ledger, and match what it was sent.
    for (index, start), request in zip(starts, t.model.requests, strict=True):
        rebuilt = run.session.model_input(index)
        assert rebuilt == request.messages == run.session.model_input(index)
        assert digest(rebuilt) == start.digest


def test_a_long_session_does_not_copy_the_conversation_into_every_model_start() -> None:
    t = triage()
    session = t.app.sessions.ephemeral()
    for n in range(30):
        t.model.set_responses([{"text": f"reply {n} " + "x" * 500}])
        t.app.run(t.agent, "y" * 500, session=session)
    sizes = [len(e.model_dump_json()) for e in session.events if isinstance(e, ModelStartEvent)]
    assert max(sizes) < 2_000  # a range reference, not 60 KB of history
    assert len(t.model.requests[-1].messages) == 1 + 59  # system + 29 turns of two messages + the new one


PROMPT = "You book appointments at a small clinic. " * 12  # an app's static prompt, as sent on every call


def prompt_app(store: Any = None) -> Any:
    """Three model calls in one invocation: a static prompt, a part that changes after the tool, tools."""
    scripted = MockAdapter()
    app = adk(name="prompts", adapters={"openai": scripted}, store=store)

    def note(ctx: Any) -> str:
        ctx.state.note = ctx.args.slot
        return "noted"

    noted = app.tool(name="note", description="Note a slot " + "with care " * 20, schema=Booking, execute=note)
    agent = app.agent(
        name="a",
        model=openai("m"),
        context=[
            app.context.system(PROMPT),
            app.context.system(lambda ctx: f"Noted so far: {ctx.state.get('note', 'nothing')}. " * 4),
            app.context.history(),
        ],
        tools=[noted],
    )
    return app, scripted, agent


def test_an_invocations_later_model_calls_hold_its_prompt_and_tools_by_reference() -> None:
    app, scripted, agent = prompt_app()
    scripted.set_responses(
        [
            {"tool_calls": [{"name": "note", "args": {"slot": "Tue"}}]},
            {"tool_calls": [{"name": "note", "args": {"slot": "Tue"}}]},
            {"text": "done"},
        ]
    )
    run = app.run(agent, "Book me.")
    starts = [(i, e) for i, e in enumerate(run.session.events) if isinstance(e, ModelStartEvent)]
    (_, first), (_, second), (_, third) = starts
    assert first.tools == [agent.tools[0].definition()] and first.tools_as_in is None
    assert [p.get("as_in") for p in first.input] == [None, None, None]
    # The static prompt and the tools: the first call's, by reference; the part that changed, inline.
    assert second.tools == [] and second.tools_as_in == first.id
    assert second.input[0] == {"kind": "system", "as_in": first.id, "part": 0}
    assert "messages" in second.input[1] and "Noted so far: Tue" in json.dumps(second.input[1])
    # Unchanged since the second call: the second's part; the rest name the event holding them, never a reference.
    assert third.tools_as_in == first.id and third.input[0] == second.input[0]
    assert third.input[1] == {"kind": "system", "as_in": second.id, "part": 1}
    for (index, start), request in zip(starts, scripted.requests, strict=True):
        assert request.tools == first.tools == run.session.model_tools(index)  # every tool on every call
        rebuilt = run.session.model_input(index)
        assert rebuilt == request.messages and digest(rebuilt) == start.digest
    sizes = [len(e.model_dump_json()) for _, e in starts]
    assert sizes[1] < sizes[0] / 2 and sizes[2] < sizes[1], sizes
    # Another invocation holds its own: its first call has the prompt and tools inline.
    scripted.set_responses([{"text": "again"}])
    again = app.run(agent, "And again.", session=run.session)
    [start] = [e for e in again.events if isinstance(e, ModelStartEvent)]
    assert start.tools == first.tools and [p.get("as_in") for p in start.input] == [None, None, None]


def test_a_resumed_invocation_in_another_process_refers_to_its_first_call(tmp_path: Any) -> None:
    from dormant.stores.sqlite import sqlite_store

    path = str(tmp_path / "s.db")
    app, scripted, agent, _ = approval_app(sqlite_store(path))
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "Tue"}, "call_id": "c"}]}])
    run = app.run(agent, "Book me.", session=app.sessions.create())
    app.sessions.commit(run.session)
    app2, scripted2, agent2, _ = approval_app(sqlite_store(path))
    session = app2.sessions.get(run.session.id)
    session.input.answer("c", {"approved": True})
    scripted2.set_responses([{"text": "Booked."}])
    resumed = app2.run(agent2, session=session)
    assert resumed.status == "completed"
    app2.sessions.commit(session)
    loaded = app2.sessions.get(run.session.id)  # a third reader: only what is stored
    first, second = (e for e in loaded.events if isinstance(e, ModelStartEvent))
    assert second.tools == [] and second.tools_as_in == first.id and first.tools
    index = loaded.event_index_of(second.id)
    assert loaded.model_input(index) == scripted2.requests[0].messages
    assert digest(loaded.model_input(index)) == second.digest
    assert loaded.model_tools(index) == scripted2.requests[0].tools == first.tools
    fork = loaded.fork_at(index)  # a fork holds what its references name
    assert fork.model_input(index) == scripted2.requests[0].messages


def test_a_reference_is_made_only_to_a_held_event_and_read_only_from_a_model_start() -> None:
    from dormant.errors import EventValidationError
    from dormant.transcript import by_reference, request_of

    tools: list[dict[str, Any]] = [{"name": "t", "description": "x" * 100}]
    part = {"kind": "system", "messages": [{"role": "system", "content": "p" * 200}]}
    holder = ModelStartEvent(
        invocation_id="i", model={"provider": "p", "name": "m"}, input=[part], message_count=1, digest="", tools=tools
    )
    previous = ModelStartEvent(
        invocation_id="i",
        model={"provider": "p", "name": "m"},
        input=[{"kind": "system", "as_in": holder.id, "part": 0}],
        message_count=1,
        digest="",
        tools_as_in=holder.id,
    )
    held = {holder.id: holder}
    assert by_reference([part], tools, previous, held.get) == (
        [{"kind": "system", "as_in": holder.id, "part": 0}],
        holder.id,
    )
    # The holder not held (a snapshot's tail starts after it): nothing to compare with, stored in full.
    assert by_reference([part], tools, previous, {}.get) == ([part], None)
    # Other content, or a part shorter than its reference: inline.
    other = {"kind": "system", "messages": [{"role": "system", "content": "q" * 200}]}
    short = {"kind": "system", "messages": [{"role": "system", "content": "p"}]}
    assert by_reference([other], [{"name": "u"}], previous, held.get) == ([other], None)
    assert by_reference([short], tools, holder.model_copy(update={"input": [short]}), {}.get)[0] == [short]
    assert request_of(previous, held.__getitem__) == ([part], tools)
    user = UserEvent(text="hi")
    with pytest.raises(EventValidationError) as caught:
        request_of(previous, {holder.id: user}.__getitem__)
    assert caught.value.field == "as_in"
    stray = previous.model_copy(update={"input": [{"kind": "system", "as_in": holder.id, "part": 3}]})
    with pytest.raises(EventValidationError) as caught:
        request_of(stray, held.__getitem__)
    assert caught.value.field == "part"


# -- renderers --------------------------------------------------------------------------------


def test_renderers_rebuild_the_input_from_the_ledger_and_state_reaches_it_only_through_them() -> None:
    scripted = MockAdapter()

    class S(BaseModel):
        secret: str = "hidden"
        mood: str = "calm"

    app = adk(name="render", schema={"session": S}, adapters={"openai": scripted})

    def set_secret(ctx: Any) -> str:
        ctx.state.secret = "s3cr3t"
        return "done"

    tool = app.tool(name="set_secret", description="", execute=set_secret)
    agent = app.agent(
        name="a",
        model={"provider": "openai", "name": "m"},
        context=[
            app.context.system(lambda ctx: f"The user is {ctx.state.mood}."),
            app.context.history(),
            app.context.user(lambda ctx: f"(mood: {ctx.state.mood})"),
        ],
        tools=[tool],
    )
    scripted.set_responses([{"tool_calls": [{"name": "set_secret", "args": {}}]}, {"text": "ok"}])
    run = app.run(agent, "hello")
    second = scripted.requests[1].messages
    assert [m.role for m in second] == ["system", "user", "assistant", "tool", "user"]
    assert second[0].content == "The user is calm." and second[-1].content == "(mood: calm)"
    assert all("s3cr3t" not in (m.content or "") for m in second)
    assert not any(isinstance(e, UserEvent) and e.text.startswith("(mood") for e in run.session.events)


def test_history_keeps_a_window_of_the_last_turns() -> None:
    scripted = MockAdapter()
    app = adk(name="window", adapters={"openai": scripted})
    agent = app.agent(name="a", model=openai("m"), context=[app.context.history(turns=2)])
    session = app.sessions.ephemeral()
    for n in range(4):
        scripted.set_responses([{"text": f"answer {n}"}])
        app.run(agent, f"question {n}", session=session)
    assert [m.content for m in scripted.requests[-1].messages] == ["question 2", "answer 2", "question 3"]


# -- models and adapters ----------------------------------------------------------------------


def test_a_run_beyond_the_script_ends_in_error_not_a_hang() -> None:
    t = triage()
    t.model.set_responses([SORE_THROAT[0]])  # the second model call has no script
    run = t.app.run(t.agent, "I have a sore throat.")
    assert run.status == "error"
    assert run.error_type == "ScriptExhausted" and "model call 2" in (run.error or "")
    end = run.session.events[-1]
    assert isinstance(end, InvocationEndEvent) and end.status == "error"
    assert results(run.session)[0].error is None  # the first step's tool still ran


def test_a_failing_adapter_ends_the_run_with_status_error_on_the_ledger() -> None:
    t = triage()
    t.model.set_responses([TimeoutError("upstream timed out")])
    run = t.app.run(t.agent, "hi")
    assert (run.status, run.error, run.error_type) == ("error", "upstream timed out", "TimeoutError")
    model_end = next(e for e in run.session.events if isinstance(e, ModelEndEvent))
    assert (model_end.error, model_end.error_type) == ("upstream timed out", "TimeoutError")
    assert types(run.session.events)[-3:] == ["model_start", "model_end", "invocation_end"]


def test_an_unknown_provider_is_a_recorded_error() -> None:
    app = adk(name="x")
    agent = app.agent(name="a", model={"provider": "acme", "name": "m"}, context=[app.context.history()])
    run = app.run(agent, "hi")
    assert run.status == "error" and run.error_type == "ConfigurationError" and "acme" in (run.error or "")


def test_adapters_override_the_provider_named_by_the_model() -> None:
    seen: list[ModelRequest] = []

    class Echo:
        def complete(self, request: ModelRequest) -> ModelResponse:
            seen.append(request)
            return ModelResponse(text=f"echo from {request.model.provider}/{request.model.name}")

    app = adk(name="x", adapters={"openai": Echo()})
    agent = app.agent(name="a", model=openai("gpt-x", temperature=0.1), context=[app.context.history()])
    run = app.run(agent, "hi")
    assert run.output.text == "echo from openai/gpt-x"
    assert seen[0].model.options == {"temperature": 0.1}


def test_a_renderer_that_raises_ends_the_run_with_error() -> None:
    scripted = MockAdapter([{"text": "never"}])
    app = adk(name="x", adapters={"openai": scripted})

    def broken(ctx: Any) -> str:
        raise RuntimeError("template bug")

    agent = app.agent(name="a", model=openai("m"), context=[app.context.system(broken)])
    run = app.run(agent, "hi")
    assert (run.status, run.error) == ("error", "template bug")
    assert scripted.requests == []


def test_structured_output_makes_output_value_a_validated_instance() -> None:
    class Verdict(BaseModel):
        urgent: bool
        reason: str

    scripted = MockAdapter([{"text": '{"urgent": true, "reason": "chest pain"}'}, {"text": "not json"}])
    app = adk(name="x", adapters={"openai": scripted})
    agent = app.agent(name="a", model=openai("m"), context=[app.context.history()], output=Verdict)
    run = app.run(agent, "hi")
    assert run.status == "completed" and run.output.value == Verdict(urgent=True, reason="chest pain")
    assert scripted.requests[0].output_schema == Verdict.model_json_schema()
    bad = app.run(agent, "again")
    assert bad.status == "error" and "Verdict" in (bad.error or "")


# -- tools: failures the model sees -----------------------------------------------------------


def make_tool_app(**agent_kwargs: Any) -> Any:
    scripted = MockAdapter()
    app = adk(name="tools", adapters={"openai": scripted})

    class Add(BaseModel):
        a: int
        b: int

    def add(ctx: Any) -> int:
        return int(ctx.args.a + ctx.args.b)

    def explode(ctx: Any) -> None:
        ctx.state.before_boom = True
        raise ValueError("kaboom")

    def weird(ctx: Any) -> object:
        return object()

    tools = [
        app.tool(name="add", description="Add two ints.", schema=Add, execute=add),
        app.tool(name="explode", description="", execute=explode),
        app.tool(name="weird", description="", execute=weird),
    ]
    agent = app.agent(name="a", model=openai("m"), context=[app.context.history()], tools=tools, **agent_kwargs)
    return app, scripted, agent


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            {"name": "add", "args": {"a": 1, "b": "two"}},
            "invalid arguments for add: b: Input should be a valid integer",
        ),
        ({"name": "add", "args": {"a": 1}}, "invalid arguments for add: b: Field required"),
        ({"name": "subtract", "args": {}}, "unknown tool 'subtract' (available: add, explode, weird)"),
        ({"name": "explode", "args": {}}, "explode failed: kaboom"),
        ({"name": "weird", "args": {}}, "weird returned a value that is not JSON"),
        ({"name": "add", "args": {}, "error": "Expecting value: line 1"}, "could not decode the arguments for add"),
    ],
)
def test_a_bad_tool_call_becomes_an_error_result_the_model_sees_and_the_run_goes_on(
    call: dict[str, Any], error: str
) -> None:
    app, scripted, agent = make_tool_app()
    scripted.set_responses([{"tool_calls": [call]}, {"text": "sorry about that"}])
    run = app.run(agent, "go")
    assert run.status == "completed" and run.output.text == "sorry about that"
    (result,) = results(run.session)
    assert result.error is not None and result.error.startswith(error)
    tool_message = scripted.requests[1].messages[-1]
    assert tool_message.role == "tool" and json.loads(tool_message.content or "") == {"error": result.error}


def test_a_tool_that_raises_keeps_the_writes_it_made_before() -> None:
    app, scripted, agent = make_tool_app()
    scripted.set_responses([{"tool_calls": [{"name": "explode", "args": {}}]}, {"text": "ok"}])
    run = app.run(agent, "go")
    assert run.state.before_boom is True
    assert [e.source for e in run.session.events if isinstance(e, StateChangeEvent)] == ["mutation"]


def test_several_tool_calls_in_one_turn_run_in_order() -> None:
    app, scripted, agent = make_tool_app()
    scripted.set_responses(
        [
            {
                "text": "Adding twice.",
                "tool_calls": [
                    {"name": "add", "args": {"a": 1, "b": 2}, "call_id": "c1"},
                    {"name": "add", "args": {"a": 3, "b": 4}, "call_id": "c2"},
                ],
            },
            {"text": "3 and 7"},
        ]
    )
    run = app.run(agent, "go")
    assert [(r.call_id, r.result) for r in results(run.session)] == [("c1", 3), ("c2", 7)]
    assistant_turn = scripted.requests[1].messages[1]
    assert assistant_turn.content == "Adding twice." and [c.call_id for c in assistant_turn.tool_calls] == ["c1", "c2"]


def test_max_steps_ends_the_run() -> None:
    app, scripted, agent = make_tool_app(max_steps=2)
    scripted.set_responses([{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 1}}]}] * 3)
    run = app.run(agent, "loop forever")
    assert run.status == "max_steps"
    assert len(scripted.requests) == 2 and scripted.remaining == 1
    assert types(run.session.events)[-2:] == ["tool_result", "invocation_end"]
    assert run.session.status == "max_steps"


def test_the_decorator_form_and_the_tool_definition() -> None:
    app = adk(name="x")

    class Query(BaseModel):
        """Search terms."""

        terms: str
        limit: int = 5

    @app.tool(description="Search the catalogue.", schema=Query)
    def search(ctx: Any) -> list[str]:
        return [ctx.args.terms] * ctx.args.limit

    assert search.name == "search" and app.tool_named("search") is search
    definition = search.definition()
    assert definition["name"] == "search" and definition["description"] == "Search the catalogue."
    assert definition["parameters"]["required"] == ["terms"]
    assert set(definition["parameters"]["properties"]) == {"terms", "limit"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name!", "description": "", "execute": lambda ctx: 1}, "tool name"),
        ({"name": "t", "description": "", "schema": dict, "execute": lambda ctx: 1}, "schema must be a pydantic"),
        ({"name": "t", "description": "", "execute": None}, "needs execute"),
    ],
)
def test_a_badly_defined_tool_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        adk(name="x").tool(**kwargs)


def test_two_different_tools_cannot_share_a_name() -> None:
    app = adk(name="x")
    app.tool(name="t", description="", execute=lambda ctx: 1)
    with pytest.raises(ConfigurationError, match="already has"):
        app.tool(name="t", description="", execute=lambda ctx: 2)


def test_temp_lives_only_inside_the_invocation() -> None:
    class Temp(BaseModel):
        scratch: list[int] = []

    scripted = MockAdapter()
    app = adk(name="x", schema={"temp": Temp}, adapters={"openai": scripted})

    def use_temp(ctx: Any) -> list[int]:
        ctx.state.temp.scratch = [*ctx.state.temp.scratch, 1]
        ctx.state.temp.scratch = [*ctx.state.temp.scratch, 2]
        return list(ctx.state.temp.scratch)

    agent = app.agent(
        name="a",
        model=openai("m"),
        context=[app.context.history()],
        tools=[app.tool(name="use_temp", description="", execute=use_temp)],
    )
    scripted.set_responses([{"tool_calls": [{"name": "use_temp", "args": {}}]}, {"text": "ok"}])
    run = app.run(agent, "go")
    assert results(run.session)[0].result == [1, 2]
    assert not any(isinstance(e, StateChangeEvent) for e in run.session.events)
    # A second invocation of the same session starts with temp empty again.
    scripted.set_responses([{"tool_calls": [{"name": "use_temp", "args": {}}]}, {"text": "ok"}])
    again = app.run(agent, "again", session=run.session)
    assert again.invocation_id != run.invocation_id
    assert [r.result for r in results(run.session)] == [[1, 2], [1, 2]]


# -- streaming and sessions -------------------------------------------------------------------


def test_stream_yields_the_events_as_they_land() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    session = t.app.sessions.ephemeral()
    stream = t.app.stream(t.agent, {"message": "I have a sore throat.", "initial_state": SEED}, session=session)
    seen = []
    for event in stream:
        seen.append(event)
        # Each event arrives once it is on the ledger, and before the run goes further.
        assert session.events[len(seen) - 1] is event
        if isinstance(event, ModelStartEvent):
            assert len(t.model.requests) == sum(isinstance(e, ModelStartEvent) for e in seen) - 1
    assert stream.result is not None and stream.result.status == "completed"
    assert seen == list(session.events)


def test_without_a_session_a_run_builds_an_ephemeral_one() -> None:
    t = triage()
    t.model.set_responses([{"text": "hi"}, {"text": "hi again"}])
    first = t.app.run(t.agent, "hello")
    second = t.app.run(t.agent, "hello")
    assert first.session.id != second.session.id and first.session.version == 0
    assert t.app.sessions.list() == []


# -- input checks: nothing written ------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_input", "error", "field"),
    [
        ({"mesage": "typo"}, InputError, "mesage"),
        ({"message": 42}, InputError, "message"),
        (42, InputError, "input"),
        ({"state": {"stage": "nope"}}, StateValidationError, "state.session.stage"),
        ({"initial_state": {"session": {"stage": "nope"}}}, StateValidationError, "initial_state.session.stage"),
        ({"initial_state": {"session": {"stagee": "intake"}}}, StateValidationError, "initial_state.session.stagee"),
        ({"state": {"stagee": "intake"}}, StateValidationError, "state.session.stagee"),
        ({"initial_state": {"session": "intake"}}, InputError, "initial_state.session"),
        ({"message": "a\x00b"}, ValueNotStorable, "message"),
        ({"initial_state": {"temp": {}}}, InputError, "initial_state.temp"),
        ({"answers": [{"call_id": "nope", "input": {}}]}, UnknownCallId, "answers.0.call_id"),
        ({"answers": "nope"}, InputError, "answers"),
    ],
)
def test_bad_run_input_raises_a_typed_error_naming_the_field_and_writes_nothing(
    bad_input: Any, error: type[Exception], field: str
) -> None:
    t = triage()
    session = t.app.sessions.ephemeral()
    with pytest.raises(error) as caught:
        t.app.run(t.agent, bad_input, session=session)
    assert caught.value.field == field  # type: ignore[attr-defined]
    assert list(session.events) == [] and t.model.requests == []


def test_a_state_change_names_the_tool_call_that_made_it_and_only_that() -> None:
    """``call_id`` and ``tool`` on a ``state_change``: set when a tool's ``execute`` wrote through its
    ``ctx.state`` (shared scopes too), absent for a write from outside, a renderer's, or an observation."""

    class Notes(BaseModel):
        note: str | None = None
        renders: int = 0

    class Profile(BaseModel):
        name: str = ""

    class Note(BaseModel):
        text: str

    def render(ctx: Any) -> str:
        ctx.state.renders = ctx.state.renders + 1  # a renderer's write: inside the invocation, no tool
        return "Take notes."

    def write(ctx: Any) -> str:
        ctx.state.note = ctx.args.text
        ctx.state.user.name = "Ada"
        return "noted"

    scripted = MockAdapter()
    app = adk(name="notes", schema={"session": Notes, "user": Profile}, adapters={"openai": scripted})
    tool = app.tool(name="write_note", description="", schema=Note, execute=write)
    agent = app.agent(name="a", model=openai("m"), context=[app.context.system(render)], tools=[tool])
    scripted.set_responses([{"tool_calls": [{"name": "write_note", "args": {"text": "hi"}}]}, {"text": "done"}])
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    app.store.save_scoped_state("notes", "user", "u-1", {"name": "Bo"})  # moved under it: observed
    run = app.run(agent, {"message": "note hi", "state": {"note": "seed"}}, session=session)
    assert run.status == "completed"
    [call] = [e for e in run.events if isinstance(e, ToolCallEvent)]
    made = [
        (e.source, e.scope, e.changes[0].key, e.call_id, e.tool) for e in run.events if isinstance(e, StateChangeEvent)
    ]
    assert made == [
        ("direct", "session", "note", None, None),
        ("mutation", "session", "renders", None, None),
        ("mutation", "session", "note", call.call_id, "write_note"),
        ("observation", "user", "name", None, None),  # what the tool saw stored ("Bo"): not its change
        ("mutation", "user", "name", call.call_id, "write_note"),
        ("mutation", "session", "renders", None, None),
    ]
    for event in run.events:  # kept through the JSON the stores hold
        assert parse_event_json(event.model_dump_json()) == event

    app.sessions.commit(session)
    stored = app.sessions.require("s-1")
    [history] = [c for c in key_history(stored.events, "session", "note") if c.source == "mutation"]
    assert (history.tool, history.call_id) == ("write_note", call.call_id)
    # cut between the tool's write and its result, a ledger can only say who wrote by recording it
    at = next(i for i, e in enumerate(stored.events) if isinstance(e, StateChangeEvent) and e.call_id)
    fork = stored.fork_at(at)
    [cut] = [c for c in key_history(fork.events, "session", "note") if c.source == "mutation"]
    assert (cut.tool, cut.call_id) == ("write_note", call.call_id)


# -- yielding tools ---------------------------------------------------------------------------


class Booking(BaseModel):
    slot: str


class Approval(BaseModel):
    approved: bool
    note: str | None = None


def approval_app(store: Any = None) -> Any:
    scripted = MockAdapter()
    app = adk(name="approvals", adapters={"openai": scripted}, store=store)
    executed: list[tuple[str, Any]] = []

    def book(ctx: Any) -> dict[str, Any]:
        executed.append((ctx.args.slot, ctx.input))
        if not ctx.input.approved:
            return {"booked": False, "why": ctx.input.note}
        ctx.state.booked = ctx.args.slot
        return {"booked": True, "slot": ctx.args.slot}

    tool = app.tool(
        name="book",
        description="Book a slot once a human approves.",
        schema=Booking,
        execute=book,
        yield_schema=Approval,
    )
    agent = app.agent(name="booker", model=openai("m"), context=[app.context.history()], tools=[tool])
    return app, scripted, agent, executed


def test_a_yielding_tool_pauses_the_run_and_resumes_in_another_process() -> None:
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "Tue 14:30"}, "call_id": "call-1"}]}])
    run = app.run(agent, "Book me Tuesday afternoon.")
    assert run.status == "yielded_tool" and executed == []
    assert [(y.call_id, y.name, y.args) for y in run.yielded_tools] == [("call-1", "book", {"slot": "Tue 14:30"})]
    assert run.session.status == "awaiting_input"
    assert types(run.session.events)[-1] == "invocation_yield"

    # Another process: it has only the JSON of the events, and its own app with the same tools.
    wire = json.dumps([e.model_dump(mode="json") for e in run.session.events])
    app2, scripted2, agent2, executed2 = approval_app()
    session = app2.sessions.from_events(json.loads(wire), session_id=run.session.id)
    assert session.status == "awaiting_input" and [y.call_id for y in session.yielded_tools] == ["call-1"]
    with pytest.raises(ToolInputError) as caught:
        session.input.answer("call-1", {"approved": "perhaps"})
    assert caught.value.field == "answers.0.input.approved"
    with pytest.raises(UnknownCallId):
        session.input.answer("call-2", {"approved": True})
    assert len(session.events) == len(run.session.events)  # the refused answers wrote nothing

    session.input.answer("call-1", {"approved": True, "note": "ok by Dr. Ray"})
    assert session.status == "resumable" and session.yielded_tools == []
    scripted2.set_responses([{"text": "Booked Tuesday 14:30."}])
    resumed = app2.run(agent2, session=session)
    assert resumed.status == "completed" and resumed.output.text == "Booked Tuesday 14:30."
    assert executed2 == [("Tue 14:30", Approval(approved=True, note="ok by Dr. Ray"))]
    assert resumed.state.booked == "Tue 14:30"
    [booked] = [e for e in resumed.events if isinstance(e, StateChangeEvent)]
    assert (booked.call_id, booked.tool) == ("call-1", "book")  # the approved call's write says so
    assert resumed.invocation_id == run.invocation_id  # the same invocation, resumed
    assert types(resumed.events) == [
        "invocation_resume",
        "state_change",  # the tool's write
        "tool_result",
        "model_start",
        "model_end",
        "assistant",
        "invocation_end",
    ]
    tool_message = scripted2.requests[0].messages[-1]
    assert tool_message.role == "tool" and json.loads(tool_message.content or "") == {
        "booked": True,
        "slot": "Tue 14:30",
    }
    answer = next(e for e in session.events if isinstance(e, ToolInputEvent))
    assert answer.input == {"approved": True, "note": "ok by Dr. Ray"} and answer.invocation_id == run.invocation_id


@pytest.mark.parametrize(
    ("answer", "where"),
    [
        ({"approved": "perhaps"}, "approved"),
        ({}, "approved"),
        ({"approved": True, "note": 5}, "note"),
        (None, "input"),
        ("yes", "input"),
        ([True], "input"),
        # what lax validation would coerce to True: an approval is a record that a human sent true
        ({"approved": 1}, "approved"),
        ({"approved": 1.0}, "approved"),
        ({"approved": "yes"}, "approved"),
        ({"approved": "true"}, "approved"),
        ({"approved": 0}, "approved"),
        ({"approved": True, "note": 5.5}, "note"),
        ({"approved": True, "note": object()}, "input"),  # not JSON at all
    ],
)
def test_a_yield_answer_is_validated_against_its_schema_as_strict_json(answer: Any, where: str) -> None:
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    session = app.run(agent, "Book x.").session
    before = list(session.events)
    field = "answers.0.input" if where == "input" else f"answers.0.input.{where}"
    for attempt in (
        lambda: session.input.answer("c", answer),
        lambda: app.run(agent, {"answers": [{"call_id": "c", "input": answer}]}, session=session),
    ):
        with pytest.raises(ToolInputError) as caught:
            attempt()
        error = caught.value
        assert (error.call_id, error.tool, error.field) == ("c", "book", field)
        assert str(error).startswith(f"invalid answer for book call c: {where}")
    assert session.events == before and session.status == "awaiting_input" and executed == []
    assert len(scripted.requests) == 1


_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_JSON_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6
)
_LAX_BOOLS = st.sampled_from([0, 1, 0.0, 1.0, "0", "1", "true", "false", "True", "yes", "no", "on", "off", "t", "f"])
"""What pydantic's lax mode would read as a bool."""
_FIELD = _LAX_BOOLS | _SCALARS | _JSON_VALUES


@functools.cache
def _awaiting_approval() -> tuple[Any, str, list[dict[str, Any]]]:
    """An app and the JSON of a session waiting on call ``c`` of ``book`` (its answer: ``Approval``)."""
    app, scripted, agent, _ = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    session = app.run(agent, "Book x.").session
    return app, session.id, [e.model_dump(mode="json") for e in session.events]


@given(_JSON_VALUES | st.fixed_dictionaries({"approved": _FIELD}, optional={"note": _FIELD, "unknown": _JSON_VALUES}))
def test_any_json_answer_is_recorded_exactly_when_it_is_an_approval_as_sent(answer: Any) -> None:
    """The oracle is the JSON types themselves, not pydantic: ``approved`` a JSON boolean, ``note`` a
    string or null (or absent), no other key (an answer is as strict as a request: an unknown key would be
    dropped, what it said lost); anything else is refused, naming where, with nothing written."""
    app, session_id, wire = _awaiting_approval()
    session = app.sessions.from_events(wire, session_id=session_id)
    is_approval = (
        isinstance(answer, dict)
        and isinstance(answer.get("approved"), bool)
        and (answer.get("note") is None or isinstance(answer["note"], str))
        and set(answer) <= {"approved", "note"}
    )
    if is_approval:
        event = session.input.answer("c", answer)
        assert event.input == {"approved": answer["approved"], "note": answer.get("note")}
        assert session.events[-1] is event
    else:
        with pytest.raises(ToolInputError) as caught:
            session.input.answer("c", answer)
        assert caught.value.field is not None and caught.value.field.startswith("answers.0.input")
        assert len(session.events) == len(wire) and session.status == "awaiting_input"


def test_a_yield_answer_is_recorded_in_its_schemas_json_form() -> None:
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    session = app.run(agent, "Book x.").session
    event = session.input.answer("c", Approval(approved=True))  # a model instance: validated as its JSON
    assert event.input == {"approved": True, "note": None}
    scripted.set_responses([{"text": "done"}])
    app.run(agent, session=session)
    assert executed == [("x", Approval(approved=True, note=None))]  # execute gets the typed answer


def test_an_answer_with_a_key_besides_call_id_and_input_is_refused_and_writes_nothing() -> None:
    """A misspelt "input" would answer the call with nothing: refused, as POST /tools refuses it."""
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    session = app.run(agent, "Book x.").session
    before = len(session.events)
    with pytest.raises(InputError, match="not 'inptu'") as caught:
        app.run(agent, {"answers": [{"call_id": "c", "inptu": {"approved": True}}]}, session=session)
    assert caught.value.field == "answers.0.inptu" and len(session.events) == before and executed == []


def test_the_same_call_answered_twice_in_one_batch_says_so() -> None:
    app, scripted, agent, _ = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    session = app.run(agent, "Book x.").session
    twice = [{"call_id": "c", "input": {"approved": True}}, {"call_id": "c", "input": {"approved": False}}]
    with pytest.raises(InputError, match="'c' is answered twice in this batch") as caught:
        session.input.answers(twice)
    assert caught.value.field == "answers.1" and session.yielded_tools[0].call_id == "c"


def test_the_answers_0_1_names_still_answer_for_a_release_warning_and_naming_their_own_field() -> None:
    """0.1 called the answers ``tools`` (``docs/concepts.md``): ``{"tools": [...]}``, ``session.input.tool`` and
    ``session.input.tools`` still answer, each with a ``DeprecationWarning`` naming the new name, and their errors
    name the field the caller sent (``tools.N``); ``answers`` and ``tools`` together are refused."""
    app, scripted, agent, executed = approval_app()
    calls = [{"name": "book", "args": {"slot": s}, "call_id": s} for s in ("a", "b", "c")]
    scripted.set_responses([{"tool_calls": calls}, {"text": "done"}])
    session = app.run(agent, "Book three.").session
    renamed = "'tools' is deprecated: name the answers 'answers'"
    with pytest.warns(DeprecationWarning, match=renamed), pytest.raises(UnknownCallId) as caught:
        app.run(agent, {"tools": [{"call_id": "nope", "input": {}}]}, session=session)
    assert caught.value.field == "tools.0.call_id"
    with pytest.raises(InputError, match="under answers, not tools as well") as both:
        app.run(agent, {"answers": [], "tools": []}, session=session)
    assert both.value.field == "tools"
    with pytest.warns(DeprecationWarning, match=r"session\.input\.tool is deprecated: use session\.input\.answer"):
        session.input.tool("a", {"approved": True})
    renamed = r"session\.input\.tools is deprecated: use session\.input\.answers"
    with pytest.warns(DeprecationWarning, match=renamed), pytest.raises(ToolInputError) as refused:
        session.input.tools([{"call_id": "b", "input": {"approved": "maybe"}}])
    assert refused.value.field == "tools.0.input.approved"
    with pytest.warns(DeprecationWarning, match="'tools' is deprecated"):
        done = app.run(
            agent, {"tools": [{"call_id": c, "input": {"approved": True}} for c in ("b", "c")]}, session=session
        )
    assert done.status == "completed" and [slot for slot, _ in executed] == ["a", "b", "c"]


def test_two_pending_calls_answered_in_two_separate_resumes() -> None:
    app, scripted, agent, executed = approval_app()
    scripted.set_responses(
        [
            {
                "tool_calls": [
                    {"name": "book", "args": {"slot": "Mon 09:00"}, "call_id": "a"},
                    {"name": "book", "args": {"slot": "Wed 16:00"}, "call_id": "b"},
                ]
            }
        ]
    )
    run = app.run(agent, "Book both.")
    session = run.session
    assert [y.call_id for y in run.yielded_tools] == ["a", "b"]

    first = app.run(
        agent, {"answers": [{"call_id": "b", "input": {"approved": False, "note": "clash"}}]}, session=session
    )
    assert first.status == "yielded_tool" and [y.call_id for y in first.yielded_tools] == ["a"]
    assert executed == [("Wed 16:00", Approval(approved=False, note="clash"))]
    assert session.status == "awaiting_input" and scripted.requests[1:] == []  # the model waits for both
    # Replayed, the ledger says the same at every step: resumed with a call still pending is awaiting input.
    resume = next(i for i, e in enumerate(session.events) if isinstance(e, InvocationResumeEvent))
    assert types(first.events)[:3] == ["tool_input", "invocation_resume", "tool_result"]
    assert session.state_at(resume).status == "awaiting_input"
    assert [y.call_id for y in session.state_at(resume).yielded_tools] == ["a"]
    assert session.state_at(resume - 1).status == "awaiting_input"  # b answered, a still waits
    assert session.state_at(-1).status == session.status == "awaiting_input"

    scripted.set_responses([{"text": "Booked Monday; Wednesday was declined."}])
    second = app.run(agent, {"answers": [{"call_id": "a", "input": {"approved": True}}]}, session=session)
    assert second.status == "completed" and second.output.text.startswith("Booked Monday")
    assert [r.call_id for r in results(session)] == ["b", "a"]
    assert session.state.booked == "Mon 09:00"
    # The model saw both results, each answering its own call.
    tool_messages = [m for m in scripted.requests[-1].messages if m.role == "tool"]
    assert sorted(m.tool_call_id for m in tool_messages) == ["a", "b"]


def test_a_message_while_every_call_still_waits_is_refused_and_writes_nothing() -> None:
    """Nothing could act on it, and kept for the resume it sat between the call and its result in the
    transcript, which no provider accepts: the caller answers the calls first (``AwaitingInput``)."""
    app, scripted, agent, _ = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}, {"text": "ok"}])
    run = app.run(agent, "Book x.")
    before = len(run.session.events)
    with pytest.raises(AwaitingInput) as caught:
        app.run(agent, "Any news?", session=run.session)
    assert (caught.value.field, caught.value.call_ids) == ("message", ["c"])
    assert http_status(caught.value) == 409
    assert len(run.session.events) == before and len(scripted.requests) == 1
    again = app.run(agent, session=run.session)  # no input: nothing to do, nothing written
    assert again.status == "yielded_tool" and [y.call_id for y in again.yielded_tools] == ["c"]
    assert len(run.session.events) == before
    done = app.run(agent, {"answers": [{"call_id": "c", "input": {"approved": True}}]}, session=run.session)
    assert done.status == "completed"
    sent = scripted.requests[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]  # the call's result follows the call


def test_a_message_sent_with_the_answers_follows_the_results_of_the_calls_it_answers() -> None:
    """The ledger keeps the order the model needs: call, its result, then the user's new message."""
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}, {"text": "ok"}])
    run = app.run(agent, "Book x.")
    answer = [{"call_id": "c", "input": {"approved": True}}]
    done = app.run(agent, {"answers": answer, "message": "and send me a reminder"}, session=run.session)
    assert done.status == "completed" and len(executed) == 1
    assert types(done.events)[:5] == ["tool_input", "invocation_resume", "state_change", "tool_result", "user"]
    sent = scripted.requests[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[-1].content == "and send me a reminder"


def test_a_message_with_answers_that_leave_a_call_waiting_is_refused_and_writes_nothing() -> None:
    """The waiting call's result would land after the message: the caller answers every call first."""
    app, scripted, agent, executed = approval_app()
    calls = [{"name": "book", "args": {"slot": s}, "call_id": s} for s in ("a", "b")]
    scripted.set_responses([{"tool_calls": calls}])
    run = app.run(agent, "Book a and b.")
    before = len(run.session.events)
    with pytest.raises(AwaitingInput) as caught:
        app.run(
            agent, {"answers": [{"call_id": "a", "input": {"approved": True}}], "message": "hi"}, session=run.session
        )
    assert caught.value.call_ids == ["b"] and executed == []
    assert len(run.session.events) == before


def test_a_yielding_tool_without_execute_returns_the_answer() -> None:
    scripted = MockAdapter([{"tool_calls": [{"name": "ask_human", "args": {}, "call_id": "q"}]}, {"text": "thanks"}])
    app = adk(name="x", adapters={"openai": scripted})
    ask = app.tool(name="ask_human", description="", execute=None, yield_schema=Approval)
    agent = app.agent(name="a", model=openai("m"), context=[app.context.history()], tools=[ask])
    run = app.run(agent, "go")
    run.session.input.answer("q", {"approved": True})
    done = app.run(agent, session=run.session)
    assert done.status == "completed" and results(done.session)[0].result == {"approved": True, "note": None}


def test_a_yielding_tool_called_with_bad_arguments_fails_at_once_instead_of_waiting() -> None:
    app, scripted, agent, executed = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": 42}}]}, {"text": "let me fix that"}])
    run = app.run(agent, "Book slot 42.")
    assert run.status == "completed" and run.yielded_tools == [] and executed == []
    (result,) = results(run.session)
    assert (result.error or "").startswith("invalid arguments for book: slot")


def test_resuming_with_another_agent_is_refused() -> None:
    app, scripted, agent, _ = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    run = app.run(agent, "Book x.")
    other = app.agent(name="other", model=openai("m"), context=[])
    with pytest.raises(AgentMismatch):
        app.run(other, {"answers": [{"call_id": "c", "input": {"approved": True}}]}, session=run.session)
    assert run.session.yielded_tools[0].call_id == "c"  # nothing was written


def test_a_user_message_outside_a_run() -> None:
    app, scripted, agent, _ = approval_app()
    session = app.sessions.ephemeral()
    event = session.input.message("hello")
    assert isinstance(event, UserEvent) and event.invocation_id is None
    scripted.set_responses([{"text": "hi"}])
    app.run(agent, session=session)
    assert [m.content for m in scripted.requests[0].messages] == ["hello"]


def test_tool_call_events_carry_the_call() -> None:
    app, scripted, agent = make_tool_app()
    scripted.set_responses([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 2}}]}, {"text": "4"}])
    run = app.run(agent, "go")
    call = next(e for e in run.session.events if isinstance(e, ToolCallEvent))
    (result,) = results(run.session)
    assert call.args == {"a": 2, "b": 2} and call.call_id == result.call_id and result.result == 4


def test_shipped_adapters_are_built_once_per_provider_and_options_even_with_object_options() -> None:
    pytest.importorskip("openai")
    app = adk(name="x")
    client = object()
    first = app.adapter_for(openai("m1", client=client, temperature=0))
    assert app.adapter_for(openai("m2", client=client, temperature=0)) is first  # the model name is per request
    assert app.adapter_for(openai("m1", client=object(), temperature=0)) is not first
    assert app.adapter_for(openai("m1", client=client, temperature=1)) is not first


def test_a_fork_taken_mid_invocation_resumes_it_when_run() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    run = t.app.run(t.agent, {"message": "I have a sore throat.", "initial_state": SEED})
    call_index = next(i for i, e in enumerate(run.session.events) if isinstance(e, ToolCallEvent))
    fork = run.session.fork_at(call_index)
    assert fork.status == "resumable"  # paused where it was cut, not "running" with no runner (issue 23)
    t.model.set_responses([{"text": "Noted, on the other branch."}])
    again = t.app.run(t.agent, session=fork)
    assert again.status == "completed" and again.invocation_id == run.invocation_id
    assert types(again.events)[:2] == ["invocation_resume", "state_change"]  # the pending call ran first
    assert (fork.state.stage, fork.state.concerns) == ("collecting", ["sore throat"])
    assert fork.output.text == "Noted, on the other branch."
    assert run.session.output.text == "Noted a sore throat. Anything else?"


def test_answering_a_call_whose_tool_this_process_does_not_know_is_a_configuration_error() -> None:
    app, scripted, agent, _ = approval_app()
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c"}]}])
    run = app.run(agent, "Book x.")
    stranger = adk(name="approvals")  # the same app name, without the tool
    session = stranger.sessions.from_events([e.model_dump(mode="json") for e in run.session.events])
    with pytest.raises(ConfigurationError, match="tool 'book' is not registered"):
        session.input.answer("c", {"approved": True})
    assert len(session.events) == len(run.session.events)


# -- work done once -----------------------------------------------------------------------------


def test_a_run_loads_each_shared_scope_once_and_checks_its_input_state_once() -> None:
    checked: list[str] = []

    class Chart(BaseModel):
        stage: str = "intake"

        @field_validator("stage")
        @classmethod
        def _count(cls, value: str) -> str:
            checked.append(value)
            return value

    class Profile(BaseModel):
        name: str = "friend"
        visits: int = 0

    store = in_memory_store()
    loads: list[tuple[str, str]] = []
    load = store.load_scoped_state

    def counting_load(app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        loads.append((scope, scope_id))
        return load(app_name, scope, scope_id)

    store.load_scoped_state = counting_load  # type: ignore[method-assign]
    scripted = MockAdapter()
    app = adk(name="once", schema={"session": Chart, "user": Profile}, store=store, adapters={"openai": scripted})

    def visit(ctx: Any) -> int:
        ctx.state.user.visits = ctx.state.user.visits + 1
        return int(ctx.state.user.visits)

    agent = app.agent(
        name="a", model=openai("m"), context=[], tools=[app.tool(name="visit", description="", execute=visit)]
    )
    scripted.set_responses([{"tool_calls": [{"name": "visit", "args": {}}]}, {"text": "ok"}])
    session = app.sessions.create(scopes={"user": "u-1"})
    run = app.run(
        agent,
        {"message": "hi", "state": {"stage": "collecting"}, "initial_state": {"user": {"name": "Ada"}}},
        session=session,
    )
    assert run.status == "completed" and results(session)[0].result == 1
    assert loads == [("user", "u-1")]  # seeding and the invocation's reads share one load
    assert checked == ["collecting"]  # input["state"] is validated once, then recorded
    assert session.state.stage == "collecting"


def test_max_steps_counts_model_calls_across_resumes() -> None:
    app, scripted, agent, _ = approval_app()
    agent.max_steps = 2
    ask = {"tool_calls": [{"name": "book", "args": {"slot": "x"}, "call_id": "c1"}]}
    scripted.set_responses([ask])
    session = app.run(agent, "Book x.").session
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {"slot": "y"}, "call_id": "c2"}]}])
    resumed = app.run(agent, {"answers": [{"call_id": "c1", "input": {"approved": True}}]}, session=session)
    assert resumed.status == "yielded_tool"  # the second model call asked again
    scripted.set_responses([{"text": "never asked"}])
    last = app.run(agent, {"answers": [{"call_id": "c2", "input": {"approved": True}}]}, session=session)
    assert last.status == "max_steps" and len(scripted.requests) == 2
    assert session.projection.invocations[last.invocation_id].model_calls == 2


def test_a_models_json_schema_is_built_once_and_shared() -> None:
    """The loop sends an agent's output schema on every model call, the API a yield's on every view."""
    from dormant.agents.tools import json_schema

    class Verdict(BaseModel):
        approved: bool

    first = json_schema(Verdict)
    assert first == Verdict.model_json_schema() and json_schema(Verdict) is first
