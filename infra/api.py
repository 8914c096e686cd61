"""The REST API: the routes of the HTTP API, every method behind a Cognito user-pool authorizer.

The caller's tenant is the ``sub`` claim of the Cognito ID token the authorizer verified; the handlers
read it from the request context and put it into every key they touch.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from dormant.serving.routes import ROUTES

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
        throttling: Mapping[str, float] | None = None,
    ) -> None:
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
        )
        self.client = self.user_pool.add_client("Client", auth_flows=cognito.AuthFlow(user_srp=True))
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
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                tracing_enabled=tracing,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=ACCESS_LOG_FORMAT,
            ),
            # The account's API Gateway logging role (AWS::ApiGateway::Account) is one per account and region: a
            # stack that created it would break every other API's logging when deleted or replaced. It is set
            # once per account (README, Deploy); the stage's access and execution logs need it.
            cloud_watch_role=False,
            default_method_options=apigw.MethodOptions(
                authorizer=authorizer, authorization_type=apigw.AuthorizationType.COGNITO
            ),
        )
        # Bodies are validated by the handlers (a 400 that names the field); API Gateway checks what it can
        # without a model: the required parameters.
        validator = self.rest_api.add_request_validator("Parameters", validate_request_parameters=True)
        integrations = {name: apigw.LambdaIntegration(functions[name]) for name in {f for _, _, f in ROUTES}}
        for method, path, function in ROUTES:
            resource = self.rest_api.root.resource_for_path(path)
            resource.add_method(method, integrations[function], request_validator=validator)

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
