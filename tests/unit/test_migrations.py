"""Scope-model migrations: a session written under an old model loads, runs and commits under the new one.

The ledger keeps what was written; derived state, ``state_at`` and shared scopes read in the new shape;
a value no migration brings to the model is a ``StateMigrationError`` at load, naming scope, key, version.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from dormant import adk, openai
from dormant.errors import SchemaError, StateMigrationError
from dormant.events import StateChangeEvent
from dormant.state.migrations import ConvertKey, RenameKey, SplitKey, apply_step
from dormant.state.schema import Schema
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter


class Approval(BaseModel):
    approved: bool


class OldSession(BaseModel):
    fullname: str = ""
    age: str = "0"


class OldUser(BaseModel):
    nickname: str = "friend"


class NewSession(BaseModel):
    first: str = ""
    last: str = ""
    age: int = 0
    booked: bool = False


class NewUser(BaseModel):
    display: str = "friend"
    visits: int = 0


def split_name(value: str) -> dict[str, str]:
    first, _, last = value.partition(" ")
    return {"first": first, "last": last}


MIGRATIONS: dict[str, Any] = {
    "session": [RenameKey("fullname", "name"), ConvertKey("age", int), SplitKey("name", ("first", "last"), split_name)],
    "user": [RenameKey("nickname", "display")],
}


def booking_app(store: Any, *, new: bool, migrations: Any = MIGRATIONS) -> tuple[Any, MockAdapter, Any]:
    """The same app in two releases: old models without migrations, new models with them."""
    scripted = MockAdapter()
    schema = {"session": NewSession, "user": NewUser} if new else {"session": OldSession, "user": OldUser}
    app = adk(
        name="clinic",
        schema=schema,
        store=store,
        adapters={"openai": scripted},
        migrations=migrations if new else None,
    )

    def book(ctx: Any) -> str:
        if new:
            ctx.state.booked = True
            ctx.state.user.visits = ctx.state.user.visits + 1
        return "booked"

    tool = app.tool(name="book", description="Book once approved.", execute=book, yield_schema=Approval)
    agent = app.agent(name="booker", model=openai("m"), context=[app.context.history()], tools=[tool])
    return app, scripted, agent


def old_session(store: Any, fullname: str = "Ada Lovelace", age: str = "36") -> str:
    """A session the old release wrote and left waiting for a human; its user's nickname stored."""
    app, scripted, agent = booking_app(store, new=False)
    scripted.set_responses([{"tool_calls": [{"name": "book", "args": {}, "call_id": "c1"}]}])
    run = app.run(
        agent,
        {"message": "book me", "initial_state": {"session": {"fullname": fullname, "age": age}}},
        session=app.sessions.create(scopes={"user": "u-ada"}),
    )
    run.session.state.user.nickname = "Countess"
    app.sessions.commit(run.session)
    assert run.session.status == "awaiting_input"
    return str(run.session.id)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = sqlite_store(tmp_path / "clinic.db")
    yield s
    s.close()


def test_an_old_session_loads_runs_and_commits_under_the_new_model(store: Any) -> None:
    session_id = old_session(store)
    app, scripted, agent = booking_app(store, new=True)
    session = app.sessions.require(session_id)
    assert (session.state.first, session.state.last, session.state.age) == ("Ada", "Lovelace", 36)
    assert session.state.user.display == "Countess"

    session.input.answer("c1", {"approved": True})
    scripted.set_responses([{"text": "done"}])
    done = app.run(agent, session=session)
    assert done.status == "completed"
    app.sessions.commit(done.session)

    again = app.sessions.require(session_id)
    assert dict(again.state) == {"first": "Ada", "last": "Lovelace", "age": 36, "booked": True}
    assert (again.state.user.display, again.state.user.visits) == ("Countess", 1)
    # The ledger keeps what the old release wrote; what the new one wrote carries its version.
    changes = [e for e in again.events if isinstance(e, StateChangeEvent) and e.scope == "session"]
    assert {c.key for e in changes if e.schema_version == 0 for c in e.changes} == {"fullname", "age"}
    assert [c.new_value for e in changes if e.schema_version == 0 for c in e.changes] == ["Ada Lovelace", "36"]
    assert [(c.key, e.schema_version) for e in changes if e.schema_version for c in e.changes] == [("booked", 3)]
    # Time travel sees the migrated shape too.
    first_write = next(i for i, e in enumerate(again.events) if isinstance(e, StateChangeEvent))
    assert again.state_at(first_write + 1).session_state == {"first": "Ada", "last": "Lovelace", "age": 36}


