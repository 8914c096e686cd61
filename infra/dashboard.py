"""The CloudWatch dashboard: turns and yields per minute, turn time and model latency (p50, p99), tokens,
conflicts, repairs, throttles and concurrency per function.

The application's metrics are read as ``dormant.metrics`` publishes them: those dimensioned by agent through a
``SEARCH`` over the agents (one line per agent, or their sum), the others per function (``infra.alarms``).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from dormant import metrics

from .alarms import app_metric, app_total

MINUTE = Duration.minutes(1)


def by_agent(name: str, statistic: str, period: Duration = MINUTE, total: bool = False) -> cloudwatch.MathExpression:
    """``name`` for every agent (``total``: summed over them): a SEARCH on the agent-dimensioned metric."""
    assert metrics.METRICS[name].by_agent, name
    search = (
        f"SEARCH('{{{metrics.NAMESPACE},agent,function,service}} MetricName=\"{name}\"', "
        f"'{statistic}', {int(period.to_seconds())})"
    )
    return cloudwatch.MathExpression(
        expression=f"SUM({search})" if total else search, label=name, period=period, using_metrics={}
    )


class Dashboard(Construct):
    def __init__(
        self, scope: Construct, id: str, *, functions: Mapping[str, lambda_.Function], table: dynamodb.Table
    ) -> None:
        super().__init__(scope, id)
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        per_function = sorted(functions.items())
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Turns and yields per minute",
                left=[by_agent("turns", "Sum", total=True), by_agent("yields", "Sum", total=True)],
            ),
            cloudwatch.GraphWidget(
                title="Turn time (ms, p50 and p99)",
                left=[by_agent("turn_ms", "p50", Duration.minutes(5)), by_agent("turn_ms", "p99", Duration.minutes(5))],
            ),
            cloudwatch.GraphWidget(
                title="Model latency (ms, p50 and p99)",
                left=[
                    by_agent("model_latency_ms", "p50", Duration.minutes(5)),
                    by_agent("model_latency_ms", "p99", Duration.minutes(5)),
                ],
            ),
            cloudwatch.GraphWidget(
                title="Model tokens per minute",
                left=[
                    by_agent("model_input_tokens", "Sum", total=True),
                    by_agent("model_output_tokens", "Sum", total=True),
                ],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Conflicts, merges, forks",
                left=[app_total("conflicts", MINUTE), app_total("merges", MINUTE), app_total("forks", MINUTE)],
            ),
            cloudwatch.GraphWidget(
                title="Sweeper: repairs, stuck sessions, orphaned waits",
                left=[
                    app_metric("repairs", "sweeper"),
                    app_metric("stuck_sessions_ended", "sweeper"),
                    app_metric("orphaned_waits_restarted", "sweeper"),
                ],
            ),
            cloudwatch.GraphWidget(
                title="Throttles (Lambda per function; DynamoDB)",
                left=[f.metric_throttles(period=MINUTE, label=name) for name, f in per_function],
                right=[
                    table.metric("ReadThrottleEvents", period=MINUTE, statistic="Sum"),
                    table.metric("WriteThrottleEvents", period=MINUTE, statistic="Sum"),
                ],
            ),
            cloudwatch.GraphWidget(
                title="Concurrent executions per function",
                left=[
                    f.metric("ConcurrentExecutions", period=MINUTE, statistic="Maximum", label=name)
                    for name, f in per_function
                ],
            ),
        )
