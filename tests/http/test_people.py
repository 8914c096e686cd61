"""Who may answer a yielded call (``answerable_by``), and who did what (principals on the ledger): in the
library, in a remote runner's commit, through the HTTP API under ``dormant serve`` on SQLite, and in the
inspector's view of a session."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dormant.errors import AnswerRefused, ConfigurationError, NotPermitted
from dormant.events import InvocationStartEvent, SessionForkedEvent, ToolInputEvent, parse_event
from dormant.people import Caller, parse_groups, parse_rules
from dormant.projection import Projection
from dormant.session import Session
from dormant.stores.sqlite import SQLiteSessionStore
from tests.support.people_app import PeopleApp, build


@pytest.fixture
def people() -> PeopleApp:
    return build()


def asked(people: PeopleApp, tool: str, principal: str | None = "alice") -> tuple[Session, str]:
    """A session whose run, started by ``principal``, waits on a call of ``tool``."""
    session = people.app.sessions.create()
    result = people.app.run(people.agent, tool, session=session, principal=principal)
    assert result.status == "yielded_tool", result.error
    (call,) = result.yielded_tools
    return session, call.call_id


YES = {"approved": True}


# -- the rules, in the library ---------------------------------------------------------------------------


def test_a_run_records_who_started_it(people: PeopleApp) -> None:
    session, _ = asked(people, "note", principal="alice")
    (start,) = [e for e in session.events if isinstance(e, InvocationStartEvent)]
    assert start.principal == "alice"
    assert session.projection.invocations[start.invocation_id].principal == "alice"


def test_a_group_tool_takes_a_member_and_refuses_anyone_else_writing_nothing(people: PeopleApp) -> None:
    session, call_id = asked(people, "approve")
    before = len(session.events)
    for principal, groups in (("carol", ()), ("carol", ("staff",)), (None, ("approvers",))):
        with pytest.raises(AnswerRefused) as refused:
            session.input.answer(call_id, YES, principal=principal, groups=groups)
        assert refused.value.http_status == 403
        assert (refused.value.call_id, refused.value.tool, refused.value.rule) == (
            call_id,
            "approve",
            "group:approvers",
        )
        assert call_id in str(refused.value) and "group:approvers" in str(refused.value)
        assert refused.value.field == "answers.0.call_id"
        assert len(session.events) == before  # nothing written
    answered = session.input.answer(call_id, YES, principal="bob", groups=["staff", "approvers"])
    assert answered.principal == "bob" and session.status == "resumable"


def test_four_eyes_refuses_the_starter_and_starter_takes_only_them(people: PeopleApp) -> None:
    session, call_id = asked(people, "review", principal="alice")
    with pytest.raises(AnswerRefused, match="not_starter"):
        session.input.answer(call_id, YES, principal="alice")
    assert session.input.answer(call_id, YES, principal="bob").principal == "bob"

    session, call_id = asked(people, "confirm", principal="alice")
    with pytest.raises(AnswerRefused, match="starter"):
        session.input.answer(call_id, YES, principal="bob")
    assert session.input.answer(call_id, YES, principal="alice").principal == "alice"


def test_rules_together_must_all_hold(people: PeopleApp) -> None:
    session, call_id = asked(people, "check", principal="alice")
    with pytest.raises(AnswerRefused, match="not_starter"):  # an approver, but the requester
        session.input.answer(call_id, YES, principal="alice", groups=["approvers"])
    with pytest.raises(AnswerRefused, match="group:approvers"):  # not the requester, but no approver
        session.input.answer(call_id, YES, principal="bob")
    session.input.answer(call_id, YES, principal="bob", groups=["approvers"])


def test_a_run_started_by_no_one_cannot_be_answered_by_a_starter_rule(people: PeopleApp) -> None:
    session, call_id = asked(people, "review", principal=None)
    with pytest.raises(AnswerRefused, match="not recorded"):
        session.input.answer(call_id, YES, principal="bob")


def test_the_default_tenant_rule_takes_anyone_even_in_process(people: PeopleApp) -> None:
    session, call_id = asked(people, "note")
    assert session.input.answer(call_id, YES).principal is None


def test_answers_in_a_runs_input_are_held_to_the_rules(people: PeopleApp) -> None:
    session, call_id = asked(people, "approve")
    answer = {"answers": [{"call_id": call_id, "input": YES}]}
    with pytest.raises(AnswerRefused):
        people.app.run(people.agent, answer, session=session, principal="carol")
    result = people.app.run(people.agent, answer, session=session, principal="bob", groups=["approvers"])
    assert result.status == "completed"


def test_the_rules_survive_a_snapshot_and_a_reload(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "s.db"))
    people = build(store)
    session, call_id = asked(people, "review", principal="alice")
    people.app.sessions.commit(session)
    assert people.app.sessions.snapshot(session)
    loaded = people.app.sessions.require(session.id)
    assert loaded.snapshot_at is not None  # loaded from the snapshot, not replayed
    assert loaded.projection.invocations[loaded.projection.open_invocation or ""].principal == "alice"
    with pytest.raises(AnswerRefused):
        loaded.input.answer(call_id, YES, principal="alice")
    store.close()


def test_older_snapshots_and_ledgers_still_read(people: PeopleApp) -> None:
    session, _ = asked(people, "review", principal="alice")
    exported = session.projection.export()
    assert exported["invocations"][0][6] == "alice"
    older = json.loads(json.dumps(exported))
    older["invocations"] = [row[:6] for row in older["invocations"]]  # as written before principals
    assert all(node.principal is None for node in Projection.restore(older).invocations.values())
    start = parse_event({"type": "invocation_start", "invocation_id": "i", "agent_name": "a"})
    assert isinstance(start, InvocationStartEvent) and start.principal is None
    forked = parse_event({"type": "session_forked", "from_session_id": "s", "reason": "r"})
    assert isinstance(forked, SessionForkedEvent) and forked.principal is None


def test_a_fork_records_who_forked(people: PeopleApp) -> None:
    session, _ = asked(people, "note")
    fork = session.fork_at(0, reason="try again", principal="bob")
    assert isinstance(fork.events[-1], SessionForkedEvent) and fork.events[-1].principal == "bob"


def test_a_commits_answers_must_be_the_callers_and_by_the_rules(people: PeopleApp) -> None:
    session, call_id = asked(people, "approve", principal="alice")
    answer = ToolInputEvent(
        call_id=call_id, name="approve", input=YES, invocation_id=session.projection.open_invocation
    )
    with pytest.raises(AnswerRefused):
        session.rules(caller=Caller("carol")).check(answer, 0)
    forged = answer.model_copy(update={"principal": "bob"})
    with pytest.raises(NotPermitted) as refused:  # carol may not record an answer as bob's
        session.rules(caller=Caller("carol", frozenset({"approvers"}))).check(forged, 0)
    assert refused.value.field == "events.0.principal"
    session.rules(caller=Caller("bob", frozenset({"approvers"}))).check(forged, 0)


def test_a_commits_own_start_makes_its_caller_the_starter(people: PeopleApp) -> None:
    session = people.app.sessions.create()
    rules = session.rules(caller=Caller("alice"))
    start = InvocationStartEvent(invocation_id="inv_1", agent_name="asker")
    rules.check(start, 0)
    assert rules.starters["inv_1"] == "alice"


def test_tools_declare_only_rules_that_exist(people: PeopleApp) -> None:
    for bad in ("everyone", "group:", "group:a b", (), ("tenant", 3)):
        with pytest.raises(ConfigurationError):
            parse_rules(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="yields"):
        people.app.tool(name="plain", execute=lambda ctx: 1, answerable_by="starter")
    assert parse_rules(("group:approvers", "not_starter")) == ("group:approvers", "not_starter")


def test_groups_as_claims_carry_them() -> None:
    assert parse_groups("approvers,staff") == {"approvers", "staff"}  # REST API's Cognito authorizer
    assert parse_groups("[approvers staff]") == {"approvers", "staff"}  # a JWT authorizer
    assert parse_groups(["approvers"]) == {"approvers"}
    assert parse_groups(None) == parse_groups("") == frozenset()


# -- over HTTP: dormant serve on SQLite ------------------------------------------------------------------

TIMEOUT = 30


def http(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    principal: str | None = None,
    tenant: str | None = None,
    groups: str | None = None,
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if method == "POST" and url.endswith("/runs"):
        headers["Prefer"] = "wait=20"  # the turn's result, not a 202
    for name, value in (("Principal", principal), ("Tenant", tenant), ("Groups", groups)):
        if value is not None:
            headers[f"X-Dormant-{name}"] = value
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dormant serve`` of the people app on SQLite, whose callers without headers are bob of tenant clinic,
    an approver."""
    from tests.support.servers.serve import dormant_serve

    folder = tmp_path_factory.mktemp("people")
    args = ("--app", "tests.support.people_app:build", "--store", f"sqlite:///{folder / 'people.db'}", "--workers", "1")
    identity = ("--principal", "bob", "--tenant", "clinic", "--groups", "approvers, staff")
    root = str(Path(__file__).resolve().parents[2])  # the app module lives in tests/support/
    with dormant_serve(*args, *identity, "--quiet", env={"PYTHONPATH": root}, cwd=root, timeout=60) as server:
        yield server.url