def test_shared_scope_values_are_upcast_when_read_and_tagged_when_written(store: Any) -> None:
    store.save_scoped_state("clinic", "user", "u-old", {"nickname": "Bea"})  # written before migrations
    app, _, _ = booking_app(store, new=True)
    session = app.sessions.create(scopes={"user": "u-old"})
    run_state = session.invocation("i-1", "booker").state
    assert run_state.user.display == "Bea"
    run_state.user.visits = 2
    app.sessions.commit(session)
    raw = store.load_scoped_state("clinic", "user", "u-old")
    assert raw["nickname"] == "Bea"  # never rewritten: its old form stays, read in the new shape
    assert raw["visits"] == {"__schema_version__": 1, "__value__": 2}
    fresh = app.sessions.create(scopes={"user": "u-old"}).invocation("i-2", "booker").state
    assert (fresh.user.display, fresh.user.visits) == ("Bea", 2)


def test_a_newer_stored_key_wins_over_an_older_one_renamed_to_it(store: Any) -> None:
    store.save_scoped_state(
        "clinic", "user", "u-2", {"display": {"__schema_version__": 1, "__value__": "new"}, "nickname": "old"}
    )
    app, _, _ = booking_app(store, new=True)
    state = app.sessions.create(scopes={"user": "u-2"}).invocation("i", "booker").state
    assert state.user.display == "new"


def test_a_value_no_migration_can_convert_is_a_typed_error_at_load(store: Any) -> None:
    session_id = old_session(store, age="thirty-six")
    app, _, _ = booking_app(store, new=True)
    with pytest.raises(StateMigrationError) as caught:
        app.sessions.require(session_id)
    assert (caught.value.scope, caught.value.key, caught.value.version, caught.value.current) == (
        "session",
        "age",
        0,
        3,
    )
    assert "age" in str(caught.value) and "version 0" in str(caught.value)


def test_a_migration_that_lands_on_an_undeclared_key_or_a_refused_type_is_a_typed_error(store: Any) -> None:
    session_id = old_session(store)
    missing_split = {"session": [RenameKey("fullname", "name"), ConvertKey("age", int)], "user": []}
    app, _, _ = booking_app(store, new=True, migrations=missing_split)
    with pytest.raises(StateMigrationError) as caught:
        app.sessions.require(session_id)
    assert (caught.value.scope, caught.value.key) == ("session", "fullname")
    assert "'name'" in str(caught.value)

    store.save_scoped_state("clinic", "user", "u-bad", {"visits": {"__schema_version__": 0, "__value__": "many"}})
    app, _, _ = booking_app(store, new=True)
    with pytest.raises(StateMigrationError) as shared:
        app.sessions.create(scopes={"user": "u-bad"}).invocation("i", "booker").state.user.visits
    assert (shared.value.scope, shared.value.key, shared.value.version) == ("user", "visits", 0)


def test_migrations_are_checked_when_the_app_is_built() -> None:
    with pytest.raises(SchemaError, match="unknown scope"):
        adk(name="x", migrations={"nope": []})
    with pytest.raises(SchemaError, match="does not declare"):
        adk(name="x", schema={"session": NewSession}, migrations={"user": []})
    with pytest.raises(SchemaError, match="RenameKey, ConvertKey or SplitKey"):
        adk(name="x", schema={"session": NewSession}, migrations={"session": [("a", "b")]})
    with pytest.raises(SchemaError, match="list of steps"):
        adk(name="x", schema={"session": NewSession}, migrations={"session": RenameKey("a", "b")})


