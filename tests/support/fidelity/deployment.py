"""The synthesized stack, deployed on this machine: API Gateway's routing and limits in front of the
function sandboxes, the Step Functions stand-in, and a table in DynamoDB Local made from the template.

``Deployment.start(...)`` synthesizes the CDK app (``app=``/``app_packages=`` context, parameter values),
creates the table from the template's own definition, starts the state machine's API and the functions'
sandboxes. Tests then only talk to it as a client would (``api``), or as AWS would (``invoke`` for a
scheduled event), and read what happened (``executions``, ``calls``, DynamoDB).

Callers carry a ``Token``: a person's ID token (``sub``, the tenant claim, ``cognito:groups``) or a machine
client's access token (``sub`` its client id, ``scope``), which ``machine_token`` gets as Cognito's token
endpoint gives it: only for an app client of the template, only with scopes that client is allowed. The Cognito
authorizer is played as API Gateway plays it, from each method's ``AuthorizationScopes`` in the template: a
method without scopes takes only an ID token, a method with scopes only an access token carrying one of them;
anything else is a 401 that never reaches the function. The claims reach the handler as the authorizer passes
them: strings (a list claim, ``cognito:groups``, comma-joined).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .capacity import Accountant, Capacity, TokenBucket, reserved_concurrency, stage_throttle
from .lambda_ import Call, Concurrency, LambdaService, scratch
from .stepfunctions import Execution, StepFunctions
from .template import ACCOUNT, REGION, ROOT, Names, Template

STACK = "Dormant"
INTEGRATION_TIMEOUT = 29.0
"""API Gateway REST's default integration timeout (seconds)."""
MAX_REQUEST_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Token:
    """A bearer token as the authorizer verified it: ``token_use`` ``id`` (a person) or ``access`` (a machine)."""

    sub: str
    token_use: str = "id"
    tenant: str | None = None
    groups: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    tenant_claim: str = "custom:tenant"
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def person(cls, sub: str, tenant: str | None = None, groups: Sequence[str] = ()) -> Token:
        return cls(sub, "id", tenant, tuple(groups))

    @classmethod
    def machine(cls, client_id: str, scopes: Sequence[str]) -> Token:
        """A client-credentials access token: its ``sub`` is the client id; it has no tenant claim, no groups."""
        return cls(client_id, "access", scopes=tuple(scopes))

    def claims(self) -> dict[str, str]:
        if self.token_use == "access":
            claims = {"sub": self.sub, "client_id": self.sub, "token_use": "access", "scope": " ".join(self.scopes)}
        else:
            claims = {"sub": self.sub, "token_use": "id", "cognito:username": self.sub, "email": "x@example.com"}
            if self.tenant is not None:
                claims[self.tenant_claim] = self.tenant
            if self.groups:
                claims["cognito:groups"] = ",".join(self.groups)
        return {**claims, **self.extra}

    def admitted(self, scopes: Sequence[str]) -> bool:
        """Whether the Cognito authorizer lets this token through a method with ``scopes``."""
        if not scopes:
            return self.token_use == "id"
        return self.token_use == "access" and bool(set(scopes) & set(self.scopes))


def synthesize(outdir: Path, context: dict[str, str]) -> dict[str, Any]:
    """The stack's template, as the template tests build it (CDK validation and cdk-nag), with extra context."""
    from tests.support.cdk_template import synthesize as synthesized

    return synthesized(outdir, context).template