def test_over_http_who_may_answer_is_the_tools_rule(serve: str) -> None:
    alice = {"principal": "alice", "tenant": "clinic"}
    carol = {"principal": "carol", "tenant": "clinic", "groups": "staff"}
    assert http(f"{serve}/sessions", "POST", {"session_id": "booking-1"}, **alice)[0] == 201
    status, ran = http(f"{serve}/sessions/booking-1/runs", "POST", {"message": "approve"}, **alice)
    assert status == 200 and ran["status"] == "yielded_tool", ran
    (call,) = ran["yielded_tools"]
    assert call["answerable_by"] == ["group:approvers"] and call["answerable"] is False  # alice is no approver

    # bob (the server's default caller: tenant clinic, approvers) is awaited; carol and alice are not
    status, mine = http(f"{serve}/sessions?awaiting=me")
    assert status == 200 and [s["id"] for s in mine["sessions"]] == ["booking-1"], mine
    assert mine["sessions"][0]["calls"][0]["call_id"] == call["call_id"]
    assert http(f"{serve}/sessions?awaiting=me", **carol)[1]["sessions"] == []
    assert http(f"{serve}/sessions?awaiting=me", principal="alice", tenant="clinic")[1]["sessions"] == []
    status, bad = http(f"{serve}/sessions?awaiting=you")
    assert status == 400 and bad["field"] == "awaiting"

    answer = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, refused = http(f"{serve}/sessions/booking-1/tools", "POST", answer, **carol)
    assert status == 403, refused
    assert refused["error"] == "AnswerRefused" and refused["field"] == "answers.0.call_id"
    assert call["call_id"] in refused["message"] and "group:approvers" in refused["message"]
    status, _ = http(f"{serve}/sessions/booking-1/tools", "POST", answer, principal="dave", tenant="lab")
    assert status == 404  # another tenant's session is no session
    status, _ = http(f"{serve}/sessions/booking-1/tools", "POST", answer)  # bob
    assert status in (200, 202)
    status, page = http(f"{serve}/sessions/booking-1/events?limit=1000", **alice)
    answers = [e for e in page["events"] if e["type"] == "tool_input"]
    assert [e["principal"] for e in answers] == ["bob"]  # carol's refusal wrote nothing
    assert [e["principal"] for e in page["events"] if e["type"] == "invocation_start"] == ["alice"]

    status, forked = http(f"{serve}/sessions/booking-1/forks", "POST", {"at": 1}, **carol)
    assert status == 201, forked
    status, page = http(f"{serve}/sessions/{forked['id']}/events?limit=1000", **carol)
    assert page["events"][-1]["type"] == "session_forked" and page["events"][-1]["principal"] == "carol"


