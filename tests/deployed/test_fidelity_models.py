"""Deployment fidelity of a model chosen at deploy time (``-c model=openai:<model>``), with its key in Secrets
Manager: the synthesized stack run by the harness (``tests/support/fidelity``), a loopback server standing in for the
provider (``tests/support/fake_model_server.py``), and moto's Secrets Manager reached over HTTP the way the functions
reach DynamoDB Local and the Step Functions stand-in (``AWS_ENDPOINT_URL_SECRETS_MANAGER``).

What it proves: the functions that call the model (``resume``, and ``run`` for a turn whose caller waits) read the
key once per cold start through their own role, send it to the model server and hold no other secret; a model server
slower than the function's remaining time ends the step with a typed error on the ledger, not a killed function.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.fake_model_server import FakeModelServer, Received, Reply
from tests.support.fidelity import iam
from tests.support.fidelity.calls import APP_PACKAGE, answer, create, evidence, fresh, ledger, run, show

MODEL = "fidelity-gpt"
RESUME_TIMEOUT = 30.0
"""The resume function's timeout in this deployment (900 s in the template): a slow model meets it in seconds."""


def test_secret_parameter_and_bedrock_calls_are_authorized_on_what_aws_checks() -> None:
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:dormant/openai-Ab12Cd"
    assert iam.required("secretsmanager", "GetSecretValue", {"SecretId": arn}) == [
        ("secretsmanager:GetSecretValue", arn)
    ]
    (by_name,) = iam.required("secretsmanager", "GetSecretValue", {"SecretId": "dormant/openai"})
    grant = {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": arn[:-6] + "??????"}
    assert iam.allowed([grant], *by_name)  # a name is what its ARN, six characters appended, would be
    assert iam.required("ssm", "GetParameter", {"Name": "/dormant/key", "WithDecryption": True}) == [
        ("ssm:GetParameter", "arn:aws:ssm:eu-west-1:123456789012:parameter/dormant/key")
    ]
    assert iam.required("bedrock-runtime", "Converse", {"modelId": "eu.amazon.nova-pro-v1:0"}) == [
        ("bedrock:InvokeModel", "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.amazon.nova-pro-v1:0"),
        ("bedrock:InvokeModel", "arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0"),
    ]
    assert iam.required("bedrock-runtime", "ConverseStream", {"modelId": "amazon.nova-pro-v1:0"}) == [
        ("bedrock:InvokeModelWithResponseStream", "arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0")
    ]


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


@contextlib.contextmanager
def deployed_with_model(
    dynamodb_endpoint: str,
    server: FakeModelServer,
    reply: Callable[[Received], Reply],
    context: dict[str, str],
    endpoints: dict[str, str],
) -> Iterator[Any]:
    """The fidelity app deployed with ``context`` (its model), the started fake provider ``server`` answering every
    call with ``reply``; the deployment closed and the server stopped afterwards."""
    from tests.support.fidelity.deployment import Deployment

    try:
        server.always(reply)
        deployment = Deployment.start(
            dynamodb_endpoint=dynamodb_endpoint,
            app="fidelity_app:build",
            app_packages=[APP_PACKAGE],
            context=context,
            endpoints=endpoints,
            timeouts={"resume": RESUME_TIMEOUT},
        )
        try:
            yield deployment
        finally:
            deployment.close()
    finally:
        server.stop()


def _provider(received: Received) -> Reply:
    """The model: ask for one sign-off, then answer; a session whose message says ``slow`` waits a minute."""
    messages = received.json["messages"]
    said = " ".join(str(m.get("content") or "") for m in messages if m["role"] == "user")
    delay = 60.0 if "slow" in said else 0.0
    if any(m["role"] == "tool" for m in messages):
        return Reply(body=_completion({"content": "All steps signed off."}, "stop"), delay=delay)
    call = {"id": "call_1", "type": "function", "function": {"name": "sign_off", "arguments": '{"step": 1}'}}
    return Reply(body=_completion({"content": None, "tool_calls": [call]}, "tool_calls"), delay=delay)


class Served:
    def __init__(self, deployment: Any, server: FakeModelServer, secrets: Any, arn: str, key: str) -> None:
        self.d, self.server, self.secrets, self.arn, self.key = deployment, server, secrets, arn, key


@pytest.fixture(scope="module")
def served(dynamodb_endpoint: str) -> Iterator[Served]:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    pytest.importorskip("openai", reason="the deployed model is an OpenAI-compatible server")
    from tests.support.fidelity.secret_store import SecretsServer

    secrets = SecretsServer()
    key = f"sk-fidelity-{uuid.uuid4().hex}"
    arn = secrets.client("secretsmanager").create_secret(Name=fresh("dormant/openai"), SecretString=key)["ARN"]
    server = FakeModelServer().start()
    context = {"model": f"openai:{MODEL}", "openai_base_url": f"{server.url}/v1", "openai_secret": arn}
    try:
        with deployed_with_model(dynamodb_endpoint, server, _provider, context, secrets.endpoints()) as deployment:
            yield Served(deployment, server, secrets, arn, key)
    finally:
        secrets.close()


def _secret_calls(d: Any, function: str | None = None) -> list[Any]:
    return [c for c in d.calls(function) if c.action.split(":")[0] in ("secretsmanager", "ssm")]


@pytest.mark.backend("dynamodb")
def test_resume_calls_the_deployed_model_with_its_key_read_once_per_cold_start(served: Served) -> None:
    d, sid = served.d, fresh("model")
    create(d, sid)
    shown = run(d, sid, f"signoffs=1 for {sid}")
    assert shown["status"] == "awaiting_input", (shown["status"], json.dumps(ledger(d, sid)[-1]), evidence(d))
    assert shown["yielded_tools"][0]["name"] == "sign_off"
    done = answer(d, sid, shown)
    assert done["status"] == "completed", (done["status"], evidence(d))
    assert "All steps signed off." in json.dumps(ledger(d, sid)[-3:]), ledger(d, sid)[-3:]  # the model's answer

    # the ledger says which model answered; the provider got the deployment's model, with the key as its bearer
    models = {json.dumps(e["model"]) for e in ledger(d, sid) if e["type"] == "model_start"}
    assert models == {json.dumps({"provider": "openai", "name": MODEL})}, models
    mine = [r for r in served.server.requests if sid in r.raw.decode()]
    assert len(mine) == 2 and all(r.json["model"] == MODEL for r in mine), [r.json for r in mine]
    assert {r.headers.get("authorization") for r in mine} == {f"Bearer {served.key}"}

    # the key is read by resume once per cold start, through its own role (run, which only claimed, reads none
    # for a run that does not wait)
    reads = _secret_calls(d, "resume")
    resumes = [i for i in d.lambdas.invocations if i.function == "resume"]
    assert all(c.action == "secretsmanager:GetSecretValue" and c.resource == served.arn for c in reads), reads
    assert len(reads) == d.lambdas.cold_starts["resume"] < len(resumes), (len(reads), d.lambdas.cold_starts, resumes)
    assert served.secrets.count("GetSecretValue") == len(reads) + len(_secret_calls(d, "run")) + len(
        _secret_calls(d, "tools")
    )
    assert not d.denied(), evidence(d)


@pytest.mark.backend("dynamodb")
def test_run_calls_the_deployed_model_for_a_turn_whose_caller_waits(served: Served) -> None:
    """``Prefer: wait``: the run function runs the turn, calling the deployed model with the key it read through
    its own role (once per cold start); the turn parks, and the answer, whose caller waits too, runs the rest in the
    tools function, calling the model with the key it read through its own role (issue 36)."""
    d, sid = served.d, fresh("inline")
    create(d, sid)
    body = {"message": f"signoffs=1 for {sid}"}
    status, _, turn = d.api("POST", f"/sessions/{sid}/runs", body, headers={"Prefer": "wait=20"})
    assert status == 200 and turn["status"] == "yielded_tool", (status, turn, evidence(d))
    mine = [r for r in served.server.requests if sid in r.raw.decode()]
    assert len(mine) == 1 and {r.headers.get("authorization") for r in mine} == {f"Bearer {served.key}"}
    reads = _secret_calls(d, "run")
    assert reads and all(c.action == "secretsmanager:GetSecretValue" and c.resource == served.arn for c in reads)
    assert 1 <= len(reads) <= d.lambdas.cold_starts["run"], (len(reads), d.lambdas.cold_starts)  # once a sandbox
    d.settle()
    (call,) = turn["yielded_tools"]
    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, _, done = d.api("POST", f"/sessions/{sid}/tools", answers, headers={"Prefer": "wait=20"})
    assert status == 200 and done["status"] == "completed", (status, done, evidence(d))
    mine = [r for r in served.server.requests if sid in r.raw.decode()]
    assert len(mine) == 2 and {r.headers.get("authorization") for r in mine} == {f"Bearer {served.key}"}
    reads = _secret_calls(d, "tools")
    assert reads and all(c.action == "secretsmanager:GetSecretValue" and c.resource == served.arn for c in reads)
    assert not d.denied(), evidence(d)


@pytest.mark.backend("dynamodb")
def test_no_function_holds_the_key_and_only_the_model_functions_may_read_it(served: Served) -> None:
    d = served.d
    for name, function in d.functions.items():
        environment = d.lambdas.environment(function)
        assert served.key not in json.dumps(environment), name
        assert "OPENAI_API_KEY" not in environment, name
        assert environment["DORMANT_MODEL"] == f"openai:{MODEL}", name  # every function serves the same app
        readable = {g for g in iam.grants(function.statements) if g[0].split(":")[0] in ("secretsmanager", "ssm")}
        model = {g for g in iam.grants(function.statements) if g[0].startswith("bedrock:")}
        assert not model, (name, model)  # an OpenAI model: no Bedrock grant anywhere
        if name in ("resume", "run", "tools"):
            assert readable == {("secretsmanager:GetSecretValue", served.arn)}, readable
            assert environment["DORMANT_OPENAI_SECRET"] == served.arn  # where the key is, not the key
        else:
            assert not readable, (name, readable)


@pytest.mark.backend("dynamodb")
def test_a_model_slower_than_the_functions_time_ends_the_step_with_a_typed_error(served: Served) -> None:
    d, sid = served.d, fresh("slow")
    create(d, sid)
    shown = run(d, sid, "signoffs=1 slow", settle=60)
    assert shown["status"] == "error", (shown["status"], evidence(d))
    end = ledger(d, sid)[-1]
    assert end["type"] == "invocation_end" and end["error_type"] == "OpenAIModelUnavailable", end
    assert "timed out" in end["error"] and "remaining time" in end["error"], end["error"]
    # the function answered in time: no invocation of it was killed
    assert not [e for e in d.errors("resume") if e[1] == "Sandbox.Timedout"], d.errors("resume")
    model_end = [e for e in ledger(d, sid) if e["type"] == "model_end"][-1]
    assert model_end["latency_ms"] < RESUME_TIMEOUT * 1000, model_end


def _unused_model_grants(d: Any) -> list[tuple[str, tuple[str, str]]]:
    """(function, grant) of each secret or model grant no call of that function needed."""
    return [
        (name, grant)
        for name, function in d.functions.items()
        for grant in iam.grants(function.statements, ("secretsmanager", "ssm", "bedrock"))
        if not iam.grant_used(grant, [(c.action, c.resource) for c in d.calls(name)])
    ]


@pytest.mark.backend("dynamodb")
def test_zz_the_model_grants_are_all_used(served: Served) -> None:
    """Runs last: every secret and model grant of this deployment was used by a scenario, no call was denied."""
    unused = _unused_model_grants(served.d)
    assert not unused and not served.d.denied(), (unused, evidence(served.d))


# -- Bedrock, through an inference profile ------------------------------------------------------------------

PROFILE = "eu.anthropic.claude-fidelity-v1:0"


def _converse(received: Received) -> Reply:
    """Bedrock's Converse: ask for one sign-off, then answer."""
    blocks = [b for m in received.json["messages"] for b in m["content"]]
    if any("toolResult" in b for b in blocks):
        content: list[dict[str, Any]] = [{"text": "All steps signed off."}]
        stop = "end_turn"
    else:
        content, stop = [{"toolUse": {"toolUseId": "t1", "name": "sign_off", "input": {"step": 1}}}], "tool_use"
    usage = {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}
    return Reply(
        body={"output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop, "usage": usage}
    )


@pytest.fixture(scope="module")
def bedrock_served(dynamodb_endpoint: str) -> Iterator[Any]:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    server = FakeModelServer().start()
    endpoints = {"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": server.url}
    with deployed_with_model(dynamodb_endpoint, server, _converse, {"model": f"bedrock:{PROFILE}"}, endpoints) as d:
        yield d, server


@pytest.mark.backend("dynamodb")
def test_run_resume_and_tools_call_bedrock_through_the_profile_with_exactly_their_grants(bedrock_served: Any) -> None:
    d, server = bedrock_served
    sid = fresh("bedrock")
    create(d, sid)
    # the caller waits: run makes the first call (the turn parks); an answer that does not wait, resume the
    # answered turn's; in a second session an answer that waits, the tools function (issue 36)
    for session, waits in ((sid, False), (fresh("bedrock"), True)):
        if waits:
            create(d, session)
        status, _, turn = d.api(
            "POST", f"/sessions/{session}/runs", {"message": "signoffs=1"}, headers={"Prefer": "wait=20"}
        )
        assert status == 200, (status, turn, evidence(d))
        d.settle()
        shown = show(d, session)
        assert shown["status"] == "awaiting_input", (shown["status"], json.dumps(ledger(d, session)[-1]), evidence(d))
        if not waits:
            assert answer(d, session, shown)["status"] == "completed", evidence(d)
            continue
        (call,) = shown["yielded_tools"]
        answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
        status, _, done = d.api("POST", f"/sessions/{session}/tools", answers, headers={"Prefer": "wait=20"})
        assert status == 200 and done["status"] == "completed", (status, done, evidence(d))
    assert {r.path for r in server.requests} == {f"/model/{PROFILE.replace(':', '%3A')}/converse"}
    # each call authorized on the profile and on the model in the region it routed to, by its function's own role
    calls = [c for c in d.calls() if c.action.startswith("bedrock:")]
    assert {c.function for c in calls} == {"run", "resume", "tools"} and all(c.allowed for c in calls), calls
    assert {c.resource for c in calls} == {
        f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/{PROFILE}",
        "arn:aws:bedrock:eu-west-1::foundation-model/anthropic.claude-fidelity-v1:0",
    }
    assert not _secret_calls(d) and not [f for f in d.functions.values() if "DORMANT_OPENAI_SECRET" in f.environment]
    unused = _unused_model_grants(d)
    assert not unused and not d.denied(), (unused, evidence(d))
