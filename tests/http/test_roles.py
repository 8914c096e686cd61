"""Roles inside a tenant and a tenant per machine client: who may delete and erase (the admin group, or a machine
client's ``dormant/admin`` scope), which tenant a machine client's token acts in, and what every log line says
about who called. In the handlers (every route enumerated), and through ``dormant serve`` on every store."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.serving.local import proxy_event
from dormant.serving.routes import ADMIN_ROUTES, ROUTES, SCOPES
from dormant.serving.runtime import Served, for_tenant, load_served
from dormant.stores.sqlite import sqlite_store
from tests.support.lambda_events import LambdaContext
from tests.support.serve_calls import TIMEOUT, call
from tests.support.servers.serve import ServeProcess, dormant_serve

PERSON = "alex-doe"
ADMIN = {"sub": "ann", "token_use": "id", "custom:tenant": "clinic", "cognito:groups": "admins,staff"}
MEMBER = {"sub": "max", "token_use": "id", "custom:tenant": "clinic", "cognito:groups": "staff"}

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


def request(
    handler: Handler, method: str, path: str, claims: dict[str, str], body: Any = None, query: str = ""
) -> tuple[int, Any]:
    """``path`` through ``handler`` as API Gateway sends it, the caller's claims as the authorizer passes them."""
    prefix = "/clients" if path.startswith("/clients/") else ""
    parts = path.removeprefix(prefix).split("/")
    params = {"id": parts[2]} if len(parts) > 2 and parts[1] == "sessions" else {}
    resource = prefix + "/".join("{id}" if params and i == 2 else part for i, part in enumerate(parts))
    raw = b"" if body is None else json.dumps(body).encode()
    event = proxy_event(
        method, resource, path, params, query, [("Content-Type", "application/json")], raw, "x", "ip", "r"
    )
    event["requestContext"]["authorizer"]["claims"] = claims
    response = handler(event, LambdaContext())
    return response["statusCode"], json.loads(response["body"] or "null")


# -- every route, enumerated: what removes data needs the role ---------------------------------------------------

SAMPLES: dict[tuple[str, str], tuple[str, Any, str]] = {
    ("POST", "/sessions"): ("/sessions", {"session_id": "new-1"}, ""),
    ("GET", "/sessions"): ("/sessions", None, ""),
    ("GET", "/sessions/{id}"): ("/sessions/s-1", None, ""),
    ("DELETE", "/sessions/{id}"): ("/sessions/s-1", None, ""),
    ("GET", "/sessions/{id}/events"): ("/sessions/s-1/events", None, ""),
    ("GET", "/sessions/{id}/state"): ("/sessions/s-1/state", None, ""),
    ("GET", "/sessions/{id}/audit"): ("/sessions/s-1/audit", None, "scope=session&key=x"),
    ("POST", "/sessions/{id}/forks"): ("/sessions/s-1/forks", {"at": 1}, ""),
    ("POST", "/sessions/{id}/runs"): ("/sessions/s-1/runs", {"message": "hello"}, ""),
    ("POST", "/sessions/{id}/tools"): ("/sessions/s-1/tools", {"answers": []}, ""),
    ("POST", "/sessions/{id}/commit"): (
        "/sessions/s-1/commit",
        {"expected_version": 1, "events": [{"type": "user", "text": "x"}]},
        "",
    ),
    ("POST", "/erasures"): ("/erasures", {"scope": "user", "scope_id": PERSON}, ""),
    ("GET", "/openapi.json"): ("/openapi.json", None, ""),
}
"""A request for each route that would do its work if allowed; a new route must add one (the test checks)."""


def held(served: Served) -> dict[str, Any]:
    """What tenant clinic holds: each session's version and ledger length, and the person's shared state."""
    app = for_tenant(served.app, "clinic")
    sessions = {row.id: (row.version, len(app.sessions.require(row.id).events)) for row in app.sessions.list(limit=100)}
    return {"sessions": sessions, "user": app.store.load_scoped_state(app.name, "user", PERSON)}


