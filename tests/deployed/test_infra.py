"""The CDK app: what the synthesized template holds, and that cfn-lint and cdk-nag pass on it.

One synthesis per module (the jsii kernel starts once), by ``tests.support.cdk_template.synthesize``: with the
cdk-nag AwsSolutions plugin and CDK's own template validation, so a finding or a circular dependency
fails the fixture itself.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.backend("cdk")

pytest.importorskip("aws_cdk", reason="the infra tests need the infra extra (pip install 'dormant[infra]')")
pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")

import dormant  # noqa: E402
from dormant.serving.routes import CLIENT_PREFIX, ROUTES, SCOPES, scope_of  # noqa: E402
from dormant.serving.workflow.stepfunctions import ANSWERED  # noqa: E402
from dormant.stores.dynamodb import TABLE  # noqa: E402
from infra.functions import FUNCTIONS_DIR, HANDLERS  # noqa: E402
from infra.wiring import ENVIRONMENT, MODEL_ENVIRONMENT  # noqa: E402
from infra.workflow import MAX_WAIT_SECONDS, RETRYABLE_ERRORS, RUNNER_LOST  # noqa: E402
from tests.support.cdk_template import (  # noqa: E402
    STACK,
    Synth,
    definition_of,
    function_of,
    machine_of,
    synthesize,
)
from tests.support.fidelity.stepfunctions import error_matches  # noqa: E402


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("cdk.out"))


def statements_of_role(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def text(value: Any) -> str:
    """A CloudFormation string as text: ``Fn::Join`` joined, ``Ref X`` as ``<X>``, ``GetAtt [X, A]`` as ``<X.A>``."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(text(part) for part in parts)
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return f"<{'.'.join(value['Fn::GetAtt'])}>"
    raise AssertionError(f"not a string: {value}")


def machine_arn(synth: Synth, which: str = "sessions") -> str:
    _, machine = machine_of(synth, which)
    name = machine["Properties"]["StateMachineName"]
    return f"arn:<AWS::Partition>:states:eu-west-1:123456789012:stateMachine:{name}"


# -- the table -----------------------------------------------------------------------------------


