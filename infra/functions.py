"""The Lambda functions: one per handler in ``functions/``, each with its own role and log group.

Every role starts empty; the stack grants each function exactly what its handler touches (``infra.wiring``:
the table, and for some the state machine). No managed policies: logging is granted on the function's own
log group. Each function gets only its own environment variables (``infra.wiring.ENVIRONMENT``), and the
memory its work was measured to need (``Handler.memory_mb``; ``-c function_memory=`` overrides it).
"""

from __future__ import annotations

import math
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


MEMORY_MIN_MB, MEMORY_MAX_MB = 128, 10_240
"""Lambda's range for a function's memory."""
HEADROOM = 1.5
MEMORY_STEP_MB = 64
PEAK_MB = {"sessions": 89, "run": 80, "tools": 68, "commit": 65, "park": 60, "resume": 85, "sweeper": 60}
"""Each function's peak memory (MB, Lambda's Max Memory Used: runtime, init and invocations) over the fidelity arcs
(``tests/deployed/test_fidelity*.py``) of a deployment whose turns load no model SDK of dormant's beyond botocore
(the app's own models, or ``-c model=bedrock:...``), as the harness measures and enforces it
(``DORMANT_FIDELITY_PEAKS``; docs/deploying.md): 2026-12-06, every AWS client from one botocore session
(``dormant.aws``), the highest of three full runs. Init alone is 43-48 MB (Python and the handler's imports;
botocore's about 23 of it); a turn function's first AWS client adds 12 MB (botocore's endpoints 7, DynamoDB's model
4), each further one about 1; with Bedrock or the scripted model 66-68; a 4.8 MB conversation run turn by turn takes
``run`` to 80 and ``resume`` to 85 (it grows with the history the turn loads). ``sessions`` 89: that conversation
read back as one page. Before the shared session: ``run`` 93, ``sessions`` 98-103."""
OPENAI_PEAK_MB = {"run": 89, "tools": 90, "resume": 86}
"""The turn functions' peaks with ``-c model=openai:...``: the OpenAI SDK adds 28 MB (its import 20, its client 8)."""


def size_for(peak_mb: int) -> int:
    """A function's memory: its measured peak x ``HEADROOM``, rounded up to ``MEMORY_STEP_MB``, at least Lambda's
    minimum. Headroom because an app's agent, a longer ledger or a bigger page holds more than the arcs did, and
    the harness's process is not Lambda's runtime to the megabyte."""
    stepped = math.ceil(peak_mb * HEADROOM / MEMORY_STEP_MB) * MEMORY_STEP_MB
    return min(max(stepped, MEMORY_MIN_MB), MEMORY_MAX_MB)


@dataclass(frozen=True)
class Handler:
    name: str
    description: str
    timeout_seconds: int
    memory_mb: int
    """Its ``MemorySize`` (``size_for`` its measured peak): Lambda bills memory x time, and these functions mostly
    wait (on the model, DynamoDB, a long-poll), where memory buys nothing; CPU is proportional to it."""


API = INTEGRATION_TIMEOUT_S - COLD_START_S - 1
"""API functions: a cold start and the whole timeout end before API Gateway's 29 s, so no request is answered
504 after its work landed (a held wait ends ``WAIT_MARGIN`` before the function's deadline: 21 s)."""
TURNS = ("run", "tools", "resume")
"""``resume`` runs turns, ``run`` the turns whose caller waits (issue 36, ``Prefer: wait``) and ``tools`` the rest
of an answered turn whose caller waits: all get what a turn needs (``turns_mb``), so neither ``run`` nor ``tools``
is ever sized lower than ``resume`` (``memory_sizes`` refuses it)."""


def turns_mb(model_sdk: bool = False) -> int:
    """The turn functions' one size: the highest of their peaks, with the OpenAI SDK's (``model_sdk``,
    ``-c model=openai``) or without (``OPENAI_PEAK_MB``, ``PEAK_MB``)."""
    peaks = OPENAI_PEAK_MB if model_sdk else PEAK_MB
    return size_for(max(peaks[name] for name in TURNS))


TURNS_MB = turns_mb()
HANDLERS = (
    Handler(
        "sessions",
        "Create, list, show and delete sessions; page a session's ledger; erase a person",
        API,
        size_for(PEAK_MB["sessions"]),
    ),
    Handler("run", "Claim a turn; run it if the caller waits, else (or if it parks) start the workflow", API, TURNS_MB),
    Handler("tools", "Store answers to yielded tools; run the turn on if the caller waits, else wake", API, TURNS_MB),
    Handler("commit", "Commit events from a runner that runs agents elsewhere", API, size_for(PEAK_MB["commit"])),
    # Longer than the store's 10 s wait on another writer's live commit marker, with room to retry it.
    Handler(
        "park", "Store the workflow's task token with a session that waits for answers", 60, size_for(PEAK_MB["park"])
    ),
    # Runs whole turns in the workflow: Lambda's maximum; a longer turn continues in the next invocation.
    Handler("resume", "Run a session's turn in the workflow; record an expired wait or a failure", 900, TURNS_MB),
    Handler(
        "sweeper",
        "Repair pending commits; end or hand on dead runners' turns; restart missing executions",
        120,
        size_for(PEAK_MB["sweeper"]),
    ),
)


def memory_sizes(value: object, *, model_sdk: bool = False) -> dict[str, int]:
    """Each function's memory: ``HANDLERS``' own (the turn functions' with the OpenAI SDK when ``model_sdk``:
    ``-c model=openai``), unless ``-c function_memory=`` gives one size for all (``=1024``) or some functions theirs
    (``=resume=1024,run=1024``). Refused: a size outside Lambda's range, an unknown function, and ``run`` or
    ``tools`` below ``resume`` (``TURNS``)."""
    sizes = {h.name: h.memory_mb for h in HANDLERS}
    sizes.update(dict.fromkeys(TURNS, turns_mb(model_sdk)))
    text = "" if value is None else str(value).strip()
    if not text:
        return sizes
    given = {name: text for name in sizes} if "=" not in text else dict(_pair(p) for p in text.split(",") if p)
    for name, size in given.items():
        if name not in sizes:
            raise ValueError(f"context function_memory names {name!r}, not one of {', '.join(sizes)}")
        try:
            sizes[name] = int(size)
        except ValueError:
            sizes[name] = 0
        if not MEMORY_MIN_MB <= sizes[name] <= MEMORY_MAX_MB:
            raise ValueError(
                f"context function_memory: {name}'s is a whole number of MB from {MEMORY_MIN_MB} to "
                f"{MEMORY_MAX_MB}, not {size!r}"
            )
    for turns in ("run", "tools"):
        if sizes[turns] < sizes["resume"]:
            raise ValueError(
                f"context function_memory: {turns} ({sizes[turns]} MB) runs turns as resume does "
                f"({sizes['resume']} MB): give it at least as much"
            )
    return sizes


def _pair(part: str) -> tuple[str, str]:
    name, _, size = part.partition("=")
    return name.strip(), size.strip()


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
        memory: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(scope, id)
        sizes = memory_sizes(None) if memory is None else memory
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
                memory_size=sizes[handler.name],
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
