"""The sweeper's schedule: an EventBridge rule that repairs commits a stopped writer left pending."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from constructs import Construct


class SweeperSchedule(Construct):
    def __init__(self, scope: Construct, id: str, *, sweeper: lambda_.IFunction, every_minutes: int = 5) -> None:
        super().__init__(scope, id)
        self.rule = events.Rule(
            self,
            "Rule",
            description="dormant: repair pending commits (repair_pending)",
            schedule=events.Schedule.rate(Duration.minutes(every_minutes)),
            targets=[targets.LambdaFunction(sweeper, retry_attempts=2)],
        )
