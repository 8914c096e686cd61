"""Guardrails: the stage's throttling, reserved concurrency, usage plans per machine client and the WAF rule
from context values (with their defaults), and the per-tenant turn quota on every store and over HTTP."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dormant.clock import frozen_clock
from dormant.errors import ConfigurationError, TurnQuotaExceeded, http_status
from dormant.serving.quota import TurnQuota
from tests.support.stores import store_maker

# -- the quota, on each store ------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made = store_maker(request.param, request, tmp_path)()
    yield made
    made.close()


def test_a_tenant_gets_its_turns_per_window_and_then_429(store: Any) -> None:
    app, quota = f"q-{uuid.uuid4().hex[:8]}", TurnQuota(3, 60)
    with frozen_clock(1_000_000_040_000) as clock:
        assert [quota.take(store, app, "tenant-a").left for _ in range(3)] == [2, 1, 0]
        assert quota.take(store, app, "tenant-b").left == 2  # another tenant's count is its own
        with pytest.raises(TurnQuotaExceeded) as refused:
            quota.take(store, app, "tenant-a")
        assert (refused.value.quota, refused.value.retry_after, refused.value.field) == ("3/60", 40, "quota")
        assert http_status(refused.value) == 429
        with pytest.raises(TurnQuotaExceeded):  # refused, it took nothing: still spent, not over-counted
            quota.take(store, app, "tenant-a")
        assert store.list(app) == [] and store.list(f"{app}@tenant-a") == []  # in no listing
        clock.advance(40_000)  # the next window
        assert quota.take(store, app, "tenant-a").left == 2


def test_a_turn_given_back_is_free_again(store: Any) -> None:
    """A request whose claim was refused gives its turn back: the quota counts claims, not refusals."""
    app, quota = f"q-{uuid.uuid4().hex[:8]}", TurnQuota(2, 60)
    with frozen_clock(1_000_000_040_000):
        first = quota.take(store, app, "tenant-a")
        for _ in range(3):  # three refused claims, each given back
            quota.give_back(store, quota.take(store, app, "tenant-a"))
        assert first.left == 1 and quota.take(store, app, "tenant-a").left == 0
        with pytest.raises(TurnQuotaExceeded):
            quota.take(store, app, "tenant-a")
        assert store.list(app) == [] and store.list(f"{app}@tenant-a") == []  # the counters are in no listing


def test_a_quota_is_turns_per_seconds() -> None:
    assert TurnQuota.parse("100/3600") == TurnQuota(100, 3600)
    for bad in ("100", "0/60", "10/0", "x/60", "-1/60"):
        with pytest.raises(ConfigurationError):
            TurnQuota.parse(bad)


# -- the quota over HTTP -------------------------------------------------------------------------------


def test_post_runs_past_the_quota_is_a_429_naming_it_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    from dormant.serving.api import api_handler
    from dormant.serving.runtime import load_served
    from dormant.serving.workflow import in_process_hooks
    from dormant.stores.sqlite import sqlite_store
    from tests.support.lambda_events import Client

    monkeypatch.setenv("DORMANT_TURN_QUOTA", "2/3600")
    store = sqlite_store(tmp_path / "q.db")
    served = load_served("bookings:build", store)
    started: list[Any] = []
    hooks = in_process_hooks(served)
    run = hooks.run
    assert run is not None
    counted = dataclasses.replace(hooks, run=lambda *args: started.append(args) or run(*args))
    client = Client(api_handler(counted, served))
    for sid in ("s-1", "s-2", "s-3"):
        body = {"session_id": sid, "scopes": {"user": "alex-doe"}}
        assert client.call("create_session", body=body)[0] == 201
    for sid in ("s-1", "s-2"):
        status, answer = client.call("run", session_id=sid)
        assert status == 200, answer
    before = client.call("session_events", session_id="s-3")[1]["events"]
    status, refused = client.call("run", session_id="s-3")
    assert status == 429, refused
    assert (refused["error"], refused["field"]) == ("TurnQuotaExceeded", "quota")
    assert "2 turns per 3600 s" in refused["message"]
    assert len(started) == 2  # no runner for the refused turn
    assert client.call("session_events", session_id="s-3")[1]["events"] == before  # nothing written
    assert client.call("run", session_id="s-3", tenant="tenant-b")[0] == 404  # another tenant: its own quota
    assert sorted(s["id"] for s in client.call("list_sessions")[1]["sessions"]) == ["s-1", "s-2", "s-3"]
    store.close()


# -- the template ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")
    from tests.support.cdk_template import synthesize

    default = synthesize(tmp_path_factory.mktemp("default"))
    chosen = synthesize(
        tmp_path_factory.mktemp("chosen"),
        {
            "throttle_rate": "7",
            "throttle_burst": "9",
            "machine_clients": "billing,crm",
            "client_rate": "3",
            "client_quota": "1000",
            "account_concurrency": "200",
            "reserved_resume": "0",
            "run_cap": "10",
            "waf_rate_limit": "500",
            "turn_quota": "100/3600",
        },
    )
    return default, chosen


def _reserved(synth: Any) -> dict[str, int | None]:
    from tests.support.cdk_template import function_of

    names = ("park", "resume", "sweeper", "run", "sessions", "tools", "commit")
    return {n: function_of(synth, n)[1]["Properties"].get("ReservedConcurrentExecutions") for n in names}


def _throttle(synth: Any, path: str = "/*/*") -> tuple[Any, Any]:
    """The stage's throttle (``path``: a method's, ``/~1sessions~1{id}~1runs/POST`` as API Gateway writes it)."""
    _, stage = synth.one("AWS::ApiGateway::Stage")
    settings = {f"{s['ResourcePath']}/{s['HttpMethod']}": s for s in stage["Properties"]["MethodSettings"]}
    return settings[path]["ThrottlingRateLimit"], settings[path]["ThrottlingBurstLimit"]


def test_defaults_throttle_the_stage_and_reserve_nothing(templates: tuple[Any, Any]) -> None:
    """The account's concurrency is not known: a reservation could leave it under Lambda's 100 unreserved (new
    accounts start at 10) and fail the deploy, so nothing is reserved until ``account_concurrency`` says."""
    default, _ = templates
    assert _throttle(default) == (50, 100)
    assert set(_reserved(default).values()) == {None}
    assert not default.of_type("AWS::ApiGateway::UsagePlan") and not default.of_type("AWS::WAFv2::WebACL")
    from tests.support.cdk_template import function_of

    assert function_of(default, "run")[1]["Properties"]["Environment"]["Variables"]["DORMANT_TURN_QUOTA"] == ""


def test_context_values_set_each_guardrail(templates: tuple[Any, Any]) -> None:
    from tests.support.cdk_template import function_of

    _, chosen = templates
    assert _throttle(chosen) == (7, 9)
    reserved = _reserved(chosen)
    assert (reserved["resume"], reserved["run"], reserved["park"]) == (None, 10, 5)
    plans = sorted(chosen.of_type("AWS::ApiGateway::UsagePlan").values(), key=lambda p: p["Properties"]["Description"])
    assert [p["Properties"]["Description"] for p in plans] == [
        "dormant machine client billing",
        "dormant machine client crm",
    ]
    for plan in plans:
        props = plan["Properties"]
        assert props["Throttle"] == {"RateLimit": 3, "BurstLimit": 20}
        assert props["Quota"] == {"Limit": 1000, "Period": "DAY"}
        assert len(props["ApiStages"]) == 1
    assert len(chosen.of_type("AWS::ApiGateway::UsagePlanKey")) == 2
    (acl,) = chosen.of_type("AWS::WAFv2::WebACL").values()
    (rule,) = acl["Properties"]["Rules"]
    assert rule["Statement"]["RateBasedStatement"] == {"Limit": 500, "AggregateKeyType": "IP"}
    assert rule["Action"] == {"Block": {}}
    assert len(chosen.of_type("AWS::WAFv2::WebACLAssociation")) == 1
    env = function_of(chosen, "run")[1]["Properties"]["Environment"]["Variables"]
    assert env["DORMANT_TURN_QUOTA"] == "100/3600"


def test_a_bad_guardrail_value_is_refused_at_synth(tmp_path: Path) -> None:
    pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")
    from tests.support.cdk_template import synthesize

    with pytest.raises(ConfigurationError):
        synthesize(tmp_path / "q", {"turn_quota": "lots"})
    with pytest.raises(ValueError, match="throttle_rate"):
        synthesize(tmp_path / "t", {"throttle_rate": "fast"})


def test_the_error_is_json_serializable() -> None:
    error = TurnQuotaExceeded(5, 60, 12)
    assert (
        json.dumps({"quota": error.quota, "retry_after": error.retry_after}) == '{"quota": "5/60", "retry_after": 12}'
    )


def _methods(synth: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(HTTP method, resource path) -> the method's properties, from the template."""

    def path_of(resource_id: Any) -> str:
        if "Fn::GetAtt" in resource_id:
            return ""  # the API's root
        props = synth.resources[resource_id["Ref"]]["Properties"]
        return path_of(props["ParentId"]) + "/" + props["PathPart"]

    return {
        (m["Properties"]["HttpMethod"], path_of(m["Properties"]["ResourceId"])): m["Properties"]
        for m in synth.of_type("AWS::ApiGateway::Method").values()
    }