def _indexes(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Index entries by name, their projected attributes sorted (CloudFormation keeps no order)."""
    out = {}
    for entry in entries:
        projection = dict(entry["Projection"])
        if "NonKeyAttributes" in projection:
            projection["NonKeyAttributes"] = sorted(projection["NonKeyAttributes"])
        out[entry["IndexName"]] = {"KeySchema": entry["KeySchema"], "Projection": projection}
    return out


def _by_name(attributes: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(attributes, key=lambda a: a["AttributeName"])


def test_the_table_is_built_from_the_store_table_shape(synth: Synth) -> None:
    _, table = synth.one("AWS::DynamoDB::Table")
    props = table["Properties"]
    wanted = TABLE.create_table_request("any")  # what the store's create_table sends
    assert props["KeySchema"] == wanted["KeySchema"]
    assert _by_name(props["AttributeDefinitions"]) == _by_name(wanted["AttributeDefinitions"])
    assert _indexes(props["GlobalSecondaryIndexes"]) == _indexes(wanted["GlobalSecondaryIndexes"])
    # No local index: it would cap every session, scope id and binding partition at 10 GB (AWS's item collection
    # limit applies only to a table with one) and keep the partition from splitting; nor can one be dropped later.
    assert "LocalSecondaryIndexes" not in props and "LocalSecondaryIndexes" not in wanted
    assert {"listing", "pending", "running"} <= set(_indexes(props["GlobalSecondaryIndexes"]))  # every GSI
    assert props["BillingMode"] == wanted["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True,
        "RecoveryPeriodInDays": 35,  # AWS's default, written: -c pitr_days= sets it
    }
    assert props["TimeToLiveSpecification"] == {"AttributeName": TABLE.ttl_attribute, "Enabled": True}
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    assert props["DeletionProtectionEnabled"] is True  # nor deleted by hand, or by a stack that lost it


# -- functions and their permissions -------------------------------------------------------------


def test_every_handler_is_a_python_312_arm64_function_with_both_layers(synth: Synth) -> None:
    functions = synth.of_type("AWS::Lambda::Function")
    assert len(functions) == len(HANDLERS)
    layers = synth.of_type("AWS::Lambda::LayerVersion")
    assert len(layers) == 2
    for handler in HANDLERS:
        _, fn = function_of(synth, handler.name)
        props = fn["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["arm64"]
        assert props["Handler"] == "app.handler"
        assert sorted(layer["Ref"] for layer in props["Layers"]) == sorted(layers)
        env = props["Environment"]["Variables"]
        assert env["DORMANT_APP"] == "bookings:build"
        assert env["POWERTOOLS_TRACE_DISABLED"] == "true"
        assert env["PYDANTIC_DISABLE_PLUGINS"] == "__all__"  # no entry-point scan at cold start
        table_id, _ = synth.one("AWS::DynamoDB::Table")
        # shard counts are context, fixed at the first deploy (the table records them), never a parameter
        # and so is the recovery period, which the store's erasure reports as its residue
        assert text(env["DORMANT_STORE"]) == f"dynamodb://<{table_id}>?shards=4&pending_shards=8&pitr_days=35"
        if "DORMANT_IDEMPOTENCY_TABLE" in env:
            assert env["DORMANT_IDEMPOTENCY_TABLE"] == {"Ref": table_id}  # idempotency records share the table
        if "DORMANT_STATE_MACHINE" in env:
            assert text(env["DORMANT_STATE_MACHINE"]) == machine_arn(synth)


# What contracts.md fixes, written out here rather than read from infra.wiring (which the stack builds from).
COMMON_ENV = {
    "DORMANT_STORE",
    "DORMANT_APP",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_TRACE_DISABLED",
    "PYDANTIC_DISABLE_PLUGINS",
}
CALLER_ENV = {"DORMANT_TENANT_CLAIM", "DORMANT_ADMIN_GROUP", "DORMANT_MACHINE_CLIENTS"}
CONTRACT_ENV = {
    # the API's functions name the caller's tenant claim (-c tenant_claim=), the admin group (-c admin_group=), the
    # machine clients' tenants (-c machine_clients=), the allowed origins and the quota
    "sessions": COMMON_ENV | CALLER_ENV | {"DORMANT_IDEMPOTENCY_TABLE", "DORMANT_CORS_ORIGINS", "DORMANT_TURN_QUOTA"},
    "run": COMMON_ENV
    | CALLER_ENV
    | {"DORMANT_IDEMPOTENCY_TABLE", "DORMANT_STATE_MACHINE", "DORMANT_WAIT_MACHINE", "DORMANT_CORS_ORIGINS"}
    | {"DORMANT_TURN_QUOTA"},
    "tools": COMMON_ENV
    | CALLER_ENV
    | {"DORMANT_IDEMPOTENCY_TABLE", "DORMANT_STATE_MACHINE", "DORMANT_WAIT_MACHINE", "DORMANT_CORS_ORIGINS"}
    | {"DORMANT_TURN_QUOTA"},
    "commit": COMMON_ENV | CALLER_ENV | {"DORMANT_IDEMPOTENCY_TABLE", "DORMANT_CORS_ORIGINS", "DORMANT_TURN_QUOTA"},
    "park": COMMON_ENV,
    "resume": COMMON_ENV,
    "sweeper": COMMON_ENV | {"DORMANT_STATE_MACHINE", "DORMANT_WAIT_MACHINE"},
}


@pytest.mark.parametrize("name", [h.name for h in HANDLERS])
def test_each_function_gets_exactly_its_own_environment(synth: Synth, name: str) -> None:
    _, fn = function_of(synth, name)
    keys = set(fn["Properties"]["Environment"]["Variables"])
    assert keys == set(ENVIRONMENT[name])  # the template is built from infra.wiring's table ...
    assert keys == CONTRACT_ENV[name]  # ... which is the contract


def test_the_state_machines_have_fixed_names_so_their_arns_need_no_reference(synth: Synth) -> None:
    assert len(synth.of_type("AWS::StepFunctions::StateMachine")) == 2  # sessions (Run first) and waits (Park)
    for which, variable in (("sessions", "DORMANT_STATE_MACHINE"), ("waits", "DORMANT_WAIT_MACHINE")):
        machine_id, machine = machine_of(synth, which)
        assert machine["Properties"]["StateMachineName"] == f"{STACK}-{which}"
        for name in ("run", "tools", "sweeper"):
            _, fn = function_of(synth, name)
            value = fn["Properties"]["Environment"]["Variables"][variable]
            assert machine_id not in json.dumps(value)  # written, not referenced: no dependency on the machine
            assert text(value) == machine_arn(synth, which)


# -- what each function's code reads -------------------------------------------------------------

_ENV_NAME = re.compile(r"DORMANT_[A-Z0-9_]+")


def _executed(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without what Python does not run: annotations, and ``if TYPE_CHECKING:`` blocks."""
    yield node
    for field, value in ast.iter_fields(node):
        if field in {"annotation", "returns"}:
            continue
        if field == "body" and isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _executed(child)


class _Code:
    """The ``dormant`` package's modules parsed, to follow a handler's code by name: the functions it can reach
    (a name resolved in its module or through its imports; ``module.attr``; ``obj.attr`` as the method of that
    name of any class the reached code names), and the module-level code of every module it imports. An
    over-approximation by name: a variable read anywhere in a function the handler can reach counts."""

    def __init__(self, root: Path, package: str) -> None:
        self.modules: dict[str, ast.Module] = {}
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(path.read_text())

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        is_package = any(m.startswith(module + ".") for m in self.modules)
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def bindings(self, module: str, nodes: Sequence[ast.AST]) -> dict[str, tuple[str, str | None]]:
        """Imported name -> (module, attribute or ``None`` for a module), from every import run in ``nodes``."""
        out: dict[str, tuple[str, str | None]] = {}
        for node in (sub for n in nodes for sub in _executed(n)):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    out[alias.asname or alias.name] = (target, None) if target in self.modules else (source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    out[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        return out

    def reads(self, entry: Path) -> set[str]:
        """The ``DORMANT_*`` names the code run by importing ``entry`` and calling what it names can read."""
        trees = {**self.modules, "__entry__": ast.parse(entry.read_text())}
        found: set[str] = set()
        done: set[tuple[str, str | None]] = set()
        todo: list[tuple[str, str | None]] = [("__entry__", None)]
        classes: dict[tuple[str, str], ast.ClassDef] = {}  # the classes the reached code names
        attributes: set[str] = set()  # the attributes it uses

        @cache
        def names(module: str) -> tuple[dict[str, tuple[str, str | None]], set[str]]:
            body = list(trees[module].body)
            return self.bindings(module, body), {n.name for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef)}

        def scan(module: str, nodes: Sequence[ast.AST]) -> None:
            bound, defs = names(module)
            for node in (sub for n in nodes for sub in _executed(n)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.fullmatch(node.value):
                    found.add(node.value)
                elif isinstance(node, ast.Name):
                    if node.id in defs:
                        todo.append((module, node.id))
                    elif node.id in bound:
                        todo.append(bound[node.id])
                elif isinstance(node, ast.Attribute):
                    if isinstance(node.value, ast.Name) and bound.get(node.value.id, ("", ""))[1] is None:
                        todo.append((bound[node.value.id][0], node.attr))  # module.attr
                    if node.attr not in attributes and not node.attr.startswith("__"):
                        attributes.add(node.attr)
                        todo.extend((m, f"{k.name}.{node.attr}") for (m, _), k in classes.items())
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    todo.extend((target, None) for target, _ in self.bindings(module, [node]).values())

        while todo:
            module, name = todo.pop()
            if (module, name) in done or module not in trees:
                continue
            done.add((module, name))
            tree = trees[module]
            if name is None:  # importing a module runs its parents' and its own module-level code
                if "." in module:
                    todo.append((module.rsplit(".", 1)[0], None))
                scan(module, [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)])
                continue
            todo.append((module, None))
            klass, _, method = name.partition(".")
            bound, defs = names(module)
            if klass not in defs and klass in bound:  # a name the module re-exports (a package's __init__)
                target, attr = bound[klass]
                todo.append(
                    (target, method or None) if attr is None else (target, f"{attr}.{method}" if method else attr)
                )
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    scan(module, [node])
                elif isinstance(node, ast.ClassDef) and node.name == klass:
                    if not method:  # a class named: its construction, and the methods called on anything
                        classes[(module, klass)] = node
                        todo.extend((module, f"{klass}.{a}") for a in attributes)
                    chosen = {method} if method else {"__init__", "__post_init__"}
                    body = [n for n in node.body if not isinstance(n, ast.FunctionDef) or n.name in chosen]
                    scan(module, [*node.decorator_list, *node.bases, *body])
        return found


def test_the_code_reading_sees_a_variable_read_behind_helpers_and_not_one_in_unreached_code(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "serving").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "serving" / "__init__.py").write_text("")
    (package / "serving" / "env.py").write_text(
        "import os\n"
        "def arn():\n    return os.environ['DORMANT_STATE_MACHINE']\n"
        "def table():\n    return os.environ.get('DORMANT_IDEMPOTENCY_TABLE')\n"
    )
    (package / "serving" / "machine.py").write_text(
        "from .env import arn\n"
        "class Machine:\n"
        "    def __init__(self, client=None):\n        self.client = client\n"
        "    @classmethod\n    def from_env(cls):\n        return cls(arn())\n"
        "    def wake(self, token):\n        return token\n"
        "def run_handler():\n    return Machine.from_env()\n"
        "def park_handler():\n    return Machine().wake('t')\n"
    )
    (package / "serving" / "other.py").write_text(
        "from .env import table\nclass Unnamed:\n    def wake(self, token):\n        return table()\n"
    )
    code = _Code(package, "pkg")
    entry = tmp_path / "app.py"
    entry.write_text("from pkg.serving.machine import run_handler\nhandler = run_handler()\n")
    assert code.reads(entry) == {"DORMANT_STATE_MACHINE"}
    entry.write_text("from pkg.serving.machine import park_handler\nhandler = park_handler()\n")
    assert code.reads(entry) == set()
    entry.write_text("from pkg.serving import env\nhandler = env.table()\n")
    assert code.reads(entry) == {"DORMANT_IDEMPOTENCY_TABLE"}
    # a package's __init__ that re-exports a handler: the reading follows the name to the module defining it
    (package / "serving" / "__init__.py").write_text("from .machine import run_handler\n")
    entry.write_text("from pkg.serving import run_handler\nhandler = run_handler()\n")
    assert _Code(package, "pkg").reads(entry) == {"DORMANT_STATE_MACHINE"}


# Today's serving code reads the state machine's ARN in these functions too (tools through workflow_hooks;
# park and resume share workflow_handler, whose park action builds StepFunctions from it); the serving rewrite
# (contracts.md) removes those reads. Strict: the marker must go when it does.
_READS_MORE_TODAY: set[str] = set()  # every function reads only what its template gives it


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            h.name,
            marks=pytest.mark.xfail(
                h.name in _READS_MORE_TODAY, strict=True, reason="reads DORMANT_STATE_MACHINE until the serving rewrite"
            ),
        )
        for h in HANDLERS
    ],
)
def test_each_function_code_reads_no_dormant_variable_its_template_does_not_give_it(name: str) -> None:
    reads = _Code(Path(dormant.__file__).parent, "dormant").reads(FUNCTIONS_DIR / name / "app.py")
    assert {"DORMANT_STORE", "DORMANT_APP"} <= reads  # the analysis reaches the composition root
    # the model's variables are given to every function when a model is chosen (tests/deployed/test_infra_models.py)
    given = ENVIRONMENT[name] | MODEL_ENVIRONMENT
    assert reads <= given, f"{name} reads {sorted(reads - given)}, which it is not given"


