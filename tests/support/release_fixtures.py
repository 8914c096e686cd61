"""The app the stored-format fixtures (``tests/fixtures/release-*``) were written by, and how to write them.

Every later release must load, resume and commit what an earlier one stored: the fixtures are files in
each store's own format, written once by ``tests/fixtures/<release>/generate.py`` and never rewritten.
The app below must keep accepting them; if its models change, it declares migrations.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dormant import App, adk, openai
from dormant.agents.agent import Agent
from dormant.clock import frozen_clock
from dormant.stores.dynamodb.table import IndexShape, TableShape
from dormant.testing import MockAdapter

FIXTURES = Path(__file__).parents[1] / "fixtures"
APP = "clinic-fixture"
WAITING = "s-waiting"
"""A session paused on a yielded tool call, its answer still to come."""
DONE = "s-done"
"""A completed session."""
USER = "u-fixture"
STARTED_AT = 1_767_225_600_000  # 2026-01-01T00:00:00Z

DYNAMODB_TABLES = {
    "release-0.1": TableShape(
        indexes=(
            IndexShape("listing", ("lpk", "S"), ("lsk", "N"), "INCLUDE", ("id", "created_at", "version", "status")),
            IndexShape("pending", ("ppk", "S"), ("psk", "N"), "KEYS_ONLY"),
            IndexShape("ids", ("pk", "S"), ("eid", "S"), "INCLUDE", ("inc",), local=True),
        )
    ),
}
"""The DynamoDB table each release made (its ``table.TABLE``): what its stored items sit in."""


class Approval(BaseModel):
    approved: bool


class Visit(BaseModel):
    reason: str = ""
    approved: bool = False


class Patient(BaseModel):
    display_name: str = "friend"
    visits: int = 0


def fixture_app(store: Any) -> tuple[App, MockAdapter, Agent]:
    scripted = MockAdapter()
    app = adk(name=APP, schema={"session": Visit, "user": Patient}, store=store, adapters={"openai": scripted})

    def book(ctx: Any) -> str:
        ctx.state.approved = bool(ctx.input.approved)
        ctx.state.user.visits = ctx.state.user.visits + 1
        return "booked" if ctx.input.approved else "declined"

    tool = app.tool(name="book", description="Book once a human approves.", execute=book, yield_schema=Approval)
    agent = app.agent(name="booker", model=openai("m"), context=[app.context.history()], tools=[tool])
    return app, scripted, agent


def write_sessions(store: Any) -> None:
    """Store the fixture sessions: one waiting for an answer, one completed, their user's shared state."""
    app, scripted, agent = fixture_app(store)
    with frozen_clock(STARTED_AT):
        for session_id in (WAITING, DONE):
            scripted.set_responses([{"tool_calls": [{"name": "book", "args": {}, "call_id": "call-1"}]}])
            session = app.sessions.create(session_id, scopes={"user": USER})
            run = app.run(
                agent,
                {"message": "Book me in, please.", "initial_state": {"session": {"reason": "check-up"}}},
                session=session,
            )
            run.session.state.user.display_name = "Ada"
            app.sessions.commit(run.session)
        done = app.sessions.require(DONE)
        done.input.answer("call-1", {"approved": True})
        scripted.set_responses([{"text": "Booked."}])
        app.sessions.commit(app.run(agent, session=done).session)


def _binary(value: Any) -> Any:
    """DynamoDB JSON as the AWS CLI prints it (base64 binaries) back to what boto3 sends."""
    if isinstance(value, dict):
        return {
            k: base64.b64decode(v) if k == "B" else [base64.b64decode(b) for b in v] if k == "BS" else _binary(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_binary(v) for v in value]
    return value


def old_dynamodb_table(ddb: Any, release: str) -> str:
    """A table of the shape ``release`` made, holding the items it stored (raw, as the fixture has them)."""
    items = [_binary(item) for item in json.loads((FIXTURES / release / "dynamodb.json").read_text())]
    assert items
    table = f"fixture-{uuid.uuid4().hex[:8]}"
    ddb.create_table(**DYNAMODB_TABLES[release].create_table_request(table))
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    for start in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        assert not ddb.batch_write_item(RequestItems={table: batch}).get("UnprocessedItems")
    return table
