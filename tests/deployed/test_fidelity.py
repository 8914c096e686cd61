"""Deployment fidelity: the synthesized stack run as AWS runs it; the only test allowed to say "works on AWS".

The harness (``tests/support/fidelity``) runs each function in its own process with exactly its template
environment and its role enforced on every AWS call, routes requests as the template's API methods do,
and drives the template's own ASL. The scenarios below talk to it only as a client (or AWS) would, and
are written against the target contract (``POST /runs`` may answer 202: they wait for the workflow to
settle and read the session). The first tests check the harness's own pieces.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.fidelity import iam
from tests.support.fidelity.calls import (
    APP_PACKAGE,
    STORE_RESENDS,
    TENANT,
    answer,
    create,
    evidence,
    fidelity_stack,
    fresh,
    ledger,
    run,
    show,
)
from tests.support.fidelity.stepfunctions import ApiError, StatesError, StepFunctions, fill, intrinsic, path_set
from tests.support.fidelity.template import Names, Template

TABLE_ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/T"
MACHINE_ARN = "arn:aws:states:eu-west-1:123456789012:stateMachine:M"

# -- IAM evaluation -----------------------------------------------------------------------------------------------


def _allow(actions: list[str], resources: list[str]) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": actions, "Resource": resources}


def test_iam_allows_only_what_a_statement_names() -> None:
    statements = [_allow(["dynamodb:GetItem", "dynamodb:Query"], [TABLE_ARN, f"{TABLE_ARN}/index/*"])]
    assert iam.allowed(statements, "dynamodb:GetItem", TABLE_ARN)
    assert iam.allowed(statements, "DynamoDB:getitem", TABLE_ARN)  # actions are case-insensitive
    assert iam.allowed(statements, "dynamodb:Query", f"{TABLE_ARN}/index/listing")
    assert not iam.allowed(statements, "dynamodb:PutItem", TABLE_ARN)
    assert not iam.allowed(statements, "dynamodb:GetItem", TABLE_ARN + "2")  # no prefix match without a wildcard
    assert not iam.allowed(statements, "dynamodb:GetItem", TABLE_ARN.replace("/T", "/t"))  # resources are exact


def test_iam_wildcards_not_action_and_an_explicit_deny() -> None:
    assert iam.allowed([_allow(["dynamodb:*"], ["*"])], "dynamodb:BatchGetItem", TABLE_ARN)
    assert iam.allowed([_allow(["dynamodb:Get?tem"], ["arn:aws:dynamodb:*:*:table/T"])], "dynamodb:GetItem", TABLE_ARN)
    not_action = [{"Effect": "Allow", "NotAction": ["dynamodb:DeleteItem"], "Resource": "*"}]
    assert iam.allowed(not_action, "dynamodb:PutItem", TABLE_ARN)
    assert not iam.allowed(not_action, "dynamodb:DeleteItem", TABLE_ARN)
    deny = [_allow(["dynamodb:*"], ["*"]), {"Effect": "Deny", "Action": "dynamodb:PutItem", "Resource": TABLE_ARN}]
    assert not iam.allowed(deny, "dynamodb:PutItem", TABLE_ARN)
    assert iam.allowed(deny, "dynamodb:UpdateItem", TABLE_ARN)
    assert not iam.allowed([], "dynamodb:GetItem", TABLE_ARN)  # nothing said is a deny


def test_a_transaction_is_authorized_per_item() -> None:
    request = {
        "TransactItems": [
            {"ConditionCheck": {"TableName": "T", "Key": {}, "ConditionExpression": "x"}},
            {"Put": {"TableName": "T", "Item": {}}},
            {"Update": {"TableName": "U", "Key": {}}},
            {"Delete": {"TableName": "T", "Key": {}}},
        ]
    }
    needed = iam.required("dynamodb", "TransactWriteItems", request)
    assert needed == [
        ("dynamodb:ConditionCheckItem", TABLE_ARN),
        ("dynamodb:PutItem", TABLE_ARN),
        ("dynamodb:UpdateItem", TABLE_ARN[:-1] + "U"),
        ("dynamodb:DeleteItem", TABLE_ARN),
    ]
    # a policy without ConditionCheckItem (main's) refuses the snapshot transaction
    writes = [_allow(["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"], ["*"])]
    assert not all(iam.allowed(writes, a, r) for a, r in needed)
    gets = iam.required("dynamodb", "TransactGetItems", {"TransactItems": [{"Get": {"TableName": "T", "Key": {}}}]})
    assert gets == [("dynamodb:GetItem", TABLE_ARN)]


def test_batches_indexes_and_step_functions_resources() -> None:
    batch = {"RequestItems": {"T": {"Keys": []}, "U": {"Keys": []}}}
    assert [a for a, _ in iam.required("dynamodb", "BatchGetItem", batch)] == ["dynamodb:BatchGetItem"] * 2
    query = iam.required("dynamodb", "Query", {"TableName": "T", "IndexName": "listing"})
    assert query == [("dynamodb:Query", f"{TABLE_ARN}/index/listing")]
    assert iam.required("dynamodb", "Query", {"TableName": "T"}) == [("dynamodb:Query", TABLE_ARN)]
    execution = "arn:aws:states:eu-west-1:123456789012:execution:M:e1"
    assert iam.required("states", "DescribeExecution", {"executionArn": execution}) == [
        ("states:DescribeExecution", execution)
    ]
    assert iam.required("states", "StartExecution", {"stateMachineArn": MACHINE_ARN}) == [
        ("states:StartExecution", MACHINE_ARN)
    ]
    owned = iam.required("states", "SendTaskSuccess", {"taskToken": "t"}, token_owner=lambda token: MACHINE_ARN)
    assert owned == [("states:SendTaskSuccess", MACHINE_ARN)]
    grants = iam.grants([_allow(["dynamodb:GetItem", "logs:PutLogEvents"], [TABLE_ARN])])
    assert grants == {("dynamodb:GetItem", TABLE_ARN)}
    assert iam.grant_used(("dynamodb:Query", f"{TABLE_ARN}/index/*"), [("dynamodb:Query", f"{TABLE_ARN}/index/x")])
    assert not iam.grant_used(("dynamodb:Query", f"{TABLE_ARN}/index/*"), [("dynamodb:Query", TABLE_ARN)])


# -- reference resolution ----------------------------------------------------------------------------------------

_TEMPLATE = {
    "Parameters": {"Shards": {"Type": "Number", "Default": 1}, "Wait": {"Type": "Number", "Default": 60}},
    "Resources": {
        "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
        "Machine": {"Type": "AWS::StepFunctions::StateMachine", "Properties": {"StateMachineName": "Dormant-resume"}},
        "Fn": {"Type": "AWS::Lambda::Function", "Properties": {}},
        "Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {}},
    },
}


def test_references_resolve_to_one_consistent_set_of_names() -> None:
    template = Template(_TEMPLATE, Names(table_name="tbl", parameters={"Wait": 3}))
    store = {"Fn::Join": ["", ["dynamodb://", {"Ref": "Table"}, "?shards=", {"Ref": "Shards"}]]}
    assert template.resolve(store) == "dynamodb://tbl?shards=1"
    assert template.resolve({"Fn::GetAtt": ["Table", "Arn"]}) == "arn:aws:dynamodb:eu-west-1:123456789012:table/tbl"
    assert template.resolve({"Ref": "Machine"}) == "arn:aws:states:eu-west-1:123456789012:stateMachine:Dormant-resume"
    assert template.resolve({"Ref": "Wait"}) == 3  # a given value wins over the default
    sub = {"Fn::Sub": ["${AWS::Partition}:${Fn.Arn}:${X}:${!Literal}", {"X": {"Ref": "AWS::Region"}}]}
    assert template.resolve(sub) == "aws:arn:aws:lambda:eu-west-1:123456789012:function:Dormant-Fn:eu-west-1:${Literal}"
    assert template.resolve({"Fn::GetAtt": "Logs.Arn"}).startswith("arn:aws:logs:eu-west-1:123456789012:log-group:")
    assert template.resolve({"Fn::Select": [1, {"Fn::Split": [",", "a,b"]}]}) == "b"


# -- the ASL interpreter -----------------------------------------------------------------------------------------


class _Functions:
    """Scripted Lambda results by function name: a list of (ok, value) answered in order."""

    def __init__(self, script: dict[str, list[tuple[bool, Any]]]) -> None:
        self.script = script
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, function: str, payload: Any) -> tuple[bool, Any]:
        self.seen.append((function, payload))
        return self.script[function].pop(0)


def until(condition: Any, what: str, timeout: float = 120, evidence: Any = None, every: float = 0.05) -> Any:
    """Poll ``condition`` every ``every`` s until it returns something true (which is returned); fail naming
    ``what`` (and what ``evidence()`` says then) after ``timeout`` s. A generous bound: the tests wait on what they
    need, not on a fixed time, which a loaded machine overruns."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s; {evidence() if evidence else ''}"
        time.sleep(every)
    return found


def _run(definition: dict[str, Any], functions: _Functions, data: Any, **options: Any) -> Any:
    sfn = StepFunctions(functions, **{"time_scale": 0.001, **options})
    sfn.create_state_machine(MACHINE_ARN, definition)
    arn = sfn.start_execution(MACHINE_ARN, "e1", json.dumps(data))["executionArn"]
    until(lambda: sfn.executions[arn].status != "RUNNING", "the execution ended")
    return sfn.executions[arn]


def _task(function: str, **extra: Any) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": {"FunctionName": function, "Payload.$": "$"},
        **extra,
    }


def test_asl_retry_catch_choice_and_result_paths() -> None:
    definition = {
        "StartAt": "Work",
        "States": {
            "Work": _task(
                "work",
                ResultSelector={"status.$": "$.Payload.status"},
                ResultPath="$.worked",
                Retry=[{"ErrorEquals": ["Busy"], "MaxAttempts": 2, "IntervalSeconds": 1, "BackoffRate": 2}],
                Catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Failed"}],
                Next="Branch",
            ),
            "Branch": {
                "Type": "Choice",
                "Choices": [
                    {
                        "And": [
                            {"Variable": "$.worked.status", "StringEquals": "again"},
                            {"Variable": "$.n", "NumericLessThan": 3},
                        ],
                        "Next": "Count",
                    },
                    {"Not": {"Variable": "$.worked", "IsPresent": False}, "Next": "Done"},
                ],
            },
            "Count": {
                "Type": "Pass",
                "Parameters": {"n.$": "States.MathAdd($.n, 1)"},
                "ResultPath": "$.counted",
                "Next": "Done",
            },
            "Failed": {"Type": "Fail", "Error": "Recorded"},
            "Done": {"Type": "Succeed"},
        },
    }
    busy = (False, {"errorType": "Busy", "errorMessage": "try later"})
    functions = _Functions({"work": [busy, busy, (True, {"status": "again"})]})
    ended = _run(definition, functions, {"n": 1})
    assert ended.status == "SUCCEEDED", ended.cause
    assert len(functions.seen) == 3  # two retries of the retryable error
    assert json.loads(ended.output or "") == {"n": 1, "worked": {"status": "again"}, "counted": {"n": 2}}
    assert ended.states == ["Work", "Branch", "Count", "Done"]

    # past MaxAttempts the Catch takes it, with the error at its ResultPath
    functions = _Functions({"work": [busy, busy, busy]})
    ended = _run(definition, functions, {"n": 1})
    assert ended.status == "FAILED" and ended.error == "Recorded" and ended.states == ["Work", "Failed"]
    # a non-retryable error is not retried
    functions = _Functions({"work": [(False, {"errorType": "KeyError", "errorMessage": "x"})]})
    assert _run(definition, functions, {"n": 1}).states == ["Work", "Failed"] and len(functions.seen) == 1


def test_asl_result_path_null_keeps_the_input_and_a_missing_choice_fails() -> None:
    definition = {
        "StartAt": "Note",
        "States": {
            "Note": _task("note", ResultPath=None, Next="Branch"),
            "Branch": {"Type": "Choice", "Choices": [{"Variable": "$.a", "BooleanEquals": True, "Next": "Done"}]},
            "Done": {"Type": "Succeed"},
        },
    }
    ended = _run(definition, _Functions({"note": [(True, {"ignored": 1})]}), {"a": True})
    assert ended.status == "SUCCEEDED" and json.loads(ended.output or "") == {"a": True}
    ended = _run(definition, _Functions({"note": [(True, {})]}), {"a": False})
    assert ended.status == "FAILED" and ended.error == "States.NoChoiceMatched"


def test_asl_paths_and_intrinsics() -> None:
    data, context = {"a": {"b": [1, 2]}, "s": "x"}, {"Execution": {"Name": "e"}}
    assert fill({"v.$": "$.a.b[1]", "n.$": "$$.Execution.Name", "k": {"x.$": "$.s"}}, data, context) == {
        "v": 2,
        "n": "e",
        "k": {"x": "x"},
    }
    assert intrinsic("States.Format('{}-{}', $.s, $.a.b[0])", data, context) == "x-1"
    assert intrinsic("States.ArrayLength($.a.b)", data, context) == 2
    assert intrinsic("States.StringToJson(States.JsonToString($.a))", data, context) == {"b": [1, 2]}
    assert path_set({"a": 1}, "$.r.s", 2) == {"a": 1, "r": {"s": 2}}
    with pytest.raises(StatesError):
        fill({"v.$": "$.missing"}, data, context)


