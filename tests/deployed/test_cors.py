"""CORS: the origins a deployment (``-c cors_origins=``) or ``dormant serve --cors-origin`` lets call the API from
a browser, and no other.

Locally: an allowed origin's page passes ``dormant serve``'s cross-site guard and gets the ``Access-Control-*``
headers and preflight answers the handlers give on Lambda; any other origin is still refused, writing nothing.
In the template: the origins reach the API functions' environment, every path takes an unauthenticated
``OPTIONS``, and API Gateway's own refusals carry the origin. (The deployed behaviour is proven in the fidelity
harness: ``test_a_browser_of_the_allowed_origin_and_no_other``.)
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.serving.local import LocalAPI
from dormant.serving.routes import PREFLIGHT_FUNCTION, ROUTES
from dormant.serving.runtime import load_served
from dormant.stores.url import store_from_url
from tests.support.servers.serve import dormant_serve

PAGE = "http://localhost:5173"
HOST = ("Host", "127.0.0.1:8000")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[LocalAPI]:
    store = store_from_url(f"sqlite:///{tmp_path / 'cors.db'}")
    yield LocalAPI(load_served("bookings:build", store), principal="clinic", cors_origins=[PAGE])
    store.close()


def test_a_page_of_an_allowed_origin_is_served_with_the_cors_headers(api: LocalAPI) -> None:
    browser = [HOST, ("Origin", PAGE), ("Sec-Fetch-Site", "cross-site"), ("Content-Type", "application/json")]
    reply = api.handle("POST", "/sessions", browser, b'{"session_id": "s-1"}', "127.0.0.1")
    assert reply.status == 201, reply
    assert reply.headers["Access-Control-Allow-Origin"] == PAGE
    assert reply.headers["Access-Control-Expose-Headers"] == "Location"
    assert reply.headers["Vary"] == "Origin"
    missing = api.handle("GET", "/sessions/nope", browser, b"", "127.0.0.1")  # an error is readable too
    assert missing.status == 404 and missing.headers["Access-Control-Allow-Origin"] == PAGE, missing


def test_a_preflight_is_answered_for_the_allowed_origin_without_a_caller(api: LocalAPI) -> None:
    asked = [HOST, ("Origin", PAGE), ("Access-Control-Request-Method", "POST"), ("Sec-Fetch-Site", "cross-site")]
    reply = api.handle("OPTIONS", "/sessions/s-1/runs", asked, b"", "127.0.0.1")
    assert reply.status == 204, reply
    assert reply.headers["Access-Control-Allow-Origin"] == PAGE
    assert "POST" in reply.headers["Access-Control-Allow-Methods"].split(",")
    allowed = reply.headers["Access-Control-Allow-Headers"].split(",")
    assert {"Authorization", "Content-Type", "Idempotency-Key", "Prefer", "X-Dormant-Principal"} <= set(allowed)


@pytest.mark.parametrize(
    "headers",
    [
        [HOST, ("Origin", "http://localhost:5174"), ("Sec-Fetch-Site", "cross-site")],  # another origin
        [HOST, ("Origin", "https://evil.example")],
        [("Host", "rebound.example:8000"), ("Origin", PAGE)],  # an allowed origin, through a rebound host name
        [HOST, ("Sec-Fetch-Site", "cross-site")],  # no Origin: not the allowed page
    ],
)
def test_any_other_origin_is_still_refused_and_writes_nothing(api: LocalAPI, headers: list[tuple[str, str]]) -> None:
    reply = api.handle("POST", "/sessions", [*headers, ("Content-Type", "text/plain")], b'{"session_id": "s-1"}', "::1")
    assert reply.status == 403 and reply.json()["error"] == "Forbidden", reply
    assert "Access-Control-Allow-Origin" not in reply.headers
    assert api.served.app.store.load("bookings@clinic", "s-1") is None
    preflight = api.handle("OPTIONS", "/sessions", [*headers, ("Access-Control-Request-Method", "POST")], b"", "::1")
    assert preflight.status == 403, preflight


def test_without_origins_no_page_is_served_and_no_preflight_answered(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'closed.db'}")
    try:
        api = LocalAPI(load_served("bookings:build", store), principal="clinic")
        reply = api.handle("GET", "/sessions", [HOST, ("Origin", PAGE)], b"", "127.0.0.1")
        assert reply.status == 403, reply
        own = api.handle("OPTIONS", "/sessions", [HOST], b"", "127.0.0.1")
        assert own.status == 405 and "Access-Control-Allow-Methods" not in own.headers, own
        plain = api.handle("GET", "/sessions", [HOST], b"", "127.0.0.1")
        assert plain.status == 200 and not any(h.startswith("Access-Control") for h in plain.headers), plain
    finally:
        store.close()


def test_dormant_serve_takes_cors_origin(tmp_path: Path) -> None:
    args = ("--store", f"sqlite:///{tmp_path / 'serve.db'}", "--workers", "1", "--sweep-every", "0", "--quiet")
    with dormant_serve(*args, "--cors-origin", PAGE, cwd=tmp_path, timeout=60) as server:
        headers = {"Origin": PAGE, "Access-Control-Request-Method": "POST", "Sec-Fetch-Site": "cross-site"}
        request = urllib.request.Request(f"{server.url}/sessions", method="OPTIONS", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == PAGE
        request = urllib.request.Request(f"{server.url}/sessions", headers={"Origin": PAGE})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Access-Control-Allow-Origin"] == PAGE
            assert json.loads(response.read())["sessions"] == []


# -- the template ----------------------------------------------------------------------------------------------


def _synth(tmp_path: Path, origins: str | None) -> object:
    pytest.importorskip("aws_cdk", reason="the template needs the infra extra")
    from tests.support.cdk_template import synthesize

    return synthesize(tmp_path, {"cors_origins": origins} if origins is not None else {})


@pytest.mark.backend("cdk")
def test_the_template_without_origins_opens_nothing(tmp_path: Path) -> None:
    from tests.support.cdk_template import Synth, function_of

    synth = _synth(tmp_path, None)
    assert isinstance(synth, Synth)
    methods = [m["Properties"] for m in synth.of_type("AWS::ApiGateway::Method").values()]
    # each route twice: for people, and under /clients for machine clients
    assert len(methods) == 2 * len(ROUTES) and all(m["AuthorizationType"] == "COGNITO_USER_POOLS" for m in methods)
    for name in ("sessions", "run", "tools", "commit"):
        assert function_of(synth, name)[1]["Properties"]["Environment"]["Variables"]["DORMANT_CORS_ORIGINS"] == ""
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.of_type("AWS::ApiGateway::GatewayResponse").values()
    }
    assert set(responses) == {"DEFAULT_4XX", "DEFAULT_5XX", "THROTTLED", "QUOTA_EXCEEDED"}
    for response in responses.values():
        # no Access-Control-Allow-Origin for anyone (a 429 says when to come back: Retry-After)
        assert set(response.get("ResponseParameters", {})) <= {"gatewayresponse.header.Retry-After"}
        assert '"error": "$context.error.responseType"' in response["ResponseTemplates"]["application/json"]


@pytest.mark.backend("cdk")
@pytest.mark.parametrize(
    ("origins", "allow_origin"),
    [
        ("https://app.example", "'https://app.example'"),
        ("https://a.example, https://b.example/", "method.request.header.Origin"),
    ],
)
def test_the_template_with_origins_takes_preflights_without_the_authorizer(
    tmp_path: Path, origins: str, allow_origin: str
) -> None:
    from tests.support.cdk_template import Synth, function_of

    synth = _synth(tmp_path, origins)
    assert isinstance(synth, Synth)
    preflight_id, _ = function_of(synth, PREFLIGHT_FUNCTION)
    resources = synth.resources
    options = [
        m["Properties"]
        for m in synth.of_type("AWS::ApiGateway::Method").values()
        if m["Properties"]["HttpMethod"] == "OPTIONS"
    ]
    assert len(options) == len({path for _, path, _ in ROUTES})
    for method in options:
        assert method["AuthorizationType"] == "NONE" and "AuthorizerId" not in method
        assert preflight_id in json.dumps(method["Integration"]["Uri"])
    others = [
        m["Properties"]
        for m in synth.of_type("AWS::ApiGateway::Method").values()
        if m["Properties"]["HttpMethod"] != "OPTIONS"
    ]
    assert all(m["AuthorizationType"] == "COGNITO_USER_POOLS" for m in others)
    expected = ",".join(o.strip().rstrip("/") for o in origins.split(","))
    for name in ("sessions", "run", "tools", "commit"):
        assert function_of(synth, name)[1]["Properties"]["Environment"]["Variables"]["DORMANT_CORS_ORIGINS"] == expected
    for response in synth.of_type("AWS::ApiGateway::GatewayResponse").values():
        parameters = response["Properties"]["ResponseParameters"]
        assert parameters["gatewayresponse.header.Access-Control-Allow-Origin"] == allow_origin
    assert resources  # the stack synthesized with cdk-nag's checks (each preflight's findings acknowledged)
