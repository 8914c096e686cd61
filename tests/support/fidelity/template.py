"""The synthesized template read back as a deployment: functions, roles, routes, the machine, the table.

Every CloudFormation reference is resolved to a concrete fake value chosen once (``Names``), the way a
deployed stack would have real ones: the table's name and ARN, the state machine's ARN, each function's
name and ARN. A function's environment, its policies and the state machine's ASL then hold the same
values, so a reference that points at the wrong thing shows as a wrong value, not as a placeholder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGION = "eu-west-1"
ACCOUNT = "123456789012"
PARTITION = "aws"
ROOT = Path(__file__).resolve().parents[3]


class Unresolvable(ValueError):
    """A reference the harness cannot give a value to (a resource type it does not know)."""


@dataclass
class Names:
    """The concrete values references resolve to. ``table_names`` etc. are filled per logical id."""

    stack: str = "Dormant"
    parameters: dict[str, Any] = field(default_factory=dict)
    table_name: str = "dormant-sessions"

    def physical(self, logical: str) -> str:
        """The physical name of a resource CloudFormation would name (``Stack-Logical``), kept short."""
        return f"{self.stack}-{logical}"[:64]


class Template:
    """A synthesized template, with ``resolve`` for any value in it."""

    def __init__(self, template: dict[str, Any], names: Names, outdir: Path | None = None) -> None:
        self.raw = template
        self.names = names
        self.outdir = outdir
        self.resources: dict[str, dict[str, Any]] = template.get("Resources", {})
        self.parameters: dict[str, dict[str, Any]] = template.get("Parameters", {})

    # -- references ---------------------------------------------------------------------------------------

    def parameter(self, name: str) -> Any:
        if name in self.names.parameters:
            return self.names.parameters[name]
        spec = self.parameters[name]
        if "Default" not in spec:
            raise Unresolvable(f"parameter {name} has no default and no value was given")
        return spec["Default"]

    def ref(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": PARTITION,
            "AWS::StackName": self.names.stack,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/{self.names.stack}/0",
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameter(name)
        resource = self.resources.get(name)
        if resource is None:
            raise Unresolvable(f"Ref to unknown {name}")
        kind = resource["Type"]
        if kind == "AWS::DynamoDB::Table":
            return self.table_name(name)
        if kind == "AWS::StepFunctions::StateMachine":
            return self.state_machine_arn(name)
        if kind == "AWS::Lambda::LayerVersion":
            return f"arn:{PARTITION}:lambda:{REGION}:{ACCOUNT}:layer:{name}:1"
        if kind == "AWS::SecretsManager::Secret":  # Ref is the ARN, with the six characters AWS appends
            return f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:{self.physical_name(name)}-AbCdEf"
        # Functions, roles, log groups, APIs and the rest: Ref is the physical name (or an id).
        return self.physical_name(name)

    def get_att(self, name: str, attribute: str) -> Any:
        resource = self.resources.get(name)
        if resource is None:
            raise Unresolvable(f"GetAtt on unknown {name}")
        kind = resource["Type"]
        if kind == "AWS::DynamoDB::Table" and attribute == "Arn":
            return self.table_arn(name)
        if kind == "AWS::DynamoDB::Table" and attribute == "StreamArn":
            return f"{self.table_arn(name)}/stream/1970-01-01T00:00:00.000"
        if kind == "AWS::Lambda::Function" and attribute == "Arn":
            return self.function_arn(name)
        if kind == "AWS::IAM::Role" and attribute == "Arn":
            return f"arn:{PARTITION}:iam::{ACCOUNT}:role/{self.physical_name(name)}"
        if kind == "AWS::Logs::LogGroup" and attribute == "Arn":
            return f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:{self.physical_name(name)}:*"
        if kind == "AWS::StepFunctions::StateMachine" and attribute == "Arn":
            return self.state_machine_arn(name)
        if kind == "AWS::StepFunctions::StateMachine" and attribute == "Name":
            return self.state_machine_arn(name).rsplit(":", 1)[1]
        if kind == "AWS::SQS::Queue" and attribute == "Arn":  # the sweeper's queue of failed sweeps
            return f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{self.physical_name(name)}"
        if kind == "AWS::SQS::Queue" and attribute == "QueueName":  # its alarm's dimension
            return self.physical_name(name)
        if kind == "AWS::ApiGateway::RestApi" and attribute == "RootResourceId":
            return f"{name}-root"
        if kind == "AWS::Cognito::UserPool" and attribute in ("Arn", "ProviderName", "ProviderURL"):
            return f"arn:{PARTITION}:cognito-idp:{REGION}:{ACCOUNT}:userpool/{REGION}_{name[:9]}"
        raise Unresolvable(f"GetAtt {name}.{attribute} ({kind})")

    def physical_name(self, logical: str) -> str:
        properties = self.resources.get(logical, {}).get("Properties", {})
        for key in ("FunctionName", "RoleName", "LogGroupName", "StateMachineName", "TableName"):
            if isinstance(properties.get(key), str):
                return str(properties[key])
        return self.names.physical(logical)

    def table_name(self, logical: str) -> str:
        explicit = self.resources[logical].get("Properties", {}).get("TableName")
        return str(self.resolve(explicit)) if explicit is not None else self.names.table_name

    def table_arn(self, logical: str) -> str:
        return f"arn:{PARTITION}:dynamodb:{REGION}:{ACCOUNT}:table/{self.table_name(logical)}"

    def function_arn(self, logical: str) -> str:
        return f"arn:{PARTITION}:lambda:{REGION}:{ACCOUNT}:function:{self.physical_name(logical)}"

    def state_machine_arn(self, logical: str) -> str:
        name = self.resources[logical].get("Properties", {}).get("StateMachineName")
        name = str(self.resolve(name)) if name is not None else self.names.physical(logical)
        return f"arn:{PARTITION}:states:{REGION}:{ACCOUNT}:stateMachine:{name}"

    def resolve(self, value: Any) -> Any:
        """``value`` with every intrinsic function replaced by its value."""
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Fn::GetAtt":
                parts = arg.split(".", 1) if isinstance(arg, str) else arg
                return self.get_att(parts[0], parts[1])
            if key == "Fn::Join":
                separator, items = arg
                return str(separator).join(_text(self.resolve(i)) for i in self.resolve(items))
            if key == "Fn::Sub":
                return self._sub(arg)
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                separator, text = arg
                return str(self.resolve(text)).split(separator)
            if key == "Fn::If":
                raise Unresolvable("Fn::If (conditions are not modelled)")
        return {k: self.resolve(v) for k, v in value.items()}

    def _sub(self, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        resolved = {k: self.resolve(v) for k, v in variables.items()}

        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in resolved:
                return _text(resolved[name])
            if "." in name:
                logical, attribute = name.split(".", 1)
                return _text(self.get_att(logical, attribute))
            return _text(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", value, text)

    # -- the parts the harness runs ------------------------------------------------------------------------

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k: r for k, r in self.resources.items() if r["Type"] == kind}

    def functions(self) -> dict[str, Function]:
        """Each function by its ``functions/<name>`` name (from its construct path)."""
        found: dict[str, Function] = {}
        for logical, resource in self.of_type("AWS::Lambda::Function").items():
            path = resource.get("Metadata", {}).get("aws:cdk:path", "")
            match = re.fullmatch(r"[^/]+/Functions/([^/]+)/Function/Resource", path)
            if match is None:
                continue
            name = match.group(1).lower()
            props = resource["Properties"]
            role_logical = props["Role"]["Fn::GetAtt"][0]
            found[name] = Function(
                name=name,
                logical_id=logical,
                function_name=self.physical_name(logical),
                arn=self.function_arn(logical),
                handler=props.get("Handler", "app.handler"),
                timeout=float(self.resolve(props.get("Timeout", 3))),
                memory=int(self.resolve(props.get("MemorySize", 128))),
                environment={
                    k: _text(self.resolve(v)) for k, v in props.get("Environment", {}).get("Variables", {}).items()
                },
                code_dir=self._code_dir(resource, name),
                layers=[ref["Ref"] for ref in props.get("Layers", []) if isinstance(ref, dict) and "Ref" in ref],
                role=role_logical,
                statements=self.role_statements(role_logical),
            )
        return found

    def _code_dir(self, resource: dict[str, Any], name: str) -> Path:
        asset = resource.get("Metadata", {}).get("aws:asset:path")
        if asset and self.outdir is not None and (self.outdir / asset / "app.py").exists():
            return self.outdir / asset  # the staged copy CDK uploads
        return ROOT / "functions" / name

    def layer_source(self, logical: str) -> Path:
        return Path(self.resources[logical]["Metadata"]["aws:asset:path"])

    def role_statements(self, role_logical: str) -> list[dict[str, Any]]:
        """Every statement of the role: its inline policies and each ``AWS::IAM::Policy`` attached to it."""
        statements: list[dict[str, Any]] = []
        role = self.resources[role_logical]["Properties"]
        for policy in role.get("Policies", []):
            statements += _statements(self.resolve(policy["PolicyDocument"]))
        for policy in self.of_type("AWS::IAM::Policy").values():
            props = policy["Properties"]
            if {"Ref": role_logical} in props.get("Roles", []):
                statements += _statements(self.resolve(props["PolicyDocument"]))
        return statements

    def routes(self) -> list[tuple[str, str, str]]:
        """(HTTP method, resource path like ``/sessions/{id}``, function logical id) of each API method."""
        found = []
        for method in self.of_type("AWS::ApiGateway::Method").values():
            props = method["Properties"]
            uri = props.get("Integration", {}).get("Uri")
            target = _function_in(uri)
            if target is None:
                continue
            found.append((props["HttpMethod"], self._path_of(props["ResourceId"]), target))
        return found

    def method_scopes(self) -> dict[tuple[str, str], list[str]]:
        """(HTTP method, resource path) -> the method's ``AuthorizationScopes`` (``[]``: none, an ID token's method)."""
        return {
            (props["HttpMethod"], self._path_of(props["ResourceId"])): list(props.get("AuthorizationScopes") or [])
            for props in (m["Properties"] for m in self.of_type("AWS::ApiGateway::Method").values())
        }

    def open_routes(self) -> set[tuple[str, str]]:
        """(HTTP method, resource path) of each API method without an authorizer (``AuthorizationType: NONE``)."""
        return {
            (props["HttpMethod"], self._path_of(props["ResourceId"]))
            for props in (m["Properties"] for m in self.of_type("AWS::ApiGateway::Method").values())
            if props.get("AuthorizationType", "NONE") == "NONE"
        }

    def machine_clients(self) -> dict[str, tuple[str, list[str]]]:
        """Each machine's app client (one with a secret) by its ``ClientName`` (else its logical id): its client id
        and the scopes it may ask for (``AllowedOAuthScopes``)."""
        return {
            str(props.get("ClientName") or logical): (self.ref(logical), list(props.get("AllowedOAuthScopes") or []))
            for logical, props in (
                (logical, r["Properties"]) for logical, r in self.of_type("AWS::Cognito::UserPoolClient").items()
            )
            if props.get("GenerateSecret")
        }

    def people_client(self) -> str:
        """The client id of the people's app client (the one without a secret): an ID token's ``aud``."""
        (logical,) = [
            logical
            for logical, r in self.of_type("AWS::Cognito::UserPoolClient").items()
            if not r["Properties"].get("GenerateSecret")
        ]
        return str(self.ref(logical))

    def gateway_responses(self) -> dict[str, dict[str, Any]]:
        """The API's gateway responses by type (``DEFAULT_4XX``...): their ``ResponseParameters`` and templates."""
        return {
            r["Properties"]["ResponseType"]: self.resolve(r["Properties"])
            for r in self.of_type("AWS::ApiGateway::GatewayResponse").values()
        }

    def _path_of(self, resource_id: Any) -> str:
        if isinstance(resource_id, dict) and "Fn::GetAtt" in resource_id:
            return ""  # the API's root
        logical = resource_id["Ref"]
        props = self.resources[logical]["Properties"]
        return self._path_of(props["ParentId"]) + "/" + props["PathPart"]

    def state_machines(self) -> dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]]:
        """Each state machine by its name's last word (``sessions``, ``waits``): its ARN, its ASL with references
        resolved and its role's statements."""
        machines = {}
        for logical, machine in self.of_type("AWS::StepFunctions::StateMachine").items():
            arn = self.state_machine_arn(logical)
            definition = json.loads(self.resolve(machine["Properties"]["DefinitionString"]))
            role = self.role_statements(machine["Properties"]["RoleArn"]["Fn::GetAtt"][0])
            machines[arn.rsplit("-", 1)[-1]] = (arn, definition, role)
        return machines

    def state_machine(self, which: str = "sessions") -> tuple[str, dict[str, Any]]:
        """(ARN, the ASL with references resolved) of the ``sessions`` machine (or ``waits``)."""
        arn, definition, _ = self.state_machines()[which]
        return arn, definition

    def state_machine_role(self, which: str = "sessions") -> list[dict[str, Any]]:
        return self.state_machines()[which][2]

    def table(self) -> dict[str, Any]:
        """The ``CreateTable`` request for the only table, from its template definition."""
        ((logical, table),) = self.of_type("AWS::DynamoDB::Table").items()
        props = self.resolve(table["Properties"])
        request: dict[str, Any] = {
            "TableName": self.table_name(logical),
            "KeySchema": props["KeySchema"],
            "AttributeDefinitions": props["AttributeDefinitions"],
            "BillingMode": props.get("BillingMode", "PROVISIONED"),
        }
        for key in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
            if props.get(key):
                request[key] = [
                    {k: v for k, v in index.items() if k in ("IndexName", "KeySchema", "Projection")}
                    for index in props[key]
                ]
        return request


@dataclass
class Function:
    name: str
    logical_id: str
    function_name: str
    arn: str
    handler: str
    timeout: float
    memory: int
    environment: dict[str, str]
    code_dir: Path
    layers: list[str]
    role: str
    statements: list[dict[str, Any]]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    statements = document.get("Statement", [])
    return [statements] if isinstance(statements, dict) else list(statements)


def _function_in(value: Any) -> str | None:
    """The logical id of the function a (raw) integration URI names."""
    if isinstance(value, dict):
        attribute = value.get("Fn::GetAtt")
        if isinstance(attribute, list) and attribute[1:] == ["Arn"]:
            return str(attribute[0])
        for inner in value.values():
            found = _function_in(inner)
            if found:
                return found
    if isinstance(value, list):
        for inner in value:
            found = _function_in(inner)
            if found:
                return found
    return None
