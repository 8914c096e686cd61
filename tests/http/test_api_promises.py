"""Promises of the HTTP API that a plausible one-line bug would break silently: a ``Prefer: wait`` that ends only
when a turn has, CORS origins matched whatever slash they were given with, and a refused run that costs no
turn of the quota. Each test here went red when its behaviour was broken on purpose.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.events import StateChange, StateChangeEvent
from dormant.serving.api import api_handler
from dormant.serving.local import LocalAPI
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import StepFunctions, step_functions_hooks, workflow_handler
from dormant.stores.url import store_from_url
from tests.support.lambda_events import TENANT_A, Client, LambdaContext, create, load_event


class FakeStepFunctions:
    """What the API and the workflow call of Step Functions: executions started, task tokens woken."""

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
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'promises.db'}"


@pytest.fixture
def opened(url: str) -> Iterator[list[Served]]:
    """Served apps on ``url``, each on a store of its own (as separate Lambda functions are), closed after."""
    made: list[Served] = []
    yield made
    for served in made:
        served.app.store.close()


def open_served(url: str, opened: list[Served]) -> Served:
    served = load_served("bookings:build", store_from_url(url))
    opened.append(served)
    return served


def deployed(
    url: str, opened: list[Served], *, answers_inline: bool = True
) -> tuple[Client, FakeStepFunctions, Any, Served]:
    """The API as deployed (a run starts an execution; answers wake it) on a store of its own, and the workflow
    function on another: the state machine's tasks, run by the test. Also the API's ``Served``. Without
    ``answers_inline`` an answer whose caller waits is not run on by the tools function (``Hooks.end_wait``): it
    wakes the execution and waits for its turn, as before issue 36 (and as when its take-on loses)."""
    fake = FakeStepFunctions()
    machine = StepFunctions("arn:aws:states:eu-west-1:123456789012:stateMachine:resume", client=fake)
    api = open_served(url, opened)
    hooks = step_functions_hooks(machine)
    if not answers_inline:
        hooks = dataclasses.replace(hooks, end_wait=None)
    client = Client(api_handler(hooks, api, function=None))
    return client, fake, workflow_handler(open_served(url, opened), StepFunctions(client=fake)), api


def act(workflow: Any, action: str, started: dict[str, Any], **extra: Any) -> dict[str, Any]:
    given = json.loads(started["input"])
    event = {
        **load_event(f"workflow/{action}.json"),
        **{k: given[k] for k in ("tenant", "session_id", "invocation_id")},
    }
    return workflow({**event, **extra}, LambdaContext())  # type: ignore[no-any-return]


# -- Prefer: wait ends when a turn has, not when the session is merely ready for one -------------------------


def test_an_answer_that_waits_is_answered_with_the_resumed_turn_not_with_resumable(
    url: str, opened: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers land before the execution parks (no token to wake yet): the answer's ``Prefer: wait`` holds. A
    state change then lands (a client's direct write): a newer version, still ``resumable``, and no turn has
    run. The wait must hold on through it and answer with the turn the execution then runs (``completed``); a
    wait that took any newer version not ``running`` as the end answered ``yielded_tool``, the turn still to run.
    (The answer's turn run in the execution, not by the tools function: ``answers_inline=False``.)"""
    client, fake, workflow, api = deployed(url, opened, answers_inline=False)
    create(client)
    client.call("run", session_id="s-1", headers={"Prefer": ""})
    [started] = fake.started
    assert act(workflow, "run", started)["status"] == "yielded_tool"
    [call] = client.call("get_session", session_id="s-1")[1]["yielded_tools"]
    writer = open_served(url, opened).for_tenant(TENANT_A)

    moved, looked = threading.Event(), threading.Event()
    looks: list[tuple[int, str | None]] = []  # what the waiting request read once the state change landed
    load = api.app.store.load

    def watched(app_name: str, session_id: str, **kwargs: Any) -> Any:
        loaded = load(app_name, session_id, **kwargs)
        if session_id == "s-1" and loaded is not None and moved.is_set():
            looks.append((loaded.row.version, loaded.row.status))
            looked.set()
        return loaded

    monkeypatch.setattr(api.app.store, "load", watched)
    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    note = StateChangeEvent(scope="session", source="direct", changes=[StateChange(key="note", new_value="later")])
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.call, "tools", session_id="s-1", body=answers, headers={"Prefer": "wait=25"})
        while (answered := writer.sessions.require("s-1")).status != "resumable":
            assert not waiting.done(), waiting.result()
        assert writer.sessions.write("s-1", lambda session: session.append(note)).version == answered.version + 1
        moved.set()
        assert looked.wait(30), "the waiting answer never read the session again"
        assert act(workflow, "park", started, token="token-late") == {"woke": True, "status": "resumable"}
        assert act(workflow, "run", started)["status"] == "completed"
        status, body = waiting.result(timeout=60)
    assert status == 200 and body["status"] == "completed", body
    assert (answered.version + 1, "resumable") in looks, looks  # it saw the newer version, still resumable


# -- CORS origins: given with a trailing slash, matched without ----------------------------------------------

SLASHED, ORIGIN = "https://app.example/", "https://app.example"  # a browser's Origin never ends with a slash


