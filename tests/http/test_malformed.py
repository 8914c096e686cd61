"""Malformed input over every API route, through ``dormant serve``, on SQLite and DynamoDB Local.

The new-user pass of issue 23 sent 117 malformed inputs per backend; this is that list and more, as one
parametrized test: bad JSON, wrong types, missing and unknown fields, oversize strings, NUL, lone surrogates,
huge numbers, bad cursors, path tricks, unknown call ids, another tenant's sessions, ledger order a run could
not write, unknown methods. Each is refused with a 4xx whose body names the field (``field``), never a 500,
and writes nothing: the whole store (every row of the SQLite file, every item of the DynamoDB table) reads the
same before and after.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.serving.api import MAX_BODY_BYTES
from tests.support.serve_calls import REQUEST, TIMEOUT
from tests.support.servers.serve import ServeProcess, dormant_serve

OWNER, STRANGER = "clinic", "intruder"
IDLE, WAITING = "m-idle", "m-waiting"  # the sessions the cases aim at (made by OWNER before them)
CALL = "{call}"  # stands for the waiting session's yielded call id
VERSION = "{version}"  # stands for the idle session's version, read before each case (passing the version gate)


@dataclass
class Served:
    server: ServeProcess
    dump: Callable[[], list[str]]
    call_id: str


def send(
    url: str,
    method: str,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    principal: str = OWNER,
) -> tuple[int, dict[str, Any] | None, str]:
    """One request as the caller sent it: its status, its JSON body (``None`` when empty) and Content-Type. The
    caller is an admin of its tenant: these are checks of input, roles are tests/http/test_roles.py's."""
    request = urllib.request.Request(url, data=raw, method=method)
    request.add_header("Content-Type", "application/json")
    request.add_header("X-Dormant-Principal", principal)
    if not any(name.lower() == "x-dormant-groups" for name in headers or {}):
        request.add_header("X-Dormant-Groups", "admins")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status, text, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, text, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, (json.loads(text) if text else None), kind


def sqlite_dump(path: Path) -> Callable[[], list[str]]:
    def dump() -> list[str]:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            return sorted(f"{t}: {row!r}" for t in tables for row in conn.execute(f"SELECT * FROM {t}"))

    return dump


