"""The CDK app: what the synthesized template holds, and that cfn-lint and cdk-nag pass on it.

One synthesis per module (the jsii kernel starts once), by ``tests.cdk_template.synthesize``: with the
cdk-nag AwsSolutions plugin and CDK's own template validation, so a finding or a circular dependency
fails the fixture itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.backend("cdk")

pytest.importorskip("aws_cdk", reason="the infra tests need the infra extra (pip install 'dormant[infra]')")
pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")

from dormant.serving.routes import ROUTES  # noqa: E402
from dormant.stores.dynamodb import TABLE  # noqa: E402
from infra.functions import HANDLERS  # noqa: E402
from infra.stack import TABLE_ACTIONS  # noqa: E402
from infra.workflow import MAX_WAIT_SECONDS, RETRYABLE_ERRORS, RUNNER_LOST  # noqa: E402
from tests.cdk_template import STACK, Synth, definition_of, function_of, synthesize  # noqa: E402


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("cdk.out"))


def statements_of_role(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- the table -----------------------------------------------------------------------------------


def _indexes(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Index entries by name, their projected attributes sorted (CloudFormation keeps no order)."""
    out = {}
    for entry in entries:
        projection = dict(entry["Projection"])
        if "NonKeyAttributes" in projection:
            projection["NonKeyAttributes"] = sorted(projection["NonKeyAttributes"])
        out[entry["IndexName"]] = {"KeySchema": entry["KeySchema"], "Projection": projection}
    return out


