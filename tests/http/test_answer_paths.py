"""Issue 35's first four defects, through ``dormant serve`` on SQLite, Postgres and DynamoDB Local: a forged commit
cannot pass as the starter, an answer's unknown field is a 422 naming it, an Idempotency-Key holds whatever the
path's spelling, and the turn quota counts turns that were claimed, not refusals.

One server per store (the people app, ``tests/support/people_app.py``, with a quota of ``QUOTA`` turns an hour per
tenant); each test works in a tenant of its own, so the quota of one is not another's.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from tests.support.servers.serve import dormant_serve

TIMEOUT = 60
QUOTA = 2
YES = {"approved": True}
STORES = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.backend("postgres")),
    pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
]


@pytest.fixture(scope="module", params=STORES)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dormant serve`` of the people app on the store, with idempotency (every store has it) and a quota."""
    kind = request.param
    env = {"DORMANT_TURN_QUOTA": f"{QUOTA}/3600"}
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('answers') / 'people.db'}"
    elif kind == "postgres":
        url = str(request.getfixturevalue("postgres_url"))  # shared: each test works in a tenant of its own
    else:
        from tests.support.servers.dynamodb import store_for_process

        url, more = store_for_process(request.getfixturevalue("dynamodb_endpoint"), f"ans-{uuid.uuid4().hex[:12]}")
        env.update(more)
    root = str(Path(__file__).resolve().parents[2])  # the app module lives in tests/support/
    args = ("--app", "tests.support.people_app:build", "--store", url, "--workers", "1", "--quiet")
    with dormant_serve(*args, env={"PYTHONPATH": root, **env}, cwd=root, timeout=TIMEOUT) as server:
        yield server.url
    assert "Traceback" not in server.output()