def test_machine_clients_must_send_a_usage_plans_key(templates: tuple[Any, Any]) -> None:
    """With machine clients, every ``/clients`` method requires an API key, so each machine's calls go through its
    usage plan (metered, throttled); people's methods never do. Without them no key exists: none is required."""
    from dormant.serving.routes import CLIENT_PREFIX, ROUTES

    default, chosen = templates
    for synth, machines_keyed in ((default, False), (chosen, True)):
        methods = _methods(synth)
        for method, path, _ in ROUTES:
            twin = methods[(method, CLIENT_PREFIX + path)]
            assert twin.get("ApiKeyRequired", False) is machines_keyed, (method, path)
            assert twin["AuthorizationScopes"]  # the access token too
            assert not methods[(method, path)].get("ApiKeyRequired", False), (method, path)
    keyed = {key for key, props in _methods(chosen).items() if props.get("ApiKeyRequired")}
    assert keyed == {(method, CLIENT_PREFIX + path) for method, path, _ in ROUTES}
    # the plans that meter them are on the stage those methods are deployed to
    _, stage = chosen.one("AWS::ApiGateway::Stage")
    for plan in chosen.of_type("AWS::ApiGateway::UsagePlan").values():
        (api_stage,) = plan["Properties"]["ApiStages"]
        assert api_stage["Stage"] == {"Ref": chosen.one("AWS::ApiGateway::Stage")[0]}, api_stage
        assert api_stage["ApiId"] == stage["Properties"]["RestApiId"]


