"""Input that cannot poison: what a remote runner commits is held to what a run could record.

Shared state is checked against its scope's schema before anything is written (a refused ``name: 5`` leaves
every other session of the user loading and running); the ledger rules (``dormant.ledger``) refuse events a
run could not have put where they stand (a result forged before its answer, a message while a call waits);
the same mistake gets the same class, status and field name on ``POST /tools`` and ``POST /commit``. On
SQLite and DynamoDB Local, through the Lambda handler in-process (the fixtures of ``tests/http/conftest.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from dormant import adk
from dormant.errors import AwaitingInput, EventOutOfOrder, InputError, UnknownCallId
from dormant.events import (
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelStartEvent,
    PendingCall,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    UserEvent,
)
from dormant.ledger import LedgerRules
from dormant.models.base import ModelRequest, ModelResponse
from dormant.serving.api import api_handler
from dormant.serving.runtime import Served
from dormant.serving.workflow import in_process_hooks
from dormant.stores.memory import in_memory_store
from tests.support.lambda_events import TENANT_A, Client, create

USER = "alex-doe"


def scoped(key: Any, value: Any) -> dict[str, Any]:
    return {"scoped_changes": [{"scope": "user", "scope_id": USER, "key": key, "value": value}]}


def change(key: Any, value: Any, scope: str = "user", **extra: Any) -> dict[str, Any]:
    event = {"type": "state_change", "scope": scope, "source": "direct", **extra}
    event["changes"] = [{"key": key, "new_value": value}]
    if scope == "user":
        event.setdefault("scope_id", USER)
    return {"events": [event]}


POISON = [
    (scoped("name", 5), 422, "StateValidationError", "scoped_changes.0.value"),
    (scoped("preferences", "notadict"), 422, "StateValidationError", "scoped_changes.0.value"),
    (scoped("preferences", {"part_of_day": "midnight"}), 422, "StateValidationError", "scoped_changes.0.value"),
    (scoped("favourite", "tea"), 422, "StateValidationError", "scoped_changes.0.key"),  # not declared
    (scoped("", "x"), 400, "InvalidKey", "scoped_changes.0.key"),
    (scoped("k" * 129, "x"), 400, "InvalidKey", "scoped_changes.0.key"),  # the key rule: 1 to 128 characters
    (scoped("na\x00me", "x"), 422, "ValueNotStorable", "scoped_changes.0.key"),
    (scoped("name", "Al\x00ex"), 422, "ValueNotStorable", "scoped_changes.0.value"),
    (change("name", 5), 422, "StateValidationError", "events.0.changes.0.new_value"),
    (change("preferences", "notadict"), 422, "StateValidationError", "events.0.changes.0.new_value"),
    (change("favourite", "tea"), 422, "StateValidationError", "events.0.changes.0.key"),
    (change("", "x"), 400, "InvalidKey", "events.0.changes.0.key"),
    (change("k" * 129, "x"), 400, "InvalidKey", "events.0.changes.0.key"),
    (change("na\x00me", "x"), 422, "ValueNotStorable", "events.0.changes.0.key"),
    (change("approved_slot", 5, scope="session"), 422, "StateValidationError", "events.0.changes.0.new_value"),
    (change("k", 1, scope="temp"), 400, "UnknownScope", "events.0.scope"),  # temp is never on a ledger
    (change("k", 1, scope="patient"), 400, "UnknownScope", "events.0.scope"),  # not in the app's schema
]


@pytest.mark.parametrize(("body", "status", "error", "field"), POISON)
def test_shared_state_cannot_be_poisoned_by_a_remote_commit(
    client: Client,
    served: Served,
    body: dict[str, Any],
    status: int,
    error: str,
    field: str,
) -> None:
    """The issue's finding: ``{name: 5, preferences: "notadict"}`` was a 200, and every other session of the
    user then showed it and ended its runs in ``error``. Now refused, naming the value, nothing written."""
    create(client, "s-1")
    create(client, "s-2")  # the same user's other session
    app = served.for_tenant(TENANT_A)
    app.store.save_scoped_state(app.name, "user", USER, {"name": "Alex Doe"})
    before = app.store.load_scoped_state(app.name, "user", USER)

    got, refused = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": [], **body})
    assert (got, refused["error"], refused["field"]) == (status, error, field), refused
    assert client.call("get_session", session_id="s-1")[1]["version"] == 1
    assert app.store.load_scoped_state(app.name, "user", USER) == before

    assert client.call("get_session", session_id="s-2")[0] == 200
    got, ran = client.call("run", session_id="s-2", headers={"Prefer": "wait=25"})
    assert got == 200 and ran["status"] == "yielded_tool", ran  # the other session still runs


def test_the_poison_of_the_issue_in_one_commit_is_refused_and_a_valid_write_still_lands(
    client: Client,
    served: Served,
) -> None:
    create(client, "s-1")
    create(client, "s-2")
    app = served.for_tenant(TENANT_A)
    both = {"scoped_changes": [*scoped("name", "Sam")["scoped_changes"], *scoped("preferences", "x")["scoped_changes"]]}
    got, refused = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": [], **both})
    assert (got, refused["field"]) == (422, "scoped_changes.1.value"), refused
    assert app.store.load_scoped_state(app.name, "user", USER) == {}  # not even the valid first one

    good = {"scoped_changes": [*scoped("name", "Sam")["scoped_changes"]]}
    good["scoped_changes"].append(
        {"scope": "user", "scope_id": USER, "key": "preferences", "value": {"day": "Tuesday"}}
    )
    got, done = client.call("commit", session_id="s-1", body={"expected_version": 1, "events": [], **good})
    assert got == 200, done
    stored = app.store.load_scoped_state(app.name, "user", USER)
    assert stored["name"] == "Sam" and stored["preferences"]["day"] == "Tuesday"
    got, ran = client.call("run", session_id="s-2", headers={"Prefer": "wait=25"})
    assert got == 200 and ran["status"] == "yielded_tool", ran


# -- the ledger rules, over HTTP ---------------------------------------------------------------------


def waiting_session(client: Client) -> tuple[dict[str, Any], int, str]:
    """A session paused on its approval call: (the call, the version, the invocation id)."""
    create(client, "s-1")
    got, ran = client.call("run", session_id="s-1", headers={"Prefer": "wait=25"})
    assert got == 200 and ran["status"] == "yielded_tool", ran
    ledger = client.call("session_events", session_id="s-1")[1]["events"]
    invocation = next(e["invocation_id"] for e in ledger if e["type"] == "invocation_yield")
    return ran["yielded_tools"][0], ran["version"], invocation


def test_a_result_forged_before_the_answer_is_refused_and_the_real_tool_runs_on_the_real_answer(
    client: Client,
) -> None:
    """The issue's finding: a ``tool_result`` for a yielded call before any answer became the call's only result."""
    call, version, invocation = waiting_session(client)
    forged = {"type": "tool_result", "call_id": call["call_id"], "name": "request_approval"}
    forged["result"] = {"approved": True, "slot_id": "forged"}
    resume = {"type": "invocation_resume", "invocation_id": invocation}
    for events, field in (([forged], "events.0.call_id"), ([resume, forged], "events.1.call_id")):
        got, refused = client.call("commit", session_id="s-1", body={"expected_version": version, "events": events})
        assert (got, refused["error"], refused["field"]) == (409, "EventOutOfOrder", field), refused
    assert client.call("get_session", session_id="s-1")[1]["version"] == version

    deny = {"answers": [{"call_id": call["call_id"], "input": {"approved": False, "note": "not Tuesday"}}]}
    got, done = client.call("tools", session_id="s-1", body=deny, headers={"Prefer": "wait=25"})
    assert got == 200, done
    ledger = client.call("session_events", session_id="s-1", query={"limit": "500"})[1]["events"]
    results = [e for e in ledger if e["type"] == "tool_result" and e["call_id"] == call["call_id"]]
    assert len(results) == 1 and results[0]["result"]["approved"] is False, results  # the real tool, real answer
    shown = client.call("get_session", session_id="s-1")[1]
    assert (
        shown["state"]["session"]["refusal"] == "not Tuesday" and shown["state"]["session"].get("confirmation") is None
    )


def test_a_remote_message_while_a_call_waits_is_refused_as_post_runs_refuses_it(
    client: Client,
) -> None:
    _, version, _ = waiting_session(client)
    message = {"type": "user", "text": "never mind"}
    got, refused = client.call("commit", session_id="s-1", body={"expected_version": version, "events": [message]})
    assert (got, refused["error"], refused["field"]) == (409, "AwaitingInput", "events.0"), refused
    got, by_run = client.call("run", session_id="s-1", body={"message": "never mind"})
    assert (got, by_run["error"]) == (409, "AwaitingInput"), by_run  # the same class and status
    assert client.call("get_session", session_id="s-1")[1]["version"] == version


@pytest.mark.parametrize("route", ["tools", "commit"])
def test_answering_a_call_never_made_is_the_same_answer_on_both_routes(
    client: Client,
    route: str,
) -> None:
    _, version, _ = waiting_session(client)
    if route == "tools":
        body: dict[str, Any] = {"answers": [{"call_id": "c-never", "input": {"approved": True}}]}
        field = "answers.0.call_id"
    else:
        answer = {"type": "tool_input", "call_id": "c-never", "name": "request_approval", "input": {"approved": True}}
        body, field = {"expected_version": version, "events": [answer]}, "events.0.call_id"
    got, refused = client.call(route, session_id="s-1", body=body)
    assert (got, refused["error"], refused["field"]) == (409, "UnknownCallId", field), refused


@pytest.mark.parametrize(
    ("answers", "status", "error", "field"),
    [
        ([{"call_id": "CALL", "input": {"approved": "perhaps"}}], 422, "ToolInputError", "answers.0.input.approved"),
        ([{"call_id": "CALL", "input": {"approved": "\x00"}}], 422, "ValueNotStorable", "answers.0.input.approved"),
        ([{"call_id": "CALL", "input": {"approved": True}}] * 2, 400, "InputError", "answers.1"),
        ([{"call_id": "CALL", "input": {"approved": True}}, {"call_id": "c-x"}], 409, "UnknownCallId", None),
    ],
)
def test_tools_errors_are_served_as_declared_and_name_answers(
    client: Client,
    answers: list[dict[str, Any]],
    status: int,
    error: str,
    field: str | None,
) -> None:
    """``/tools`` errors are the class raised, at its declared status, named in this body (``answers.N``):
    the library's ``tools.N`` does not leak."""
    call, version, _ = waiting_session(client)
    body = {"answers": [{**a, "call_id": call["call_id"]} if a["call_id"] == "CALL" else a for a in answers]}
    got, refused = client.call("tools", session_id="s-1", body=body)
    assert (got, refused["error"]) == (status, error), refused
    assert refused["field"] == (field or "answers.1.call_id"), refused
    assert "tools." not in refused["message"] + refused["field"], refused
    assert client.call("get_session", session_id="s-1")[1]["version"] == version


