"""The Step Functions state machines that run turns and wake sleeping sessions: the sessions machine and the waits
machine (one construct, ``ResumeWorkflow``).

``POST /runs`` starts an execution of the sessions machine with ``{tenant, session_id, invocation_id, name, loop}``
just before it commits the turn's claim, so every claimed turn has an execution responsible for it; it starts at
``Run``. A turn that a waiting request (``Prefer: wait``) ran to its park (``hand_on(parked=True)``), and a wait
the sweeper finds without an execution, get an execution of the waits machine, whose first state is ``Park``: no
Choice at the start of any execution, no ``Run`` to find the turn waiting::

    sessions:  Run ──yielded──> Park ─┐        waits:  Park ─┐   (the same Park and all after it, one function
                │ ^                   │                      │    builds both: ``_wait_states``)
                │ └─handed on──┘      │                      │
                ├─ anything else ──> Done
                ├─ claim never landed ──> NotClaimed
                └─ error (after retries) ──> RecordFailure (on park) ──> Failed

    Park ──answered, the turn run on by the request that answered (SendTaskSuccess)──> (end)
      ├─ answered, the turn left to the workflow (SendTaskFailure Answered) ──> Continue
      │                                  ──> a fresh execution of the sessions machine (Run ...)
      ├─ wait timed out ──> Expire ──answered meanwhile?──yes──> Continue
      │                            └─no──> Expired
      └─ error (after retries) ──> RecordParkFailure (on resume) ──> Failed

``Run`` (the resume function, minutes of time) runs the turn, committing each step; a turn that needs more
time than one invocation comes back ``handed_on`` and runs again from its last committed step. A retried
``Run`` (its first attempt timed out or died) takes the invocation over; one whose claim has not landed
yet raises ``TurnNotClaimed``, retried for about a minute and then dropped (``NotClaimed``).

``Park`` is a ``.waitForTaskToken`` task: the park function stores the token with the session (and which
execution parked, until when: the sweeper finds a wait whose execution is gone and gives it a fresh one; an
``Expire`` of an execution it superseded ends nothing) and the execution sleeps, at no cost, until
``POST /tools`` sends the answers or the wait times out. An answer whose request runs the turn on itself
(``Prefer: wait``) makes the task succeed, and the execution ends there: ``Park`` is an end state. An answer
left to the workflow (``POST /tools`` without ``Prefer: wait``, the sweeper's lost wake-up, park finding the
answers in before its token was stored) fails the task with
``Answered`` (``dormant.serving.workflow.stepfunctions.ANSWERED``, named in Park's payload and kept with the
token), caught before ``States.ALL`` and matched by no retrier (a retried wait would park again), into
``Continue``. Every wait ends its execution: the turn goes on in a fresh execution (``Continue``, "continue as
new"), so one execution holds at most one wait, its history stays short
(tens of events, never near 25,000) and its life stays under Step Functions' one year (the wait timeout is at
most ``MAX_WAIT_SECONDS``). The next execution's name is the first's with ``-<loop>``: a retried ``Continue``
finds it started (``ExecutionAlreadyExists``). Each machine has a fixed name (``infra.wiring.state_machine_name``,
``wait_machine_name``), so the stack writes their ARNs (the functions' environment, each machine's right to start
the sessions machine, ``Continue``'s target) without a circular reference. An inline approval is 1 transition
(``Park``) where it was 4 (``Parked?``, ``Park``, ``Went on?``, ``Went on inline``); a turn run in the workflow
pays no first Choice (issue 36). A caught ``Answered`` is a ``TaskFailed`` event in the history, so the log
group (level ``ERROR``) gets a record of it (a few hundred bytes an answer left to the workflow: not a failure,
and cheaper than the two states, ``Went on?`` and ``Went on inline``, it replaces on every inline answer); the
execution succeeds, and the alarms (each machine's ``ExecutionsFailed``, ``ExecutionsTimedOut``) do not count it.

Every task retries, with backoff and jitter, what may pass by itself: dormant's retryable errors
(``dormant.errors.retryable_error_names()``), Lambda throttling (for as long as a throttle can last,
``THROTTLE_RETRY``), and, for ``Run``, a function that timed out or died (its committed steps are kept).
Anything else goes to ``RecordFailure``, which ends the invocation on the ledger as an ``error`` on the
*other* workflow function (a function throttled at its cap cannot record its own failure): a session is
never left ``running`` by a failed execution. Each Lambda task's timeout outlasts its function's.
"""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import Acknowledgment, ArnFormat, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from dormant.errors import retryable_error_names
from dormant.serving.workflow.stepfunctions import ANSWERED

