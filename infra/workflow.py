"""The Step Functions state machine that wakes sleeping sessions.

A run that yields starts an execution with ``{tenant, session_id}``::

    Park ──(answers arrive: SendTaskSuccess)──> Resume ──> Yielded again? ──yes──> Park
      │                                            │            └─no──> Done
      ├─ wait timed out ──> Expire ──> Expired     │
      └─ any error ───────────────────────────────┴──> RecordFailure ──> Failed

``Park`` is a ``.waitForTaskToken`` task: the park function stores the token with the session and the
execution sleeps, at no cost, until ``POST /tools`` sends the answers or the wait times out (up to a year).
Its result goes to ``$.answer`` so the execution input (tenant, session) survives the callback.

Every task retries, with backoff and jitter, what may pass by itself: dormant's retryable errors
(``dormant.errors.retryable_error_names()``: a busy or unreachable store, a model that is down) and
Lambda throttling, on top of the Lambda service errors CDK already retries. Anything else goes
straight to its Catch. A retried park stores the new token; a retried resume claims the session
again (``serving.advance``), so a retry never runs a turn twice.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from dormant.errors import retryable_error_names

MAX_WAIT_SECONDS = 365 * 24 * 3600
_TIMEOUTS = ["States.Timeout", "States.HeartbeatTimeout"]
RETRYABLE_ERRORS = [*retryable_error_names(), "Lambda.TooManyRequestsException"]
"""What the tasks retry beyond CDK's Lambda service errors: the errors that say "try again later"."""


def _retry_transient(task: tasks.LambdaInvoke) -> None:
    """Up to 4 retries, 1 s apart and doubling (at most 30 s), fully jittered so retries do not stampede."""
    task.add_retry(
        errors=RETRYABLE_ERRORS,
        interval=Duration.seconds(1),
        backoff_rate=2,
        max_attempts=4,
        max_delay=Duration.seconds(30),
        jitter_strategy=sfn.JitterType.FULL,
    )


def _session(action: str, **extra: object) -> sfn.TaskInput:
    return sfn.TaskInput.from_object(
        {
            "action": action,
            "tenant": sfn.JsonPath.string_at("$.tenant"),
            "session_id": sfn.JsonPath.string_at("$.session_id"),
            **extra,
        }
    )


class ResumeWorkflow(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        park: lambda_.IFunction,
        resume: lambda_.IFunction,
        wait_timeout_seconds: float,
        log_retention_days: float,
        tracing: bool,
        state_machine_name: str | None = None,
    ) -> None:
        super().__init__(scope, id)
        wait = tasks.LambdaInvoke(
            self,
            "Park",
            lambda_function=park,
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            payload=_session("park", token=sfn.JsonPath.task_token),
            task_timeout=sfn.Timeout.duration(Duration.seconds(wait_timeout_seconds)),
            result_path="$.answer",
        )
        run_on = tasks.LambdaInvoke(
            self,
            "Resume",
            lambda_function=resume,
            payload=_session("resume"),
            result_selector={"status": sfn.JsonPath.string_at("$.Payload.status")},
            result_path="$.resumed",
        )
        expire = tasks.LambdaInvoke(
            self, "Expire", lambda_function=resume, payload=_session("expire"), result_path=sfn.JsonPath.DISCARD
        )
        record_failure = tasks.LambdaInvoke(
            self,
            "RecordFailure",
            lambda_function=resume,
            payload=_session("fail", error=sfn.JsonPath.object_at("$.error")),
            result_path=sfn.JsonPath.DISCARD,
        )
        for task in (wait, run_on, expire, record_failure):
            _retry_transient(task)
        failed = sfn.Fail(self, "Failed", error="ResumeFailed", cause="the error is recorded on the session's ledger")
        record_failure.next(failed)
        expire.next(sfn.Succeed(self, "Expired", comment="the wait timed out; the session is marked expired"))
        wait.add_catch(expire, errors=_TIMEOUTS, result_path="$.error")
        wait.add_catch(record_failure, errors=["States.ALL"], result_path="$.error")
        run_on.add_catch(record_failure, errors=["States.ALL"], result_path="$.error")
        yielded = (
            sfn.Choice(self, "Yielded again?")
            .when(sfn.Condition.string_equals("$.resumed.status", "yielded_tool"), wait)
            .otherwise(sfn.Succeed(self, "Done"))
        )
        log_group = logs.LogGroup(self, "Logs", removal_policy=RemovalPolicy.DESTROY)
        log_group.node.default_child.add_property_override("RetentionInDays", log_retention_days)  # type: ignore[union-attr]
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(wait.next(run_on).next(yielded)),
            state_machine_type=sfn.StateMachineType.STANDARD,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
            tracing_enabled=tracing,
            # (infra) A fixed name, so the stack can write the ARN without referencing this resource.
            state_machine_name=state_machine_name,
        )
        acks = [
            Acknowledgment(
                id=f"AwsSolutions::AwsSolutions-IAM5[Resource::<{self._logical_id(fn)}.Arn>:*]",
                reason="Invoking a function's versions and aliases (ARN:*) is how CDK grants the task's lambda:invoke; "
                "it stays on the two functions the workflow calls.",
            )
            for fn in (park, resume)
        ]
        acks.append(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-IAM5[Resource::*]",
                reason="Execution logging uses the CloudWatch Logs delivery actions (logs:CreateLogDelivery and the "
                "like), which accept no resource narrower than *.",
            )
        )
        if not tracing:
            acks.append(
                Acknowledgment(
                    id="AwsSolutions::AwsSolutions-SF2",
                    reason="X-Ray is off by default to keep cold starts and cost down; -c tracing=true turns it on for "
                    "the functions, the API and the state machine together.",
                )
            )
        Validations.of(self.state_machine).acknowledge(*acks)

    @staticmethod
    def _logical_id(fn: lambda_.IFunction) -> str:
        return Stack.of(fn).resolve(fn.node.default_child.logical_id)  # type: ignore[union-attr, no-any-return]