def test_a_task_token_wait_answers_times_out_and_refuses_spent_tokens() -> None:
    definition = {
        "StartAt": "Wait",
        "States": {
            "Wait": {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                "Parameters": {"FunctionName": "park", "Payload": {"token.$": "$$.Task.Token"}},
                "TimeoutSeconds": 1,
                "ResultPath": "$.answer",
                "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.error", "Next": "Expired"}],
                "End": True,
            },
            "Expired": {"Type": "Succeed"},
        },
    }
    functions = _Functions({"park": [(True, {}), (True, {})]})
    sfn = StepFunctions(functions)
    sfn.create_state_machine(MACHINE_ARN, definition)
    arn = sfn.start_execution(MACHINE_ARN, "e1", "{}")["executionArn"]
    # the same name and input while it runs: the same execution; other input: refused
    assert sfn.start_execution(MACHINE_ARN, "e1", "{}")["executionArn"] == arn
    with pytest.raises(ApiError, match="Already"):
        sfn.start_execution(MACHINE_ARN, "e1", '{"x": 1}')
    until(lambda: functions.seen, "park called with its token")
    token = functions.seen[0][1]["token"]
    assert (
        iam.required("states", "SendTaskSuccess", {"taskToken": token}, token_owner=sfn.token_owner)[0][1]
        == MACHINE_ARN
    )
    sfn.send_task(token, ("success", '{"answered": true}'))
    until(lambda: sfn.executions[arn].status != "RUNNING", "the answered execution ended")
    assert json.loads(sfn.executions[arn].output or "") == {"answer": {"answered": True}}
    assert sfn.executions[arn].states == ["Wait"]
    with pytest.raises(ApiError, match="Timed Out"):
        sfn.send_task(token, ("success", "{}"))  # spent
    with pytest.raises(ApiError, match="Invalid"):
        sfn.send_task("not-a-token", ("success", "{}"))
    unknown = base64.urlsafe_b64encode(json.dumps({"m": MACHINE_ARN, "t": "x"}).encode()).decode()
    with pytest.raises(ApiError, match="Does Not Exist"):
        sfn.send_task(unknown, ("success", "{}"))
    # unanswered: the wait times out into the Catch
    arn = sfn.start_execution(MACHINE_ARN, "e2", "{}")["executionArn"]
    until(lambda: sfn.executions[arn].status != "RUNNING", "the unanswered execution ended")
    assert sfn.executions[arn].states == ["Wait", "Expired"]
    assert json.loads(sfn.executions[arn].output or "")["error"]["Error"] == "States.Timeout"


def test_the_api_speaks_to_botocore_with_aws_errors() -> None:
    import botocore.session

    sfn = StepFunctions(_Functions({"park": [(True, {})]}))
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}
    sfn.create_state_machine(MACHINE_ARN, definition)
    try:
        client = botocore.session.get_session().create_client(
            "stepfunctions",
            endpoint_url=sfn.serve(),
            region_name="eu-west-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        started = client.start_execution(stateMachineArn=MACHINE_ARN, name="n1", input='{"a": 1}')
        assert started["executionArn"].endswith(":execution:M:n1")
        with pytest.raises(client.exceptions.ExecutionAlreadyExists):
            client.start_execution(stateMachineArn=MACHINE_ARN, name="n1", input='{"a": 2}')
        with pytest.raises(client.exceptions.InvalidToken):
            client.send_task_success(taskToken="nonsense", output="{}")
        described = client.describe_execution(executionArn=started["executionArn"])
        assert described["name"] == "n1" and described["status"] in ("RUNNING", "SUCCEEDED")
        listed = client.list_executions(stateMachineArn=MACHINE_ARN)["executions"]
        assert [e["name"] for e in listed] == ["n1"]
    finally:
        sfn.close()


def test_a_parked_task_sleeps_on_its_token_and_wakes_when_its_execution_ends() -> None:
    """Thousands of parked tasks (the busy day's sleepers) cost nothing while they sleep: a parked task waits on its
    token, not on a poll (its backstop look is ``poll_seconds`` away), and still ends at once when its execution is
    stopped, or reaches Step Functions' time limit."""
    definition = {
        "StartAt": "Park",
        "States": {
            "Park": {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                "Parameters": {"FunctionName": "park", "Payload": {"token.$": "$$.Task.Token"}},
                "End": True,
            }
        },
    }
    sfn = StepFunctions(_Functions({"park": [(True, {}), (True, {})]}), max_execution_seconds=4.0)
    assert sfn.poll_seconds >= 60
    sfn.create_state_machine(MACHINE_ARN, definition)

    def thread(name: str) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == f"sfn-{name}"]

    stopped = sfn.start_execution(MACHINE_ARN, "stopped", "{}")["executionArn"]
    until(lambda: sfn.executions[stopped].history[-1]["type"] == "TaskSubmitted", "parked")
    sfn.stop_execution(stopped)
    until(lambda: not thread("stopped"), "the stopped execution's task woke and ended", timeout=2)
    assert sfn.executions[stopped].status == "ABORTED"
    timed = sfn.start_execution(MACHINE_ARN, "timed", "{}")["executionArn"]
    until(lambda: sfn.executions[timed].status != "RUNNING", "the time limit ended the execution", timeout=8)
    assert sfn.executions[timed].status == "TIMED_OUT"
    until(lambda: not thread("timed"), "its task ended", timeout=2)


def test_an_execution_fails_past_the_history_limit() -> None:
    definition = {
        "StartAt": "Loop",
        "States": {
            "Loop": {"Type": "Pass", "Next": "Again"},
            "Again": {"Type": "Choice", "Choices": [{"Variable": "$", "IsPresent": True, "Next": "Loop"}]},
        },
    }
    ended = _run(definition, _Functions({}), {})
    assert ended.status == "FAILED" and "25,000" in (ended.cause or "")
    assert len(ended.history) == 25_002  # the event past the cap, then ExecutionFailed


def test_an_execution_ends_at_its_time_limit() -> None:
    definition = {
        "StartAt": "W",
        "States": {"W": {"Type": "Wait", "Seconds": 100, "Next": "D"}, "D": {"Type": "Succeed"}},
    }
    ended = _run(definition, _Functions({}), {}, max_execution_seconds=0.2, time_scale=1.0)
    assert ended.status == "TIMED_OUT"


# -- the Lambda sandboxes ---------------------------------------------------------------------------------------

_HANDLER = """
import json, os, sys, time

def handler(event, context):
    kind = event["kind"]
    if kind == "env":
        return {"env": dict(os.environ), "path": sys.path, "remaining": context.get_remaining_time_in_millis()}
    if kind == "sleep":
        time.sleep(event["seconds"])
        return {"slept": True}
    if kind == "big":
        return "x" * (6 * 1024 * 1024 + 1)
    if kind == "raise":
        raise LookupError("no such thing")
    if kind == "allocate":  # touched, so resident; kept until the end of the invocation unless dropped
        held = "x" * (event["mb"] * 1024 * 1024)
        if event.get("drop"):
            del held
        if not event.get("then_aws"):
            return {"allocated": event["mb"]}
        kind = "aws"
    if kind == "aws":
        import botocore.session
        client = botocore.session.get_session().create_client("dynamodb")
        try:
            client.get_item(TableName=event["table"], Key={"pk": {"S": "x"}})
        except client.exceptions.ClientError as exc:
            return {"error": exc.response["Error"]["Code"], "message": exc.response["Error"]["Message"]}
        return {"error": None}
"""


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[Any]:
    from tests.support.fidelity.lambda_ import LambdaService
    from tests.support.fidelity.template import Function

    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text(_HANDLER)
    layer = tmp_path / "layer"
    layer.mkdir()
    function = Function(
        name="probe",
        logical_id="Probe",
        function_name="Dormant-Probe",
        arn="arn:aws:lambda:eu-west-1:123456789012:function:Dormant-Probe",
        handler="app.handler",
        timeout=2,
        memory=256,
        environment={"ONLY_THIS": "1"},
        code_dir=code,
        layers=["Layer"],
        role="ProbeRole",
        statements=[_allow(["dynamodb:GetItem"], ["arn:aws:dynamodb:eu-west-1:123456789012:table/allowed"])],
    )
    # an endpoint nothing listens on: an allowed call fails to connect, a denied one never leaves
    service = LambdaService(
        {"probe": function}, {"Layer": layer}, {"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9"}, tmp_path
    )
    try:
        yield service
    finally:
        service.close()


def test_a_sandbox_sees_only_its_environment_and_lambdas_path(sandboxes: Any, tmp_path: Path) -> None:
    seen = sandboxes.invoke("probe", {"kind": "env"})
    assert seen.ok, seen.error()
    env = seen.payload["env"]
    assert env["ONLY_THIS"] == "1" and env["AWS_LAMBDA_FUNCTION_NAME"] == "Dormant-Probe" and env["TZ"] == ":UTC"
    assert "PYTHONPATH" not in env and "HOME" not in env and "PYTEST_CURRENT_TEST" not in env
    assert seen.payload["path"][:2] == [str(tmp_path / "code"), str(tmp_path / "layer")]
    assert 0 < seen.payload["remaining"] <= 2000


def test_a_sandbox_can_be_killed_just_before_a_call(sandboxes: Any) -> None:
    sandboxes.crash_before("probe", "dynamodb:GetItem")
    died = sandboxes.invoke("probe", {"kind": "aws", "table": "allowed"})
    assert (died.ok, died.error_type) == (False, "Runtime.ExitError")
    assert sandboxes.calls == []  # killed before the call was made (or checked)
    again = sandboxes.invoke("probe", {"kind": "aws", "table": "other"})
    assert again.ok and again.payload["error"] == "AccessDeniedException"  # once only, in a fresh sandbox


def test_a_sandbox_can_be_held_just_after_a_call_until_released(sandboxes: Any) -> None:
    import threading

    sandboxes.hold_after("probe", "dynamodb:GetItem")
    done: list[Any] = []
    worker = threading.Thread(
        target=lambda: done.append(sandboxes.invoke("probe", {"kind": "aws", "table": "allowed"}))
    )
    worker.start()
    until(lambda: sandboxes.holding("probe"), "the sandbox held after its call")
    assert [c.action for c in sandboxes.calls] == ["dynamodb:GetItem"]  # the call was made: held after it
    time.sleep(0.3)
    assert not done and sandboxes.busy("probe") == 1  # the invocation waits while held
    sandboxes.release("probe")
    worker.join(30)
    assert done and done[0].error_type == "EndpointConnectionError", done  # then it went on to its end
    assert not sandboxes.holding("probe")
    again = sandboxes.invoke("probe", {"kind": "aws", "table": "allowed"})
    assert again.error_type == "EndpointConnectionError" and not sandboxes.holding("probe")  # once only


def test_a_sandbox_enforces_the_role_timeouts_crashes_and_the_response_limit(sandboxes: Any) -> None:
    denied = sandboxes.invoke("probe", {"kind": "aws", "table": "other"})
    assert denied.ok and denied.payload["error"] == "AccessDeniedException", denied.payload
    assert "dynamodb:GetItem" in denied.payload["message"]
    allowed = sandboxes.invoke("probe", {"kind": "aws", "table": "allowed"})
    assert allowed.error_type == "EndpointConnectionError"  # allowed: it went to the (absent) endpoint
    assert [(c.action, c.allowed) for c in sandboxes.calls] == [("dynamodb:GetItem", False), ("dynamodb:GetItem", True)]

    raised = sandboxes.invoke("probe", {"kind": "raise"})
    assert (raised.ok, raised.error_type) == (False, "LookupError")
    too_big = sandboxes.invoke("probe", {"kind": "big"})
    assert (too_big.ok, too_big.error_type) == (False, "Function.ResponseSizeTooLarge")
    timed_out = sandboxes.invoke("probe", {"kind": "sleep", "seconds": 5})
    assert (timed_out.ok, timed_out.error_type) == (False, "Sandbox.Timedout")
    assert sandboxes.invoke("probe", {"kind": "sleep", "seconds": 0}).ok  # a fresh sandbox after the timeout

    import threading

    killed: list[Any] = []
    worker = threading.Thread(
        target=lambda: killed.append(sandboxes.invoke("probe", {"kind": "sleep", "seconds": 1.5}))
    )
    worker.start()
    # killed as soon as it is busy (in its init or its handler: either way the process dies mid-invocation)
    until(lambda: sandboxes.busy("probe"), "the invocation under way")
    assert sandboxes.kill("probe") == 1
    worker.join()
    assert (killed[0].ok, killed[0].error_type) == (False, "Runtime.ExitError")


