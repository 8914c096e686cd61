"""The Bedrock adapter on a real ``bedrock-runtime`` client: botocore's Stubber for scripted answers, and a
local HTTP endpoint where botocore's own retry handler has to run (Stubber answers before it would).

Every request is recorded twice over: the keyword arguments ``converse`` got, and the JSON body
botocore serialized from them (validated against the service model on the way) — what AWS would receive.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

boto3 = pytest.importorskip("boto3")  # the `bedrock` extra
from botocore.stub import Stubber  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from dormant import App, bedrock  # noqa: E402
from dormant.errors import ConfigurationError  # noqa: E402
from dormant.events import (  # noqa: E402
    InvocationEndEvent,
    ModelEndEvent,
    ModelStartEvent,
    StateChangeEvent,
    ToolCallEvent,
)
from dormant.models.base import ModelRequest, ModelSpec  # noqa: E402
from dormant.models.bedrock import BedrockAdapter, BedrockMalformedResponse  # noqa: E402
from dormant.transcript import digest  # noqa: E402
from tests.support.examples import noted_a_sore_throat, of_type, triage  # noqa: E402
from tests.support.fake_model_server import FakeModelServer, Reply, running  # noqa: E402

MODEL_ID = "anthropic.claude-3-5-haiku-20241022-v1:0"
AWS = {"region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "x"}


@dataclass
class Recorded:
    """What ``converse`` was called with, and the HTTP body and path botocore built from it."""

    kwargs: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


def record(client: Any) -> Recorded:
    seen = Recorded()

    def params(params: dict[str, Any], **_: Any) -> None:
        seen.kwargs.append(copy.deepcopy(params))

    def serialized(model: Any, params: dict[str, Any], **_: Any) -> None:
        if model.name == "Converse":
            seen.bodies.append(json.loads(params["body"]))
            seen.paths.append(params["url_path"])

    client.meta.events.register_first("provide-client-params.*.Converse", params)
    # Same pattern as Stubber's handler, so registering first runs it before Stubber answers.
    client.meta.events.register_first("before-call.*.*", serialized)
    return seen


@pytest.fixture
def client() -> Any:
    return boto3.client("bedrock-runtime", **AWS)


@pytest.fixture
def stubber(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def converse(*blocks: dict[str, Any], stop: str = "end_turn", usage: tuple[int, int] = (30, 12)) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": list(blocks)}},
        "stopReason": stop,
        "usage": {"inputTokens": usage[0], "outputTokens": usage[1], "totalTokens": sum(usage)},
        "metrics": {"latencyMs": 321},
    }


def text(value: str) -> dict[str, Any]:
    return {"text": value}


def tool_use(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"toolUse": {"toolUseId": call_id, "name": name, "input": args}}


# -- an app with tools and state -----------------------------------------------------------------


class Verdict(BaseModel):
    urgency: Literal["low", "high"]
    reason: str
    follow_up: bool = False


def triage_app(
    adapter: BedrockAdapter | None, spec: ModelSpec | None = None, *, tools: bool = True, **agent_options: Any
) -> tuple[App, Any]:
    t = triage(
        model=spec or bedrock(MODEL_ID, max_tokens=512),
        adapters={"bedrock": adapter} if adapter else {},
        tools=tools,
        **agent_options,
    )
    return t.app, t.agent


NOTE_TOOL = {
    "toolSpec": {
        "name": "note_concern",
        "description": "Record one concern.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {"concern": {"title": "Concern", "type": "string"}},
                "required": ["concern"],
            }
        },
    }
}


# -- text, tool use, several tool uses ------------------------------------------------------------


def test_a_text_answer_with_usage_and_stop_reason(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    stubber.add_response("converse", converse(text("Hello! "), text("How can I help?"), usage=(40, 9)))
    app, agent = triage_app(BedrockAdapter(client=client), bedrock(MODEL_ID, max_tokens=512, temperature=0.2))

    run = app.run(agent, "hi")

    assert run.status == "completed"
    assert run.output.text == "Hello! How can I help?"
    assert sent.kwargs == [
        {
            "modelId": MODEL_ID,
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "system": [{"text": "Log every concern with note_concern."}],
            "toolConfig": {"tools": [NOTE_TOOL]},
            "inferenceConfig": {"maxTokens": 512, "temperature": 0.2},
        }
    ]
    [end] = of_type(run.events, ModelEndEvent)
    assert (end.usage.input_tokens, end.usage.output_tokens, end.usage.total_tokens) == (40, 9, 49)
    assert end.finish_reason == "end_turn"


def test_tool_use_from_the_model_and_tool_result_sent_back(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    stubber.add_response(
        "converse",
        converse(
            text("I'll note that."), tool_use("tooluse_1", "note_concern", {"concern": "sore throat"}), stop="tool_use"
        ),
    )
    stubber.add_response("converse", converse(text("Noted a sore throat.")))
    app, agent = triage_app(BedrockAdapter(client=client))

    run = app.run(agent, "I have a sore throat.")

    noted_a_sore_throat(run, "tooluse_1")
    assert sent.kwargs[1]["messages"] == [
        {"role": "user", "content": [{"text": "I have a sore throat."}]},
        {
            "role": "assistant",
            "content": [
                {"text": "I'll note that."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "note_concern", "input": {"concern": "sore throat"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": '{"concerns": ["sore throat"]}'}]}}
            ],
        },
    ]
    assert [e.finish_reason for e in of_type(run.events, ModelEndEvent)] == ["tool_use", "end_turn"]


def test_several_tool_uses_in_one_turn_send_their_results_in_one_user_message(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    stubber.add_response(
        "converse",
        converse(
            tool_use("tooluse_a", "note_concern", {"concern": "fever"}),
            tool_use("tooluse_b", "note_concern", {"concern": "cough"}),
            stop="tool_use",
        ),
    )
    stubber.add_response("converse", converse(text("Noted both.")))
    app, agent = triage_app(BedrockAdapter(client=client))

    run = app.run(agent, "fever and cough")

    assert run.status == "completed"
    assert run.state.concerns == ["fever", "cough"]
    assert [(c.call_id, c.args) for c in of_type(run.events, ToolCallEvent)] == [
        ("tooluse_a", {"concern": "fever"}),
        ("tooluse_b", {"concern": "cough"}),
    ]
    assert len(of_type(run.events, StateChangeEvent)) == 3
    second = sent.kwargs[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert [b["toolResult"]["toolUseId"] for b in second[2]["content"]] == ["tooluse_a", "tooluse_b"]


# -- throttling and errors --------------------------------------------------------------------


def test_the_retry_configuration_is_botocores() -> None:
    assert BedrockAdapter().retry_config() == {"mode": "adaptive", "total_max_attempts": 4}
    adapter = BedrockAdapter(retry_mode="standard", max_attempts=6, read_timeout=300, **AWS)
    config = adapter.client_config()
    assert config.retries == {"mode": "standard", "total_max_attempts": 6}
    assert config.read_timeout == 300
    built = adapter._get_client()  # what complete() would use
    assert built.meta.config.retries == {"mode": "standard", "total_max_attempts": 6}
    assert built.meta.region_name == "us-east-1"
    with pytest.raises(ConfigurationError, match="retry_mode"):
        BedrockAdapter(retry_mode="forever")
    with pytest.raises(ConfigurationError, match="max_attempts"):
        BedrockAdapter(max_attempts=0)


def test_stubbed_throttling_ends_the_run_with_the_error_on_the_ledger(client: Any, stubber: Stubber) -> None:
    # Stubber answers in before-call, ahead of botocore's retry handler: this is the error after retries.
    stubber.add_client_error(
        "converse", service_error_code="ThrottlingException", service_message="Too many requests", http_status_code=429
    )
    app, agent = triage_app(BedrockAdapter(client=client))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "BedrockModelUnavailable"  # retryable: a class of its own, matched by name
    assert run.error == f"Bedrock Converse ({MODEL_ID}) failed: ThrottlingException: Too many requests"
    [end] = of_type(run.events, ModelEndEvent)
    assert (end.error, end.error_type) == (run.error, "BedrockModelUnavailable")
    assert of_type(run.events, InvocationEndEvent)[0].status == "error"


def test_a_validation_exception_ends_the_run_with_status_error(client: Any, stubber: Stubber) -> None:
    stubber.add_client_error(
        "converse",
        service_error_code="ValidationException",
        service_message="The model returned the following errors: messages: roles must alternate",
        http_status_code=400,
    )
    app, agent = triage_app(BedrockAdapter(client=client))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error is not None and "ValidationException: The model returned the following errors" in run.error
    assert of_type(run.events, ModelEndEvent)[0].error == run.error
    assert of_type(run.events, InvocationEndEvent)[0].error == run.error


THROTTLED = Reply(429, {"message": "Too many requests, please wait."}, {"x-amzn-ErrorType": "ThrottlingException"})


@pytest.fixture
def endpoint() -> Iterator[FakeModelServer]:
    with running() as fake:
        yield fake


def test_throttling_is_retried_by_botocores_handler_and_the_run_completes(endpoint: FakeModelServer) -> None:
    endpoint.script([THROTTLED, Reply(200, converse(text("After a pause.")))])
    adapter = BedrockAdapter(endpoint_url=endpoint.url, **AWS)  # default: adaptive mode, 4 attempts

    app, agent = triage_app(adapter)
    run = app.run(agent, "hi")

    assert run.status == "completed"
    assert run.output.text == "After a pause."
    assert len(endpoint.requests) == 2
    attempts = [r.headers["amz-sdk-request"] for r in endpoint.requests]  # botocore's retry bookkeeping
    assert attempts[0] == "attempt=1; max=4"
    assert attempts[1].endswith("attempt=2; max=4")
    assert endpoint.requests[0].raw == endpoint.requests[1].raw
    assert endpoint.requests[0].path == f"/model/{urllib.parse.quote(MODEL_ID, safe='')}/converse"
    assert len(of_type(run.events, ModelStartEvent)) == 1


def test_throttling_past_max_attempts_is_an_error_naming_the_retries(endpoint: FakeModelServer) -> None:
    endpoint.always(THROTTLED)
    adapter = BedrockAdapter(endpoint_url=endpoint.url, retry_mode="standard", max_attempts=2, **AWS)

    app, agent = triage_app(adapter)
    run = app.run(agent, "hi")

    assert run.status == "error"
    assert len(endpoint.requests) == 2  # max_attempts counts the first try: one retry, then the error
    assert [r.headers["amz-sdk-request"].split("; ")[-2:] for r in endpoint.requests] == [
        ["attempt=1", "max=2"],
        ["attempt=2", "max=2"],
    ]
    assert (
        run.error
        == f"Bedrock Converse ({MODEL_ID}) failed after 1 retry: ThrottlingException: Too many requests, please wait."
    )
    assert of_type(run.events, ModelEndEvent)[0].error_type == "BedrockModelUnavailable"


# -- structured output -----------------------------------------------------------------------


def test_structured_output_forces_a_tool_named_after_the_output_model(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    stubber.add_response(
        "converse",
        converse(
            text("Here is my verdict."),
            tool_use("tooluse_v", "Verdict", {"urgency": "high", "reason": "chest pain"}),
            stop="tool_use",
        ),
    )
    app, agent = triage_app(BedrockAdapter(client=client), tools=False, output=Verdict)

    run = app.run(agent, "I have chest pain.")

    assert run.status == "completed"
    assert isinstance(run.output.value, Verdict)
    assert run.output.value == Verdict(urgency="high", reason="chest pain")
    assert json.loads(run.output.text or "") == {"urgency": "high", "reason": "chest pain"}
    assert of_type(run.events, ToolCallEvent) == []  # the answer is not a tool call on the ledger
    assert sent.kwargs[0]["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "Verdict",
                    "description": "Give your final answer by calling this tool once, with the answer as its input.",
                    "inputSchema": {"json": Verdict.model_json_schema()},
                }
            }
        ],
        "toolChoice": {"tool": {"name": "Verdict"}},
    }


def test_structured_output_next_to_real_tools_asks_for_any_tool(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    stubber.add_response(
        "converse", converse(tool_use("tooluse_1", "note_concern", {"concern": "rash"}), stop="tool_use")
    )
    stubber.add_response(
        "converse", converse(tool_use("tooluse_2", "Verdict", {"urgency": "low", "reason": "a rash"}), stop="tool_use")
    )
    app, agent = triage_app(BedrockAdapter(client=client), output=Verdict)

    run = app.run(agent, "I have a rash.")

    assert run.status == "completed"
    assert run.state.concerns == ["rash"]
    assert run.output.value == Verdict(urgency="low", reason="a rash")
    for kwargs in sent.kwargs:
        assert kwargs["toolConfig"]["toolChoice"] == {"any": {}}
        assert [t["toolSpec"]["name"] for t in kwargs["toolConfig"]["tools"]] == ["note_concern", "Verdict"]


@pytest.mark.parametrize("where", ["adapter", "agent"])
def test_native_json_schema_output_mode(client: Any, stubber: Stubber, where: str) -> None:
    sent = record(client)
    stubber.add_response("converse", converse(text('{"urgency": "low", "reason": "a cold"}')))
    if where == "adapter":
        adapter, spec = BedrockAdapter(client=client, output_mode="json_schema"), None
    else:  # the agent's model spec chooses it, over an injected adapter's default
        adapter, spec = BedrockAdapter(client=client), bedrock(MODEL_ID, output_mode="json_schema")
    app, agent = triage_app(adapter, spec, tools=False, output=Verdict)

    run = app.run(agent, "I have a cold.")

    assert run.output.value == Verdict(urgency="low", reason="a cold")
    assert "toolConfig" not in sent.kwargs[0]
    assert sent.kwargs[0]["outputConfig"] == {
        "textFormat": {
            "type": "json_schema",
            "structure": {"jsonSchema": {"name": "Verdict", "schema": json.dumps(Verdict.model_json_schema())}},
        }
    }


# -- exactly as sent --------------------------------------------------------------------------


def test_model_start_records_the_rendered_messages_and_tools_exactly_as_sent(client: Any, stubber: Stubber) -> None:
    sent = record(client)
    for response in [
        converse(text("Noting."), tool_use("tooluse_1", "note_concern", {"concern": "fever"}), stop="tool_use"),
        converse(
            tool_use("tooluse_2", "note_concern", {"concern": "cough"}),
            tool_use("tooluse_3", "note_concern", {"concern": "naïve ache"}),
            stop="tool_use",
        ),
        converse(tool_use("tooluse_4", "Verdict", {"urgency": "low", "reason": "mild"}), stop="tool_use"),
        converse(tool_use("tooluse_5", "Verdict", {"urgency": "high", "reason": "worse"}), stop="tool_use"),
    ]:
        stubber.add_response("converse", response)
    spec = bedrock(MODEL_ID, max_tokens=256, top_p=0.9, requestMetadata={"tenant": "t1"})
    adapter = BedrockAdapter(client=client, temperature=0.1)
    app, agent = triage_app(adapter, spec, output=Verdict)
    session = app.sessions.create()

    runs = [app.run(agent, "fever, cough", session=session), app.run(agent, "now it is worse", session=session)]

    assert [r.status for r in runs] == ["completed", "completed"]
    starts = [i for i, e in enumerate(session.events) if isinstance(e, ModelStartEvent)]
    assert len(starts) == len(sent.kwargs) == 4
    for index, kwargs, body, path in zip(starts, sent.kwargs, sent.bodies, sent.paths, strict=True):
        event = session.events[index]
        assert isinstance(event, ModelStartEvent)
        messages = session.model_input(index)
        assert digest(messages) == event.digest
        rebuilt = adapter.wire_request(
            ModelRequest(
                model=spec,
                messages=messages,
                tools=session.model_tools(index),
                output_schema=Verdict.model_json_schema(),
                output_name="Verdict",
            )
        )
        assert kwargs == rebuilt
        # ...and what botocore put on the wire is that, with the model id in the path.
        assert body == {k: v for k, v in rebuilt.items() if k != "modelId"}
        assert path == f"/model/{urllib.parse.quote(MODEL_ID, safe='')}/converse"
    assert sent.kwargs[-1]["inferenceConfig"] == {"temperature": 0.1, "maxTokens": 256, "topP": 0.9}
    assert sent.kwargs[-1]["requestMetadata"] == {"tenant": "t1"}
    # The earlier structured answer is in the history of the next run as assistant text.
    assert sent.kwargs[-1]["messages"][-2] == {
        "role": "assistant",
        "content": [{"text": '{"urgency": "low", "reason": "mild"}'}],
    }


# -- configuration mistakes and malformed answers -------------------------------------------------


def test_an_unknown_option_is_refused_at_run_time() -> None:
    app, agent = triage_app(None, bedrock(MODEL_ID, tempreature=0.5))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "ConfigurationError"
    assert run.error is not None and "unknown Bedrock option 'tempreature'" in run.error


def test_no_region_is_a_configuration_error_at_run_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance metadata service
    app, agent = triage_app(None, bedrock(MODEL_ID))

    run = app.run(agent, "hi")

    assert run.status == "error"
    assert run.error_type == "ConfigurationError"
    assert run.error is not None and "region_name" in run.error


def test_malformed_converse_responses_are_refused() -> None:
    adapter = BedrockAdapter()
    for response in [{}, {"output": {}}, {"output": {"message": {"content": "text"}}}]:
        with pytest.raises(BedrockMalformedResponse, match="no output message"):
            adapter.parse_response(response)
    odd = adapter.parse_response(converse({"toolUse": {"toolUseId": "t", "name": "x", "input": [1]}}))
    assert odd.tool_calls[0].error is not None and "not a JSON object" in odd.tool_calls[0].error
