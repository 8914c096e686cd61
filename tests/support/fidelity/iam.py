"""IAM as AWS applies it to a function's calls: which actions and resources a call needs, and whether the
function's policy statements grant them.

``required(service, operation, params)`` maps one API call to the (action, resource ARN) pairs AWS checks:

* DynamoDB transactions are authorized per item: ``TransactWriteItems`` needs ``PutItem``/``UpdateItem``/
  ``DeleteItem``/``ConditionCheckItem`` for each Put/Update/Delete/ConditionCheck, on that item's table;
  ``TransactGetItems`` needs ``GetItem`` per item (there is no ``dynamodb:TransactWriteItems`` action).
* ``BatchGetItem``/``BatchWriteItem`` are their own actions, checked on every table of the request.
* ``Query``/``Scan`` with ``IndexName`` are checked on ``table/NAME/index/INDEX``.
* Step Functions: ``StartExecution``/``ListExecutions`` on the state machine, ``DescribeExecution``/
  ``StopExecution``/``GetExecutionHistory`` on the execution ARN, and ``SendTask*`` on the state machine
  the token belongs to (``token_owner`` tells it; a token nobody issued is checked against ``*``).
* Secrets Manager: ``GetSecretValue`` (and the other secret calls) on the secret's ARN; a secret named without
  its ARN is checked as ``secret:NAME-??????`` would match it (AWS appends six characters). SSM:
  ``GetParameter(s)`` on ``parameter/NAME`` (each name of a ``GetParameters``).
* Bedrock: ``Converse``/``InvokeModel`` are ``bedrock:InvokeModel`` (the streaming ones
  ``bedrock:InvokeModelWithResponseStream``) on the model's ARN; through a system-defined inference profile,
  on the profile's ARN and on the foundation model in the region it routes to (here: this one).

``allowed(statements, action, resource)``: an explicit Deny wins, else some Allow must match (Action or
NotAction, Resource or NotResource, ``*`` and ``?`` wildcards, actions case-insensitively). Conditions
are not modelled: a statement with a Condition does not count as an Allow (and does count as a Deny).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

REGION = "eu-west-1"
ACCOUNT = "123456789012"

_DYNAMODB_ITEM = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_SFN_ON_EXECUTION = {"DescribeExecution", "StopExecution", "GetExecutionHistory", "RedriveExecution"}
_SFN_ON_MACHINE = {"StartExecution", "StartSyncExecution", "ListExecutions", "DescribeStateMachine"}
_SFN_TOKEN = {"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"}


def table_arn(name_or_arn: str, region: str = REGION, account: str = ACCOUNT) -> str:
    if name_or_arn.startswith("arn:"):
        return name_or_arn
    return f"arn:aws:dynamodb:{region}:{account}:table/{name_or_arn}"


def required(
    service: str,
    operation: str,
    params: dict[str, Any],
    *,
    region: str = REGION,
    account: str = ACCOUNT,
    token_owner: Callable[[str], str | None] | None = None,
) -> list[tuple[str, str]]:
    """The (IAM action, resource ARN) pairs AWS authorizes ``operation`` by; all must be allowed."""
    service = service.lower()
    if service == "dynamodb":
        return _dynamodb(operation, params, region, account)
    if service in ("sfn", "states", "stepfunctions"):
        if operation in _SFN_ON_MACHINE:
            return [(f"states:{operation}", str(params.get("stateMachineArn", "*")))]
        if operation in _SFN_ON_EXECUTION:
            return [(f"states:{operation}", str(params["executionArn"]))]
        if operation in _SFN_TOKEN:
            owner = token_owner(str(params.get("taskToken", ""))) if token_owner else None
            return [(f"states:{operation}", owner or "*")]
        return [(f"states:{operation}", "*")]
    if service == "secretsmanager":
        secret = str(params.get("SecretId", "*"))
        if secret != "*" and not secret.startswith("arn:"):
            secret = f"arn:aws:secretsmanager:{region}:{account}:secret:{secret}-AbCdEf"
        return [(f"secretsmanager:{operation}", secret)]
    if service == "ssm" and operation in ("GetParameter", "GetParameters"):
        names = [params["Name"]] if operation == "GetParameter" else list(params.get("Names", []))
        return [(f"ssm:{operation}", _parameter_arn(str(n), region, account)) for n in names]
    if service == "bedrock-runtime":
        action = "InvokeModelWithResponseStream" if "Stream" in operation else "InvokeModel"
        return [(f"bedrock:{action}", arn) for arn in model_arns(str(params.get("modelId", "*")), region, account)]
    return [(f"{service}:{operation}", "*")]


def _parameter_arn(name: str, region: str, account: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:ssm:{region}:{account}:parameter/{name.lstrip('/')}"


GEOGRAPHIES = ("us", "us-gov", "eu", "apac", "jp", "au", "ca", "global")


def model_arns(model_id: str, region: str = REGION, account: str = ACCOUNT) -> list[str]:
    """What a call to ``model_id`` is authorized on: the model, or the profile and the model it routes to."""
    if model_id.startswith("arn:"):
        kind, _, ident = model_id.split(":", 5)[-1].partition("/")
        if kind == "inference-profile":
            return [model_id, f"arn:aws:bedrock:{region}::foundation-model/{ident.partition('.')[2]}"]
        return [model_id]
    geography, _, model = model_id.partition(".")
    if geography in GEOGRAPHIES and "." in model:
        return [
            f"arn:aws:bedrock:{region}:{account}:inference-profile/{model_id}",
            f"arn:aws:bedrock:{region}::foundation-model/{model}",
        ]
    return [f"arn:aws:bedrock:{region}::foundation-model/{model_id}"]


def _dynamodb(operation: str, params: dict[str, Any], region: str, account: str) -> list[tuple[str, str]]:
    def arn(name: str) -> str:
        return table_arn(name, region, account)

    if operation == "TransactWriteItems":
        pairs = []
        for item in params.get("TransactItems", []):
            ((kind, body),) = item.items()
            pairs.append((f"dynamodb:{_DYNAMODB_ITEM[kind]}", arn(body["TableName"])))
        return pairs
    if operation == "TransactGetItems":
        return [("dynamodb:GetItem", arn(item["Get"]["TableName"])) for item in params.get("TransactItems", [])]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        return [(f"dynamodb:{operation}", arn(name)) for name in params.get("RequestItems", {})]
    if operation in ("Query", "Scan") and params.get("IndexName"):
        return [(f"dynamodb:{operation}", f"{arn(params['TableName'])}/index/{params['IndexName']}")]
    if "TableName" in params:
        return [(f"dynamodb:{operation}", arn(params["TableName"]))]
    return [(f"dynamodb:{operation}", "*")]


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _matches(pattern: str, value: str, *, case_sensitive: bool) -> bool:
    """IAM wildcard match: ``*`` any run of characters, ``?`` one character, nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _statement_matches(statement: dict[str, Any], action: str, resource: str) -> bool:
    if "Action" in statement:
        action_ok = any(_matches(p, action, case_sensitive=False) for p in _as_list(statement["Action"]))
    else:
        action_ok = not any(_matches(p, action, case_sensitive=False) for p in _as_list(statement.get("NotAction")))
    if not action_ok:
        return False
    if "Resource" in statement:
        return any(_matches(p, resource, case_sensitive=True) for p in _as_list(statement["Resource"]))
    return not any(_matches(p, resource, case_sensitive=True) for p in _as_list(statement.get("NotResource")))