def test_an_origin_configured_with_a_trailing_slash_gets_the_cors_headers(url: str, opened: list[Served]) -> None:
    """The handler as deployed, given ``DORMANT_CORS_ORIGINS`` with the slash: the browser's ``Origin`` (no
    slash) gets ``Access-Control-Allow-Origin`` on an answer and on a preflight."""
    from dormant.serving.workflow import in_process_hooks

    served = open_served(url, opened)
    handler = api_handler(in_process_hooks(served), served, cors_origins=[SLASHED])
    for name in ("list_sessions", "preflight"):
        event = copy.deepcopy(load_event("api/list_sessions.json"))
        asked = {"Origin": ORIGIN, **({"Access-Control-Request-Method": "POST"} if name == "preflight" else {})}
        event["headers"].update(asked)
        event.setdefault("multiValueHeaders", {}).update({k: [v] for k, v in asked.items()})
        if name == "preflight":
            event["httpMethod"] = "OPTIONS"
        response = handler(event, LambdaContext())
        headers = {**(response.get("headers") or {}), **(response.get("multiValueHeaders") or {})}
        allowed = headers.get("Access-Control-Allow-Origin")
        assert allowed in (ORIGIN, [ORIGIN]), (name, response)


def test_dormant_serve_given_an_origin_with_a_trailing_slash_serves_its_pages(url: str, opened: list[Served]) -> None:
    """``dormant serve --cors-origin https://app.example/``: the page's request passes the cross-site guard (a
    403 otherwise) and is answered with the origin's CORS headers."""
    api = LocalAPI(open_served(url, opened), cors_origins=[SLASHED])
    browser = [("Host", "127.0.0.1:8000"), ("Origin", ORIGIN), ("Sec-Fetch-Site", "cross-site")]
    reply = api.handle("GET", "/sessions", browser, b"", "127.0.0.1")
    assert reply.status == 200 and reply.headers.get("Access-Control-Allow-Origin") == ORIGIN, reply
    preflight = [*browser, ("Access-Control-Request-Method", "POST")]
    asked = api.handle("OPTIONS", "/sessions", preflight, b"", "127.0.0.1")
    assert asked.status == 204 and asked.headers.get("Access-Control-Allow-Origin") == ORIGIN, asked


# -- the turn quota: a run refused with 409 takes no turn of it ----------------------------------------------


def test_a_run_refused_because_a_live_run_holds_the_session_takes_no_turn_of_the_quota(
    url: str, opened: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quota 2 turns. One run is claimed and running (its execution not yet done); three more runs of that
    session are refused (409: held by a live run). A second session's run is then the second turn: 200 or
    202, not the quota's 429 that three refusals charged as turns would give."""
    monkeypatch.setenv("DORMANT_TURN_QUOTA", "2/3600")
    client, fake, _, _ = deployed(url, opened)
    create(client, "s-1")
    create(client, "s-2")
    assert client.call("run", session_id="s-1", headers={"Prefer": ""})[0] == 202
    for _ in range(3):
        status, refused = client.call("run", session_id="s-1", headers={"Prefer": ""})
        assert status == 409, refused
    status, ran = client.call("run", session_id="s-2", headers={"Prefer": ""})
    assert status == 202 and len(fake.started) == 2, ran
    status, over = client.call("run", session_id="s-2", headers={"Prefer": ""})  # held too: 409, not a turn
    assert status == 409, over


# -- An answer whose caller waits: taken on in the answers' own commit ----------------------------------------


def test_an_answer_run_on_here_is_taken_on_in_the_answers_own_commit(url: str, opened: list[Served]) -> None:
    """``POST /tools`` with ``Prefer: wait`` that leaves the turn ready to go on: the answers and the take-on (the
    ``invocation_resume`` with the hold's deadline) land in one commit, so the session never stands ``resumable``
    with no runner, and the answer's commit pays the meta item's write and its index entries once, not twice."""
    client, fake, workflow, api = deployed(url, opened)
    create(client)
    client.call("run", session_id="s-1", headers={"Prefer": ""})
    [started] = fake.started
    assert act(workflow, "run", started)["status"] == "yielded_tool"
    assert act(workflow, "park", started, token="token-1") == {"woke": False, "status": "awaiting_input"}
    shown = client.call("get_session", session_id="s-1")[1]
    [call] = shown["yielded_tools"]
    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True}}]}
    status, body = client.call("tools", session_id="s-1", body=answers, headers={"Prefer": "wait=25"})
    assert status == 200 and body["status"] == "completed", body
    assert fake.sent == ["token-1"]  # the parked execution ended (inline), not woken to run it too
    store, name = api.app.store, api.for_tenant(TENANT_A).name
    wait = shown["version"]

    def commit(version: int) -> list[str]:
        """The types of the events the commit of ``version`` stored."""
        since, later = store.load(name, "s-1", after=version - 1), store.load(name, "s-1", after=version)
        assert since is not None and later is not None
        return [e.type for e in since.events[: len(since.events) - len(later.events)]]

    assert commit(wait + 1) == ["tool_input", "invocation_resume"], commit(wait + 1)
    assert "invocation_resume" not in commit(wait + 2), commit(wait + 2)