MAX_WAIT_SECONDS = 360 * 24 * 3600
"""The longest a session waits for answers: under Step Functions' one year, with room for the turn's runs."""
_TIMEOUTS = ["States.Timeout", "States.HeartbeatTimeout"]
RETRYABLE_ERRORS = [*retryable_error_names()]
"""What the tasks retry beyond CDK's Lambda service errors and throttling: the errors that say "try again later"."""
THROTTLED = "Lambda.TooManyRequestsException"
THROTTLE_RETRY = {"interval": 2, "backoff": 2.0, "max_delay": 60, "attempts": 1440}
"""A task's function at its reserved concurrency (or the account's) is refused until a slot frees, and with turns
queued on the cap that lasts until the queue drains (queued turns x a turn's length / the cap), not one invocation:
jittered retries are no queue, so one execution may lose the race many times. Sized for the longest queue the API
lets build: an hour of ``POST .../runs`` at their method throttles (two of 1.6/s at ``account_concurrency=1000``,
about 11,500 turns) on ``resume``'s 25 with one-minute turns drains in about 7 hours. The delays are 2, 4 ... 32 s,
then 60 s each (a freed slot is soon taken), 1,440 attempts: about 24 hours nominal, 12 on average with full
jitter. Each attempt writes 3 history events: about 4,300 of the 25,000 an execution holds. Each is a state
transition: a day of them costs about $0.036 per waiting turn. Past it ``RecordFailure`` ends the turn."""
TASK_TIMEOUT_MARGIN_S = 30
"""A Lambda task waits this much longer than its function's timeout: Step Functions never retries an
attempt that is still running."""
RUNNER_LOST = ["Sandbox.Timedout", "Runtime.ExitError", "Runtime.OutOfMemory", "Lambda.Unknown"]
"""A ``Run`` whose function timed out, died or passed its memory size (``Runtime.OutOfMemory``: Lambda kills the
sandbox, the retry gets a fresh one): retried, the next attempt goes on from the last committed step."""
NOT_CLAIMED = "TurnNotClaimed"
LOG_LEVELS = ("ERROR", "ALL", "FATAL", "OFF")
"""``-c workflow_log_level``, the first the default. ``ERROR``: the state machine's log group gets the events of a
failure (a task failed or timed out, an execution failed, aborted or timed out), not a record of every one of a
turn's history events at $0.50 a GB: a Standard execution keeps its whole history itself, 90 days, in the console
and ``GetExecutionHistory``. ``ALL`` for a deployment whose log searches must see every step."""


def log_level(context: Callable[[str], object]) -> sfn.LogLevel:
    """``-c workflow_log_level`` (one of ``LOG_LEVELS``), else a ``ValueError`` naming it."""
    value = str(context("workflow_log_level") or LOG_LEVELS[0]).upper()
    if value not in LOG_LEVELS:
        raise ValueError(f"-c workflow_log_level= is one of {', '.join(LOG_LEVELS)}, not {value!r}")
    return sfn.LogLevel[value]


def _retry_transient(task: sfn.TaskStateBase, errors: list[str] = RETRYABLE_ERRORS) -> None:
    """Throttling retried until it passes (``THROTTLE_RETRY``); then up to 4 retries of ``errors``, 1 s apart and
    doubling (at most 30 s); both fully jittered so retries do not stampede."""
    task.add_retry(
        errors=[THROTTLED],
        interval=Duration.seconds(THROTTLE_RETRY["interval"]),
        backoff_rate=THROTTLE_RETRY["backoff"],
        max_attempts=int(THROTTLE_RETRY["attempts"]),
        max_delay=Duration.seconds(THROTTLE_RETRY["max_delay"]),
        jitter_strategy=sfn.JitterType.FULL,
    )
    task.add_retry(
        errors=errors,
        interval=Duration.seconds(1),
        backoff_rate=2,
        max_attempts=4,
        max_delay=Duration.seconds(30),
        jitter_strategy=sfn.JitterType.FULL,
    )


def _timeout(function: lambda_.IFunction) -> sfn.Timeout:
    """Longer than ``function`` can run (``TASK_TIMEOUT_MARGIN_S``)."""
    seconds = function.timeout.to_seconds() if isinstance(function, lambda_.Function) and function.timeout else 900
    return sfn.Timeout.duration(Duration.seconds(int(seconds) + TASK_TIMEOUT_MARGIN_S))


def _turn(action: str, **extra: object) -> sfn.TaskInput:
    return sfn.TaskInput.from_object(
        {
            "action": action,
            "tenant": sfn.JsonPath.string_at("$.tenant"),
            "session_id": sfn.JsonPath.string_at("$.session_id"),
            "invocation_id": sfn.JsonPath.string_at("$.invocation_id"),
            **extra,
        }
    )


