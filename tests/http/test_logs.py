"""The handlers' logs on Lambda: the tenant, principal, session and invocation as keys on every line, the
library's own lines included; nothing a caller sent (messages, answers, tokens) in any line."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from dormant.serving.api import api_handler
from dormant.serving.runtime import load_served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.sqlite import sqlite_store
from tests.support.lambda_events import Client

MARK = "MARK-7f1c"
"""In every message and answer the test sends: it must never reach a log."""


def lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if line.startswith("{") and '"level"' in line:
            found.append(json.loads(line))
    return found


def test_every_line_carries_who_and_which_session_and_no_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "dormant-sessions")
    # a logger of its own: Powertools binds a service's logger to the stdout of its first use (another test's)
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"logs-{uuid.uuid4().hex[:8]}")
    store = sqlite_store(tmp_path / "logs.db")
    served = load_served("bookings:build", store)
    client = Client(api_handler(in_process_hooks(served), served))
    body = {"session_id": "s-1", "scopes": {"user": "alex-doe"}}
    assert client.call("create_session", body=body)[0] == 201
    status, ran = client.call("run", session_id="s-1", body={"message": f"book a table {MARK}"})
    assert status == 200, ran
    for call in ran.get("yielded_tools") or []:
        answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": True, "note": MARK}}]}
        assert client.call("tools", session_id="s-1", body=answers)[0] in (200, 202)
    # a library line (dormant.*) inside a request, and the handler's own
    original = type(store).load

    def noisy(self: Any, app_name: str, session_id: str, **options: Any) -> Any:
        logging.getLogger("dormant.stores.sqlite").warning("loaded a session")
        return original(self, app_name, session_id, **options)

    monkeypatch.setattr(type(store), "load", noisy)
    assert client.call("get_session", session_id="s-1")[0] == 200
    monkeypatch.setattr(type(store), "load", original)
    assert client.call("erase", body={"scope": "user", "scope_id": "alex-doe"})[0] == 200
    assert client.call("get_session", session_id="nope", tenant="tenant-b")[0] == 404
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert MARK not in text and "sample-cognito-id-token" not in text
    logged = lines(text)
    assert any(line["message"] == "erased" for line in logged), text
    (library,) = [line for line in logged if line["message"] == "loaded a session"]
    assert (library["tenant"], library["session_id"]) == ("tenant-a", "s-1")
    for line in logged:
        assert line["tenant"] == line["principal"] and line["tenant"] in ("tenant-a", "tenant-b"), line
        assert "function_request_id" in line or "correlation_id" in line, line
    store.close()
