"""The REST API: the routes of the HTTP API, every method behind a Cognito user-pool authorizer.

People sign in to the user pool (SRP, no OAuth redirect: no implicit grant, no callback URL) and call the
routes with their ID token, which carries ``sub`` (the principal), the tenant claim (``custom:tenant``, set
by an administrator: the app client cannot write it) and ``cognito:groups``. Machine clients get an access
token by the client-credentials grant, with scopes of the ``dormant`` resource server, and call the same
routes under ``/clients`` (``serving.routes.CLIENT_PREFIX``): those methods require the route's scope, and
API Gateway takes only an access token on a method with scopes, only an ID token on one without. Each machine
client of ``-c machine_clients`` is an app client of its own with only its scopes (``infra.clients``); the
administrative routes need a person in the admin group (``-c admin_group``, default ``admins``), created here.

API Gateway's own refusals (no token, an unknown path, a body too large, a timeout) answer in the handlers'
error shape, ``{"error", "message"}`` (gateway responses); its throttles and a usage plan's quota as 429 with
``Retry-After``. Each function has one permission for this API's methods (its resource policy stays one
statement however many routes), and the stack creates the stage's execution-log group, with a retention.

With ``cors_origins``, every path also takes
``OPTIONS`` without the authorizer (a browser's preflight carries no token), answered by the function that
knows the origins (``serving.routes.PREFLIGHT_FUNCTION``), and the gateway's refusals carry
``Access-Control-Allow-Origin`` too: a page can then tell an expired token from a network failure. Machine
clients' ``/clients`` paths take no preflight: a machine has no browser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from dormant.serving.callers import DEFAULT_ADMIN_GROUP
from dormant.serving.routes import CLIENT_PREFIX, PREFLIGHT_FUNCTION, ROUTES, SCOPES, scope_of

from .clients import MachineClient

_SCOPE_DESCRIPTIONS = {
    "read": "read sessions, their events and state",
    "run": "create, run, fork and commit sessions",
    "answer": "answer yielded tool calls",
    "admin": "erase a person's data and delete sessions",
}

ERROR_TEMPLATE = '{"error": "$context.error.responseType", "message": $context.error.messageString}'
"""The body of API Gateway's own 4xx and 5xx: the handlers' error shape (``messageString`` is quoted JSON)."""
THROTTLED_RETRY_AFTER = 1
"""Seconds a throttled caller waits (``Retry-After``): a throttle's token bucket refills every second."""
QUOTA_RETRY_AFTER = 3600
"""Seconds a caller past its usage plan's daily quota waits before trying again (the quota resets daily)."""

F = apigw.AccessLogField
ACCESS_LOG_FIELDS = {
    "requestId": F.context_request_id(),
    "ip": F.context_identity_source_ip(),
    "requestTime": F.context_request_time(),
    "httpMethod": F.context_http_method(),
    "resourcePath": F.context_resource_path(),
    "status": F.context_status(),
    "protocol": F.context_protocol(),
    "responseLength": F.context_response_length(),
    # who called, how long the function took, and why a request failed before or inside it
    "sub": F.context_authorizer_claims("sub"),
    "clientId": F.context_authorizer_claims("client_id"),
    "integrationLatency": F.context_integration_latency(),
    "integrationStatus": F.context_integration_status(),
    "integrationError": F.context_integration_error_message(),
    "errorType": F.context_error_response_type(),
}
"""The access log's fields: one JSON object per request (no body, no header, no token)."""
ACCESS_LOG_FORMAT = apigw.AccessLogFormat.custom(
    "{"
    + ",".join(f'"{name}":"{value}"' for name, value in ACCESS_LOG_FIELDS.items())
    + f',"error":{F.context_error_message_string()}'  # quoted by API Gateway itself
    + "}"
)


