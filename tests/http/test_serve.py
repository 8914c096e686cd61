"""``dormant serve``: the HTTP API through the Lambda handler code, as a separate process, on SQLite and DynamoDB Local.

Each request becomes an API Gateway proxy event and goes through ``serving.api``'s handler; these tests
drive the real process over real sockets (urllib), and check what a caller sees: statuses, bodies, the
tenant the principal picks, the loopback-only rule, and a clean Ctrl-C.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from pydantic import BaseModel

from dormant import adk, openai
from dormant.serving.api import MAX_BODY_BYTES, api_handler
from dormant.serving.local import LocalAPI, LocalServer, PageRequest, Reply, is_loopback, proxy_event
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.url import store_from_url
from dormant.testing import MockAdapter
from tests.support.lambda_events import EVENTS, LambdaContext
from tests.support.serve_calls import REQUEST, TIMEOUT, call, eventually
from tests.support.servers.serve import ServeProcess, clinic_serve, command, dormant_serve

OVERLAP_WAIT = 3
PAGE_FAILED = "the page failed; the server's log says why"


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A store URL and the environment the server needs for it: a SQLite file, or a fresh DynamoDB Local table."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'serve.db'}", {}
    from tests.support.servers.dynamodb import store_for_process

    return store_for_process(request.getfixturevalue("dynamodb_endpoint"), f"serve-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def server(store_env: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[ServeProcess]:
    with clinic_serve(store_env, tmp_path, TIMEOUT) as process:
        yield process


# -- the arc, over HTTP --------------------------------------------------------------------------------------


def test_a_booking_sleeps_is_answered_over_http_and_resumes_in_process(server: ServeProcess) -> None:
    api = server.url
    status, created = call(f"{api}/sessions", "POST", {"session_id": "b-1", "scopes": {"user": "alex-doe"}})
    assert (status, created["id"], created["status"]) == (201, "b-1", "idle")

    # the turn runs after the request: a 202 saying where to look, then the session moves on by itself
    status, accepted = call(f"{api}/sessions/b-1/runs", "POST", {"message": REQUEST}, extra={"Prefer": ""})
    assert status == 202 and (accepted["status"], accepted["after"]) == ("running", 0), accepted
    shown = eventually(lambda: (s := call(f"{api}/sessions/b-1")[1])["status"] == "awaiting_input" and s)
    [waiting] = shown["yielded_tools"]
    assert waiting["name"] == "request_approval" and waiting["answer_schema"]["required"] == ["approved"]
    assert shown["version"] > accepted["version"]

    # an answer the yield schema refuses (as strict JSON: 1 is no approval) is its declared ToolInputError
    # (422) naming the value in the body, and records nothing
    for approved in ("maybe", 1):
        wrong = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": approved}}]}
        status, refused = call(f"{api}/sessions/b-1/tools", "POST", wrong)
        assert (status, refused["error"], refused["field"]) == (422, "ToolInputError", "answers.0.input.approved")
    assert call(f"{api}/sessions/b-1")[1]["version"] == shown["version"]

    answer = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True, "note": "ok"}}]}
    # with Prefer: wait the answer's request holds until the resumed turn ends, and answers with it
    status, answered = call(f"{api}/sessions/b-1/tools", "POST", answer, extra={"Prefer": "wait=25"})
    assert status == 200 and answered["status"] == "completed", answered

    status, done = call(f"{api}/sessions/b-1")
    assert done["status"] == "completed" and done["yielded_tools"] == []
    assert answered["version"] == done["version"]
    assert done["state"]["session"]["confirmation"]["slot_id"] == waiting["args"]["slot_id"]

    # the ledger, paged
    events: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        status, page = call(f"{api}/sessions/b-1/events?after={after}&limit=4")
        assert status == 200 and len(page["events"]) <= 4
        events += page["events"]
        after = page["next"]
    assert len({e["id"] for e in events}) == len(events) > 4
    assert [e["type"] for e in events][-1] == "invocation_end"
    [given] = [e for e in events if e["type"] == "tool_input"]
    assert given["input"] == {"approved": True, "note": "ok"} and given["principal"] == "clinic"  # who approved

    status, listed = call(f"{api}/sessions?status=completed")
    assert status == 200 and [s["id"] for s in listed["sessions"]] == ["b-1"]
    assert call(f"{api}/sessions/b-1", "DELETE") == (204, None)
    assert call(f"{api}/sessions/b-1")[0] == 404


def test_a_retried_run_with_an_idempotency_key_runs_once(server: ServeProcess) -> None:
    """On SQLite as on DynamoDB (tests/http/test_idempotency.py: every store, the other body, the overlap)."""
    api = server.url
    assert call(f"{api}/sessions", "POST", {"session_id": "b-3"})[0] == 201
    key = {"Idempotency-Key": "run-1"}
    first = call(f"{api}/sessions/b-3/runs", "POST", {"message": REQUEST}, extra=key)
    assert first[0] == 200 and first[1]["status"] == "yielded_tool"
    again = call(f"{api}/sessions/b-3/runs", "POST", {"message": REQUEST}, extra=key)
    assert again == first and call(f"{api}/sessions/b-3")[1]["version"] == first[1]["version"]


def test_bad_input_is_a_4xx_naming_the_field_and_writes_nothing(server: ServeProcess) -> None:
    api = server.url
    assert call(f"{api}/sessions", "POST", {"session_id": "b-2"})[0] == 201
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/sessions/b-2/runs", {"raw": b"{not json"}),
        ("POST", "/sessions/b-2/runs", {"raw": b"\xff\xfe not utf-8"}),
        ("POST", "/sessions/b-2/runs", {"body": {"mesage": "typo"}}),
        ("POST", "/sessions/b-2/tools", {"body": {"answers": []}}),
        ("POST", "/sessions/b-2/commit", {"body": {"expected_version": -1, "events": []}}),
        ("GET", "/sessions?limit=many", {}),
        ("POST", "/sessions", {"body": {"session_id": "bad id with spaces"}}),
    ]
    for method, path, kwargs in cases:
        status, body = call(api + path, method, **kwargs)
        assert status == 400 and body["error"] and body.get("field"), (path, kwargs, status, body)
    expectations = {"body", "mesage", "answers", "expected_version", "limit"}
    assert expectations <= {call(api + p, m, **k)[1]["field"] for m, p, k in cases}
    # an answer to a call never made is UnknownCallId at its declared 409, as POST /commit serves it
    status, body = call(f"{api}/sessions/b-2/tools", "POST", {"answers": [{"call_id": "nope", "input": {}}]})
    assert (status, body["error"], body["field"]) == (409, "UnknownCallId", "answers.0.call_id"), body

    status, body = call(f"{api}/sessions/b-2/runs", "POST", raw=b'{"message": "' + b"x" * MAX_BODY_BYTES + b'"}')
    assert status == 413 and body["error"] == "RequestTooLarge"
    assert call(f"{api}/sessions/missing")[0] == 404
    assert call(f"{api}/sessions/missing/runs", "POST", {"message": "hi"})[0] == 404
    status, body = call(f"{api}/sessions/b-2", "PUT", {})
    assert status == 405 and body["error"] == "MethodNotAllowed"
    assert call(f"{api}/no/such/route")[0] == 404

    shown = call(f"{api}/sessions/b-2")[1]
    assert shown["version"] == 1 and shown["status"] == "idle"  # nothing above wrote anything
    assert [s["id"] for s in call(f"{api}/sessions")[1]["sessions"]] == ["b-2"]


def test_the_principal_header_picks_the_tenant(server: ServeProcess) -> None:
    api = server.url
    assert call(f"{api}/sessions", "POST", {"session_id": "mine"}, principal="alice")[0] == 201
    assert call(f"{api}/sessions/mine", principal="alice")[0] == 200
    assert call(f"{api}/sessions/mine", principal="bob")[0] == 404
    assert call(f"{api}/sessions/mine")[0] == 404  # no header: the server's --principal, clinic
    assert call(f"{api}/sessions")[1]["sessions"] == []
    assert call(f"{api}/sessions", "POST", {"session_id": "mine"})[0] == 201  # clinic's own "mine"
    status, body = call(f"{api}/sessions", principal="a@b")
    assert status == 400 and body["field"] == "tenant"


def test_every_sample_event_gets_over_http_what_the_handler_gives_it_directly(tmp_path: Path) -> None:
    """The sample API Gateway events of ``events/api``, in order: once straight into the Lambda handler,
    once as HTTP requests to ``dormant serve`` (as the events' caller). Same statuses; same error bodies."""
    names = ["create_session", "get_session", "list_sessions", "session_events", "commit", "run", "tools"]
    names.append("delete_session")
    samples = {name: json.loads((EVENTS / "api" / f"{name}.json").read_text()) for name in names}
    sub = samples["run"]["requestContext"]["authorizer"]["claims"]["sub"]

    store = store_from_url(f"sqlite:///{tmp_path / 'direct.db'}")
    served = load_served("bookings:build", store)
    handler = api_handler(in_process_hooks(served), served)
    direct = {}
    for name, event in samples.items():
        response = handler(event, LambdaContext())
        direct[name] = (response["statusCode"], json.loads(response["body"]) if response["body"] else None)
    store.close()

    over_http = {}
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'http.db'}", "--principal", sub, cwd=tmp_path) as server:
        for name, event in samples.items():
            query = urllib.parse.urlencode(event["queryStringParameters"] or {})
            target = f"{server.url}{event['path']}{'?' + query if query else ''}"
            raw = event["body"].encode() if event["body"] else None
            over_http[name] = call(target, event["httpMethod"], raw=raw, extra={"Prefer": ""})

    assert {n: s for n, (s, _) in over_http.items()} == {n: s for n, (s, _) in direct.items()}
    assert direct["tools"][0] == 409  # the sample answers a call the sample run did not make: UnknownCallId

    def fresh_ids_masked(body: Any) -> str:
        return re.sub(r"call_[0-9a-f]{32}", "call_*", json.dumps(body, sort_keys=True))

    for name, (status, body) in direct.items():
        if status >= 400:
            assert fresh_ids_masked(over_http[name][1]) == fresh_ids_masked(body)
        elif body is not None:
            assert set(over_http[name][1]) == set(body)


