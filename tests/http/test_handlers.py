"""The Lambda handlers, driven by the sample events in ``events/``, over the Bookings app on a SQLite file.

Every request goes through the real handler (Powertools resolver, Logger, Metrics) as API Gateway
would call it; the tenant is the Cognito ``sub`` claim in the event's request context.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.errors import TurnNotClaimed
from dormant.events import InvocationStartEvent
from dormant.serving.api import MAX_BODY_BYTES, MAX_LIST_LIMIT, api_handler
from dormant.serving.idempotency import DynamoDBIdempotency
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import (
    StepFunctions,
    execution_name,
    in_process_hooks,
    step_functions_hooks,
    sweeper_handler,
    tasks,
    workflow_handler,
)
from dormant.session import Session
from dormant.stores.sqlite import SQLiteSessionStore, sqlite_store
from dormant.stores.url import store_from_url
from tests.support.lambda_events import EVENTS, TENANT_A, TENANT_B, Client, LambdaContext, create, load_event

REQUEST = "I need physio on Tuesday afternoon, for Alex Doe"


def wait_for(client: Client, session_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The session once ``done`` holds for it (a turn runs in a thread after its request answered 202)."""
    deadline = time.monotonic() + 30
    while True:
        shown: dict[str, Any] = client.call("get_session", session_id=session_id)[1]
        if done(shown):
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.02)


# -- every event parses and reaches its route ------------------------------------------------------


def test_every_sample_api_event_is_served(client: Client) -> None:
    # the events name session s-sample; create it first so each route meets a real session
    assert client.call("create_session")[0] == 201
    statuses = {}
    names = ("get_session", "list_sessions", "session_events", "commit", "run", "tools")
    for name in (*names, "session_state", "key_audit", "fork_session", "delete_session", "erase"):
        statuses[name] = client.call(name)[0]
    # tools answers a call id the sample run did not make: UnknownCallId, served with its own status (409),
    # as POST /commit serves the same mistake
    assert statuses == {
        "get_session": 200,
        "list_sessions": 200,
        "session_events": 200,
        "commit": 200,
        "run": 200,
        "tools": 409,
        "session_state": 200,
        "key_audit": 200,
        "fork_session": 201,
        "delete_session": 204,
        "erase": 200,
    }


# -- sessions --------------------------------------------------------------------------------------


def test_create_show_list_page_delete(client: Client) -> None:
    created = create(client)
    assert created["id"] == "s-1" and created["version"] == 1 and created["status"] == "idle"
    assert created["scopes"] == {"user": "alex-doe"}

    status, shown = client.call("get_session", session_id="s-1")
    assert status == 200
    assert set(shown) == {"id", "version", "status", "scopes", "state", "yielded_tools", "updated_at"}
    assert set(shown["state"]) == {"session", "user"}

    status, page = client.call("list_sessions", query={"limit": "10"})
    assert status == 200 and [s["id"] for s in page["sessions"]] == ["s-1"]

    assert client.call("delete_session", session_id="s-1") == (204, None)
    assert client.call("get_session", session_id="s-1")[0] == 404
    assert client.call("delete_session", session_id="s-1")[0] == 404


def test_a_page_of_the_ledger_near_its_head_reads_only_the_tail_from_the_store(tmp_path: Path) -> None:
    from tests.support.snapshots_app import CountingWithSnapshots, build

    store = CountingWithSnapshots(sqlite_store(tmp_path / "pages.db"))
    app, agent, _ = build(store)  # its agent shows the last 2 turns: a load reads a snapshot and the tail
    served = Served(app, {agent.name: agent})
    client = Client(api_handler(in_process_hooks(served), served))
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    for version in range(1, 41):  # 120 events, one snapshot every few commits
        events = [{"type": "user", "text": f"note {version}.{n}"} for n in range(3)]
        status, body = client.call("commit", session_id="s-1", body={"expected_version": version, "events": events})
        assert status == 200, body
    whole = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    assert len(whole) == 120
    # Remote commits go through the app's commit, which keeps snapshots as a run's commits do.
    assert store.inner.load_snapshot(f"{app.name}@{TENANT_A}", "s-1") is not None

    store.loads.clear()
    status, page = client.call("session_events", session_id="s-1", query={"after": "110", "limit": "5"})
    assert status == 200 and page["events"] == whole[110:115] and page["next"] == 115
    assert store.loads and min(after for after, _ in store.loads) > 30  # the tail after a recent snapshot
    assert sum(size for _, size in store.loads) < 20

    status, page = client.call("session_events", session_id="s-1", query={"after": "3", "limit": "4"})
    assert status == 200 and page["events"] == whole[3:7] and page["next"] == 7  # an old page still reads


def test_listing_pages_with_a_cursor(client: Client) -> None:
    for n in range(5):
        create(client, f"s-{n}")
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        status, page = client.call("list_sessions", query=query)
        assert status == 200
        seen += [s["id"] for s in page["sessions"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"s-{n}" for n in range(5)] and len(seen) == 5


def test_a_listing_by_status_reads_on_until_its_page_is_full(client: Client) -> None:
    from dormant.clock import frozen_clock

    with frozen_clock(1_796_000_000_000) as clock:
        for n in range(7):
            create(client, f"s-{n}")
            clock.advance(1000)
        for n in (0, 1, 3):  # the oldest ones wait on a human
            assert client.call("run", session_id=f"s-{n}")[1]["status"] == "yielded_tool"
            clock.advance(1000)
        for n in range(4, 7):  # and the newest were touched last
            assert client.call("commit", session_id=f"s-{n}", body={"expected_version": 1, "events": []})[0] == 200
            clock.advance(1000)
    query = {"limit": "2", "status": "awaiting_input"}
    seen, cursor, pages = [], None, 0
    while True:
        status, page = client.call("list_sessions", query={**query, **({"cursor": cursor} if cursor else {})})
        assert status == 200 and len(page["sessions"]) <= 2
        assert {s["status"] for s in page["sessions"]} <= {"awaiting_input"}
        seen += [s["id"] for s in page["sessions"]]
        pages += 1
        cursor = page["cursor"]
        if cursor is None:
            break
    assert seen == ["s-3", "s-1", "s-0"] and pages <= 3
    # the first page is full although the newest sessions in the store do not match
    first = client.call("list_sessions", query=query)[1]
    assert [s["id"] for s in first["sessions"]] == ["s-3", "s-1"]


def test_a_tenant_sees_only_its_own_sessions(client: Client, served: Served) -> None:
    create(client, "shared-id", tenant=TENANT_A)
    assert client.call("get_session", tenant=TENANT_B, session_id="shared-id")[0] == 404
    assert client.call("session_events", tenant=TENANT_B, session_id="shared-id")[0] == 404
    assert client.call("run", tenant=TENANT_B, session_id="shared-id")[0] == 404
    assert client.call("delete_session", tenant=TENANT_B, session_id="shared-id")[0] == 404
    assert client.call("list_sessions", tenant=TENANT_B)[1]["sessions"] == []
    # the same id is free for tenant B: its keys are its own
    create(client, "shared-id", tenant=TENANT_B)
    assert client.call("get_session", tenant=TENANT_A, session_id="shared-id")[0] == 200
    # by construction: the store holds them under different app names
    store = served.app.store
    assert store.load(f"bookings@{TENANT_A}", "shared-id") is not None
    assert store.load(f"bookings@{TENANT_B}", "shared-id") is not None
    assert store.load("bookings", "shared-id") is None


def test_no_authenticated_caller_is_a_401(client: Client) -> None:
    assert client.call("list_sessions", tenant=None)[0] == 401


# -- bad input: a 4xx naming the field, nothing written --------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("create_session", {"session_id": "s-9", "scopes": "not-a-map"}, "scopes"),
        ("create_session", {"session_id": "s-9", "scopes": {"user": "bad id"}}, "scopes.user"),
        ("create_session", {"session_id": "s-9", "scopes": {"patient": "p-1"}}, "scopes.patient"),  # not declared
        ("create_session", {"session_id": "s-9", "colour": "red"}, "colour"),
        ("create_session", {"session_id": "bad id with spaces"}, "session_id"),
        ("run", {"message": 42}, "message"),
        ("tools", {"answers": []}, "answers"),
        ("commit", {"expected_version": -1, "events": []}, "expected_version"),
        # the session is at version 1: JSON true or "1" is no version (else they would write)
        ("commit", {"expected_version": True, "events": [{"type": "user", "text": "hi"}]}, "expected_version"),
        ("commit", {"expected_version": "1", "events": [{"type": "user", "text": "hi"}]}, "expected_version"),
        ("commit", {"expected_version": 1.0, "events": [{"type": "user", "text": "hi"}]}, "expected_version"),
        ("commit", {"expected_version": 1, "events": [{"type": "no-such-event"}]}, "events.0"),
        ("erase", {"scope": "session", "scope_id": "s-1"}, "scope"),
        ("erase", {"scope": "user"}, "scope_id"),
        ("erase", {"scope": "user", "scope_id": "alex doe"}, "scope_id"),
        ("erase", {"scope": "user", "scope_id": "alex-doe", "everyone": True}, "everyone"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field_and_writes_nothing(
    client: Client, served: Served, route: str, body: dict[str, Any], field: str
) -> None:
    create(client)
    before = client.call("get_session", session_id="s-1")[1]
    status, error = client.call(route, session_id="s-1", body=body)
    assert status == 400, error
    assert error["field"] == field
    assert "Traceback" not in json.dumps(error)
    assert client.call("get_session", session_id="s-1")[1] == before
    assert [s["id"] for s in client.call("list_sessions")[1]["sessions"]] == ["s-1"]


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[" * 100_000 + "]" * 100_000,  # within the size limit, too deep for the parser: no 500
        '{"expected_version": 1, "events": [{"type": "user", "text": "x", "deep": ' + "[" * 5000 + "]" * 5000 + "}]}",
    ],
)
@pytest.mark.parametrize("route", ["create_session", "commit"])
def test_a_body_that_is_not_json_is_a_400(client: Client, route: str, raw: str) -> None:
    create(client)
    status, error = client.call(route, session_id="s-1", raw_body=raw)
    assert status == 400 and error["field"] == "body", error
    assert client.call("get_session", session_id="s-1")[1]["version"] == 1