# -- the ledger rules, one by one --------------------------------------------------------------------


class Patient(BaseModel):
    name: str | None = None


def rules() -> LedgerRules:
    return LedgerRules(adk(name="rules", schema={"user": Patient}).schema, session_id="s")


def opened(*more: Event) -> list[Event]:
    """A running invocation that made calls a (plain) and b (to be yielded), then whatever ``more`` adds."""
    return [
        UserEvent(text="hi"),
        InvocationStartEvent(invocation_id="i", agent_name="a"),
        ToolCallEvent(call_id="a", name="plain"),
        ToolCallEvent(call_id="b", name="ask"),
        *more,
    ]


YIELDED = (
    ToolResultEvent(call_id="a", name="plain"),
    InvocationYieldEvent(invocation_id="i", pending=[PendingCall(call_id="b", name="ask")]),
)
ANSWERED = (*YIELDED, ToolInputEvent(call_id="b", name="ask", input={"ok": True}))


@pytest.mark.parametrize(
    ("events", "error", "field"),
    [
        ([*opened(*YIELDED), UserEvent(text="x")], AwaitingInput, "events.6"),  # a message while b waits
        ([*opened(*ANSWERED), UserEvent(text="x")], EventOutOfOrder, "events.7"),  # b answered, no result yet
        (opened(UserEvent(text="x")), EventOutOfOrder, "events.4"),  # calls made, no results
        ([*opened(*YIELDED), ToolResultEvent(call_id="b", name="ask")], EventOutOfOrder, "events.6.call_id"),
        (opened(ToolResultEvent(call_id="zz", name="plain")), EventOutOfOrder, "events.4.call_id"),  # never made
        (
            opened(ToolResultEvent(call_id="a", name="p"), ToolResultEvent(call_id="a", name="p")),
            EventOutOfOrder,
            "events.5.call_id",
        ),
        ([*opened(*ANSWERED), ToolResultEvent(call_id="b", name="ask")], EventOutOfOrder, "events.7"),  # paused
        ([*opened(*YIELDED), ToolInputEvent(call_id="zz", name="ask")], UnknownCallId, "events.6.call_id"),
        ([*opened(*ANSWERED), ToolInputEvent(call_id="b", name="ask")], UnknownCallId, "events.7.call_id"),
        ([ToolCallEvent(call_id="a", name="plain")], EventOutOfOrder, "events.0"),  # no invocation open
        ([*opened(*YIELDED), ToolCallEvent(call_id="c", name="plain")], EventOutOfOrder, "events.6"),  # paused
        ([InvocationStartEvent(invocation_id="i", agent_name="a")] * 2, EventOutOfOrder, "events.1"),
        (
            [
                InvocationStartEvent(invocation_id="i", agent_name="a"),
                InvocationEndEvent(invocation_id="i", status="completed"),
                InvocationStartEvent(invocation_id="i", agent_name="a"),
            ],
            EventOutOfOrder,
            "events.2.invocation_id",
        ),
        (opened(InvocationYieldEvent(invocation_id="other", pending=[])), EventOutOfOrder, "events.4.invocation_id"),
        (opened(InvocationResumeEvent(invocation_id="other")), EventOutOfOrder, "events.4.invocation_id"),
        (
            opened(InvocationEndEvent(invocation_id="other", status="completed")),
            EventOutOfOrder,
            "events.4.invocation_id",
        ),
        (
            opened(InvocationYieldEvent(invocation_id="i", pending=[PendingCall(call_id="zz", name="ask")])),
            EventOutOfOrder,
            "events.4.pending.0.call_id",
        ),
    ],
)
def test_each_ledger_rule_refuses_its_event(events: list[Event], error: type[InputError], field: str) -> None:
    with pytest.raises(error) as caught:
        rules().check_all(events)
    assert caught.value.field == field