def test_every_throttle_and_quota_of_the_gateway_is_a_429_with_retry_after(templates: tuple[Any, Any]) -> None:
    """API Gateway's own throttles (the stage's, a method's, a usage plan's) and a plan's quota answer 429 in the
    handlers' error shape, with ``Retry-After``; with CORS origins, with the headers a page needs to read it."""
    from infra.api import ERROR_TEMPLATE

    for synth in templates:
        responses = {
            r["Properties"]["ResponseType"]: r["Properties"]
            for r in synth.of_type("AWS::ApiGateway::GatewayResponse").values()
        }
        for kind, after in (("THROTTLED", "'1'"), ("QUOTA_EXCEEDED", "'3600'")):
            response = responses[kind]
            assert response["StatusCode"] == "429"
            assert response["ResponseParameters"]["gatewayresponse.header.Retry-After"] == after
            assert response["ResponseTemplates"] == {"application/json": ERROR_TEMPLATE}


def test_the_held_routes_are_throttled_by_the_gateway_before_their_functions_cap(templates: tuple[Any, Any]) -> None:
    """``GET .../events``, ``POST .../runs`` and ``.../tools`` hold a function up to its timeout: their methods
    are throttled so their held functions stay within half the unreserved pool (1,000 when undeclared), and a
    capped function (``run_cap=10``) under its cap: the gateway's 429 comes before Lambda's throttle."""
    default, chosen = templates
    for held in ("/~1sessions~1{id}~1events/GET", "/~1clients~1sessions~1{id}~1tools/POST"):
        assert _throttle(default, held) == (1.7, 41)  # 41 + 1.7 x 24 s = 81.8 held at most, x 6 methods <= 500
    assert _throttle(chosen, "/~1sessions~1{id}~1runs/POST") == (0.1, 2)  # 2 + 0.1 x 24 = 4.4 of run's 10 / 2
    assert _throttle(chosen, "/~1clients~1sessions~1{id}~1runs/POST") == (0.1, 2)
    from infra.guardrails import Guardrails

    with pytest.raises(ValueError, match="cannot be throttled under it"):  # 2 of 4 each: no throttle keeps under
        Guardrails.from_context({"account_concurrency": "200", "run_cap": "4"}.get).held_throttling(24)