def test_an_oversized_body_is_a_413_and_writes_nothing(client: Client) -> None:
    create(client)
    status, error = client.call("run", session_id="s-1", body={"message": "x" * MAX_BODY_BYTES})
    assert status == 413 and error["field"] == "body"
    assert client.call("get_session", session_id="s-1")[1]["version"] == 1


def test_a_bad_query_parameter_is_a_400(client: Client) -> None:
    create(client)
    status, error = client.call("session_events", session_id="s-1", query={"limit": "0"})
    assert (status, error["field"]) == (400, "limit"), error  # not the default page
    assert client.call("list_sessions", query={"limit": "many"})[1]["field"] == "limit"
    assert client.call("list_sessions", query={"limit": "0"})[0] == 400
    for huge in (str(MAX_LIST_LIMIT + 1), "99999999999999999999"):  # beyond any store's integer
        status, error = client.call("list_sessions", query={"limit": huge})
        assert (status, error["field"]) == (400, "limit"), error
    assert client.call("list_sessions", query={"limit": str(MAX_LIST_LIMIT)})[0] == 200
    for loose in ("1_000", " 1", "-5", "+3", "\u0661"):  # int() would take all but -5; -5 said ">= 0"
        status, error = client.call("session_events", session_id="s-1", query={"after": loose})
        assert (status, error["field"]) == (400, "after"), (loose, error)
    status, error = client.call("session_events", session_id="s-1", query={"limit": str(MAX_LIST_LIMIT + 1)})
    assert (status, error["field"]) == (400, "limit"), error
    status, error = client.call("list_sessions", query={"status": "awaiting"})  # a typo lists nothing, silently
    assert (status, error["field"]) == (400, "status") and "awaiting_input" in error["message"], error
    assert client.call("list_sessions", query={"status": "idle"})[1]["sessions"][0]["id"] == "s-1"


def test_unknown_sessions_are_404s(client: Client) -> None:
    for route in ("get_session", "session_events", "run", "tools", "commit", "delete_session"):
        status, error = client.call(route, session_id="nobody")
        assert status == 404, (route, error)
        assert error["error"] == "SessionNotFound"


# -- the Bookings arc: run, yield, answer, resume ----------------------------------------------------