def _wait_states(
    scope: Construct,
    *,
    park: lambda_.IFunction,
    resume: lambda_.IFunction,
    wait_timeout_seconds: float,
    sessions_arn: str,
) -> tuple[sfn.TaskStateBase, sfn.TaskStateBase]:
    """``Park`` and all that follows it (``Expire``, the failure records, ``Continue`` into the sessions machine),
    in ``scope``: the same states in both machines. Returns ``(Park, RecordFailure)`` (``Run``'s catch)."""
    stack = Stack.of(scope)
    status = {"status": sfn.JsonPath.string_at("$.Payload.status")}
    wait = tasks.LambdaInvoke(
        scope,
        "Park",
        lambda_function=park,
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        # the wait's record (which execution parked, until when): the sweeper tells a lost wait from a live one
        payload=_turn(
            "park",
            token=sfn.JsonPath.task_token,
            execution=sfn.JsonPath.string_at("$$.Execution.Id"),
            wait_seconds=wait_timeout_seconds,
            answer_error=ANSWERED,  # what an answer that leaves the turn to this machine fails the task with
        ),
        task_timeout=sfn.Timeout.duration(Duration.seconds(wait_timeout_seconds)),
        result_path="$.answer",
    )
    expire = tasks.LambdaInvoke(
        scope,
        "Expire",
        lambda_function=resume,
        payload=_turn("expire", execution=sfn.JsonPath.string_at("$$.Execution.Id")),
        result_selector=status,
        result_path="$.expired",
        task_timeout=_timeout(resume),
    )
    # A failure is recorded by a function other than the one that failed: a function at its reserved
    # concurrency cannot record its own throttling. Run's and Expire's (resume) by park; Park's by resume.
    record_failure = tasks.LambdaInvoke(
        scope,
        "RecordFailure",
        lambda_function=park,
        payload=_turn("fail", error=sfn.JsonPath.object_at("$.error")),
        result_path=sfn.JsonPath.DISCARD,
        task_timeout=_timeout(park),
    )
    record_park_failure = tasks.LambdaInvoke(
        scope,
        "RecordParkFailure",
        lambda_function=resume,
        payload=_turn("fail", error=sfn.JsonPath.object_at("$.error")),
        result_path=sfn.JsonPath.DISCARD,
        task_timeout=_timeout(resume),
    )
    for task in (wait, expire, record_failure, record_park_failure):
        _retry_transient(task)
    # Continue as new: the next wait, or the rest of the turn, in a fresh execution of the sessions machine.
    next_loop = sfn.Pass(
        scope,
        "Next loop",
        parameters={
            "tenant.$": "$.tenant",
            "session_id.$": "$.session_id",
            "invocation_id.$": "$.invocation_id",
            "name.$": "$.name",
            "loop.$": "States.MathAdd($.loop, 1)",
        },
    )
    continued = sfn.Succeed(scope, "Continued", comment="the turn goes on in the next execution")
    start_next = sfn.CustomState(
        scope,
        "Continue",
        state_json={
            "Type": "Task",
            "Resource": f"arn:{stack.partition}:states:::states:startExecution",
            "Parameters": {
                "StateMachineArn": sessions_arn,  # the sessions machine, from either: its Run goes on with the turn
                "Name.$": "States.Format('{}-{}', $.name, $.loop)",
                "Input": {
                    "tenant.$": "$.tenant",
                    "session_id.$": "$.session_id",
                    "invocation_id.$": "$.invocation_id",
                    "name.$": "$.name",
                    "loop.$": "$.loop",
                    "AWS_STEP_FUNCTIONS_STARTED_BY_EXECUTION_ID.$": "$$.Execution.Id",
                },
            },
            "Retry": [
                {
                    "ErrorEquals": ["StepFunctions.SdkClientException", "States.TaskFailed"],
                    "IntervalSeconds": 1,
                    "BackoffRate": 2,
                    "MaxAttempts": 4,
                    "MaxDelaySeconds": 30,
                    "JitterStrategy": "FULL",
                }
            ],
            "Catch": [  # a retry after the start went through: that execution goes on
                {"ErrorEquals": ["StepFunctions.ExecutionAlreadyExistsException"], "Next": "Continued"}
            ],
        },
    )
    failed = sfn.Fail(scope, "Failed", error="TurnFailed", cause="the error is recorded on the session's ledger")
    record_failure.next(failed)
    record_park_failure.next(failed)
    next_loop.next(start_next)
    start_next.next(continued)
    wait.add_catch(expire, errors=_TIMEOUTS, result_path="$.error")
    # Answers that leave the turn to the workflow (POST /tools without Prefer: wait, the sweeper's wake-up, park
    # finding them first) fail the task with ANSWERED: caught before States.ALL, matched by no retrier (a
    # retried wait would park again), the turn goes on in a fresh execution. An answer whose caller ran the
    # turn on (SendTaskSuccess) ends the execution at Park: no Choice, no Succeed state after it.
    wait.add_catch(next_loop, errors=[ANSWERED], result_path=sfn.JsonPath.DISCARD)
    wait.add_catch(record_park_failure, errors=["States.ALL"], result_path="$.error")
    expire.add_catch(record_failure, errors=["States.ALL"], result_path="$.error")
    expire.next(
        sfn.Choice(scope, "Answered as it expired?")
        .when(sfn.Condition.string_equals("$.expired.status", "resumable"), next_loop)
        .otherwise(sfn.Succeed(scope, "Expired", comment="the wait timed out; the session is marked expired"))
    )
    return wait, record_failure