def dynamodb_dump(endpoint: str, table: str) -> Callable[[], list[str]]:
    from tests.support.servers.dynamodb import client

    ddb = client(endpoint)

    def dump() -> list[str]:
        items: list[str] = []
        scan: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
        while True:
            page = ddb.scan(**scan)
            items += [json.dumps(item, sort_keys=True, default=repr) for item in page["Items"]]
            if "LastEvaluatedKey" not in page:
                return sorted(items)
            scan["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    return dump


@pytest.fixture(scope="module", params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("malformed")
    if request.param == "sqlite":
        url, env = f"sqlite:///{folder / 'malformed.db'}", {}
        dump = sqlite_dump(folder / "malformed.db")
    else:
        from tests.support.servers.dynamodb import store_for_process

        endpoint = request.getfixturevalue("dynamodb_endpoint")
        table = f"malformed-{uuid.uuid4().hex[:12]}"
        (url, env), dump = store_for_process(endpoint, table), dynamodb_dump(endpoint, table)
    with dormant_serve("--store", url, "--principal", OWNER, env=env, cwd=folder, timeout=TIMEOUT) as server:
        api = server.url
        for sid in (IDLE, WAITING):
            body = json.dumps({"session_id": sid, "scopes": {"user": "alex-doe"}}).encode()
            assert send(f"{api}/sessions", "POST", body)[0] == 201
        ran = send(
            f"{api}/sessions/{WAITING}/runs", "POST", json.dumps({"message": REQUEST}).encode(), {"Prefer": "wait=25"}
        )
        assert ran[0] == 200 and ran[1] is not None and ran[1]["status"] == "yielded_tool", ran
        [waiting] = ran[1]["yielded_tools"]
        yield Served(server, dump, waiting["call_id"])
    assert "Traceback" not in server.output(), server.output()[-3000:]


def case(
    method: str,
    path: str,
    body: Any = None,
    status: int = 400,
    field: str | None = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    principal: str = OWNER,
    id: str,
) -> Any:
    return pytest.param(method, path, body, raw, headers, principal, status, field, id=id)


def commit(events: list[Any], changes: list[Any] | None = None, version: Any = VERSION) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_version": version, "events": events}
    if changes is not None:
        body["scoped_changes"] = changes
    return body


def change(key: Any = "name", value: Any = "Alex", scope: Any = "user", scope_id: Any = "alex-doe") -> dict[str, Any]:
    return {"scope": scope, "scope_id": scope_id, "key": key, "value": value}


def user(text: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"type": "user", "text": text, **extra}


S = "/sessions"
IS, WS = f"{S}/{IDLE}", f"{S}/{WAITING}"  # the idle session, the waiting session
LONG = "x" * 5000
NUL = "a\u0000b"
SURROGATE = b'"\\ud800"'  # a lone surrogate, as JSON escapes it (json.dumps would not send one)
HUGE = b"1" + b"0" * 400  # an integer with 400 digits
ANSWER = {"call_id": CALL, "input": {"approved": True}}

CASES = [
    # -- POST /sessions: the body --------------------------------------------------------------------------------
    case("POST", S, raw=b"{not json", field="body", id="create-bad-json"),
    case("POST", S, raw=b"\xff\xfe not utf-8", field="body", id="create-not-utf8"),
    case("POST", S, raw=b"[]", field="body", id="create-list"),
    case("POST", S, raw=b'"a string"', field="body", id="create-string"),
    case("POST", S, raw=b"null", field="body", id="create-null"),
    case("POST", S, raw=b"[" * 100_000 + b"]" * 100_000, field="body", id="create-deep-nesting"),
    case("POST", S, raw=b'{"session_id": "a", "session_id": 5}', field="session_id", id="create-duplicate-key"),
    case("POST", S, {"sesion_id": "x"}, field="sesion_id", id="create-unknown-field"),
    case("POST", S, {"session_id": 5}, field="session_id", id="create-id-int"),
    case("POST", S, {"session_id": ["a"]}, field="session_id", id="create-id-list"),
    case("POST", S, {"session_id": ""}, field="session_id", id="create-id-empty"),
    case("POST", S, {"session_id": LONG}, field="session_id", id="create-id-oversize"),
    case("POST", S, {"session_id": NUL}, field="session_id", id="create-id-nul"),
    case("POST", S, raw=b'{"session_id": ' + SURROGATE + b"}", field="session_id", id="create-id-surrogate"),
    case("POST", S, {"session_id": "../etc/passwd"}, field="session_id", id="create-id-dotdot"),
    case("POST", S, {"session_id": "a/b"}, field="session_id", id="create-id-slash"),
    case("POST", S, {"session_id": "a b"}, field="session_id", id="create-id-space"),
    case("POST", S, {"session_id": "a#b"}, field="session_id", id="create-id-hash"),
    case("POST", S, {"session_id": "é"}, field="session_id", id="create-id-non-ascii"),
    case("POST", S, raw=b'{"session_id": ' + HUGE + b"}", field="session_id", id="create-id-huge-number"),
    case("POST", S, raw=b'{"session_id": 1e400}', field="session_id", id="create-id-infinity"),
    case("POST", S, {"session_id": IDLE}, 409, "session_id", id="create-existing-id"),
    case("POST", S, {"scopes": "user"}, field="scopes", id="create-scopes-string"),
    case("POST", S, {"scopes": {"user": 5}}, field="scopes.user", id="create-scope-id-int"),
    case("POST", S, {"scopes": {"nope": "x"}}, field="scopes.nope", id="create-unknown-scope"),
    case("POST", S, {"scopes": {"user": ""}}, field="scopes.user", id="create-scope-id-empty"),
    case("POST", S, {"scopes": {"user": NUL}}, field="scopes.user", id="create-scope-id-nul"),
    case("POST", S, {"scopes": {"user": LONG}}, field="scopes.user", id="create-scope-id-oversize"),
    case("POST", S, raw=b'{"scopes": {"user": ' + SURROGATE + b"}}", field="scopes.user", id="create-scope-surrogate"),
    case("POST", S, raw=b'{"x": "' + b"y" * MAX_BODY_BYTES + b'"}', status=413, field="body", id="create-too-large"),
    # -- GET /sessions: the query ------------------------------------------------------------------------------------
    case("GET", f"{S}?limit=0", field="limit", id="list-limit-zero"),
    case("GET", f"{S}?limit=-1", field="limit", id="list-limit-negative"),
    case("GET", f"{S}?limit=1e3", field="limit", id="list-limit-exponent"),
    case("GET", f"{S}?limit=abc", field="limit", id="list-limit-word"),
    case("GET", f"{S}?limit=%EF%BC%91%EF%BC%92", field="limit", id="list-limit-fullwidth-digits"),
    case("GET", f"{S}?limit={'9' * 400}", field="limit", id="list-limit-huge"),
    case("GET", f"{S}?limit=1001", field="limit", id="list-limit-over-max"),
    case("GET", f"{S}?status=bogus", field="status", id="list-status-unknown"),
    case("GET", f"{S}?status=%00", field="status", id="list-status-nul"),
    case("GET", f"{S}?cursor=garbage", field="cursor", id="list-cursor-garbage"),
    case("GET", f"{S}?cursor=1e40", field="cursor", id="list-cursor-1e40"),
    case("GET", f"{S}?cursor=1e308", field="cursor", id="list-cursor-1e308"),
    case("GET", f"{S}?cursor=-1", field="cursor", id="list-cursor-negative"),
    case("GET", f"{S}?cursor=%ED%A0%80", field="cursor", id="list-cursor-surrogate-bytes"),
    case("GET", f"{S}?cursor=%5Cud800", field="cursor", id="list-cursor-surrogate-escape"),
    case("GET", f"{S}?cursor=%00", field="cursor", id="list-cursor-nul"),
    case("GET", f"{S}?cursor={'A' * 5000}", field="cursor", id="list-cursor-oversize"),
    case("GET", f"{S}?cursor=W10%3D", field="cursor", id="list-cursor-base64-list"),
    # -- GET/DELETE /sessions/{id}: ids and tenants ------------------------------------------------------------------
    case("GET", f"{S}/missing", status=404, field="session_id", id="show-missing"),
    case("GET", IS, status=404, field="session_id", principal=STRANGER, id="show-other-tenant"),
    case("GET", f"{S}/%00", field="session_id", id="show-nul"),
    case("GET", f"{S}/{IDLE}%00", field="session_id", id="show-id-nul-suffix"),
    case("GET", f"{S}/..%2F{IDLE}", field="session_id", id="show-encoded-dotdot"),
    case("GET", f"{S}/{'a' * 5000}", field="session_id", id="show-oversize"),
    case("GET", f"{S}/%ED%A0%80", field="session_id", id="show-surrogate-bytes"),
    case("GET", f"{S}/%20", field="session_id", id="show-space"),
    case("DELETE", IS, status=404, field="session_id", principal=STRANGER, id="delete-other-tenant"),
    case("DELETE", f"{S}/missing", status=404, field="session_id", id="delete-missing"),
    case("DELETE", f"{S}/%00", field="session_id", id="delete-nul"),
    # -- GET /sessions/{id}/events ---------------------------------------------------------------------------------
    case("GET", f"{IS}/events?after=-1", field="after", id="events-after-negative"),
    case("GET", f"{IS}/events?after=abc", field="after", id="events-after-word"),
    case("GET", f"{IS}/events?after=1e400", field="after", id="events-after-exponent"),
    case("GET", f"{IS}/events?limit=0", field="limit", id="events-limit-zero"),
    case("GET", f"{IS}/events?wait=26", field="wait", id="events-wait-over-max"),
    case("GET", f"{IS}/events?wait=-1", field="wait", id="events-wait-negative"),
    case("GET", f"{IS}/events?wait=1.5", field="wait", id="events-wait-fraction"),
    case("GET", f"{S}/missing/events", status=404, field="session_id", id="events-missing"),
    case("GET", f"{IS}/events", status=404, field="session_id", principal=STRANGER, id="events-other-tenant"),
    # -- GET /sessions/{id}/state and /audit -------------------------------------------------------------------------
    case("GET", f"{IS}/state?at=99999", status=404, field="at", id="state-at-out-of-range"),
    case("GET", f"{IS}/state?at=-1", field="at", id="state-at-negative"),
    case("GET", f"{IS}/state?at=x", field="at", id="state-at-word"),
    case("GET", f"{WS}/state?at=0&since=99999", status=404, field="since", id="state-since-out-of-range"),
    case("GET", f"{IS}/state", status=404, field="session_id", principal=STRANGER, id="state-other-tenant"),
    case("GET", f"{IS}/audit", field="scope", id="audit-no-scope"),
    case("GET", f"{IS}/audit?scope=nope&key=k", field="scope", id="audit-unknown-scope"),
    case("GET", f"{IS}/audit?scope=user", field="key", id="audit-no-key"),
    case(
        "GET",
        f"{IS}/audit?scope=user&key=name",
        status=404,
        field="session_id",
        principal=STRANGER,
        id="audit-other-tenant",
    ),
    # -- POST /sessions/{id}/forks ---------------------------------------------------------------------------------
    case("POST", f"{IS}/forks", {}, field="at", id="fork-no-at"),
    case("POST", f"{IS}/forks", {"at": -1}, field="at", id="fork-at-negative"),
    case("POST", f"{IS}/forks", {"at": True}, field="at", id="fork-at-bool"),
    case("POST", f"{IS}/forks", {"at": "0"}, field="at", id="fork-at-string"),
    case("POST", f"{IS}/forks", {"at": 1.5}, field="at", id="fork-at-fraction"),
    case("POST", f"{IS}/forks", {"at": 99999}, status=404, field="at", id="fork-at-out-of-range"),
    case("POST", f"{IS}/forks", raw=b'{"at": ' + HUGE + b"}", status=404, field="at", id="fork-at-huge"),
    case("POST", f"{IS}/forks", raw=b'{"at": 1e400}', field="at", id="fork-at-infinity"),
    case("POST", f"{IS}/forks", {"at": 0, "reason": ""}, field="reason", id="fork-reason-empty"),
    case("POST", f"{IS}/forks", {"at": 0, "reason": 5}, field="reason", id="fork-reason-int"),
    case("POST", f"{IS}/forks", {"at": 0, "x": 1}, field="x", id="fork-unknown-field"),
    case("POST", f"{IS}/forks", {"at": 0}, status=404, field="session_id", principal=STRANGER, id="fork-other-tenant"),
    # -- POST /sessions/{id}/runs ----------------------------------------------------------------------------------
    case("POST", f"{IS}/runs", {"mesage": "hi"}, field="mesage", id="run-unknown-field"),
    case("POST", f"{IS}/runs", {"message": 5}, field="message", id="run-message-int"),
    case("POST", f"{IS}/runs", {"message": ["hi"]}, field="message", id="run-message-list"),
    case("POST", f"{IS}/runs", {"message": NUL}, 422, "message", id="run-message-nul"),
    case(
        "POST",
        f"{IS}/runs",
        raw=b'{"message": ' + SURROGATE + b"}",
        status=422,
        field="message",
        id="run-message-surrogate",
    ),
    case("POST", f"{IS}/runs", {"state": "x"}, field="state", id="run-state-string"),
    # (``state`` sets the session scope's keys: the errors name them in it)
    case("POST", f"{IS}/runs", {"state": {"nope": 1}}, 422, "state.session.nope", id="run-state-unknown-key"),
    case("POST", f"{IS}/runs", {"state": {"": 1}}, 400, "state.session", id="run-state-empty-key"),
    case("POST", f"{IS}/runs", {"state": {"refusal": 5}}, 422, "state.session.refusal", id="run-state-wrong-type"),
    case("POST", f"{IS}/runs", {"state": {"refusal": NUL}}, 422, "state.session.refusal", id="run-state-nul"),
    case(
        "POST",
        f"{IS}/runs",
        {"state": {"confirmation": {"x": 1}}},
        422,
        "state.session.confirmation",
        id="run-state-bad-model",
    ),
    case("POST", f"{IS}/runs", {"takeover": "yes"}, field="takeover", id="run-takeover-string"),
    case("POST", f"{IS}/runs", {"takeover": 1}, field="takeover", id="run-takeover-int"),
    case("POST", f"{IS}/runs", {"agent": 5}, field="agent", id="run-agent-int"),
    case("POST", f"{IS}/runs", {"agent": "nobody", "message": "hi"}, field="agent", id="run-agent-unknown"),
    case(
        "POST", f"{IS}/runs", {"message": "hi"}, field="Prefer", headers={"Prefer": "wait=99"}, id="run-prefer-over-max"
    ),
    case("POST", f"{IS}/runs", {"message": "hi"}, field="Prefer", headers={"Prefer": "wait=abc"}, id="run-prefer-word"),
    case("POST", f"{WS}/runs", {"message": "hi"}, 409, "message", id="run-message-while-waiting"),
    case("POST", f"{S}/missing/runs", {"message": "hi"}, 404, "session_id", id="run-missing"),
    case("POST", f"{IS}/runs", {"message": "hi"}, 404, "session_id", principal=STRANGER, id="run-other-tenant"),
    case(
        "POST",
        f"{IS}/runs",
        raw=b'{"message": "' + b"x" * MAX_BODY_BYTES + b'"}',
        status=413,
        field="body",
        id="run-too-large",
    ),
    # -- POST /sessions/{id}/tools ---------------------------------------------------------------------------------
    case("POST", f"{WS}/tools", {}, field="answers", id="tools-no-answers"),
    case("POST", f"{WS}/tools", {"answers": []}, field="answers", id="tools-empty"),
    case("POST", f"{WS}/tools", {"answers": "yes"}, field="answers", id="tools-string"),
    case("POST", f"{WS}/tools", {"answers": [{"input": {}}]}, field="answers.0.call_id", id="tools-no-call-id"),
    case("POST", f"{WS}/tools", {"answers": [{"call_id": 5}]}, field="answers.0.call_id", id="tools-call-id-int"),
    case("POST", f"{WS}/tools", {"answers": [{"call_id": "nope"}]}, 409, "answers.0.call_id", id="tools-unknown-call"),
    case("POST", f"{WS}/tools", {"answers": [{"call_id": NUL}]}, 409, "answers.0.call_id", id="tools-call-id-nul"),
    case(
        "POST", f"{WS}/tools", {"answers": [{"call_id": LONG}]}, 409, "answers.0.call_id", id="tools-call-id-oversize"
    ),
    case(
        "POST",
        f"{WS}/tools",
        {"answers": [{"call_id": CALL, "input": {"approved": "maybe"}}]},
        422,
        "answers.0.input.approved",
        id="tools-input-wrong-type",
    ),
    case(
        "POST",
        f"{WS}/tools",
        {"answers": [{"call_id": CALL, "input": 5}]},
        422,
        "answers.0.input",
        id="tools-input-int",
    ),
    case("POST", f"{WS}/tools", {"answers": [{"call_id": CALL}]}, 422, "answers.0.input", id="tools-input-missing"),
    case("POST", f"{WS}/tools", {"answers": [{**ANSWER, "x": 1}]}, field="answers.0.x", id="tools-unknown-field"),
    case(
        "POST",
        f"{WS}/tools",
        {"answers": [ANSWER, {"call_id": "nope"}]},
        409,
        "answers.1.call_id",
        id="tools-second-unknown",
    ),
    case("POST", f"{WS}/tools", {"answers": [ANSWER, ANSWER]}, 400, "answers.1", id="tools-same-call-twice"),
    case("POST", f"{WS}/tools", {"answers": [ANSWER]}, 404, "session_id", principal=STRANGER, id="tools-other-tenant"),
    case("POST", f"{IS}/tools", {"answers": [ANSWER]}, 409, "answers.0.call_id", id="tools-session-not-waiting"),
    # -- POST /sessions/{id}/commit --------------------------------------------------------------------------------
    case("POST", f"{IS}/commit", {}, field="expected_version", id="commit-empty"),
    case("POST", f"{IS}/commit", commit([], version=-1), field="expected_version", id="commit-version-negative"),
    case("POST", f"{IS}/commit", commit([], version=True), field="expected_version", id="commit-version-bool"),
    case("POST", f"{IS}/commit", commit([], version="1"), field="expected_version", id="commit-version-string"),
    case(
        "POST",
        f"{IS}/commit",
        raw=b'{"expected_version": ' + HUGE + b', "events": []}',
        status=409,
        field="expected_version",
        id="commit-version-huge",
    ),
    case("POST", f"{IS}/commit", commit([], version=99), 409, "expected_version", id="commit-version-stale"),
    case("POST", f"{IS}/commit", {"expected_version": 1}, field="events", id="commit-no-events"),
    case("POST", f"{IS}/commit", commit("x"), field="events", id="commit-events-string"),  # type: ignore[arg-type]
    case("POST", f"{IS}/commit", commit([5]), field="events.0", id="commit-event-int"),
    case("POST", f"{IS}/commit", commit([{"type": "nope"}]), field="events.0", id="commit-event-unknown-type"),
    case("POST", f"{IS}/commit", commit([user(5)]), field="events.0", id="commit-event-text-int"),
    case("POST", f"{IS}/commit", commit([user(NUL)]), 422, "events.0.text", id="commit-event-text-nul"),
    case("POST", f"{IS}/commit", commit([user(), user(id="")]), field="events.1.id", id="commit-event-id-empty"),
    case("POST", f"{IS}/commit", commit([user(id="../x")]), field="events.0.id", id="commit-event-id-dotdot"),
    case("POST", f"{IS}/commit", commit([user(id="e" * 200)]), field="events.0.id", id="commit-event-id-oversize"),
    case("POST", f"{IS}/commit", commit([user(id=NUL)]), 400, "events.0.id", id="commit-event-id-nul"),
    case("POST", f"{IS}/commit", commit([user(created_at="now")]), field="events.0", id="commit-event-time-string"),
    case(
        "POST",
        f"{IS}/commit",
        commit([{"type": "tool_result", "call_id": "nope", "name": "x", "result": {}}]),
        409,
        "events.0.call_id",
        id="commit-result-for-no-call",
    ),
    case("POST", f"{WS}/commit", commit([user()], version=99), 409, "events.0", id="commit-message-while-waiting"),
    case(
        "POST",
        f"{WS}/commit",
        commit([{"type": "tool_result", "call_id": CALL, "name": "request_approval", "result": {}}], version=99),
        409,
        "events.0.call_id",
        id="commit-result-before-answer",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(value=5)]),
        422,
        "scoped_changes.0.value",
        id="commit-change-wrong-type",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change("preferences", "notadict")]),
        422,
        "scoped_changes.0.value",
        id="commit-change-not-a-dict",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change("nope")]),
        status=422,
        field="scoped_changes.0.key",
        id="commit-change-undeclared-key",
    ),
    case("POST", f"{IS}/commit", commit([], [change("")]), field="scoped_changes.0.key", id="commit-change-empty-key"),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(NUL)]),
        status=422,
        field="scoped_changes.0.key",
        id="commit-change-nul-key",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change("k" * 2000)]),
        status=400,  # the key rule (dormant.ids): InvalidKey
        field="scoped_changes.0.key",
        id="commit-change-long-key",
    ),
    case(
        "POST",
        f"{IS}/commit",
        raw=b'{"expected_version": 1, "events": [], "scoped_changes": [{"scope": "user", "scope_id": "alex-doe", '
        + b'"key": '
        + SURROGATE
        + b', "value": 1}]}',
        status=422,
        field="scoped_changes.0.key",
        id="commit-change-surrogate-key",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(scope="nope")]),
        field="scoped_changes.0.scope",
        id="commit-change-unknown-scope",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(scope="session")]),
        field="scoped_changes.0.scope_id",
        id="commit-change-session-scope",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(scope_id="someone-else")]),
        field="scoped_changes.0.scope_id",
        id="commit-change-unbound-id",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [change(scope_id=5)]),
        field="scoped_changes.0.scope_id",
        id="commit-change-scope-id-int",
    ),
    case(
        "POST",
        f"{IS}/commit",
        commit([], [{"scope": "user", "key": "name"}]),
        field="scoped_changes.0.scope_id",
        id="commit-change-no-scope-id",
    ),
    case("POST", f"{IS}/commit", commit([], "x"), field="scoped_changes", id="commit-changes-string"),  # type: ignore[arg-type]
    case("POST", f"{IS}/commit", commit([user()]), 404, "session_id", principal=STRANGER, id="commit-other-tenant"),
    # -- POST /erasures ----------------------------------------------------------------------------------------------
    case("POST", "/erasures", {}, field="scope", id="erase-empty"),
    case("POST", "/erasures", {"scope": "nope", "scope_id": "x"}, field="scope", id="erase-unknown-scope"),
    case("POST", "/erasures", {"scope": "session", "scope_id": IDLE}, field="scope", id="erase-session-scope"),
    case("POST", "/erasures", {"scope": "user", "scope_id": ""}, field="scope_id", id="erase-scope-id-empty"),
    case("POST", "/erasures", {"scope": "user", "scope_id": 5}, field="scope_id", id="erase-scope-id-int"),
    case("POST", "/erasures", {"scope": "user", "scope_id": NUL}, field="scope_id", id="erase-scope-id-nul"),
    case("POST", "/erasures", {"scope": "user", "scope_id": LONG}, field="scope_id", id="erase-scope-id-oversize"),
    # -- methods and paths the API does not serve ----------------------------------------------------------------
    # (no field: the method is the request's own; the JSON error and its Allow header say what is served)
    case("PUT", IS, {}, 405, id="put-session"),
    case("TRACE", S, status=405, id="trace-sessions"),
    case("PATCH", f"{IS}/runs", {}, 405, id="patch-runs"),
]


def test_the_cases_are_at_least_the_issues_117() -> None:
    assert len(CASES) >= 117 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("method", "path", "body", "raw", "headers", "principal", "status", "field"), CASES)
def test_a_malformed_request_is_a_4xx_naming_its_field_and_writes_nothing(
    served: Served,
    method: str,
    path: str,
    body: Any,
    raw: bytes | None,
    headers: dict[str, str] | None,
    principal: str,
    status: int,
    field: str | None,
) -> None:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    if data is not None:
        shown = send(f"{served.server.url}{IS}", "GET")[1]
        assert shown is not None
        data = data.replace(CALL.encode(), served.call_id.encode())
        data = data.replace(f'"{VERSION}"'.encode(), str(shown["version"]).encode())
    before = served.dump()
    got, answer, kind = send(served.server.url + path, method, data, headers, principal)
    assert (got, kind) == (status, "application/json"), (got, answer)
    assert answer is not None and answer["error"] and answer.get("field") == field, answer
    assert served.dump() == before
