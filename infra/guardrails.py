"""Guardrails against runaway cost, each a CDK context value with a default (``cdk deploy -c name=value``).

* ``throttle_rate`` / ``throttle_burst`` (50 requests/s, burst 100): the API stage's throttling, for every
  caller together. API Gateway answers 429 past it, before any function runs.
* ``machine_clients`` (none): ``name,name`` of machine clients, each given an API key and a usage plan of its
  own (``client_rate`` / ``client_burst``: 10/s, burst 20; ``client_quota``: requests per day, 0 none). A usage
  plan meters requests that carry its key (``x-api-key``); with any set, the ``/clients`` methods (the machine
  clients' routes, ``infra.api``) require a key, so no machine call goes unmetered.
* ``reserved_park`` (5), ``reserved_resume`` (25), ``reserved_sweeper`` (1): concurrency reserved for the
  workflow's functions, so a flood of API calls cannot starve the functions that finish turns; ``run_cap``
  (25): the most ``run`` may use at once (a reserved concurrency is also a cap). 0 leaves one unset. Their sum
  must stay under the account's concurrency limit minus the 100 Lambda keeps unreserved.
* ``waf_rate_limit`` (0: no WAF): requests per 5 minutes per client IP that an AWS WAF rate-based rule
  allows before it blocks; the web ACL is associated with the stage.
* ``turn_quota`` (none): ``N/SECONDS`` turns per tenant per window, enforced by the app (``dormant.serving.quota``):
  a 429 naming the quota, nothing run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from dormant.serving.quota import TurnQuota

from .clients import parse_machine_clients

RESERVED = {"park": 5, "resume": 25, "sweeper": 1, "run": 25}
"""Function -> its reserved concurrency by default (``reserved_<name>``; ``run``: ``run_cap``)."""


@dataclass(frozen=True)
class Guardrails:
    throttle_rate: float = 50
    throttle_burst: int = 100
    machine_clients: tuple[str, ...] = ()
    client_rate: float = 10
    client_burst: int = 20
    client_quota: int = 0
    reserved: Mapping[str, int] | None = None
    waf_rate_limit: int = 0
    turn_quota: str = ""

    @classmethod
    def from_context(cls, context: Callable[[str], object]) -> Guardrails:
        def number(name: str, default: float) -> float:
            value = context(name)
            try:
                parsed = float(str(value)) if value is not None else default
            except ValueError:
                raise ValueError(f"-c {name}= takes a number, not {value!r}") from None
            if parsed < 0:
                raise ValueError(f"-c {name}= takes a number >= 0, not {value!r}")
            return parsed

        reserved = {
            name: int(number("run_cap" if name == "run" else f"reserved_{name}", default))
            for name, default in RESERVED.items()
        }
        quota = str(context("turn_quota") or "")
        if quota:
            TurnQuota.parse(quota)  # refused at synth, not at the first request
        return cls(
            throttle_rate=number("throttle_rate", cls.throttle_rate),
            throttle_burst=int(number("throttle_burst", cls.throttle_burst)),
            machine_clients=tuple(c.name for c in parse_machine_clients(context("machine_clients"))),
            client_rate=number("client_rate", cls.client_rate),
            client_burst=int(number("client_burst", cls.client_burst)),
            client_quota=int(number("client_quota", cls.client_quota)),
            reserved=reserved,
            waf_rate_limit=int(number("waf_rate_limit", 0)),
            turn_quota=quota,
        )

    def stage_throttling(self) -> dict[str, float]:
        """The ``StageOptions`` throttling arguments."""
        return {"throttling_rate_limit": self.throttle_rate, "throttling_burst_limit": self.throttle_burst}

    def reserve(self, functions: Mapping[str, lambda_.Function]) -> None:
        """Set each function's reserved concurrency (0: left unset)."""
        for name, count in (self.reserved or RESERVED).items():
            if count:
                function = functions[name].node.default_child
                assert isinstance(function, lambda_.CfnFunction)
                function.reserved_concurrent_executions = count


class MachineClientPlans(Construct):
    """An API key and a usage plan (throttle, optional daily quota) per machine client, on the stage."""

    def __init__(self, scope: Construct, id: str, *, guardrails: Guardrails, stage: apigw.Stage) -> None:
        super().__init__(scope, id)
        self.plans: dict[str, apigw.UsagePlan] = {}
        for client in guardrails.machine_clients:
            key = apigw.ApiKey(self, f"{client}Key", description=f"dormant machine client {client}")
            plan = apigw.UsagePlan(
                self,
                f"{client}Plan",
                description=f"dormant machine client {client}",
                throttle=apigw.ThrottleSettings(rate_limit=guardrails.client_rate, burst_limit=guardrails.client_burst),
                quota=apigw.QuotaSettings(limit=guardrails.client_quota, period=apigw.Period.DAY)
                if guardrails.client_quota
                else None,
                api_stages=[apigw.UsagePlanPerApiStage(api=stage.rest_api, stage=stage)],
            )
            plan.add_api_key(key)
            self.plans[client] = plan


class RateLimitedWebAcl(Construct):
    """An AWS WAF web ACL with one rate-based rule (requests per 5 minutes per IP), on the stage."""

    def __init__(self, scope: Construct, id: str, *, limit: int, stage: apigw.Stage) -> None:
        super().__init__(scope, id)
        visibility = wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True, metric_name="dormant-rate", sampled_requests_enabled=True
        )
        self.acl = wafv2.CfnWebACL(
            self,
            "Acl",
            scope="REGIONAL",
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=visibility,
            rules=[
                wafv2.CfnWebACL.RuleProperty(
                    name="rate-per-ip",
                    priority=0,
                    action=wafv2.CfnWebACL.RuleActionProperty(block={}),
                    statement=wafv2.CfnWebACL.StatementProperty(
                        rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                            limit=limit, aggregate_key_type="IP"
                        )
                    ),
                    visibility_config=visibility,
                )
            ],
        )
        wafv2.CfnWebACLAssociation(self, "Association", resource_arn=stage.stage_arn, web_acl_arn=self.acl.attr_arn)