def test_a_sandbox_past_its_memory_size_is_killed_as_lambda_kills_it(sandboxes: Any) -> None:
    # the probe is sized 256 MB: its peak (runtime, init, invocations) is Lambda's Max Memory Used
    fits = sandboxes.invoke("probe", {"kind": "allocate", "mb": 64})
    assert fits.ok and 64 < fits.peak_mb < 256, fits
    # the sandbox's own: its init (the runtime, and botocore for the harness's guard) is tens of MB, not the
    # harness's process that started it (whose high-water mark Linux carries over exec in ru_maxrss)
    assert fits.init_mb is not None and 8 < fits.init_mb < 64 and fits.peak_mb - fits.init_mb >= 64, fits
    assert sandboxes.peaks["probe"] == fits.peak_mb and sandboxes.cold_starts["probe"] == 1

    over = sandboxes.invoke("probe", {"kind": "allocate", "mb": 300})
    assert (over.ok, over.error_type) == (False, "Runtime.OutOfMemory"), over
    assert over.error_message.endswith("Error: Runtime exited with error: signal: killed")
    assert sandboxes.peaks["probe"] > 256  # recorded, as Lambda's REPORT line shows it
    assert sandboxes.invoke("probe", {"kind": "allocate", "mb": 1}).ok  # a fresh sandbox: a cold start
    assert sandboxes.cold_starts["probe"] == 2

    # a peak that came and went within the invocation still killed it (the kernel's high-water mark)
    gone = sandboxes.invoke("probe", {"kind": "allocate", "mb": 300, "drop": True})
    assert gone.error_type == "Runtime.OutOfMemory", gone
    # past its size, the sandbox makes no further AWS call: Lambda would have killed it first
    calls = len(sandboxes.calls)
    stopped = sandboxes.invoke("probe", {"kind": "allocate", "mb": 300, "then_aws": True, "table": "allowed"})
    assert stopped.error_type == "Runtime.OutOfMemory" and len(sandboxes.calls) == calls, sandboxes.calls[calls:]
    # a runaway is stopped by the hard limit before it takes the machine, and fails the same way
    runaway = sandboxes.invoke("probe", {"kind": "allocate", "mb": 2048})
    assert runaway.error_type == "Runtime.OutOfMemory" and runaway.peak_mb < 2 * 256, runaway  # never got there
    assert sandboxes.invoke("probe", {"kind": "allocate", "mb": 1}).ok


# -- the deployment --------------------------------------------------------------------------------------------

BROWSER_APP = "https://app.example"
"""The one origin the deployment lets call it from a browser (``-c cors_origins=``)."""


PERSONS_TENANT = "clinic-fidelity"
"""The tenant the machine client ``intake`` is mapped to: people of it see what intake starts."""
MACHINE_CLIENTS = {
    "robot": {"scopes": ["runs.write", "sessions.read"]},
    "billing": {"scopes": ["sessions.read", "runs.write"]},
    "crm": {"scopes": ["sessions.read", "runs.write"], "tenant": "own"},
    "intake": {"scopes": ["sessions.read", "runs.write"], "tenant": PERSONS_TENANT},
    "ops": {"scopes": ["admin"], "tenant": PERSONS_TENANT},
}
"""``-c machine_clients``: each an app client with its scopes, in its own tenant or a person's."""


@pytest.fixture(scope="module")
def deployment(dynamodb_endpoint: str) -> Iterator[Any]:
    """The stack with the fidelity app, started once for the module (synthesis takes a while)."""
    context = {"cors_origins": BROWSER_APP, "machine_clients": json.dumps(MACHINE_CLIENTS)}
    with fidelity_stack(dynamodb_endpoint, time_scale=0.01, context=context) as started:
        yield started