class Api(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        log_retention_days: float,
        tracing: bool,
        auth_domain_prefix: str,
        cors_origins: Sequence[str] = (),
        throttling: Mapping[str, float] | None = None,
        method_throttling: Mapping[str, tuple[float, int]] | None = None,
        client_api_keys: bool = False,
        machine_clients: Sequence[MachineClient] = (),
        admin_group: str = DEFAULT_ADMIN_GROUP,
        email: cognito.UserPoolEmail | None = None,
    ) -> None:
        """``client_api_keys``: the ``/clients`` methods require an API key (``x-api-key``), so each machine
        client's usage plan (``infra.guardrails``) meters and throttles it; set when machine clients have keys.
        ``method_throttling``: ``"{path}/{METHOD}"`` -> (rate, burst), on top of the stage's. ``machine_clients``:
        an app client each (``infra.clients``); ``admin_group``: the group created for the administrative role.
        ``email``: how the pool sends mail (SES; ``None``: Cognito's own, a testing quota of a few messages a day)."""
        super().__init__(scope, id)
        self.user_pool = cognito.UserPool(
            self,
            "Users",
            self_sign_up_enabled=False,
            sign_in_aliases=cognito.SignInAliases(email=True),
            password_policy=cognito.PasswordPolicy(
                min_length=12,
                require_lowercase=True,
                require_uppercase=True,
                require_digits=True,
                require_symbols=True,
                temp_password_validity=Duration.days(3),
            ),
            mfa=cognito.Mfa.REQUIRED,
            mfa_second_factor=cognito.MfaSecondFactor(otp=True, sms=False),
            account_recovery=cognito.AccountRecovery.EMAIL_ONLY,
            removal_policy=RemovalPolicy.RETAIN,
            # The tenant a person belongs to: set by an administrator (docs/deploying.md), read by the handlers.
            custom_attributes={"tenant": cognito.StringAttribute(min_len=1, max_len=128, mutable=True)},
            email=email,
        )
        # People: SRP sign-in for an ID token; no OAuth flows (no implicit grant, no placeholder callback URL).
        # They may change their email, never their tenant (write_attributes leaves custom:tenant out).
        self.client = self.user_pool.add_client(
            "Client",
            auth_flows=cognito.AuthFlow(user_srp=True),
            disable_o_auth=True,
            write_attributes=cognito.ClientAttributes().with_standard_attributes(email=True),
        )
        self.resource_server = self.user_pool.add_resource_server(
            "Scopes",
            identifier=SCOPES["read"].split("/")[0],
            scopes=[
                cognito.ResourceServerScope(scope_name=SCOPES[key].split("/")[1], scope_description=text)
                for key, text in _SCOPE_DESCRIPTIONS.items()
            ],
        )
        # Machines: the client-credentials grant at the pool's token endpoint, each client for its own scopes
        # (each token asks for the ones it needs with scope=).
        self.domain = self.user_pool.add_domain(
            "Domain", cognito_domain=cognito.CognitoDomainOptions(domain_prefix=auth_domain_prefix)
        )
        # Each machine client of -c machine_clients is an app client of its own, allowed only its scopes; without
        # any, one client ("Machines") for every scope, a tenant of its own (infra.clients).
        given = machine_clients or (MachineClient("Machines", tuple(SCOPES.values()), None),)
        self.machine_clients: dict[str, cognito.UserPoolClient] = {}
        self.machine_tenants: dict[str, tuple[str, str | None]] = {}
        for machine in given:
            client = self.user_pool.add_client(
                "Machines" if not machine_clients else f"Machine-{machine.name}",
                user_pool_client_name=machine.name if machine_clients else None,
                generate_secret=True,
                auth_flows=cognito.AuthFlow(),
                o_auth=cognito.OAuthSettings(
                    flows=cognito.OAuthFlows(client_credentials=True),
                    scopes=[cognito.OAuthScope.custom(scope) for scope in machine.scopes],
                ),
            )
            client.node.add_dependency(self.resource_server)
            self.machine_clients[machine.name] = client
            self.machine_tenants[machine.name] = (client.user_pool_client_id, machine.tenant)
        # The group whose members may delete sessions and erase people (serving.callers): add people to it.
        cognito.CfnUserPoolGroup(
            self,
            "Admins",
            user_pool_id=self.user_pool.user_pool_id,
            group_name=admin_group,
            description="dormant: may delete sessions and erase a person's data, in their tenant",
        )
        authorizer = apigw.CognitoUserPoolsAuthorizer(self, "Authorizer", cognito_user_pools=[self.user_pool])

        access_logs = logs.LogGroup(self, "AccessLogs", removal_policy=RemovalPolicy.DESTROY)
        access_logs.node.default_child.add_property_override("RetentionInDays", log_retention_days)  # type: ignore[union-attr]
        self.rest_api = apigw.RestApi(
            self,
            "RestApi",
            description="dormant: sessions that sleep between turns",
            deploy_options=apigw.StageOptions(
                stage_name="v1",
                **(throttling or {}),  # infra.guardrails: the stage's rate and burst
                method_options={
                    path: apigw.MethodDeploymentOptions(throttling_rate_limit=rate, throttling_burst_limit=burst)
                    for path, (rate, burst) in (method_throttling or {}).items()
                },
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                tracing_enabled=tracing,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=ACCESS_LOG_FORMAT,
            ),
            # The account's API Gateway logging role (AWS::ApiGateway::Account) is one per account and region: a
            # stack that created it would break every other API's logging when deleted or replaced. It is set
            # once per account (docs/deploying.md); the stage's access and execution logs need it.
            cloud_watch_role=False,
            default_method_options=apigw.MethodOptions(
                authorizer=authorizer, authorization_type=apigw.AuthorizationType.COGNITO
            ),
        )
        # Execution logs (logging_level) go to a group API Gateway would create itself, outside the stack and
        # kept forever: the stack creates it first, with the stack's retention, and deletes it with the stack.
        execution_logs = logs.CfnLogGroup(
            self,
            "ExecutionLogs",
            log_group_name=f"API-Gateway-Execution-Logs_{self.rest_api.rest_api_id}/v1",
            retention_in_days=log_retention_days,
        )
        execution_logs.apply_removal_policy(RemovalPolicy.DESTROY)
        self.rest_api.deployment_stage.node.add_dependency(execution_logs)
        # Bodies are validated by the handlers (a 400 that names the field); API Gateway checks what it can
        # without a model: the required parameters.
        validator = self.rest_api.add_request_validator("Parameters", validate_request_parameters=True)
        integrations = {
            name: apigw.LambdaIntegration(functions[name], scope_permission_to_method=False)
            for name in {f for _, _, f in ROUTES}
        }
        for method, path, function in ROUTES:
            resource = self.rest_api.root.resource_for_path(path)
            resource.add_method(method, integrations[function], request_validator=validator)
            # the machine clients' twin: an access token with the route's scope (an ID token is refused here)
            clients = self.rest_api.root.resource_for_path(CLIENT_PREFIX + path)
            clients.add_method(
                method,
                integrations[function],
                request_validator=validator,
                authorization_scopes=[scope_of(method, path)],
                api_key_required=client_api_keys,  # a call without a usage plan's key is a 403, no function runs
            )
        self._cors(cors_origins, functions[PREFLIGHT_FUNCTION])

        Validations.of(self.user_pool).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-COG8",
                reason="The Plus feature plan (threat protection) is billed per monthly active user; a deployment that "
                "wants it sets feature_plan on this pool. MFA is required and the password policy is strict.",
            )
        )
        Validations.of(self.rest_api).acknowledge(
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-APIG2",
                reason="Request parameters are validated here; bodies by the handlers' pydantic models, which answer "
                "400 naming the field. A second schema in API Gateway would drift from them and answer differently.",
            ),
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-APIG3",
                reason="A WAF web ACL is billed per ACL and rule and is usually shared per account; associate one "
                "with the v1 stage when the API is public. Every method requires a Cognito token.",
            ),
        )

    def _cors(self, origins: Sequence[str], preflight: lambda_.IFunction) -> None:
        """Gateway responses in the error shape (with ``Access-Control-*`` for ``origins``), and with ``origins``
        an unauthenticated ``OPTIONS`` on every path of the routes."""
        headers: dict[str, str] = {}
        if origins:
            # One origin is written as is; several cannot be chosen from by a gateway response, which only maps
            # headers: it echoes the request's Origin (its refusals hold no data; the handlers check the list).
            headers = {
                "Access-Control-Allow-Origin": f"'{origins[0]}'"
                if len(origins) == 1
                else "method.request.header.Origin",
                "Vary": "'Origin'",
            }
        for name, kind in (
            ("Default4xx", apigw.ResponseType.DEFAULT_4_XX),
            ("Default5xx", apigw.ResponseType.DEFAULT_5_XX),
        ):
            self.rest_api.add_gateway_response(
                name, type=kind, response_headers=headers or None, templates={"application/json": ERROR_TEMPLATE}
            )
        # The stage's, a method's or a usage plan's throttle, and a usage plan's quota: a 429 that says when to
        # come back (a throttle's bucket refills every second; a quota's period is a day).
        for name, kind, after in (
            ("Throttled", apigw.ResponseType.THROTTLED, THROTTLED_RETRY_AFTER),
            ("QuotaExceeded", apigw.ResponseType.QUOTA_EXCEEDED, QUOTA_RETRY_AFTER),
        ):
            self.rest_api.add_gateway_response(
                name,
                type=kind,
                status_code="429",
                response_headers={**headers, "Retry-After": f"'{after}'"},
                templates={"application/json": ERROR_TEMPLATE},
            )
        if not origins:
            return
        integration = apigw.LambdaIntegration(preflight, scope_permission_to_method=False)
        for path in sorted({path for _, path, _ in ROUTES}):
            method = self.rest_api.root.resource_for_path(path).add_method(
                "OPTIONS", integration, authorization_type=apigw.AuthorizationType.NONE
            )
            Validations.of(method).acknowledge(
                Acknowledgment(
                    id="AwsSolutions::AwsSolutions-APIG4",
                    reason="A CORS preflight: browsers send it without a token. It reaches only the preflight answer "
                    "(Powertools' CORS, before any route), which reads no data.",
                ),
                Acknowledgment(
                    id="AwsSolutions::AwsSolutions-COG4",
                    reason="A CORS preflight carries no Cognito token; every other method requires one.",
                ),
            )
