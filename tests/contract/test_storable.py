"""One rule for what every store can keep: no NaN or ±Infinity, no NUL, no lone surrogate.

Input holding one is refused at once with ``ValueNotStorable`` naming the field, and nothing is written;
text a model or a tool produced is repaired (U+FFFD) so a run never fails at commit; the stores'
encoders refuse the same values as a last line of defence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from dormant import adk, in_memory_store, openai
from dormant.errors import ValueNotStorable
from dormant.events import AssistantEvent, ToolCallEvent, ToolResultEvent, UserEvent
from dormant.state.values import check_storable, repaired, unstorable
from dormant.stores.base import ScopedStateChange, StoredSession
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter

BAD_NUMBERS = [float("nan"), float("inf"), float("-inf")]
BAD_TEXT = ["a\x00b", "a\ud800b", "\udfff"]


class Scores(BaseModel):
    score: float = 0.0
    scores: list[float] = []
    note: str = ""


class OpenOrg(BaseModel):
    model_config = ConfigDict(extra="allow")


class Answer(BaseModel):
    ok: bool
    why: str = ""


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    store = in_memory_store() if request.param == "memory" else sqlite_store(tmp_path / "s.db")
    yield store
    store.close()


def make_app(store: Any = None, responses: list[dict[str, Any]] | None = None) -> tuple[Any, Any, MockAdapter]:
    scripted = MockAdapter(responses or [])
    schema = {"session": Scores, "user": Scores, "temp": Scores, "org": OpenOrg}
    app = adk(name="storable", schema=schema, store=store or in_memory_store(), adapters={"openai": scripted})
    seen: dict[str, Any] = {}

    def write_temp(ctx: Any) -> str:
        try:
            ctx.state.temp.score = float(ctx.args.value)
        except ValueNotStorable as exc:
            seen["temp"] = exc
            return "refused"
        return "written"

    class Value(BaseModel):
        value: str

    tools = [
        app.tool(name="write_temp", description="", schema=Value, execute=write_temp),
        app.tool(name="ask", description="", execute=None, yield_schema=Answer),
        app.tool(name="echo", description="", execute=lambda ctx: ctx.session.state.get("note")),
        app.tool(name="nan", description="", execute=lambda ctx: {"x": [1.0, float("nan")]}),
        app.tool(name="nul", description="", execute=lambda ctx: {"te\x00xt": "a\ud800\x00b"}),
    ]
    agent = app.agent(name="agent", model=openai("m"), context=[app.context.history()], tools=tools)
    app.seen = seen  # type: ignore[attr-defined]
    return app, agent, scripted


# -- input is refused, naming the field, with nothing written -------------------------------------------


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("scope", "key", "plant", "field"),
    [
        ("session", "score", lambda bad: bad, "state.session.score"),
        ("session", "scores", lambda bad: [1.0, bad], "state.session.scores.1"),
        ("user", "score", lambda bad: bad, "state.user.score"),
        ("org", "x", lambda bad: {"y": [bad]}, "state.org.x.y.0"),
    ],
)
def test_non_finite_numbers_are_refused_at_write_time_in_every_scope(
    store: Any, bad: float, scope: str, key: str, plant: Any, field: str
) -> None:
    app, _, _ = make_app(store)
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    view = session.state if scope == "session" else getattr(session.state, scope)
    with pytest.raises(ValueNotStorable) as caught:
        setattr(view, key, plant(bad))
    assert caught.value.field == field
    assert session.events == [] and session.scoped_changes() == []
    app.sessions.commit(session)
    assert app.store.load_scoped_state("storable", "user", "u-1") == {}
    assert app.sessions.get("s-1").state.to_dict() == {}


def test_non_finite_numbers_are_refused_in_temp_too() -> None:
    app, agent, _ = make_app(
        responses=[{"tool_calls": [{"name": "write_temp", "args": {"value": "nan"}}]}, {"text": "done"}]
    )
    run = app.run(agent, "go")
    assert run.status == "completed"
    assert app.seen["temp"].field == "state.temp.score"  # type: ignore[attr-defined]
    [result] = [e for e in run.events if isinstance(e, ToolResultEvent)]
    assert result.result == "refused"


@pytest.mark.parametrize("bad", BAD_TEXT, ids=["nul", "surrogate", "lone-low"])
def test_text_no_store_can_keep_is_refused_at_input(store: Any, bad: str) -> None:
    app, agent, _ = make_app(store, [{"tool_calls": [{"name": "ask", "args": {}}]}])
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    assert app.run(agent, "hello", session=session).status == "yielded_tool"
    app.sessions.commit(session)
    before = list(session.events)
    [waiting] = session.yielded_tools

    cases: list[tuple[str, Any]] = [
        ("message", lambda: app.run(agent, bad, session=session)),
        ("message", lambda: app.run(agent, {"message": bad}, session=session)),
        ("message", lambda: session.input.message(bad)),
        ("state.session.note", lambda: app.run(agent, {"state": {"note": bad}}, session=session)),
        ("state.session.note", lambda: setattr(session.state, "note", bad)),
        ("state.org.k", lambda: setattr(session.state.org, "k", {"list": [bad]})),
        (
            "initial_state.user.note",
            lambda: app.run(agent, {"initial_state": {"user": {"note": bad}}}, session=session),
        ),
        ("state.org.", lambda: session.state.org.update({f"k{bad}": 1})),
        ("answers.0.input", lambda: session.input.answer(waiting.call_id, {"ok": True, "why": bad})),
    ]
    for field, attempt in cases:
        with pytest.raises(ValueNotStorable) as caught:
            attempt()
            pytest.fail(f"not refused: {field}")
        assert caught.value.field is not None and caught.value.field.startswith(field), (field, caught.value.field)
    assert session.events == before and session.uncommitted_events == []
    assert app.store.load("storable", "s-1").events == before


def test_from_events_refuses_unstorable_text_naming_the_event() -> None:
    app, _, _ = make_app()
    good = UserEvent(text="fine").model_dump(mode="json")
    bad = UserEvent(text="x").model_dump(mode="json") | {"text": "nul \x00 here"}
    with pytest.raises(ValueNotStorable) as caught:
        app.sessions.from_events([good, bad])
    assert caught.value.field == "events.1.text"


def test_events_cannot_hold_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        AssistantEvent(value={"x": float("nan")})


# -- output is repaired or recorded as an error: a run never fails at commit ----------------------------


def test_model_text_with_nul_and_lone_surrogates_is_repaired_and_commits(tmp_path: Path) -> None:
    app, agent, _ = make_app(sqlite_store(tmp_path / "s.db"), [{"text": "hi\x00there \ud83d!"}])
    session = app.sessions.create("s-1")
    run = app.run(agent, "go", session=session)
    assert run.status == "completed"
    assert run.output.text == "hi\ufffdthere \ufffd!"
    app.sessions.commit(session)
    assert app.sessions.get("s-1").output.text == "hi\ufffdthere \ufffd!"


def test_tool_output_that_cannot_be_stored_is_repaired_or_an_error(tmp_path: Path) -> None:
    responses = [
        {"tool_calls": [{"name": "nan", "args": {}}, {"name": "nul", "args": {}}]},
        {"tool_calls": [{"name": "write_temp", "args": {"value": float("inf")}}]},
        {"text": "done"},
    ]
    app, agent, _ = make_app(sqlite_store(tmp_path / "s.db"), responses)
    session = app.sessions.create("s-1")
    run = app.run(agent, "go", session=session)
    assert run.status == "completed"
    results = {e.name: e for e in run.events if isinstance(e, ToolResultEvent)}
    assert results["nan"].result is None
    assert results["nan"].error == "nan returned a value that cannot be stored: NaN at result.x.1"
    assert results["nul"].result == {"te\ufffdxt": "a\ufffd\ufffdb"} and results["nul"].error is None
    [inf_call] = [e for e in run.events if isinstance(e, ToolCallEvent) and e.name == "write_temp"]
    assert inf_call.args == {} and inf_call.error == "the arguments hold Infinity at args.value, which cannot be stored"
    assert "Infinity" in (results["write_temp"].error or "")
    app.sessions.commit(session)
    assert app.sessions.get("s-1").events == session.events


def test_structured_output_with_nan_ends_the_run_with_an_error() -> None:
    scripted = MockAdapter([{"text": '{"score": NaN}'}])
    app = adk(name="out", adapters={"openai": scripted})
    agent = app.agent(name="a", model=openai("m"), output=Scores)
    run = app.run(agent, "go")
    assert run.status == "error"
    assert run.error is not None and "NaN" in run.error


# -- the stores refuse the same values, as a last line of defence -------------------------------------


@pytest.mark.parametrize("bad", BAD_TEXT, ids=["nul", "surrogate", "lone-low"])
def test_every_store_refuses_unstorable_text_in_events(store: Any, bad: str) -> None:
    row = StoredSession(id="s-1", app_name="app", created_at=1)
    with pytest.raises(ValueNotStorable) as caught:
        store.commit(row, [UserEvent(text="ok"), UserEvent(text=bad)], 0)
    assert caught.value.field == "event.text"
    assert store.load("app", "s-1") is None


@pytest.mark.parametrize("bad", [*BAD_TEXT, *BAD_NUMBERS])
def test_every_store_refuses_unstorable_scoped_values(store: Any, bad: Any) -> None:
    row = StoredSession(id="s-1", app_name="app", created_at=1)
    with pytest.raises(ValueNotStorable):
        store.commit(row, [UserEvent(text="ok")], 0, [ScopedStateChange("user", "u-1", "k", {"v": [bad]})])
    assert store.load("app", "s-1") is None and store.load_scoped_state("app", "user", "u-1") == {}


def test_event_to_json_keeps_text_that_only_spells_a_nul_escape() -> None:
    store = in_memory_store()
    event = UserEvent(text="a literal \\u0000, not a NUL")
    assert store.decode_event(store.encode_event(event)) == event


# -- the rule itself --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_a_value_is_storable_exactly_when_it_survives_every_encoding(value: Any) -> None:
    problem = unstorable(value)
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        assert problem is not None
        return
    if problem is None:
        assert b"\\u0000" not in text and json.loads(text) == value
        check_storable(value, "v")
    else:
        assert "NUL" in problem[1] and "\\u0000" in text.decode()
        with pytest.raises(ValueNotStorable):
            check_storable(value, "v")
    assert unstorable(repaired(value)) is None or any(isinstance(x, float) for x in _leaves(value))


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def test_the_rule_names_where_and_what() -> None:
    assert unstorable({"a": [1, {"b": math.inf}]}) == (".a.1.b", "Infinity")
    assert unstorable({"a\x00": 1}) == (".a\ufffd", "a NUL character in the key")
    assert unstorable(["ok", "x\ud800"]) == (".1", "a lone surrogate")
    assert unstorable({"fine": ["text", 1.5, None, True]}) is None


@pytest.mark.backend("postgres")
@pytest.mark.parametrize("bad", BAD_TEXT, ids=["nul", "surrogate", "lone-low"])
def test_postgres_refuses_the_same_text_with_the_same_error(postgres_url: str, bad: str) -> None:
    pytest.importorskip("psycopg")
    from dormant.stores.postgres import postgres_store

    store = postgres_store(postgres_url)
    try:
        row = StoredSession(id=f"s-{abs(hash(bad))}", app_name="storable-pg", created_at=1)
        with pytest.raises(ValueNotStorable) as caught:
            store.commit(row, [UserEvent(text=bad)], 0)
        assert caught.value.field == "event.text"
        with pytest.raises(ValueNotStorable):
            store.commit(row, [UserEvent(text="ok")], 0, [ScopedStateChange("user", "u-1", "k", bad)])
        assert store.load("storable-pg", row.id) is None
    finally:
        store.close()