# -- identity: loopback only -----------------------------------------------------------------------------------


@pytest.fixture
def local_api(tmp_path: Path) -> Iterator[LocalAPI]:
    store = store_from_url(f"sqlite:///{tmp_path / 'local.db'}")
    yield LocalAPI(load_served("bookings:build", store), principal="clinic")
    store.close()


@pytest.mark.parametrize("client", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_loopback_clients_are_served_as_their_header_says(local_api: LocalAPI, client: str) -> None:
    headers = [("Content-Type", "application/json"), ("X-Dormant-Principal", "alice")]
    reply = local_api.handle("POST", "/sessions", headers, b'{"session_id": "s-1"}', client)
    assert reply.status == 201
    assert local_api.served.app.store.load("bookings@alice", "s-1") is not None


@pytest.mark.parametrize("client", ["192.0.2.10", "203.0.113.7", "2001:db8::1", "::ffff:192.0.2.10", "not-an-ip"])
@pytest.mark.parametrize("header", [True, False])
def test_a_client_off_loopback_is_refused_with_or_without_the_header(
    local_api: LocalAPI, client: str, header: bool
) -> None:
    headers = [("Content-Type", "application/json"), *([("X-Dormant-Principal", "alice")] if header else [])]
    reply = local_api.handle("POST", "/sessions", headers, b'{"session_id": "s-1"}', client)
    assert reply.status == 403 and reply.json()["error"] == "Forbidden"
    store = local_api.served.app.store
    assert store.load("bookings@alice", "s-1") is None and store.load("bookings@clinic", "s-1") is None


@pytest.mark.parametrize(
    "browser",
    [
        [("Origin", "https://evil.example")],  # another site's page: a simple POST needs no preflight
        [("Host", "127.0.0.1:8000"), ("Origin", "http://localhost:8000")],  # another origin on this machine
        [("Host", "127.0.0.1:8000"), ("Origin", "null")],  # a sandboxed frame, a file: page
        [("Host", "rebound.evil.example:8000")],  # DNS rebinding: the attacker's name, resolving to 127.0.0.1
        [("Host", "attackerlocalhost:8000")],  # a name that merely ends in "localhost"
        [("Host", "localhost.evil.example:8000")],
        [("Host", "127.0.0.1:8000"), ("Origin", "http://127.0.0.1:8000.evil.example")],  # ours only as a prefix
        [("Host", "127.0.0.1:8000"), ("Origin", "http://127.0.0.1:80")],  # a prefix of ours
        [("Host", "[::1")],
        [("Host", "127.0.0.1:8000"), ("Sec-Fetch-Site", "cross-site")],
        [("Host", "127.0.0.1:8000"), ("Sec-Fetch-Site", "same-site")],
    ],
)
def test_a_cross_site_request_from_a_browser_on_this_machine_is_refused_and_writes_nothing(
    local_api: LocalAPI, browser: list[tuple[str, str]]
) -> None:
    headers = [("Content-Type", "text/plain"), *browser]
    reply = local_api.handle("POST", "/sessions", headers, b'{"session_id": "s-1"}', "127.0.0.1")
    assert reply.status == 403 and reply.json()["error"] == "Forbidden", reply
    assert local_api.served.app.store.load("bookings@clinic", "s-1") is None


@pytest.mark.parametrize(
    "own",
    [
        [("Host", "127.0.0.1:8000"), ("Origin", "http://127.0.0.1:8000"), ("Sec-Fetch-Site", "same-origin")],
        [("Host", "localhost:8000"), ("Sec-Fetch-Site", "none")],  # typed into the address bar
        [("Host", "[::1]:8000")],
        [],  # curl over HTTP/1.0, a test client
    ],
)
def test_the_pages_own_requests_and_local_tools_are_served(local_api: LocalAPI, own: list[tuple[str, str]]) -> None:
    reply = local_api.handle("POST", "/sessions", own, b'{"session_id": "s-1"}', "127.0.0.1")
    assert reply.status == 201, reply
    assert local_api.served.app.store.load("bookings@clinic", "s-1") is not None


@pytest.mark.parametrize(("length", "status"), [("-5", 400), ("five", 400), (str(10 * 1024 * 1024 + 1), 413)])
def test_a_bad_content_length_is_refused_naming_it_and_writes_nothing(
    local_api: LocalAPI, length: str, status: int
) -> None:
    with LocalServer(local_api, port=0, log_requests=False).running() as server:
        connection = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=TIMEOUT)
        connection.putrequest("POST", "/sessions")
        connection.putheader("Content-Length", length)
        connection.endheaders()
        response = connection.getresponse()
        error = json.loads(response.read())
        connection.close()
    assert response.status == status, error
    assert status == 413 or error["field"] == "Content-Length"
    assert local_api.served.app.store.list("bookings@clinic") == []