def _allowed_resources(synth: Synth, name: str) -> dict[str, set[str]]:
    """What a function's statements may name, by service: its own log group, this table and this table's indexes,
    this stack's state machine and its executions, and for the sweeper its queue of failed sweeps."""
    table_id, _ = synth.one("AWS::DynamoDB::Table")
    (log_id,) = [
        key
        for key, r in synth.of_type("AWS::Logs::LogGroup").items()
        if r["Metadata"]["aws:cdk:path"] == f"{STACK}/Functions/{name.capitalize()}/Logs/Resource"
    ]
    machines = [machine_arn(synth, which) for which in ("sessions", "waits")]
    queues = {f"<{key}.Arn>" for key in synth.of_type("AWS::SQS::Queue")} if name == "sweeper" else set()
    return {
        **({"sqs": queues} if queues else {}),  # the sweeper's failed sweeps: its on-failure destination
        "logs": {f"<{log_id}.Arn>"},
        "dynamodb": {f"<{table_id}.Arn>", *(f"<{table_id}.Arn>/index/{index.name}" for index in TABLE.indexes)},
        "states": {*machines, *(machine.replace(":stateMachine:", ":execution:") + ":*" for machine in machines)},
    }


@pytest.mark.parametrize("name", [h.name for h in HANDLERS])
def test_each_function_may_touch_only_its_logs_this_table_and_this_state_machine(synth: Synth, name: str) -> None:
    # Which actions each function needs is the fidelity harness's to say (from the calls the code makes);
    # here: nothing granted wholesale, no wildcard action, nothing outside the stack's own resources.
    _, fn = function_of(synth, name)
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    role = synth.resources[role_id]["Properties"]
    assert "ManagedPolicyArns" not in role  # nothing granted wholesale
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    allowed = _allowed_resources(synth, name)
    actions: set[str] = set()
    for statement in statements_of_role(synth, role_id):
        assert statement["Effect"] == "Allow"
        assert "Condition" not in statement and "NotAction" not in statement and "NotResource" not in statement
        services = {action.split(":")[0] for action in as_list(statement["Action"])}
        assert len(services) == 1, statement
        (service,) = services
        assert service in allowed, f"{name} may call {service}: {statement}"
        assert not [a for a in as_list(statement["Action"]) if "*" in a], statement  # no wildcard action
        for resource in as_list(statement["Resource"]):
            assert text(resource) in allowed[service], f"{name}: {service} on {text(resource)}"
        actions |= set(as_list(statement["Action"]))
    assert "dynamodb:Scan" not in actions
    assert {a for a in actions if a.startswith("dynamodb:")} >= {"dynamodb:GetItem", "dynamodb:Query"}