def ended(d: Any, execution: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while execution.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    return execution


def steps_committed(d: Any, sid: str) -> int:
    """How many tool steps of session ``sid`` are committed (on the ledger)."""
    return sum(1 for e in ledger(d, sid) if e["type"] == "tool_result")


def chain(d: Any, sid: str) -> list[Any]:
    """The session's executions, oldest first: each wait ends its execution and the turn goes on in the next."""
    return sorted(d.executions_of(TENANT, sid), key=lambda e: e.started)


def parked(d: Any, sid: str) -> Any:
    """The session's one live execution, asleep in ``Park``."""
    live = [e for e in d.executions_of(TENANT, sid) if e.status == "RUNNING"]
    executions = [(e.name[:8], e.status, e.states, e.error) for e in d.executions_of(TENANT, sid)]
    assert len(live) == 1, f"{len(live)} live executions for {sid} (all: {executions}); {evidence(d)}"
    assert live[0].states[-1] == "Park", (live[0].states, evidence(d))
    return live[0]


def yielded_and_parked(d: Any, sid: str, message: str) -> tuple[dict[str, Any], Any]:
    """Create ``sid`` and run ``message`` until it yields: the session as shown, and the execution parked on it."""
    create(d, sid)
    shown = run(d, sid, message)
    assert shown["status"] == "awaiting_input", (shown["status"], evidence(d))
    return shown, parked(d, sid)


@pytest.mark.backend("dynamodb")
def test_create_run_park_answer_resume_complete(deployment: Any) -> None:
    d, sid = deployment, fresh("park")
    shown, execution = yielded_and_parked(d, sid, "signoffs=1")
    assert execution.states[:1] == ["Run"]  # the turn ran in the workflow, not in the API's request
    done = answer(d, sid, shown)
    assert done["status"] == "completed", (done["status"], evidence(d))
    assert ended(d, execution).status == "SUCCEEDED", (execution.states, execution.error, execution.cause)
    # the wait ended its execution; the rest of the turn ran in the next one, which ended Done
    first, then = chain(d, sid)
    # an answer left to the workflow fails the wait with Answered (SendTaskFailure), caught into Continue
    assert first is execution and execution.states[-4:] == ["Park", "Next loop", "Continue", "Continued"]
    assert [e["details"]["error"] for e in execution.history if e["type"] == "TaskFailed"] == ["Answered"]
    assert then.name == f"{execution.name}-1" and ended(d, then).status == "SUCCEEDED" and then.states[-1] == "Done"


@pytest.mark.backend("dynamodb")
def test_list_sessions(deployment: Any) -> None:
    d, tenant = deployment, fresh("tenant")
    ids = sorted(fresh("list") for _ in range(2))
    for sid in ids:
        create(d, sid, tenant=tenant)
    status, _, body = d.api("GET", "/sessions", tenant=tenant)
    assert status == 200, (status, body, evidence(d))
    assert sorted(s["id"] for s in body["sessions"]) == ids
    # ?status= reads the store's status listing (on DynamoDB its own index, granted by its own ARN)
    for wanted, expected in (("idle", ids), ("running", [])):
        status, _, body = d.api("GET", "/sessions", tenant=tenant, query={"status": wanted, "limit": "1"})
        assert status == 200 and len(body["sessions"]) == min(1, len(expected)), (status, body, evidence(d))
        listed = [s["id"] for s in body["sessions"]]
        if body["cursor"] is not None:  # the cursor goes on within the status
            query = {"status": wanted, "cursor": body["cursor"]}
            listed += [s["id"] for s in d.api("GET", "/sessions", tenant=tenant, query=query)[2]["sessions"]]
        assert sorted(listed) == expected and {s["status"] for s in body["sessions"]} <= {wanted}, (wanted, body)
    # a route the template does not have is API Gateway's answer, not a function's (in the API's error shape)
    refused = (403, {"error": "MISSING_AUTHENTICATION_TOKEN", "message": "Missing Authentication Token"})
    assert d.api("GET", "/nowhere")[::2] == refused


@pytest.mark.backend("dynamodb")
def test_an_id_a_client_escapes_in_the_path_is_the_same_session(deployment: Any) -> None:
    """API Gateway's REST API passes ``path`` as the client escaped it (only ``pathParameters`` are decoded) and
    the handlers route on the path: an id holding ``:@+=``, escaped as a browser escapes a path segment, reaches
    the same session through every function that takes an id in its path."""
    d, sid = deployment, fresh("visit:a@b+c=d")
    create(d, sid)
    escaped = quote(sid, safe="")
    assert escaped != sid
    assert show(d, escaped)["id"] == sid  # sessions
    status, _, ran = d.api("POST", f"/sessions/{escaped}/runs", {"message": "signoffs=0"})  # run
    assert status in (200, 202), (status, ran, evidence(d))
    d.settle()
    body = {"expected_version": show(d, sid)["version"], "events": [{"type": "user", "text": "escaped"}]}
    status, _, committed = d.api("POST", f"/sessions/{escaped}/commit", body)  # commit
    assert status == 200, (status, committed, evidence(d))
    assert "escaped" in [e.get("text") for e in ledger(d, escaped)]


def _as(d: Any, token: Any, method: str, path: str, body: Any = None, **options: Any) -> tuple[int, Any]:
    status, _, answered = d.api(method, path, body, token=token, **options)
    return status, answered


@pytest.mark.backend("dynamodb")
def test_people_of_a_tenant_approve_by_group_four_eyes_and_machine_scopes(deployment: Any) -> None:
    """Issue 22's done-when, on the stack: tenant T's requester A, approver B, outsider C; D of tenant U; a
    machine client that may only run."""
    from tests.support.fidelity.deployment import Token

    d, tenant, other = deployment, fresh("clinic"), fresh("lab")
    a, b, c = (Token.person(fresh(who), tenant) for who in ("alice", "bob", "carol"))
    b = Token.person(b.sub, tenant, groups=["approvers", "staff"])
    dave = Token.person(fresh("dave"), other, groups=["approvers"])
    sid = fresh("booking")
    assert _as(d, a, "POST", "/sessions", {"session_id": sid})[0] == 201
    status, started = _as(d, a, "POST", f"/sessions/{sid}/runs", {"message": "tool=approve"})
    assert status in (200, 202), (status, started, evidence(d))
    d.settle()
    status, shown = _as(d, b, "GET", f"/sessions/{sid}")  # B, of the same tenant, sees A's session
    assert status == 200 and shown["status"] == "awaiting_input", (status, shown, evidence(d))
    (call,) = shown["yielded_tools"]
    assert call["name"] == "approve" and call["answerable_by"] == ["group:approvers"] and call["answerable"]

    # who may answer: B sees it in ?awaiting=me; A and C (outside the group) do not
    status, mine = _as(d, b, "GET", "/sessions", query={"awaiting": "me"})
    assert status == 200 and [(s["id"], [x["call_id"] for x in s["calls"]]) for s in mine["sessions"]] == [
        (sid, [call["call_id"]])
    ], mine
    for outsider in (a, c):
        assert _as(d, outsider, "GET", "/sessions", query={"awaiting": "me"}) == (200, {"sessions": [], "cursor": None})
    approval = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, refused = _as(d, c, "POST", f"/sessions/{sid}/tools", approval)
    assert status == 403 and refused["error"] == "AnswerRefused", refused
    assert call["call_id"] in refused["message"] and "group:approvers" in refused["message"]
    assert _as(d, dave, "POST", f"/sessions/{sid}/tools", approval)[0] == 404  # another tenant: no such session
    status, events = _as(d, a, "GET", f"/sessions/{sid}/events", query={"limit": "1000"})
    assert status == 200 and not [e for e in events["events"] if e["type"] == "tool_input"]  # nothing written
    status, _ = _as(d, b, "POST", f"/sessions/{sid}/tools", approval)
    assert status == 202, evidence(d)
    d.settle()
    status, events = _as(d, a, "GET", f"/sessions/{sid}/events", query={"limit": "1000"})
    (answered,) = [e for e in events["events"] if e["type"] == "tool_input"]
    assert answered["principal"] == b.sub  # recorded as B (C's refusal wrote nothing: one answer)
    assert [e["principal"] for e in events["events"] if e["type"] == "invocation_start"] == [a.sub]  # A started it
    assert _as(d, a, "GET", f"/sessions/{sid}")[1]["status"] == "completed", evidence(d)

    # four eyes: A may not answer the review A's own run asked for; C may
    second = fresh("review")
    assert _as(d, a, "POST", "/sessions", {"session_id": second})[0] == 201
    assert _as(d, a, "POST", f"/sessions/{second}/runs", {"message": "tool=review"})[0] in (200, 202)
    d.settle()
    (review,) = _as(d, a, "GET", f"/sessions/{second}")[1]["yielded_tools"]
    own = {"answers": [{"call_id": review["call_id"], "input": {"approved": True}}]}
    status, refused = _as(d, a, "POST", f"/sessions/{second}/tools", own)
    assert status == 403 and "not_starter" in refused["message"], refused
    assert _as(d, c, "POST", f"/sessions/{second}/tools", own)[0] == 202, evidence(d)

    # a machine client with dormant/runs.write only: it runs, under /clients; it cannot answer, nor read
    robot = d.machine_token("robot", ["dormant/runs.write"])
    job = fresh("job")
    assert _as(d, robot, "POST", "/clients/sessions", {"session_id": job})[0] == 201
    status, ran = _as(d, robot, "POST", f"/clients/sessions/{job}/runs", {"message": "signoffs=1"})
    assert status in (200, 202), (ran, evidence(d))
    d.settle()
    machine_call = {"answers": [{"call_id": "any", "input": {"approved": True}}]}
    invoked = len(d.lambdas.invocations)
    assert _as(d, robot, "POST", f"/clients/sessions/{job}/tools", machine_call)[0] == 401  # no answers.write
    assert _as(d, robot, "GET", f"/clients/sessions/{job}")[0] == 401  # no sessions.read
    assert _as(d, robot, "POST", f"/sessions/{job}/runs", {"message": "x"})[0] == 401  # people's method: ID only
    assert _as(d, a, "GET", f"/clients/sessions/{sid}")[0] == 401  # the machines' method: access tokens only
    assert len(d.lambdas.invocations) == invoked  # the authorizer refused them all: no function ran
    reader = d.machine_token("robot", ["dormant/sessions.read"])
    status, job_shown = _as(d, reader, "GET", f"/clients/sessions/{job}")
    assert status == 200 and job_shown["status"] == "awaiting_input", (job_shown, evidence(d))


@pytest.mark.backend("dynamodb")
def test_a_second_yield_parks_again_in_a_fresh_execution(deployment: Any) -> None:
    d, sid = deployment, fresh("twice")
    first, execution = yielded_and_parked(d, sid, "signoffs=2")
    second = answer(d, sid, first)
    assert second["status"] == "awaiting_input" and second["yielded_tools"][0]["args"] == {"step": 2}, evidence(d)
    again = parked(d, sid)
    assert again is not execution and again.name == f"{execution.name}-1"  # continued as new
    assert answer(d, sid, second)["status"] == "completed", evidence(d)
    executions = chain(d, sid)
    assert [ended(d, e).status for e in executions] == ["SUCCEEDED"] * 3
    # one wait per execution: its history stays short whatever the number of yields (the cap is 25,000)
    longest = max(len(e.history) for e in executions)
    print(f"history events per execution: {[len(e.history) for e in executions]}")
    assert longest <= 40, longest


@pytest.mark.backend("dynamodb")
def test_an_unanswered_wait_expires(deployment: Any) -> None:
    d, sid = deployment, fresh("expire")
    default = d.template.parameter("WaitTimeoutSeconds")
    d.update({"WaitTimeoutSeconds": 3})
    try:
        create(d, sid)
        status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"})
        assert status in (200, 202), (status, body, evidence(d))
        # That it waited shows in the execution's history and the ledger, read once it is over: a look at the
        # session while it waits would race the 3 s wait on a slow machine.
        (execution,) = until(
            lambda: [e for e in d.executions_of(TENANT, sid) if e.status != "RUNNING"], "the wait's execution ended"
        )
        d.settle()
    finally:
        d.update({"WaitTimeoutSeconds": default})
    assert execution.status == "SUCCEEDED" and execution.states[-6:] == [
        "Run",
        "After the run",
        "Park",
        "Expire",
        "Answered as it expired?",
        "Expired",
    ], (execution.states, evidence(d))
    events = ledger(d, sid)
    assert events[-2]["type"] == "invocation_yield", [e["type"] for e in events]  # it waited on the sign-off
    end = events[-1]
    assert end["type"] == "invocation_end" and end["error_type"] == "SessionExpired", end
    assert show(d, sid)["status"] == "error"


@pytest.mark.backend("dynamodb")
def test_a_model_failure_after_resume_is_recorded(deployment: Any) -> None:
    d, sid = deployment, fresh("fail")
    shown, execution = yielded_and_parked(d, sid, "signoffs=1 fail=model")
    failed = answer(d, sid, shown)
    assert failed["status"] == "error", (failed["status"], evidence(d))
    end = ledger(d, sid)[-1]
    assert end["type"] == "invocation_end" and "crashed" in (end.get("error") or ""), end
    assert ended(d, execution).status != "RUNNING"


@pytest.mark.backend("dynamodb")
def test_a_run_throttled_past_its_retries_is_recorded_by_park_not_by_resume(deployment: Any) -> None:
    """The stack's own ASL: a Run whose function stays at its reserved concurrency is retried as long as
    ``THROTTLE_RETRY`` says (1 + 1,440 attempts, about a day), then ``RecordFailure`` runs on park, never on resume,
    whose cap refused it: the turn ends on the ledger instead of staying ``running`` until the sweeper."""
    from infra.workflow import THROTTLE_RETRY

    d = deployment
    resume, park = d.functions["resume"].arn, d.functions["park"].arn
    throttled = (False, {"errorType": "Lambda.TooManyRequestsException", "errorMessage": "Rate Exceeded."})
    attempts = 1 + int(THROTTLE_RETRY["attempts"])
    functions = _Functions({resume: [throttled] * attempts, park: [(True, {"status": "error"})]})
    given = {"tenant": "t", "session_id": "s", "invocation_id": "inv_1", "name": "n", "loop": 0}
    ended = _run(d.definition, functions, given, time_scale=0.00002)  # a day of retries in about 2 s
    assert ended.status == "FAILED" and ended.states == ["Run", "RecordFailure", "Failed"], ended.states
    assert [f for f, _ in functions.seen] == [resume] * attempts + [park]
    recorded = functions.seen[-1][1]
    assert recorded["action"] == "fail" and recorded["error"]["Error"] == "Lambda.TooManyRequestsException"


@pytest.mark.backend("dynamodb")
def test_a_function_sized_below_what_it_needs_fails_as_lambda_fails_it(deployment: Any) -> None:
    """A function whose sandbox passes its ``MemorySize`` is killed (``Runtime.OutOfMemory``), its sandbox discarded:
    behind the API, API Gateway answers 502; as the workflow's ``Run``, Step Functions retries it (each attempt a
    cold start, killed again), then ``RecordFailure`` ends the turn on the ledger naming the error: not stuck."""
    from infra.workflow import RUNNER_LOST

    d = deployment
    sized = {name: d.functions[name].memory for name in ("sessions", "resume")}
    d.lambdas.resize("sessions", 16)  # below what its runtime and imports take
    try:
        status, _, body = d.api("GET", "/sessions")
    finally:
        d.lambdas.resize("sessions", sized["sessions"])
    assert status == 502 and body["message"] == "Internal server error", (status, body)
    assert d.errors("sessions")[-1][1] == "Runtime.OutOfMemory", d.errors("sessions")[-1]

    # what a turn takes a cold resume sandbox to, by its init and by the turn's end: sized between the two, the
    # sandbox starts, and the turn takes it past its size
    sid = fresh("sized")
    create(d, sid)
    d.lambdas.resize("resume", sized["resume"])  # its idle sandboxes retired: the turn's starts cold
    assert run(d, sid, "signoffs=0")["status"] == "completed"
    turn = next(i for i in reversed(d.lambdas.invocations) if i.function == "resume" and i.init_mb is not None)
    assert turn.ok and turn.init_mb is not None and turn.peak_mb - turn.init_mb >= 4, turn
    small, cold = (turn.init_mb + turn.peak_mb) // 2, d.lambdas.cold_starts["resume"]
    sid = fresh("small")
    create(d, sid)
    d.lambdas.resize("resume", small)
    try:
        ended = run(d, sid, "signoffs=0")
    finally:
        d.lambdas.resize("resume", sized["resume"])
    killed = [e for e in d.errors("resume")[-5:] if e[1] == "Runtime.OutOfMemory"]
    assert "Runtime.OutOfMemory" in RUNNER_LOST and len(killed) == 5, (small, d.errors("resume")[-6:])  # 1 + 4 retries
    assert d.lambdas.cold_starts["resume"] - cold == 5  # each attempt in a fresh sandbox
    assert ended["status"] != "running", ended
    end = ledger(d, sid)[-1]
    assert end["type"] == "invocation_end" and end["error_type"] == "Runtime.OutOfMemory", end


@pytest.mark.backend("dynamodb")
def test_a_runner_killed_half_way_is_ended_with_its_committed_steps_kept(deployment: Any) -> None:
    import threading

    d, sid = deployment, fresh("killed")
    create(d, sid)
    answers: list[Any] = []
    request = threading.Thread(
        target=lambda: answers.append(d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=4 sleep=1 signoffs=0"}))
    )
    request.start()
    # the turn runs in the workflow (target) or in the request (today): kill whichever runs it, mid-turn, once
    # it has committed a step (not after a fixed time: a slow cold start would make that a kill before any step)
    until(lambda: steps_committed(d, sid) >= 1, "a first step committed", evidence=lambda: evidence(d))
    assert d.kill("resume") + d.kill("run") >= 1, "no runner was running the turn"
    request.join(30)
    d.settle()
    if show(d, sid)["status"] == "running":
        event = json.loads((Path(__file__).resolve().parents[2] / "events/schedule/sweeper.json").read_text())
        ok, result = d.invoke("sweeper", event)
        assert ok, (result, evidence(d))
        d.settle()
    shown = show(d, sid)
    assert shown["status"] != "running", f"still running after the runner died and a sweep ({answers}); {evidence(d)}"
    steps = [e for e in ledger(d, sid) if e["type"] == "tool_result"]
    assert steps, "the steps completed before the kill were not kept"


@pytest.mark.backend("dynamodb")
def test_a_run_that_dies_before_starting_its_execution_claims_nothing(deployment: Any) -> None:
    """The execution is started before the claim: a run function that dies first leaves the session as it was
    (no claim, so nothing waits for a runner that never comes), and the caller's retry goes through."""
    d, sid = deployment, fresh("nostart")
    create(d, sid)
    d.crash_before("run", "states:StartExecution")
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"})
    assert status == 502, (status, body)
    d.settle()
    assert not d.executions_of(TENANT, sid), "the run started an execution although it died before the call"
    shown = show(d, sid)
    assert (shown["status"], shown["version"]) == ("idle", 1), (shown, evidence(d))
    assert run(d, sid, "signoffs=1")["status"] == "awaiting_input", evidence(d)
    parked(d, sid)


@pytest.mark.backend("dynamodb")
def test_a_run_retried_after_its_answer_was_lost_past_its_claim_claims_no_second_turn(deployment: Any) -> None:
    """The run function claims the turn, then its answer is lost before its idempotency record says so (here the
    record's completion is refused; under load, the function timed out there). The record stays in progress only
    until the function's timeout; the client's retry with the same ``Idempotency-Key`` comes after that. The
    retry finds the turn its first attempt claimed on the ledger (the invocation id is derived from the key) and
    answers 202 for it: one user message, one invocation, one execution, however many attempts."""
    d, sid = deployment, fresh("lost")
    create(d, sid)
    function = d.functions["run"]
    timeout, function.timeout = function.timeout, 4.0  # as if deployed with a 4 s timeout: the record expires sooner
    key = {"Idempotency-Key": f"k-{sid}"}
    try:
        d.fail_next("run", "UpdateItem", ["COMPLETED"], "ValidationException")  # the claim landed, its answer lost
        status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=0"}, headers=key)
        assert status >= 500 and not d.lambdas.fault_armed("run"), (status, body, evidence(d))
        d.settle()
        assert [e["type"] for e in ledger(d, sid) if e["type"] == "user"] == ["user"], evidence(d)
        time.sleep(4.5)  # past the in-progress record's expiry (the function's timeout, from its start)
        status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=0"}, headers=key)
    finally:
        function.timeout = timeout
    assert status == 202, (status, body, evidence(d))
    d.settle()
    events = ledger(d, sid)
    assert len([e for e in events if e["type"] == "user"]) == 1, [e["type"] for e in events]  # no second turn
    assert len([e for e in events if e["type"] == "invocation_start"]) == 1, [e["type"] for e in events]
    assert body["after"] == next(i for i, e in enumerate(events) if e["type"] == "invocation_start"), body
    assert len(d.executions_of(TENANT, sid)) == 1, evidence(d)
    assert show(d, sid)["status"] == "completed", evidence(d)


@pytest.mark.backend("dynamodb")
def test_answers_retried_after_their_wake_up_failed_wake_the_parked_turn(deployment: Any) -> None:
    """The tools function stores the answers, then waking the parked execution fails (a 5xx to the caller; the
    idempotency record goes with the failure). The client's retry with the same ``Idempotency-Key`` finds its
    answers on the ledger: it writes nothing again and wakes the execution, so the turn completes now, not after
    the sweeper's grace. Without the key, the same answers are another request: a 409, the call answered."""
    d, sid = deployment, fresh("rewake")
    shown, execution = yielded_and_parked(d, sid, "signoffs=1")
    call = shown["yielded_tools"][0]["call_id"]
    body = {"answers": [{"call_id": call, "input": {"approved": True}}]}
    key = {"Idempotency-Key": f"k-{sid}"}
    # an answer left to the workflow wakes it with Answered (SendTaskFailure)
    d.lambdas.fail_next("tools", "SendTaskFailure", [], {"__type": "ValidationException", "message": "harness fault"})
    status, _, failed = d.api("POST", f"/sessions/{sid}/tools", body, headers=key)
    assert status >= 500 and not d.lambdas.fault_armed("tools"), (status, failed, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "resumable" and execution.status == "RUNNING", evidence(d)  # answered, asleep
    stored = ledger(d, sid)
    status, _, again = d.api("POST", f"/sessions/{sid}/tools", body)
    assert status == 409 and again["error"] == "UnknownCallId", (status, again)  # keyless: another request
    changed = {"answers": [{"call_id": call, "input": {"approved": False}}]}
    status, _, again = d.api("POST", f"/sessions/{sid}/tools", changed, headers=key)
    assert status == 409 and again["error"] == "UnknownCallId", (status, again)  # not what landed: not its retry
    status, _, again = d.api("POST", f"/sessions/{sid}/tools", body, headers=key)
    assert status == 202 and again.get("woke") is True, (status, again, evidence(d))
    d.settle()
    events = ledger(d, sid)
    assert events[: len(stored)] == stored and [e["type"] for e in events].count("tool_input") == 1, events
    assert show(d, sid)["status"] == "completed", evidence(d)
    assert ended(d, execution).status == "SUCCEEDED", (execution.states, evidence(d))


# -- the claim grace: the execution starts just before the API's claim lands -------------------------------------

_READS = {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchGetItem", "dynamodb:Scan"}
_WRITES = {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"}


def run_attempts(execution: Any) -> list[tuple[float, str]]:
    """Each attempt of the execution's ``Run`` task, from its history: (seconds it took, how it ended: the error
    or ``ok``). Step Functions retries within the task, so every retry is one more attempt here."""
    attempts, started = [], None
    for event in list(execution.history):
        details = event.get("details") or {}
        if event["type"] == "TaskScheduled":
            payload = (details.get("parameters") or {}).get("Payload") or {}
            started = event["timestamp"] if payload.get("action") == "run" else None
        elif started is not None and event["type"] in ("TaskSucceeded", "TaskFailed"):
            outcome = "ok" if event["type"] == "TaskSucceeded" else str(details.get("error"))
            attempts.append((event["timestamp"] - started, outcome))
            started = None
    return attempts


def warm_turn(d: Any, sid: str) -> dict[str, Any]:
    """A first turn of ``sid`` to its end: the run and resume functions are warm after it (a cold start would
    outlast the race these scenarios set up), and the session has a ledger to compare with."""
    create(d, sid)
    shown = run(d, sid, "signoffs=0")
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    d.settle()
    return shown


@contextlib.contextmanager
def claim_held(d: Any, sid: str) -> Iterator[tuple[Any, Any, list[Any]]]:
    """``POST /runs`` of ``sid`` with the run function held just after it started the turn's execution, so its
    claim has not landed; yields once the execution's ``Run`` has read the session: the execution, the request's
    thread and the list its answer goes to. The run function is let go on the way out (its claim then lands)."""
    import threading

    before = {e.arn for e in d.executions_of(TENANT, sid)}
    reads = len(d.calls("resume"))
    d.hold_after("run", "states:StartExecution")
    try:
        answers: list[Any] = []
        request = threading.Thread(
            target=lambda: answers.append(d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=0"}))
        )
        request.start()
        until(lambda: d.holding("run"), "the run function started the execution", evidence=lambda: evidence(d))
        (execution,) = [e for e in d.executions_of(TENANT, sid) if e.arn not in before]
        until(
            lambda: any(c.action in _READS for c in d.calls("resume")[reads:]),
            "the execution's Run read the session",
            evidence=lambda: evidence(d),
            every=0.005,  # seen at once: the time from that read to the claim is the scenario's to set
        )
        yield execution, request, answers
    finally:
        d.release("run")  # never left armed or holding for the scenarios after this one


def invocations(d: Any, function: str) -> int:
    """How many times ``function`` was invoked so far (the harness's Lambda record, successes and failures)."""
    return sum(1 for i in d.lambdas.invocations if i.function == function)


@pytest.mark.backend("dynamodb")
def test_a_claim_landing_just_after_the_run_read_the_session_runs_on_the_first_attempt(deployment: Any) -> None:
    """The API starts the turn's execution, then commits the claim: the state machine's ``Run`` can read the
    session first. Here the claim lands just over 0.1 s after that read (the run function held between its two
    calls): the run reads again within its grace (``CLAIM_GRACE_S``) and runs the turn on its first invocation.
    No ``TurnNotClaimed``, no Step Functions retry (an invocation, a transition and a back-off each), the turn
    committed once."""
    d, sid = deployment, fresh("grace")
    warm_turn(d, sid)
    first = ledger(d, sid)
    calls, invoked = len(d.calls("resume")), invocations(d, "resume")
    with claim_held(d, sid) as (execution, request, answers):
        assert not [c for c in d.calls("resume")[calls:] if c.action in _WRITES], "the run wrote before the claim"
        time.sleep(0.1)  # then the run function goes on: the claim lands a little after the run's first read
    request.join(30)
    ((status, _, body),) = answers
    assert status in (200, 202), (status, body, evidence(d))
    d.settle()
    assert ended(d, execution).status == "SUCCEEDED", (execution.states, execution.error, evidence(d))
    attempts = run_attempts(execution)
    assert [outcome for _, outcome in attempts] == ["ok"], (attempts, evidence(d))  # one attempt, no retry
    assert invocations(d, "resume") - invoked == 1  # and one invocation of the function, as Lambda counts them
    # no transition more (the first Choice every execution pays: a parked turn's starts at Park, issue 36)
    assert execution.states == ["Run", "After the run", "Done"], execution.states
    assert not [e for e in d.errors("resume") if sid in e[2]], d.errors("resume")
    shown = show(d, sid)
    assert shown["status"] == "completed", (shown, evidence(d))
    events = ledger(d, sid)
    turn = events[len(first) :]
    assert events[: len(first)] == first
    assert [e["type"] for e in turn].count("invocation_start") == 1, turn  # the turn committed once
    assert [e["text"] for e in turn if e["type"] == "user"] == ["signoffs=0"], turn
    assert [e["type"] for e in turn].count("invocation_end") == 1, turn
    assert len({e["id"] for e in events}) == len(events), events


@pytest.mark.backend("dynamodb")
def test_a_claim_that_never_lands_is_not_claimed_after_the_grace_and_nothing_is_written(deployment: Any) -> None:
    """The run function dies between starting the execution and its claim: each ``Run`` attempt reads through
    the grace, no longer (under a second more than one read), and ends ``TurnNotClaimed``; the state machine
    retries, then drops the turn (``NotClaimed``). Nothing is written to the session, which takes its next turn."""
    from dormant.serving.workflow.tasks import CLAIM_GRACE_S

    d, sid = deployment, fresh("noclaim")
    shown = warm_turn(d, sid)
    first = ledger(d, sid)
    calls, invoked = len(d.calls("resume")), invocations(d, "resume")
    with claim_held(d, sid) as (execution, request, answers):
        assert d.kill("run") == 1, "the held run function was not running"
    request.join(30)
    ((status, _, body),) = answers
    assert status == 502, (status, body)  # the function died: API Gateway's own answer
    assert ended(d, execution).status == "SUCCEEDED", (execution.states, execution.error, evidence(d))
    assert execution.states[-1] == "NotClaimed", execution.states
    attempts = run_attempts(execution)
    assert {outcome for _, outcome in attempts} == {"TurnNotClaimed"}, attempts
    # as many attempts as the ASL's retry of TurnNotClaimed allows, each one invocation of the function
    (retry,) = [r for r in d.definition["States"]["Run"]["Retry"] if r["ErrorEquals"] == ["TurnNotClaimed"]]
    assert len(attempts) == 1 + retry["MaxAttempts"] == invocations(d, "resume") - invoked, attempts
    grace = sum(CLAIM_GRACE_S)
    assert grace < 1.0, CLAIM_GRACE_S  # a claim that never lands costs each attempt under a second more
    took = [seconds for seconds, _ in attempts]
    assert all(grace <= s < grace + 1.0 for s in took), (took, grace)  # read through the grace, then let go
    d.settle()
    assert not [c for c in d.calls("resume")[calls:] if c.action in _WRITES], "a run of no claim wrote"
    after = show(d, sid)
    assert (after["status"], after["version"]) == (shown["status"], shown["version"]), after
    assert ledger(d, sid) == first
    assert run(d, sid, "signoffs=0")["status"] == "completed", evidence(d)  # nothing is left holding the session


@pytest.mark.backend("dynamodb")
def test_a_retried_run_task_completes_the_session(deployment: Any) -> None:
    """Step Functions retries ``Run`` after its first attempt died having committed steps: the retry takes the
    invocation over and completes the turn (today's main ended the execution Succeeded, the session running)."""
    import threading

    d, sid = deployment, fresh("retried")
    create(d, sid)
    request = threading.Thread(
        target=lambda: d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=1 signoffs=0"})
    )
    request.start()
    # killed once it has committed a step (not after a fixed time, which a slow cold start eats)
    until(lambda: steps_committed(d, sid) >= 1, "a first step committed", evidence=lambda: evidence(d))
    assert d.kill("resume") == 1, "no runner was running the turn"
    request.join(30)
    d.settle()
    shown = show(d, sid)
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    (execution,) = chain(d, sid)
    assert execution.states.count("Run") >= 1 and execution.states[-1] == "Done", execution.states
    resumes = [e for e in ledger(d, sid) if e["type"] == "invocation_resume"]
    assert resumes and all(e["deadline"] for e in resumes), resumes  # each runner recorded its deadline


@pytest.mark.backend("dynamodb")
def test_a_runner_killed_mid_commit_does_not_hold_up_its_retry(deployment: Any) -> None:
    """The runner dies between a commit's gate and its events, leaving the commit's marker on the session: the
    retried ``Run`` (whose predecessor is gone for sure) finishes or undoes that commit at once and completes the
    turn, instead of waiting on a dead writer's marker (``StoreBusy``, again and again) until it turns stale."""
    import threading

    d, sid = deployment, fresh("midcommit")
    create(d, sid)
    request = threading.Thread(
        target=lambda: d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=1 signoffs=0 keys=120"})
    )  # 120 state keys a step: each step's commit is too large for one transaction, so it is gated
    request.start()
    until(lambda: steps_committed(d, sid) >= 1, "a first step committed", evidence=lambda: evidence(d))
    d.crash_before("resume", "dynamodb:BatchWriteItem")  # the next commit's events: after its gate
    request.join(30)
    d.settle()
    assert not (d.workdir / "resume.crash").exists(), "the runner was not killed mid-commit"
    shown = show(d, sid)
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    held = [e for e in d.errors("resume") if e[1] == "StoreBusy" and sid in e[2]]
    assert not held, f"the retry waited on the dead runner's commit: {held}"
    assert steps_committed(d, sid) == 3, ledger(d, sid)  # each step once: none lost, none run twice


@pytest.mark.backend("dynamodb")
def test_erasure(deployment: Any) -> None:
    d, sid, person = deployment, fresh("erase"), fresh("person")
    create(d, sid, scopes={"user": person})
    from tests.support.fidelity.deployment import Token

    admin = Token.person("tenant-a", groups=["admins"])  # the default caller's tenant, in the admin group
    status, _, body = d.api("POST", "/erasures", {"scope": "user", "scope_id": person}, token=admin)
    assert status in (200, 202), (status, body, evidence(d))
    status, _, body = d.api("GET", f"/sessions/{sid}")
    assert status == 404, (status, body)


@pytest.mark.backend("dynamodb")
def test_only_an_admin_of_the_tenant_deletes_and_erases_and_the_report_names_the_backups(deployment: Any) -> None:
    """Roles inside a tenant, on the stack: a member without the admin group is refused (403 naming the role,
    nothing written); an admin deletes and erases, and the erasure's report names what point-in-time recovery
    keeps (the table's period, 35 days by default) and until when."""
    from tests.support.fidelity.deployment import Token

    d, tenant, person = deployment, fresh("clinic"), fresh("person")
    member = Token.person(fresh("max"), tenant, groups=["staff"])
    admin = Token.person(fresh("ann"), tenant, groups=["staff", "admins"])
    kept, erased = fresh("kept"), fresh("erased")
    for sid in (kept, erased):
        assert _as(d, member, "POST", "/sessions", {"session_id": sid, "scopes": {"user": person}})[0] == 201
    before = {sid: _as(d, member, "GET", f"/sessions/{sid}")[1]["version"] for sid in (kept, erased)}
    status, refused = _as(d, member, "DELETE", f"/sessions/{kept}")
    assert status == 403 and refused["error"] == "NotPermitted" and "'admins'" in refused["message"], refused
    status, refused = _as(d, member, "POST", "/erasures", {"scope": "user", "scope_id": person})
    assert status == 403 and "'admins'" in refused["message"], refused
    after = {sid: _as(d, member, "GET", f"/sessions/{sid}")[1]["version"] for sid in (kept, erased)}
    assert after == before  # nothing written, nothing removed

    assert _as(d, admin, "DELETE", f"/sessions/{kept}")[0] == 204
    assert _as(d, member, "GET", f"/sessions/{kept}")[0] == 404
    status, report = _as(d, admin, "POST", "/erasures", {"scope": "user", "scope_id": person})
    assert status == 200 and report["sessions"] == [erased], (report, evidence(d))
    assert "point-in-time recovery" in report["residue"] and "35 days, until " in report["residue"], report
    assert _as(d, member, "GET", f"/sessions/{erased}")[0] == 404
    lines = [json.loads(line) for line in d.log("sessions").splitlines() if line.startswith("{") and '"level"' in line]
    keys = {(line["tenant"], line["principal"], line.get("client")) for line in lines if line["message"] == "erased"}
    assert (tenant, admin.sub, d.people_client) in keys, keys  # the tenant and the person apart (it was the sub)


@pytest.mark.backend("dynamodb")
def test_each_machine_client_acts_in_its_own_tenant_or_the_one_it_is_given(deployment: Any) -> None:
    """``billing`` and ``crm`` (each its own tenant) see only their own sessions; ``intake``, mapped to a person's
    tenant, starts a run there, which the person sees, and cannot answer (no ``answers.write``). The log lines
    name the tenant, the principal and the client apart."""
    from tests.support.fidelity.deployment import Token

    d = deployment
    billing, crm, intake = (d.machine_token(name) for name in ("billing", "crm", "intake"))
    mine, theirs = fresh("bill"), fresh("crm")
    assert _as(d, billing, "POST", "/clients/sessions", {"session_id": mine})[0] == 201
    assert _as(d, crm, "POST", "/clients/sessions", {"session_id": theirs})[0] == 201
    assert _as(d, billing, "GET", f"/clients/sessions/{theirs}")[0] == 404  # crm's session is none of billing's
    assert _as(d, crm, "GET", f"/clients/sessions/{mine}")[0] == 404
    listed = {s["id"] for s in _as(d, billing, "GET", "/clients/sessions", query={"limit": "200"})[1]["sessions"]}
    assert mine in listed and theirs not in listed, listed

    person = Token.person(fresh("nurse"), PERSONS_TENANT)
    sid = fresh("intake")
    assert _as(d, person, "POST", "/sessions", {"session_id": sid})[0] == 201
    status, ran = _as(d, intake, "POST", f"/clients/sessions/{sid}/runs", {"message": "signoffs=1"})
    assert status in (200, 202), (status, ran, evidence(d))
    d.settle()
    status, shown = _as(d, person, "GET", f"/sessions/{sid}")
    assert status == 200 and shown["status"] == "awaiting_input", (shown, evidence(d))
    starts = [
        e for e in _as(d, person, "GET", f"/sessions/{sid}/events")[1]["events"] if e["type"] == "invocation_start"
    ]
    assert [e["principal"] for e in starts] == [intake.sub]  # recorded as the client
    with pytest.raises(PermissionError, match="invalid_scope"):  # Cognito gives intake no answers.write
        d.machine_token("intake", ["dormant/answers.write"])
    (waiting,) = shown["yielded_tools"]
    answer = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True}}]}
    assert _as(d, intake, "POST", f"/clients/sessions/{sid}/tools", answer)[0] == 401  # the method needs the scope
    event = {
        "type": "tool_input",
        "call_id": waiting["call_id"],
        "name": waiting["name"],
        "input": {"approved": True},
        "invocation_id": starts[0]["invocation_id"],
    }
    commit = {"expected_version": shown["version"], "events": [event]}
    status, refused = _as(d, intake, "POST", f"/clients/sessions/{sid}/commit", commit)
    assert status == 403 and "dormant/answers.write" in refused["message"], refused
    assert _as(d, person, "GET", f"/sessions/{sid}")[1]["version"] == shown["version"]  # nothing written

    # a machine deletes and erases with dormant/admin (no group: machines have none), in the tenant it is given;
    # crm has no dormant/admin: the gateway refuses it
    ops = d.machine_token("ops")
    assert _as(d, crm, "DELETE", f"/clients/sessions/{theirs}")[0] == 401
    bound, someone = fresh("bound"), fresh("person")
    assert _as(d, person, "POST", "/sessions", {"session_id": bound, "scopes": {"user": someone}})[0] == 201
    status, report = _as(d, ops, "POST", "/clients/erasures", {"scope": "user", "scope_id": someone})
    assert status == 200 and report["sessions"] == [bound], (report, evidence(d))
    assert report["principal"] == ops.sub

    # the log lines name the tenant, the principal and the client apart
    lines = [json.loads(line) for line in d.log("sessions").splitlines() if line.startswith("{") and '"level"' in line]
    erased = {(line["tenant"], line["principal"], line.get("client")) for line in lines if line["message"] == "erased"}
    assert (PERSONS_TENANT, ops.sub, ops.sub) in erased, erased


@pytest.mark.backend("dynamodb")
def test_a_commit_from_a_remote_runner(deployment: Any) -> None:
    d, sid = deployment, fresh("remote")
    create(d, sid)
    body = {"expected_version": 1, "events": [{"type": "user", "text": "from a remote runner"}]}
    status, _, committed = d.api("POST", f"/sessions/{sid}/commit", body)
    assert status in (200, 201), (status, committed, evidence(d))
    assert [e["text"] for e in ledger(d, sid) if e["type"] == "user"] == ["from a remote runner"]


@pytest.mark.backend("dynamodb")
def test_a_forged_commit_cannot_pass_its_answer_off_as_someone_elses_turns(deployment: Any) -> None:
    """Issue 35: A's review waits for anyone but A (four eyes). A commits an answer naming an invocation C
    started, to pass as "not the starter": the commit function (in its own process) reads the starter from the
    invocation the call waits in, so it is refused, nothing written, and nothing resumes the session."""
    from tests.support.fidelity.deployment import Token

    d, tenant, sid = deployment, fresh("clinic"), fresh("forged")
    a, c = (Token.person(fresh(who), tenant) for who in ("alice", "carol"))
    assert _as(d, a, "POST", "/sessions", {"session_id": sid})[0] == 201
    assert _as(d, c, "POST", f"/sessions/{sid}/runs", {"message": "signoffs=0"})[0] in (200, 202)  # C's turn, ended
    d.settle()
    assert _as(d, a, "POST", f"/sessions/{sid}/runs", {"message": "tool=review signoffs=1"})[0] in (200, 202)
    d.settle()
    status, shown = _as(d, a, "GET", f"/sessions/{sid}")
    assert status == 200 and shown["status"] == "awaiting_input", (shown, evidence(d))
    (review,) = shown["yielded_tools"]
    events = _as(d, a, "GET", f"/sessions/{sid}/events", query={"limit": "1000"})[1]["events"]
    (carols,) = [e["invocation_id"] for e in events if e["type"] == "invocation_start" and e["principal"] == c.sub]
    forged = {"type": "tool_input", "call_id": review["call_id"], "name": "review", "input": {"approved": True}}
    body = {"expected_version": shown["version"], "events": [{**forged, "invocation_id": carols}]}
    status, refused = _as(d, a, "POST", f"/sessions/{sid}/commit", body)
    assert (status, refused.get("field")) == (409, "events.0.invocation_id"), (refused, evidence(d))
    body = {"expected_version": shown["version"], "events": [forged]}
    status, refused = _as(d, a, "POST", f"/sessions/{sid}/commit", body)
    assert (status, refused["error"], refused["field"]) == (403, "AnswerRefused", "events.0.call_id"), refused
    d.settle()
    after = _as(d, a, "GET", f"/sessions/{sid}")[1]
    assert (after["version"], after["status"]) == (shown["version"], "awaiting_input"), evidence(d)  # nothing written


@pytest.mark.backend("dynamodb")
def test_a_browser_of_the_allowed_origin_and_no_other(deployment: Any) -> None:
    """CORS as deployed with ``-c cors_origins=``: a preflight passes without a token on every path and is answered
    for the allowed origin only; the handlers' answers (errors too) and API Gateway's own refusals carry
    ``Access-Control-Allow-Origin`` for it, in the error shape."""
    d, sid = deployment, fresh("cors")
    asked = {"Origin": BROWSER_APP, "Access-Control-Request-Method": "POST"}
    for path in ("/sessions", f"/sessions/{sid}/runs", "/openapi.json"):
        status, headers, _ = d.api("OPTIONS", path, headers=asked, tenant=None)  # a preflight carries no token
        assert status == 204, (path, status, headers, evidence(d))
        assert headers["Access-Control-Allow-Origin"] == BROWSER_APP, (path, headers)
        assert (
            "POST" in headers["Access-Control-Allow-Methods"]
            and "Idempotency-Key" in headers["Access-Control-Allow-Headers"]
        ), headers
    status, headers, _ = d.api("OPTIONS", "/sessions", headers={**asked, "Origin": "https://evil.example"}, tenant=None)
    assert status == 204 and "Access-Control-Allow-Origin" not in headers, headers  # the browser refuses the call

    create(d, sid)
    status, headers, body = d.api("GET", f"/sessions/{sid}", headers={"Origin": BROWSER_APP})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == BROWSER_APP, (status, headers)
    assert "Origin" in headers["Vary"], headers
    status, headers, body = d.api("GET", "/sessions/nope", headers={"Origin": BROWSER_APP})
    assert status == 404 and headers["Access-Control-Allow-Origin"] == BROWSER_APP, (status, headers, body)
    status, headers, _ = d.api("GET", f"/sessions/{sid}", headers={"Origin": "https://evil.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers, headers

    # API Gateway's own answers: no token, an unknown path; in the handlers' error shape, readable by the page
    status, headers, body = d.api("GET", "/sessions", headers={"Origin": BROWSER_APP}, tenant=None)
    assert status == 401 and headers["Access-Control-Allow-Origin"] == BROWSER_APP, (status, headers)
    assert body == {"error": "UNAUTHORIZED", "message": "Unauthorized"}, body
    status, headers, body = d.api("GET", "/nowhere", headers={"Origin": BROWSER_APP})
    assert status == 403 and headers["Access-Control-Allow-Origin"] == BROWSER_APP, (status, headers)
    assert body["error"] == "MISSING_AUTHENTICATION_TOKEN", body


@pytest.mark.backend("dynamodb")
def test_the_openapi_document_is_served_behind_the_authorizer(deployment: Any) -> None:
    from dormant.serving.openapi import document

    d = deployment
    status, _, body = d.api("GET", "/openapi.json", tenant=None)
    assert status == 401, (status, body)
    status, _, body = d.api("GET", "/openapi.json")
    assert status == 200, (status, body, evidence(d))
    assert body == document()  # what `make openapi` writes, from the function's own layer


@pytest.mark.backend("dynamodb")
def test_a_snapshot_is_written_after_enough_events(deployment: Any) -> None:
    d, sid = deployment, fresh("snap")
    create(d, sid)
    shown = run(d, sid, "steps=8 signoffs=0")
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    item = d.item({"pk": {"S": f"S#fidelity@{TENANT}#{sid}"}, "sk": {"S": "#S"}})
    assert item is not None, f"no snapshot item after {len(ledger(d, sid))} events; {evidence(d)}"


@pytest.mark.backend("dynamodb")
def test_a_long_conversation_runs_and_pages_within_each_functions_memory(deployment: Any) -> None:
    """What a function holds grows with the session's data: a conversation of ``BIG_TURNS`` turns of
    ``BIG_MESSAGE`` bytes each (near the API's 256 KB body) is run turn by turn (``resume`` loads the history and
    hands the model all of it) and read back as one page (``sessions``, up to ``MAX_EVENTS_PAGE_BYTES``), every
    function within its ``MemorySize`` (the harness kills a sandbox past it). Its peaks are among those the stack
    is sized by (``infra.functions.PEAK_MB``)."""
    d, sid = deployment, fresh("long")
    before = len(d.lambdas.invocations)
    create(d, sid)
    for turn in range(BIG_TURNS):
        shown = run(d, sid, f"signoffs=0 turn {turn} " + "x" * BIG_MESSAGE)
        assert shown["status"] == "completed", (turn, shown["status"], evidence(d))
    status, _, page = d.api("GET", f"/sessions/{sid}/events", query={"limit": "1000"})
    assert status == 200, (status, evidence(d))
    users = [e for e in page["events"] if e["type"] == "user"]
    assert 10 <= len(users) <= BIG_TURNS and sum(len(json.dumps(e)) for e in page["events"]) > 2_500_000, len(users)
    killed = [i for i in d.lambdas.invocations[before:] if i.error_type == "Runtime.OutOfMemory"]
    assert not killed, killed


BIG_TURNS, BIG_MESSAGE = 20, 240_000
"""The long conversation: 20 turns of 240 KB messages, about 4.8 MB of history (a page is at most 5 MB)."""


@pytest.mark.slow
@pytest.mark.backend("dynamodb")
def test_a_sixty_second_turn_completes(deployment: Any) -> None:
    d, sid = deployment, fresh("slow")
    create(d, sid)
    status, headers, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "sleep=60 signoffs=0"})
    assert status == 202 and body["status"] == "running", (status, body, evidence(d))  # at once, not at 29 s
    assert headers.get("Location") == f"/sessions/{sid}", headers
    assert show(d, sid)["status"] == "running"
    d.settle(150)
    assert show(d, sid)["status"] == "completed", evidence(d)


_SHARDS = "shards=4&pending_shards=8"
"""The deployment's shard counts (``infra.stack.SHARD_DEFAULTS``): the table refuses a store opened with others."""


def table_store(d: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store on the deployment's table, opened by the test itself (as a writer outside the functions would)."""
    from dormant.stores.url import store_from_url
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    return store_from_url(f"dynamodb://{d.table_name}?endpoint={d.dynamodb_endpoint}&region={REGION}&{_SHARDS}")


def scheduled_sweep(d: Any) -> dict[str, Any]:
    """The sweeper invoked with the schedule's own event (``events/schedule/sweeper.json``): what it reports."""
    event = json.loads((Path(__file__).resolve().parents[2] / "events/schedule/sweeper.json").read_text())
    ok, result = d.invoke("sweeper", event)
    assert ok, (result, evidence(d))
    return result


@pytest.mark.backend("dynamodb")
def test_the_sweeper_repairs_a_commit_a_dead_writer_left_pending(
    deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer dies after its gate (the events half written), ten minutes ago: the scheduled sweeper, with
    only its own environment and permissions, rolls the commit back and the session takes commits again."""
    from dormant.clock import now_ms, use_clock
    from dormant.events import UserEvent
    from dormant.stores.base import StoredSession
    from tests.support.dynamodb_faults import Died, Faults

    d, sid = deployment, fresh("pending")
    create(d, sid)
    store = table_store(d, monkeypatch)
    app_name = f"fidelity@{TENANT}"
    loaded = store.load(app_name, sid)
    assert loaded is not None
    row: StoredSession = loaded.row
    Faults(store._client).die("BatchWriteItem", nth=1)  # type: ignore[attr-defined]
    ten_minutes_ago = now_ms() - 600_000
    with use_clock(lambda: ten_minutes_ago), pytest.raises(Died):
        # 120 events: more than one TransactWriteItems holds, so the gated protocol (gate, batches, finish)
        store.commit(row, [UserEvent(text=f"lost {n}") for n in range(120)], row.version)
    store.close()
    result = scheduled_sweep(d)
    assert result["repaired"] == 1 and result["turns"] == [], result  # DynamoDB: turns are the workflow's
    assert [e for e in ledger(d, sid) if e["type"] == "user"] == []  # rolled back: nothing of it shows
    body = {"expected_version": show(d, sid)["version"], "events": [{"type": "user", "text": "after the repair"}]}
    assert d.api("POST", f"/sessions/{sid}/commit", body)[0] == 200, evidence(d)
    assert {"dynamodb:Query", "dynamodb:UpdateItem"} <= {c.action for c in d.calls("sweeper")}


@pytest.mark.backend("dynamodb")
def test_the_sweeper_hands_a_turn_whose_runner_died_to_a_fresh_execution(
    deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn claimed ten minutes ago whose runner and execution are both gone (an operator stopped it, say):
    the sweeper finds it through the table's running-sessions index and starts an execution, whose Run takes
    the invocation over and completes it."""
    from dormant.clock import now_ms, use_clock
    from dormant.serving.runtime import for_tenant
    from dormant.serving.turns import claim_turn
    from tests.support.fidelity.fidelity_app import build

    d, sid = deployment, fresh("orphan")
    create(d, sid)
    store = table_store(d, monkeypatch)
    fidelity = build(store)
    view = for_tenant(fidelity.app, TENANT)
    ten_minutes_ago = now_ms() - 600_000
    with use_clock(lambda: ten_minutes_ago):
        claim_turn(view, fidelity.agent, sid, "steps=2 signoffs=0", deadline=ten_minutes_ago + 60_000)
    store.close()
    assert show(d, sid)["status"] == "running" and not d.executions_of(TENANT, sid)
    result = scheduled_sweep(d)
    assert [line for line in result["turns"] if sid in line and "handed on (execution" in line], result
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    (execution,) = chain(d, sid)
    assert execution.states[:1] == ["Run"] and execution.states[-1] == "Done", execution.states


def swept(result: dict[str, Any], sid: str) -> list[str]:
    """The sweeper's lines about session ``sid``."""
    return [line for line in result["turns"] if line.startswith(f"{sid}@") or line.startswith(f"{sid}:")]


@pytest.mark.backend("dynamodb")
def test_the_sweeper_gives_a_wait_whose_execution_is_gone_a_fresh_one(deployment: Any) -> None:
    """A session waits on answers, and its execution is stopped by hand. A parked wait is due for the sweeper
    only at its timeout (sleeping costs nothing: no read, no DescribeExecution), so sweeps leave it alone; its
    answer's wake-up finds no execution, which makes it due: the sweeper (DescribeExecution on the execution the
    wait's record names) starts a fresh one, which runs the answered turn to its end, the tool's result once."""
    d, sid = deployment, fresh("stopped")
    shown, first = yielded_and_parked(d, sid, "signoffs=1")
    assert not swept(d.sweep(grace_seconds=None), sid)  # the default grace: a wait just parked is not looked at
    described = len([c for c in d.calls("sweeper") if c.action == "states:DescribeExecution"])
    assert not swept(d.sweep(), sid)  # parked: not due before its timeout, not even asked about
    d.stop(first)
    assert ended(d, first).status == "ABORTED"
    assert not swept(d.sweep(), sid)
    assert len([c for c in d.calls("sweeper") if c.action == "states:DescribeExecution"]) == described
    (call,) = shown["yielded_tools"]
    body = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, _, answered = d.api("POST", f"/sessions/{sid}/tools", body)
    assert status == 202, (status, answered, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "resumable", evidence(d)  # the wake-up found no execution
    lines = swept(d.sweep(), sid)
    assert len(lines) == 1 and "restarted (execution" in lines[0], (lines, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    assert [e["type"] for e in ledger(d, sid)].count("tool_result") == 1
    assert not swept(d.sweep(), sid)  # ended: nothing to do
    # the restart is the waits machine's: it starts at Park, which finds the answers in and continues (Answered)
    _, restarted, then = chain(d, sid)
    assert restarted.machine_arn == d.wait_machine_arn and restarted.name.endswith("-r0"), evidence(d)
    assert restarted.states == ["Park", "Next loop", "Continue", "Continued"], restarted.states
    assert then.machine_arn == d.machine_arn and then.states[-1] == "Done", then.states  # Continue: the sessions one


@pytest.mark.backend("dynamodb")
def test_the_sweeper_starts_an_execution_for_a_wait_that_never_had_one(
    deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that yielded with no execution ever started for it (run outside the workflow: what a lost
    start leaves): the sweeper starts one, it parks, and the answer completes the session."""
    from dormant.serving.runtime import for_tenant
    from dormant.serving.turns import claim_turn, run_to_end
    from tests.support.fidelity.fidelity_app import build

    d, sid = deployment, fresh("never")
    create(d, sid)
    store = table_store(d, monkeypatch)
    fidelity = build(store)
    view = for_tenant(fidelity.app, TENANT)
    run_to_end(view, claim_turn(view, fidelity.agent, sid, "signoffs=1"), lambda _: fidelity.agent)
    store.close()
    shown = show(d, sid)
    assert shown["status"] == "awaiting_input" and not d.executions_of(TENANT, sid), shown
    lines = swept(d.sweep(), sid)
    assert len(lines) == 1 and "restarted (execution" in lines[0], (lines, evidence(d))
    d.settle()
    restarted = parked(d, sid)
    # a lost wait restarts at Park (the waits machine): no Run to find it waiting, no After the run
    assert restarted.machine_arn == d.wait_machine_arn and restarted.states == ["Park"], restarted.states
    assert answer(d, sid, shown)["status"] == "completed", evidence(d)


@pytest.mark.backend("dynamodb")
def test_the_sweeper_wakes_an_answered_wait_whose_wake_up_was_lost(deployment: Any) -> None:
    """``tools`` dies after storing the answers and before ``SendTaskFailure``: the session is ``resumable``
    and its execution sleeps on. The sweeper sends the stored token (the wake-up that was lost) and the turn
    completes, the answered tool's result recorded once. Answered while its execution is gone too: a fresh
    execution runs it."""
    d, sid, other = deployment, fresh("lost"), fresh("lostgone")
    for session in (sid, other):
        create(d, session)
    shown = run(d, sid, "signoffs=1")
    shown_other = run(d, other, "signoffs=1")
    assert (shown["status"], shown_other["status"]) == ("awaiting_input", "awaiting_input"), evidence(d)
    execution, gone = parked(d, sid), parked(d, other)
    for session, seen in ((sid, shown), (other, shown_other)):
        d.crash_before("tools", "states:SendTaskFailure")  # the wake-up: Answered, caught into Continue
        (call,) = seen["yielded_tools"]
        body = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
        status, _, answered = d.api("POST", f"/sessions/{session}/tools", body)
        assert status == 502, (status, answered)
    d.settle()
    assert show(d, sid)["status"] == "resumable" and execution.status == "RUNNING", evidence(d)
    d.stop(gone)
    described = [c for c in d.calls("sweeper") if c.action == "states:DescribeExecution"]
    result = d.sweep()
    assert swept(result, sid) == [f"{sid}: woken (execution {execution.name})"], (result, evidence(d))
    # the two answers are due; the waits other tests left parked here are not asked about
    assert len([c for c in d.calls("sweeper") if c.action == "states:DescribeExecution"]) == len(described) + 2
    (line,) = swept(result, other)
    assert "restarted (execution" in line, (result, evidence(d))
    d.settle()
    for session in (sid, other):
        final = show(d, session)
        assert final["status"] == "completed", (session, final["status"], evidence(d))
        kinds = [e["type"] for e in ledger(d, session)]
        assert kinds.count("tool_input") == 1 and kinds.count("tool_result") == 1, kinds
    assert ended(d, execution).status == "SUCCEEDED" and execution.states[-1] == "Continued", execution.states


@pytest.mark.backend("dynamodb")
def test_the_sweeper_expires_a_wait_past_its_timeout_whose_execution_is_gone(deployment: Any) -> None:
    """The wait's execution was stopped by hand and its wait timed out since: the sweeper ends the invocation
    as ``Expire`` would (``SessionExpired``), rather than give it a new wait or leave it waiting on no one."""
    d, sid, warm = deployment, fresh("lapsed"), fresh("warm")
    create(d, warm)  # functions warm first: a cold start must not eat the short wait below
    assert run(d, warm, "signoffs=1")["status"] == "awaiting_input", evidence(d)
    default = d.template.parameter("WaitTimeoutSeconds")
    wait = 20
    d.update({"WaitTimeoutSeconds": wait})
    try:
        create(d, sid)
        status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"})
        assert status in (200, 202), (status, body, evidence(d))
        # stopped as soon as it sleeps in Park (its wait's record stored), well before its own Expire
        deadline = time.monotonic() + wait - 2
        while not [e for e in d.executions_of(TENANT, sid) if e.states[-1:] == ["Park"] and d.sfn._asleep(e)]:
            assert time.monotonic() < deadline, ([e.states for e in d.executions_of(TENANT, sid)], evidence(d))
            time.sleep(0.02)
        execution = parked(d, sid)
        d.stop(execution)
        parked_at = time.monotonic()
        assert show(d, sid)["status"] == "awaiting_input", evidence(d)
        time.sleep(max(0.0, parked_at + wait + 0.5 - time.monotonic()))
    finally:
        d.update({"WaitTimeoutSeconds": default})
    lines = swept(d.sweep(), sid)
    assert len(lines) == 1 and lines[0].endswith(": expired"), (lines, evidence(d))
    end = ledger(d, sid)[-1]
    assert end["type"] == "invocation_end" and end["error_type"] == "SessionExpired", end
    assert show(d, sid)["status"] == "error"
    assert len(d.executions_of(TENANT, sid)) == 1  # no new execution for a wait that is over


def in_model_call(d: Any, sid: str, timeout: float = 30) -> dict[str, Any]:
    """The session once its runner took the turn on (its resume is stored) and is in its model call, which a
    ``sleep=S`` order holds for S seconds: nothing of the call is stored until it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["type"] == "invocation_resume" for e in ledger(d, sid)):
            return show(d, sid)
        time.sleep(0.05)
    raise AssertionError(f"no runner took {sid} on; {evidence(d)}")


def emitted(d: Any, function: str, metric: str) -> float:
    """The sum of ``metric`` in the EMF lines ``function`` printed so far."""
    total = 0.0
    for line in d.log(function).splitlines():
        if line.startswith("{") and '"_aws"' in line:
            record = json.loads(line)
            if any(m["Name"] == metric for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]):
                value = record[metric]  # a list when one invocation counted it more than once
                total += sum(value) if isinstance(value, list) else float(value)
    return total


def noted(person: str, text: str, invocation_id: str | None = None) -> dict[str, Any]:
    """A remote writer's state change of the person's note (``invocation_id``: as a step of that invocation)."""
    change = {"key": "note", "old_value": None, "new_value": text}
    event = {"type": "state_change", "scope": "user", "scope_id": person, "source": "direct", "changes": [change]}
    return {**event, **({"invocation_id": invocation_id} if invocation_id else {})}


@pytest.mark.backend("dynamodb")
def test_a_write_that_lands_during_a_model_call_is_merged_with_the_turn(deployment: Any) -> None:
    """Two writers on one session: a remote commit lands while the workflow's runner waits on its model; the
    runner's end loses the race (a conflict) and is rebased after it (a merge), both counted by ``resume``."""
    d, sid, person = deployment, fresh("merge"), fresh("person")
    create(d, sid, scopes={"user": person})
    conflicts, merges = emitted(d, "resume", "conflicts"), emitted(d, "resume", "merges")
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "sleep=3 signoffs=0"})
    assert status in (200, 202), (status, body, evidence(d))
    during = in_model_call(d, sid)
    commit = {"expected_version": during["version"], "events": [noted(person, "landed mid-call")]}
    status, _, body = d.api("POST", f"/sessions/{sid}/commit", commit)
    assert status == 200, (status, body, evidence(d))
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    types = [e["type"] for e in ledger(d, sid)]
    assert types.index("state_change") < types.index("model_end") < types.index("invocation_end"), types
    assert emitted(d, "resume", "conflicts") == conflicts + 1, evidence(d)
    assert emitted(d, "resume", "merges") == merges + 1, evidence(d)


@pytest.mark.backend("dynamodb")
def test_a_turn_that_cannot_join_what_landed_is_forked(deployment: Any) -> None:
    """A second writer continues the same invocation while the runner waits on its model (two runners on one
    turn): the runner's end cannot be rebased after it, so its ledger is stored as a fork, counted by ``resume``."""
    d, sid, person = deployment, fresh("fork"), fresh("person")
    create(d, sid, scopes={"user": person})
    forks = emitted(d, "resume", "forks")
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "sleep=3 signoffs=0"})
    assert status in (200, 202), (status, body, evidence(d))
    during = in_model_call(d, sid)
    (start,) = [e for e in ledger(d, sid) if e["type"] == "invocation_start"]
    commit = {"expected_version": during["version"], "events": [noted(person, "a step", start["invocation_id"])]}
    status, _, body = d.api("POST", f"/sessions/{sid}/commit", commit)
    assert status == 200, (status, body, evidence(d))
    d.settle()
    assert emitted(d, "resume", "forks") == forks + 1, evidence(d)
    assert "model_end" not in [e["type"] for e in ledger(d, sid)]  # the runner's call went to the fork
    status, _, listed = d.api("GET", "/sessions", query={"limit": "5"})  # the fork is among the newest
    assert status == 200, (status, listed)
    forks_of = [
        events
        for events in (ledger(d, s["id"]) for s in listed["sessions"] if s["id"] != sid)
        if events and events[-1]["type"] == "session_forked" and events[-1]["from_session_id"] == sid
    ]
    assert len(forks_of) == 1 and "model_end" in [e["type"] for e in forks_of[0]], (listed, evidence(d))


@pytest.mark.backend("dynamodb")
def test_a_colleague_committing_on_the_listings_version_mid_turn_is_refused(deployment: Any) -> None:
    """A running turn's steps leave its listed row at the claim's version (DynamoDB: a step moves no index entry).
    A colleague who takes that version from ``GET /sessions`` and commits on it (``POST /commit``) is refused
    with 409 and nothing written; ``events?after=`` that version has the steps."""
    from tests.support.fidelity.deployment import Token

    d, sid = deployment, fresh("listed")
    carol = Token.person(fresh("carol"), TENANT)
    create(d, sid)
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "steps=3 sleep=1 signoffs=0"})
    assert status in (200, 202), (status, body, evidence(d))
    deadline, row, head = time.monotonic() + 30, None, None
    while time.monotonic() < deadline:
        status, _, listed = d.api("GET", "/sessions", query={"limit": "50"}, token=carol)
        assert status == 200, (status, listed)
        row = next((s for s in listed["sessions"] if s["id"] == sid), None)
        head = show(d, sid)
        if row is not None and head["status"] == "running" and row["version"] < head["version"]:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the listing never lagged a step: {row} {head} {evidence(d)}")
    commit = {"expected_version": row["version"], "events": [{"type": "user", "text": "on the listed version"}]}
    status, _, body = d.api("POST", f"/sessions/{sid}/commit", commit, token=carol)
    assert status == 409, (status, body)
    # A commit that, landing on a running session, would be gated: refused the same, before any store path (the
    # route checks the version it loaded; a race past that check meets the gate's condition: contract tests).
    large = [{"type": "user", "text": f"on the listed version {n} " + "x" * 900} for n in range(5)]
    status, _, body = d.api("POST", f"/sessions/{sid}/commit", {**commit, "events": large}, token=carol)
    assert status == 409, (status, body)
    status, _, after = d.api("GET", f"/sessions/{sid}/events", query={"after": str(row["version"])}, token=carol)
    assert status == 200 and after["events"], (status, after)
    d.settle()
    assert show(d, sid)["status"] == "completed", evidence(d)
    assert not any(str(e.get("text")).startswith("on the listed version") for e in ledger(d, sid))