def test_a_ledger_a_run_writes_passes_the_rules_and_from_events_refuses_a_forged_one() -> None:
    whole = [
        *opened(*ANSWERED),
        InvocationResumeEvent(invocation_id="i"),
        ToolResultEvent(call_id="b", name="ask", result={"ok": True}),
        ModelStartEvent(invocation_id="i", model={"provider": "p", "name": "m"}, input=[], message_count=0, digest=""),
        AssistantEvent(text="done"),
        InvocationEndEvent(invocation_id="i", status="completed"),
        UserEvent(text="again"),
    ]
    rules().check_all(whole)
    app = adk(name="rules", schema={"user": Patient})
    assert len(app.sessions.from_events(whole).events) == len(whole)
    forged = [*opened(*YIELDED), ToolResultEvent(call_id="b", name="ask")]
    with pytest.raises(EventOutOfOrder) as caught:
        app.sessions.from_events(forged)
    assert caught.value.field == "events.6.call_id"
    poisoned = [
        *whole[:1],
        {"type": "state_change", "scope": "user", "source": "direct", "changes": [{"key": "name", "new_value": 5}]},
    ]
    with pytest.raises(InputError) as refused:
        app.sessions.from_events(poisoned)
    assert refused.value.field == "events.1.changes.0.new_value"