# contracts.md: which functions call Step Functions, and on what (a task token is authorized against the
# state machine whose execution issued it; DescribeExecution against the execution).
CONTRACT_STATES = {
    "run": {"states:StartExecution": {"sessions", "waits"}},
    "sweeper": {
        "states:StartExecution": {"sessions", "waits"},
        "states:DescribeExecution": {"sessions executions", "waits executions"},
        "states:SendTaskSuccess": {"sessions"},  # a wait parked before Answered: the sessions machine's only
        "states:SendTaskFailure": {"sessions", "waits"},
    },
    "tools": {
        "states:SendTaskSuccess": {"sessions", "waits"},
        "states:SendTaskFailure": {"sessions", "waits"},
        "states:StartExecution": {"sessions", "waits"},
    },
    "park": {"states:SendTaskSuccess": {"sessions", "waits"}, "states:SendTaskFailure": {"sessions", "waits"}},
}


@pytest.mark.parametrize("name", [h.name for h in HANDLERS])
def test_step_functions_grants_follow_the_contract_in_policies_of_their_own(synth: Synth, name: str) -> None:
    _, fn = function_of(synth, name)
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    on = {}
    for which in ("sessions", "waits"):
        machine = machine_arn(synth, which)
        on[machine] = which
        on[machine.replace(":stateMachine:", ":execution:") + ":*"] = f"{which} executions"
    granted: dict[str, set[str]] = {}
    for key, policy in synth.of_type("AWS::IAM::Policy").items():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            for action in as_list(statement["Action"]):
                if action.startswith("states:"):
                    # not in the default policy the function depends on: the machine depends on park and resume
                    assert "DefaultPolicy" not in policy["Metadata"]["aws:cdk:path"], key
                    (resource,) = as_list(statement["Resource"])
                    granted.setdefault(action, set()).add(on[text(resource)])
    assert granted == CONTRACT_STATES.get(name, {})


