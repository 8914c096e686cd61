"""The template's machine clients, admin group and recovery period: ``-c machine_clients`` (JSON or ``name,name``),
``-c admin_group``, ``-c pitr_days``; and their refusals at synth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.backend("cdk")

pytest.importorskip("aws_cdk", reason="the infra tests need the infra extra (pip install 'dormant[infra]')")
pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")

from dormant.serving.routes import SCOPES  # noqa: E402
from infra.clients import MAX_MAPPING_BYTES, parse_machine_clients  # noqa: E402
from infra.stack import _admin_group  # noqa: E402
from infra.table import recovery_days  # noqa: E402
from tests.support.cdk_template import Synth, function_of, synthesize  # noqa: E402

CLIENTS = {
    "billing": {"scopes": ["sessions.read"]},
    "crm": {"scopes": ["sessions.read", "runs.write"], "tenant": "own"},
    "intake": {"scopes": ["sessions.read", "dormant/runs.write"], "tenant": "clinic-7"},
}


@pytest.fixture(scope="module")
def chosen(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    context = {"machine_clients": json.dumps(CLIENTS), "admin_group": "clinic-admins", "pitr_days": "7"}
    return synthesize(tmp_path_factory.mktemp("clients"), context)


def machine_clients(synth: Synth) -> dict[str, tuple[str, dict[str, Any]]]:
    """Name -> (logical id, properties) of each app client with a secret (a machine's)."""
    return {
        c["Properties"].get("ClientName", "Machines"): (logical, c["Properties"])
        for logical, c in synth.of_type("AWS::Cognito::UserPoolClient").items()
        if c["Properties"].get("GenerateSecret")
    }


def test_each_machine_client_is_an_app_client_of_its_own_with_only_its_scopes(chosen: Synth) -> None:
    found = machine_clients(chosen)
    assert sorted(found) == ["billing", "crm", "intake"]  # no shared client with every scope
    for name, (_, props) in found.items():
        assert props["AllowedOAuthFlows"] == ["client_credentials"]
        wanted = {f"dormant/{s.removeprefix('dormant/')}" for s in CLIENTS[name]["scopes"]}
        assert set(props["AllowedOAuthScopes"]) == wanted, name
    assert SCOPES["admin"] not in {s for _, p in found.values() for s in p["AllowedOAuthScopes"]}


def test_the_api_functions_know_each_clients_tenant(chosen: Synth) -> None:
    found = machine_clients(chosen)
    for name in ("sessions", "run", "tools", "commit"):
        _, fn = function_of(chosen, name)
        env = fn["Properties"]["Environment"]["Variables"]
        separator, parts = env["DORMANT_MACHINE_CLIENTS"]["Fn::Join"]
        rendered = separator.join(f"<{p['Ref']}>" if isinstance(p, dict) else p for p in parts)
        mapping = json.loads(rendered)
        assert mapping == {f"<{found[c][0]}>": t for c, t in (("billing", ""), ("crm", ""), ("intake", "clinic-7"))}
        assert env["DORMANT_ADMIN_GROUP"] == "clinic-admins"
    for name in ("park", "resume", "sweeper"):  # the workflow reads no caller
        assert "DORMANT_MACHINE_CLIENTS" not in function_of(chosen, name)[1]["Properties"]["Environment"]["Variables"]


def test_the_admin_group_is_made_and_the_recovery_period_set(chosen: Synth) -> None:
    _, group = chosen.one("AWS::Cognito::UserPoolGroup")
    assert group["Properties"]["GroupName"] == "clinic-admins"
    _, table = chosen.one("AWS::DynamoDB::Table")
    assert table["Properties"]["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True,
        "RecoveryPeriodInDays": 7,
    }
    _, fn = function_of(chosen, "sessions")
    store = fn["Properties"]["Environment"]["Variables"]["DORMANT_STORE"]
    assert "&pitr_days=7" in json.dumps(store)  # the functions learn the period from their store URL
    outputs = chosen.template["Outputs"]
    assert {"MachineClientIdbilling", "MachineClientIdcrm", "MachineClientIdintake"} <= set(outputs)


def test_the_list_form_still_gives_each_name_every_scope_in_a_tenant_of_its_own() -> None:
    clients = parse_machine_clients("billing,crm")
    assert [(c.name, set(c.scopes), c.tenant) for c in clients] == [
        ("billing", set(SCOPES.values()), None),
        ("crm", set(SCOPES.values()), None),
    ]
    assert parse_machine_clients(None) == parse_machine_clients("") == ()
    assert parse_machine_clients(["billing", "crm"]) == clients  # context from cdk.json arrives parsed
    assert parse_machine_clients(CLIENTS) == parse_machine_clients(json.dumps(CLIENTS))
    (default,) = parse_machine_clients('{"x": {}}')
    assert default.scopes == (SCOPES["read"],) and default.tenant is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"billing": {"scopes": ["sessions.write"]}}', "sessions.write"),
        ('{"billing": {"scopes": []}}', "scopes"),
        ('{"billing": {"scopes": ["sessions.read"], "tenant": "a@b"}}', "tenant"),
        ('{"billing": {"scope": ["sessions.read"]}}', "billing"),
        ('{"bill ing": {}}', "bill ing"),
        ('["billing"]', "not '[\"billing\"]'"),
        ("{not json", "JSON"),
        ("bill-ing,bill_ing", "differ"),
    ],
)
def test_a_bad_machine_client_is_refused_at_synth_naming_it(value: str, named: str) -> None:
    with pytest.raises(ValueError, match="machine_clients") as refused:
        parse_machine_clients(value)
    assert named in str(refused.value)


def test_the_mapping_must_fit_the_functions_environment(tmp_path: Path) -> None:
    many = {f"c{i}": {"tenant": "t" * 100} for i in range(MAX_MAPPING_BYTES // 100)}
    with pytest.raises(ValueError, match="4 KB"):
        synthesize(tmp_path, {"machine_clients": json.dumps(many)})


def test_the_recovery_period_and_the_admin_group_are_checked() -> None:
    assert recovery_days({}.get) == 35
    assert recovery_days({"pitr_days": "1"}.get) == 1
    for bad in ("0", "36", "x", "7.5"):
        with pytest.raises(ValueError, match="pitr_days"):
            recovery_days({"pitr_days": bad}.get)
    assert _admin_group({}.get) == "admins"
    for bad in ("two words", "a,b", "[a]"):
        with pytest.raises(ValueError, match="admin_group"):
            _admin_group({"admin_group": bad}.get)