def test_an_answer_or_a_yield_under_another_tools_name_is_refused(client: Client) -> None:
    """An answer is judged by its call's tool, not by the name it carries (``x`` would have skipped the
    check); a yield waits only for calls of a tool that yields (else nothing could ever answer it)."""
    call, version, invocation = waiting_session(client)
    answer = {"type": "tool_input", "call_id": call["call_id"], "name": "x", "input": "anything"}
    got, refused = client.call("commit", session_id="s-1", body={"expected_version": version, "events": [answer]})
    assert (got, refused["error"], refused["field"]) == (409, "EventOutOfOrder", "events.0.name"), refused
    answered = {**answer, "name": "request_approval", "input": {"approved": True}}
    turn = [
        answered,
        {"type": "invocation_resume", "invocation_id": invocation},
        {"type": "tool_result", "call_id": call["call_id"], "name": "request_approval", "result": {"approved": True}},
        {"type": "tool_call", "call_id": "c-f", "name": "find_slots", "args": {}},
        {
            "type": "invocation_yield",
            "invocation_id": invocation,
            "pending": [{"call_id": "c-f", "name": "find_slots"}],
        },
    ]
    got, refused = client.call("commit", session_id="s-1", body={"expected_version": version, "events": turn})
    assert (got, refused["error"], refused["field"]) == (409, "EventOutOfOrder", "events.4.pending.0.name"), refused
    assert client.call("get_session", session_id="s-1")[1]["version"] == version


