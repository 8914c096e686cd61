"""``Idempotency-Key`` through ``dormant serve`` on every store: memory, SQLite, Postgres and DynamoDB Local.

A retried run or answer returns its first result and writes nothing more; the key with another body is the
same typed error everywhere; a retry while the first request still runs is the same 409 everywhere (with the
server's four worker processes on the stores that have them: the records are shared through the database).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from tests.support.serve_calls import REQUEST, TIMEOUT, call, eventually
from tests.support.servers.postgres import throwaway_schema
from tests.support.servers.serve import ServeProcess, clinic_serve, dormant_serve

STORES = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.backend("postgres")),
    pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A store URL for ``dormant serve`` and the environment it needs: a store of the test's own (on Postgres a
    schema of its own, dropped after it: the database may be one earlier runs used, whose bookings took the
    sample's shared slots)."""
    kind = request.param
    if kind == "memory":
        yield "memory:", {}
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'idem.db'}", {}
    elif kind == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        from psycopg.conninfo import conninfo_to_dict

        with throwaway_schema(url, "dormant_idem_") as own:
            yield url, {"PGOPTIONS": str(conninfo_to_dict(own)["options"])}
    else:
        from tests.support.servers.dynamodb import store_for_process

        yield store_for_process(request.getfixturevalue("dynamodb_endpoint"), f"idem-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def server(store: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[ServeProcess]:
    with clinic_serve(store, tmp_path, TIMEOUT) as process:
        yield process


def fresh(api: str) -> str:
    session_id = f"i-{uuid.uuid4().hex[:12]}"
    assert call(f"{api}/sessions", "POST", {"session_id": session_id})[0] == 201
    return session_id


def test_a_retried_run_and_answer_return_their_first_result_on_every_store(server: ServeProcess) -> None:
    api = server.url
    sid = fresh(api)
    run_key = {"Idempotency-Key": f"run-{sid}"}
    first = call(f"{api}/sessions/{sid}/runs", "POST", {"message": REQUEST}, extra=run_key)
    assert first[0] == 200 and first[1]["status"] == "yielded_tool", first
    version = call(f"{api}/sessions/{sid}")[1]["version"]
    assert call(f"{api}/sessions/{sid}/runs", "POST", {"message": REQUEST}, extra=run_key) == first
    shown = call(f"{api}/sessions/{sid}")[1]
    assert shown["version"] == version and shown["status"] == "awaiting_input"  # the retry ran nothing

    # the same key with another body: refused, named, nothing written
    status, refused = call(f"{api}/sessions/{sid}/runs", "POST", {"message": "another"}, extra=run_key)
    assert (status, refused["error"], refused["field"]) == (400, "InputError", "Idempotency-Key"), refused
    assert call(f"{api}/sessions/{sid}")[1]["version"] == version

    [waiting] = shown["yielded_tools"]
    answer = {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True}}]}
    tools_key = {"Idempotency-Key": f"tools-{sid}", "Prefer": "wait=25"}
    answered = call(f"{api}/sessions/{sid}/tools", "POST", answer, extra=tools_key)
    assert answered[0] == 200 and answered[1]["status"] == "completed", answered
    done = call(f"{api}/sessions/{sid}")[1]
    # a second answer to an answered call would be a 409 UnknownCallId: the retry is the first's 200 instead
    assert call(f"{api}/sessions/{sid}/tools", "POST", answer, extra=tools_key) == answered
    assert call(f"{api}/sessions/{sid}")[1]["version"] == done["version"]
    without_key = call(f"{api}/sessions/{sid}/tools", "POST", answer)
    assert (without_key[0], without_key[1]["error"]) == (409, "UnknownCallId")

    # the key is the session's: the same key on another session is a request of its own
    other = fresh(api)
    ran = call(f"{api}/sessions/{other}/runs", "POST", {"message": REQUEST}, extra=run_key)
    assert ran[0] == 200 and call(f"{api}/sessions/{other}")[1]["status"] == "awaiting_input", ran

    # deleting the session forgets its records: the id made again runs the key afresh
    assert call(f"{api}/sessions/{sid}", "DELETE")[0] == 204
    assert call(f"{api}/sessions", "POST", {"session_id": sid})[0] == 201
    again = call(f"{api}/sessions/{sid}/runs", "POST", {"message": REQUEST}, extra=run_key)
    assert again[0] == 200 and call(f"{api}/sessions/{sid}")[1]["status"] == "awaiting_input", again


@pytest.fixture
def hold_server(store: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[tuple[ServeProcess, Path]]:
    url, env = store
    root = str(Path(__file__).resolve().parents[2])  # tests.support.serve_app: the entry point does not add the cwd
    env = {**env, "HOLD_DIR": str(tmp_path), "PYTHONPATH": root}
    args = ("--store", url, "--app", "tests.support.serve_app:build", "--principal", "clinic")
    with dormant_serve(*args, env=env, cwd=tmp_path, timeout=TIMEOUT) as process:
        yield process, tmp_path
    assert "Traceback" not in process.output()


# Not on memory: its one worker serves one request at a time, so no retry can overlap the first there.
@pytest.mark.parametrize("store", STORES[1:], indirect=True)
def test_a_retry_while_the_first_request_runs_is_a_409_on_every_store(
    hold_server: tuple[ServeProcess, Path],
) -> None:
    server, folder = hold_server
    api = server.url
    sid = fresh(api)
    key = {"Idempotency-Key": f"hold-{sid}", "Prefer": "wait=25"}
    results: list[tuple[int, Any]] = []
    first = threading.Thread(
        target=lambda: results.append(call(f"{api}/sessions/{sid}/runs", "POST", {"message": "go"}, extra=key))
    )
    first.start()
    try:
        eventually((folder / "inside").exists)  # the first request is inside its turn
        for _ in range(3):  # whichever worker takes the retry: the record is the store's, not the process's
            status, held = call(f"{api}/sessions/{sid}/runs", "POST", {"message": "go"}, extra=key)
            assert (status, held.get("error"), held.get("field")) == (409, "RequestInProgress", "Idempotency-Key"), held
        status, other = call(f"{api}/sessions/{sid}/runs", "POST", {"message": "other"}, extra=key)
        assert (status, other["field"]) == (400, "Idempotency-Key"), other  # another body: refused, not held
    finally:
        (folder / "release").touch()
        first.join(TIMEOUT)
    [(status, ran)] = results
    assert status == 200 and ran["output"]["text"] == '{"released": true}', ran
    assert call(f"{api}/sessions/{sid}/runs", "POST", {"message": "go"}, extra=key) == (status, ran)