def removed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    gone = [sid for sid in before["sessions"] if sid not in after["sessions"]]
    gone += [
        sid for sid, (_, n) in before["sessions"].items() if sid in after["sessions"] and after["sessions"][sid][1] < n
    ]
    gone += [f"user.{key}" for key, value in before["user"].items() if after["user"].get(key) != value]
    return gone


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Callable[[], tuple[Served, Handler]]]:
    """A new clinic each time: session ``s-1`` bound to the person, whose shared state holds a key."""
    from dormant.serving.api import api_handler
    from dormant.serving.workflow import in_process_hooks

    stores = []

    def make() -> tuple[Served, Handler]:
        store = sqlite_store(tmp_path / f"{uuid.uuid4().hex[:8]}.db")
        stores.append(store)
        served = load_served("bookings:build", store)
        app = for_tenant(served.app, "clinic")
        app.sessions.create("s-1", {"user": PERSON})
        store.save_scoped_state(app.name, "user", PERSON, {"name": "Alex"})
        return served, api_handler(in_process_hooks(served), served)

    yield make
    for store in stores:
        store.close()


def test_every_route_that_removes_data_needs_the_admin_role(fresh: Callable[[], tuple[Served, Handler]]) -> None:
    assert set(SAMPLES) == {(m, p) for m, p, _ in ROUTES}, "a new route: add a request for it to SAMPLES"
    assert {(m, p) for m, p, _ in ROUTES if m == "DELETE"} <= ADMIN_ROUTES
    destructive = set()
    for route, (path, body, query) in SAMPLES.items():
        # a member of the tenant: an administrative route is a 403 naming the role, and nothing changes
        served, handler = fresh()
        before = held(served)
        status, answer = request(handler, route[0], path, MEMBER, body, query)
        after = held(served)
        if route in ADMIN_ROUTES:
            assert status == 403, (route, status, answer)
            assert answer["error"] == "NotPermitted" and "'admins'" in answer["message"], answer
            assert after == before, (route, "wrote something")
        else:
            assert not removed(before, after), (route, "removed data for a member", removed(before, after))
        # an admin: the route does its work; whatever removes data must be an administrative route
        served, handler = fresh()
        before = held(served)
        status, answer = request(handler, route[0], path, ADMIN, body, query)
        assert status < 500, (route, status, answer)
        if removed(before, held(served)):
            destructive.add(route)
    assert destructive == ADMIN_ROUTES  # each administrative route did remove data when an admin asked


def test_a_machine_client_needs_the_admin_scope_not_a_group(fresh: Callable[[], tuple[Served, Handler]]) -> None:
    served, handler = fresh()
    robot = {"sub": "robot", "client_id": "robot", "token_use": "access", "scope": SCOPES["read"]}
    assert request(handler, "DELETE", "/clients/sessions/s-1", robot)[0] == 403
    served_app = for_tenant(served.app, "robot")
    served_app.sessions.create("s-1")
    assert request(handler, "DELETE", "/clients/sessions/s-1", {**robot, "scope": SCOPES["admin"]})[0] == 204
    assert served_app.sessions.get("s-1") is None


# -- a tenant per machine client ------------------------------------------------------------------------------------


def machine(client: str, *scopes: str) -> dict[str, str]:
    return {"sub": client, "client_id": client, "token_use": "access", "scope": " ".join(scopes)}


