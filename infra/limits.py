"""AWS's limits, checked on a synthesized template before ``cdk deploy`` meets them.

Each rule reads the template (a dict, as ``cdk synth`` writes it) and returns its ``Breach``es: a resource
policy Lambda would refuse, a role's inline policies IAM would refuse, a stack CloudFormation would refuse,
reservations that leave the account under Lambda's 100 unreserved, and a timeout chain in which the caller
gives up before the callee (a 504 after the work landed, a task retried while its first attempt still runs).
``check`` runs them all. CloudFormation values are resolved to what AWS would store: ``Ref``/``Fn::GetAtt`` as
a name or ARN of the length CloudFormation generates (``Deployment``), so sizes are measured, not guessed.

The module needs no CDK: ``python -m infra.limits cdk.out [account concurrency]`` checks what ``cdk synth``
wrote, and ``tests/deployed/test_limits.py`` runs it over every combination of context that changes the
template.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESOURCE_POLICY_BYTES = 20_480
"""A Lambda function's resource-based policy, as Lambda stores it."""
ROUTE_HEADROOM = 4
"""Routes a function's resource policy must still have room for, each at its template's statements per route."""
ROLE_INLINE_CHARS = 10_240
"""A role's inline policies together, whitespace not counted (IAM)."""
MANAGED_POLICY_CHARS = 6_144
ENVIRONMENT_BYTES = 4_096
"""A function's environment variables together."""
RESOURCES = 500
TEMPLATE_BYTES = 1_000_000
"""CloudFormation's template size from S3 (1 MB), counted in decimal: a template near it is too near."""
UNZIPPED_BYTES = 250 * 1024 * 1024
"""A function's code and its layers, unzipped."""
UNRESERVED_MINIMUM = 100
"""Lambda keeps this much of the account's concurrency unreserved; a deploy that leaves less fails."""
INTEGRATION_TIMEOUT_S = 29
"""API Gateway's default integration timeout (a REST API method's ``TimeoutInMillis`` may lower it)."""
COLD_START_S = 4
"""The cold start a synchronous route must leave room for: a Python 3.12 function with dormant's layers
initializes in about 1 s at 512 MB (docs/benchmarks.md, "Cold start": its imports cost about 1.3x boto3's, 144-211
ms of CPU); at 128 MB (``tools``, ``commit``: ``infra.functions``), if Lambda throttles init as it does invocations
(7% of a vCPU), about 3 s. 4 s covers that, a layer fetched cold and a first TLS handshake. Init does not count
against the function's timeout, but it does against API Gateway's."""


@dataclass(frozen=True)
class Breach:
    rule: str
    where: str
    value: float
    limit: float

    def __str__(self) -> str:
        return f"{self.rule}: {self.where} at {self.value:g}, over {self.limit:g}"


@dataclass(frozen=True)
class Deployment:
    """What CloudFormation fills in: names it generates are ``{stack}-{logical id}-{12 characters}``, cut to
    the resource's own limit. The region is a long one, so a size measured here holds in the others."""

    stack: str = "Dormant"
    region: str = "ap-southeast-2"
    account: str = "123456789012"
    partition: str = "aws"
    api_id: str = "a1b2c3d4e5"

    def generated(self, logical: str, limit: int = 64) -> str:
        suffix = "-ABCDEFGH1234"
        return f"{self.stack}-{logical}"[: limit - len(suffix)] + suffix

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return (
            f"arn:{self.partition}:{service}:{self.region if region else ''}:{self.account if account else ''}:"
            f"{resource}"
        )


_NAME_LIMITS = {
    "AWS::Lambda::Function": 64,
    "AWS::IAM::Role": 64,
    "AWS::IAM::Policy": 128,
    "AWS::SQS::Queue": 80,
    "AWS::StepFunctions::StateMachine": 80,
    "AWS::Lambda::Permission": 100,
}
_NAME_PROPERTY = {
    "AWS::Lambda::Function": "FunctionName",
    "AWS::IAM::Role": "RoleName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::StepFunctions::StateMachine": "StateMachineName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::SQS::Queue": "QueueName",
}


