"""The model the served agents use, chosen at deploy time, and what the functions that call it may do.

``-c model=bedrock:<model id, inference-profile id or ARN>`` or ``-c model=openai:<model>`` (with
``-c openai_base_url=<url>`` for a compatible server). An OpenAI key is kept in Secrets Manager or SSM Parameter
Store: ``-c openai_secret=<secret name or ARN>`` or ``ssm:/parameter/name`` references one that exists, and is
required: a secret the stack created would hold no key (or a random one), and every model call would fail
with 401 until someone noticed. Only the functions of
``infra.wiring.MODEL_FUNCTIONS`` get ``bedrock:InvokeModel`` on that model's ARNs or read on that one secret.

An inference profile routes a call to the model in one of several regions, and each hop is authorized: the grant
names the profile and the foundation model in every region (``arn:...:bedrock:*::foundation-model/<model>``: that
model only, in any region, since a profile's regions are AWS's to extend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_cdk import Acknowledgment, ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from .wiring import MODEL, MODEL_ACTIONS, OPENAI_BASE_URL, OPENAI_SECRET

GEOGRAPHIES = frozenset({"us", "us-gov", "eu", "apac", "jp", "au", "ca", "global"})
"""The prefixes of system-defined (cross-region) inference profile ids: ``eu.anthropic.claude-...``."""


@dataclass(frozen=True)
class ModelChoice:
    provider: str
    name: str
    base_url: str | None = None
    secret: str | None = None


def model_choice(context: Callable[[str], Any]) -> ModelChoice | None:
    """The ``-c model=...`` choice (``None``: none; the app's own models serve). Raises ``SystemExit`` with the
    form expected, at synth, for a value no function could use."""
    value = str(context("model") or "").strip()
    base_url, secret = context("openai_base_url"), context("openai_secret")
    if not value:
        if base_url or secret:
            raise SystemExit("-c openai_base_url / -c openai_secret need -c model=openai:<model>")
        return None
    provider, _, name = value.partition(":")
    if provider == "openai" and name:
        if not secret:
            raise SystemExit(
                "-c model=openai:... needs -c openai_secret=<Secrets Manager name or ARN, or ssm:/parameter> holding "
                "the key: create it first (aws secretsmanager create-secret --name NAME --secret-string KEY), so no "
                "model call is made with a key that is not there"
            )
        return ModelChoice("openai", name, str(base_url) if base_url else None, str(secret) if secret else None)
    if provider == "bedrock" and name:
        if base_url or secret:
            raise SystemExit("-c openai_base_url / -c openai_secret are for -c model=openai:<model>, not Bedrock")
        bedrock_arns(name, "aws", "eu-west-1", "123456789012")  # refuses an id it cannot grant, at synth
        return ModelChoice("bedrock", name)
    raise SystemExit(f"-c model is bedrock:<model or inference-profile id> or openai:<model>, not {value!r}")


def bedrock_arns(model_id: str, partition: str, region: str, account: str) -> list[str]:
    """The ARNs ``bedrock:InvokeModel`` must name to call ``model_id`` (a foundation model, a system-defined
    inference profile, or the ARN of either)."""
    if model_id.startswith("arn:"):
        parts = model_id.split(":", 5)
        resource = parts[5] if len(parts) == 6 else ""
        kind, _, ident = resource.partition("/")
        if kind == "foundation-model" and ident:
            return [model_id]
        if kind == "inference-profile" and ident.partition(".")[0] in GEOGRAPHIES:
            return [model_id, f"arn:{parts[1]}:bedrock:*::foundation-model/{ident.partition('.')[2]}"]
        raise SystemExit(
            f"-c model=bedrock:{model_id}: give a foundation model or a system-defined inference profile (id or "
            "ARN); an application inference profile's models are not known at synth"
        )
    geography, _, model = model_id.partition(".")
    if geography in GEOGRAPHIES and "." in model:
        return [
            f"arn:{partition}:bedrock:{region}:{account}:inference-profile/{model_id}",
            f"arn:{partition}:bedrock:*::foundation-model/{model}",
        ]
    if "." not in model_id:
        raise SystemExit(f"-c model=bedrock:{model_id}: a Bedrock model id is provider.model (anthropic.claude-...)")
    return [f"arn:{partition}:bedrock:{region}::foundation-model/{model_id}"]


class ModelAccess(Construct):
    """The chosen model's environment (``environment``) and the statements a model function gets (``statements``);
    the OpenAI key's secret created when none is referenced."""

    def __init__(self, scope: Construct, id: str, *, choice: ModelChoice, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.environment: dict[str, str] = {MODEL: f"{choice.provider}:{choice.name}"}
        self.statements: list[iam.PolicyStatement] = []
        self.acknowledgments: list[Acknowledgment] = []
        """For the scope of each model function's role: the findings its model statements raise, and why."""
        if choice.provider == "bedrock":
            resources = bedrock_arns(choice.name, stack.partition, stack.region, stack.account)
            self.statements.append(iam.PolicyStatement(actions=list(MODEL_ACTIONS["bedrock"]), resources=resources))
            # cdk-nag names a resource with its tokens written as <AWS::Partition>.
            as_nag = bedrock_arns(choice.name, "<AWS::Partition>", stack.region, stack.account)
            self.acknowledgments += [
                Acknowledgment(
                    id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{arn}]",
                    reason="An inference profile routes each call to its model in one of its regions, each hop "
                    "authorized: this names that one model, in any region the profile may use.",
                )
                for arn in as_nag
                if "*" in arn
            ]
            return
        if choice.base_url:
            self.environment[OPENAI_BASE_URL] = choice.base_url
        assert choice.secret is not None  # model_choice refuses openai without it
        reference, resource = self._secret(choice.secret, stack)
        self.environment[OPENAI_SECRET] = reference
        service = "ssm" if reference.startswith("ssm:") or ":ssm:" in reference else "secretsmanager"
        self.statements.append(iam.PolicyStatement(actions=list(MODEL_ACTIONS[service]), resources=[resource]))

    def _secret(self, ref: str, stack: Stack) -> tuple[str, str]:
        """(what the environment names, the ARN the grant names) for the key's secret or parameter."""
        if ref.startswith("ssm:"):
            name = ref.removeprefix("ssm:")
            arn = stack.format_arn(service="ssm", resource="parameter", resource_name=name.lstrip("/"))
            return ref, arn
        if ref.startswith("arn:"):
            return ref, ref
        # A name: Secrets Manager appends six random characters to a secret's ARN.
        arn = stack.format_arn(
            service="secretsmanager",
            resource="secret",
            resource_name=f"{ref}-??????",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        return ref, arn