def test_each_machine_client_is_in_the_tenant_the_deployment_gives_it(
    fresh: Callable[[], tuple[Served, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = {"billing-id": "", "crm-id": "", "intake-id": "clinic"}
    monkeypatch.setenv("DORMANT_MACHINE_CLIENTS", json.dumps(clients))
    served, handler = fresh()
    read, run, answer = SCOPES["read"], SCOPES["run"], SCOPES["answer"]
    billing, crm = machine("billing-id", read, run), machine("crm-id", read, run)
    assert request(handler, "POST", "/clients/sessions", crm, {"session_id": "crm-1"})[0] == 201
    assert request(handler, "POST", "/clients/sessions", billing, {"session_id": "bill-1"})[0] == 201
    assert request(handler, "GET", "/clients/sessions/crm-1", billing)[0] == 404  # crm's is no session to billing
    assert [s["id"] for s in request(handler, "GET", "/clients/sessions", billing)[1]["sessions"]] == ["bill-1"]
    assert [s["id"] for s in request(handler, "GET", "/clients/sessions", crm)[1]["sessions"]] == ["crm-1"]
    # a client mapped to the clinic acts in it: it sees the clinic's session and starts a run there
    intake = machine("intake-id", read, run)
    assert request(handler, "GET", "/clients/sessions/s-1", intake)[0] == 200
    status, ran = request(handler, "POST", "/clients/sessions", intake, {"session_id": "intake-1"})
    assert status == 201 and for_tenant(served.app, "clinic").sessions.get("intake-1") is not None, ran
    assert request(handler, "GET", "/sessions/intake-1", MEMBER)[0] == 200  # a person of the clinic sees it
    # ... and answers only with answers.write
    answers = {"answers": [{"call_id": "c-1", "input": {"approved": True}}]}
    status, refused = request(handler, "POST", "/clients/sessions/s-1/tools", intake, answers)
    assert status == 403 and SCOPES["answer"] in refused["message"], refused
    assert request(handler, "POST", "/clients/sessions/s-1/tools", machine("intake-id", answer), answers)[0] != 403
    # a client the deployment does not list is refused, whatever its scopes
    status, refused = request(handler, "GET", "/clients/sessions", machine("stranger", read))
    assert status == 403 and "stranger" in refused["message"], refused


# -- through dormant serve, on every store ----------------------------------------------------------------------

STORES = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.backend("postgres")),
    pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
]


@pytest.fixture(params=STORES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServeProcess]:
    kind = request.param
    env: dict[str, str] = {}
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'roles.db'}"
    elif kind == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
    else:
        from tests.support.servers.dynamodb import store_for_process

        url, env = store_for_process(request.getfixturevalue("dynamodb_endpoint"), f"roles-{uuid.uuid4().hex[:12]}")
    with dormant_serve("--store", url, "--workers", "1", "--quiet", env=env, cwd=tmp_path, timeout=TIMEOUT) as process:
        yield process
    assert "Traceback" not in process.output()


def test_over_http_only_an_admin_deletes_and_erases(server: ServeProcess) -> None:
    clinic = f"clinic-{uuid.uuid4().hex[:8]}"  # a tenant of its own on a shared Postgres server

    def as_(principal: str, groups: str) -> dict[str, str]:
        return {"X-Dormant-Principal": principal, "X-Dormant-Tenant": clinic, "X-Dormant-Groups": groups}

    api, member, admin = server.url, as_("max", "staff"), as_("ann", "staff,admins")
    for sid in ("r-1", "r-2"):
        status, _ = call(f"{api}/sessions", "POST", {"session_id": sid, "scopes": {"user": PERSON}}, extra=member)
        assert status == 201
    status, refused = call(f"{api}/sessions/r-1", "DELETE", extra=member)
    assert status == 403 and refused["error"] == "NotPermitted" and "'admins'" in refused["message"], refused
    status, refused = call(f"{api}/erasures", "POST", {"scope": "user", "scope_id": PERSON}, extra=member)
    assert status == 403 and "'admins'" in refused["message"], refused
    listed = call(f"{api}/sessions", extra=member)[1]["sessions"]
    assert sorted(s["id"] for s in listed) == ["r-1", "r-2"]  # nothing written, nothing removed

    assert call(f"{api}/sessions/r-1", "DELETE", extra=admin)[0] == 204
    status, report = call(f"{api}/erasures", "POST", {"scope": "user", "scope_id": PERSON}, extra=admin)
    assert status == 200 and report["sessions"] == ["r-2"], report
    assert call(f"{api}/sessions", extra=member)[1]["sessions"] == []
    # who runs the server, naming no caller, is in the admin group
    mine = f"mine-{uuid.uuid4().hex[:8]}"
    assert call(f"{api}/sessions", "POST", {"session_id": mine})[0] == 201
    assert call(f"{api}/sessions/{mine}", "DELETE")[0] == 204


# -- erasure and point-in-time recovery ---------------------------------------------------------------------------