class Deployment:
    """A running deployment of the template (see the module docstring)."""

    def __init__(
        self,
        template: Template,
        *,
        dynamodb_endpoint: str,
        app_packages: list[Path],
        time_scale: float = 0.01,
        workdir: Path | None = None,
        endpoints: dict[str, str] | None = None,
        timeouts: dict[str, float] | None = None,
        capacity: Capacity | None = None,
    ) -> None:
        self.template = template
        self.workdir = workdir or scratch()
        self.functions = template.functions()
        for name, seconds in (timeouts or {}).items():  # as if deployed with another timeout
            self.functions[name].timeout = seconds
        machines = template.state_machines()
        self.machine_arn, self.definition, _ = machines["sessions"]
        self.wait_machine_arn, self.wait_definition, _ = machines["waits"]
        self.table_name = template.table()["TableName"]
        self.dynamodb_endpoint = dynamodb_endpoint
        self._create_table()
        self.sfn = StepFunctions(self._invoke_for_states, time_scale=time_scale)
        for arn, definition, role in machines.values():  # the sessions machine (Run first) and the waits (Park)
            self.sfn.create_state_machine(arn, definition, role)
        self.accountant: Accountant | None = None
        """With ``capacity``: the ledger of AWS's capacity (throttles, units per partition), ``capacity.py``."""
        self._stage_bucket: TokenBucket | None = None
        concurrency, capacity_config = None, None
        if capacity is not None:
            self.accountant = Accountant(capacity)
            self.sfn.accountant = self.accountant
            reserved = reserved_concurrency(template, self.functions)
            concurrency = Concurrency(reserved, capacity.account_concurrency - sum(reserved.values()), self.accountant)
            capacity_config = {
                "capacity_url": self.accountant.serve(),
                "units_file": str(ROOT / "bench" / "units.py"),
                "tables": [template.table()],
            }
            throttle = stage_throttle(template)
            if throttle is not None:
                rate, burst = throttle
                self._stage_bucket = TokenBucket(burst * capacity.rate_scale, rate * capacity.rate_scale)
        stand_ins = {
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint,
            "AWS_ENDPOINT_URL_SFN": self.sfn.serve(),
            **(endpoints or {}),
        }
        self.lambdas = LambdaService(
            self.functions,
            self._layers(app_packages),
            stand_ins,
            self.workdir,
            concurrency=concurrency,
            capacity_config=capacity_config,
        )
        self.routes = {
            (method, path): self._function_by_logical(logical) for method, path, logical in template.routes()
        }
        self.scopes = template.method_scopes()
        self.open_routes = template.open_routes()
        self.gateway_responses = template.gateway_responses()
        self.machine_clients = template.machine_clients()
        self.people_client = template.people_client()
        # requests in flight at once: with capacity enforced, enough to meet the functions' caps (each is a process)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16 if capacity is None else 64)

    @classmethod
    def start(
        cls,
        *,
        dynamodb_endpoint: str,
        app: str | None = None,
        app_packages: list[str] | None = None,
        parameters: dict[str, Any] | None = None,
        time_scale: float = 0.01,
        context: dict[str, str] | None = None,
        endpoints: dict[str, str] | None = None,
        timeouts: dict[str, float] | None = None,
        capacity: Capacity | None = None,
    ) -> Deployment:
        """``context``: more CDK context (``cors_origins``, ``model=``...); ``endpoints``: more stand-ins the
        functions reach (``AWS_ENDPOINT_URL_<SERVICE>``); ``timeouts``: function -> seconds, as if deployed with
        that timeout; ``capacity``: AWS's capacity enforced (``capacity.py``; none by default)."""
        workdir = scratch()
        context = dict(context or {})
        if app:
            context["app"] = app
        if app_packages:
            context["app_packages"] = ",".join(app_packages)
        raw = synthesize(workdir / "cdk.out", context)
        names = Names(stack=STACK, parameters=dict(parameters or {}), table_name=f"fidelity-{uuid.uuid4().hex[:10]}")
        packages = [ROOT / p for p in (app_packages or ["samples/bookings"])]
        template = Template(raw, names, workdir / "cdk.out")
        return cls(
            template,
            dynamodb_endpoint=dynamodb_endpoint,
            app_packages=packages,
            time_scale=time_scale,
            workdir=workdir,
            endpoints=endpoints,
            timeouts=timeouts,
            capacity=capacity,
        )

    # -- setup -------------------------------------------------------------------------------------------------

    def _function_by_logical(self, logical: str) -> str:
        return next(name for name, f in self.functions.items() if f.logical_id == logical)

    def _layers(self, app_packages: list[Path]) -> dict[str, Path]:
        """Each layer's ``/opt/python``: the library's ``python`` dir; the app layer made of its packages."""
        dirs = {}
        for logical in self.template.of_type("AWS::Lambda::LayerVersion"):
            source = self.template.layer_source(logical)
            if (source / "python").is_dir():
                dirs[logical] = source / "python"
                continue
            target = self.workdir / "layers" / logical / "python"
            target.mkdir(parents=True)
            for package in app_packages:
                (target / package.name).symlink_to(package, target_is_directory=True)
            dirs[logical] = target
        return dirs

    def ddb(self) -> Any:
        import boto3

        return boto3.client(
            "dynamodb",
            endpoint_url=self.dynamodb_endpoint,
            region_name=REGION,
            aws_access_key_id="dormantlocal",
            aws_secret_access_key="dormantlocal",
        )

    def _create_table(self) -> None:
        client = self.ddb()
        client.create_table(**self.template.table())
        client.get_waiter("table_exists").wait(TableName=self.table_name)

    def update(self, parameters: dict[str, Any]) -> None:
        """A stack update with new parameter values: the state machine's definition is re-resolved (new
        executions use it, as on AWS). Parameters that reach a function's environment are refused here."""
        self.template.names.parameters.update(parameters)
        if any(f.environment != self.template.functions()[n].environment for n, f in self.functions.items()):
            raise ValueError(f"{sorted(parameters)} change a function's environment: start a new Deployment")
        machines = self.template.state_machines()
        self.machine_arn, self.definition, _ = machines["sessions"]
        self.wait_machine_arn, self.wait_definition, _ = machines["waits"]
        for arn, definition, role in machines.values():
            self.sfn.create_state_machine(arn, definition, role)

    def close(self) -> None:
        if self.accountant is not None:
            self.accountant.close()
        self.sfn.close()
        self.lambdas.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def machine_token(self, name: str, scopes: Sequence[str] | None = None) -> Token:
        """An access token of the app client ``name`` (``-c machine_clients``) by the client-credentials grant, for
        ``scopes`` (default: all it may ask for). A scope the client is not allowed is refused, as Cognito's token
        endpoint refuses it (``invalid_scope``): no token."""
        client_id, allowed = self.machine_clients[name]
        wanted = list(allowed if scopes is None else scopes)
        if not set(wanted) <= set(allowed):
            raise PermissionError(f"invalid_scope: {name} may ask for {allowed}, not {wanted}")
        return Token.machine(client_id, wanted)

    # -- AWS's side ----------------------------------------------------------------------------------------------

    def _invoke_for_states(self, function: str, payload: Any) -> tuple[bool, Any]:
        done = self.lambdas.invoke(function, payload)
        if done.throttled:  # Lambda's own refusal, as the Task state sees it
            return False, {"errorType": "Lambda.TooManyRequestsException", "errorMessage": done.error_message}
        return (True, done.payload) if done.ok else (False, done.error())

    def invoke(self, function: str, event: Any) -> tuple[bool, Any]:
        """Invoke a function as an AWS service would (EventBridge's schedule, a console test)."""
        done = self.lambdas.invoke(function, event)
        return (True, done.payload) if done.ok else (False, done.error())

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        tenant: str | None = "tenant-a",
        query: dict[str, str] | None = None,
        timeout: float = INTEGRATION_TIMEOUT,
        token: Token | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """A request through API Gateway: (status, headers, JSON body or None), as ``token``'s bearer (default: a
        person whose ``sub`` is ``tenant``, with no tenant claim: their own tenant; ``tenant=None``: no token). A
        method without an authorizer (a CORS preflight) is passed on without a caller; the gateway's own refusals
        are its gateway responses."""
        headers = headers or {}
        route = self._route(method, path)
        if route is None:
            return self._refused(403, "MISSING_AUTHENTICATION_TOKEN", "Missing Authentication Token", headers)
        resource, function, parameters = route
        open_route = (method, resource) in self.open_routes
        if token is None and tenant is not None:
            token = Token.person(tenant)
        if not open_route and (token is None or not token.admitted(self.scopes.get((method, resource), []))):
            return self._refused(401, "UNAUTHORIZED", "Unauthorized", headers)
        text = None if body is None else body if isinstance(body, str) else json.dumps(body)
        if text is not None and len(text.encode()) > MAX_REQUEST_BYTES:
            return self._refused(413, "REQUEST_TOO_LARGE", "Request Too Long", headers)
        if self._stage_bucket is not None and not self._stage_bucket.take():
            assert self.accountant is not None
            self.accountant.throttled("gateway", "stage")
            return self._refused(429, "THROTTLED", "Too Many Requests", headers)
        event = self._event(method, path, resource, parameters, text, headers, None if open_route else token, query)
        future = self._pool.submit(self.lambdas.invoke, function, event)
        try:
            done = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            return self._refused(504, "INTEGRATION_TIMEOUT", "Endpoint request timed out", headers)
        if done.throttled:  # a proxy integration's throttled function: API Gateway answers 500, not 429
            return self._refused(500, "DEFAULT_5XX", "Internal server error", headers)
        if not done.ok:
            return self._refused(502, "DEFAULT_5XX", "Internal server error", headers)
        response = done.payload
        if not isinstance(response, dict) or "statusCode" not in response:
            return self._refused(502, "DEFAULT_5XX", "Internal server error", headers)  # a malformed proxy response
        out_headers = {**(response.get("headers") or {})}
        for key, values in (response.get("multiValueHeaders") or {}).items():
            out_headers[key] = ",".join(values)
        raw = response.get("body") or ""
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        return int(response["statusCode"]), out_headers, parsed

    def _refused(
        self, status: int, kind: str, message: str, request_headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        """API Gateway's own answer: the gateway response of its type, else its 4XX/5XX default, else the built-in
        ``{"message"}``; the template's ``$context.error`` variables and the headers' mappings filled in."""
        default = "DEFAULT_4XX" if status < 500 else "DEFAULT_5XX"
        headers = {"x-amzn-ErrorType": kind}
        found = self.gateway_responses.get(kind) or self.gateway_responses.get(default)
        if found is None:
            return status, headers, {"message": message}
        given = {name.lower(): value for name, value in request_headers.items()}
        for key, value in (found.get("ResponseParameters") or {}).items():
            name = key.removeprefix("gatewayresponse.header.")
            if value.startswith("'") and value.endswith("'"):
                headers[name] = value[1:-1]
            elif value.startswith("method.request.header."):
                mapped = given.get(value.removeprefix("method.request.header.").lower())
                if mapped is not None:  # a header mapped from an absent one is left out
                    headers[name] = mapped
            else:
                raise ValueError(f"gateway response header {name}: {value!r} is not modelled")
        template = (found.get("ResponseTemplates") or {}).get("application/json")
        if template is None:
            return status, headers, {"message": message}
        body = template.replace("$context.error.responseType", kind).replace(
            "$context.error.messageString", json.dumps(message)
        )
        return status, headers, json.loads(body)

    def _route(self, method: str, path: str) -> tuple[str, str, dict[str, str]] | None:
        segments = [s for s in path.split("?", maxsplit=1)[0].split("/") if s]
        for (route_method, resource), function in self.routes.items():
            if route_method != method:
                continue
            template = [s for s in resource.split("/") if s]
            if len(template) != len(segments):
                continue
            parameters: dict[str, str] = {}
            for want, got in zip(template, segments, strict=True):
                match = re.fullmatch(r"\{(\w+)\}", want)
                if match:
                    parameters[match.group(1)] = unquote(got)  # API Gateway decodes pathParameters, not path
                elif want != got:
                    break
            else:
                return resource, function, parameters
        return None

    def _event(
        self,
        method: str,
        path: str,
        resource: str,
        parameters: dict[str, str],
        body: str | None,
        headers: dict[str, str],
        token: Token | None,
        query: dict[str, str] | None,
    ) -> dict[str, Any]:
        all_headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Host": "abc123.execute-api.eu-west-1.amazonaws.com",
            **({"Authorization": f"harness-{token.token_use}-token"} if token is not None else {}),
            **headers,
        }
        request_id = str(uuid.uuid4())
        claims = {} if token is None else token.claims()
        if token is not None and token.token_use == "id":  # an ID token names the app client it was issued to
            claims.setdefault("aud", self.people_client)
        authorizer = {"authorizer": {"claims": claims}} if token is not None else {}  # none ran: no claims
        return {
            "resource": resource,
            "path": path,
            "httpMethod": method,
            "headers": all_headers,
            "multiValueHeaders": {k: [v] for k, v in all_headers.items()},
            "queryStringParameters": query or None,
            "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
            "pathParameters": parameters or None,
            "stageVariables": None,
            "requestContext": {
                "resourceId": "abc123",
                "resourcePath": resource,
                "httpMethod": method,
                "path": f"/v1{path}",
                "stage": "v1",
                "requestId": request_id,
                "extendedRequestId": request_id,
                "requestTimeEpoch": int(time.time() * 1000),
                "accountId": ACCOUNT,
                "apiId": "abc123",
                "protocol": "HTTP/1.1",
                "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
                "identity": {"sourceIp": "203.0.113.7", "userAgent": "fidelity-harness"},
                **authorizer,
            },
            "body": body,
            "isBase64Encoded": False,
        }

    # -- views -------------------------------------------------------------------------------------------------

    def executions(self) -> list[Execution]:
        return sorted(self.sfn.executions.values(), key=lambda e: e.started)

    def executions_of(self, tenant: str, session_id: str) -> list[Execution]:
        return [
            e
            for e in self.executions()
            if _input(e).get("session_id") == session_id and _input(e).get("tenant") == tenant
        ]

    def settle(self, timeout: float = 180.0) -> None:
        """Wait until no execution has work in flight (a running task, a retry's pause): each is finished or
        asleep on a task token. Raises ``TimeoutError`` with what is still busy. It returns as soon as all is
        quiet: the bound is generous, for a loaded machine, and costs nothing when nothing is stuck."""
        deadline = time.monotonic() + timeout
        quiet_since = None
        while time.monotonic() < deadline:
            busy = self.sfn.in_flight() or any(self.lambdas.busy(n) for n in self.functions)
            if not busy:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 0.3:
                    return
            else:
                quiet_since = None
            time.sleep(0.05)
        raise TimeoutError(f"still busy after {timeout} s: {self.sfn.in_flight()}")

    def calls(self, function: str | None = None) -> list[Call]:
        return [c for c in self.lambdas.calls if function is None or c.function == function]

    def denied(self) -> list[Call]:
        return [c for c in self.lambdas.calls if not c.allowed]

    def kill(self, function: str) -> int:
        """``kill -9`` the function's sandboxes that are running an invocation now."""
        return self.lambdas.kill(function)

    def crash_before(self, function: str, action: str) -> None:
        """Kill ``function``'s sandbox just before its next call needing ``action`` (e.g. states:StartExecution)."""
        self.lambdas.crash_before(function, action)

    def hold_after(self, function: str, action: str) -> None:
        """``function``'s next call needing ``action`` is made, then its sandbox pauses until ``release``: a writer
        slow between two calls (e.g. the run function between starting the turn's execution and its claim)."""
        self.lambdas.hold_after(function, action)

    def holding(self, function: str) -> bool:
        """Whether a sandbox of ``function`` is paused by ``hold_after`` now."""
        return self.lambdas.holding(function)

    def release(self, function: str) -> None:
        """Let the sandbox ``hold_after`` paused go on (a no-op once it was killed)."""
        self.lambdas.release(function)

    def fail_next(
        self, function: str, operation: str, where: list[str], code: str, reasons: Sequence[str] = (), times: int = 1
    ) -> None:
        """AWS answers ``function``'s next ``operation`` call whose parameters hold each of ``where`` (and the
        ``times - 1`` like it after it) with error ``code`` (a DynamoDB ``TransactionCanceledException`` with these
        cancellation ``reasons``): a throttle or a refusal of one request, as the service returns it; nothing of the
        call is applied."""
        answer: dict[str, Any] = {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": "harness fault"}
        if reasons:
            answer["CancellationReasons"] = [{"Code": reason} for reason in reasons]
        self.lambdas.fail_next(function, operation, where, answer, times)

    def stop(self, execution: Execution) -> None:
        """``StopExecution``, as an operator would from the console (the execution ends ``ABORTED``)."""
        self.sfn.stop_execution(execution.arn, error="Operator", cause="stopped by hand")

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass for the functions: dormant's clock moves on in every sandbox (claims' deadlines, waits'
        graces), where waiting for them would be real time. Step Functions' and DynamoDB's clocks do not move."""
        self.lambdas.advance(seconds)

    def sweep(self, grace_seconds: float | None = 0) -> dict[str, Any]:
        """Invoke the sweeper with the schedule's event (plus ``grace_seconds``: an operator's "sweep now")."""
        event = json.loads((ROOT / "events/schedule/sweeper.json").read_text())
        if grace_seconds is not None:
            event["grace_seconds"] = grace_seconds
        ok, result = self.invoke("sweeper", event)
        if not ok:
            raise AssertionError(f"the sweeper failed: {result}")
        return result  # type: ignore[no-any-return]

    def errors(self, function: str | None = None) -> list[tuple[str, str | None, str]]:
        """(function, errorType, errorMessage) of each failed invocation."""
        return [
            (i.function, i.error_type, i.error_message)
            for i in self.lambdas.invocations
            if not i.ok and (function is None or i.function == function)
        ]

    def log(self, function: str) -> str:
        path = self.workdir / f"{function}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def item(self, key: dict[str, Any]) -> dict[str, Any] | None:
        return self.ddb().get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")  # type: ignore[no-any-return]


def _input(execution: Execution) -> dict[str, Any]:
    try:
        return json.loads(execution.input)  # type: ignore[no-any-return]
    except ValueError:
        return {}