@pytest.mark.parametrize("which", ["sessions", "waits"])
def test_each_state_machine_may_invoke_only_park_and_resume_and_start_only_the_sessions_machine(
    synth: Synth, which: str
) -> None:
    _, machine = machine_of(synth, which)
    role_id = machine["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    invoked = set()
    started = []
    for statement in statements_of_role(synth, role_id):
        if statement["Action"] == "lambda:InvokeFunction":
            invoked |= {json.dumps(r) for r in as_list(statement["Resource"])}
        elif statement["Action"] == "states:StartExecution":  # continue-as-new: into the sessions machine
            started += [text(r) for r in as_list(statement["Resource"])]
        else:  # log delivery, which takes no resource narrower than *
            assert all(action.startswith("logs:") for action in as_list(statement["Action"])), statement
    assert started == [machine_arn(synth)]
    park_id, _ = function_of(synth, "park")
    resume_id, _ = function_of(synth, "resume")
    assert {fid for fid in (park_id, resume_id) if any(fid in r for r in invoked)} == {park_id, resume_id}
    others = {key for key in synth.of_type("AWS::Lambda::Function")} - {park_id, resume_id}
    assert not any(other in r for other in others for r in invoked)


def test_timeouts_fit_what_each_function_does(synth: Synth) -> None:
    from dormant.stores.dynamodb import DynamoDBSessionStore

    timeouts = {h.name: function_of(synth, h.name)[1]["Properties"]["Timeout"] for h in HANDLERS}
    for name in {f for _, _, f in ROUTES}:
        assert timeouts[name] == 24  # with a cold start, under API Gateway's 29 s: no 504 after the work landed
    live_wait = DynamoDBSessionStore.__init__.__kwdefaults__["live_wait_s"]  # type: ignore[index]
    assert timeouts["park"] >= 30 and timeouts["park"] >= 2 * live_wait  # past the store's wait, with margin
    assert timeouts["resume"] == 900  # runs whole turns: Lambda's maximum
    assert timeouts["sweeper"] == 120


# -- the API -------------------------------------------------------------------------------------


def test_each_function_is_sized_by_its_measured_peak_with_headroom(synth: Synth) -> None:
    """Lambda bills memory x time: each function gets its peak over the fidelity arcs x 1.5, on a 64 MB step, at
    least Lambda's 128 (``infra.functions.PEAK_MB``, measured by the harness, which enforces the size). ``run``
    and ``tools`` run turns as ``resume`` does (issue 36): never sized lower."""
    from infra.functions import MEMORY_MIN_MB, PEAK_MB, size_for

    sizes = {h.name: function_of(synth, h.name)[1]["Properties"]["MemorySize"] for h in HANDLERS}
    assert sizes == {h.name: h.memory_mb for h in HANDLERS}
    for name, size in sizes.items():
        assert 0 < PEAK_MB[name] * 1.5 <= size and size % 64 == 0 and size >= MEMORY_MIN_MB, (name, size)
        assert size >= size_for(PEAK_MB[name]), name
    assert sizes["run"] >= sizes["resume"] and sizes["tools"] >= sizes["resume"]
    assert max(sizes.values()) < 512  # the size every function had before it was measured


def test_with_the_openai_sdk_the_turn_functions_are_sized_by_its_peaks(tmp_path: Path) -> None:
    """``-c model=openai:...`` loads the OpenAI SDK in the turn functions (28 MB): they are sized by their peaks with
    it (``OPENAI_PEAK_MB``), the others as without; ``-c model=bedrock:...`` loads none beyond botocore."""
    from infra.functions import OPENAI_PEAK_MB, TURNS, size_for

    secret = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:dormant/openai-Ab12Cd"
    with_sdk = synthesize(tmp_path / "openai", {"model": "openai:m", "openai_secret": secret})
    sizes = {h.name: function_of(with_sdk, h.name)[1]["Properties"]["MemorySize"] for h in HANDLERS}
    turns = size_for(max(OPENAI_PEAK_MB.values()))
    assert turns > min(h.memory_mb for h in HANDLERS if h.name in TURNS), "the SDK's peaks size no higher"
    assert sizes == {h.name: turns if h.name in TURNS else h.memory_mb for h in HANDLERS}, sizes
    for name in TURNS:
        assert OPENAI_PEAK_MB[name] * 1.5 <= sizes[name], name
    bedrock = synthesize(tmp_path / "bedrock", {"model": "bedrock:eu.amazon.nova-pro-v1:0"})
    sizes = {h.name: function_of(bedrock, h.name)[1]["Properties"]["MemorySize"] for h in HANDLERS}
    assert sizes == {h.name: h.memory_mb for h in HANDLERS}, sizes


def test_function_memory_is_context_one_size_or_each_functions_and_checked(tmp_path: Path) -> None:
    from infra.functions import memory_sizes

    own = {h.name: h.memory_mb for h in HANDLERS}
    assert memory_sizes(None) == memory_sizes("") == own
    assert memory_sizes("1024") == dict.fromkeys(own, 1024)
    want = {**own, "resume": 1024, "run": 1536, "tools": 1024}
    assert memory_sizes("resume=1024, run=1536, tools=1024") == want
    for bad, named in (
        ("resume=1024", "run"),  # run below resume
        ("resume=1024,run=1024", "tools"),  # tools below resume
        ("tools=64", "tools"),
        ("tools=10241", "tools"),
        ("tools=lots", "tools"),
        ("nope=256", "nope"),
        ("127", "sessions"),
    ):
        with pytest.raises(ValueError, match=named):
            memory_sizes(bad)
    synthesized = synthesize(tmp_path / "memory", {"function_memory": "sessions=256,resume=640,run=640,tools=640"})
    sizes = {h.name: function_of(synthesized, h.name)[1]["Properties"]["MemorySize"] for h in HANDLERS}
    assert sizes == {**own, "sessions": 256, "resume": 640, "run": 640, "tools": 640}


def test_the_stack_leaves_the_account_api_gateway_logging_role_alone(synth: Synth) -> None:
    assert synth.of_type("AWS::ApiGateway::Account") == {}
    for role in synth.of_type("AWS::IAM::Role").values():
        principals = [s["Principal"] for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]]
        assert {"Service": "apigateway.amazonaws.com"} not in principals
        assert "AmazonAPIGatewayPushToCloudWatchLogs" not in json.dumps(role["Properties"].get("ManagedPolicyArns"))
    _, stage = synth.one("AWS::ApiGateway::Stage")
    assert "DestinationArn" in stage["Properties"]["AccessLogSetting"]  # needs the account's role (docs/deploying.md)


def _path_of(synth: Synth, resource_id: Any) -> str:
    if isinstance(resource_id, dict) and "Fn::GetAtt" in resource_id:
        return ""  # the API's root resource
    resource = synth.resources[resource_id["Ref"]]["Properties"]
    return f"{_path_of(synth, resource['ParentId'])}/{resource['PathPart']}"


def test_the_api_has_exactly_the_routes_of_the_table(synth: Synth) -> None:
    methods = synth.of_type("AWS::ApiGateway::Method")
    routes = set()
    for method in methods.values():
        props = method["Properties"]
        path = _path_of(synth, props["ResourceId"])
        uri = json.dumps(props["Integration"]["Uri"])
        targets = [h.name for h in HANDLERS if function_of(synth, h.name)[0] in uri]
        assert len(targets) == 1
        assert props["Integration"]["Type"] == "AWS_PROXY"
        routes.add((props["HttpMethod"], path, targets[0]))
        # people's methods take their ID token (no scopes); the machine clients' twins require the route's scope
        scopes = props.get("AuthorizationScopes")
        if path.startswith(CLIENT_PREFIX):
            assert scopes == [scope_of(props["HttpMethod"], path.removeprefix(CLIENT_PREFIX))], path
        else:
            assert scopes is None, path
    clients = {(m, CLIENT_PREFIX + p, f) for m, p, f in ROUTES}
    assert routes == set(ROUTES) | clients
    assert len(methods) == 2 * len(ROUTES)  # no OPTIONS or ANY method left open


