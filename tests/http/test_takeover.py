"""A takeover with a message, on a session cut between a yielding tool call and its yield record.

The process running the turn died after committing the model's call of a yielding tool, before it recorded the
yield. The call waits for a human all the same: a message now would land between the call and its result,
which no transcript a model accepts holds. So a message is refused (``AwaitingInput``, nothing written), as it
is once the yield is recorded; a takeover without one records the yield, and the answer then lets it run.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, in_memory_store, openai
from dormant.errors import AwaitingInput
from dormant.events import InvocationYieldEvent, ToolCallEvent, UserEvent
from dormant.serving.api import api_handler
from dormant.serving.runtime import Served
from dormant.serving.turns import claim_turn, run_claimed
from dormant.serving.workflow import in_process_hooks
from dormant.testing import MockAdapter
from tests.support.lambda_events import TENANT_A, Client


class Question(BaseModel):
    q: str


class Reply(BaseModel):
    ok: bool


def cut_session(tenant: str | None = None) -> tuple[Any, Any, MockAdapter, str]:
    """A session whose turn stopped after its yielding call was committed, before the yield was (the app as
    ``tenant`` sees it, when one is named; ``app.served`` is what the API serves)."""
    model = MockAdapter()
    base = adk(name="cut", store=in_memory_store(), adapters={"openai": model})
    ask = base.tool(name="ask", schema=Question, yield_schema=Reply, execute=None)
    agent = base.agent(name="a", model=openai("m"), context=[base.context.history()], tools=[ask])
    served = Served(base, {agent.name: agent})
    app = served.for_tenant(tenant) if tenant is not None else base
    app.served = served
    model.set_responses([{"tool_calls": [{"name": "ask", "args": {"q": "go?"}, "call_id": "c-1"}]}, {"text": "done"}])
    session = app.sessions.create("s-1")
    for event in app.stream(agent, "start", session=session):
        if isinstance(event, ToolCallEvent):
            break  # the process dies here, with the call committed
    app.sessions.commit(session)
    stored = app.sessions.require("s-1")
    assert stored.status == "running" and not any(isinstance(e, InvocationYieldEvent) for e in stored.events)
    return app, agent, model, "s-1"


def ordered(events: Any) -> None:
    """No user message between a tool call and its result."""
    calls_open: set[str] = set()
    for event in events:
        if isinstance(event, ToolCallEvent):
            calls_open.add(event.call_id)
        elif isinstance(event, UserEvent):
            assert not calls_open, f"a message while calls {sorted(calls_open)} wait"
        elif getattr(event, "type", None) == "tool_result":
            calls_open.discard(event.call_id)  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["run", "claim"])
def test_a_message_with_a_takeover_of_a_cut_yield_is_refused_and_writes_nothing(how: str) -> None:
    app, agent, _, sid = cut_session()
    session = app.sessions.require(sid)
    before = (session.version, len(session.events))
    with pytest.raises(AwaitingInput) as refused:
        if how == "run":
            app.run(agent, "hello?", session=session)
        else:
            claim_turn(app, agent, session, {"message": "hello?"}, takeover=True)
    assert refused.value.field == "message" and "c-1" in str(refused.value)
    stored = app.sessions.require(sid)
    assert (stored.version, len(stored.events)) == before


def test_a_takeover_without_a_message_records_the_yield_and_the_answer_runs_on() -> None:
    app, agent, _, sid = cut_session()
    claim = claim_turn(app, agent, sid, None, takeover=True)
    outcome = run_claimed(app, claim)
    assert outcome.status == "yielded_tool" and [y.call_id for y in outcome.yielded_tools] == ["c-1"]
    stored = app.sessions.require(sid)
    assert stored.status == "awaiting_input"
    with pytest.raises(AwaitingInput):  # as for any yielded call
        app.run(agent, "hello?", session=stored)
    done = app.run(agent, {"answers": [{"call_id": "c-1", "input": {"ok": True}}]}, session=stored)
    app.sessions.commit(stored)
    assert done.status == "completed"
    ordered(app.sessions.require(sid).events)


def test_over_http_a_takeover_with_a_message_is_a_409_and_one_without_records_the_yield() -> None:
    app, _, _, sid = cut_session(TENANT_A)
    client = Client(api_handler(in_process_hooks(app.served), app.served))
    version = app.sessions.require(sid).version
    status, refused = client.call("run", session_id=sid, body={"message": "hello?", "takeover": True})
    assert (status, refused["error"], refused["field"]) == (409, "AwaitingInput", "message"), refused
    assert app.sessions.require(sid).version == version
    status, ran = client.call("run", session_id=sid, body={"takeover": True})
    assert status == 200 and ran["status"] == "yielded_tool", ran
    assert [y["call_id"] for y in ran["yielded_tools"]] == ["c-1"]
    ordered(app.sessions.require(sid).events)