def test_over_http_four_eyes_refuses_the_requesters_own_answer(serve: str) -> None:
    alice = {"principal": "alice", "tenant": "clinic"}
    assert http(f"{serve}/sessions", "POST", {"session_id": "review-1"}, **alice)[0] == 201
    (call,) = http(f"{serve}/sessions/review-1/runs", "POST", {"message": "review"}, **alice)[1]["yielded_tools"]
    answer = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, refused = http(f"{serve}/sessions/review-1/tools", "POST", answer, **alice)
    assert status == 403 and "not_starter" in refused["message"]
    assert http(f"{serve}/sessions/review-1/tools", "POST", answer, principal="carol", tenant="clinic")[0] in (200, 202)


def test_without_a_tenant_the_principal_is_its_own_tenant(serve: str) -> None:
    assert http(f"{serve}/sessions", "POST", {"session_id": "solo"}, principal="erin", tenant="")[0] == 400
    assert http(f"{serve}/sessions", "POST", {"session_id": "solo"}, principal="erin", groups="")[0] == 201
    # erin's requests carry the server's --tenant (clinic) unless they name another: the session is clinic's
    assert http(f"{serve}/sessions/solo", principal="zoe")[0] == 200
    assert http(f"{serve}/sessions/solo", principal="zoe", tenant="zoe")[0] == 404


