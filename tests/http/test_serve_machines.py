"""Machine clients through ``dormant serve``, on SQLite, Postgres and DynamoDB Local: ``X-Dormant-Client`` and
``X-Dormant-Scopes`` are an access token's claims on the ``/clients`` routes, ``--machine-clients`` gives each
client its tenant, the authorizer's refusals are a 401 as on AWS, and the log lines name the tenant, the principal
and the client apart. (Who may delete and erase, and the erasure's point-in-time-recovery residue, through serve:
``test_roles.py``.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.cli import main
from dormant.serving.routes import SCOPES
from tests.support.servers.serve import ServeProcess, dormant_serve

TIMEOUT = 60
READ, RUN, ANSWER, ADMIN = SCOPES["read"], SCOPES["run"], SCOPES["answer"], SCOPES["admin"]
STORES = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.backend("postgres")),
    pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
]


@dataclass
class Served:
    process: ServeProcess
    clinic: str
    """The people's tenant, which ``intake`` and ``ops`` are mapped to."""
    ids: dict[str, str]
    """Each client's id on this server (unique: Postgres is shared by the tests)."""


@pytest.fixture(scope="module", params=STORES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``dormant serve`` of the people app, ``--machine-clients`` a file: ``billing`` and ``crm`` tenants of their
    own, ``intake`` and ``ops`` in the clinic."""
    kind, folder, uid = request.param, tmp_path_factory.mktemp("machines"), uuid.uuid4().hex[:8]
    env: dict[str, str] = {}
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'machines.db'}"
    elif kind == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
    else:
        from tests.support.servers.dynamodb import store_for_process

        url, env = store_for_process(request.getfixturevalue("dynamodb_endpoint"), f"machines-{uid}")
    clinic = f"clinic-{uid}"
    ids = {name: f"{name}-{uid}" for name in ("billing", "crm", "intake", "ops")}
    mapping = folder / "clients.json"
    mapping.write_text(json.dumps({ids["billing"]: "", ids["crm"]: "", ids["intake"]: clinic, ids["ops"]: clinic}))
    root = str(Path(__file__).resolve().parents[2])  # the app module lives in tests/support/
    args = ("--app", "tests.support.people_app:build", "--store", url, "--machine-clients", str(mapping))
    with dormant_serve(
        *args, "--workers", "1", "--quiet", env={"PYTHONPATH": root, **env}, cwd=root, timeout=TIMEOUT
    ) as process:
        yield Served(process, clinic, ids)
    assert "Traceback" not in process.output()


def caller(url: str, headers: dict[str, str]) -> Any:
    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        sent = {"Content-Type": "application/json", **headers}
        if method == "POST" and (path.endswith("/runs") or path.endswith("/tools")):
            sent["Prefer"] = "wait=20"  # the turn's result, not a 202
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    return call


def machine(served: Served, name: str, *scopes: str) -> Any:
    return caller(served.process.url, {"X-Dormant-Client": served.ids[name], "X-Dormant-Scopes": " ".join(scopes)})


def person(served: Served, principal: str, groups: str = "") -> Any:
    who = {"X-Dormant-Principal": principal, "X-Dormant-Tenant": served.clinic, "X-Dormant-Groups": groups}
    return caller(served.process.url, who)


def listed(call: Any) -> list[str]:
    status, page = call("GET", "/clients/sessions")
    assert status == 200, page
    return sorted(s["id"] for s in page["sessions"])


def test_billing_and_crm_each_see_only_their_own_tenants_sessions(served: Served) -> None:
    billing, crm = machine(served, "billing", READ, RUN), machine(served, "crm", READ, RUN)
    assert billing("POST", "/clients/sessions", {"session_id": "bill-1"})[0] == 201
    assert crm("POST", "/clients/sessions", {"session_id": "crm-1"})[0] == 201
    assert listed(billing) == ["bill-1"] and listed(crm) == ["crm-1"]
    assert billing("GET", "/clients/sessions/crm-1")[0] == 404  # crm's is no session to billing
    assert crm("GET", "/clients/sessions/bill-1")[0] == 404
    # neither is in the clinic: a person of it sees none of theirs
    assert person(served, "ann")("GET", "/sessions/bill-1")[0] == 404


def test_a_client_mapped_to_the_clinic_runs_there_and_answers_only_with_answers_write(served: Served) -> None:
    ann = person(served, "ann")
    assert ann("POST", "/sessions", {"session_id": "visit-1"})[0] == 201
    intake = machine(served, "intake", READ, RUN)
    assert "visit-1" in listed(intake)  # the clinic's session
    status, ran = intake("POST", "/clients/sessions/visit-1/runs", {"message": "note"})
    assert status == 200 and ran["status"] == "yielded_tool", ran
    (waiting,) = ran["yielded_tools"]
    events = ann("GET", "/sessions/visit-1/events?limit=1000")[1]["events"]
    assert [e["principal"] for e in events if e["type"] == "invocation_start"] == [served.ids["intake"]]
    answer = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True}}]}
    # without answers.write the authorizer refuses the token: a 401, as on AWS, and the call still waits
    status, refused = intake("POST", "/clients/sessions/visit-1/tools", answer)
    assert (status, refused["error"]) == (401, "UNAUTHORIZED") and ANSWER in refused["message"], refused
    assert ann("GET", "/sessions/visit-1")[1]["status"] == "awaiting_input"
    status, done = machine(served, "intake", ANSWER)("POST", "/clients/sessions/visit-1/tools", answer)
    assert status == 200 and done["status"] == "completed", done


def test_a_client_the_mapping_does_not_list_is_refused(served: Served) -> None:
    stranger = caller(served.process.url, {"X-Dormant-Client": "stranger", "X-Dormant-Scopes": f"{READ} {RUN}"})
    status, refused = stranger("GET", "/clients/sessions")
    assert status == 403 and "stranger" in refused["message"], refused
    status, refused = stranger("POST", "/clients/sessions", {"session_id": "x-1"})
    assert status == 403, refused


def test_each_route_takes_only_the_token_its_method_takes_on_aws(served: Served) -> None:
    """API Gateway's authorizer: ``/sessions...`` only an ID token, ``/clients/...`` only an access token holding
    the route's scope; anything else is a 401 before any handler runs."""
    billing = machine(served, "billing", READ, RUN)
    assert billing("GET", "/sessions")[0] == 401  # a machine on a person's method
    assert person(served, "ann")("GET", "/clients/sessions")[0] == 401  # a person on a machine's method
    status, refused = machine(served, "billing", RUN)("GET", "/clients/sessions")
    assert status == 401 and READ in refused["message"], refused
    status, refused = billing("POST", "/clients/erasures", {"scope": "user", "scope_id": "p"})
    assert status == 401 and ADMIN in refused["message"], refused


def test_a_machine_callers_headers_are_checked_and_named(served: Served) -> None:
    url = served.process.url
    bad = [
        ({"X-Dormant-Client": " "}, "X-Dormant-Client"),
        ({"X-Dormant-Client": "crm", "X-Dormant-Principal": "ann"}, "X-Dormant-Client"),
        ({"X-Dormant-Client": "crm", "X-Dormant-Scopes": "answers.write"}, "X-Dormant-Scopes"),
        ({"X-Dormant-Scopes": READ}, "X-Dormant-Scopes"),
    ]
    for headers, field in bad:
        status, refused = caller(url, headers)("POST", "/clients/sessions", {"session_id": "never"})
        assert (status, refused["field"]) == (400, field), (headers, refused)
    assert person(served, "ann")("GET", "/sessions/never")[0] == 404  # nothing written


def test_log_lines_name_the_tenant_the_principal_and_the_client_apart(served: Served) -> None:
    """What ``dormant serve`` writes on stdout is the handlers' Powertools JSON, keyed as on Lambda."""
    subject = {"scope": "user", "scope_id": f"p-{uuid.uuid4().hex[:6]}"}
    assert person(served, "ann", "admins")("POST", "/erasures", subject)[0] == 200
    assert machine(served, "ops", ADMIN)("POST", "/clients/erasures", subject)[0] == 200
    lines = [json.loads(line) for line in served.process.output().splitlines() if line.startswith("{")]
    erased = [
        (line["tenant"], line["principal"], line.get("client"))
        for line in lines
        if line["message"] == "erased" and line["tenant"] == served.clinic
    ]
    assert erased[-2:] == [(served.clinic, "ann", None), (served.clinic, served.ids["ops"], served.ids["ops"])]


@pytest.mark.parametrize("given", ["[1]", '{"crm": 1}', "no-such-file.json"])
def test_a_bad_mapping_is_a_usage_error_naming_it(
    given: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dormant.cli

    monkeypatch.setattr(dormant.cli, "_serve", lambda args: 0)  # a mapping let through must not start a server
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--machine-clients", given])
    assert stopped.value.code == 2
    assert "--machine-clients" in capsys.readouterr().err