def test_run_yields_then_answers_resume_it_to_completion(client: Client) -> None:
    create(client)
    status, ran = client.call("run", session_id="s-1")
    assert status == 200, ran
    assert ran["status"] == "yielded_tool" and ran["commit_status"] == "committed"
    (call,) = ran["yielded_tools"]
    assert call["name"] == "request_approval"
    assert call["answer_schema"]["properties"]["approved"]["type"] == "boolean"
    version = ran["version"]

    # an answer that fails the yield schema (as strict JSON: 1 or "yes" is no approval) is its declared class
    # and status (ToolInputError, 422); one to an unknown call is UnknownCallId (409); each names the value
    # in this body (answers.N), and nothing is stored
    for wrong in ("perhaps", 1, "yes", "true"):
        status, error = client.call(
            "tools", session_id="s-1", body={"answers": [{"call_id": call["call_id"], "input": {"approved": wrong}}]}
        )
        assert (status, error["error"], error["field"]) == (422, "ToolInputError", "answers.0.input.approved"), (
            wrong,
            error,
        )
    status, error = client.call("tools", session_id="s-1", body={"answers": [{"call_id": "c-x", "input": {}}]})
    assert (status, error["error"], error["field"]) == (409, "UnknownCallId", "answers.0.call_id"), error
    right = {"call_id": call["call_id"], "input": {"approved": True}}  # with a wrong one after it: neither lands
    status, error = client.call("tools", session_id="s-1", body={"answers": [right, {"call_id": "c-x", "input": {}}]})
    assert (status, error["field"]) == (409, "answers.1.call_id"), error
    assert client.call("get_session", session_id="s-1")[1]["version"] == version

    status, accepted = client.call(
        "tools", session_id="s-1", body={"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    )
    assert status == 202 and accepted["status"] in ("running", "resumable", "completed"), accepted
    shown = wait_for(client, "s-1", lambda s: s["status"] == "completed")
    assert shown["yielded_tools"] == []
    assert shown["state"]["session"]["confirmation"]["patient"] == "Alex Doe"

    status, ledger = client.call("session_events", session_id="s-1", query={"after": "0", "limit": "3"})
    assert status == 200 and len(ledger["events"]) == 3 and ledger["next"] == 3


def started_elsewhere(served: Served, invocation_id: str) -> Session:
    """Session s-1 as another process leaves it once it has claimed a run (an invocation started)."""
    app = served.for_tenant(TENANT_A)
    session = app.sessions.require("s-1")
    session.append(InvocationStartEvent(invocation_id=invocation_id, agent_name="bookings"))
    app.sessions.commit(session)
    return session


def test_a_run_on_a_session_held_by_another_run_is_a_409_and_runs_nothing(client: Client, served: Served) -> None:
    create(client)
    session = started_elsewhere(served, "inv-elsewhere")
    status, error = client.call("run", session_id="s-1")
    assert status == 409 and error["error"] == "ClaimLost", error
    assert client.call("get_session", session_id="s-1")[1]["version"] == session.version


def test_a_run_left_running_by_a_dead_process_is_taken_over_only_when_asked(client: Client, served: Served) -> None:
    create(client)
    session = started_elsewhere(served, "inv-died")
    for bad in ("yes", 1, None):
        status, error = client.call("run", session_id="s-1", body={"message": "hi", "takeover": bad})
        assert (status, error["field"]) == (400, "takeover"), error
    assert client.call("run", session_id="s-1")[0] == 409
    assert client.call("get_session", session_id="s-1")[1]["version"] == session.version

    status, ran = client.call("run", session_id="s-1", body={"message": REQUEST, "takeover": True})
    assert status == 200 and ran["status"] == "yielded_tool", ran
    assert client.call("get_session", session_id="s-1")[1]["status"] == "awaiting_input"


def test_an_answer_that_another_answer_beat_is_a_409_and_stores_nothing(client: Client) -> None:
    """Two people approve at once: both read the call waiting, one answer lands; the other is a conflict
    (the caller lost a race, as with ``ClaimLost``). A call that never waited is the same class and status
    (``UnknownCallId``, 409, as on ``POST /commit``); only the race's message says it was answered already."""
    create(client)
    call = client.call("run", session_id="s-1")[1]["yielded_tools"][0]
    assert approve(client, "s-1", call["call_id"])[0] == 200
    version = client.call("get_session", session_id="s-1")[1]["version"]
    status, error = approve(client, "s-1", call["call_id"])
    assert (status, error["error"], error["field"]) == (409, "UnknownCallId", "answers.0.call_id"), error
    assert "answered already" in error["message"], error
    status, error = client.call("tools", session_id="s-1", body={"answers": [{"call_id": "c-never", "input": {}}]})
    assert (status, error["error"], error["field"]) == (409, "UnknownCallId", "answers.0.call_id"), error
    assert "answered already" not in error["message"], error
    assert client.call("get_session", session_id="s-1")[1]["version"] == version


def test_a_message_to_a_session_waiting_for_answers_is_a_409_naming_the_calls_and_writes_nothing(
    client: Client,
) -> None:
    """It was stored and never acted on (a 200 saying ``yielded_tool``), and two of them both landed."""
    create(client)
    call = client.call("run", session_id="s-1")[1]["yielded_tools"][0]
    shown = client.call("get_session", session_id="s-1")[1]
    assert shown["status"] == "awaiting_input"
    for text in ("Any news?", "Make it Wednesday instead"):
        status, error = client.call("run", session_id="s-1", body={"message": text})
        assert (status, error["error"], error["field"]) == (409, "AwaitingInput", "message"), error
        assert call["call_id"] in error["message"] and "/tools" in error["message"]
    assert client.call("get_session", session_id="s-1")[1] == shown
    status, answered = approve(client, "s-1", call["call_id"])
    assert status == 200 and answered["status"] == "completed", answered


# -- the inspector's reads: state at an event, the audit of a key, forks --------------------------


def booked(client: Client, session_id: str = "s-1") -> list[dict[str, Any]]:
    """Run the Bookings arc to completion through the API; return its ledger."""
    create(client, session_id)
    call = client.call("run", session_id=session_id)[1]["yielded_tools"][0]
    assert approve(client, session_id, call["call_id"])[0] == 200
    status, ledger = client.call("session_events", session_id=session_id, query={"limit": "500"})
    assert status == 200 and ledger["next"] is None
    return ledger["events"]  # type: ignore[no-any-return]


def test_state_at_every_event_is_the_ledger_replayed_with_what_that_event_changed(
    client: Client, served: Served
) -> None:
    ledger = booked(client)
    session = served.for_tenant(TENANT_A).sessions.require("s-1")
    for index, event in enumerate(ledger):
        status, view = client.call("session_state", session_id="s-1", query={"at": str(index)})
        assert status == 200, view
        snapshot = session.state_at(index)
        assert view["index"] == index and view["since"] == index - 1
        assert view["state"] == {"session": snapshot.session_state, **snapshot.scoped_states}
        assert view["status"] == snapshot.status
        assert [(y["call_id"], y["name"]) for y in view["yielded_tools"]] == [
            (y.call_id, y.name) for y in snapshot.yielded_tools
        ]
        expected = [
            {"scope": event["scope"], "key": c["key"], "before": c["old_value"], "after": c["new_value"]}
            for c in (event["changes"] if event["type"] == "state_change" else [])
        ]
        assert view["changes"] == expected, (index, event["type"])
    # the waiting call at the yield, gone once answered; the invocation tree at the end
    yielded = next(i for i, e in enumerate(ledger) if e["type"] == "invocation_yield")
    waiting = client.call("session_state", session_id="s-1", query={"at": str(yielded)})[1]
    assert waiting["status"] == "awaiting_input" and waiting["yielded_tools"][0]["name"] == "request_approval"
    last = client.call("session_state", session_id="s-1", query={})[1]
    assert last["index"] == len(ledger) - 1 and last["status"] == "completed"
    (invocation,) = last["invocations"]
    assert invocation["status"] == "completed" and invocation["end_index"] == len(ledger) - 1
    assert invocation["model_calls"] == sum(e["type"] == "model_start" for e in ledger)


def test_state_since_an_event_is_the_diff_between_the_two(client: Client) -> None:
    ledger = booked(client)
    status, view = client.call("session_state", session_id="s-1", query={"at": str(len(ledger) - 1), "since": "0"})
    assert status == 200 and view["since"] == 0
    changed = {(c["scope"], c["key"]): (c["before"], c["after"]) for c in view["changes"]}
    assert set(changed) == {
        ("session", "approved_slot"),
        ("session", "confirmation"),
        ("user", "name"),
        ("user", "preferences"),
    }
    assert changed["session", "approved_slot"] == (None, "physio-tue-1430")
    # backwards: the same keys, before and after swapped
    back = client.call("session_state", session_id="s-1", query={"at": "0", "since": str(len(ledger) - 1)})[1]
    assert {(c["scope"], c["key"]): (c["after"], c["before"]) for c in back["changes"]} == changed


def test_state_of_a_bad_index_is_a_4xx(client: Client) -> None:
    create(client)
    assert client.call("session_state", session_id="s-1", query={})[1]["error"] == "EventIndexError"  # no events
    booked(client, "s-2")
    status, error = client.call("session_state", session_id="s-2", query={"at": "999"})
    assert (status, error["error"], error["field"]) == (404, "EventIndexError", "at"), error
    status, error = client.call("session_state", session_id="s-2", query={"at": "3", "since": "999"})
    assert (status, error["field"]) == (404, "since"), error  # the parameter that is out of range
    assert client.call("session_state", session_id="s-2", query={"at": "x"})[1]["field"] == "at"
    assert client.call("session_state", session_id="s-2", query={"at": "-1"})[1]["field"] == "at"
    assert client.call("session_state", session_id="s-2", query={"since": "999"})[0] == 404


def test_the_audit_of_a_key_names_each_change_its_invocation_and_tool(client: Client) -> None:
    ledger = booked(client)
    status, audit = client.call("key_audit", session_id="s-1", query={"scope": "session", "key": "confirmation"})
    assert status == 200
    (change,) = audit["changes"]
    event = ledger[change["index"]]
    assert event["type"] == "state_change" and change["event_id"] == event["id"]
    assert change["created_at"] == event["created_at"] and change["invocation_id"] == event["invocation_id"]
    assert (change["source"], change["tool"], change["old_value"]) == ("mutation", "book_slot", None)
    assert change["new_value"]["patient"] == "Alex Doe"
    call = next(e for e in ledger if e["type"] == "tool_call" and e["name"] == "book_slot")
    assert change["call_id"] == call["call_id"]
    # the approval's answer set approved_slot inside request_approval's run; user.name by remember_patient
    approved = client.call("key_audit", session_id="s-1", query={"scope": "session", "key": "approved_slot"})[1]
    assert [c["tool"] for c in approved["changes"]] == ["request_approval"]
    named = client.call("key_audit", session_id="s-1", query={"scope": "user", "key": "name"})[1]
    assert [(c["tool"], c["scope_id"], c["new_value"]) for c in named["changes"]] == [
        ("remember_patient", "alex-doe", "Alex Doe")
    ]
    assert client.call("key_audit", session_id="s-1", query={"scope": "session", "key": "refusal"})[1]["changes"] == []


def test_the_audit_needs_a_known_scope_and_a_key(client: Client) -> None:
    create(client)
    assert client.call("key_audit", session_id="s-1", query={"key": "x"})[1]["field"] == "scope"
    assert client.call("key_audit", session_id="s-1", query={"scope": "session"})[1]["field"] == "key"
    status, error = client.call("key_audit", session_id="s-1", query={"scope": "galaxy", "key": "x"})
    assert status == 400 and error["field"] == "scope"


def test_a_fork_at_an_event_is_a_new_session_holding_the_ledger_up_to_it(client: Client) -> None:
    ledger = booked(client)
    yielded = next(i for i, e in enumerate(ledger) if e["type"] == "invocation_yield")
    status, forked = client.call("fork_session", session_id="s-1", body={"at": yielded, "reason": "ask again"})
    assert status == 201, forked
    assert forked["id"] != "s-1" and forked["status"] == "awaiting_input"
    assert [y["name"] for y in forked["yielded_tools"]] == ["request_approval"]
    copied = client.call("session_events", session_id=forked["id"], query={"limit": "500"})[1]["events"]
    assert [e["id"] for e in copied[:-1]] == [e["id"] for e in ledger[: yielded + 1]]
    assert copied[-1]["type"] == "session_forked" and copied[-1]["from_session_id"] == "s-1"
    assert copied[-1]["at_event_id"] == ledger[yielded]["id"] and copied[-1]["reason"] == "ask again"
    listed = {s["id"] for s in client.call("list_sessions")[1]["sessions"]}
    assert listed == {"s-1", forked["id"]}
    # the fork answers on its own; the original is untouched
    call_id = forked["yielded_tools"][0]["call_id"]
    assert approve(client, forked["id"], call_id)[1]["status"] == "completed"
    assert client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"] == ledger


def test_a_bad_fork_is_a_4xx_and_stores_nothing(client: Client) -> None:
    booked(client)
    bad = (({"at": -1}, 400), ({"at": "x"}, 400), ({"at": True}, 400), ({}, 400), ({"at": 0, "reason": ""}, 400))
    for body, expected in bad:
        status, error = client.call("fork_session", session_id="s-1", body=body)
        assert status == expected and error["field"] in {"at", "reason"}, (body, error)
    status, error = client.call("fork_session", session_id="s-1", body={"at": 999})
    assert (status, error["field"]) == (404, "at"), error
    assert client.call("fork_session", tenant=TENANT_B, session_id="s-1", body={"at": 0})[0] == 404
    assert [s["id"] for s in client.call("list_sessions")[1]["sessions"]] == ["s-1"]
    assert client.call("list_sessions", tenant=TENANT_B)[1]["sessions"] == []


def test_another_tenant_reads_no_state_and_no_audit(client: Client) -> None:
    booked(client)
    assert client.call("session_state", tenant=TENANT_B, session_id="s-1", query={})[0] == 404
    query = {"scope": "session", "key": "confirmation"}
    assert client.call("key_audit", tenant=TENANT_B, session_id="s-1", query=query)[0] == 404


# -- commits from remote runners -------------------------------------------------------------------


def test_remote_commit_appends_or_answers_409_with_the_actual_version(client: Client) -> None:
    create(client)
    body = {"expected_version": 1, "events": [{"type": "user", "text": "hello from elsewhere"}]}
    status, done = client.call("commit", session_id="s-1", body=body)
    assert (status, done) == (200, {"version": 2, "appended": 1})
    status, conflict = client.call("commit", session_id="s-1", body=body)
    assert status == 409 and conflict["actual_version"] == 2
    ledger = client.call("session_events", session_id="s-1")[1]["events"]
    assert [e["text"] for e in ledger if e["type"] == "user"] == ["hello from elsewhere"]


def test_a_remote_commit_writing_shared_state_the_session_is_not_bound_to_is_a_400_and_writes_nothing(
    client: Client, served: Served
) -> None:
    """A run cannot write another user's state (``ScopeNotBound``), so neither can a remote runner's commit."""
    create(client)  # bound to user alex-doe
    write = {"type": "state_change", "scope": "user", "scope_id": "other", "source": "direct"}
    write["changes"] = [{"key": "k", "new_value": 1}]
    team = {"scope": "team", "scope_id": "t-1", "key": "k", "value": 1}  # a scope the app does not declare
    for body, kind, field in (
        (
            {"scoped_changes": [{"scope": "user", "scope_id": "other", "key": "k", "value": 1}]},
            "ScopeNotBound",
            "scoped_changes.0.scope_id",
        ),
        ({"scoped_changes": [team]}, "UnknownScope", "scoped_changes.0.scope"),
        ({"events": [{"type": "user", "text": "hi"}, write]}, "ScopeNotBound", "events.1.scope_id"),
    ):
        status, error = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": [], **body})
        assert (status, error["error"], error["field"]) == (400, kind, field), error
    assert client.call("get_session", session_id="s-1")[1]["version"] == 1
    app = served.for_tenant(TENANT_A)
    assert app.store.load_scoped_state(app.name, "user", "other") == {}
    assert app.store.load_scoped_state(app.name, "team", "t-1") == {}
    own = {"scope": "user", "scope_id": "alex-doe", "key": "name", "value": "Alex"}  # a key the model declares
    status, done = client.call(
        "commit", session_id="s-1", body={"expected_version": 1, "events": [], "scoped_changes": [own]}
    )
    assert status == 200, done
    assert app.store.load_scoped_state(app.name, "user", "alex-doe")["name"] == "Alex"


def test_a_remote_commit_of_an_answer_its_tool_refuses_as_strict_json_is_a_400_and_writes_nothing(
    client: Client,
) -> None:
    """An answer a remote runner commits is held to what ``POST /tools`` holds it to: ``1`` is no approval,
    and only a waiting call takes one."""
    create(client)
    ran = client.call("run", session_id="s-1")[1]
    (call,) = ran["yielded_tools"]
    version = ran["version"]
    answer = {"type": "tool_input", "call_id": call["call_id"], "name": "request_approval"}
    # (a message may not come while the call waits: a state change goes first, so the answer is events.1)
    note = {"type": "state_change", "scope": "session", "source": "direct"}
    note["changes"] = [{"key": "refusal", "new_value": "none yet"}]
    for value, field in (({"approved": 1}, "events.1.input.approved"), ("yes", "events.1.input")):
        body = {"expected_version": version, "events": [note, {**answer, "input": value}]}
        status, error = client.call("commit", session_id="s-1", body=body)
        assert (status, error["error"], error["field"]) == (422, "ToolInputError", field), error
    for call_id in ("c-never-made", ""):  # no such call is waiting: an answer to it would be written as one
        body = {"expected_version": version, "events": [{**answer, "call_id": call_id, "input": {"approved": True}}]}
        status, error = client.call("commit", session_id="s-1", body=body)
        assert (status, error["error"], error["field"]) == (409, "UnknownCallId", "events.0.call_id"), error
    twice = [{**answer, "input": {"approved": True}}, {**answer, "input": {"approved": False}}]
    status, error = client.call("commit", session_id="s-1", body={"expected_version": version, "events": twice})
    assert (status, error["field"]) == (409, "events.1.call_id"), error
    assert client.call("get_session", session_id="s-1")[1]["version"] == version
    body = {"expected_version": version, "events": [{**answer, "input": {"approved": True}}]}
    assert client.call("commit", session_id="s-1", body=body)[0] == 200
    # a call this commit makes and yields itself takes an answer in the same commit, inside the invocation
    # that waits (a yield of an invocation that is not open is out of order)
    ledger = client.call("session_events", session_id="s-1")[1]["events"]
    invocation = next(e["invocation_id"] for e in ledger if e["type"] == "invocation_yield")
    yielded = {"type": "invocation_yield", "invocation_id": "inv-r", "pending": [{"call_id": "c-r", "name": "x"}]}
    status, error = client.call("commit", session_id="s-1", body={"expected_version": version + 1, "events": [yielded]})
    assert (status, error["error"], error["field"]) == (409, "EventOutOfOrder", "events.0.invocation_id"), error
    turn = [
        {"type": "invocation_resume", "invocation_id": invocation},
        {"type": "tool_result", "call_id": call["call_id"], "name": "request_approval", "result": {"approved": True}},
        {"type": "tool_call", "call_id": "c-r", "name": "request_approval", "args": call["args"]},
        {**yielded, "invocation_id": invocation, "pending": [{"call_id": "c-r", "name": "request_approval"}]},
        {**answer, "call_id": "c-r", "input": {"approved": False}},
    ]
    status, done = client.call("commit", session_id="s-1", body={"expected_version": version + 1, "events": turn})
    assert status == 200, done


# -- erasure ---------------------------------------------------------------------------------------


def test_an_erasure_removes_one_person_within_the_callers_tenant_only(client: Client, served: Served) -> None:
    for tenant in (TENANT_A, TENANT_B):
        create(client, "s-1", tenant=tenant)  # bound to user alex-doe, in each tenant
        tenant_app = served.for_tenant(tenant)
        tenant_app.store.save_scoped_state(tenant_app.name, "user", "alex-doe", {"name": "Alex Doe"})
    status, other = client.call("create_session", body={"session_id": "s-2", "scopes": {"user": "sam-roe"}})
    assert status == 201, other

    status, report = client.call("erase", body={"scope": "user", "scope_id": "alex-doe"})
    assert status == 200, report
    assert report == {
        "scope": "user",
        "scope_id": "alex-doe",
        "sessions": ["s-1"],
        "scoped_keys": ["name"],
        "residue": None,
        "principal": TENANT_A,  # who erased: the sessions are gone, so the report says it
    }
    assert client.call("get_session", session_id="s-1")[0] == 404
    assert client.call("get_session", session_id="s-2")[0] == 200
    store, a, b = served.app.store, served.for_tenant(TENANT_A), served.for_tenant(TENANT_B)
    assert store.load_scoped_state(a.name, "user", "alex-doe") == {}
    # the same person in another tenant is another tenant's data: untouched
    assert client.call("get_session", tenant=TENANT_B, session_id="s-1")[0] == 200
    assert store.load_scoped_state(b.name, "user", "alex-doe") == {"name": "Alex Doe"}
    # erasing again finds nothing: the same 200, an empty report
    status, again = client.call("erase", body={"scope": "user", "scope_id": "alex-doe"})
    assert (status, again["sessions"], again["scoped_keys"]) == (200, [], [])


def test_an_erasure_needs_an_authenticated_caller(client: Client) -> None:
    create(client)
    assert client.call("erase", tenant=None)[0] == 401
    assert client.call("get_session", session_id="s-1")[0] == 200


# -- the workflow and the sweeper ------------------------------------------------------------------


class FakeStepFunctions:
    """Records the wake-ups a handler asks for, as the boto3 Step Functions client would take them."""

    class exceptions:
        class ExecutionAlreadyExists(Exception):
            pass

        ClientError = Exception

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.started: list[dict[str, Any]] = []

    def send_task_success(self, taskToken: str, output: str) -> None:
        self.sent.append(taskToken)

    def start_execution(self, **kwargs: Any) -> None:
        if any(s["name"] == kwargs["name"] for s in self.started):
            raise self.exceptions.ExecutionAlreadyExists(kwargs["name"])
        self.started.append(kwargs)


@pytest.fixture
def aws(served: Served) -> tuple[Client, FakeStepFunctions, Callable[..., Any]]:
    fake = FakeStepFunctions()
    machine = StepFunctions("arn:aws:states:eu-west-1:123456789012:stateMachine:resume", client=fake)
    client = Client(api_handler(step_functions_hooks(machine), served, function=None))
    return client, fake, workflow_handler(served, StepFunctions(client=fake))


def act(workflow: Callable[..., Any], action: str, started: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One task of the execution ``started``: the state machine's call of the workflow function."""
    given = json.loads(started["input"])
    event = {
        **load_event(f"workflow/{action}.json"),
        **{k: given[k] for k in ("tenant", "session_id", "invocation_id")},
    }
    return workflow({**event, **extra}, LambdaContext())  # type: ignore[no-any-return]


def started_run(aws: Any) -> dict[str, Any]:
    """Create ``s-1`` and ask for a run without waiting: the one execution the API started for it."""
    client, fake, _ = aws
    create(client)
    client.call("run", session_id="s-1", headers={"Prefer": ""})
    (started,) = fake.started
    return started  # type: ignore[no-any-return]


def yielded_run(aws: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``started_run``, its run task run to the yield: the execution, and the call that waits."""
    client, _, workflow = aws
    started = started_run(aws)
    act(workflow, "run", started)
    return started, client.call("get_session", session_id="s-1")[1]["yielded_tools"][0]


def test_a_run_retried_with_its_key_after_its_record_is_gone_answers_for_its_turn(aws: Any) -> None:
    """The idempotency record of a run whose function timed out expires with it (here: no record at all): the
    retry with the same ``Idempotency-Key`` opens the invocation id its first attempt claimed, finds it on the
    ledger, and answers 202 for that turn, while it runs and after it ended: no second claim, no execution."""
    client, fake, workflow = aws
    create(client)
    key = {"Idempotency-Key": "k-1", "Prefer": ""}
    first = client.call("run", session_id="s-1", headers=key)
    assert first[0] == 202 and first[1]["status"] == "running", first
    ledger = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    again = client.call("run", session_id="s-1", headers=key)  # still running
    assert again == (202, first[1]), again
    (started,) = fake.started
    act(workflow, "run", started)  # the turn runs to its sign-off
    waiting = client.call("get_session", session_id="s-1")[1]
    assert waiting["status"] == "awaiting_input"
    later = client.call("run", session_id="s-1", headers=key)
    assert later[0] == 202 and later[1]["status"] == "awaiting_input", later
    assert later[1]["after"] == first[1]["after"] and later[1]["version"] == waiting["version"]
    events = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    assert events[: len(ledger)] == ledger and [e["type"] for e in events].count("user") == 1
    assert len(fake.started) == 1
    # another key is another request: refused while the session waits, as any run is
    assert client.call("run", session_id="s-1", headers={"Idempotency-Key": "k-2", "Prefer": ""})[0] == 409


def test_a_run_that_waits_is_run_by_the_request_and_its_execution_started_only_when_it_parks(aws: Any) -> None:
    """``Prefer: wait`` on AWS's hooks: the run function claims the turn and runs it itself (no execution before the
    claim); it parks, so its execution is started then, and its Run finds it waiting. A retry with the same key
    (its record gone) answers for that turn: one claim, one execution."""
    client, fake, workflow = aws
    create(client)
    key = {"Idempotency-Key": "k-1", "Prefer": "wait=25"}
    first = client.call("run", session_id="s-1", headers=key)
    assert first[0] == 200 and first[1]["status"] == "yielded_tool", first
    (started,) = fake.started  # after the park, not before the claim
    events = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    types = [e["type"] for e in events]
    assert types.count("user") == 1 and "invocation_resume" not in types and types[-1] == "invocation_yield", types
    assert json.loads(started["input"])["invocation_id"] == events[-1]["invocation_id"]
    assert act(workflow, "run", started) == {"status": "yielded_tool", "version": first[1]["version"]}
    again = client.call("run", session_id="s-1", headers=key)
    assert again[0] in (200, 202) and again[1]["status"] in ("yielded_tool", "awaiting_input"), again
    assert [e["type"] for e in client.call("session_events", session_id="s-1")[1]["events"]].count("user") == 1
    assert len(fake.started) == 1


def approve(client: Client, session_id: str, call_id: str, wait: bool = True) -> tuple[int, Any]:
    return client.call(
        "tools",
        session_id=session_id,
        body={"answers": [{"call_id": call_id, "input": {"approved": True}}]},
        headers={"Prefer": "wait=25"} if wait else None,
    )


def test_a_run_starts_its_execution_before_the_claim_and_answers_202(aws: Any, served: Served) -> None:
    client, fake, workflow = aws
    create(client)
    status, accepted = client.call("run", session_id="s-1", headers={"Prefer": ""})
    assert status == 202 and accepted["status"] == "running" and accepted["after"] == 0, accepted
    (started,) = fake.started
    given = json.loads(started["input"])
    session = served.for_tenant(TENANT_A).sessions.require("s-1")
    invocation = session.projection.open_invocation
    assert session.status == "running" and given["invocation_id"] == invocation
    assert started["name"] == execution_name(TENANT_A, "s-1", invocation, 1) == given["name"]
    assert len(started["name"]) <= 80 and started["name"].isalnum()
    # the claim records when a runner must have taken it on
    assert session.projection.deadline is not None and session.projection.deadline > session.created_at
    # held by the turn: a second run is a 409 and starts no execution
    assert client.call("run", session_id="s-1", headers={"Prefer": ""})[0] == 409
    assert len(fake.started) == 1
    assert execution_name(TENANT_B, "s-1", invocation, 1) != started["name"]
    assert execution_name(TENANT_A, "s-1", invocation, 2) != started["name"]
    # the execution's run task runs the claimed turn to its yield
    assert act(workflow, "run", started)["status"] == "yielded_tool"
    assert client.call("get_session", session_id="s-1")[1]["status"] == "awaiting_input"


class _Ending(LambdaContext):
    """A Lambda context with 4 s left: a cold start ate the rest of the API's time."""

    def get_remaining_time_in_millis(self) -> int:
        return 4_000


@pytest.mark.parametrize("route", ["run", "tools"])
def test_prefer_wait_holds_no_longer_than_the_functions_remaining_time(aws: Any, route: str) -> None:
    """``Prefer: wait=25`` with 4 s left answers within them (the claim, the answers, landed), not a 504 at
    API Gateway: the wait is capped by the function's remaining time less ``WAIT_MARGIN``. A run is run by the
    request itself (it waits) and parks within the hold: 200, its execution started after the park; the answers'
    turn is run by the tools function itself (it waits, issue 36) and ends within the hold: 200."""
    client, fake, _workflow = aws
    if route == "run":
        create(client)
        event = load_event("api/run.json")
    else:
        _, call = yielded_run(aws)
        event = load_event("api/tools.json")
        event["body"] = json.dumps({"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]})
    event["headers"].pop("Idempotency-Key", None)
    event["headers"]["Prefer"] = "wait=25"
    event["pathParameters"] = {"id": "s-1"}
    event["path"] = event["resource"].replace("{id}", "s-1")
    event["requestContext"]["authorizer"]["claims"]["sub"] = TENANT_A
    started = time.monotonic()
    response = client.handler(event, _Ending())  # a turn in an execution runs in no execution here: it never ends
    held = time.monotonic() - started
    assert response["statusCode"] == 200, response
    assert held < 4, held  # inside the function's time
    assert len(fake.started) == 1  # the turn's execution started (it waits in the workflow, not lost)


def test_a_retried_run_task_takes_its_invocation_over_and_a_finished_one_ends(aws: Any, served: Served) -> None:
    client, _, workflow = aws
    started = started_run(aws)
    first = act(workflow, "run", started)
    assert first["status"] == "yielded_tool"
    # a retry of a run task that already yielded parks again, running nothing twice
    again = act(workflow, "run", started)
    assert again == {"status": "yielded_tool", "version": first["version"]}
    call = client.call("get_session", session_id="s-1")[1]["yielded_tools"][0]
    assert approve(client, "s-1", call["call_id"], wait=False)[0] == 202
    assert act(workflow, "run", started)["status"] == "completed"
    # once the invocation ended, a late retry reports it and runs nothing
    version = client.call("get_session", session_id="s-1")[1]["version"]
    assert act(workflow, "run", started)["status"] == "completed"
    assert client.call("get_session", session_id="s-1")[1]["version"] == version


def test_a_run_task_for_a_claim_not_landed_yet_is_retryable(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client, _, workflow = aws
    create(client)
    slept: list[float] = []
    monkeypatch.setattr(tasks.time, "sleep", slept.append)
    ghost = {"input": json.dumps({"tenant": TENANT_A, "session_id": "s-1", "invocation_id": "inv_never"})}
    with pytest.raises(TurnNotClaimed):
        act(workflow, "run", ghost)
    assert slept == list(tasks.CLAIM_GRACE_S)  # it read again through the grace, then gave the retry back


def test_a_run_task_waits_out_a_claim_landing_just_after_its_execution_started(
    aws: Any, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API starts the execution just before it commits the claim: a run that reads first finds no invocation.
    It reads again within the grace instead of failing (a state transition, an invocation and a back-off)."""
    _, _, workflow = aws
    started = started_run(aws)
    real = tasks.resume_turn
    reads: list[str] = []

    def before_the_claim(app: Any, agent: Any, session_id: str, invocation_id: str, **kw: Any) -> Any:
        reads.append(invocation_id)
        if len(reads) == 1:  # the first read sees the session as it stood before the claim landed
            return app.sessions.ephemeral(session_id)
        return real(app, agent, session_id, invocation_id, **kw)

    monkeypatch.setattr(tasks, "resume_turn", before_the_claim)
    monkeypatch.setattr(tasks.time, "sleep", lambda _: None)
    assert act(workflow, "run", started)["status"] == "yielded_tool"
    assert len(reads) == 2


def test_a_wake_up_throttled_by_step_functions_is_a_429_and_the_keyed_retry_wakes(aws: Any) -> None:
    """Waking the parked execution is refused for Step Functions' rate past the SDK's retries: the answers are
    stored, the caller gets a 429 with ``Retry-After`` (a throttle, not a 500), and its retry with the same
    ``Idempotency-Key`` finds the answers on the ledger, writes nothing and wakes the execution."""
    from botocore.exceptions import ClientError

    client, fake, workflow = aws
    started, call = yielded_run(aws)
    assert act(workflow, "park", started, token="token-1")["woke"] is False
    woke = fake.send_task_success

    def throttled(taskToken: str, output: str) -> None:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "SendTaskSuccess")

    fake.send_task_success = throttled  # type: ignore[method-assign]
    body = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    key = {"Idempotency-Key": "k-1", "Prefer": ""}
    status, refused = client.call("tools", session_id="s-1", body=body, headers=key)
    assert (status, refused["error"], client.headers.get("Retry-After")) == (429, "Throttled", "1"), (status, refused)
    assert "ThrottlingException" in refused["message"] and fake.sent == []
    ledger = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    fake.send_task_success = woke  # type: ignore[method-assign]
    status, answered = client.call("tools", session_id="s-1", body=body, headers=key)
    assert status == 202 and answered["woke"] is True and fake.sent == ["token-1"], answered
    assert client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"] == ledger


def test_park_then_answers_wakes_the_execution_once(aws: Any) -> None:
    client, fake, workflow = aws
    started, call = yielded_run(aws)
    assert act(workflow, "park", started, token="token-1") == {"woke": False, "status": "awaiting_input"}
    status, answered = approve(client, "s-1", call["call_id"], wait=False)
    assert status == 202 and answered["woke"] is True and answered["status"] == "resumable"
    assert fake.sent == ["token-1"]


def test_answers_that_arrive_before_park_are_not_lost(aws: Any) -> None:
    client, fake, workflow = aws
    started, call = yielded_run(aws)
    status, answered = approve(client, "s-1", call["call_id"], wait=False)  # no token stored yet
    assert status == 202 and answered["woke"] is False and fake.sent == []
    assert act(workflow, "park", started, token="token-late") == {"woke": True, "status": "resumable"}
    assert fake.sent == ["token-late"]
    assert act(workflow, "run", started)["status"] == "completed"


def test_answers_landing_between_parks_read_and_its_write_still_wake_the_execution(
    aws: Any, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Park stores its token behind the version gate: answers that land after park read the session (still
    waiting) and before its write move the version, so park reads again, finds them, and wakes itself. A token
    stored without the gate would land after the answers looked for it: nobody would ever wake the execution."""
    client, fake, workflow = aws
    started, call = yielded_run(aws)
    store = served.app.store
    load = store.load
    armed = [True]

    def load_then_answer(app_name: str, session_id: str, **kwargs: Any) -> Any:
        loaded = load(app_name, session_id, **kwargs)
        if armed and session_id == "s-1":  # park's read: the answers land right after it
            armed.clear()
            status, answered = approve(client, "s-1", call["call_id"], wait=False)
            assert status == 202 and answered["woke"] is False  # no token stored yet
        return loaded

    monkeypatch.setattr(store, "load", load_then_answer)
    assert act(workflow, "park", started, token="token-mid") == {"woke": True, "status": "resumable"}
    assert not armed and fake.sent == ["token-mid"]


def test_expire_and_fail_end_only_their_own_invocation(client: Client, served: Served) -> None:
    handler = workflow_handler(served)
    for session_id, action in (("s-expire", "expire"), ("s-fail", "fail")):
        create(client, session_id)
        assert client.call("run", session_id=session_id)[1]["status"] == "yielded_tool"
        invocation = served.for_tenant(TENANT_A).sessions.require(session_id).projection.open_invocation
        base = {**load_event(f"workflow/{action}.json"), "tenant": TENANT_A, "session_id": session_id}
        # another invocation's task (an older execution's) leaves this one alone
        assert handler({**base, "invocation_id": "inv_other"}, LambdaContext())["status"] == "awaiting_input"
        result = handler({**base, "invocation_id": invocation}, LambdaContext())
        assert result["status"] == "error"
        ledger = client.call("session_events", session_id=session_id, query={"limit": "100"})[1]["events"]
        end = ledger[-1]
        assert end["type"] == "invocation_end" and end["status"] == "error"
        expected = ("SessionExpired", "timed out") if action == "expire" else ("Lambda.Unknown", "resume function")
        assert end["error_type"] == expected[0] and expected[1] in end["error"]


def test_expire_honours_answers_that_landed_as_the_wait_timed_out(client: Client, served: Served) -> None:
    create(client)
    call = client.call("run", session_id="s-1")[1]["yielded_tools"][0]
    view = served.for_tenant(TENANT_A)
    waiting = view.sessions.require("s-1")
    invocation = waiting.projection.open_invocation
    waiting.input.answer(call["call_id"], {"approved": True})  # answered in the store, the wake-up not yet sent
    view.sessions.commit(waiting)
    event = {**load_event("workflow/expire.json"), "tenant": TENANT_A, "session_id": "s-1", "invocation_id": invocation}
    assert workflow_handler(served)(event, LambdaContext())["status"] == "resumable"
    assert view.sessions.require("s-1").status == "resumable"  # not ended: the state machine runs it on


def test_the_sweeper_event_runs_the_sweeper(served: Served) -> None:
    assert sweeper_handler(served)(load_event("schedule/sweeper.json"), LambdaContext()) == {
        "repaired": 0,
        "sessions": [],
        "purged": [],
        "turns": [],
    }


def test_the_sweeper_purges_expired_sessions_of_every_tenant_on_sql_stores(
    client: Client, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the sweeper deletes what retention hides; on DynamoDB it leaves that to the table's TTL."""
    from dormant.clock import frozen_clock, system_ms

    day = 24 * 3600 * 1000
    monkeypatch.setattr(served.app, "retention_ms", 30 * day)
    with frozen_clock(system_ms()) as clock:
        for tenant in (TENANT_A, TENANT_B):
            create(client, "s-old", tenant=tenant)
        clock.advance(20 * day)
        create(client, "s-new")
        clock.advance(11 * day)
        assert client.call("get_session", session_id="s-old")[0] == 404  # hidden at once, purged or not
        late = {"expected_version": 1, "events": [{"type": "user", "text": "too late"}]}
        assert client.call("commit", session_id="s-old", body=late)[0] == 404  # and not revived by a commit
        assert client.call("run", session_id="s-old")[0] == 404
        swept = sweeper_handler(served)(load_event("schedule/sweeper.json"), LambdaContext())
        store, a = served.app.store, served.for_tenant(TENANT_A)
        if isinstance(store, SQLiteSessionStore):
            assert sorted(swept["purged"]) == [f"bookings@{TENANT_A}/s-old", f"bookings@{TENANT_B}/s-old"]
            assert store.load(a.name, "s-old") is None
        else:  # DynamoDB hides it itself and leaves the deleting to the table's TTL: still there, seen from before
            assert swept["purged"] == []
            with frozen_clock(clock.ms - 31 * day):
                assert store.load(a.name, "s-old") is not None
        assert store.load(a.name, "s-new") is not None


def test_each_function_module_serves_its_sample_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``functions/<name>/app.py`` loaded as Lambda loads it (``make invoke``), on ``DORMANT_STORE``."""
    import importlib.util

    from dormant.serving.runtime import served_from_env

    spec = importlib.util.spec_from_file_location("invoke", EVENTS.parent / "functions" / "invoke.py")
    assert spec is not None and spec.loader is not None
    invoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(invoke)
    monkeypatch.setenv("DORMANT_STORE", f"sqlite:///{tmp_path / 'invoke.db'}")
    monkeypatch.setenv("DORMANT_APP", "bookings:build")
    monkeypatch.delenv("DORMANT_STATE_MACHINE", raising=False)
    served_from_env.cache_clear()
    try:
        statuses = []
        # run is wired to Step Functions, explicitly: without the ARN its template gives it, invoke says so
        assert invoke.main(["run", str(EVENTS / "api/run.json")]) == 2
        assert "needs DORMANT_STATE_MACHINE" in capsys.readouterr().err
        # so is tools (it starts the execution of an answered turn it ran that parks again: issue 36)
        assert invoke.main(["tools", str(EVENTS / "api/tools.json")]) == 2
        assert "needs DORMANT_STATE_MACHINE" in capsys.readouterr().err
        for function, event in [
            ("sessions", "api/create_session.json"),
            ("commit", "api/commit.json"),
            ("sessions", "api/delete_session.json"),
            ("sessions", "api/erase.json"),
        ]:
            assert invoke.main([function, str(EVENTS / event)]) == 0
            statuses.append(last_json(capsys.readouterr().out)["statusCode"])
        assert statuses == [201, 200, 204, 200]
        assert invoke.main(["sweeper", str(EVENTS / "schedule/sweeper.json")]) == 2  # wired to Step Functions too
        assert "needs DORMANT_STATE_MACHINE" in capsys.readouterr().err
    finally:
        served_from_env.cache_clear()


def last_json(out: str) -> Any:
    """The last JSON document printed (the handler's log and metric lines come before it)."""
    decoder, position, last = json.JSONDecoder(), 0, None
    while position < len(out):
        if out[position] in "{[":
            last, position = decoder.raw_decode(out, position)
        else:
            position += 1
    return last


def test_a_dormant_app_that_is_not_an_app_is_a_configuration_error(tmp_path: Path) -> None:
    from dormant.errors import ConfigurationError

    store = sqlite_store(tmp_path / "x.db")
    try:
        for spec in ("bookings", "no_such_module:app", "bookings:SERVICES", "bookings.app:INSTRUCTIONS"):
            with pytest.raises(ConfigurationError):
                load_served(spec, store)
    finally:
        store.close()


@pytest.mark.backend("dynamodb")
def test_a_retry_with_the_same_idempotency_key_returns_the_first_result_and_runs_nothing(
    dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION
    from tests.support.servers.dynamodb import client as dynamodb_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    table = f"idempotency-{uuid.uuid4().hex[:12]}"
    store = store_from_url(f"dynamodb://{table}?endpoint={dynamodb_endpoint}&region={REGION}")
    ddb = dynamodb_client(dynamodb_endpoint)
    try:
        served = load_served("bookings:build", store)
        client = Client(api_handler(in_process_hooks(served), served, DynamoDBIdempotency(table, client=ddb)))
        for tenant in (TENANT_A, TENANT_B):
            create(client, "s-1", tenant=tenant)
        key = {"Idempotency-Key": "k-1"}
        first = client.call("run", session_id="s-1", headers=key)
        assert first[0] == 200 and first[1]["status"] == "yielded_tool"
        ledger = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
        again = client.call("run", session_id="s-1", headers=key)
        assert again == first  # the first result, not a second run
        assert client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"] == ledger

        # the same key from another tenant is another request: its own session runs
        other = client.call("run", tenant=TENANT_B, session_id="s-1", headers=key)
        assert other[0] == 200 and other[1]["version"] == first[1]["version"]
        assert other[1]["yielded_tools"][0]["call_id"] != first[1]["yielded_tools"][0]["call_id"]

        # answers: the retry is acknowledged with the first 202, and the agent is not resumed twice
        call_id = first[1]["yielded_tools"][0]["call_id"]
        answer = {"answers": [{"call_id": call_id, "input": {"approved": True}}]}
        done = client.call("tools", session_id="s-1", body=answer, headers={"Idempotency-Key": "k-2"})
        assert done[0] == 202 and done[1]["status"] == "running"
        wait_for(client, "s-1", lambda s: s["status"] == "completed")
        assert client.call("tools", session_id="s-1", body=answer, headers={"Idempotency-Key": "k-2"}) == done
        # without the key, the same answers are a new request: that call was answered (a 409, a lost race)
        assert client.call("tools", session_id="s-1", body=answer)[0] == 409
        # the key again with another body: refused, not the first result passed off as this one's
        changed = {"answers": [{"call_id": call_id, "input": {"approved": False, "note": "changed my mind"}}]}
        status, error = client.call("tools", session_id="s-1", body=changed, headers={"Idempotency-Key": "k-2"})
        assert (status, error["field"]) == (400, "Idempotency-Key"), error
        status, error = client.call("run", session_id="s-1", body={"message": "another"}, headers=key)
        assert (status, error["field"]) == (400, "Idempotency-Key"), error
        # the same body, spelled differently, is the same request
        respaced = json.dumps(answer, indent=2)
        assert client.call("tools", session_id="s-1", raw_body=respaced, headers={"Idempotency-Key": "k-2"}) == done
        # the records live under the tenant's own partition for the session, and expire through the table's TTL
        items = ddb.scan(TableName=table)["Items"]
        records = [i for i in items if i["pk"]["S"].startswith("I#")]
        assert {i["pk"]["S"] for i in records} == {f"I#bookings@{TENANT_A}#s-1", f"I#bookings@{TENANT_B}#s-1"}
        assert all("expires_at" in i for i in records)

        # erasing the person erases the results kept for retries too (they hold the patient's name);
        # another tenant's records, and its session, stay
        assert "Alex Doe" in repr(records)
        status, report = client.call("erase", body={"scope": "user", "scope_id": "alex-doe"})
        assert status == 200 and report["sessions"] == ["s-1"], report
        left = ddb.scan(TableName=table)["Items"]
        tenant_a = [repr(i) for i in left if f"bookings@{TENANT_A}" in repr(i)]  # its slot holds stay
        assert not [i for i in tenant_a if "Alex Doe" in i or "alex-doe" in i or "'I#" in i]
        assert "Alex Doe" in repr(left)
        assert {i["pk"]["S"] for i in left if i["pk"]["S"].startswith("I#")} == {f"I#bookings@{TENANT_B}#s-1"}
        # a deleted session's records go with it
        assert client.call("delete_session", tenant=TENANT_B, session_id="s-1")[0] == 204
        assert not [i for i in ddb.scan(TableName=table)["Items"] if i["pk"]["S"].startswith("I#")]
    finally:
        ddb.close()
        store.close()


# -- the cold path ---------------------------------------------------------------------------------

# What importing a function module must not load: boto3 and s3transfer (the clients are botocore's),
# the X-Ray SDK (tracing is off), a client or the app (both are built by the first request), and the run
# loop (only a request that runs an agent needs it).
COLD_PATH_EXCLUDES = {"boto3", "s3transfer", "aws_xray_sdk", "botocore.client", "bookings", "dormant.agents.loop"}
COLD_PATH_EXCLUDES |= {"dormant.serving.openapi"}  # the OpenAPI document is built when GET /openapi.json asks
# The workflow's functions serve no HTTP: no Powertools resolver, no pydantic request models.
WORKFLOW_EXCLUDES = {"aws_lambda_powertools.event_handler", "dormant.serving.api"}


@pytest.mark.parametrize("name", ["sessions", "run", "tools", "commit", "park", "resume", "sweeper"])
def test_a_function_module_imports_only_what_its_cold_path_needs(name: str) -> None:
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "DORMANT_STORE": "dynamodb://cold-table?region=us-east-1",
        "DORMANT_APP": "bookings:build",
        "DORMANT_STATE_MACHINE": "arn:aws:states:us-east-1:123456789012:stateMachine:cold",
        "DORMANT_IDEMPOTENCY_TABLE": "cold-table",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_NAME": f"dormant-{name}",
    }
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('app', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "assert callable(module.handler)\n"
        "from pydantic import BaseModel\n"
        "library = [m for n, m in list(sys.modules.items()) if n.startswith('dormant')]\n"
        "models = [c for m in library for c in vars(m).values() if isinstance(c, type) and issubclass(c, BaseModel)]\n"
        "print(json.dumps(sorted({c.__qualname__ for c in models if c.__pydantic_complete__})))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    path = EVENTS.parent / "functions" / name / "app.py"
    run = [sys.executable, "-c", code, str(path)]
    done = subprocess.run(run, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    # Validators are built by the first request that uses them, not by the import (a function builds the
    # request bodies of its own routes only).
    assert json.loads(done.stdout.splitlines()[-2]) == []
    excluded = COLD_PATH_EXCLUDES | (WORKFLOW_EXCLUDES if name in {"park", "resume", "sweeper"} else set())
    assert "dormant.serving" in loaded  # it did load the handler's own code
    assert sorted(m for m in loaded if m in excluded or m.split(".")[0] in excluded) == []


def test_state_set_while_calls_wait_starts_no_second_execution(aws: Any, served: Served) -> None:
    """The execution parked on the waiting calls goes on waiting: a second one would park too, and the older
    one's timeout would end a wait the newer one holds."""
    client, fake, workflow = aws
    started = started_run(aws)
    act(workflow, "run", started)
    status, ran = client.call("run", session_id="s-1", body={"state": {"refusal": "later"}}, headers={"Prefer": ""})
    assert status == 200 and ran["status"] == "yielded_tool", ran  # nothing to run: answered at once
    assert len(fake.started) == 1
    assert client.call("get_session", session_id="s-1")[1]["status"] == "awaiting_input"


def test_a_step_functions_client_without_the_arn_cannot_start_a_turn_and_says_it_is_the_wiring(
    served: Served,
) -> None:
    from dormant.errors import ConfigurationError, http_status

    client = Client(api_handler(step_functions_hooks(StepFunctions(client=FakeStepFunctions())), served))
    create(client)
    status, error = client.call("run", session_id="s-1", headers={"Prefer": ""})
    assert (status, error["error"]) == (500, "ConfigurationError"), error  # the operator's to mend, not a 400
    assert http_status(ConfigurationError("x")) == 500
    assert client.call("get_session", session_id="s-1")[1]["status"] == "idle"  # nothing claimed
