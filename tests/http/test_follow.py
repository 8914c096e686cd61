"""Following a running turn without busy-polling: ``GET /sessions/{id}/events?after=N&wait=S`` holds until
events after N land, pages are capped by bytes as well as count, and ``dormant serve`` offers the same feed
as server-sent events (``Accept: text/event-stream``).

A second writer (a thread with a store of its own, as another process would be) commits while a request
holds; the tests check what the reader gets and in which order, never how fast.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.events import UserEvent
from dormant.serving.api import MAX_EVENTS_PAGE_BYTES, MAX_WAIT_SECONDS, api_handler
from dormant.serving.local import LocalAPI, LocalServer
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.url import store_from_url
from tests.support.lambda_events import TENANT_A, TENANT_B, Client, LambdaContext, load_event
from tests.support.servers.serve import dormant_serve

LAMBDA_RESPONSE_LIMIT = 6_000_000  # bytes: Lambda's synchronous response limit, "6 MB"


def open_served(url: str) -> Served:
    return load_served("bookings:build", store_from_url(url))


@pytest.fixture
def served(store_url: str) -> Iterator[Served]:
    served = open_served(store_url)
    yield served
    served.app.store.close()


@pytest.fixture
def client(served: Served) -> Client:
    return Client(api_handler(in_process_hooks(served), served))


def append(served: Served, session_id: str, *texts: str, tenant: str = TENANT_A) -> None:
    """Commit one user event per text to the stored session, as a turn commits its steps."""
    tenant_app = served.for_tenant(tenant)
    session = tenant_app.sessions.require(session_id)
    for text in texts:
        session.append(UserEvent(text=text))
    tenant_app.sessions.commit(session)


def texts(page: dict[str, Any]) -> list[str]:
    return [e["text"] for e in page["events"]]


class Writer(threading.Thread):
    """Another process's writer: its own store; commits ``texts`` once ``go`` is set (after ``delay`` s)."""

    def __init__(self, url: str, session_id: str, *texts: str, delay: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url, self.session_id, self.texts, self.delay = url, session_id, texts, delay
        self.committed = threading.Event()
        self.failed: BaseException | None = None

    def run(self) -> None:
        served = open_served(self.url)
        try:
            time.sleep(self.delay)
            append(served, self.session_id, *self.texts)
            self.committed.set()
        except BaseException as exc:  # reported by the test
            self.failed = exc
        finally:
            served.app.store.close()


# -- ?wait= ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", " 1", "1_0", "٣", str(MAX_WAIT_SECONDS + 1), "99999999"])
def test_a_wait_that_is_not_0_to_25_digits_is_a_400_naming_wait(client: Client, bad: str) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    status, body = client.call("session_events", session_id="s-1", query={"after": "0", "wait": bad})
    assert status == 400 and body["field"] == "wait", body


def test_a_held_request_answers_with_the_events_another_writer_commits(
    client: Client, served: Served, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    append(served, "s-1", "one", "two")
    # what the held request reads from the store: the tail after the version it saw, never the whole ledger
    store = served.app.store
    reads: list[int | None] = []
    load = store.load

    def recording(app_name: str, session_id: str, *, after: int | None = None) -> Any:
        reads.append(after)
        return load(app_name, session_id, after=after)

    monkeypatch.setattr(store, "load", recording)
    writer = Writer(store_url, "s-1", "three", "four")
    writer.start()
    started = time.monotonic()
    status, page = client.call("session_events", session_id="s-1", query={"after": "2", "wait": str(MAX_WAIT_SECONDS)})
    held = time.monotonic() - started
    writer.join(timeout=30)
    assert writer.failed is None and writer.committed.is_set()
    assert status == 200 and texts(page) == ["three", "four"] and page["next"] is None
    assert held < MAX_WAIT_SECONDS  # it answered when they landed, not at the end of the wait
    version_seen = 2  # created (1), then "one" and "two" (2)
    held_reads = reads[reads.index(version_seen) :] if version_seen in reads else []
    assert held_reads and all(after is not None and after >= version_seen for after in held_reads), reads


def test_an_idle_held_request_answers_an_empty_page_after_the_wait(client: Client, served: Served) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    append(served, "s-1", "one")
    started = time.monotonic()
    status, page = client.call("session_events", session_id="s-1", query={"after": "1", "wait": "1"})
    assert time.monotonic() - started >= 1
    assert (status, page) == (200, {"events": [], "next": None})
    # events already there are answered at once, whatever the wait
    status, page = client.call("session_events", session_id="s-1", query={"after": "0", "wait": "25"})
    assert status == 200 and texts(page) == ["one"]


def test_a_wait_past_the_end_holds_until_that_index_exists(client: Client, served: Served, store_url: str) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    append(served, "s-1", "zero")
    first = Writer(store_url, "s-1", "one", delay=0.2)  # lands before index 2 exists: not enough
    second = Writer(store_url, "s-1", "two", "three", delay=1.5)
    first.start()
    second.start()
    status, page = client.call("session_events", session_id="s-1", query={"after": "2", "wait": "25"})
    first.join(timeout=30)
    second.join(timeout=30)
    assert status == 200 and texts(page) == ["two", "three"]


def test_a_held_request_answers_before_its_functions_deadline(client: Client) -> None:
    """A function with 4 s left holds a wait=25 for at most 1 s: it answers (empty) rather than time out."""
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    event = load_event("api/session_events.json")
    event["headers"].pop("Idempotency-Key", None)
    event["pathParameters"] = {"id": "s-1"}
    event["path"] = "/sessions/s-1/events"
    event["requestContext"]["authorizer"]["claims"]["sub"] = TENANT_A
    event["queryStringParameters"] = {"after": "0", "wait": "25"}
    event["multiValueQueryStringParameters"] = {"after": ["0"], "wait": ["25"]}

    class Ending(LambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 4_000

    started = time.monotonic()
    response = client.handler(event, Ending())
    assert (response["statusCode"], json.loads(response["body"])) == (200, {"events": [], "next": None})
    assert time.monotonic() - started < 4  # answered inside the function's time


def test_a_held_request_of_a_deleted_session_is_a_404(client: Client, served: Served, store_url: str) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201

    def delete() -> None:
        time.sleep(0.5)
        other = open_served(store_url)
        other.for_tenant(TENANT_A).sessions.delete("s-1")
        other.app.store.close()

    thread = threading.Thread(target=delete, daemon=True)
    thread.start()
    status, body = client.call("session_events", session_id="s-1", query={"wait": "25"})
    thread.join(timeout=30)
    assert status == 404 and body["error"] == "SessionNotFound"


def test_another_tenants_session_is_a_404_before_any_wait(client: Client) -> None:
    assert client.call("create_session", body={"session_id": "s-1"})[0] == 201
    status, body = client.call("session_events", tenant=TENANT_B, session_id="s-1", query={"wait": "25"})
    assert status == 404 and body["error"] == "SessionNotFound"


# -- pages capped by bytes ----------------------------------------------------------------------------------


def raw_events(client: Client, session_id: str) -> list[tuple[dict[str, Any], int]]:
    """Every page of the ledger at limit=1000, with the size of the Lambda response that carried it."""
    pages = []
    after: int | None = 0
    while after is not None:
        event = load_event("api/session_events.json")
        event["headers"].pop("Idempotency-Key", None)
        event["pathParameters"] = {"id": session_id}
        event["path"] = f"/sessions/{session_id}/events"
        event["requestContext"]["authorizer"]["claims"]["sub"] = TENANT_A
        event["queryStringParameters"] = {"after": str(after), "limit": "1000"}
        event["multiValueQueryStringParameters"] = {"after": [str(after)], "limit": ["1000"]}
        response = client.handler(event, LambdaContext())
        assert response["statusCode"] == 200
        page = json.loads(response["body"])
        pages.append((page, len(json.dumps(response).encode())))  # as the runtime would send it
        after = page["next"]
    return pages


@pytest.mark.parametrize(
    ("unit", "count"),
    [
        ("x", 1_000_000),  # ~1 MB of plain text per event
        ('"', 500_000),  # ~1 MB stored, twice that in the response: each quote escaped once more there
        ("\U0001f600", 250_000),  # ~1 MB stored (4 bytes each), 12 in the response (a surrogate pair)
    ],
    ids=["ascii", "quotes", "emoji"],
)
def test_a_page_of_large_events_stays_under_lambdas_response_limit(
    client: Client, served: Served, unit: str, count: int
) -> None:
    assert client.call("create_session", body={"session_id": "s-big"})[0] == 201
    bodies = [f"{n}:" + unit * count for n in range(6)]
    for text in bodies:  # one commit each: a commit carries what a turn step does
        append(served, "s-big", text)
    pages = raw_events(client, "s-big")
    sizes = [size for _, size in pages]
    print(f"{unit!r}: {len(pages)} pages, Lambda responses of {sizes} bytes")
    assert len(pages) >= 2 and all(page["events"] for page, _ in pages)
    assert all(size < LAMBDA_RESPONSE_LIMIT for size in sizes), sizes
    assert max(sizes) <= MAX_EVENTS_PAGE_BYTES + 4096, sizes  # the budget, and an envelope
    assert [e["text"] for page, _ in pages for e in page["events"]] == bodies  # each once, in order


# -- server-sent events from `dormant serve` ----------------------------------------------------------------


class Stream:
    """An event-stream client over a raw HTTP connection: frames as they arrive, comments too."""

    def __init__(self, base: str, path: str, headers: dict[str, str] | None = None, timeout: float = 30) -> None:
        split = urllib.parse.urlsplit(base)
        self.connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=timeout)
        self.connection.request("GET", path, headers={"Accept": "text/event-stream", **(headers or {})})
        self.response = self.connection.getresponse()
        self.comments: list[str] = []

    @property
    def status(self) -> int:
        return self.response.status

    def next_frame(self) -> dict[str, str]:
        """The next event (``id``, ``event``, ``data``), keeping the comments met on the way."""
        fields: dict[str, str] = {}
        while True:
            line = self.response.readline()
            if not line:
                raise EOFError(f"the stream ended; got {fields}")
            text = line.decode().rstrip("\n")
            if text.startswith(":"):
                self.comments.append(text)
            elif text:
                name, _, value = text.partition(": ")
                fields[name] = value
            elif fields:
                return fields

    def events(self, count: int) -> list[tuple[int, str, dict[str, Any]]]:
        frames = [self.next_frame() for _ in range(count)]
        return [(int(f["id"]), f["event"], json.loads(f["data"])) for f in frames]

    def close(self) -> None:
        self.response.close()  # the response holds the socket (the server said Connection: close)
        self.connection.close()


def http_call(base: str, method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def commit_texts(base: str, session_id: str, *texts: str) -> None:
    version = http_call(base, "GET", f"/sessions/{session_id}")[1]["version"]
    events = [{"type": "user", "text": text} for text in texts]
    status, body = http_call(
        base, "POST", f"/sessions/{session_id}/commit", {"expected_version": version, "events": events}
    )
    assert status == 200, body


def test_dormant_serve_streams_each_event_as_it_lands_and_resumes_after_the_last_seen(
    store_url: str, tmp_path: Path
) -> None:
    with dormant_serve("--store", store_url, "--quiet", cwd=tmp_path, timeout=60) as server:  # env: the store's
        base = server.url
        assert http_call(base, "POST", "/sessions", {"session_id": "s-1"})[0] == 201
        commit_texts(base, "s-1", "zero", "one")
        stream = Stream(base, "/sessions/s-1/events?after=0")
        assert stream.status == 200 and stream.response.headers["Content-Type"].startswith("text/event-stream")
        assert [(i, kind, e["text"]) for i, kind, e in stream.events(2)] == [(0, "user", "zero"), (1, "user", "one")]
        commit_texts(base, "s-1", "two")  # a second writer, while the stream waits
        ((index, kind, event),) = stream.events(1)
        ledger = http_call(base, "GET", "/sessions/s-1/events")[1]["events"]
        assert (index, kind, event) == (2, "user", ledger[2])  # the event as the ledger holds it
        stream.close()

        # a reconnecting EventSource names the last event it got; after= starts anywhere
        resumed = Stream(base, "/sessions/s-1/events?after=0", {"Last-Event-ID": "1"})
        assert [i for i, _, _ in resumed.events(1)] == [2]
        resumed.close()
        later = Stream(base, "/sessions/s-1/events?after=1")
        assert [i for i, _, _ in later.events(2)] == [1, 2]
        commit_texts(base, "s-1", "three")
        assert [(i, e["text"]) for i, _, e in later.events(1)] == [(3, "three")]
        later.close()

        # the JSON long-poll, as on Lambda: held in a worker until the next commit lands
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(http_call, base, "GET", "/sessions/s-1/events?after=4&wait=25")
            commit_texts(base, "s-1", "four")
            status, page = held.result(timeout=60)
        assert status == 200 and [e["text"] for e in page["events"]] == ["four"] and page["next"] is None
    assert "Traceback" not in server.output()


def test_event_streams_refuse_as_the_json_route_does(tmp_path: Path) -> None:
    with dormant_serve(
        "--store", f"sqlite:///{tmp_path / 's.db'}", "--principal", "clinic", "--quiet", cwd=tmp_path
    ) as server:
        base = server.url
        assert http_call(base, "POST", "/sessions", {"session_id": "s-1"})[0] == 201
        cases = [
            ({"X-Dormant-Principal": "someone-else"}, "/sessions/s-1/events", 404, "session_id"),  # another tenant's
            ({}, "/sessions/nope/events", 404, "session_id"),
            ({"Origin": "http://evil.example"}, "/sessions/s-1/events", 403, None),
            ({}, "/sessions/s-1/events?after=x", 400, "after"),
            ({}, "/sessions/s-1/events?limit=5000", 400, "limit"),
            ({"Last-Event-ID": "-1"}, "/sessions/s-1/events", 400, "Last-Event-ID"),
        ]
        for headers, path, status, field in cases:
            stream = Stream(base, path, headers)
            body = json.loads(stream.response.read())
            assert (stream.status, body.get("field")) == (status, field), (headers, path, body)
            assert stream.response.headers["Content-Type"] == "application/json"
            stream.close()
        # the clinic's own stream, as its principal
        own = Stream(base, "/sessions/s-1/events", {"X-Dormant-Principal": "clinic"})
        commit_texts(base, "s-1", "hello")
        assert [e["text"] for _, _, e in own.events(1)] == ["hello"]
        own.close()


def test_open_streams_hold_no_worker(tmp_path: Path) -> None:
    """With one worker and three idle streams, every other request is still answered, and the streams see
    what those requests commit: a stream that held its worker would leave the others waiting until it ends."""
    with dormant_serve(
        "--store", f"sqlite:///{tmp_path / 's.db'}", "--workers", "1", "--quiet", cwd=tmp_path
    ) as server:
        base = server.url
        assert http_call(base, "POST", "/sessions", {"session_id": "s-1"})[0] == 201
        streams = [Stream(base, "/sessions/s-1/events") for _ in range(3)]
        assert all(s.status == 200 for s in streams)
        for n in range(3):
            assert http_call(base, "GET", "/sessions", timeout=10)[0] == 200
            commit_texts(base, "s-1", f"note {n}")
        for stream in streams:
            assert [(i, e["text"]) for i, _, e in stream.events(3)] == [(n, f"note {n}") for n in range(3)]
        # the server stops at Ctrl-C with the streams still open: each ends, and its client reads the end
        server.stop()
        for stream in streams:
            with pytest.raises((EOFError, ConnectionError)):
                stream.next_frame()
            stream.close()
    assert "Traceback" not in server.output()


def test_an_idle_stream_beats_and_ends_when_its_client_goes(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'beat.db'}")
    served = load_served("bookings:build", store)
    api = LocalAPI(served, principal="local")
    assert api.call("POST", "/sessions", {}, b'{"session_id": "s-1"}', "local").status == 201
    for heartbeat in (0.2, 3600.0):  # beats; then a client that goes is noticed without one
        server = LocalServer(api, "127.0.0.1", 0, log_requests=False, heartbeat=heartbeat)
        with server.running():
            before = {t.ident for t in threading.enumerate()}
            stream = Stream(server.url, "/sessions/s-1/events")
            assert stream.status == 200
            if heartbeat < 1:
                lines = [stream.response.readline() for _ in range(4)]  # two beats (a comment, a blank line)
                assert lines == [b": keep-alive\n", b"\n"] * 2  # and no event
            serving = [t for t in threading.enumerate() if t.ident not in before]
            assert serving  # the thread holding the stream
            stream.close()
            for thread in serving:
                thread.join(timeout=10)
            assert not any(t.is_alive() for t in serving)  # it noticed the client went, and ended
    store.close()
