"""The alarms, as synthesized: every alarm's metric exists under the name, namespace and dimensions it watches.

The application's metrics are checked against the code's own definitions (``dormant.metrics``: the names the
code counts, the functions whose path counts them, the dimensions it publishes with); AWS's metrics against
the resources of the template they name. The fidelity harness checks the published lines themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")

from dormant import metrics
from dormant.stores.dynamodb import TABLE
from infra.functions import HANDLERS
from tests.support.cdk_template import Synth, alarms, function_of, machine_of, synthesize, watched

TOPIC = "arn:aws:sns:eu-west-1:123456789012:ops"


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("cdk.out"), {"alarm_topic": TOPIC})


def test_every_application_alarm_watches_a_metric_the_code_emits_as_it_emits_it(synth: Synth) -> None:
    seen = set()
    for name, alarm in alarms(synth.template).items():
        for metric in watched(alarm):
            if metric["namespace"] != metrics.NAMESPACE:
                continue
            definition = metrics.METRICS.get(metric["name"])
            assert definition is not None, (name, metric)  # a name the code counts
            function = metric["dimensions"].get("function")
            assert function in definition.emitted_by, (name, metric)  # by a function whose path counts it
            assert metric["dimensions"] == metrics.dimensions(function), (name, metric)  # as it publishes it
            seen.add(metric["name"])
    assert seen == {"repairs", "stuck_sessions_ended", "orphaned_waits_restarted", "snapshot_write_failures"}
    # a metric several functions emit is watched for each of them
    failures = [m for m in watched(alarms(synth.template)["snapshot-failures"])]
    assert {m["dimensions"]["function"] for m in failures} == metrics.METRICS["snapshot_write_failures"].emitted_by


def test_aws_metrics_name_the_stacks_own_resources(synth: Synth) -> None:
    found = alarms(synth.template)
    for handler in HANDLERS:
        function_id, _ = function_of(synth, handler.name)
        for kind, metric_name in (("errors", "Errors"), ("throttles", "Throttles")):
            (metric,) = watched(found[f"{handler.name}-{kind}"])
            assert metric == {
                "namespace": "AWS/Lambda",
                "name": metric_name,
                "dimensions": {"FunctionName": {"Ref": function_id}},
            }
    for prefix, which in (("", "sessions"), ("wait-", "waits")):  # each machine's failed and timed-out executions
        machine_id, _ = machine_of(synth, which)
        states = (("executions-failed", "ExecutionsFailed"), ("executions-timed-out", "ExecutionsTimedOut"))
        for name, metric_name in states:
            (metric,) = watched(found[prefix + name])
            assert (metric["namespace"], metric["name"]) == ("AWS/States", metric_name)
            assert metric["dimensions"] == {"StateMachineArn": {"Ref": machine_id}}
    table_id, _ = synth.one("AWS::DynamoDB::Table")
    global_indexes = [i.name for i in TABLE.indexes if not i.local]
    assert global_indexes
    for index in [None, *global_indexes]:
        metrics_ = watched(found["table-throttled" if index is None else f"index-{index}-throttled"])
        want = {"TableName": {"Ref": table_id}, **({"GlobalSecondaryIndexName": index} if index else {})}
        assert {m["name"] for m in metrics_} == {"ReadThrottleEvents", "WriteThrottleEvents"}
        assert all(m["namespace"] == "AWS/DynamoDB" and m["dimensions"] == want for m in metrics_)
    api = watched(found["api-5xx-rate"])
    assert {m["name"] for m in api} == {"5XXError", "Count"}
    assert all(set(m["dimensions"]) == {"ApiName", "Stage"} for m in api)
    queue_id, _ = synth.one("AWS::SQS::Queue")
    (depth,) = watched(found["sweeper-dlq"])
    assert depth["name"] == "ApproximateNumberOfMessagesVisible"
    assert depth["dimensions"] == {"QueueName": {"Fn::GetAtt": [queue_id, "QueueName"]}}


def test_every_alarm_goes_to_the_topic_and_repairs_need_three_sweeps(synth: Synth) -> None:
    found = alarms(synth.template)
    assert all(a["Properties"]["AlarmActions"] == [TOPIC] for a in found.values())
    repairs = found["repairs"]["Properties"]
    assert (repairs["EvaluationPeriods"], repairs["DatapointsToAlarm"], repairs["Threshold"]) == (3, 3, 0)
    assert all(m.get("MetricStat", {}).get("Period", 300) == 300 for m in repairs.get("Metrics", []))


def test_the_sweepers_schedule_has_a_dead_letter_queue(synth: Synth) -> None:
    _, rule = synth.one("AWS::Events::Rule")
    queue_id, _ = synth.one("AWS::SQS::Queue")
    (target,) = rule["Properties"]["Targets"]
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [queue_id, "Arn"]}}


def test_the_sweepers_own_failures_reach_the_queue_whose_alarm_fires(synth: Synth) -> None:
    """EventBridge invokes the sweeper asynchronously: once Lambda took the event, the sweeper's errors and
    throttles are Lambda's to retry, and only its async config's on-failure destination catches what fails them
    (the rule's dead-letter queue sees only events EventBridge could not deliver)."""
    queue_id, _ = synth.one("AWS::SQS::Queue")
    sweeper_id, _ = function_of(synth, "sweeper")
    _, config = synth.one("AWS::Lambda::EventInvokeConfig")
    props = config["Properties"]
    assert props["FunctionName"] == {"Ref": sweeper_id} and props["Qualifier"] == "$LATEST"
    assert props["DestinationConfig"] == {"OnFailure": {"Destination": {"Fn::GetAtt": [queue_id, "Arn"]}}}
    assert props["MaximumRetryAttempts"] == 2 and props["MaximumEventAgeInSeconds"] == 300
    role = {"Ref": function_of(synth, "sweeper")[1]["Properties"]["Role"]["Fn::GetAtt"][0]}
    sent = [
        statement["Resource"]
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if role in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "sqs:SendMessage" in statement["Action"]
    ]
    assert sent == [{"Fn::GetAtt": [queue_id, "Arn"]}]  # the sweeper's role may send its failures there
    depth = alarms(synth.template)["sweeper-dlq"]
    (metric,) = watched(depth)
    assert metric["name"] == "ApproximateNumberOfMessagesVisible"
    assert metric["dimensions"] == {"QueueName": {"Fn::GetAtt": [queue_id, "QueueName"]}}


def test_without_a_topic_the_alarms_have_no_action(tmp_path: Path) -> None:
    bare = synthesize(tmp_path / "cdk.out")
    assert all("AlarmActions" not in a["Properties"] for a in bare.of_type("AWS::CloudWatch::Alarm").values())


def test_the_dashboard_shows_what_operating_needs(synth: Synth) -> None:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = json.loads("".join(p if isinstance(p, str) else "<ref>" for p in parts))
    lines = [line for widget in body["widgets"] for line in widget["properties"]["metrics"]]
    expressions = {line[0]["expression"] for line in lines if isinstance(line[0], dict)}
    named = {part for line in lines for part in line if isinstance(part, str)}
    dims = f"{{{metrics.NAMESPACE},agent,function,service}}"
    for name in ("turns", "yields", "model_input_tokens", "model_output_tokens"):
        assert f"SUM(SEARCH('{dims} MetricName=\"{name}\"', 'Sum', 60))" in expressions, (name, expressions)
    for name in ("turn_ms", "model_latency_ms"):
        for statistic in ("p50", "p99"):
            assert f"SEARCH('{dims} MetricName=\"{name}\"', '{statistic}', 300)" in expressions, (name, statistic)
    for name in ("conflicts", "repairs", "Throttles", "ConcurrentExecutions", "ReadThrottleEvents"):
        assert name in named, (name, named)


def test_the_operating_page_says_what_every_alarm_means_and_what_to_do(synth: Synth) -> None:
    """docs/operating.md's Alarms table names each alarm the stack makes (``<function>``/``<name>`` stand for every
    function and index), with what it means and what to do: an alarm added without a line there is red."""
    page = (Path(__file__).parents[2] / "docs" / "operating.md").read_text()
    section = page.split("\n## Alarms\n", 1)[1].split("\n## ", 1)[0]  # not the guardrails' table above it
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    patterns = []
    for row in rows:
        alarm, means, todo = (cell.strip() for cell in row.strip("|").split("|")[:3])
        assert means and todo, row
        for name in alarm.replace("`", "").split(","):
            escaped = re.escape(name.strip())
            patterns.append(
                re.compile(escaped.replace(re.escape("<function>"), r"[a-z]+").replace(re.escape("<name>"), r"[a-z]+"))
            )
    unexplained = [name for name in alarms(synth.template) if not any(p.fullmatch(name) for p in patterns)]
    assert not unexplained