@pytest.mark.backend("dynamodb")
def test_an_erasure_names_what_point_in_time_recovery_keeps_and_until_when(
    dynamodb_endpoint: str, tmp_path: Path
) -> None:
    """A table with point-in-time recovery (``pitr_days`` in the store URL; the stack puts ``-c pitr_days`` there)
    can be restored as it was before the erasure, for that many days: the report says so, and until when."""
    from datetime import UTC, datetime, timedelta

    from tests.support.servers.dynamodb import store_for_process

    url, env = store_for_process(dynamodb_endpoint, f"pitr-{uuid.uuid4().hex[:12]}")
    with dormant_serve("--store", f"{url}&pitr_days=7", "--workers", "1", "--quiet", env=env, cwd=tmp_path) as server:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "p-1", "scopes": {"user": PERSON}})[0] == 201
        status, report = call(f"{server.url}/erasures", "POST", {"scope": "user", "scope_id": PERSON})
    assert status == 200 and report["sessions"] == ["p-1"], report
    ends = (datetime.now(UTC) + timedelta(days=7)).strftime("%Y-%m-%d")
    assert "point-in-time recovery" in report["residue"] and "7 days" in report["residue"], report
    assert f"until {ends}T" in report["residue"], report


def test_a_store_url_takes_a_recovery_period_of_1_to_35_days() -> None:
    from dormant.errors import ConfigurationError
    from dormant.stores.url import store_from_url

    for bad in ("0", "36", "x", "-1"):
        with pytest.raises(ConfigurationError, match="pitr_days"):
            store_from_url(f"dynamodb://abc?region=eu-west-1&pitr_days={bad}", create=False)


# -- log lines: the tenant, the principal and the client apart --------------------------------------------------


def test_log_lines_name_the_tenant_the_principal_and_the_client_apart(
    fresh: Callable[[], tuple[Served, Handler]], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The tenant key is the tenant (a person's tenant claim, a machine client's mapped tenant), not the ``sub``:
    the per-tenant log search docs/operating.md gives finds a clinic's people and machines."""
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "dormant-sessions")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"roles-{uuid.uuid4().hex[:8]}")  # a logger of its own
    monkeypatch.setenv("DORMANT_MACHINE_CLIENTS", json.dumps({"ops-id": "clinic"}))
    served, handler = fresh()
    app = for_tenant(served.app, "clinic")
    erase = {"scope": "user", "scope_id": PERSON}
    assert request(handler, "POST", "/erasures", {**ADMIN, "aud": "people-app"}, erase)[0] == 200
    app.sessions.create("s-2", {"user": PERSON})
    assert request(handler, "POST", "/clients/erasures", machine("ops-id", SCOPES["admin"]), erase)[0] == 200
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    erased = [(line["tenant"], line["principal"], line.get("client")) for line in logged if line["message"] == "erased"]
    assert erased == [("clinic", "ann", "people-app"), ("clinic", "ops-id", "ops-id")], logged


def test_who_calls_is_read_from_the_claims_and_the_deployments_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    from dormant.errors import ConfigurationError, NotAuthenticated, NotPermitted
    from dormant.serving.callers import identify, machine_clients

    person = identify({**MEMBER, "aud": "people-app"}, "custom:tenant", {"x": ""})
    assert (person.principal, person.tenant, person.client, person.groups, person.scopes) == (
        "max",
        "clinic",
        "people-app",
        frozenset({"staff"}),
        None,
    )
    assert identify({"sub": "solo", "token_use": "id"}, "custom:tenant", None).tenant == "solo"
    robot = machine("robot", SCOPES["read"])
    assert identify(robot, "custom:tenant", None).tenant == "robot"  # no mapping: its own, as before
    assert identify(robot, "custom:tenant", {"robot": ""}).tenant == "robot"  # "": its own
    assert identify(robot, "custom:tenant", {"robot": "clinic"}).tenant == "clinic"
    with pytest.raises(NotPermitted, match="robot"):
        identify(robot, "custom:tenant", {"other": ""})
    with pytest.raises(NotAuthenticated):
        identify({"token_use": "id"}, "custom:tenant", None)
    monkeypatch.delenv("DORMANT_MACHINE_CLIENTS", raising=False)
    assert machine_clients() is None
    for bad in ("[1]", "{not json", '{"a": 1}'):
        monkeypatch.setenv("DORMANT_MACHINE_CLIENTS", bad)
        with pytest.raises(ConfigurationError, match="DORMANT_MACHINE_CLIENTS"):
            machine_clients()