def _outward_address() -> str | None:
    """This machine's address on a non-loopback interface (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if is_loopback(address) else address


def test_a_real_connection_from_off_loopback_gets_403(local_api: LocalAPI) -> None:
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 interface to connect from")
    with LocalServer(local_api, address, 0, log_requests=False).running() as server:
        status, body = call(f"{server.url}/sessions", principal="alice")
        assert status == 403 and "loopback" in body["message"]


# -- the event is API Gateway's ---------------------------------------------------------------------------


def _shape(value: Any) -> Any:
    return {key: _shape(item) for key, item in value.items()} if isinstance(value, dict) else type(value).__name__


def test_the_proxy_event_has_the_shape_of_the_sample_api_gateway_events() -> None:
    sample = json.loads((EVENTS / "api" / "run.json").read_text())
    built = proxy_event(
        "POST",
        "/sessions/{id}/runs",
        "/sessions/s-sample/runs",
        {"id": "s-sample"},
        "",
        [("Content-Type", "application/json"), ("Idempotency-Key", "k-1")],
        b'{"message": "hi"}',
        "alice",
        "127.0.0.1",
        "req-1",
    )
    assert set(built) == set(sample)
    assert set(built["requestContext"]) == set(sample["requestContext"])
    assert built["requestContext"]["authorizer"]["claims"]["sub"] == "alice"
    assert (built["pathParameters"], built["resource"], built["body"]) == (
        {"id": "s-sample"},
        sample["resource"],
        '{"message": "hi"}',
    )
    assert built["multiValueHeaders"]["Idempotency-Key"] == ["k-1"]
    query = proxy_event("GET", "/sessions", "/sessions", {}, "limit=2&status=a%20b&status=c", [], b"", "a", "::1", "r")
    assert query["queryStringParameters"] == {"limit": "2", "status": "c"}
    assert query["multiValueQueryStringParameters"] == {"limit": ["2"], "status": ["a b", "c"]}
    assert query["body"] is None and query["headers"] is None


_names = st.text(alphabet=st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    query=st.lists(st.tuples(_names, st.text(max_size=12)), max_size=5),
    header=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20),
    body=st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
def test_what_the_handler_reads_of_the_event_is_what_the_client_sent(
    query: list[tuple[str, str]], header: str, body: bytes
) -> None:
    """Through Powertools' own view of the event: query values decoded (the last of each name), headers,
    and the body byte for byte (base64 when it is not UTF-8, as API Gateway sends binary)."""
    from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

    raw_query = urllib.parse.urlencode(query)
    seen = APIGatewayProxyEvent(
        proxy_event("POST", "/sessions", "/sessions", {}, raw_query, [("X-Note", header)], body, "a", "::1", "r")
    )
    for name, _ in query:
        assert seen.get_query_string_value(name) == [v for n, v in query if n == name][-1]
    assert seen.headers.get("X-Note") == header and seen.request_context.authorizer.claims["sub"] == "a"
    sent = base64.b64decode(seen.body or "") if seen.is_base64_encoded else (seen.body or "").encode()
    assert sent == body


# -- pages: the seam for non-API paths ---------------------------------------------------------------------


def test_pages_serve_other_paths_and_call_the_api_as_their_caller(tmp_path: Path) -> None:
    seen: list[str] = []

    def index(request: PageRequest) -> Reply | None:
        seen.append(request.path)
        if request.path == "/broken":
            raise RuntimeError("a bug in a page")
        if request.path != "/":
            return None
        listed = request.call_api("GET", "/sessions?limit=5").json()
        ids = ", ".join(s["id"] for s in listed["sessions"])
        return Reply(200, f"<p>{request.principal}: {ids}</p>".encode(), {"Content-Type": "text/html"})

    store = store_from_url(f"sqlite:///{tmp_path / 'pages.db'}")
    api = LocalAPI(load_served("bookings:build", store), principal="clinic", pages=[index])
    with LocalServer(api, "127.0.0.1", 0, log_requests=False).running() as server:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-9"}, principal="alice")[0] == 201
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-8"})[0] == 201
        request = urllib.request.Request(f"{server.url}/", headers={"X-Dormant-Principal": "alice"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            assert response.read() == b"<p>alice: s-9</p>" and response.headers["Content-Type"] == "text/html"
        assert call(f"{server.url}/inspect/x")[0] == 404  # no page took it
        assert call(f"{server.url}/broken") == (500, {"error": "InternalError", "message": PAGE_FAILED})
        assert call(f"{server.url}/sessions")[0] == 200  # and the server goes on
    store.close()
    assert seen == ["/", "/inspect/x", "/broken"]  # API routes never reach a page


# -- stopping ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ignoring_sigint", [False, True])
def test_ctrl_c_stops_the_server_cleanly_with_an_idle_keep_alive_connection_open(
    tmp_path: Path, ignoring_sigint: bool
) -> None:
    store = f"sqlite:///{tmp_path / 'stop.db'}"
    with dormant_serve("--store", store, cwd=tmp_path, timeout=TIMEOUT, ignoring_sigint=ignoring_sigint) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        connection.request("GET", "/sessions")
        assert connection.getresponse().read() and connection.sock is not None  # kept alive, now idle
        assert server.stop(timeout=TIMEOUT) == 0
        connection.close()
    assert "stopping" in server.output() and "Traceback" not in server.output()


def test_a_bad_store_url_or_app_is_a_message_and_exit_2(tmp_path: Path) -> None:
    for args in (["--store", "sqlite://no-third-slash"], ["--app", "no_such_module:build"]):
        done = subprocess.run(
            [*command(), "serve", "--port", "0", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=TIMEOUT,
            check=False,
        )
        assert done.returncode == 2 and done.stderr.startswith("dormant serve: ") and "Traceback" not in done.stderr


# -- bookings --api: the arc as separate processes through dormant serve --------------------------------------


def bookings(api: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("bookings")
    return subprocess.run(
        [str(script), "--api", api, *args], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def test_the_bookings_arc_through_the_api_each_command_a_process(server: ServeProcess) -> None:
    asked = bookings(server.url, "ask", REQUEST)
    assert asked.returncode == 0, asked.stderr
    assert "waiting for approval: physio with Sam Patel on Tuesday at 14:30 for Alex Doe" in asked.stdout
    [sid] = [line.split()[-1] for line in asked.stdout.splitlines() if line.strip().startswith("session:")]
    assert f"bookings --api {server.url} approve {sid}" in asked.stdout  # the hint names the same API

    pending = bookings(server.url, "pending")
    assert pending.returncode == 0 and sid in pending.stdout and "1 booking(s) waiting" in pending.stdout

    approved = bookings(server.url, "approve", sid, "--note", "see you then")
    assert approved.returncode == 0, approved.stderr
    assert (
        f"confirmation BK-{sid[-6:].upper()}: physio with Sam Patel, Tuesday at 14:30, for Alex Doe" in approved.stdout
    )
    assert bookings(server.url, "pending").stdout.strip() == "No booking is waiting for a human."

    again = bookings(server.url, "approve", sid)
    assert again.returncode == 4 and "not waiting for an approval (status: completed)" in again.stderr

    shown = bookings(server.url, "show", sid)
    assert shown.returncode == 0 and "status completed" in shown.stdout.splitlines()[0]
    [answer] = [line for line in shown.stdout.splitlines() if " human " in line]
    assert 'answers request_approval: {"approved": true, "note": "see you then"}  (by "clinic")' in answer

    asked = bookings(server.url, "ask", "Dentist on Friday morning for Jo Bloggs")
    [other] = [line.split()[-1] for line in asked.stdout.splitlines() if line.strip().startswith("session:")]
    denied = bookings(server.url, "deny", other, "the clinic is closed")
    assert denied.returncode == 0 and "the clinic is closed" in denied.stdout, denied

    missing = bookings(server.url, "show", "no-such-session")
    assert missing.returncode == 3 and "no session 'no-such-session'" in missing.stderr
    assert "Traceback" not in missing.stderr + denied.stderr + shown.stderr


def test_bookings_api_takes_over_a_run_whose_server_died_and_loses_a_double_answer_with_5(
    server: ServeProcess,
) -> None:
    api = server.url
    assert call(f"{api}/sessions", "POST", {"session_id": "died", "scopes": {"user": "alex-doe"}})[0] == 201
    opened = [  # what a server killed mid-run leaves: an invocation started and never ended
        {"type": "invocation_start", "invocation_id": "inv-died", "agent_name": "bookings"},
        {"type": "user", "text": REQUEST, "invocation_id": "inv-died", "agent_name": "bookings"},
    ]
    assert call(f"{api}/sessions/died/commit", "POST", {"expected_version": 1, "events": opened})[0] == 200
    refused = bookings(api, "resume", "died")
    assert refused.returncode == 5 and f"bookings --api {api} resume --takeover died" in refused.stderr
    taken = bookings(api, "resume", "--takeover", "died")
    assert taken.returncode == 0 and "waiting for approval" in taken.stdout, taken.stderr
    [waiting] = call(f"{api}/sessions/died")[1]["yielded_tools"]

    answer = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True}}]}
    assert call(f"{api}/sessions/died/tools", "POST", answer)[0] == 202
    status, error = call(f"{api}/sessions/died/tools", "POST", answer)  # the slower of two approvers
    assert (status, error["error"]) == (409, "UnknownCallId"), error


def test_bookings_api_that_cannot_be_reached_or_misused_exits_2(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: connections are refused
        refused = bookings(f"http://127.0.0.1:{port}", "pending")
    assert refused.returncode == 2 and "cannot reach the API" in refused.stderr
    assert bookings("ftp://example", "pending").returncode == 2
    assert bookings("http://127.0.0.1:9", "demo").returncode == 2
    both = subprocess.run(
        [
            str(Path(sys.executable).with_name("bookings")),
            "--db",
            str(tmp_path / "x.db"),
            "--api",
            "http://x",
            "pending",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert both.returncode == 2 and "give one" in both.stderr


def test_a_request_never_enters_the_handler_while_another_is_inside(tmp_path: Path) -> None:
    """Powertools keeps the current request on the resolver's class: a second request inside the handler
    at the same time would swap the first one's caller. So while a run is inside (its tool holding), another
    caller's request must not complete. The tool gives it ``OVERLAP_WAIT`` seconds to (it never can)."""
    inside, other_done = threading.Event(), threading.Event()
    overlapped: list[bool] = []

    class Empty(BaseModel):
        pass

    def hold(ctx: Any) -> dict[str, Any]:
        inside.set()
        overlapped.append(other_done.wait(timeout=OVERLAP_WAIT))
        return {}

    store = store_from_url(f"sqlite:///{tmp_path / 'hold.db'}")
    script = MockAdapter([{"tool_calls": [{"name": "hold", "args": {}}]}, {"text": "done"}])
    app = adk(name="hold", store=store, adapters={"openai": script})
    agent = app.agent(
        name="holder", model=openai("scripted"), tools=[app.tool(name="hold", schema=Empty, execute=hold)]
    )
    api = LocalAPI(Served(app, {"holder": agent}))
    with LocalServer(api, "127.0.0.1", 0, log_requests=False).running() as server, ThreadPoolExecutor(2) as pool:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-1"}, principal="alice")[0] == 201
        run = pool.submit(call, f"{server.url}/sessions/s-1/runs", "POST", {"message": "go"}, principal="alice")
        assert inside.wait(timeout=TIMEOUT)
        listed = pool.submit(call, f"{server.url}/sessions", principal="bob")
        listed.add_done_callback(lambda _: other_done.set())
        assert run.result(timeout=TIMEOUT)[1]["output"]["text"] == "done"
        assert listed.result(timeout=TIMEOUT) == (200, {"sessions": [], "cursor": None})
    store.close()
    assert overlapped == [False]


def test_an_id_a_client_escapes_in_the_path_is_the_same_id(server: ServeProcess) -> None:
    """A browser escapes ':', '@', '+' and '=' in a path segment (``encodeURIComponent``): API Gateway and
    ``dormant serve`` pass the path as sent, so the API decodes the ids it routes on."""
    api, sid = server.url, "visit:a@b+c=d"
    assert call(f"{api}/sessions", "POST", {"session_id": sid, "scopes": {"user": "alex-doe"}})[0] == 201
    escaped = urllib.parse.quote(sid, safe="")
    assert escaped != sid
    for path in (escaped, sid):  # escaped or as it is: one session
        status, shown = call(f"{api}/sessions/{path}")
        assert (status, shown["id"]) == (200, sid), shown
    status, page = call(f"{api}/sessions/{escaped}/events")
    assert status == 200 and page["events"] == []
    assert call(f"{api}/sessions/{escaped}", "DELETE")[0] == 204
    assert call(f"{api}/sessions/{escaped}")[0] == 404