def test_a_deleted_key_upcasts_to_deletions_of_what_it_became() -> None:
    schema = Schema({"session": NewSession}, {"session": MIGRATIONS["session"]})
    event = StateChangeEvent(scope="session", source="direct", changes=[{"key": "fullname", "new_value": None}])
    assert [(c.key, c.new_value) for c in schema.upcast(event).changes] == [("first", None), ("last", None)]
    assert schema.versions == {"session": 3}


def test_a_split_returning_a_key_it_did_not_declare_is_refused() -> None:
    step = SplitKey("name", ("first",), lambda v: {"first": v, "surname": v})
    schema = Schema(None, {"session": [step]})
    event = StateChangeEvent(scope="session", source="direct", changes=[{"key": "name", "new_value": "x"}])
    with pytest.raises(StateMigrationError, match="surname"):
        schema.upcast(event)
    assert apply_step(step, "other", 1) == {"other": 1}


@given(st.text(min_size=1).filter(lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)))
def test_a_rename_keeps_any_value_and_a_current_event_is_folded_as_written(text: str) -> None:
    schema = Schema({"user": NewUser}, {"user": [RenameKey("nickname", "display")]})
    old = StateChangeEvent(
        scope="user", scope_id="u", source="direct", changes=[{"key": "nickname", "new_value": text}]
    )
    assert [(c.key, c.new_value) for c in schema.upcast(old).changes] == [("display", text)]
    current = old.model_copy(update={"schema_version": 1})
    assert schema.upcast(current) is current


def test_the_upgrading_example_in_the_docs_runs() -> None:
    page = (Path(__file__).parents[2] / "docs" / "upgrading.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "SplitKey(" in b)
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/upgrading.md (upgrading)", "exec", dont_inherit=True), namespace)
    assert namespace["woken"].state.age == 36


def test_a_renamed_shared_key_once_deleted_stays_deleted(store: Any) -> None:
    """The old release stored ``nickname``; the new one reads it as ``display``. Deleting ``display`` must
    not let the stored ``nickname`` show through again to a later run reading the user's stored state."""
    old_session(store)  # stores the user's nickname "Countess" under the old model
    app, scripted, _ = booking_app(store, new=True)
    seen: list[Any] = []

    def look(ctx: Any) -> str:
        seen.append(ctx.state.user.to_dict().get("display"))
        return "looked"

    def forget(ctx: Any) -> str:
        del ctx.state.user.display
        return "forgotten"

    tools = [app.tool(name=name, execute=fn) for name, fn in (("look", look), ("forget", forget))]
    agent = app.agent(name="reader", model=openai("m"), tools=tools)

    def run(tool: str) -> None:
        scripted.set_responses([{"tool_calls": [{"name": tool, "args": {}}]}, {"text": "ok"}])
        done = app.run(agent, "go", session=app.sessions.create(scopes={"user": "u-ada"}))
        assert done.status == "completed", done.error
        app.sessions.commit(done.session)

    run("look")
    run("forget")
    run("look")
    assert seen == ["Countess", None]


class Counted(BaseModel):
    n: int = 0


def test_a_value_upcasts_from_the_step_after_the_last_it_went_through() -> None:
    """Each step runs once on a value: one written at version 1 went through the first step already (steps that
    are not idempotent tell: adding 1 twice, multiplying by 10 twice)."""
    steps = [ConvertKey("n", lambda v: v + 1), ConvertKey("n", lambda v: v * 10)]
    schema = Schema({"session": Counted}, {"session": steps})
    for version, expected in ((None, 60), (1, 50), (2, 5)):
        event = StateChangeEvent(scope="session", source="direct", changes=[{"key": "n", "new_value": 5}])
        if version is not None:
            event = event.model_copy(update={"schema_version": version})
        assert [(c.key, c.new_value) for c in schema.upcast(event).changes] == [("n", expected)], version
    assert schema["session"].upcast("n", 5, 1) == {"n": 50}