class Resolver:
    """CloudFormation values as AWS would hold them, for one template and ``Deployment``."""

    def __init__(self, template: Mapping[str, Any], deployment: Deployment) -> None:
        self.resources: Mapping[str, Any] = template.get("Resources", {})
        self.parameters: Mapping[str, Any] = template.get("Parameters", {})
        self.d = deployment

    def name(self, logical: str) -> str:
        resource = self.resources[logical]
        kind, props = resource["Type"], resource.get("Properties", {})
        key = _NAME_PROPERTY.get(kind)
        if key is not None and key in props:
            return self.text(props[key])
        return self.d.generated(logical, _NAME_LIMITS.get(kind, 64))

    def ref(self, logical: str) -> str:
        pseudo = {
            "AWS::Partition": self.d.partition,
            "AWS::Region": self.d.region,
            "AWS::AccountId": self.d.account,
            "AWS::StackName": self.d.stack,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": "",
        }
        if logical in pseudo:
            return pseudo[logical]
        if logical in self.parameters:
            return str(self.parameters[logical].get("Default", "x" * 32))
        kind = self.resources[logical]["Type"]
        if kind == "AWS::ApiGateway::RestApi":
            return self.d.api_id
        if kind == "AWS::ApiGateway::Stage":
            return self.text(self.resources[logical]["Properties"]["StageName"])
        if kind in ("AWS::StepFunctions::StateMachine", "AWS::SecretsManager::Secret", "AWS::Lambda::LayerVersion"):
            return self.get_att(logical, "Arn")
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{self.d.region}.amazonaws.com/{self.d.account}/{self.name(logical)}"
        return self.name(logical)

    def get_att(self, logical: str, attribute: str) -> str:
        kind = self.resources[logical]["Type"]
        name = self.name(logical)
        if attribute != "Arn":
            return name
        d = self.d
        arns = {
            "AWS::Lambda::Function": lambda: d.arn("lambda", f"function:{name}"),
            "AWS::IAM::Role": lambda: d.arn("iam", f"role/{name}", region=False),
            "AWS::DynamoDB::Table": lambda: d.arn("dynamodb", f"table/{name}"),
            "AWS::SQS::Queue": lambda: d.arn("sqs", name),
            "AWS::Logs::LogGroup": lambda: d.arn("logs", f"log-group:{name}:*"),
            "AWS::StepFunctions::StateMachine": lambda: d.arn("states", f"stateMachine:{name}"),
            "AWS::SecretsManager::Secret": lambda: d.arn("secretsmanager", f"secret:{name}-AbCdEf"),
            "AWS::Lambda::LayerVersion": lambda: d.arn("lambda", f"layer:{name}:1"),
            "AWS::Cognito::UserPool": lambda: d.arn("cognito-idp", f"userpool/{d.region}_AbCdEfGhI"),
        }
        service = kind.split("::")[1].lower()
        return arns.get(kind, lambda: d.arn(service, name))()

    def text(self, value: Any) -> str:
        """A CloudFormation string value, resolved."""
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, bool)):
            return json.dumps(value)
        if not isinstance(value, dict) or len(value) != 1:
            raise ValueError(f"not a CloudFormation string: {value!r}")
        ((function, args),) = value.items()
        if function == "Ref":
            return self.ref(args)
        if function == "Fn::GetAtt":
            logical, attribute = args if isinstance(args, list) else args.split(".", 1)
            return self.get_att(logical, attribute)
        if function == "Fn::Join":
            separator, parts = args
            return str(separator).join(self.text(part) for part in parts)
        if function == "Fn::Select":
            index, items = args
            return self.list(items)[int(index)]
        if function == "Fn::Sub":
            pattern, names = (args, {}) if isinstance(args, str) else args
            return re.sub(
                r"\$\{([^}!]+)\}",
                lambda m: (
                    self.text(names[m[1]])
                    if m[1] in names
                    else (self.get_att(*m[1].split(".", 1)) if "." in m[1] else self.ref(m[1]))
                ),
                pattern,
            )
        if function == "Fn::If":
            return self.text(args[1])
        if function == "Fn::ImportValue":
            return "x" * 64
        raise ValueError(f"cannot resolve {function}")

    def list(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return [self.text(v) for v in value]
        if isinstance(value, dict) and "Fn::Split" in value:
            separator, source = value["Fn::Split"]
            return self.text(source).split(separator)
        if isinstance(value, dict) and "Fn::GetAZs" in value:
            return [f"{self.d.region}{z}" for z in "abc"]
        raise ValueError(f"not a CloudFormation list: {value!r}")

    def document(self, value: Any) -> Any:
        """A JSON document (a policy, a map of variables) with every intrinsic resolved."""
        if isinstance(value, list):
            return [self.document(v) for v in value]
        if isinstance(value, dict):
            if len(value) == 1 and (next(iter(value)) == "Ref" or next(iter(value)).startswith("Fn::")):
                return self.text(value)
            return {k: self.document(v) for k, v in value.items()}
        return value


def _of_type(template: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {key: r for key, r in template.get("Resources", {}).items() if r["Type"] == kind}


def _target(value: Any) -> str | None:
    """The logical id a ``Ref``/``Fn::GetAtt`` of a resource names (``None``: a literal)."""
    if isinstance(value, dict) and "Ref" in value:
        return str(value["Ref"])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        args = value["Fn::GetAtt"]
        return str(args[0] if isinstance(args, list) else args.split(".")[0])
    return None


def _compact(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"))


# -- Lambda resource policies -----------------------------------------------------------------------------------


def resource_policies(
    template: Mapping[str, Any], deployment: Deployment = Deployment()
) -> dict[str, list[dict[str, Any]]]:
    """Function logical id -> the statements its ``AWS::Lambda::Permission``s add to its resource policy, as
    Lambda stores them (``aws lambda get-policy``): the statement id is the permission's generated name."""
    resolve = Resolver(template, deployment)
    statements: dict[str, list[dict[str, Any]]] = {}
    for logical, permission in sorted(_of_type(template, "AWS::Lambda::Permission").items()):
        props = permission["Properties"]
        function = _target(props["FunctionName"])
        if function is None:
            continue
        principal = resolve.text(props["Principal"])
        statement: dict[str, Any] = {
            "Sid": resolve.name(logical),
            "Effect": "Allow",
            "Principal": {"Service": principal} if principal.endswith(".amazonaws.com") else {"AWS": principal},
            "Action": resolve.text(props["Action"]),
            "Resource": resolve.get_att(function, "Arn"),
        }
        condition: dict[str, Any] = {}
        if "SourceAccount" in props:
            condition["StringEquals"] = {"AWS:SourceAccount": resolve.text(props["SourceAccount"])}
        if "SourceArn" in props:
            condition["ArnLike"] = {"AWS:SourceArn": resolve.text(props["SourceArn"])}
        if condition:
            statement["Condition"] = condition
        statements.setdefault(function, []).append(statement)
    return statements


def policy_bytes(statements: list[dict[str, Any]]) -> int:
    return len(_compact({"Version": "2012-10-17", "Id": "default", "Statement": statements}).encode())


def statements_per_route(template: Mapping[str, Any]) -> int:
    """What one more route adds to its function's policy: its method, the machine clients' twin under
    ``/clients``, with CORS an ``OPTIONS`` on its path, each twice when the console's test-invoke is allowed."""
    sources = [
        json.dumps(p["Properties"].get("SourceArn", "")) for p in _of_type(template, "AWS::Lambda::Permission").values()
    ]
    per_method = 2 if any("test-invoke-stage" in s for s in sources) else 1
    options = any("/OPTIONS/" in s for s in sources)
    return (2 + options) * per_method


def check_resource_policies(template: Mapping[str, Any], deployment: Deployment = Deployment()) -> list[Breach]:
    """Each function's resource policy, with ``ROUTE_HEADROOM`` more routes' statements, within Lambda's size."""
    per_route = statements_per_route(template)
    breaches = []
    for function, statements in resource_policies(template, deployment).items():
        largest = max(len(_compact(s).encode()) + 1 for s in statements)
        size = policy_bytes(statements) + ROUTE_HEADROOM * per_route * largest
        if size > RESOURCE_POLICY_BYTES:
            breaches.append(Breach("resource policy (with room for 4 routes)", function, size, RESOURCE_POLICY_BYTES))
    return breaches


# -- IAM and the environment ------------------------------------------------------------------------------------


def inline_policy_chars(template: Mapping[str, Any], deployment: Deployment = Deployment()) -> dict[str, int]:
    """Role logical id -> its inline policies' characters, whitespace not counted: the role's own ``Policies``
    and every ``AWS::IAM::Policy`` attached to it."""
    resolve = Resolver(template, deployment)
    documents: dict[str, list[Any]] = {
        role: [p["PolicyDocument"] for p in r.get("Properties", {}).get("Policies", [])]
        for role, r in _of_type(template, "AWS::IAM::Role").items()
    }
    for policy in _of_type(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"].get("Roles", []):
            target = _target(role)
            if target in documents:
                documents[target].append(policy["Properties"]["PolicyDocument"])
    return {
        role: sum(len(re.sub(r"\s", "", _compact(resolve.document(doc)))) for doc in docs)
        for role, docs in documents.items()
    }


def check_roles(template: Mapping[str, Any], deployment: Deployment = Deployment()) -> list[Breach]:
    breaches = [
        Breach("role inline policies", role, chars, ROLE_INLINE_CHARS)
        for role, chars in inline_policy_chars(template, deployment).items()
        if chars > ROLE_INLINE_CHARS
    ]
    resolve = Resolver(template, deployment)
    for logical, policy in _of_type(template, "AWS::IAM::ManagedPolicy").items():
        chars = len(re.sub(r"\s", "", _compact(resolve.document(policy["Properties"]["PolicyDocument"]))))
        if chars > MANAGED_POLICY_CHARS:
            breaches.append(Breach("managed policy", logical, chars, MANAGED_POLICY_CHARS))
    return breaches


def environment_bytes(template: Mapping[str, Any], deployment: Deployment = Deployment()) -> dict[str, int]:
    """Function logical id -> its environment variables' size as Lambda counts it (the JSON of the map)."""
    resolve = Resolver(template, deployment)
    return {
        logical: len(_compact(resolve.document(r["Properties"].get("Environment", {}).get("Variables", {}))).encode())
        for logical, r in _of_type(template, "AWS::Lambda::Function").items()
    }


def check_environments(template: Mapping[str, Any], deployment: Deployment = Deployment()) -> list[Breach]:
    return [
        Breach("environment", function, size, ENVIRONMENT_BYTES)
        for function, size in environment_bytes(template, deployment).items()
        if size > ENVIRONMENT_BYTES
    ]


# -- the stack and its assets -----------------------------------------------------------------------------------


def check_stack(template: Mapping[str, Any]) -> list[Breach]:
    """At most ``RESOURCES`` resources; the template, as ``cdk synth`` writes it, within ``TEMPLATE_BYTES``."""
    breaches = []
    count = len(template.get("Resources", {}))
    if count > RESOURCES:
        breaches.append(Breach("resources", "stack", count, RESOURCES))
    size = len(json.dumps(template, indent=1).encode())
    if size > TEMPLATE_BYTES:
        breaches.append(Breach("template size", "stack", size, TEMPLATE_BYTES))
    return breaches


def _tree_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def unzipped_bytes(template: Mapping[str, Any], assets: Path) -> dict[str, int]:
    """Function logical id -> its code and its layers, unzipped, from the assets ``cdk synth`` staged in
    ``assets`` (cdk.out; each resource's ``aws:asset:path``)."""
    resources = template.get("Resources", {})

    def size(logical: str) -> int:
        path = resources[logical].get("Metadata", {}).get("aws:asset:path")
        return _tree_bytes(assets / path) if path else 0

    return {
        logical: size(logical) + sum(size(t) for t in map(_target, r["Properties"].get("Layers", [])) if t)
        for logical, r in _of_type(template, "AWS::Lambda::Function").items()
    }


def check_assets(template: Mapping[str, Any], assets: Path) -> list[Breach]:
    return [
        Breach("code and layers unzipped", function, size, UNZIPPED_BYTES)
        for function, size in unzipped_bytes(template, assets).items()
        if size > UNZIPPED_BYTES
    ]


# -- concurrency -------------------------------------------------------------------------------------------------


def reserved_concurrency(template: Mapping[str, Any]) -> dict[str, int]:
    return {
        logical: int(r["Properties"]["ReservedConcurrentExecutions"])
        for logical, r in _of_type(template, "AWS::Lambda::Function").items()
        if "ReservedConcurrentExecutions" in r["Properties"]
    }


def check_concurrency(template: Mapping[str, Any], account_concurrency: int | None) -> list[Breach]:
    """With no account limit declared, nothing reserved (a deploy must not fail on an account whose limit is
    unknown, new accounts start at 10); with one, at least ``UNRESERVED_MINIMUM`` left unreserved."""
    total = sum(reserved_concurrency(template).values())
    if account_concurrency is None:
        return [Breach("reserved concurrency with no account_concurrency declared", "stack", total, 0)] if total else []
    left = account_concurrency - total
    if left < UNRESERVED_MINIMUM:
        return [Breach("reserved concurrency", "stack", total, account_concurrency - UNRESERVED_MINIMUM)]
    return []


# -- the timeout chain -------------------------------------------------------------------------------------------


def _function_timeouts(template: Mapping[str, Any]) -> dict[str, int]:
    return {
        logical: int(r["Properties"].get("Timeout", 3))
        for logical, r in _of_type(template, "AWS::Lambda::Function").items()
    }


def _functions_in(value: Any) -> list[str]:
    found = _target(value)
    if found is not None:
        return [found]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _functions_in(v)]
    if isinstance(value, list):
        return [f for v in value for f in _functions_in(v)]
    return []


def state_machine_tasks(template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``machine/state`` -> a Lambda task's ``TimeoutSeconds`` (``None``: unset), the function it invokes (its
    logical id) and whether it waits for a task token."""
    tasks = {}
    functions = _of_type(template, "AWS::Lambda::Function")
    for machine, r in _of_type(template, "AWS::StepFunctions::StateMachine").items():
        definition = r["Properties"].get("DefinitionString") or r["Properties"].get("Definition")
        text = definition if isinstance(definition, str) else _placeholders(definition)
        states = _all_states(json.loads(text) if isinstance(text, str) else text)
        for name, state in states.items():
            resource = str(state.get("Resource", ""))
            if state.get("Type") != "Task" or ":lambda:invoke" not in resource:
                continue
            target = str(state.get("Parameters", {}).get("FunctionName", ""))
            function = next((f for f in functions if f"<{f}>" in target), None)
            timeout = state.get("TimeoutSeconds")
            tasks[f"{machine}/{name}"] = {
                "timeout": timeout if isinstance(timeout, int) or timeout is None else str(timeout),
                "function": function,
                "token": resource.endswith(".waitForTaskToken"),
            }
    return tasks


def _placeholders(value: Any) -> str:
    """A ``Fn::Join`` definition as text, each reference written ``<logical id>`` (outside a string, quoted)."""
    if isinstance(value, str):
        return value
    if "Fn::Join" not in value:
        raise ValueError(f"cannot read {value!r}")
    separator, parts = value["Fn::Join"]
    text = ""
    for i, part in enumerate(parts):
        text += str(separator) if i else ""
        target = _target(part)
        if isinstance(part, str):
            text += part
        elif target is not None:
            inside = len(re.findall(r'(?<!\\)"', text)) % 2 == 1
            text += f"<{target}>" if inside else json.dumps(f"<{target}>")
        else:
            raise ValueError(f"cannot read {part!r}")
    return text


def _all_states(definition: Mapping[str, Any]) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for name, state in definition.get("States", {}).items():
        states[name] = state
        for branch in [*state.get("Branches", []), *([state["Iterator"]] if "Iterator" in state else [])]:
            states.update(_all_states(branch))
        if "ItemProcessor" in state:
            states.update(_all_states(state["ItemProcessor"]))
    return states


def api_functions(template: Mapping[str, Any]) -> dict[str, int]:
    """Function logical id -> the shortest integration timeout (s) of the API methods that call it."""
    found: dict[str, int] = {}
    functions = _of_type(template, "AWS::Lambda::Function")
    for method in _of_type(template, "AWS::ApiGateway::Method").values():
        integration = method["Properties"].get("Integration", {})
        if integration.get("Type") not in ("AWS_PROXY", "AWS"):
            continue
        timeout = int(integration.get("TimeoutInMillis", INTEGRATION_TIMEOUT_S * 1000)) // 1000
        for function in _functions_in(integration.get("Uri")):
            if function not in functions:
                continue
            found[function] = min(found.get(function, timeout), timeout)
    return found


def check_timeouts(template: Mapping[str, Any], long_poll_s: float, margin_s: float) -> list[Breach]:
    """A synchronous route's function ends (every wait it holds is capped by its own deadline) and a cold start
    fits before API Gateway gives up; a long-poll of ``long_poll_s``, held until ``margin_s`` before the
    function's deadline, still holds at least half of it (less, and long-polls turn into polls); a Lambda task
    waits longer than its function can run (else a retry starts while the first attempt still runs)."""
    timeouts = _function_timeouts(template)
    breaches = []
    for function, gateway in api_functions(template).items():
        if timeouts[function] + COLD_START_S >= gateway:
            breaches.append(
                Breach(
                    f"function timeout + {COLD_START_S} s cold start",
                    function,
                    timeouts[function] + COLD_START_S,
                    gateway,
                )
            )
        held = min(long_poll_s, timeouts[function] - margin_s)  # the handler's cap: its remaining time - margin
        if held < long_poll_s / 2:
            breaches.append(Breach("long-poll held (under half the wait asked)", function, held, long_poll_s / 2))
    for task, found in state_machine_tasks(template).items():
        if found["token"] or found["function"] is None:
            continue
        timeout = found["timeout"]
        if not isinstance(timeout, int) or timeout <= timeouts[found["function"]]:
            value = timeout if isinstance(timeout, int) else float("inf")
            breaches.append(
                Breach("task timeout (must outlast its function)", task, value, timeouts[found["function"]])
            )
    return breaches


# -- all of them -------------------------------------------------------------------------------------------------


def check(
    template: Mapping[str, Any],
    *,
    assets: Path | None,
    account_concurrency: int | None,
    long_poll_s: float,
    margin_s: float,
    deployment: Deployment = Deployment(),
) -> list[Breach]:
    """Every rule's breaches (none: the template is within every limit checked here)."""
    found: Iterable[Breach] = [
        *check_resource_policies(template, deployment),
        *check_roles(template, deployment),
        *check_environments(template, deployment),
        *check_stack(template),
        *(check_assets(template, assets) if assets is not None else []),
        *check_concurrency(template, account_concurrency),
        *check_timeouts(template, long_poll_s, margin_s),
    ]
    return list(found)


def main(argv: list[str]) -> int:
    """``python -m infra.limits CDK_OUT [ACCOUNT_CONCURRENCY]``: each breach on a line; exit 1 if any."""
    from dormant.serving.api import MAX_WAIT_SECONDS
    from dormant.serving.http.waits import WAIT_MARGIN

    outdir = Path(argv[0] if argv else "cdk.out")
    breaches = []
    for path in sorted(outdir.glob("*.template.json")):
        template = json.loads(path.read_text())
        concurrency = int(argv[1]) if len(argv) > 1 else None
        breaches += check(
            template, assets=outdir, account_concurrency=concurrency, long_poll_s=MAX_WAIT_SECONDS, margin_s=WAIT_MARGIN
        )
    for breach in breaches:
        print(breach)
    return 1 if breaches else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