# -- a property: whatever a remote commit accepts, the session runs on and shared state validates ------------


class Profile(BaseModel):
    name: str | None = None
    age: int | None = None


class Notes(BaseModel):
    topic: str | None = None


class Question(BaseModel):
    q: str = "?"


class Reply(BaseModel):
    ok: bool


class Model:
    """Calls a tool after a user message (``look``, or ``ask``, which yields), and answers after a result."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if request.messages and request.messages[-1].role == "tool":
            return ModelResponse(text="done", finish_reason="stop")
        name = "ask" if self.calls % 2 else "look"
        call = {"name": name, "args": {"q": "?"}, "call_id": f"m{self.calls}"}
        return ModelResponse.model_validate({"tool_calls": [call], "finish_reason": "tool_calls"})


def prop_app() -> tuple[Served, Any]:
    app = adk(
        name="prop", schema={"session": Notes, "user": Profile}, store=in_memory_store(), adapters={"openai": Model()}
    )
    ask = app.tool(name="ask", schema=Question, yield_schema=Reply, execute=None)
    look = app.tool(name="look", schema=Question, execute=lambda ctx: {"seen": True})
    agent = app.agent(
        name="a", model={"provider": "openai", "name": "m"}, context=[app.context.history()], tools=[ask, look]
    )
    return Served(app, {agent.name: agent}), agent


GOOD_VALUES = {"name": st.text(max_size=5), "age": st.integers(0, 120)}
BAD_VALUES = st.sampled_from([5, "notadict", {"x": 1}, [1], "\x00"])


@st.composite
def state_write(draw: st.DrawFn) -> tuple[str, Any]:
    """A (key, value) a shared scope may or may not take (mostly may)."""
    if draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(GOOD_VALUES)))
        return key, draw(GOOD_VALUES[key] | st.none())
    return draw(st.sampled_from(["name", "age", "", "nope", "k\x00"])), draw(BAD_VALUES | st.integers())


@st.composite
def remote_events(draw: st.DrawFn, session: Any) -> list[dict[str, Any]]:
    """Events a remote runner might send: each aimed at what the ledger holds by then (its open invocation,
    the calls that wait or have no result), valid or not; the first the rules refuse ends the list, so most
    commits are a run's way on and some go wrong once, anywhere."""
    from dormant.events import parse_event

    rules = session.rules()
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 6)) * 3):
        open_inv = rules.open_invocation
        calls = sorted({*rules.waiting, *rules.open_calls}) or ["c-none"]
        call_id = draw(st.sampled_from([*calls, *calls, "c-forged"]))
        invocation = draw(st.sampled_from([open_inv or "inv-x", open_inv or "inv-y", "inv-z"]))
        kind = draw(
            st.sampled_from(
                ["user", "answer", "result", "call", "start", "yield", "resume", "end", "state", "session_state"]
            )
        )
        if kind == "user":
            event: dict[str, Any] = {"type": "user", "text": "hi"}
        elif kind == "answer":
            value = draw(st.sampled_from([{"ok": True}, {"ok": False}, {"ok": True}, {"ok": "perhaps"}, "yes"]))
            name = rules.waiting.get(call_id) or draw(st.sampled_from(["ask", "look"]))
            event = {"type": "tool_input", "call_id": call_id, "name": name, "input": value}
        elif kind == "result":
            name = rules.open_calls.get(call_id, "ask")
            event = {"type": "tool_result", "call_id": call_id, "name": name, "result": {"seen": True}}
        elif kind == "call":
            name = draw(st.sampled_from(["ask", "look", "ask"]))
            event = {"type": "tool_call", "call_id": f"r{len(events)}-{draw(st.integers(0, 3))}", "name": name}
            event["args"] = {"q": "?"}
        elif kind == "start":
            event = {"type": "invocation_start", "invocation_id": f"inv-{draw(st.integers(0, 3))}", "agent_name": "a"}
        elif kind == "yield":
            asks = [c for c, name in rules.open_calls.items() if name == "ask"] or [call_id]
            pending = [{"call_id": c, "name": "ask"} for c in draw(st.lists(st.sampled_from(asks), max_size=2))]
            event = {"type": "invocation_yield", "invocation_id": invocation, "pending": pending}
        elif kind == "resume":
            event = {"type": "invocation_resume", "invocation_id": invocation}
        elif kind == "end":
            event = {"type": "invocation_end", "invocation_id": invocation, "status": "completed"}
        else:
            key, value = draw(state_write())
            if kind == "session_state":
                key = draw(st.sampled_from(["topic", key]))
                event = {"type": "state_change", "scope": "session", "source": "direct"}
            else:
                scope_id = draw(st.sampled_from([USER, USER, "other"]))
                event = {"type": "state_change", "scope": "user", "scope_id": scope_id, "source": "direct"}
            event["changes"] = [{"key": key, "new_value": value}]
        try:
            rules.check(parse_event(event), len(events))
        except InputError:
            if draw(st.integers(0, 3)):
                continue  # mostly, try another: most commits are a run's way on
            events.append(event)
            break  # the server refuses the commit here: nothing after it matters
        events.append(event)
    return events