# -- the handlers, as API Gateway calls them with a machine client's access token ------------------------


def _request(method: str, resource: str, path: str, claims: dict[str, str], body: Any = None) -> dict[str, Any]:
    from dormant.serving.local import proxy_event

    raw = b"" if body is None else json.dumps(body).encode()
    params = {"id": path.split("/")[3]} if resource.count("/") > 2 else {}
    event = proxy_event(
        method, resource, path, params, "", [("Content-Type", "application/json")], raw, "x", "1.2.3.4", "r"
    )
    event["requestContext"]["authorizer"]["claims"] = claims
    return event


def test_a_machine_clients_token_needs_its_routes_scope_and_answers_write_to_commit_answers(tmp_path: Path) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    from dormant.serving.api import api_handler
    from dormant.serving.runtime import Served
    from tests.support.lambda_events import LambdaContext

    store = SQLiteSessionStore(str(tmp_path / "m.db"))
    people = build(store)
    handler = api_handler(served=Served(people.app, {"asker": people.agent}))

    def call(method: str, resource: str, path: str, scopes: str, body: Any = None) -> tuple[int, Any]:
        claims = {"sub": "robot", "client_id": "robot", "token_use": "access", "scope": scopes}
        response = handler(_request(method, resource, path, claims, body), LambdaContext())
        return response["statusCode"], json.loads(response["body"] or "null")

    run = "dormant/runs.write"
    assert call("POST", "/clients/sessions", "/clients/sessions", run, {"session_id": "j"})[0] == 201
    status, refused = call("GET", "/clients/sessions/{id}", "/clients/sessions/j", run)
    assert status == 403 and refused["error"] == "NotPermitted" and "dormant/sessions.read" in refused["message"]
    assert call("GET", "/clients/sessions/{id}", "/clients/sessions/j", "dormant/sessions.read")[0] == 200

    # an answer in a commit needs dormant/answers.write as well, and is recorded as the client's
    from dormant.serving.runtime import for_tenant

    mine = for_tenant(people.app, "robot")
    stored = mine.sessions.create("k")
    result = mine.run(people.agent, "note", session=stored, principal="robot")
    mine.sessions.commit(stored)
    (waiting,) = result.yielded_tools
    answer = {
        "type": "tool_input",
        "call_id": waiting.call_id,
        "name": "note",
        "input": YES,
        "invocation_id": waiting.invocation_id,
    }
    commit = {"expected_version": stored.version, "events": [answer]}
    status, refused = call("POST", "/clients/sessions/{id}/commit", "/clients/sessions/k/commit", run, commit)
    assert status == 403 and "dormant/answers.write" in refused["message"], refused
    both = f"{run} dormant/answers.write"
    status, done = call("POST", "/clients/sessions/{id}/commit", "/clients/sessions/k/commit", both, commit)
    assert status == 200, done
    recorded = mine.sessions.require("k").events[-1]
    assert isinstance(recorded, ToolInputEvent) and recorded.principal == "robot"  # stamped as the caller
    store.close()