def test_every_method_is_behind_the_cognito_authorizer(synth: Synth) -> None:
    authorizer_id, authorizer = synth.one("AWS::ApiGateway::Authorizer")
    assert authorizer["Properties"]["Type"] == "COGNITO_USER_POOLS"
    pool_id, _ = synth.one("AWS::Cognito::UserPool")
    assert authorizer["Properties"]["ProviderARNs"] == [{"Fn::GetAtt": [pool_id, "Arn"]}]
    for method in synth.of_type("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        assert props["AuthorizationType"] == "COGNITO_USER_POOLS"
        assert props["AuthorizerId"] == {"Ref": authorizer_id}


def test_people_sign_in_without_oauth_and_machines_by_client_credentials(synth: Synth) -> None:
    clients = {
        c["Properties"].get("GenerateSecret", False): c["Properties"]
        for c in synth.of_type("AWS::Cognito::UserPoolClient").values()
    }
    people, machines = clients[False], clients[True]
    assert people["ExplicitAuthFlows"] == ["ALLOW_USER_SRP_AUTH", "ALLOW_REFRESH_TOKEN_AUTH"]
    assert "AllowedOAuthFlows" not in people and "CallbackURLs" not in people  # no implicit grant, no placeholder URL
    assert people["WriteAttributes"] == ["email"]  # a person cannot move to another tenant
    assert machines["AllowedOAuthFlows"] == ["client_credentials"]
    assert sorted(machines["AllowedOAuthScopes"]) == sorted(SCOPES.values())
    _, server = synth.one("AWS::Cognito::UserPoolResourceServer")
    named = {f"{server['Properties']['Identifier']}/{s['ScopeName']}" for s in server["Properties"]["Scopes"]}
    assert named == set(SCOPES.values())
    _, pool = synth.one("AWS::Cognito::UserPool")
    assert {"Name": "tenant", "AttributeDataType": "String", "Mutable": True}.items() <= next(
        a for a in pool["Properties"]["Schema"] if a["Name"] == "tenant"
    ).items()


# -- the resume workflow -------------------------------------------------------------------------


def test_the_workflow_runs_parks_continues_as_new_and_ends_cleanly(synth: Synth) -> None:
    asl = definition_of(synth)
    states = asl["States"]
    assert asl["StartAt"] == "Run"  # no Choice first: a turn run in the workflow starts at its Run
    assert set(states) == {
        "Run",
        "After the run",
        "Park",
        "Next loop",
        "Continue",
        "Continued",
        "Done",
        "NotClaimed",
        "Expire",
        "Answered as it expired?",
        "Expired",
        "RecordFailure",
        "RecordParkFailure",
        "Failed",
    }
    # the waits machine (a turn a waiting request ran to its park, a lost wait's restart) starts at Park, with
    # the very states that follow the sessions machine's Park (one function builds both)
    waits = definition_of(synth, which="waits")
    assert waits["StartAt"] == "Park"
    assert set(waits["States"]) == set(states) - {"Run", "After the run", "Done", "NotClaimed"}
    assert waits["States"] == {name: states[name] for name in waits["States"]}
    run = states["Run"]
    assert run["Parameters"]["Payload"]["action"] == "run"
    assert run["Parameters"]["Payload"]["retry.$"] == "$$.State.RetryCount"  # a retry repairs a dead runner's commit
    assert run["ResultPath"] == "$.turn" and run["ResultSelector"] == {"status.$": "$.Payload.status"}
    catches = {tuple(c["ErrorEquals"]): c["Next"] for c in run["Catch"]}
    assert catches == {("TurnNotClaimed",): "NotClaimed", ("States.ALL",): "RecordFailure"}
    after = states["After the run"]
    assert after["Choices"] == [
        {"Variable": "$.turn.status", "StringEquals": "yielded_tool", "Next": "Park"},
        {"Variable": "$.turn.status", "StringEquals": "handed_on", "Next": "Run"},  # the rest of the turn
    ]
    assert after["Default"] == "Done" and states["Done"]["Type"] == "Succeed"

    park = states["Park"]
    assert park["Resource"].endswith(":states:::lambda:invoke.waitForTaskToken")
    assert park["Parameters"]["Payload"]["token.$"] == "$$.Task.Token"
    # the wait's record, for the sweeper: which execution parked, and for how long
    assert park["Parameters"]["Payload"]["execution.$"] == "$$.Execution.Id"
    assert park["Parameters"]["Payload"]["wait_seconds"] == "<WaitTimeoutSeconds>"
    assert park["ResultPath"] == "$.answer"  # the callback's output must not replace the session's ids
    assert park["TimeoutSeconds"] == "<WaitTimeoutSeconds>"
    assert park["Parameters"]["Payload"]["answer_error"] == ANSWERED  # stored with the token: how to wake it
    # in order: a timeout expires the wait; an answer left to the workflow (Answered) continues it, caught before
    # States.ALL would record it as the turn's failure, and retried by nothing (a retry would park again)
    assert [(c["ErrorEquals"], c["Next"]) for c in park["Catch"]] == [
        (["States.Timeout", "States.HeartbeatTimeout"], "Expire"),
        ([ANSWERED], "Next loop"),
        (["States.ALL"], "RecordParkFailure"),  # recorded by resume: park may be what failed
    ]
    assert park["Catch"][1]["ResultPath"] is None  # the failure's error and cause are not the next loop's input
    assert not [r for r in park["Retry"] if error_matches(r["ErrorEquals"], ANSWERED)], park["Retry"]
    # every wait ends its execution (one wait per execution): an answer whose request ran the turn on ends it at
    # Park itself (SendTaskSuccess), no state after it
    assert park["End"] is True and "Next" not in park

    # continue as new: the sessions machine, the same turn, a deterministic name per loop
    assert states["Next loop"]["Parameters"]["loop.$"] == "States.MathAdd($.loop, 1)"
    assert states["Next loop"]["Next"] == "Continue"
    cont = states["Continue"]
    assert cont["Resource"].endswith(":states:::states:startExecution")
    # always the sessions machine (from the waits machine too): the next loop starts at Run
    assert cont["Parameters"]["StateMachineArn"] == machine_arn(synth)
    assert "StateMachineArn.$" not in cont["Parameters"]
    assert cont["Parameters"]["Name.$"] == "States.Format('{}-{}', $.name, $.loop)"
    assert {k: v for k, v in cont["Parameters"]["Input"].items() if not k.startswith("AWS_")} == {
        "tenant.$": "$.tenant",
        "session_id.$": "$.session_id",
        "invocation_id.$": "$.invocation_id",
        "name.$": "$.name",
        "loop.$": "$.loop",
    }
    assert cont["Catch"] == [{"ErrorEquals": ["StepFunctions.ExecutionAlreadyExistsException"], "Next": "Continued"}]
    assert cont["Next"] == "Continued" and states["Continued"]["Type"] == "Succeed"

    assert states["Expire"]["Parameters"]["Payload"]["action"] == "expire"
    assert states["Expire"]["Parameters"]["Payload"]["execution.$"] == "$$.Execution.Id"  # only its own wait
    assert states["Expire"]["Next"] == "Answered as it expired?"
    answered = states["Answered as it expired?"]
    assert answered["Choices"] == [{"Variable": "$.expired.status", "StringEquals": "resumable", "Next": "Next loop"}]
    assert answered["Default"] == "Expired" and states["Expired"]["Type"] == "Succeed"
    park_fn, resume_fn = (function_of(synth, name)[0] for name in ("park", "resume"))
    for record, function in (("RecordFailure", park_fn), ("RecordParkFailure", resume_fn)):
        assert states[record]["Parameters"]["Payload"]["error.$"] == "$.error"
        assert states[record]["Parameters"]["Payload"]["action"] == "fail"
        assert states[record]["Next"] == "Failed" and states["Failed"]["Type"] == "Fail"
        # a failure is recorded by another function than the one that failed (one at its cap cannot record it)
        assert states[record]["Parameters"]["FunctionName"] == f"<{function}.Arn>"
    assert states["Run"]["Parameters"]["FunctionName"] == states["Expire"]["Parameters"]["FunctionName"]
    assert states["Run"]["Parameters"]["FunctionName"] == f"<{resume_fn}.Arn>"
    assert states["Expire"]["Catch"][0]["Next"] == "RecordFailure"
    for name in ("Run", "Park", "Expire", "RecordFailure", "RecordParkFailure"):
        for key in ("session_id", "tenant", "invocation_id"):
            assert states[name]["Parameters"]["Payload"][f"{key}.$"] == f"$.{key}"


def test_every_task_retries_transient_errors_with_backoff_and_nothing_else(synth: Synth) -> None:
    from dormant.errors import retryable_error_names

    states = definition_of(synth)["States"]
    assert set(retryable_error_names()) >= {"StoreBusy", "StoreUnavailable", "CommitIncomplete", "ModelUnavailable"}
    assert [*retryable_error_names()] == RETRYABLE_ERRORS
    timeouts = {h.name: h.timeout_seconds for h in HANDLERS}
    for name in ("Run", "Park", "Expire", "RecordFailure", "RecordParkFailure"):
        retries = {tuple(r["ErrorEquals"]): r for r in states[name]["Retry"]}
        # a throttle lasts until an invocation holding the cap ends: retried for longer than the longest one
        throttled = retries.pop(("Lambda.TooManyRequestsException",))
        delays = [
            min(throttled["IntervalSeconds"] * throttled["BackoffRate"] ** min(n, 64), throttled["MaxDelaySeconds"])
            for n in range(throttled["MaxAttempts"])
        ]
        # longer than a queue of turns on the cap drains (hours: THROTTLE_RETRY), on average with full jitter
        assert throttled["JitterStrategy"] == "FULL" and sum(delays) / 2 > 8 * 3600, sum(delays)
        assert sum(delays) / 2 > max(timeouts.values())
        # three history events an attempt: a Run handed on several times can meet it again under 25,000
        assert 3 * (1 + throttled["MaxAttempts"]) * 5 < 25_000, throttled["MaxAttempts"]
        if name == "Run":  # a runner that timed out or died: the next attempt goes on from its committed steps
            ours = retries.pop((*RETRYABLE_ERRORS, *RUNNER_LOST))
            claim = retries.pop(("TurnNotClaimed",))  # the claim lands just after the execution starts
            waited = sum(claim["IntervalSeconds"] * claim["BackoffRate"] ** n for n in range(claim["MaxAttempts"]))
            assert 29 < waited < 120, waited  # longer than the API's request that commits it, not forever
        else:
            ours = retries.pop(tuple(RETRYABLE_ERRORS))
        assert ours["IntervalSeconds"] == 1 and ours["BackoffRate"] == 2 and ours["MaxAttempts"] == 4
        assert ours["MaxDelaySeconds"] == 30 and ours["JitterStrategy"] == "FULL"
        # what is left is CDK's retry of the Lambda service's own errors
        ((errors, service),) = retries.items()
        assert set(errors) == {
            "Lambda.ClientExecutionTimeoutException",
            "Lambda.ServiceException",
            "Lambda.AWSLambdaException",
            "Lambda.SdkClientException",
        }
        assert service["BackoffRate"] == 2 and service["MaxAttempts"] >= 1
        # a timeout is not retried (it is the end of the wait), nor a failure of the agent's own making
        assert not any(e.startswith("States.") for r in states[name]["Retry"] for e in r["ErrorEquals"])


def test_the_wait_timeout_is_a_parameter_under_a_year(synth: Synth) -> None:
    params = synth.template["Parameters"]
    # one wait per execution, and its turn's runs, stay under Step Functions' one year
    assert params["WaitTimeoutSeconds"]["MaxValue"] == MAX_WAIT_SECONDS == 360 * 24 * 3600 < 365 * 24 * 3600
    assert "ListingShards" not in params  # context, fixed at the first deploy: the table records it
    assert "30" in params["LogRetentionDays"]["AllowedValues"]
    for group in synth.of_type("AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_the_sweeper_runs_on_a_schedule(synth: Synth) -> None:
    _, rule = synth.one("AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    sweeper_id, _ = function_of(synth, "sweeper")
    assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [{"Fn::GetAtt": [sweeper_id, "Arn"]}]


# -- linters -------------------------------------------------------------------------------------


def test_cdk_nag_passes_with_only_the_acknowledged_findings(synth: Synth) -> None:
    (report,) = synth.report["pluginReports"]
    assert report["pluginName"] == "AwsSolutions"
    assert report["conclusion"] == "success"
    assert report["violations"] == []
    acknowledged = {v["ruleName"] for v in report["suppressedViolations"]}
    # Each is acknowledged with its reason where it is made (CDK requires the reason); a new one is a decision.
    park_id, _ = function_of(synth, "park")
    resume_id, _ = function_of(synth, "resume")
    assert acknowledged == {
        f"AwsSolutions-IAM5[Resource::<{park_id}.Arn>:*]",
        f"AwsSolutions-IAM5[Resource::<{resume_id}.Arn>:*]",
        "AwsSolutions-IAM5[Resource::*]",
        # the sweeper's DescribeExecution: on each machine's executions, whose names are made per turn
        f"AwsSolutions-IAM5[Resource::{machine_arn(synth).replace(':stateMachine:', ':execution:')}:*]",
        f"AwsSolutions-IAM5[Resource::{machine_arn(synth, 'waits').replace(':stateMachine:', ':execution:')}:*]",
        "AwsSolutions-L1",
        "AwsSolutions-SF1",  # the state machine logs its failures; a Standard execution keeps its history
        "AwsSolutions-SF2",
        "AwsSolutions-COG8",
        "AwsSolutions-APIG2",
        "AwsSolutions-APIG3",
        "AwsSolutions-SQS3",  # the sweeper schedule's dead-letter queue is itself a DLQ
    }


def test_cfn_lint_is_clean(synth: Synth) -> None:
    # W3005 (a DependsOn that a GetAtt already implies) is CDK's own redundancy, not ours.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cfn-lint")), "-i", "W3005", "--", str(synth.path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shard_counts_are_context_with_defaults_and_checked() -> None:
    from infra.stack import SHARD_DEFAULTS, _shard_count

    given = {"listing_shards": "4"}
    assert _shard_count(given.get, "listing_shards", 1) == 4
    assert _shard_count(given.get, "pending_shards", 8) == 8 == SHARD_DEFAULTS["pending_shards"]
    # the stack's defaults are the store's: a tenant's listing and status entries over 4 index partitions each
    from dormant.stores.dynamodb.store import DEFAULT_LISTING_SHARDS, DEFAULT_PENDING_SHARDS

    assert SHARD_DEFAULTS == {"listing_shards": DEFAULT_LISTING_SHARDS, "pending_shards": DEFAULT_PENDING_SHARDS}
    assert SHARD_DEFAULTS["listing_shards"] >= 4
    for bad in ("0", "x", "1001"):
        with pytest.raises(ValueError, match="listing_shards"):
            _shard_count({"listing_shards": bad}.get, "listing_shards", 1)


def test_the_state_machine_logs_its_failures_unless_told_to_log_every_event(synth: Synth) -> None:
    """A Standard execution keeps its own history: the log group gets failures, not a record per state a turn."""
    from aws_cdk import aws_stepfunctions as sfn

    from infra.workflow import log_level

    for which in ("sessions", "waits"):
        _, machine = machine_of(synth, which)
        logging = machine["Properties"]["LoggingConfiguration"]
        assert logging["Level"] == "ERROR" and logging["IncludeExecutionData"] is False
    assert log_level({}.get) == sfn.LogLevel.ERROR
    assert log_level({"workflow_log_level": "all"}.get) == sfn.LogLevel.ALL
    with pytest.raises(ValueError, match="workflow_log_level"):
        log_level({"workflow_log_level": "DEBUG"}.get)


def test_the_execution_log_group_is_the_stacks_with_a_retention(synth: Synth) -> None:
    """API Gateway would create ``API-Gateway-Execution-Logs_<api>/<stage>`` itself, outside the stack, kept
    forever: the stack creates it first (the stage depends on it), with the stack's retention."""
    groups = {
        text(r["Properties"]["LogGroupName"]): (key, r)
        for key, r in synth.of_type("AWS::Logs::LogGroup").items()
        if "LogGroupName" in r["Properties"]
    }
    api_id, _ = synth.one("AWS::ApiGateway::RestApi")
    key, group = groups[f"API-Gateway-Execution-Logs_<{api_id}>/v1"]
    assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    _, stage = synth.one("AWS::ApiGateway::Stage")
    assert stage["Properties"]["StageName"] == "v1" and key in stage["DependsOn"]


def test_cognito_mails_through_ses_when_given_and_its_own_email_otherwise(synth: Synth, tmp_path: Path) -> None:
    _, pool = synth.one("AWS::Cognito::UserPool")
    assert "EmailConfiguration" not in pool["Properties"]  # Cognito's own: a testing quota (docs/deploying.md)
    context = {"ses_from": "no-reply@a.example", "ses_name": "Bookings", "ses_domain": "a.example"}
    _, pool = synthesize(tmp_path / "ses", context).one("AWS::Cognito::UserPool")
    email = pool["Properties"]["EmailConfiguration"]
    assert email["EmailSendingAccount"] == "DEVELOPER" and email["From"] == "Bookings <no-reply@a.example>"
    assert text(email["SourceArn"]).endswith(":identity/a.example")
    with pytest.raises(SystemExit, match="ses_from"):
        synthesize(tmp_path / "half", {"ses_name": "Bookings"})
