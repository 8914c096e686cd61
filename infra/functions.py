"""The Lambda functions: one per handler in ``functions/``, each with its own role and log group.

Every role starts empty; the stack grants each function exactly what its handler touches (``infra.wiring``:
the table, and for some the state machine). No managed policies: logging is granted on the function's own
log group. Each function gets only its own environment variables (``infra.wiring.ENVIRONMENT``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from .layer import ARCHITECTURE, RUNTIME
from .limits import COLD_START_S, INTEGRATION_TIMEOUT_S

FUNCTIONS_DIR = Path(__file__).resolve().parents[1] / "functions"


@dataclass(frozen=True)
class Handler:
    name: str
    description: str
    timeout_seconds: int


API = INTEGRATION_TIMEOUT_S - COLD_START_S - 1
"""API functions: a cold start and the whole timeout end before API Gateway's 29 s, so no request is answered
504 after its work landed (a held wait ends ``WAIT_MARGIN`` before the function's deadline: 21 s)."""
HANDLERS = (
    Handler("sessions", "Create, list, show and delete sessions; page a session's ledger; erase a person", API),
    Handler("run", "Claim a turn; run it if the caller waits, else (or if it parks) start the workflow", API),
    Handler("tools", "Store answers to yielded tools and wake the workflow waiting on them", API),
    Handler("commit", "Commit events from a runner that runs agents elsewhere", API),
    # Longer than the store's 10 s wait on another writer's live commit marker, with room to retry it.
    Handler("park", "Store the workflow's task token with a session that waits for answers", 60),
    # Runs whole turns in the workflow: Lambda's maximum; a longer turn continues in the next invocation.
    Handler("resume", "Run a session's turn in the workflow; record an expired wait or a failure", 900),
    Handler("sweeper", "Repair pending commits; end or hand on dead runners' turns; restart missing executions", 120),
)


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        layers: list[lambda_.ILayerVersion],
        environment: Mapping[str, Mapping[str, str]],
        log_retention_days: float,
        tracing: bool,
    ) -> None:
        super().__init__(scope, id)
        self.by_name: dict[str, lambda_.Function] = {}
        for handler in HANDLERS:
            scope_ = Construct(self, handler.name.capitalize())
            role = iam.Role(
                scope_,
                "Role",
                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                description=f"dormant {handler.name} function",
            )
            if tracing:
                Validations.of(role).acknowledge(
                    Acknowledgment(
                        id="AwsSolutions::AwsSolutions-IAM5[Resource::*]",
                        reason="-c tracing=true: X-Ray's PutTraceSegments and PutTelemetryRecords take no resource "
                        "narrower than * (CDK grants them with active tracing).",
                    )
                )
            log_group = logs.LogGroup(scope_, "Logs", removal_policy=RemovalPolicy.DESTROY)
            # A parameter decides the retention: set it on the CloudFormation resource, where a token is allowed.
            log_group.node.default_child.add_property_override("RetentionInDays", log_retention_days)  # type: ignore[union-attr]
            log_group.grant_write(role)
            self.by_name[handler.name] = lambda_.Function(
                scope_,
                "Function",
                description=handler.description,
                code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / handler.name)),
                handler="app.handler",
                runtime=RUNTIME,
                architecture=ARCHITECTURE,
                layers=layers,
                memory_size=512,
                timeout=Duration.seconds(handler.timeout_seconds),
                role=role,
                log_group=log_group,
                environment=dict(environment[handler.name]),
                tracing=lambda_.Tracing.ACTIVE if tracing else lambda_.Tracing.DISABLED,
            )

        Validations.of(self).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-L1",
                reason="The layer is built for the Python 3.12 runtime (wheels fetched for cp312); the runtime is "
                "chosen with it, in infra/layer.py, not left to float to the newest.",
            )
        )

    def __getitem__(self, name: str) -> lambda_.Function:
        return self.by_name[name]
