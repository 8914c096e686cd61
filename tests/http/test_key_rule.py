"""The one key rule over HTTP: a tenant, session id, scope id or cursor outside it is a 4xx naming its field,
with nothing written, on SQLite and DynamoDB Local (through the Lambda handler in-process, as
``tests.http.test_handlers`` runs it). The rule itself, on every store, is ``StoreContract``'s; here, that the
API answers it as a 4xx and never a 500, and that a tenant can never be an app's tenant's tenant."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant import adk
from dormant.errors import InvalidKey
from dormant.ids import MAX_KEY_LENGTH, split_app_name, tenant_app_name
from dormant.serving.runtime import Served, for_tenant, purge_tenants, view_of
from dormant.stores.base import BaseSessionStore
from tests.support.lambda_events import TENANT_A, Client, create


class Person(BaseModel):
    name: str = ""


DEFECTS = {"nul": "a\x00b", "lone-surrogate": "a\ud800b", "too-long": "k" * (MAX_KEY_LENGTH + 1)}


def nothing_stored(app: Served) -> None:
    store = app.app.store
    assert isinstance(store, BaseSessionStore)
    assert app.app.sessions.list() == []
    assert store.app_names(f"{app.app.name}@") in ([], None)


@pytest.mark.parametrize(
    "tenant", [*DEFECTS.values(), "eu@x", "@eu", "eu@"], ids=[*DEFECTS, "at", "at-first", "at-last"]
)
def test_a_tenant_outside_the_rule_is_a_400_naming_tenant_and_writes_nothing(
    client: Client,
    served: Served,
    tenant: str,
) -> None:
    """A tenant holding ``@`` would name another tenant's keys (``eu@x`` of ``bookings`` is ``bookings@eu@x``):
    refused before the route touches the store."""
    for name, extra in (("create_session", {"body": {"session_id": "s-1"}}), ("list_sessions", {})):
        got, refused = client.call(name, tenant=tenant, **extra)
        assert (got, refused["error"], refused["field"]) == (400, "InvalidKey", "tenant"), refused
    nothing_stored(served)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_session_or_scope_id_outside_the_rule_is_a_400_naming_it(
    client: Client,
    served: Served,
    defect: str,
) -> None:
    bad = DEFECTS[defect]
    got, refused = client.call("create_session", body={"session_id": bad})
    assert (got, refused["error"], refused["field"]) == (400, "InvalidSessionId", "session_id"), refused
    got, refused = client.call("create_session", body={"session_id": "s-1", "scopes": {"user": bad}})
    assert (got, refused["error"], refused["field"]) == (400, "InvalidSessionId", "scopes.user"), refused
    # In a path: the id a route takes is refused as such (400); one no route's segment matches (NUL, a lone
    # surrogate, once the gateway decoded the path) is no route (404). Never the catch-all's 500.
    got, refused = client.call("get_session", session_id=bad)
    expected = (400, "InvalidSessionId") if defect == "too-long" else (404, "NotFound")
    assert (got, refused["error"]) == expected, refused
    nothing_stored(served)


@pytest.mark.parametrize("cursor", ["\x00", "\ud800", "A" * 300, "e30", "garbage!"])
def test_a_cursor_outside_the_rule_is_a_400_naming_cursor(
    client: Client,
    cursor: str,
) -> None:
    create(client, "s-1")
    got, refused = client.call("list_sessions", query={"cursor": cursor, "limit": "5"})
    assert (got, refused["error"], refused["field"]) == (400, "InvalidKey", "cursor"), refused


def test_tenants_of_two_apps_and_an_app_named_like_a_tenant(
    client: Client,
    served: Served,
) -> None:
    """The issue's collision, tried as a new user would: an app ``bookings@tenant-a`` next to tenant
    ``tenant-a`` of ``bookings``. The app cannot be made, so the tenant's sessions are its own."""
    create(client, "s-1")
    store = served.app.store
    tenant = served.for_tenant(TENANT_A)
    assert isinstance(store, BaseSessionStore)
    store.save_scoped_state(tenant.name, "user", "alex-doe", {"name": "Alex Doe"})
    with pytest.raises(InvalidKey) as caught:
        adk(name=f"bookings@{TENANT_A}", store=store)
    assert caught.value.field == "app_name"
    # The nearest apps that can be made keep to their keys; purging or erasing them leaves the tenant's session.
    for name in (f"bookings.{TENANT_A}", f"bookings-{TENANT_A}"):
        near = adk(name=name, store=store, schema={"user": Person})
        near.sessions.create("s-1", scopes={"user": "alex-doe"})
        assert view_of(served.app, near.name) is None
        assert near.erase(scope="user", scope_id="alex-doe").sessions == ["s-1"]
        purge_tenants(near)
    assert client.call("get_session", session_id="s-1")[0] == 200
    assert store.load_scoped_state(tenant.name, "user", "alex-doe") == {"name": "Alex Doe"}
    assert store.bound_sessions(tenant.name, "user", "alex-doe") == ["s-1"]
    got, listed = client.call("list_sessions")
    assert got == 200 and [s["id"] for s in listed["sessions"]] == ["s-1"]


def test_the_tenant_separator_round_trips_and_has_one_reading() -> None:
    assert tenant_app_name("clinic", "eu") == "clinic@eu"
    assert split_app_name("clinic@eu") == ("clinic", "eu")
    assert split_app_name("clinic") == ("clinic", None)
    for name in ("clinic@eu@x", "@eu", "clinic@", "clinic@@eu"):
        with pytest.raises(InvalidKey):
            split_app_name(name)
    with pytest.raises(InvalidKey) as caught:
        tenant_app_name("clinic@eu", "x")
    assert caught.value.field == "app_name"
    app = adk(name="clinic")
    assert view_of(app, "clinic@eu") is not None and view_of(app, "clinic.eu@x") is None
    assert view_of(app, "clinic@eu@x") is None  # a name only a store written before the rule can hold
    with pytest.raises(Exception, match="already a tenant's view"):
        for_tenant(for_tenant(app, "eu"), "x")


@pytest.mark.parametrize("defect", [*sorted(DEFECTS), "empty"])
def test_an_event_id_outside_the_rule_is_a_400_and_writes_nothing(
    client: Client,
    served: Served,
    defect: str,
) -> None:
    """An event id is a key on every store (DynamoDB's id index): an empty one was a 503 after the gate there."""
    create(client, "s-1")
    events = [{"type": "user", "id": DEFECTS.get(defect, ""), "text": "hello", "created_at": 1_700_000_000_000}]
    got, refused = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": events})
    assert (got, refused["error"], refused["field"]) == (400, "InvalidKey", "events.0.id"), refused
    assert client.call("get_session", session_id="s-1")[1]["version"] == 1
    got, again = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": []})
    assert got == 200, again
