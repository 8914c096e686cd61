"""The Bookings sample on a real model adapter, as configured by BOOKINGS_MODEL: the CLI processes talk
to a local server that speaks the provider's API (OpenAI Chat Completions, Bedrock Converse)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.bookings_cli import REQUEST, bookings, session_id
from tests.support.fake_model_server import FakeModelServer, Reply, running

pytest.importorskip("openai")

SLOT = "physio-tue-1430"
SUMMARY = "physio with Sam Patel on Tuesday at 14:30 for Alex Doe"
PATIENT = {"name": "Alex Doe", "service": "physio", "day": "Tuesday", "part_of_day": "afternoon"}
FIND = {"service": "physio", "day": "Tuesday", "part_of_day": "afternoon"}


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with running() as fake:
        yield fake


def chat(*calls: tuple[str, dict[str, Any]], text: str | None = None) -> Reply:
    tool_calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for n, (name, args) in enumerate(calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
    usage = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    return Reply(
        200, {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage}
    )


def converse(*calls: tuple[str, dict[str, Any]], text: str | None = None) -> Reply:
    content: list[dict[str, Any]] = [{"text": text}] if text else []
    content += [
        {"toolUse": {"toolUseId": f"tu_{n}", "name": name, "input": args}} for n, (name, args) in enumerate(calls)
    ]
    body = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "tool_use" if calls else "end_turn",
        "usage": {"inputTokens": 50, "outputTokens": 10, "totalTokens": 60},
        "metrics": {"latencyMs": 5},
    }
    return Reply(200, body)


def run_the_arc(db: Path, env: dict[str, str]) -> str:
    asked = bookings(db, "ask", REQUEST, env=env)
    assert asked.returncode == 0, asked.stderr
    assert "scripted model" not in asked.stdout
    assert f"waiting for approval: {SUMMARY}" in asked.stdout
    sid = session_id(asked.stdout)
    approved = bookings(db, "approve", sid, env=env)
    assert approved.returncode == 0, approved.stderr
    assert (
        f"confirmation BK-{sid[-6:].upper()}: physio with Sam Patel, Tuesday at 14:30, for Alex Doe" in approved.stdout
    )
    return approved.stdout


def test_bookings_on_an_openai_compatible_server(server: FakeModelServer, tmp_path: Path) -> None:
    server.script(
        [
            chat(("remember_patient", PATIENT), ("find_slots", FIND)),
            chat(("request_approval", {"slot_id": SLOT, "summary": SUMMARY})),
            chat(("book_slot", {"slot_id": SLOT})),
            chat(text="Booked physio with Sam Patel on Tuesday at 14:30."),
        ]
    )
    env = {"BOOKINGS_MODEL": "openai:gpt-test", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{server.url}/v1"}
    out = run_the_arc(tmp_path / "b.db", env)
    assert "agent: Booked physio with Sam Patel" in out
    assert [r.json["model"] for r in server.requests] == ["gpt-test"] * 4
    # The approval arrived in another process: the third request carries the human's answer as a tool result.
    tool_results = [m for m in server.requests[2].json["messages"] if m["role"] == "tool"]
    assert json.loads(tool_results[-1]["content"]) == {"slot_id": SLOT, "approved": True, "note": None}


def test_bookings_on_bedrock_converse(server: FakeModelServer, tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    server.script(
        [
            converse(("remember_patient", PATIENT), ("find_slots", FIND)),
            converse(("request_approval", {"slot_id": SLOT, "summary": SUMMARY})),
            converse(("book_slot", {"slot_id": SLOT})),
            converse(text="Booked physio with Sam Patel on Tuesday at 14:30."),
        ]
    )
    env = {
        "BOOKINGS_MODEL": "bedrock:anthropic.claude-test",
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": server.url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    out = run_the_arc(tmp_path / "b.db", env)
    assert "agent: Booked physio with Sam Patel" in out
    assert all(r.path.endswith("/converse") and "anthropic.claude-test" in r.path for r in server.requests)
    third = server.requests[2].json["messages"]
    results = [block["toolResult"] for m in third for block in m["content"] if "toolResult" in block]
    assert [json.loads(block["text"]) for block in results[-1]["content"]] == [
        {"slot_id": SLOT, "approved": True, "note": None}
    ]


def test_a_model_failure_after_an_approval_is_listed_and_resumed(server: FakeModelServer, tmp_path: Path) -> None:
    """The answer is recorded, nothing is booked; `pending` lists the session and `resume` finishes it."""
    down = Reply(400, {"error": {"message": "model overloaded"}}, headers={"x-should-retry": "false"})
    server.script(
        [
            chat(("remember_patient", PATIENT), ("find_slots", FIND)),
            chat(("request_approval", {"slot_id": SLOT, "summary": SUMMARY})),
            down,
            chat(("book_slot", {"slot_id": SLOT})),
            chat(text="Booked physio with Sam Patel on Tuesday at 14:30."),
        ]
    )
    env = {"BOOKINGS_MODEL": "openai:gpt-test", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{server.url}/v1"}
    db = tmp_path / "b.db"
    sid = session_id(bookings(db, "ask", REQUEST, env=env).stdout)
    failed = bookings(db, "approve", sid, env=env)
    assert failed.returncode == 1 and "model overloaded" in failed.stderr and f"resume {sid}" in failed.stdout
    pending = bookings(db, "pending", env=env).stdout
    assert "1 to run again" in pending and sid in pending and "model overloaded" in pending
    assert bookings(db, "approve", sid, env=env).returncode == 4  # the answer is in: approving again is refused
    resumed = bookings(db, "resume", sid, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"confirmation BK-{sid[-6:].upper()}: physio with Sam Patel" in resumed.stdout
    assert bookings(db, "pending", env=env).stdout.strip() == "No booking is waiting for a human."
