"""The OpenAI adapter against a real HTTP server speaking Chat Completions, through real ``adk()`` apps.

The server runs on 127.0.0.1 and answers from a per-test script; it records the raw requests the
official SDK sent, so the assertions are about what a provider would actually have received.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import pytest

pytest.importorskip("openai")  # the `openai` extra
from pydantic import BaseModel, ConfigDict

from dormant import App, adk, openai
from dormant.errors import ConfigurationError
from dormant.events import (
    InvocationEndEvent,
    ModelEndEvent,
    ModelStartEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from dormant.models.base import Message, ModelRequest, ModelSpec
from dormant.models.openai import OpenAIAdapter, OpenAIMalformedResponse
from dormant.transcript import digest
from tests.support.examples import noted_a_sore_throat, of_type, triage
from tests.support.fake_model_server import FakeModelServer, Reply, running

KEY = "sk-test-key"
FAST = {"retry-after-ms": "5"}  # the SDK honours Retry-After; real servers send it with 429s and 5xx


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with running() as fake:
        yield fake


def model(server: FakeModelServer, name: str = "gpt-test", **options: Any) -> ModelSpec:
    options.setdefault("api_key", KEY)
    return openai(name, base_url=f"{server.url}/v1", **options)


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    finish: str | None = None,
    usage: tuple[int, int] = (11, 7),
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return Reply(
        200,
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        },
    )


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


# -- an app with tools and state -----------------------------------------------------------------


def triage_app(spec: ModelSpec, **agent_options: Any) -> tuple[App, Any]:
    t = triage(model=spec, adapters={}, **agent_options)
    return t.app, t.agent


# -- plain text, usage and finish reason ---------------------------------------------------------


def test_plain_text_answer_records_usage_and_finish_reason(server: FakeModelServer) -> None:
    server.script([completion("Hello! How can I help?", usage=(21, 5), finish="stop")])
    app, agent = triage_app(model(server))

    run = app.run(agent, "hi")

    assert run.status == "completed"
    assert run.output.text == "Hello! How can I help?"
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.json["model"] == "gpt-test"
    assert sent.json["messages"] == [
        {"role": "system", "content": "Log every concern with note_concern."},
        {"role": "user", "content": "hi"},
    ]
    assert sent.json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "note_concern",
                "description": "Record one concern.",
                "parameters": {
                    "type": "object",
                    "properties": {"concern": {"title": "Concern", "type": "string"}},
                    "required": ["concern"],
                },
            },
        }
    ]
    assert "response_format" not in sent.json
    [end] = of_type(run.events, ModelEndEvent)
    assert (end.usage.input_tokens, end.usage.output_tokens, end.usage.total_tokens) == (21, 5, 26)
    assert end.finish_reason == "stop"
    assert end.error is None
    assert run.usage.total_tokens == 26


def test_length_finish_reason_is_recorded_as_sent(server: FakeModelServer) -> None:
    server.script([completion("Truncat", finish="length")])
    app, agent = triage_app(model(server, max_tokens=3))

    run = app.run(agent, "tell me everything")

    assert run.status == "completed"
    assert server.requests[0].json["max_tokens"] == 3
    [end] = of_type(run.events, ModelEndEvent)
    assert end.finish_reason == "length"


# -- tool calls -------------------------------------------------------------------------------


def test_one_tool_call_runs_the_tool_and_sends_its_result_back(server: FakeModelServer) -> None:
    server.script(
        [
            completion(None, [call("call_a1", "note_concern", {"concern": "sore throat"})]),
            completion("Noted a sore throat."),
        ]
    )
    app, agent = triage_app(model(server))

    run = app.run(agent, "I have a sore throat.")

    assert noted_a_sore_throat(run, "call_a1").error is None
    second = server.requests[1].json["messages"]
    assert second[-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a1",
                    "type": "function",
                    "function": {"name": "note_concern", "arguments": '{"concern": "sore throat"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a1", "content": '{"concerns": ["sore throat"]}'},
    ]
    ends = of_type(run.events, ModelEndEvent)
    assert [e.finish_reason for e in ends] == ["tool_calls", "stop"]


def test_several_tool_calls_in_one_turn_land_on_the_ledger_in_order(server: FakeModelServer) -> None:
    server.script(
        [
            completion(
                "Logging both.",
                [
                    call("call_1", "note_concern", {"concern": "fever"}),
                    call("call_2", "note_concern", {"concern": "cough"}),
                ],
            ),
            completion("Noted a fever and a cough."),
        ]
    )
    app, agent = triage_app(model(server))

    run = app.run(agent, "I have a fever and a cough.")

    assert run.status == "completed"
    assert run.state.concerns == ["fever", "cough"]
    kinds = [e.type for e in run.events if e.type in ("assistant", "tool_call", "tool_result", "state_change")]
    assert kinds == [
        "assistant",
        "tool_call",
        "tool_call",
        "state_change",
        "state_change",
        "tool_result",
        "state_change",
        "tool_result",
        "assistant",
    ]
    assert [(c.call_id, c.args) for c in of_type(run.events, ToolCallEvent)] == [
        ("call_1", {"concern": "fever"}),
        ("call_2", {"concern": "cough"}),
    ]
    changes = [(c.key, c.new_value) for e in of_type(run.events, StateChangeEvent) for c in e.changes]
    assert changes == [
        ("concerns", ["fever"]),
        ("stage", "collecting"),
        ("concerns", ["fever", "cough"]),
    ]
    # The next request carries one assistant turn with both calls, then both results in order.
    messages = server.requests[1].json["messages"]
    assert messages[-3]["role"] == "assistant"
    assert messages[-3]["content"] == "Logging both."
    assert [c["id"] for c in messages[-3]["tool_calls"]] == ["call_1", "call_2"]
    assert [(m["role"], m["tool_call_id"]) for m in messages[-2:]] == [("tool", "call_1"), ("tool", "call_2")]


def test_undecodable_arguments_become_an_error_the_model_sees(server: FakeModelServer) -> None:
    server.script(
        [
            completion(None, [call("call_bad", "note_concern", '{"concern": "sore thr')]),
            completion("Sorry, let me try again later."),
        ]
    )
    app, agent = triage_app(model(server))

    run = app.run(agent, "I have a sore throat.")

    assert run.status == "completed"
    [tool_call] = of_type(run.events, ToolCallEvent)
    assert tool_call.error is not None and "not valid JSON" in tool_call.error
    [result] = of_type(run.events, ToolResultEvent)
    assert result.error is not None and result.error.startswith("could not decode the arguments for note_concern")
    tool_message = server.requests[1].json["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_bad"
    assert "could not decode" in json.loads(tool_message["content"])["error"]
    assert run.state.concerns == []


# -- retries and failures ---------------------------------------------------------------------


def test_a_429_is_retried_by_the_sdk_and_the_run_completes(server: FakeModelServer) -> None:
    server.script(
        [
            Reply(429, {"error": {"message": "Rate limit reached", "type": "requests"}}, headers=FAST),
            completion("Second time lucky."),
        ]
    )
    app, agent = triage_app(model(server, max_retries=2))

    run = app.run(agent, "hi")

    assert run.status == "completed"
    assert run.output.text == "Second time lucky."
    assert len(server.requests) == 2
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0", "1"]
    assert server.requests[0].json == server.requests[1].json
    assert len(of_type(run.events, ModelStartEvent)) == 1  # one model call on the ledger, retried below it


def test_a_timeout_is_retried_by_the_sdk(server: FakeModelServer) -> None:
    # The first reply comes far past the client's timeout, the second at once: only a retry completes the run.
    server.script([Reply(200, {}, delay=60.0), completion("After the timeout.")])
    app, agent = triage_app(model(server, timeout=2.0, max_retries=1))

    run = app.run(agent, "hi")

    assert run.status == "completed"
    assert run.output.text == "After the timeout."
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0", "1"]


def test_a_timeout_past_the_retries_is_a_retryable_error(server: FakeModelServer) -> None:
    server.always(Reply(200, {}, delay=60.0))
    app, agent = triage_app(model(server, timeout=1.0, max_retries=0))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "OpenAIModelUnavailable"
    assert run.error is not None and "timed out" in run.error
    assert len(server.requests) == 1


def test_a_500_every_time_ends_the_run_with_the_error_on_the_ledger(server: FakeModelServer) -> None:
    server.always(Reply(500, {"error": {"message": "The server had an error", "type": "server_error"}}, FAST))
    app, agent = triage_app(model(server, max_retries=2))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert len(server.requests) == 3  # the first try and max_retries=2 retries
    [end] = of_type(run.events, ModelEndEvent)
    assert end.error_type == "OpenAIModelUnavailable"  # a 5xx is transient: retryable, by name
    assert end.error is not None
    assert "HTTP 500 after 2 retries: The server had an error" in end.error
    [finished] = of_type(run.events, InvocationEndEvent)
    assert finished.status == "error"
    assert finished.error == end.error == run.error
    assert run.error_type == "OpenAIModelUnavailable"


def test_a_400_is_not_retried_and_says_why(server: FakeModelServer) -> None:
    server.script([Reply(400, {"error": {"message": "Invalid 'messages[0].role'", "type": "invalid_request_error"}})])
    app, agent = triage_app(model(server, max_retries=2))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert len(server.requests) == 1
    assert run.error == f"OpenAI chat completion ({server.url}/v1/) failed with HTTP 400: Invalid 'messages[0].role'"
    assert run.error_type == "OpenAIModelError"  # not retryable


@pytest.mark.parametrize(
    "body",
    [
        {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-test"},
        {"id": "chatcmpl-1", "object": "chat.completion", "choices": []},
        {"choices": [{"index": 0, "finish_reason": "stop"}]},
        [1, 2, 3],
        b"<html>gateway</html>",
    ],
    ids=["no-choices", "empty-choices", "no-message", "not-an-object", "not-json"],
)
def test_a_malformed_response_ends_the_run_with_a_clear_error(server: FakeModelServer, body: Any) -> None:
    server.script([Reply(200, body)])
    app, agent = triage_app(model(server, max_retries=0))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "OpenAIMalformedResponse"
    [end] = of_type(run.events, ModelEndEvent)
    assert end.error_type == "OpenAIMalformedResponse"
    assert of_type(run.events, InvocationEndEvent)[0].status == "error"


def test_a_missing_api_key_is_a_configuration_error_at_run_time(
    server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    adapter = OpenAIAdapter(base_url=f"{server.url}/v1")  # building it needs no key: only using it does
    app, agent = triage_app(openai("gpt-test", base_url=f"{server.url}/v1"))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "ConfigurationError"
    assert run.error is not None and "no API key" in run.error and "OPENAI_API_KEY" in run.error
    assert of_type(run.events, ModelEndEvent)[0].error == run.error
    assert server.requests == []
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        adapter.complete(ModelRequest(model=openai("gpt-test"), messages=[Message(role="user", content="hi")]))


def test_the_key_comes_from_the_environment(server: FakeModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.script([completion("ok")])
    app, agent = triage_app(openai("gpt-test", base_url=f"{server.url}/v1"))

    assert app.run(agent, "hi").status == "completed"
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


# -- structured output ------------------------------------------------------------------------


class Verdict(BaseModel):
    urgency: Literal["low", "high"]
    reason: str
    follow_up: bool = False


class StrictVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    urgency: Literal["low", "high"]
    reason: str


def test_structured_output_asks_for_the_json_schema_and_returns_an_instance(server: FakeModelServer) -> None:
    server.script([completion('{"urgency": "high", "reason": "chest pain", "follow_up": true}')])
    app, agent = triage_app(model(server), output=Verdict)

    run = app.run(agent, "I have chest pain.")

    assert run.status == "completed"
    assert isinstance(run.output.value, Verdict)
    assert run.output.value == Verdict(urgency="high", reason="chest pain", follow_up=True)
    response_format = server.requests[0].json["response_format"]
    assert response_format == {
        "type": "json_schema",
        # follow_up has a default, so the schema is not strict-compatible and strict is not asked for
        "json_schema": {"name": "Verdict", "schema": Verdict.model_json_schema(), "strict": False},
    }


def test_a_strict_compatible_schema_is_sent_strict(server: FakeModelServer) -> None:
    server.script([completion('{"urgency": "low", "reason": "a cold"}')])
    app, agent = triage_app(model(server), output=StrictVerdict)

    run = app.run(agent, "I have a cold.")

    assert isinstance(run.output.value, StrictVerdict)
    json_schema = server.requests[0].json["response_format"]["json_schema"]
    assert json_schema["strict"] is True
    assert json_schema["schema"]["additionalProperties"] is False


def test_output_strict_and_response_format_options_override(server: FakeModelServer) -> None:
    server.script([completion('{"urgency": "low", "reason": "x"}'), completion('{"urgency": "low", "reason": "y"}')])
    app, agent = triage_app(model(server, output_strict=True), output=Verdict)
    app.run(agent, "one")
    app2, agent2 = triage_app(model(server, response_format={"type": "json_object"}), output=Verdict)
    run = app2.run(agent2, "two")

    assert server.requests[0].json["response_format"]["json_schema"]["strict"] is True
    assert "output_strict" not in server.requests[0].json
    assert server.requests[1].json["response_format"] == {"type": "json_object"}
    assert isinstance(run.output.value, Verdict)


def test_an_answer_that_does_not_match_the_output_model_ends_in_error(server: FakeModelServer) -> None:
    server.script([completion('{"urgency": "whenever"}')])
    app, agent = triage_app(model(server), output=Verdict)

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error is not None and "does not match Verdict" in run.error


# -- exactly as sent --------------------------------------------------------------------------


def test_model_start_records_the_rendered_messages_and_tools_exactly_as_sent(server: FakeModelServer) -> None:
    server.script(
        [
            completion("Let me note that.", [call("call_1", "note_concern", {"concern": "fever"})]),
            completion(
                None,
                [
                    call("call_2", "note_concern", {"concern": "cough"}),
                    call("call_3", "note_concern", {"concern": "ä"}),
                ],
            ),
            completion('{"urgency": "low", "reason": "mild"}'),
            completion('{"urgency": "high", "reason": "worse"}'),
        ]
    )
    spec = model(server, temperature=0.2, seed=7, top_k=5)  # top_k is a vendor field: sent via extra_body
    app, agent = triage_app(spec, output=Verdict)
    session = app.sessions.create()

    first = app.run(agent, "fever, cough", session=session)
    second = app.run(agent, "now it is worse", session=session)

    assert (first.status, second.status) == ("completed", "completed")
    adapter = app.adapter_for(spec)
    assert isinstance(adapter, OpenAIAdapter)
    starts = [i for i, e in enumerate(session.events) if isinstance(e, ModelStartEvent)]
    assert len(starts) == len(server.requests) == 4
    for index, received in zip(starts, server.requests, strict=True):
        event = session.events[index]
        assert isinstance(event, ModelStartEvent)
        messages = session.model_input(index)
        assert digest(messages) == event.digest
        assert len(messages) == event.message_count
        rebuilt = ModelRequest(
            model=spec,
            messages=messages,
            tools=session.model_tools(index),
            output_schema=Verdict.model_json_schema(),
            output_name="Verdict",
        )
        assert received.json == adapter.wire_request(rebuilt)
    last = server.requests[-1].json
    assert (last["temperature"], last["seed"], last["top_k"]) == (0.2, 7, 5)


def test_request_options_on_the_agent_override_an_injected_adapters(server: FakeModelServer) -> None:
    server.script([completion("ok")])
    adapter = OpenAIAdapter(base_url=f"{server.url}/v1", api_key=KEY, temperature=0.1, seed=1)
    app = adk(name="injected", adapters={"openai": adapter})
    agent = app.agent(name="a", model=openai("gpt-other", temperature=0.7), context=[app.context.history()])

    assert app.run(agent, "hi").status == "completed"
    body = server.requests[0].json
    assert (body["model"], body["temperature"], body["seed"]) == ("gpt-other", 0.7, 1)


# -- the response parser on its own -------------------------------------------------------------


def test_tool_call_arguments_are_decoded_or_reported() -> None:
    adapter = OpenAIAdapter(api_key=KEY)
    response = adapter.parse_response(
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            call("c1", "none", ""),
                            call("c2", "list", "[1, 2]"),
                            call("c3", "ok", '{"a": {"b": [1]}}'),
                            {"id": "c4", "type": "custom", "custom": {"name": "grammar", "input": "x"}},
                        ],
                    },
                }
            ]
        }
    )
    assert [(c.call_id, c.name, c.args, c.error is None) for c in response.tool_calls] == [
        ("c1", "none", {}, True),
        ("c2", "list", {}, False),
        ("c3", "ok", {"a": {"b": [1]}}, True),
        ("c4", "grammar", {}, False),
    ]
    assert response.usage.total_tokens == 0  # a compatible server may leave usage out
    with pytest.raises(OpenAIMalformedResponse, match="no choices"):
        adapter.parse_response({"choices": None})