ACCEPTED: list[Any] = []


def profile_validates(stored: dict[str, Any]) -> None:
    assert set(stored) <= set(Profile.model_fields), stored
    Profile.model_validate(stored)


def run_on(app: Any, agent: Any, session: Any) -> Any:
    """A run on the session: the answers to what waits, else a message. A yielding call a remote commit left
    without its yield waits too: a message is refused for it (``AwaitingInput``, naming it), and a run without
    input records the yield first."""
    pending = session.projection.pending
    run_input = {"answers": [{"call_id": c, "input": {"ok": True}} for c in pending]} if pending else "hello"
    try:
        return app.run(agent, run_input, session=session)
    except AwaitingInput as waiting:
        assert not pending and waiting.call_ids, waiting
        result = app.run(agent, None, session=session)
        assert result.status == "yielded_tool" and {y.call_id for y in result.yielded_tools} >= set(waiting.call_ids)
        return result


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_whatever_a_remote_commit_accepts_the_session_runs_on_and_shared_state_validates(data: st.DataObject) -> None:
    own, agent = prop_app()
    api = Client(api_handler(in_process_hooks(own), own))
    app = own.for_tenant(TENANT_A)
    got, _ = api.call("create_session", body={"session_id": "s-1", "scopes": {"user": USER}})
    assert got == 201
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        session = app.sessions.require("s-1")
        if data.draw(st.booleans(), label="remote commit"):
            events = data.draw(remote_events(session), label="events")
            writes = data.draw(st.lists(state_write(), max_size=1), label="scoped writes")
            scoped_changes = [{"scope": "user", "scope_id": USER, "key": k, "value": v} for k, v in writes]
            body = {"expected_version": session.version, "events": events, "scoped_changes": scoped_changes}
            before = app.store.load_scoped_state(app.name, "user", USER)
            got, answered = api.call("commit", session_id="s-1", body=body)
            ACCEPTED.append((got, [e["type"] for e in events], answered))  # for a look at the mix
            assert got == 200 or 400 <= got < 500, answered  # never a server error
            if got != 200:
                assert app.sessions.require("s-1").version == session.version, answered
                assert app.store.load_scoped_state(app.name, "user", USER) == before
        else:
            result = run_on(app, agent, session)
            assert result.status in ("completed", "yielded_tool", "max_steps"), (result.status, result.error)
            app.sessions.commit(session)
        profile_validates(app.store.load_scoped_state(app.name, "user", USER))
    # and whatever was accepted, a run on the session works (answering what waits first)
    session = app.sessions.require("s-1")
    result = run_on(app, agent, session)
    assert result.status in ("completed", "yielded_tool", "max_steps"), (result.status, result.error)
    app.sessions.commit(session)
    Profile.model_validate(session.state.user.to_dict())
    Notes.model_validate(session.state.to_dict())