@pytest.mark.backend("dynamodb")
def test_a_snapshot_the_table_throttles_is_counted_and_the_turn_stands(deployment: Any) -> None:
    """The snapshot write of a long turn is answered as a throttled DynamoDB transaction is (cancelled, reason
    ``ThrottlingError``): the runner counts a snapshot write failure and the turn completes, its commits kept (a
    snapshot is a cache: the next boundary's write stores one)."""
    d, sid = deployment, fresh("snapfail")
    pk = f"S#fidelity@{TENANT}#{sid}"
    create(d, sid)
    failures = emitted(d, "resume", "snapshot_write_failures")
    where = [pk, '"sk": {"S": "#S"}']  # the transaction that puts the session's snapshot item, and no commit
    reasons = ["None", "ThrottlingError"]  # past the store's re-sends of a throttled transaction
    d.fail_next("resume", "TransactWriteItems", where, "TransactionCanceledException", reasons, 1 + STORE_RESENDS)
    shown = run(d, sid, "steps=8 signoffs=0")
    assert not d.lambdas.fault_armed("resume"), f"no snapshot write met the fault; {evidence(d)}"
    assert shown["status"] == "completed", (shown["status"], evidence(d))
    assert [e["type"] for e in ledger(d, sid)].count("tool_result") == 8
    assert emitted(d, "resume", "snapshot_write_failures") == failures + 1, evidence(d)


