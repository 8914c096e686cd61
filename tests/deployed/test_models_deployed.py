"""The deployment's model in the library: chosen by the environment, keyed by a secret read with Powertools and
cached, and called within the time the function has left (``calls_end_by``), against real HTTP servers: the
scripted model server, and moto's Secrets Manager and SSM served over HTTP (``tests/support/fidelity/secret_store.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("openai")
from dormant.errors import BedrockModelUnavailable, ConfigurationError, OpenAIModelUnavailable
from dormant.models.base import ModelRequest, ModelSpec, bedrock, calls_end_by, openai, time_left
from dormant.models.bedrock import BedrockAdapter
from dormant.models.openai import OpenAIAdapter
from dormant.models.secrets import Secret
from dormant.serving.deployed import model_from_env
from dormant.serving.runtime import load_served
from dormant.stores.memory import in_memory_store
from tests.support.fake_model_server import FakeModelServer, Reply, running

OK = Reply(
    200,
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    },
)
REQUEST = ModelRequest(model=openai("m"), messages=[{"role": "user", "content": "hello"}])  # type: ignore[list-item]


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with running() as fake:
        yield fake


# -- the model a deployment names ------------------------------------------------------------------------


def test_the_environment_names_the_model_its_server_and_where_its_key_is() -> None:
    assert model_from_env({}) is None
    spec = model_from_env(
        {"DORMANT_MODEL": "openai:gpt-4o-mini", "DORMANT_OPENAI_BASE_URL": "http://x/v1", "DORMANT_OPENAI_SECRET": "k"}
    )
    assert spec is not None and (spec.provider, spec.name) == ("openai", "gpt-4o-mini")
    assert spec.options == {"base_url": "http://x/v1", "api_key": Secret("k")}
    profile = "eu.anthropic.claude-3-7-sonnet-20250219-v1:0"
    assert model_from_env({"DORMANT_MODEL": f"bedrock:{profile}"}) == bedrock(profile)
    with pytest.raises(ConfigurationError, match="DORMANT_MODEL is openai"):
        model_from_env({"DORMANT_MODEL": "anthropic:claude"})


@dataclass
class _Built:
    app: Any
    agent: Any


def test_the_factory_gets_the_deployments_model_and_one_that_takes_none_is_refused() -> None:
    from dormant import adk

    seen: list[ModelSpec | None] = []

    def takes(store: Any, model: ModelSpec | None = None) -> _Built:
        seen.append(model)
        app = adk(name="deployed", store=store)
        return _Built(app, app.agent(name="a", model=model or openai("own")))

    def ignores(store: Any) -> _Built:
        app = adk(name="deployed", store=store)
        return _Built(app, app.agent(name="a", model=openai("own")))

    import sys
    import types

    module = types.ModuleType("deployed_factories")
    module.takes, module.ignores = takes, ignores  # type: ignore[attr-defined]
    sys.modules["deployed_factories"] = module
    try:
        served = load_served("deployed_factories:takes", in_memory_store(), openai("chosen"))
        assert seen == [openai("chosen")] and served.agent(None).model.name == "chosen"
        assert load_served("deployed_factories:ignores", in_memory_store()).agent(None).model.name == "own"
        with pytest.raises(ConfigurationError, match="takes no model="):
            load_served("deployed_factories:ignores", in_memory_store(), openai("chosen"))
    finally:
        del sys.modules["deployed_factories"]


def test_bookings_serves_the_deployments_model_instead_of_its_script() -> None:
    from bookings import build

    assert build(store=in_memory_store(), model=bedrock("anthropic.claude-x-v1:0")).agent.model.provider == "bedrock"
    assert build(store=in_memory_store()).agent.model.provider == "scripted"


# -- the key, read with Powertools and cached ---------------------------------------------------------------


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("aws_lambda_powertools")
    from aws_lambda_powertools.utilities import parameters

    from tests.support.fidelity.secret_store import SecretsServer

    served = SecretsServer()
    for name, url in served.endpoints().items():
        monkeypatch.setenv(name, url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dormantlocal")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dormantlocal")
    parameters.clear_caches()
    parameters.base.DEFAULT_PROVIDERS.clear()  # clients built for another endpoint
    try:
        yield served
    finally:
        parameters.clear_caches()
        parameters.base.DEFAULT_PROVIDERS.clear()
        served.close()


def test_a_secret_is_read_once_until_its_max_age_and_never_shown(secrets: Any) -> None:
    arn = secrets.client("secretsmanager").create_secret(Name="deployed/one", SecretString="sk-1 ")["ARN"]
    secret = Secret(arn)
    assert [secret.value(), secret.value(), Secret(arn).value()] == ["sk-1"] * 3
    assert secrets.count("GetSecretValue") == 1  # cached across calls (and across invocations of a sandbox)
    assert "sk-1" not in repr(secret) and arn in repr(secret)
    expiring = Secret("deployed/one", max_age=0)
    expiring.value(), expiring.value()
    assert secrets.count("GetSecretValue") == 3  # by name; max_age=0 reads every time


def test_a_parameter_store_secure_string_is_a_secret_too(secrets: Any) -> None:
    secrets.client("ssm").put_parameter(Name="/deployed/key", Value="sk-ssm", Type="SecureString")
    assert Secret("ssm:/deployed/key").value() == "sk-ssm"
    arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/deployed/key"
    assert Secret(arn).kind == "ssm" and Secret(arn).value() == "sk-ssm"
    secrets.client("ssm").put_parameter(Name="/deployed/empty", Value=" ", Type="SecureString")
    with pytest.raises(ConfigurationError, match="is empty"):
        Secret("ssm:/deployed/empty").value()


class _Rotating:
    """Stands in for a ``Secret``: what ``value()`` gives, which a test changes."""

    def __init__(self, value: str) -> None:
        self.current, self.reads = value, 0

    def value(self) -> str:
        self.reads += 1
        return self.current


def test_the_openai_key_comes_from_the_secret_and_a_rotated_one_is_used(server: FakeModelServer) -> None:
    server.always(OK)
    key = _Rotating("sk-one")
    adapter = OpenAIAdapter(api_key=key, base_url=f"{server.url}/v1")
    adapter.complete(REQUEST)
    adapter.complete(REQUEST)
    key.current = "sk-two"
    adapter.complete(REQUEST)
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer sk-one", "Bearer sk-one", "Bearer sk-two"]


# -- model calls within the function's time ---------------------------------------------------------------


def test_no_deadline_is_in_force_outside_calls_end_by() -> None:
    assert time_left() is None
    with calls_end_by(time.time() + 5):
        assert 4 < (time_left() or 0) <= 5
        with calls_end_by(time.time() - 1):
            assert time_left() == 0
    assert time_left() is None


def test_a_slow_openai_server_ends_the_call_at_the_deadline_with_a_typed_error(server: FakeModelServer) -> None:
    server.always(Reply(200, OK.body, delay=10))
    adapter = OpenAIAdapter(api_key="k", base_url=f"{server.url}/v1", timeout=600)  # its own timeout: 10 minutes
    started = time.monotonic()
    with calls_end_by(time.time() + 2), pytest.raises(OpenAIModelUnavailable, match="remaining time"):
        adapter.complete(REQUEST)
    assert time.monotonic() - started < 3.5
    assert len(server.requests) == 1  # a timeout that used the time up is not retried


def test_under_a_deadline_a_retry_is_made_only_when_time_is_left_for_it(server: FakeModelServer) -> None:
    adapter = OpenAIAdapter(api_key="k", base_url=f"{server.url}/v1")
    server.script([Reply(500, {"error": {"message": "down"}}, {"retry-after-ms": "10"}), OK])
    with calls_end_by(time.time() + 30):
        assert adapter.complete(REQUEST).text == "hi"
    assert len(server.requests) == 2

    # a Retry-After of 5 s when 3 s are left: no retry, the error at once
    server.requests.clear()
    server.script([Reply(429, {"error": {"message": "slow down"}}, {"retry-after": "5"}), OK])
    started = time.monotonic()
    with calls_end_by(time.time() + 3), pytest.raises(OpenAIModelUnavailable, match="HTTP 429"):
        adapter.complete(REQUEST)
    assert len(server.requests) == 1 and time.monotonic() - started < 1

    # too little time for even a first try
    with calls_end_by(time.time() + 0.5), pytest.raises(OpenAIModelUnavailable, match="before the call"):
        adapter.complete(REQUEST)
    assert len(server.requests) == 1


CONVERSE = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
}
AWS = {"region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "x"}
BEDROCK_REQUEST = ModelRequest(model=bedrock("anthropic.claude-x-v1:0"), messages=REQUEST.messages)


def test_a_slow_bedrock_model_ends_the_call_at_the_deadline_and_throttling_is_retried_in_time(
    server: FakeModelServer,
) -> None:
    adapter = BedrockAdapter(endpoint_url=server.url, read_timeout=600, **AWS)
    server.always(Reply(200, CONVERSE, delay=10))
    started = time.monotonic()
    with calls_end_by(time.time() + 2), pytest.raises(BedrockModelUnavailable):
        adapter.complete(BEDROCK_REQUEST)
    assert time.monotonic() - started < 3.5 and len(server.requests) == 1

    server.requests.clear()
    throttled = Reply(429, {"message": "slow down"}, {"x-amzn-ErrorType": "ThrottlingException"})
    server.script([throttled, Reply(200, CONVERSE)])
    with calls_end_by(time.time() + 30):
        assert adapter.complete(BEDROCK_REQUEST).text == "hi"
    assert len(server.requests) == 2