# -- a fork taken inside an open invocation can move on --------------------------------------------------


def test_a_fork_cut_inside_a_running_invocation_is_resumable_and_a_run_continues_it() -> None:
    """The issue's finding: such a fork stayed ``running`` for ever (no runner goes on with a copy), so a
    message got 409 ``ClaimLost``. Now it is paused where it was cut; the call it cut off runs, once."""
    from dormant.testing import MockAdapter

    scripted = MockAdapter(
        [{"tool_calls": [{"name": "look", "args": {"q": "?"}, "call_id": "k1"}]}, {"text": "seen"}, {"text": "again"}]
    )
    app = adk(name="forks", adapters={"openai": scripted})
    look = app.tool(name="look", schema=Question, execute=lambda ctx: {"seen": True})
    agent = app.agent(
        name="a", model={"provider": "openai", "name": "m"}, context=[app.context.history()], tools=[look]
    )
    session = app.sessions.create()
    assert app.run(agent, "hi", session=session).status == "completed"
    app.sessions.commit(session)
    at = next(n for n, e in enumerate(session.events) if e.type == "tool_call")
    fork = session.fork_at(at)
    assert fork.status == "resumable" and fork.events[-1].type == "session_forked"
    app.sessions.commit(fork)
    fork = app.sessions.require(fork.id)
    run = app.run(agent, "go on", session=fork)
    assert run.status == "completed", run.error
    app.sessions.commit(fork)
    results = [e for e in fork.events if e.type == "tool_result" and e.call_id == "k1"]
    assert len(results) == 1 and results[0].result == {"seen": True}
    assert [e.text for e in fork.events if e.type == "user"] == ["hi", "go on"]


def test_a_fork_cut_inside_a_turn_is_continued_over_http(client: Client) -> None:
    create(client, "s-1")
    got, ran = client.call("run", session_id="s-1", headers={"Prefer": "wait=25"})
    assert got == 200 and ran["status"] == "yielded_tool", ran
    ledger = client.call("session_events", session_id="s-1")[1]["events"]
    at = next(n for n, e in enumerate(ledger) if e["type"] == "tool_call")  # inside the turn, before its yield
    got, forked = client.call("fork_session", session_id="s-1", body={"at": at, "reason": "try again"})
    assert got == 201 and forked["status"] == "resumable", forked
    got, went_on = client.call("run", session_id=forked["id"], headers={"Prefer": "wait=25"})
    assert got == 200 and went_on["status"] in ("yielded_tool", "completed"), went_on


def test_each_error_answers_the_http_status_of_its_class_inherited_unless_it_differs() -> None:
    """The status is the class's ``http_status``, so a route serves what it raises, as raised: a class declares one
    only where it answers differently from what it inherits (statuses written once; ``test_errors`` holds each
    class to the status it answered before)."""
    from dormant import errors

    for kind, status in errors.HTTP_STATUS.items():
        inherited = next((vars(base)["http_status"] for base in kind.__mro__[1:] if "http_status" in vars(base)), None)
        assert vars(kind).get("http_status", inherited) == status, kind
        assert "http_status" not in vars(kind) or status != inherited, f"{kind.__name__} restates {status}"
        assert errors.http_status(kind.__new__(kind)) == status
    assert errors.http_status(ValueError("not ours")) == 500


def test_a_merge_whose_events_cannot_follow_what_landed_forks_instead_of_failing() -> None:
    """A rebase that merge_conflicts allows may still put a message after a call that now waits: the ledger
    rules refuse the append, and the write parks the run as a fork, as for any other conflict."""
    app = adk(name="merging")
    app.sessions.create("m-1")
    stale = app.sessions.require("m-1")
    other = app.sessions.require("m-1")
    for event in opened(*YIELDED)[1:]:
        other.append(event)
    app.sessions.commit(other)

    result = app.sessions.write(session=stale, change=lambda s: s.append(UserEvent(text="hi")), on_conflict="merge")
    assert result.status == "forked" and "cannot follow" in result.conflicts[0], result
    assert app.sessions.require("m-1").status == "awaiting_input"  # the stored session as the other left it