REACHED_RARELY = {
    # A commit that meets a stale marker repairs it (rolls back: DeleteItem, BatchWriteItem; reads the meta and
    # the touch: GetItem; writes bindings and touches in a finish transaction: PutItem), and a commit that
    # crosses a snapshot boundary writes one (ConditionCheckItem + PutItem): every function that commits
    # may, the scenarios need not. infra/wiring.py's SESSION_ACTIONS says so, action by action.
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
    # A re-sent event id that the meta item's filter cannot rule out is looked up among the id items (one
    # strongly consistent BatchGetItem); the first store on a table whose layout item predates the id items
    # checks the table's shape once (DescribeTable). Any function that opens the store may meet either.
    "dynamodb:BatchGetItem",
    "dynamodb:DescribeTable",
}
"""Granted actions the scenarios may leave unexercised: the commit path's rare branches. Nothing else."""
RARE_BY_FUNCTION = {  # answers that landed before park stored its token: inline (success) or left to the workflow
    "park": {"states:SendTaskSuccess", "states:SendTaskFailure"},
    # a lost wake-up of a wait parked by the machine before Answered (its record names no answer_error)
    "sweeper": {"states:SendTaskSuccess"},
}


@pytest.mark.backend("dynamodb")
def test_an_answer_whose_caller_waits_runs_on_in_tools_and_hands_a_second_wait_on(deployment: Any) -> None:
    """Issue 36 on the full deployment (test_fidelity_answers.py has its crash points): the answered turn runs in
    the tools function and, parking again, is handed to one execution by it (its ``StartExecution`` grant)."""
    d, sid = deployment, fresh("answait")
    create(d, sid)
    wait = {"Prefer": "wait=20"}
    status, _, body = d.api("POST", f"/sessions/{sid}/runs", {"message": "signoffs=2"}, headers=wait)
    assert status == 200 and body["status"] == "yielded_tool", (status, body, evidence(d))
    d.settle()
    for ends in ("yielded_tool", "completed"):
        (call,) = show(d, sid)["yielded_tools"]
        answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
        status, _, body = d.api("POST", f"/sessions/{sid}/tools", answers, headers=wait)
        assert status == 200 and body["status"] == ends, (status, body, evidence(d))
        d.settle()
    executions = d.executions_of(TENANT, sid)
    assert len(executions) == 2 and all(e.states[-1] == "Park" for e in executions), evidence(d)
    assert all(e.status == "SUCCEEDED" for e in executions), evidence(d)