def allowed(statements: list[dict[str, Any]], action: str, resource: str) -> bool:
    """Whether ``statements`` let ``action`` on ``resource``: no Deny matches, and an Allow does."""
    granted = False
    for statement in statements:
        if not _statement_matches(statement, action, resource):
            continue
        if statement.get("Effect") == "Deny":
            return False
        if statement.get("Effect") == "Allow" and not statement.get("Condition"):
            granted = True
    return granted


SERVICES = ("dynamodb", "states", "secretsmanager", "ssm", "bedrock")
"""The services whose grants the policy test holds to the calls made."""


def grants(statements: list[dict[str, Any]], services: tuple[str, ...] = SERVICES) -> set[tuple[str, str]]:
    """The (action, resource pattern) pairs the Allow statements name, for ``services`` (no wildcard
    actions expanded: a ``dynamodb:*`` grant is reported as such)."""
    found = set()
    for statement in statements:
        if statement.get("Effect") != "Allow" or "Action" not in statement:
            continue
        for action in _as_list(statement["Action"]):
            if action.split(":", 1)[0].lower() in services:
                found.update((action, resource) for resource in _as_list(statement.get("Resource")))
    return found


def grant_used(grant: tuple[str, str], calls: list[tuple[str, str]]) -> bool:
    """Whether some recorded (action, resource) is covered by ``grant`` (an action/resource pattern)."""
    action, resource = grant
    return any(
        _matches(action, a, case_sensitive=False) and _matches(resource, r, case_sensitive=True) for a, r in calls
    )


__all__ = ["SERVICES", "allowed", "grant_used", "grants", "model_arns", "required", "table_arn"]