def _by_name(attributes: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(attributes, key=lambda a: a["AttributeName"])


def test_the_table_is_built_from_the_store_table_shape(synth: Synth) -> None:
    _, table = synth.one("AWS::DynamoDB::Table")
    props = table["Properties"]
    wanted = TABLE.create_table_request("any")  # what the store's create_table sends
    assert props["KeySchema"] == wanted["KeySchema"]
    assert _by_name(props["AttributeDefinitions"]) == _by_name(wanted["AttributeDefinitions"])
    assert _indexes(props["GlobalSecondaryIndexes"]) == _indexes(wanted["GlobalSecondaryIndexes"])
    assert _indexes(props.get("LocalSecondaryIndexes", [])) == _indexes(wanted.get("LocalSecondaryIndexes", []))
    assert {"listing", "pending"} <= set(_indexes(props["GlobalSecondaryIndexes"]))  # both GSIs
    assert props["BillingMode"] == wanted["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["TimeToLiveSpecification"] == {"AttributeName": TABLE.ttl_attribute, "Enabled": True}
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"


# -- functions and their permissions -------------------------------------------------------------


def test_every_handler_is_a_python_312_arm64_function_with_both_layers(synth: Synth) -> None:
    functions = synth.of_type("AWS::Lambda::Function")
    assert len(functions) == len(HANDLERS)
    layers = synth.of_type("AWS::Lambda::LayerVersion")
    assert len(layers) == 2
    for handler in HANDLERS:
        _, fn = function_of(synth, handler.name)
        props = fn["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["arm64"]
        assert props["Handler"] == "app.handler"
        assert sorted(layer["Ref"] for layer in props["Layers"]) == sorted(layers)
        env = props["Environment"]["Variables"]
        assert env["DORMANT_APP"] == "bookings:build"
        assert env["POWERTOOLS_TRACE_DISABLED"] == "true"
        assert env["PYDANTIC_DISABLE_PLUGINS"] == "__all__"  # no entry-point scan at cold start
        table_id, _ = synth.one("AWS::DynamoDB::Table")
        assert env["DORMANT_IDEMPOTENCY_TABLE"] == {"Ref": table_id}  # idempotency records share the table
        store_url = json.dumps(env["DORMANT_STORE"])
        assert "dynamodb://" in store_url and '"Ref": "ListingShards"' in store_url


def _allowed_resources(synth: Synth, name: str, role_id: str) -> dict[str, list[Any]]:
    table_id, _ = synth.one("AWS::DynamoDB::Table")
    machine_id, _ = synth.one("AWS::StepFunctions::StateMachine")
    table_arn = {"Fn::GetAtt": [table_id, "Arn"]}
    (log_id,) = [
        key
        for key, r in synth.of_type("AWS::Logs::LogGroup").items()
        if r["Metadata"]["aws:cdk:path"] == f"{STACK}/Functions/{name.capitalize()}/Logs/Resource"
    ]
    allowed: dict[str, list[Any]] = {
        "logs": [{"Fn::GetAtt": [log_id, "Arn"]}],
        "dynamodb": [table_arn, {"Fn::Join": ["", [table_arn, "/index/*"]]}],
    }
    if name in {"run", "tools", "park"}:
        allowed["states"] = [{"Ref": machine_id}]
    return allowed


@pytest.mark.parametrize("name", [h.name for h in HANDLERS])
def test_each_function_may_touch_only_the_table_its_logs_and_the_state_machine(synth: Synth, name: str) -> None:
    _, fn = function_of(synth, name)
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    role = synth.resources[role_id]["Properties"]
    assert "ManagedPolicyArns" not in role  # nothing granted wholesale
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    allowed = _allowed_resources(synth, name, role_id)
    actions_by_service: dict[str, set[str]] = {}
    for statement in statements_of_role(synth, role_id):
        assert statement["Effect"] == "Allow"
        services = {action.split(":")[0] for action in as_list(statement["Action"])}
        assert len(services) == 1, statement
        (service,) = services
        assert service in allowed, f"{name} may call {service}: {statement}"
        for resource in as_list(statement["Resource"]):
            assert resource in allowed[service], f"{name}: {service} on {resource}"
        actions_by_service.setdefault(service, set()).update(as_list(statement["Action"]))
    assert actions_by_service["dynamodb"] == set(TABLE_ACTIONS)
    assert "dynamodb:Scan" not in actions_by_service["dynamodb"]
    expected_states = {
        "run": {"states:StartExecution"},
        "tools": {"states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"},
        "park": {"states:SendTaskSuccess", "states:SendTaskFailure"},
    }
    assert actions_by_service.get("states", set()) == expected_states.get(name, set())


def test_the_state_machine_may_invoke_only_park_and_resume_and_start_only_itself(synth: Synth) -> None:
    _, machine = synth.one("AWS::StepFunctions::StateMachine")
    role_id = machine["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    name = machine["Properties"]["StateMachineName"]
    invoked, started = set(), []
    for statement in statements_of_role(synth, role_id):
        if statement["Action"] == "lambda:InvokeFunction":
            invoked |= {json.dumps(r) for r in as_list(statement["Resource"])}
        elif statement["Action"] == "states:StartExecution":  # continue as new: this machine, by its name
            started += [json.dumps(r) for r in as_list(statement["Resource"])]
        else:  # log delivery, which takes no resource narrower than *
            assert all(action.startswith("logs:") for action in as_list(statement["Action"])), statement
    park_id, _ = function_of(synth, "park")
    resume_id, _ = function_of(synth, "resume")
    assert {fid for fid in (park_id, resume_id) if any(fid in r for r in invoked)} == {park_id, resume_id}
    others = {key for key in synth.of_type("AWS::Lambda::Function")} - {park_id, resume_id}
    assert not any(other in r for other in others for r in invoked)
    assert len(started) == 1 and started[0].endswith(f':stateMachine:{name}"]]}}'), started


# -- the API -------------------------------------------------------------------------------------


def _path_of(synth: Synth, resource_id: Any) -> str:
    if isinstance(resource_id, dict) and "Fn::GetAtt" in resource_id:
        return ""  # the API's root resource
    resource = synth.resources[resource_id["Ref"]]["Properties"]
    return f"{_path_of(synth, resource['ParentId'])}/{resource['PathPart']}"


def test_the_api_has_exactly_the_routes_of_the_table(synth: Synth) -> None:
    methods = synth.of_type("AWS::ApiGateway::Method")
    routes = set()
    for method in methods.values():
        props = method["Properties"]
        path = _path_of(synth, props["ResourceId"])
        uri = json.dumps(props["Integration"]["Uri"])
        targets = [h.name for h in HANDLERS if function_of(synth, h.name)[0] in uri]
        assert len(targets) == 1
        assert props["Integration"]["Type"] == "AWS_PROXY"
        routes.add((props["HttpMethod"], path, targets[0]))
    assert routes == set(ROUTES)
    assert len(methods) == len(ROUTES)  # no OPTIONS or ANY method left open


def test_every_method_is_behind_the_cognito_authorizer(synth: Synth) -> None:
    authorizer_id, authorizer = synth.one("AWS::ApiGateway::Authorizer")
    assert authorizer["Properties"]["Type"] == "COGNITO_USER_POOLS"
    pool_id, _ = synth.one("AWS::Cognito::UserPool")
    assert authorizer["Properties"]["ProviderARNs"] == [{"Fn::GetAtt": [pool_id, "Arn"]}]
    for method in synth.of_type("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        assert props["AuthorizationType"] == "COGNITO_USER_POOLS"
        assert props["AuthorizerId"] == {"Ref": authorizer_id}


# -- the resume workflow -------------------------------------------------------------------------


def test_the_workflow_runs_parks_continues_as_new_and_ends_cleanly(synth: Synth) -> None:
    asl = definition_of(synth)
    states = asl["States"]
    assert asl["StartAt"] == "Run"
    assert set(states) == {
        "Run",
        "After the run",
        "Park",
        "Next loop",
        "Continue",
        "Continued",
        "Done",
        "NotClaimed",
        "Expire",
        "Answered as it expired?",
        "Expired",
        "RecordFailure",
        "Failed",
    }
    run = states["Run"]
    assert run["Parameters"]["Payload"]["action"] == "run"
    assert run["ResultPath"] == "$.turn" and run["ResultSelector"] == {"status.$": "$.Payload.status"}
    catches = {tuple(c["ErrorEquals"]): c["Next"] for c in run["Catch"]}
    assert catches == {("TurnNotClaimed",): "NotClaimed", ("States.ALL",): "RecordFailure"}
    after = states["After the run"]
    assert after["Choices"] == [
        {"Variable": "$.turn.status", "StringEquals": "yielded_tool", "Next": "Park"},
        {"Variable": "$.turn.status", "StringEquals": "handed_on", "Next": "Run"},  # the rest of the turn
    ]
    assert after["Default"] == "Done" and states["Done"]["Type"] == "Succeed"

    park = states["Park"]
    assert park["Resource"].endswith(":states:::lambda:invoke.waitForTaskToken")
    assert park["Parameters"]["Payload"]["token.$"] == "$$.Task.Token"
    assert park["ResultPath"] == "$.answer"  # the callback's output must not replace the session's ids
    assert park["TimeoutSeconds"] == "<WaitTimeoutSeconds>"
    catches = {tuple(c["ErrorEquals"]): c["Next"] for c in park["Catch"]}
    assert catches[("States.Timeout", "States.HeartbeatTimeout")] == "Expire"
    assert catches[("States.ALL",)] == "RecordFailure"
    assert park["Next"] == "Next loop"  # every wait ends its execution: one wait per execution

    # continue as new: the same machine, the same turn, a deterministic name per loop
    assert states["Next loop"]["Parameters"]["loop.$"] == "States.MathAdd($.loop, 1)"
    assert states["Next loop"]["Next"] == "Continue"
    cont = states["Continue"]
    assert cont["Resource"].endswith(":states:::states:startExecution")
    assert cont["Parameters"]["StateMachineArn.$"] == "$$.StateMachine.Id"
    assert cont["Parameters"]["Name.$"] == "States.Format('{}-{}', $.name, $.loop)"
    assert {k: v for k, v in cont["Parameters"]["Input"].items() if not k.startswith("AWS_")} == {
        "tenant.$": "$.tenant",
        "session_id.$": "$.session_id",
        "invocation_id.$": "$.invocation_id",
        "name.$": "$.name",
        "loop.$": "$.loop",
    }
    assert cont["Catch"] == [{"ErrorEquals": ["StepFunctions.ExecutionAlreadyExistsException"], "Next": "Continued"}]
    assert cont["Next"] == "Continued" and states["Continued"]["Type"] == "Succeed"

    assert states["Expire"]["Parameters"]["Payload"]["action"] == "expire"
    assert states["Expire"]["Next"] == "Answered as it expired?"
    answered = states["Answered as it expired?"]
    assert answered["Choices"] == [{"Variable": "$.expired.status", "StringEquals": "resumable", "Next": "Next loop"}]
    assert answered["Default"] == "Expired" and states["Expired"]["Type"] == "Succeed"
    assert states["RecordFailure"]["Parameters"]["Payload"]["error.$"] == "$.error"
    assert states["RecordFailure"]["Next"] == "Failed" and states["Failed"]["Type"] == "Fail"
    for name in ("Run", "Park", "Expire", "RecordFailure"):
        for key in ("session_id", "tenant", "invocation_id"):
            assert states[name]["Parameters"]["Payload"][f"{key}.$"] == f"$.{key}"


def test_every_task_retries_transient_errors_with_backoff_and_nothing_else(synth: Synth) -> None:
    from dormant.errors import retryable_error_names

    states = definition_of(synth)["States"]
    assert set(retryable_error_names()) >= {"StoreBusy", "StoreUnavailable", "CommitIncomplete", "ModelUnavailable"}
    assert [*retryable_error_names(), "Lambda.TooManyRequestsException"] == RETRYABLE_ERRORS
    for name in ("Run", "Park", "Expire", "RecordFailure"):
        retries = {tuple(r["ErrorEquals"]): r for r in states[name]["Retry"]}
        if name == "Run":  # a runner that timed out or died: the next attempt goes on from its committed steps
            ours = retries.pop((*RETRYABLE_ERRORS, *RUNNER_LOST))
            claim = retries.pop(("TurnNotClaimed",))  # the claim lands just after the execution starts
            waited = sum(claim["IntervalSeconds"] * claim["BackoffRate"] ** n for n in range(claim["MaxAttempts"]))
            assert 29 < waited < 120, waited  # longer than the API's request that commits it, not forever
        else:
            ours = retries.pop(tuple(RETRYABLE_ERRORS))
        assert ours["IntervalSeconds"] == 1 and ours["BackoffRate"] == 2 and ours["MaxAttempts"] == 4
        assert ours["MaxDelaySeconds"] == 30 and ours["JitterStrategy"] == "FULL"
        # what is left is CDK's retry of the Lambda service's own errors
        ((errors, service),) = retries.items()
        assert set(errors) == {
            "Lambda.ClientExecutionTimeoutException",
            "Lambda.ServiceException",
            "Lambda.AWSLambdaException",
            "Lambda.SdkClientException",
        }
        assert service["BackoffRate"] == 2 and service["MaxAttempts"] >= 1
        # a timeout is not retried (it is the end of the wait), nor a failure of the agent's own making
        assert not any(e.startswith("States.") for r in states[name]["Retry"] for e in r["ErrorEquals"])


def test_the_wait_timeout_is_a_parameter_under_a_year(synth: Synth) -> None:
    params = synth.template["Parameters"]
    # one wait per execution, and its turn's runs, stay under Step Functions' one year
    assert params["WaitTimeoutSeconds"]["MaxValue"] == MAX_WAIT_SECONDS == 360 * 24 * 3600 < 365 * 24 * 3600
    assert params["ListingShards"]["MinValue"] == 1
    assert "30" in params["LogRetentionDays"]["AllowedValues"]
    for group in synth.of_type("AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_the_sweeper_runs_on_a_schedule(synth: Synth) -> None:
    _, rule = synth.one("AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    sweeper_id, _ = function_of(synth, "sweeper")
    assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [{"Fn::GetAtt": [sweeper_id, "Arn"]}]


# -- linters -------------------------------------------------------------------------------------


def test_cdk_nag_passes_with_only_the_acknowledged_findings(synth: Synth) -> None:
    (report,) = synth.report["pluginReports"]
    assert report["pluginName"] == "AwsSolutions"
    assert report["conclusion"] == "success"
    assert report["violations"] == []
    acknowledged = {v["ruleName"] for v in report["suppressedViolations"]}
    # Each is acknowledged with its reason where it is made (CDK requires the reason); a new one is a decision.
    table_id, _ = synth.one("AWS::DynamoDB::Table")
    park_id, _ = function_of(synth, "park")
    resume_id, _ = function_of(synth, "resume")
    assert acknowledged == {
        f"AwsSolutions-IAM5[Resource::<{table_id}.Arn>/index/*]",
        f"AwsSolutions-IAM5[Resource::<{park_id}.Arn>:*]",
        f"AwsSolutions-IAM5[Resource::<{resume_id}.Arn>:*]",
        "AwsSolutions-IAM5[Resource::*]",
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
        "AwsSolutions-L1",
        "AwsSolutions-SF2",
        "AwsSolutions-COG8",
        "AwsSolutions-APIG2",
        "AwsSolutions-APIG3",
    }


def test_cfn_lint_is_clean(synth: Synth) -> None:
    # W3005 (a DependsOn that a GetAtt already implies) is CDK's own redundancy, not ours.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cfn-lint")), "-i", "W3005", "--", str(synth.path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
