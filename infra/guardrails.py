"""Guardrails against runaway cost, each a CDK context value with a default (``cdk deploy -c name=value``).

* ``throttle_rate`` / ``throttle_burst`` (50 requests/s, burst 100): the API stage's throttling, for every
  caller together. API Gateway answers 429 past it, before any function runs.
* ``machine_clients`` (none): ``name,name`` of machine clients, each given an API key and a usage plan of its
  own (``client_rate`` / ``client_burst``: 10/s, burst 20; ``client_quota``: requests per day, 0 none). A usage
  plan meters requests that carry its key (``x-api-key``); with any set, the ``/clients`` methods (the machine
  clients' routes, ``infra.api``) require a key, so no machine call goes unmetered.
* ``account_concurrency`` (none): the account's Lambda concurrency limit in this region (Service Quotas,
  "Concurrent executions"). Undeclared, the stack reserves nothing: a reservation that leaves under 100
  unreserved fails the deploy, and new accounts start at 10. Declared, the workflow's functions get
  ``reserved_park`` (5), ``reserved_resume`` (25) and ``reserved_sweeper`` (1), scaled down to leave 100
  unreserved, so a flood of API calls cannot starve the functions that finish turns; ``run_cap`` (none) caps
  ``run``. Explicit values over what the account leaves are refused at synth.
* The held routes (``GET /sessions/{id}/events``, ``POST .../runs`` and ``.../tools``, and their ``/clients``
  twins: a ``wait`` holds a function up to its timeout) get method throttles sized so their held functions
  take at most half the unreserved pool (``held_throttling``): API Gateway answers 429 before Lambda
  throttles, which API Gateway would answer 500.
* ``waf_rate_limit`` (0: no WAF): requests per 5 minutes per client IP that an AWS WAF rate-based rule
  allows before it blocks; the web ACL is associated with the stage.
* ``turn_quota`` (none): ``N/SECONDS`` turns per tenant per window, enforced by the app (``dormant.serving.quota``):
  a 429 naming the quota, nothing run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from dormant.serving.quota import TurnQuota
from dormant.serving.routes import CLIENT_PREFIX

from .clients import parse_machine_clients
from .limits import UNRESERVED_MINIMUM

RESERVED = {"park": 5, "resume": 25, "sweeper": 1, "run": 0}
"""Function -> its reserved concurrency with ``account_concurrency`` declared (``reserved_<name>``; ``run``:
``run_cap``, none by default: its held requests are throttled by the gateway, ``held_throttling``)."""
DEFAULT_ACCOUNT_CONCURRENCY = 1000
"""Lambda's default concurrency quota, what the held routes' throttles are sized for when none is declared."""
HELD_ROUTES = (
    ("GET", "/sessions/{id}/events", "sessions"),
    ("POST", "/sessions/{id}/runs", "run"),
    ("POST", "/sessions/{id}/tools", "tools"),
)
"""The routes whose ``wait`` holds their function: each can hold one for the function's whole timeout."""
HELD_SHARE = 0.5
"""The share of the unreserved pool the held routes may take together; the rest serves every other request
of the account's functions."""


@dataclass(frozen=True)
class Guardrails:
    throttle_rate: float = 50
    throttle_burst: int = 100
    machine_clients: tuple[str, ...] = ()
    client_rate: float = 10
    client_burst: int = 20
    client_quota: int = 0
    reserved: Mapping[str, int] | None = None
    account_concurrency: int | None = None
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

        declared = context("account_concurrency")
        account = int(number("account_concurrency", 0)) if declared is not None else None
        explicit = {
            name: int(number(key, 0))
            for name in RESERVED
            if context(key := "run_cap" if name == "run" else f"reserved_{name}") is not None
        }
        reserved = _reservations(account, explicit)
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
            account_concurrency=account,
            waf_rate_limit=int(number("waf_rate_limit", 0)),
            turn_quota=quota,
        )

    def stage_throttling(self) -> dict[str, float]:
        """The ``StageOptions`` throttling arguments."""
        return {"throttling_rate_limit": self.throttle_rate, "throttling_burst_limit": self.throttle_burst}

    def reserve(self, functions: Mapping[str, lambda_.Function]) -> None:
        """Set each function's reserved concurrency (none without ``account_concurrency``)."""
        for name, count in (self.reserved or {}).items():
            function = functions[name].node.default_child
            assert isinstance(function, lambda_.CfnFunction)
            function.reserved_concurrent_executions = count

    def held_throttling(self, hold_s: float) -> dict[str, tuple[float, int]]:
        """``"{path}/{METHOD}"`` -> (rate, burst) of each held route's method (``HELD_ROUTES``, and their
        ``/clients`` twins), for functions that hold a request up to ``hold_s``.

        A throttle admits at most ``burst + rate * hold_s`` requests within one hold, so each method gets
        ``share`` concurrent holds as ``burst = share / 2`` and ``rate = share / 2 / hold_s``. ``share`` splits
        ``HELD_SHARE`` of the unreserved pool (the account's concurrency, declared or Lambda's default, less the
        reservations) between the methods; a function with a reserved cap (``run_cap``) splits its cap instead,
        kept under it, so the gateway's 429 comes before Lambda's throttle (a 500 at the gateway)."""
        reserved = dict(self.reserved or {})
        pool = (self.account_concurrency or DEFAULT_ACCOUNT_CONCURRENCY) - sum(reserved.values())
        methods = 2 * len(HELD_ROUTES)
        out = {}
        for method, path, function in HELD_ROUTES:
            share = pool * HELD_SHARE / methods
            if reserved.get(function):
                share = min(share, reserved[function] / 2)
            burst = max(1, int(share / 2))
            rate = math.floor((share - burst) / hold_s * 10) / 10  # rounded down: never past the share
            if rate < 0.1:  # API Gateway's smallest useful rate: below it no throttle keeps within the share
                raise ValueError(
                    f"{method} {path} holds {function} up to {hold_s:g} s: a share of {share:g} concurrent "
                    f"executions cannot be throttled under it (raise -c account_concurrency or the cap of {function})"
                )
            for prefix in ("", CLIENT_PREFIX):
                out[f"{prefix}{path}/{method}"] = (rate, burst)
        return out


def _reservations(account: int | None, explicit: Mapping[str, int]) -> dict[str, int]:
    """Each function's reserved concurrency: none undeclared; declared, the explicit ones (refused past what
    the account leaves reserved) and the defaults scaled to fit, each leaving ``UNRESERVED_MINIMUM`` free."""
    if account is None:
        if any(explicit.values()):
            raise ValueError(
                "-c reserved_*/run_cap reserve concurrency out of the account's limit: declare that limit with "
                "-c account_concurrency=N (Service Quotas: Lambda, Concurrent executions) so the stack leaves "
                f"{UNRESERVED_MINIMUM} unreserved, as Lambda requires"
            )
        return {}
    budget = account - UNRESERVED_MINIMUM
    chosen = sum(explicit.values())
    if chosen > budget:
        raise ValueError(
            f"-c reserved_*/run_cap reserve {chosen} of -c account_concurrency={account}: Lambda keeps "
            f"{UNRESERVED_MINIMUM} unreserved, so at most {max(budget, 0)} can be reserved"
        )
    defaults = {name: count for name, count in RESERVED.items() if name not in explicit and count}
    factor = min(1.0, max(budget - chosen, 0) / sum(defaults.values())) if defaults else 1.0
    sized = {**{name: int(count * factor) for name, count in defaults.items()}, **explicit}
    return {name: count for name, count in sized.items() if count}


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