class ResumeWorkflow(Construct):
    """Two Standard state machines: ``state_machine`` (sessions: every turn starts at ``Run``) and
    ``wait_machine`` (waits: starts at ``Park``, for a turn a waiting request ran to its park and a wait the
    sweeper gives a fresh execution). Both continue into the sessions machine."""

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
        state_machine_name: str,
        wait_machine_name: str,
        log_level: sfn.LogLevel = sfn.LogLevel.ERROR,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        sessions_arn = stack.format_arn(
            service="states",
            resource="stateMachine",
            resource_name=state_machine_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

        def wait_states(where: Construct) -> tuple[sfn.TaskStateBase, sfn.TaskStateBase]:
            return _wait_states(
                where, park=park, resume=resume, wait_timeout_seconds=wait_timeout_seconds, sessions_arn=sessions_arn
            )

        run = tasks.LambdaInvoke(
            self,
            "Run",
            lambda_function=resume,
            # the retry count: a retried run frees the session of a commit its killed predecessor left pending
            payload=_turn("run", retry=sfn.JsonPath.number_at("$$.State.RetryCount")),
            result_selector={"status": sfn.JsonPath.string_at("$.Payload.status")},
            result_path="$.turn",
            task_timeout=_timeout(resume),
        )
        wait, record_failure = wait_states(self)
        run.add_retry(  # the claim lands just after the execution starts: wait for it, about a minute in all
            errors=[NOT_CLAIMED], interval=Duration.seconds(2), backoff_rate=1.5, max_attempts=8
        )
        _retry_transient(run, [*RETRYABLE_ERRORS, *RUNNER_LOST])
        run.add_catch(sfn.Succeed(self, "NotClaimed", comment="the claim never landed"), errors=[NOT_CLAIMED])
        run.add_catch(record_failure, errors=["States.ALL"], result_path="$.error")
        run.next(
            sfn.Choice(self, "After the run")
            .when(sfn.Condition.string_equals("$.turn.status", "yielded_tool"), wait)
            .when(sfn.Condition.string_equals("$.turn.status", "handed_on"), run)
            .otherwise(sfn.Succeed(self, "Done"))
        )
        # The waits machine: the same Park and what follows it, with Park its first state (1 transition for a turn
        # a waiting request ran to its park and answered inline); no Choice at the start of any execution.
        waiting = Construct(self, "Waits")
        first_wait, _ = wait_states(waiting)
        log_group = logs.LogGroup(self, "Logs", removal_policy=RemovalPolicy.DESTROY)
        log_group.node.default_child.add_property_override("RetentionInDays", log_retention_days)  # type: ignore[union-attr]
        machines = []
        for where, start, name in ((self, run, state_machine_name), (waiting, first_wait, wait_machine_name)):
            machines.append(
                sfn.StateMachine(
                    where,
                    "StateMachine",
                    definition_body=sfn.DefinitionBody.from_chainable(start),
                    state_machine_type=sfn.StateMachineType.STANDARD,
                    logs=sfn.LogOptions(destination=log_group, level=log_level, include_execution_data=False),
                    tracing_enabled=tracing,
                    # A fixed name, so the stack can write the ARN without referencing this resource (the
                    # functions' environment, each machine's right to start the sessions machine).
                    state_machine_name=name,
                )
            )
        self.state_machine, self.wait_machine = machines
        for machine in machines:
            self._acknowledge(machine, park, resume, log_level, tracing)

    def _acknowledge(
        self,
        machine: sfn.StateMachine,
        park: lambda_.IFunction,
        resume: lambda_.IFunction,
        log_level: sfn.LogLevel,
        tracing: bool,
    ) -> None:
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
        if log_level != sfn.LogLevel.ALL:
            acks.append(
                Acknowledgment(
                    id="AwsSolutions::AwsSolutions-SF1",
                    reason="A Standard execution keeps its whole history in Step Functions for 90 days; the log group "
                    "gets its failures (ERROR), not a record per state at a cost per turn; -c workflow_log_level=ALL "
                    "logs every event.",
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
        Validations.of(machine).acknowledge(*acks)

    @staticmethod
    def _logical_id(fn: lambda_.IFunction) -> str:
        return Stack.of(fn).resolve(fn.node.default_child.logical_id)  # type: ignore[union-attr, no-any-return]
