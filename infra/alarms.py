"""The alarms: what fires before users notice, each to the SNS topic given at deploy time.

``-c alarm_topic=arn:aws:sns:...`` names the topic (one the operator already owns and subscribes to); without
it the alarms exist and show in the console, with no action. The application's own alarms watch the metrics
``dormant.metrics`` publishes, under exactly the namespace, name and dimensions the code emits
(``metrics.METRICS``, ``metrics.dimensions``); a test holds the template to them. docs/operating.md, "Alarms", says
what each alarm means and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from dormant import metrics

FIVE_MINUTES = Duration.minutes(5)
API_5XX_RATE = 0.05
"""The share of API requests answered 5xx, over five minutes, that fires the API's alarm."""


def app_metric(name: str, function: str, statistic: str = "Sum", period: Duration = FIVE_MINUTES) -> cloudwatch.Metric:
    """Metric ``name`` as ``function`` publishes it (``dormant.metrics``): the same namespace and dimensions."""
    assert function in metrics.METRICS[name].emitted_by, (name, function)
    return cloudwatch.Metric(
        namespace=metrics.NAMESPACE,
        metric_name=name,
        dimensions_map=metrics.dimensions(function),
        statistic=statistic,
        period=period,
    )


def app_total(name: str, period: Duration = FIVE_MINUTES) -> cloudwatch.IMetric:
    """``name`` summed over every function that emits it (one metric when only one does)."""
    functions = sorted(metrics.METRICS[name].emitted_by)
    if len(functions) == 1:
        return app_metric(name, functions[0], period=period)
    named = {f"{name}_{i}": app_metric(name, f, period=period) for i, f in enumerate(functions)}
    return cloudwatch.MathExpression(
        expression=f"SUM([{','.join(named)}])", using_metrics=named, label=name, period=period
    )


class Alarms(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        functions: Mapping[str, lambda_.Function],
        state_machines: Mapping[str, sfn.StateMachine],
        table: dynamodb.Table,
        indexes: Sequence[str],
        stage: apigw.Stage,
        sweeper_dlq: sqs.Queue,
        topic_arn: str | None,
    ) -> None:
        super().__init__(scope, id)
        self.topic = sns.Topic.from_topic_arn(self, "Topic", topic_arn) if topic_arn else None
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        for name, function in sorted(functions.items()):
            self._above(f"{name}-errors", function.metric_errors(period=FIVE_MINUTES), f"the {name} function failed")
            self._above(f"{name}-throttles", function.metric_throttles(period=FIVE_MINUTES), f"{name} was throttled")
        for prefix, machine in state_machines.items():  # "": the sessions machine; "wait-": the waits machine
            self._above(f"{prefix}executions-failed", machine.metric_failed(period=FIVE_MINUTES), "executions failed")
            timed_out = machine.metric_timed_out(period=FIVE_MINUTES)
            self._above(f"{prefix}executions-timed-out", timed_out, "executions timed out")
        self._above("table-throttled", _throttles(table.table_name, None), "the session table throttled requests")
        for index in indexes:
            self._above(f"index-{index}-throttled", _throttles(table.table_name, index), f"index {index} throttled")
        rate = cloudwatch.MathExpression(
            expression="IF(requests > 0, FILL(errors, 0) / requests, 0)",
            using_metrics={
                "errors": stage.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
                "requests": stage.metric_count(period=FIVE_MINUTES, statistic="Sum"),
            },
            label="5xx rate",
            period=FIVE_MINUTES,
        )
        self._above("api-5xx-rate", rate, f"over {API_5XX_RATE:.0%} of API requests answered 5xx", API_5XX_RATE)
        # The sweeper runs every five minutes: three periods in a row are three sweeps that each repaired.
        self._above("repairs", app_total("repairs"), "commits left pending by stopped writers, 3 sweeps in a row", 0, 3)
        self._above("stuck-sessions", app_total("stuck_sessions_ended"), "turns whose runner died were ended")
        self._above("orphaned-waits", app_total("orphaned_waits_restarted"), "waits had lost their execution")
        self._above("snapshot-failures", app_total("snapshot_write_failures"), "snapshots could not be stored")
        depth = sweeper_dlq.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum")
        self._above("sweeper-dlq", depth, "sweeps the schedule could not deliver to the sweeper")

    def _above(
        self, name: str, metric: cloudwatch.IMetric, what: str, threshold: float = 0, periods: int = 1
    ) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"dormant: {what} (docs/operating.md, Alarms: {name})",
        )
        if self.topic is not None:
            alarm.add_alarm_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm
        return alarm


def _throttles(table: str, index: str | None) -> cloudwatch.MathExpression:
    """Read and write throttle events of the table (``index``: of that global secondary index)."""
    dims = {"TableName": table, **({"GlobalSecondaryIndexName": index} if index else {})}
    named = {
        kind.lower(): cloudwatch.Metric(
            namespace="AWS/DynamoDB",
            metric_name=f"{kind}ThrottleEvents",
            dimensions_map=dims,
            statistic="Sum",
            period=FIVE_MINUTES,
        )
        for kind in ("Read", "Write")
    }
    expression = "FILL(read, 0) + FILL(write, 0)"
    return cloudwatch.MathExpression(expression=expression, using_metrics=named, label="throttles")