@pytest.mark.backend("dynamodb")
def test_zz_the_policies_grant_what_the_code_calls(deployment: Any) -> None:
    """Runs last: every recorded call was allowed, and every granted action was used by some scenario, or is
    one of the commit path's rare branches (``REACHED_RARELY``): a grant nothing can call fails it."""
    d = deployment
    denied = sorted({(c.function, c.action, c.resource) for c in d.denied()})
    unused, idle = [], []
    for name, function in d.functions.items():
        calls = [(c.action, c.resource) for c in d.calls(name)]
        if not calls:
            idle.append(name)
            continue
        granted: dict[str, list[str]] = {}
        for action, resource in iam.grants(function.statements):
            granted.setdefault(action, []).append(resource)
        rare = REACHED_RARELY | RARE_BY_FUNCTION.get(name, set())
        # an action counts as used when some call needed it on one of the resources it is granted on
        unused += [
            (name, action)
            for action, resources in sorted(granted.items())
            if action not in rare and not any(iam.grant_used((action, resource), calls) for resource in resources)
        ]
    machine_denied = [c for c in d.sfn.role_calls if not c[2]]
    # idle: functions whose grants no scenario exercised (or the test ran alone: it reads the others' calls)
    assert not (denied or machine_denied or unused or idle), (
        f"denied: {denied} {machine_denied}; granted but never used (function, action): {unused}; "
        f"functions that made no AWS call in any scenario: {idle}"
    )


