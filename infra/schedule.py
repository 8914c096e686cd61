"""The sweeper's schedule: an EventBridge rule that repairs commits a stopped writer left pending.

EventBridge invokes the sweeper asynchronously: once Lambda accepts the event, the sweeper's own failures and
throttles are Lambda's to retry, and the rule's dead-letter queue only ever sees events EventBridge could not
hand to Lambda. So the sweeper's asynchronous invocation config sends a sweep that failed its retries (or
aged past a sweep's period) to the same queue, as its on-failure destination; the queue's depth has an alarm
(``infra.alarms``): sweeps that do not run leave pending commits, dead runners and lost waits unattended.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, Validations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_sqs as sqs
from constructs import Construct


class SweeperSchedule(Construct):
    def __init__(self, scope: Construct, id: str, *, sweeper: lambda_.IFunction, every_minutes: int = 5) -> None:
        super().__init__(scope, id)
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            enforce_ssl=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            retention_period=Duration.days(14),
        )
        Validations.of(self.dead_letters).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-SQS3",
                reason="This queue is the dead-letter queue of the sweeper's schedule (EventBridge target) and the "
                "sweeper's on-failure destination.",
            )
        )
        # The next sweep comes within a period: an older one is dropped to the queue, not run late.
        sweeper.configure_async_invoke(
            on_failure=destinations.SqsDestination(self.dead_letters),
            retry_attempts=2,
            max_event_age=Duration.minutes(every_minutes),
        )
        self.rule = events.Rule(
            self,
            "Rule",
            description="dormant: repair pending commits (repair_pending)",
            schedule=events.Schedule.rate(Duration.minutes(every_minutes)),
            targets=[
                targets.LambdaFunction(
                    sweeper,
                    retry_attempts=2,
                    max_event_age=Duration.minutes(every_minutes),
                    dead_letter_queue=self.dead_letters,
                )
            ],
        )
