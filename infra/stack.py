"""``DormantStack``: the table, the layers, the functions, the API, the resume workflow and the sweeper.

Deploy-time choices are stack parameters (wait timeout, log retention); build-time ones are CDK context
(``-c app=module:attr``, ``-c app_packages=dir,dir``, ``-c app_requirements=file``, ``-c removal=destroy``,
``-c tracing=true``, ``-c tenant_claim=custom:tenant`` (the ID-token claim naming the caller's tenant; a token
without it is its own tenant), ``-c auth_domain=prefix`` (the Cognito domain machine clients get tokens from;
default ``{stack}-{account}``), ``-c cors_origins=https://a.example,https://b.example`` (the origins whose pages
may call the API; none by default), the model: ``-c model=...``, ``-c openai_base_url=...``,
``-c openai_secret=...``, see ``infra.model``, ``-c alarm_topic=<SNS topic ARN>`` (where the alarms go),
``-c ses_from=<address>`` (Cognito's mail through SES), ``-c account_concurrency=N`` (the account's Lambda
concurrency: reservations only with it), and the guardrails of ``infra.guardrails``), and so are the
table's shard counts (``-c listing_shards=N``, ``-c pending_shards=N``):
fixed at the first deploy, as the table records them and refuses a store opened with others
(a parameter would invite changing them).
"""

from __future__ import annotations

import re
from typing import Any, cast

from aws_cdk import Acknowledgment, ArnFormat, CfnOutput, CfnParameter, RemovalPolicy, Stack, Token, Validations
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from dormant import metrics
from dormant.serving.callers import DEFAULT_ADMIN_GROUP
from dormant.serving.runtime import DEFAULT_TENANT_CLAIM
from dormant.stores.dynamodb import TABLE

from .alarms import Alarms
from .api import Api
from .bundle import ROOT
from .clients import mapping_environment, parse_machine_clients
from .dashboard import Dashboard
from .functions import API, Functions, memory_sizes
from .guardrails import Guardrails, MachineClientPlans, RateLimitedWebAcl
from .layer import Layers
from .model import ModelAccess, model_choice
from .schedule import SweeperSchedule
from .table import SessionTable, recovery_days
from .wiring import (
    ADMIN_GROUP,
    APP,
    CORS_ORIGINS,
    ENVIRONMENT,
    EXECUTIONS,
    IDEMPOTENCY_TABLE,
    MACHINE,
    MACHINE_CLIENTS,
    MODEL_ENVIRONMENT,
    MODEL_FUNCTIONS,
    STATE_MACHINE,
    STATES_ACCESS,
    STORE,
    TABLE_ACCESS,
    TENANT_CLAIM,
    TURN_QUOTA,
    WAIT_EXECUTIONS,
    WAIT_MACHINE,
    WAITS,
    state_machine_name,
    wait_machine_name,
)
from .workflow import MAX_WAIT_SECONDS, ResumeWorkflow, log_level

DEFAULT_APP = "bookings:build"
DEFAULT_APP_PACKAGES = "samples/bookings"
# The values CloudWatch Logs accepts.
_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
LOG_RETENTION_DAYS = [str(days) for days in _DAYS]


SHARD_DEFAULTS = {"listing_shards": 4, "pending_shards": 8}
"""The table's shard counts when the context gives none (the listing's per app, the pending index's per table):
the store's own defaults. A tenant's listing and status entries spread over ``listing_shards`` index partitions
each: in the fidelity harness's busy day one tenant took about 115 turns/s on one shard before its busiest partition
reached DynamoDB's 1,000 write units a second, about 400 on 4, far above the stage's default 50 requests/s
(docs/deploying.md, "Capacity of one stack")."""


def _shard_count(context: Any, name: str, default: int) -> int:
    value = context(name)
    if value is None:
        return default
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if not 1 <= count <= 1000:
        raise ValueError(f"context {name} is a whole number from 1 to 1000, not {value!r}")
    return count


