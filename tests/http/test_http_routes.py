"""The HTTP API's parts (``serving.http``): a function builds only its own routes, the routes its module
declares are the ones API Gateway sends it (``serving.routes``), and a request's body is parsed once."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.errors import ConfigurationError
from dormant.serving import api
from dormant.serving.api import api_handler
from dormant.serving.idempotency import MemoryIdempotency
from dormant.serving.runtime import Served, load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.memory import MemorySessionStore
from tests.support.lambda_events import Client

REQUEST = "I need physio on Tuesday afternoon, for Alex Doe"


@pytest.fixture
def served() -> Iterator[Served]:
    store = MemorySessionStore()
    yield load_served("bookings:build", store)
    store.close()


def test_a_function_serves_only_its_own_routes(served: Served) -> None:
    commit = Client(api_handler(in_process_hooks(served), served, function="commit"))
    sessions = Client(api_handler(in_process_hooks(served), served, function="sessions"))
    assert sessions.call("create_session", session_id="s-1", body={"session_id": "s-1"})[0] == 201
    status, missing = commit.call("get_session", session_id="s-1")
    assert (status, missing["error"]) == (404, "NotFound"), missing  # routed to sessions on AWS, not here
    status, _ = commit.call("commit", session_id="s-1", body={"expected_version": 99, "events": []})
    assert status == 409  # its own route: served (the version is wrong, so nothing is written)


def test_a_route_the_function_lacks_in_its_module_stops_the_build(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serving.routes`` builds API Gateway: a route sent to a function whose module serves no such route
    would answer every request a 404, so the handler's first request says so instead."""
    monkeypatch.setattr(api, "ROUTES", (*api.ROUTES, ("GET", "/sessions/{id}/nowhere", "sessions")))
    client = Client(api_handler(in_process_hooks(served), served, function="sessions"))
    with pytest.raises(ConfigurationError, match="nowhere"):
        client.call("get_session", session_id="s-1")


def test_a_body_is_parsed_once_per_request_even_with_an_idempotency_key(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    loads = json.loads

    def counted(text: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("dormant.serving") and text == body:
            parsed.append(caller)
        return loads(text, *args, **kwargs)

    client = Client(api_handler(in_process_hooks(served), served, MemoryIdempotency()))
    assert client.call("create_session", session_id="s-1", body={"session_id": "s-1"})[0] == 201
    body = json.dumps({"message": REQUEST})
    monkeypatch.setattr(json, "loads", counted)
    status, ran = client.call("run", session_id="s-1", raw_body=body, headers={"Idempotency-Key": "k-1"})
    assert status == 200 and ran["status"] == "yielded_tool", ran
    assert parsed == ["dormant.serving.http.request"]  # the route's model and the record's payload: one parse
    monkeypatch.setattr(json, "loads", loads)
    assert client.call("run", session_id="s-1", raw_body=body, headers={"Idempotency-Key": "k-1"}) == (status, ran)


def test_the_routes_of_every_function_are_those_of_serving_routes(tmp_path: Path) -> None:
    from dormant.serving.http.request import Api, Routes
    from dormant.serving.routes import ROUTES

    served = load_served("bookings:build", MemorySessionStore())
    built: dict[str, set[tuple[str, str]]] = {}
    for function in api.FUNCTIONS:
        routes = api._routes(function, Api(served, in_process_hooks(served), api.Logger(), None, None, "t"))
        assert isinstance(routes, Routes)
        built[function] = routes.paths
    assert built == {f: {(m, p) for m, p, g in ROUTES if g == f} for f in api.FUNCTIONS}
