"""Following a running turn without busy-polling: ``GET /sessions/{id}/events?after=N&wait=S`` holds until
events after N land, pages are capped by bytes as well as count, and ``dormant serve`` offers the same feed
as server-sent events (``Accept: text/event-stream``).

A second writer (a thread with a store of its own, as another process would be) commits while a request
holds; the tests check what the reader gets and in which order, never how fast.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.events import UserEvent
from dormant.serving.api import MAX_EVENTS_PAGE_BYTES, MAX_WAIT_SECONDS, api_handler
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.url import store_from_url
from tests.lambda_events import TENANT_A, TENANT_B, Client, LambdaContext, load_event

LAMBDA_RESPONSE_LIMIT = 6_000_000  # bytes: Lambda's synchronous response limit, "6 MB"


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'follow.db'}"
    from tests.servers.dynamodb import ACCESS_KEY, REGION

    endpoint = request.getfixturevalue("dynamodb_endpoint")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    return f"dynamodb://follow-{uuid.uuid4().hex[:12]}?endpoint={endpoint}&region={REGION}"


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
        ("\U0001f600", 250_000),  # ~1 MB stored (4 bytes each), 14 bytes each in the response
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
