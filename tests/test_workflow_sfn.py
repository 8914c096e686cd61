"""The resume workflow, for real: the state machine synthesized from the CDK app, executed by moto.

Step Functions has no local engine, so moto runs the ASL taken from the synthesized template (only
its CloudFormation references filled in: the two function ARNs, the partition, the wait timeout).
Its Lambda invokes are dispatched in-process to the real handler modules (``functions/<name>/app.py``,
loaded as Lambda loads them), which serve the app over a fresh table in DynamoDB Local. The API
requests go through the same modules, so a yield really starts the execution, park really stores the
token, and ``POST /tools`` really sends ``SendTaskSuccess`` to moto.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

pytestmark = pytest.mark.backend("dynamodb")

pytest.importorskip("aws_cdk", reason="the workflow is synthesized from the CDK app (the infra extra)")
pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
moto = pytest.importorskip("moto", reason="moto executes the state machine (the dev extra)")

import boto3  # noqa: E402
from moto.awslambda_simple.models import LambdaSimpleBackend  # noqa: E402

from dormant.errors import StoreBusy  # noqa: E402
from dormant.serving import workflow  # noqa: E402
from dormant.serving.runtime import Served, served_from_env  # noqa: E402
from dormant.serving.workflow import TOKEN_SCOPE, StepFunctions, execution_name  # noqa: E402
from tests.cdk_template import Synth, definition_of, function_of, synthesize  # noqa: E402
from tests.lambda_events import TENANT_A, Client, LambdaContext  # noqa: E402
from tests.servers.dynamodb import ACCESS_KEY, REGION  # noqa: E402

T = TypeVar("T")
ACCOUNT = "123456789012"
FUNCTIONS = Path(__file__).resolve().parents[1] / "functions"
# Which function serves each sample API event (serving.routes, by event name).
ROUTE_OF = {"create_session": "sessions", "get_session": "sessions", "session_events": "sessions"}
WAIT = 60.0
"""The longest any step may take before the test gives up on it (a deadline, not a measurement)."""


def eventually(check: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + WAIT
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:dormant-{name}"


def load_function(name: str) -> Callable[[dict[str, Any], Any], Any]:
    """``functions/<name>/app.py`` as Lambda loads it: a fresh module, configured by the environment."""
    spec = importlib.util.spec_from_file_location(f"function_{name}_{uuid.uuid4().hex}", FUNCTIONS / name / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.handler  # type: ignore[no-any-return]


class Deployment:
    """The stack in one process: moto's state machine, the function modules, DynamoDB Local."""

    def __init__(self, machine_arn: str) -> None:
        self.machine_arn = machine_arn
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.handlers = {name: load_function(name) for name in ("sessions", "run", "tools", "park", "resume")}
        self.served: Served = served_from_env()
        self.invocations: list[tuple[str, str, Any]] = []
        """(function, action, result or the error's type) of each Lambda invoke, in order."""
        self.holds: dict[str, threading.Event] = {}
        """An invoke of an action held until its event is set (to order it after a request on purpose)."""

    def invoke(self, function_name: str, body: bytes | str, response_headers: dict[str, str]) -> bytes:
        """What Lambda does with a state machine's invoke: run the handler, or report its error as Lambda does."""
        name = function_name.rsplit(":", 1)[-1].removeprefix("dormant-")
        event = json.loads(body)
        hold = self.holds.get(event["action"])
        if hold is not None:
            assert hold.wait(WAIT), f"{event['action']} was held and never released"
        try:
            result = self.handlers[name](event, LambdaContext(function_name=f"dormant-{name}"))
        except Exception as exc:
            self.invocations.append((name, event["action"], type(exc).__name__))
            response_headers["x-amz-function-error"] = "Unhandled"
            error = {"errorMessage": str(exc), "errorType": type(exc).__name__, "stackTrace": []}
            return json.dumps(error).encode()
        self.invocations.append((name, event["action"], result))
        return json.dumps(result).encode()

    def call(self, event_name: str, **kwargs: Any) -> tuple[int, Any]:
        return Client(self.handlers[ROUTE_OF.get(event_name, event_name)]).call(event_name, **kwargs)

    def session(self, session_id: str) -> dict[str, Any]:
        status, body = self.call("get_session", session_id=session_id)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def ledger(self, session_id: str) -> list[dict[str, Any]]:
        status, body = self.call("session_events", session_id=session_id, query={"limit": "500"})
        assert status == 200, body
        return body["events"]  # type: ignore[no-any-return]

    def token(self, session_id: str) -> str | None:
        app = self.served.for_tenant(TENANT_A)
        return app.store.load_scoped_state(app.name, TOKEN_SCOPE, session_id).get("task_token")  # type: ignore[no-any-return]

    def executions(self) -> list[dict[str, Any]]:
        return self.sfn.list_executions(stateMachineArn=self.machine_arn)["executions"]  # type: ignore[no-any-return]

    def the_execution(self) -> dict[str, Any]:
        (execution,) = self.executions()
        return execution

    def ended(self) -> dict[str, Any]:
        """The only execution, once it has ended."""
        arn = self.the_execution()["executionArn"]
        return eventually(
            lambda: (d := self.sfn.describe_execution(executionArn=arn))["status"] != "RUNNING" and d,
            "the execution to end",
        )

    def history(self) -> list[dict[str, Any]]:
        arn = self.the_execution()["executionArn"]
        return self.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]  # type: ignore[no-any-return]

    def states_entered(self) -> list[str]:
        return [e["stateEnteredEventDetails"]["name"] for e in self.history() if "stateEnteredEventDetails" in e]

    def yield_run(self, session_id: str, scopes: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a session (bound to a Bookings patient unless ``scopes``) and run it until it yields; the
        call it waits on."""
        scopes = {"user": "alex-doe"} if scopes is None else scopes
        status, _ = self.call("create_session", body={"session_id": session_id, "scopes": scopes})
        assert status == 201
        status, ran = self.call("run", session_id=session_id)
        assert status == 200 and ran["status"] == "yielded_tool", ran
        (call,) = ran["yielded_tools"]
        return call  # type: ignore[no-any-return]

    def answer(self, session_id: str, call_id: str, answer: Any) -> dict[str, Any]:
        body = {"answers": [{"call_id": call_id, "input": answer}]}
        status, body = self.call("tools", session_id=session_id, body=body)
        assert status == 202, body
        return body  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture
def deploy(
    template: Synth, dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Deployment]]:
    """``deploy(app=..., wait_seconds=...)``: the state machine in moto, the functions over a fresh table."""
    from moto import mock_aws

    monkeypatch.setenv("DORMANT_STORE", f"dynamodb://workflow-{uuid.uuid4().hex[:12]}?endpoint={dynamodb_endpoint}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "dormant")
    monkeypatch.delenv("DORMANT_IDEMPOTENCY_TABLE", raising=False)
    deployments: list[Deployment] = []

    def deploy(app: str = "bookings:build", wait_seconds: int = 3600) -> Deployment:
        monkeypatch.setenv("DORMANT_APP", app)
        functions = {f"{function_of(template, name)[0]}.Arn": function_arn(name) for name in ("park", "resume")}
        asl = definition_of(template, {"AWS::Partition": "aws", "WaitTimeoutSeconds": wait_seconds, **functions})
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(
            name=f"resume-{uuid.uuid4().hex[:8]}",
            definition=json.dumps(asl),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/resume-workflow",
        )["stateMachineArn"]
        monkeypatch.setenv("DORMANT_STATE_MACHINE", arn)
        served_from_env.cache_clear()
        deployment = Deployment(arn)
        monkeypatch.setattr(
            LambdaSimpleBackend,
            "invoke",
            lambda backend, function_name, qualifier, body, headers, response_headers: deployment.invoke(
                function_name, body, response_headers
            ),
        )
        deployments.append(deployment)
        return deployment

    with mock_aws(config={"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}):
        # moto's credentials are in place now; DynamoDB Local (run with -sharedDb) takes any, ours included
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
        try:
            yield deploy
        finally:
            for deployment in deployments:
                for hold in deployment.holds.values():
                    hold.set()
                for execution in deployment.executions():
                    if execution["status"] == "RUNNING":
                        deployment.sfn.stop_execution(executionArn=execution["executionArn"])
            served_from_env.cache_clear()


def test_a_yield_parks_the_answer_wakes_it_and_the_resume_completes_the_run(deploy: Callable[..., Deployment]) -> None:
    aws = deploy()
    call = aws.yield_run("s-1")

    # the run started one execution, named for the session and its invocation
    execution = aws.the_execution()
    invocation = next(e for e in reversed(aws.ledger("s-1")) if e["type"] == "invocation_start")["invocation_id"]
    assert execution["name"] == execution_name(TENANT_A, "s-1", invocation)
    assert json.loads(aws.sfn.describe_execution(executionArn=execution["executionArn"])["input"]) == {
        "tenant": TENANT_A,
        "session_id": "s-1",
    }
    # a retried run's hook finds the execution its first attempt started: still one
    session = aws.served.for_tenant(TENANT_A).sessions.require("s-1")
    retried = SimpleNamespace(session_id="s-1", session=session)
    StepFunctions(aws.machine_arn).on_yield(TENANT_A, aws.served.app, retried)  # type: ignore[arg-type]
    assert [e["name"] for e in aws.executions()] == [execution["name"]]

    token = eventually(lambda: aws.token("s-1"), "park to store its task token")
    assert aws.the_execution()["status"] == "RUNNING"  # asleep until answered
    assert aws.session("s-1")["status"] == "awaiting_input"

    answered = aws.answer("s-1", call["call_id"], {"approved": True, "note": "fine"})
    assert answered["woke"] is True

    assert aws.ended()["status"] == "SUCCEEDED"
    assert aws.states_entered() == ["Park", "Resume", "Yielded again?", "Done"]
    assert [(f, a) for f, a, _ in aws.invocations] == [("park", "park"), ("resume", "resume")]
    assert aws.invocations[1][2]["status"] == "completed"
    shown = aws.session("s-1")
    assert shown["status"] == "completed" and shown["yielded_tools"] == []
    assert shown["state"]["session"]["confirmation"]  # the resumed agent booked the slot and committed it
    assert aws.token("s-1") == token  # the spent token stays with the session; Step Functions refuses it now


def test_a_run_that_yields_again_parks_again_in_the_same_execution(deploy: Callable[..., Deployment]) -> None:
    aws = deploy("tests.workflow_app:build")
    first = aws.yield_run("s-loop", scopes={})
    assert first["args"] == {"step": 1}
    token_1 = eventually(lambda: aws.token("s-loop"), "the first park")
    aws.answer("s-loop", first["call_id"], {"approved": True})

    token_2 = eventually(lambda: (t := aws.token("s-loop")) != token_1 and t, "the second park's token")
    (second,) = aws.session("s-loop")["yielded_tools"]
    assert second["args"] == {"step": 2} and aws.the_execution()["status"] == "RUNNING"
    aws.answer("s-loop", second["call_id"], {"approved": True})

    assert aws.ended()["status"] == "SUCCEEDED"
    assert aws.states_entered() == ["Park", "Resume", "Yielded again?", "Park", "Resume", "Yielded again?", "Done"]
    assert [r["status"] for f, _, r in aws.invocations if f == "resume"] == ["yielded_tool", "completed"]
    assert token_2 != token_1
    assert aws.session("s-loop")["status"] == "completed"


def test_a_wait_that_times_out_ends_cleanly_with_the_session_marked_expired(deploy: Callable[..., Deployment]) -> None:
    aws = deploy(wait_seconds=1)
    call = aws.yield_run("s-late")

    assert aws.ended()["status"] == "SUCCEEDED"  # an expired wait is an outcome, not a failure
    assert aws.states_entered() == ["Park", "Expire", "Expired"]
    end = aws.ledger("s-late")[-1]
    assert end["type"] == "invocation_end" and end["status"] == "error"
    assert end["error_type"] == "SessionExpired" and "timed out" in end["error"]
    assert aws.session("s-late")["yielded_tools"] == []
    # an answer after the wait ended has no call to answer: refused, nothing written
    before = aws.ledger("s-late")
    status, refused = aws.call(
        "tools", session_id="s-late", body={"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    )
    assert status == 400, refused
    assert aws.ledger("s-late") == before


def test_an_error_ends_in_the_failed_state_with_its_cause_on_the_ledger(
    deploy: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    aws = deploy()
    call = aws.yield_run("s-crash")
    eventually(lambda: aws.token("s-crash"), "park")

    def crash(*args: Any) -> dict[str, Any]:
        raise RuntimeError("the model provider's client crashed")

    monkeypatch.setattr(workflow, "resume", crash)
    aws.answer("s-crash", call["call_id"], {"approved": True})

    ended = aws.ended()
    assert ended["status"] == "FAILED"
    assert aws.states_entered() == ["Park", "Resume", "RecordFailure", "Failed"]
    # not a retryable error: one attempt, then the failure is recorded
    assert [(f, a) for f, a, _ in aws.invocations] == [("park", "park"), ("resume", "resume"), ("resume", "fail")]
    end = aws.ledger("s-crash")[-1]
    assert end["type"] == "invocation_end" and end["status"] == "error"
    assert end["error_type"] == "RuntimeError"
    assert "the model provider's client crashed" in end["error"]
    assert aws.session("s-crash")["status"] == "error"


def test_a_retryable_error_is_retried_and_the_run_goes_on(
    deploy: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    aws = deploy()
    call = aws.yield_run("s-busy")
    eventually(lambda: aws.token("s-busy"), "park")
    real_resume = workflow.resume
    failures = [StoreBusy("the table is throttling")]

    def busy_once(*args: Any) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return real_resume(*args)

    monkeypatch.setattr(workflow, "resume", busy_once)
    aws.answer("s-busy", call["call_id"], {"approved": True})

    assert aws.ended()["status"] == "SUCCEEDED"
    assert [(f, a, r if isinstance(r, str) else r["status"]) for f, a, r in aws.invocations[1:]] == [
        ("resume", "resume", "StoreBusy"),
        ("resume", "resume", "completed"),
    ]
    failed = [e for e in aws.history() if e["type"] == "LambdaFunctionFailed" or e["type"] == "TaskFailed"]
    assert failed and all("StoreBusy" in json.dumps(e, default=str) for e in failed)
    assert aws.states_entered() == ["Park", "Resume", "Yielded again?", "Done"]
    assert aws.session("s-busy")["status"] == "completed"


def test_an_answer_before_park_is_on_the_ledger_first_and_park_resumes_at_once(
    deploy: Callable[..., Deployment],
) -> None:
    aws = deploy()
    park_may_run = aws.holds["park"] = threading.Event()
    call = aws.yield_run("s-early")
    assert aws.the_execution()["status"] == "RUNNING"

    answered = aws.answer("s-early", call["call_id"], {"approved": True})  # park is held: no token yet
    assert answered["woke"] is False and aws.token("s-early") is None
    assert aws.session("s-early")["status"] == "resumable"  # the answer is stored: not lost
    park_may_run.set()

    assert aws.ended()["status"] == "SUCCEEDED"
    park = aws.invocations[0]
    assert park[:2] == ("park", "park") and park[2] == {"woke": True, "status": "resumable"}
    assert aws.states_entered() == ["Park", "Resume", "Yielded again?", "Done"]
    assert aws.session("s-early")["status"] == "completed"