UNIT_TESTED_METRICS = {"snapshot_write_failures", "sweep_skips"}
"""Metrics whose every emitting function the scenarios do not reach: a snapshot write failure comes out of
``resume`` here (a throttled snapshot transaction), but its alarm watches all seven committers, and the other six
are held by tests/unit/test_metrics.py; a sweep's skipped session (a throttle the harness does not make yet) by
tests/process/test_sweeper_holds.py. Every other metric must come out of the functions' logs, from each function
an alarm watches it on."""


@pytest.mark.backend("dynamodb")
def test_zz_every_metric_is_emitted_by_the_function_whose_path_should(deployment: Any) -> None:
    """Runs after the scenarios: the EMF lines the functions printed (their stdout, as CloudWatch Logs gets it)
    hold each metric under the namespace and dimensions the code defines, from a function that should emit it,
    never with an id as a dimension; and each alarm on an application metric watches one of those lines."""
    from dormant import metrics
    from tests.support.cdk_template import alarms, watched

    d = deployment
    seen: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for name in d.functions:
        for line in d.log(name).splitlines():
            if not (line.startswith("{") and '"_aws"' in line):
                continue
            record = json.loads(line)
            (directive,) = record["_aws"]["CloudWatchMetrics"]
            (dims,) = directive["Dimensions"]
            assert directive["Namespace"] == metrics.NAMESPACE
            assert record["function"] == name, (name, record)  # published by the function that counted it
            for metric in directive["Metrics"]:
                definition = metrics.METRICS[metric["Name"]]
                assert name in definition.emitted_by, (name, metric)
                assert metric["Unit"] == definition.unit
                want = metrics.dimensions(name, record.get("agent") if definition.by_agent else None)
                assert {k: record[k] for k in dims} == want, (metric, dims)  # nothing else: no session or tenant id
                seen.setdefault(metric["Name"], set()).add(tuple(sorted(want.items())))
    for name in ("sessions", "run", "tools", "commit", "park", "resume"):  # the functions with a Powertools logger
        for line in d.log(name).splitlines():
            if line.startswith("{") and '"level"' in line:
                logged = json.loads(line)
                assert logged.get("tenant") and logged.get("principal"), (name, line[:300])
    missing = set(metrics.METRICS) - UNIT_TESTED_METRICS - set(seen)
    assert not missing, f"never emitted in the scenarios: {sorted(missing)}; emitted: {sorted(seen)}"
    for alarm_name, alarm in alarms(d.template.raw).items():
        for metric in watched(alarm):
            if metric["namespace"] == metrics.NAMESPACE and metric["name"] not in UNIT_TESTED_METRICS:
                assert tuple(sorted(metric["dimensions"].items())) in seen.get(metric["name"], set()), alarm_name


@pytest.mark.backend("dynamodb")
def test_a_caller_past_its_turn_quota_gets_429_and_runs_nothing(dynamodb_endpoint: str) -> None:
    """A deployment of its own, with ``-c turn_quota=2/3600``: the third POST /runs of a tenant in the hour is a
    429 naming the quota; no execution starts and the session's ledger is untouched. Runs refused before their
    claim (409 AwaitingInput) take no turn. Another tenant runs. And an ``Idempotency-Key`` names the route as
    the handler reads it: the same key on ``i-1`` and ``i%2D1`` runs one turn."""
    from tests.support.fidelity.deployment import Deployment

    d = Deployment.start(
        dynamodb_endpoint=dynamodb_endpoint,
        app="fidelity_app:build",
        app_packages=[APP_PACKAGE],
        context={"turn_quota": "2/3600"},
    )
    try:
        tenant = fresh("quota")
        for sid in ("q-1", "q-2", "q-3"):
            create(d, sid, tenant=tenant)
        # turn 1 parks; two runs refused while it waits (409 AwaitingInput: nothing claimed) give their turn back
        assert run(d, "q-1", "signoffs=1", tenant=tenant, settle=30)["status"] == "awaiting_input", evidence(d)
        for _ in range(2):
            status, _, body = d.api("POST", "/sessions/q-1/runs", {"message": "again"}, tenant=tenant)
            assert (status, body["error"]) == (409, "AwaitingInput"), (status, body)
        assert run(d, "q-2", "signoffs=0", tenant=tenant, settle=30)["status"] == "completed", evidence(d)
        before = ledger(d, "q-3", tenant)
        executions = len(d.executions())
        status, _, body = d.api("POST", "/sessions/q-3/runs", {"message": "signoffs=0"}, tenant=tenant)
        assert status == 429, (status, body, evidence(d))
        assert (body["error"], body["field"]) == ("TurnQuotaExceeded", "quota")
        assert "2 turns per 3600 s" in body["message"]
        d.settle(10)
        assert len(d.executions()) == executions  # no execution started for it
        assert ledger(d, "q-3", tenant) == before and show(d, "q-3", tenant)["status"] != "running"
        other = fresh("quota")
        create(d, "q-3", tenant=other)
        assert run(d, "q-3", "signoffs=0", tenant=other, settle=30)["status"] == "completed", evidence(d)
        # one Idempotency-Key, the id spelled two ways: API Gateway decodes the path parameter, and the record is
        # keyed on the route as the handler reads it, so the second is the first's retry (the turn runs once)
        keyed = fresh("quota")
        create(d, "i-1", tenant=keyed)
        key = {"Idempotency-Key": "k-" + keyed}
        answers = [
            d.api("POST", path, {"message": "signoffs=0"}, tenant=keyed, headers=key)
            for path in ("/sessions/i-1/runs", "/sessions/i%2D1/runs")
        ]
        assert [status for status, _, _ in answers] == [202, 202], (answers, evidence(d))
        assert answers[0][2] == answers[1][2]
        d.settle(30)
        users = [e for e in ledger(d, "i-1", keyed) if e["type"] == "user"]
        assert len(users) == 1, users
    finally:
        d.close()