class DormantStack(Stack):
    def __init__(self, scope: Construct, id: str, **kwargs: object) -> None:
        super().__init__(scope, id, **kwargs)  # type: ignore[arg-type]
        context = self.node.try_get_context
        guardrails = Guardrails.from_context(context)
        tracing = str(context("tracing") or "false").lower() == "true"
        removal = RemovalPolicy.DESTROY if context("removal") == "destroy" else RemovalPolicy.RETAIN
        app_packages = [ROOT / p for p in str(context("app_packages") or DEFAULT_APP_PACKAGES).split(",") if p]
        cors_origins = [o.strip().rstrip("/") for o in str(context("cors_origins") or "").split(",") if o.strip()]
        requirements = context("app_requirements")
        choice = model_choice(context)

        shards = {name: _shard_count(context, name, default) for name, default in SHARD_DEFAULTS.items()}
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

        machine_clients = parse_machine_clients(context("machine_clients"))
        admin_group = _admin_group(context)
        pitr_days = recovery_days(context)
        workflow_log_level = log_level(context)
        table = SessionTable(
            self,
            "Sessions",
            removal_policy=removal,
            deletion_protection=removal != RemovalPolicy.DESTROY,
            recovery_days=pitr_days,
        ).table
        layers = Layers(
            self,
            "Layers",
            app_packages=app_packages,
            requirements=ROOT / str(requirements) if requirements else None,
            extras=("openai",) if choice is not None and choice.provider == "openai" else (),
        )
        model = ModelAccess(self, "Model", choice=choice, removal_policy=removal) if choice is not None else None

        # The state machine's name is fixed, so its ARN is known before it exists: the functions it invokes hold
        # that ARN (and grants on it) without depending on it, which would be a circular dependency.
        machine_name, waits_name = state_machine_name(self.stack_name), wait_machine_name(self.stack_name)
        arns = {}
        for machine_key, executions_key, name in (
            (MACHINE, EXECUTIONS, machine_name),
            (WAITS, WAIT_EXECUTIONS, waits_name),
        ):
            arns[machine_key] = self.format_arn(
                service="states", resource="stateMachine", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
            )
            arns[executions_key] = self.format_arn(
                service="states",
                resource="execution",
                resource_name=f"{name}:*",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
        values = {
            STORE: (
                f"dynamodb://{table.table_name}?shards={shards['listing_shards']}"
                f"&pending_shards={shards['pending_shards']}&pitr_days={pitr_days}"
            ),
            APP: str(context("app") or DEFAULT_APP),
            IDEMPOTENCY_TABLE: table.table_name,  # idempotency records share the session table
            STATE_MACHINE: arns[MACHINE],
            WAIT_MACHINE: arns[WAITS],
            TURN_QUOTA: guardrails.turn_quota,
            TENANT_CLAIM: str(context("tenant_claim") or DEFAULT_TENANT_CLAIM),
            ADMIN_GROUP: admin_group,
            CORS_ORIGINS: ",".join(cors_origins),
            "POWERTOOLS_SERVICE_NAME": metrics.SERVICE,
            "POWERTOOLS_METRICS_NAMESPACE": metrics.NAMESPACE,
            "POWERTOOLS_TRACE_DISABLED": "false" if tracing else "true",
            # No pydantic plugins are deployed: skip pydantic's scan of every installed package's
            # entry points, which the first model built would otherwise pay at cold start.
            "PYDANTIC_DISABLE_PLUGINS": "__all__",
            **(model.environment if model is not None else {}),
        }
        functions = Functions(
            self,
            "Functions",
            layers=[layers.library, layers.app],
            environment={
                # MACHINE_CLIENTS names the API's app clients: added once the API made them
                name: {
                    key: values[key] for key in sorted((keys - {MACHINE_CLIENTS}) | (MODEL_ENVIRONMENT & values.keys()))
                }
                for name, keys in ENVIRONMENT.items()
            },
            log_retention_days=retention.value_as_number,
            tracing=tracing,
            # the turn functions load the model's SDK: the OpenAI SDK is 28 MB more (infra.functions.OPENAI_PEAK_MB)
            memory=memory_sizes(
                context("function_memory"), model_sdk=choice is not None and choice.provider == "openai"
            ),
        )
        for name, function in functions.by_name.items():
            _grant_table(function, table, name)
            if model is not None and name in MODEL_FUNCTIONS:
                for statement in model.statements:
                    function.add_to_role_policy(statement)
                if model.acknowledgments:
                    Validations.of(functions.node.find_child(name.capitalize())).acknowledge(*model.acknowledgments)
            states = STATES_ACCESS.get(name)
            if states:
                # A policy of its own, not the function's default policy, which the function depends on: the
                # state machine depends on the functions it invokes.
                policy = iam.Policy(
                    cast(Construct, functions.node.find_child(name.capitalize())),
                    "StepFunctions",
                    roles=[function.role],  # type: ignore[list-item]
                    statements=[
                        iam.PolicyStatement(
                            actions=sorted(a for a, on in states.items() if target in on), resources=[arns[target]]
                        )
                        for target in (MACHINE, EXECUTIONS, WAITS, WAIT_EXECUTIONS)
                        if any(target in on for on in states.values())
                    ],
                )
                region, account = (v if not Token.is_unresolved(v) else f"<AWS::{k}>" for k, v in _nag_env(self))
                for target, named in ((EXECUTIONS, machine_name), (WAIT_EXECUTIONS, waits_name)):
                    if not any(target in on for on in states.values()):
                        continue
                    arn = f"arn:<AWS::Partition>:states:{region}:{account}:execution:{named}:*"
                    Validations.of(policy).acknowledge(
                        Acknowledgment(
                            id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{arn}]",
                            reason="An execution's name is made per turn: DescribeExecution is granted on this state "
                            "machine's executions (ARN:*), none of any other machine.",
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
            state_machine_name=machine_name,
            wait_machine_name=waits_name,
            log_level=workflow_log_level,
        )
        machine = workflow.state_machine
        # Continue-as-new: either machine's execution starts its successor in the sessions machine.
        for each in (machine, workflow.wait_machine):
            each.add_to_role_policy(iam.PolicyStatement(actions=["states:StartExecution"], resources=[arns[MACHINE]]))

        guardrails.reserve(functions.by_name)
        api = Api(
            self,
            "Api",
            functions=functions.by_name,
            log_retention_days=retention.value_as_number,
            tracing=tracing,
            auth_domain_prefix=str(context("auth_domain") or f"{self.stack_name.lower()}-{self.account}"),
            cors_origins=cors_origins,
            throttling=guardrails.stage_throttling(),
            method_throttling=guardrails.held_throttling(hold_s=API),
            client_api_keys=bool(guardrails.machine_clients),
            machine_clients=machine_clients,
            admin_group=admin_group,
            email=_email(context),
        )
        tenants = mapping_environment(api.machine_tenants)
        for name, keys in ENVIRONMENT.items():
            if MACHINE_CLIENTS in keys:
                functions[name].add_environment(MACHINE_CLIENTS, tenants)
        stage = api.rest_api.deployment_stage
        MachineClientPlans(self, "MachineClients", guardrails=guardrails, stage=stage)
        if guardrails.waf_rate_limit:
            RateLimitedWebAcl(self, "Waf", limit=guardrails.waf_rate_limit, stage=stage)
        schedule = SweeperSchedule(self, "Sweeper", sweeper=functions["sweeper"])
        Alarms(
            self,
            "Alarms",
            functions=functions.by_name,
            state_machines={"": machine, "wait-": workflow.wait_machine},
            table=table,
            indexes=[index.name for index in TABLE.indexes if not index.local],
            stage=stage,
            sweeper_dlq=schedule.dead_letters,
            topic_arn=context("alarm_topic"),
        )

        Dashboard(self, "Dashboard", functions=functions.by_name, table=table)

        CfnOutput(self, "ApiUrl", value=api.rest_api.url)
        CfnOutput(self, "UserPoolId", value=api.user_pool.user_pool_id)
        CfnOutput(self, "UserPoolClientId", value=api.client.user_pool_client_id)
        for name, client in api.machine_clients.items():  # "MachineClientId" without -c machine_clients
            suffix = "" if not machine_clients else re.sub(r"[^A-Za-z0-9]", "", name)
            CfnOutput(self, f"MachineClientId{suffix}", value=client.user_pool_client_id)
        CfnOutput(self, "TokenUrl", value=f"{api.domain.base_url()}/oauth2/token")
        CfnOutput(self, "TableName", value=table.table_name)
        CfnOutput(self, "StateMachineArn", value=machine.state_machine_arn)
        CfnOutput(self, "WaitMachineArn", value=workflow.wait_machine.state_machine_arn)


def _admin_group(context: Any) -> str:
    """``-c admin_group=``: the Cognito group of the administrative role (default ``admins``)."""
    value = str(context("admin_group") or DEFAULT_ADMIN_GROUP)
    if not re.fullmatch(r"[^\s,\[\]]{1,128}", value):
        raise ValueError(f"-c admin_group= is a Cognito group name without spaces or commas, not {value!r}")
    return value


def _email(context: Any) -> cognito.UserPoolEmail | None:
    """``-c ses_from=address`` (``-c ses_name=``, ``-c ses_region=``, ``-c ses_domain=``): the pool mails through
    SES from that verified identity. Without it Cognito's own email serves, a quota of a few a day for testing."""
    sender = context("ses_from")
    others = [name for name in ("ses_name", "ses_region", "ses_domain") if context(name)]
    if not sender:
        if others:
            raise SystemExit(f"-c {others[0]} needs -c ses_from=<address of a verified SES identity>")
        return None
    return cognito.UserPoolEmail.with_ses(
        from_email=str(sender),
        from_name=str(context("ses_name")) if context("ses_name") else None,
        ses_region=str(context("ses_region")) if context("ses_region") else None,
        ses_verified_domain=str(context("ses_domain")) if context("ses_domain") else None,
    )


def _nag_env(stack: Stack) -> list[tuple[str, str]]:
    """The stack's region and account as cdk-nag writes them in a finding's id (a token as ``<AWS::...>``)."""
    return [("Region", stack.region), ("AccountId", stack.account)]


def _grant_table(function: lambda_.Function, table: dynamodb.Table, name: str) -> None:
    """``TABLE_ACCESS[name]``: its actions on the table, and ``Query`` on each index it reads, by the index's ARN."""
    access = TABLE_ACCESS[name]
    function.add_to_role_policy(iam.PolicyStatement(actions=list(access.actions), resources=[table.table_arn]))
    if access.indexes:
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["dynamodb:Query"], resources=[f"{table.table_arn}/index/{index}" for index in access.indexes]
            )
        )