class Person:
    """A caller of the local API: a principal of a tenant, in groups (``X-Dormant-*`` headers)."""

    def __init__(self, api: str, principal: str, tenant: str, groups: str = "") -> None:
        self.api, self.principal, self.tenant, self.groups = api, principal, tenant, groups

    def __call__(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {
            "Content-Type": "application/json",
            "X-Dormant-Principal": self.principal,
            "X-Dormant-Tenant": self.tenant,
            "X-Dormant-Groups": self.groups,
            **(headers or {}),
        }
        if method == "POST" and (path.endswith("/runs") or path.endswith("/tools")):
            sent.setdefault("Prefer", "wait=20")  # the turn's result, not a 202
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def events(self, session_id: str) -> list[dict[str, Any]]:
        status, page = self("GET", f"/sessions/{session_id}/events?limit=1000")
        assert status == 200, page
        return list(page["events"])

    def version(self, session_id: str) -> int:
        status, shown = self("GET", f"/sessions/{session_id}")
        assert status == 200, shown
        return int(shown["version"])


def tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def asked(person: Person, session_id: str, tool: str) -> dict[str, Any]:
    """``person`` runs a turn of ``session_id`` that calls ``tool``: the call it waits on."""
    status, ran = person("POST", f"/sessions/{session_id}/runs", {"message": tool})
    assert status == 200 and ran["status"] == "yielded_tool", ran
    (call,) = ran["yielded_tools"]
    return dict(call)


# -- one answer rule: a commit's answer is judged by the waiting call's own invocation ------------------------


def test_a_forged_commit_cannot_pass_as_the_starter(api: str) -> None:
    clinic = tenant()
    alice, mallory = Person(api, "alice", clinic), Person(api, "mallory", clinic)
    assert alice("POST", "/sessions", {"session_id": "s1"})[0] == 201
    # mallory's own turn, ended: an invocation mallory started, on this session's ledger
    note = asked(mallory, "s1", "note")
    answered = mallory("POST", "/sessions/s1/tools", {"answers": [{"call_id": note["call_id"], "input": YES}]})
    assert answered[0] == 200 and answered[1]["status"] == "completed", answered
    (own,) = [e for e in mallory.events("s1") if e["type"] == "invocation_start" and e["principal"] == "mallory"]
    # alice's turn waits on a call only she, its starter, may answer
    confirm = asked(alice, "s1", "confirm")
    assert "invocation_id" not in confirm
    version = alice.version("s1")
    forged = {"type": "tool_input", "call_id": confirm["call_id"], "name": "confirm", "input": YES}

    # naming mallory's invocation does not make mallory the starter: refused, named, nothing written
    commit = {"expected_version": version, "events": [{**forged, "invocation_id": own["invocation_id"]}]}
    status, refused = mallory("POST", "/sessions/s1/commit", commit)
    assert status == 409 and refused["field"] == "events.0.invocation_id", refused
    # naming none: the starter is read from the ledger (alice), and the rule refuses mallory
    status, refused = mallory("POST", "/sessions/s1/commit", {"expected_version": version, "events": [forged]})
    assert (status, refused["error"], refused["field"]) == (403, "AnswerRefused", "events.0.call_id"), refused
    assert "starter" in refused["message"]
    # naming a group mallory is not in: refused too
    grouped = {**forged, "groups": ["approvers"]}
    status, refused = mallory("POST", "/sessions/s1/commit", {"expected_version": version, "events": [grouped]})
    assert (status, refused["field"]) == (403, "events.0.groups"), refused
    assert alice.version("s1") == version and alice("GET", "/sessions/s1")[1]["status"] == "awaiting_input"

    # the starter herself may, through the same commit
    waits_in = [e for e in alice.events("s1") if e["type"] == "invocation_yield"][-1]["invocation_id"]
    own_answer = {**forged, "invocation_id": waits_in}
    status, done = alice("POST", "/sessions/s1/commit", {"expected_version": version, "events": [own_answer]})
    assert status == 200 and done["appended"] == 1, done
    assert [e["principal"] for e in alice.events("s1") if e["type"] == "tool_input"] == ["mallory", "alice"]


# -- answers as strict as requests -----------------------------------------------------------------------------


def test_an_answers_unknown_field_is_a_422_naming_it_on_tools_and_commit(api: str) -> None:
    bob = Person(api, "bob", tenant(), "approvers")
    assert bob("POST", "/sessions", {"session_id": "s2"})[0] == 201
    call = asked(bob, "s2", "approve")
    version = bob.version("s2")
    lossy = {"approved": False, "notes": "the slot is taken"}  # the schema has note, not notes
    status, refused = bob("POST", "/sessions/s2/tools", {"answers": [{"call_id": call["call_id"], "input": lossy}]})
    assert (status, refused["error"], refused["field"]) == (422, "ToolInputError", "answers.0.input.notes"), refused
    event = {"type": "tool_input", "call_id": call["call_id"], "name": "approve", "input": lossy}
    status, refused = bob("POST", "/sessions/s2/commit", {"expected_version": version, "events": [event]})
    assert (status, refused["field"]) == (422, "events.0.input.notes"), refused
    assert bob.version("s2") == version  # nothing written by either

    kept = {"approved": False, "note": "the slot is taken"}
    answered = bob("POST", "/sessions/s2/tools", {"answers": [{"call_id": call["call_id"], "input": kept}]})
    assert answered[0] == 200, answered
    (recorded,) = [e for e in bob.events("s2") if e["type"] == "tool_input"]
    assert recorded["input"] == kept and recorded["groups"] == ["approvers"]


def test_a_yield_schema_that_allows_extras_keeps_them(api: str) -> None:
    bob = Person(api, "bob", tenant())
    assert bob("POST", "/sessions", {"session_id": "s3"})[0] == 201
    call = asked(bob, "s3", "feedback")
    answer = {"score": 4, "comment": "quick"}
    status, done = bob("POST", "/sessions/s3/tools", {"answers": [{"call_id": call["call_id"], "input": answer}]})
    assert status == 200, done
    (recorded,) = [e for e in bob.events("s3") if e["type"] == "tool_input"]
    assert recorded["input"] == answer


# -- Idempotency-Key: the request as the handler understands it ----------------------------------------------


def test_an_idempotency_key_holds_whatever_the_paths_spelling(api: str) -> None:
    bob = Person(api, "bob", tenant())
    assert bob("POST", "/sessions", {"session_id": "i-1"})[0] == 201
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    first = bob("POST", "/sessions/i-1/runs", {"message": "note"}, key)
    assert first[0] == 200 and first[1]["status"] == "yielded_tool", first
    version = bob.version("i-1")
    again = bob("POST", "/sessions/i%2D1/runs", {"message": "note"}, key)  # the same request, spelt otherwise
    assert again == first
    assert bob.version("i-1") == version
    starts = [e for e in bob.events("i-1") if e["type"] == "invocation_start"]
    assert len(starts) == 1  # the turn ran once
    again = bob("post", "/sessions/i-1/runs", {"message": "note"}, key)  # a method in lower case is the same too
    assert again == first


# -- the quota counts claimed turns ------------------------------------------------------------------------------


def test_refused_runs_do_not_use_up_the_turn_quota(api: str) -> None:
    bob = Person(api, "bob", tenant())
    assert bob("POST", "/sessions", {"session_id": "q1"})[0] == 201
    call = asked(bob, "q1", "note")  # turn 1 of QUOTA
    for _ in range(3):  # refused: nothing claimed, nothing counted
        status, refused = bob("POST", "/sessions/q1/runs", {"message": "note"})
        assert (status, refused["error"]) == (409, "AwaitingInput"), refused
    # a session a live run holds (its start committed by a remote runner): a 409, nothing claimed
    assert bob("POST", "/sessions", {"session_id": "q0"})[0] == 201
    start = {"type": "invocation_start", "invocation_id": f"inv_{uuid.uuid4().hex}", "agent_name": "asker"}
    assert bob("POST", "/sessions/q0/commit", {"expected_version": 1, "events": [start]})[0] == 200
    status, refused = bob("POST", "/sessions/q0/runs", {"message": "note"})
    assert (status, refused["error"]) == (409, "ClaimLost"), refused
    status, refused = bob("POST", "/sessions/q1/runs", {"state": {"k": "\u0000"}})  # no store keeps a NUL
    assert (status, refused["field"]) == (422, "state.session.k"), refused
    answered = bob("POST", "/sessions/q1/tools", {"answers": [{"call_id": call["call_id"], "input": YES}]})
    assert answered[0] == 200, answered
    assert bob("POST", "/sessions", {"session_id": "q2"})[0] == 201
    asked(bob, "q2", "note")  # turn 2 of QUOTA: still there
    assert bob("POST", "/sessions", {"session_id": "q3"})[0] == 201
    status, refused = bob("POST", "/sessions/q3/runs", {"message": "note"})
    assert (status, refused["error"]) == (429, "TurnQuotaExceeded"), refused  # the quota still holds
