"""``DormantStack``: the table, the layers, the functions, the API, the resume workflow and the sweeper.

Deploy-time choices are stack parameters (listing shards, wait timeout, log retention); build-time ones
are CDK context (``-c app=module:attr``, ``-c app_packages=dir,dir``, ``-c removal=destroy``, ``-c tracing=true``).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnOutput, CfnParameter, RemovalPolicy, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import Construct

from .api import Api
from .bundle import ROOT
from .functions import Functions
from .layer import Layers
from .schedule import SweeperSchedule
from .table import SessionTable
from .workflow import MAX_WAIT_SECONDS, ResumeWorkflow

DEFAULT_APP = "bookings:build"
# What the DynamoDB store and Powertools idempotency call: item reads and writes, no Scan, no streams.
# (A transaction is authorized by the actions of its parts; IAM has no TransactWriteItems action.)
TABLE_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
)
DEFAULT_APP_PACKAGES = "samples/bookings"
# The values CloudWatch Logs accepts.
_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
LOG_RETENTION_DAYS = [str(days) for days in _DAYS]


class DormantStack(Stack):
    def __init__(self, scope: Construct, id: str, **kwargs: object) -> None:
        super().__init__(scope, id, **kwargs)  # type: ignore[arg-type]
        context = self.node.try_get_context
        tracing = str(context("tracing") or "false").lower() == "true"
        removal = RemovalPolicy.DESTROY if context("removal") == "destroy" else RemovalPolicy.RETAIN
        app_packages = [ROOT / p for p in str(context("app_packages") or DEFAULT_APP_PACKAGES).split(",") if p]

        shards = CfnParameter(
            self,
            "ListingShards",
            type="Number",
            default=1,
            min_value=1,
            max_value=64,
            description="Write shards of the session listing index (more shards, more listing writes per second)",
        )
        wait_timeout = CfnParameter(
            self,
            "WaitTimeoutSeconds",
            type="Number",
            default=7 * 24 * 3600,
            min_value=60,
            max_value=MAX_WAIT_SECONDS,
            description="How long a session waits for answers to yielded tools before it is marked expired",
        )
        retention = CfnParameter(
            self,
            "LogRetentionDays",
            type="Number",
            default="30",
            allowed_values=LOG_RETENTION_DAYS,
            description="Retention of every log group of the stack",
        )

        table = SessionTable(self, "Sessions", removal_policy=removal).table
        layers = Layers(self, "Layers", app_packages=app_packages)
        functions = Functions(
            self,
            "Functions",
            layers=[layers.library, layers.app],
            environment={
                "DORMANT_STORE": f"dynamodb://{table.table_name}?shards={shards.value_as_string}",
                "DORMANT_APP": str(context("app") or DEFAULT_APP),
                "DORMANT_IDEMPOTENCY_TABLE": table.table_name,
                "POWERTOOLS_SERVICE_NAME": "dormant",
                "POWERTOOLS_METRICS_NAMESPACE": "dormant",
                "POWERTOOLS_TRACE_DISABLED": "false" if tracing else "true",
                # No pydantic plugins are deployed: skip pydantic's scan of every installed package's
                # entry points, which the first model built would otherwise pay at cold start.
                "PYDANTIC_DISABLE_PLUGINS": "__all__",
            },
            log_retention_days=retention.value_as_number,
            tracing=tracing,
        )
        for function in functions.by_name.values():
            table.grant(function, *TABLE_ACTIONS)
        table_id = self.resolve(table.node.default_child.logical_id)  # type: ignore[union-attr]
        Validations.of(functions).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions::AwsSolutions-IAM5[Resource::<{table_id}.Arn>/index/*]",
                reason="The table's own indexes (the session listing and the pending-commit index the sweeper "
                "reads); nothing outside this table.",
            )
        )

        workflow = ResumeWorkflow(
            self,
            "Workflow",
            park=functions["park"],
            resume=functions["resume"],
            wait_timeout_seconds=wait_timeout.value_as_number,
            log_retention_days=retention.value_as_number,
            tracing=tracing,
        )
        machine = workflow.state_machine
        run = functions["run"]
        machine.grant_start_execution(run)
        run.add_environment("DORMANT_STATE_MACHINE", machine.state_machine_arn)
        machine.grant_task_response(functions["tools"])
        # park sends the answer itself when it finds the session already answered. Granted through a
        # policy of its own: in the function's default policy, the grant would make the function depend on
        # the state machine, which depends on the function (a circular dependency).
        iam.Policy(
            self,
            "ParkTaskResponse",
            roles=[functions["park"].role],  # type: ignore[list-item]
            statements=[
                iam.PolicyStatement(
                    actions=["states:SendTaskSuccess", "states:SendTaskFailure"],
                    resources=[machine.state_machine_arn],
                )
            ],
        )

        api = Api(
            self, "Api", functions=functions.by_name, log_retention_days=retention.value_as_number, tracing=tracing
        )
        SweeperSchedule(self, "Sweeper", sweeper=functions["sweeper"])

        CfnOutput(self, "ApiUrl", value=api.rest_api.url)
        CfnOutput(self, "UserPoolId", value=api.user_pool.user_pool_id)
        CfnOutput(self, "UserPoolClientId", value=api.client.user_pool_client_id)
        CfnOutput(self, "TableName", value=table.table_name)
        CfnOutput(self, "StateMachineArn", value=machine.state_machine_arn)
