"""app.sessions over the stores, shared scopes, direct writes, and the seed page "Stores", steps 1-2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, in_memory_store, openai
from dormant.errors import (
    InputError,
    InvalidSessionId,
    ScopeNotBound,
    SessionNotFound,
    StoreClosed,
    VersionConflict,
    http_status,
)
from dormant.events import StateChangeEvent, UserEvent
from dormant.stores.base import ScopedStateChange, StoredSession
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter, StoreContract
from tests.support.examples import triage


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    store = in_memory_store() if request.param == "memory" else sqlite_store(tmp_path / "s.db")
    yield store
    store.close()


# -- seed "Stores", step 1: the contract, exercised directly -----------------------------------


def test_step_1_the_ledger_example(store: Any) -> None:
    row = StoredSession(id="session_demo", app_name="bookings", version=0, scopes={}, created_at=1_700_000_000_000)

    def make_event(n: int) -> UserEvent:
        return UserEvent(id=f"evt-{n}", created_at=1_700_000_000_000 + n, text=f"message {n}")

    created = store.commit(row, [make_event(1), make_event(2)], 0)
    appended = store.commit(row, [make_event(2), make_event(3)], 1)  # event 2 is already stored
    reread = store.load("bookings", "session_demo")
    assert (created.ok, created.version, created.appended) == (True, 1, 2)
    assert (appended.ok, appended.version, appended.appended) == (True, 2, 1)
    assert [e.id for e in reread.events] == ["evt-1", "evt-2", "evt-3"] and reread.row.version == 2

    stale = store.commit(row, [make_event(4)], 1)  # a writer that loaded at version 1
    after_stale = store.load("bookings", "session_demo")
    assert (stale.ok, stale.version, stale.appended) == (False, 2, 0)
    assert len(after_stale.events) == 3

    store.save_scoped_state("bookings", "user", "u-1", {"theme": "dark", "locale": "en-GB"})
    store.save_scoped_state("bookings", "user", "u-1", {"theme": "light", "locale": None})
    assert store.load_scoped_state("bookings", "user", "u-1") == {"theme": "light"}


def test_the_0_1_names_of_a_sessions_row_still_answer_for_a_release_warning_at_the_caller(store: Any) -> None:
    """0.1 called a session's row ``LoadedSession.session`` (it is not a ``Session``), ``Session.stored()`` and the
    compliance suite's ``meta`` (``docs/concepts.md``: it is the row). Each still answers the same row for one release,
    with a ``DeprecationWarning`` naming ``row`` and pointing at the caller's line (so the default filter shows it
    once per call site)."""
    app = adk(name="rows", store=store)
    session = app.sessions.create("s-1", scopes={})
    session.input.message("hello")
    app.sessions.commit(session)
    loaded = store.load("rows", "s-1")
    assert loaded is not None and (loaded.row.id, loaded.row.version) == ("s-1", 2)
    renamed = r"LoadedSession\.session is deprecated: use LoadedSession\.row"
    with pytest.warns(DeprecationWarning, match=renamed) as seen:
        old = loaded.session
    assert old is loaded.row
    assert [Path(w.filename).name for w in seen] == [Path(__file__).name]
    with pytest.warns(DeprecationWarning, match=r"Session\.stored\(\) is deprecated: use Session\.row\(\)") as seen:
        stored = session.stored()
    assert stored == session.row() and stored.version == 2
    assert [Path(w.filename).name for w in seen] == [Path(__file__).name]
    with pytest.warns(DeprecationWarning, match=r"StoreContract\.meta is deprecated: use StoreContract\.row"):
        made = StoreContract.meta("rows", "s-2", scopes={"user": "u-1"})
    assert made == StoreContract.row("rows", "s-2", scopes={"user": "u-1"})


# -- seed "Stores", step 2: the row is real only after a commit --------------------------------


def concierge(store: Any, responses: list[dict[str, Any]]) -> Any:
    app = adk(name="bookings", store=store, adapters={"openai": MockAdapter(responses)})
    agent = app.agent(
        name="concierge", model=openai("gpt-5.6-luna"), context=[app.context.system("Be brief."), app.context.history()]
    )
    return app, agent


def test_step_2_the_row_is_real_only_after_a_commit(store: Any) -> None:
    app, agent = concierge(store, [{"text": "Tuesday 14:30 is open."}])
    session = app.sessions.create()
    run = app.run(agent, {"message": "Anything on Tuesday?"}, session=session)
    on_disk = app.sessions.get(session.id)
    assert run.status == "completed" and run.output.text == "Tuesday 14:30 is open."
    assert len(session.events) == 6 and len(on_disk.events) == 0 and on_disk.version == 1

    committed = app.sessions.commit(session)
    reloaded = app.sessions.get(session.id)
    assert (committed.ok, committed.version, committed.appended) == (True, 2, 6)
    assert (len(reloaded.events), reloaded.version) == (6, 2)
    assert reloaded.output.text == "Tuesday 14:30 is open."  # out of storage, not the object in scope
    assert [e.type for e in reloaded.events] == [
        "invocation_start",
        "user",
        "model_start",
        "model_end",
        "assistant",
        "invocation_end",
    ]
    assert reloaded.status == "completed"


def test_step_2_an_ephemeral_run_is_absent_from_the_listing_until_committed(store: Any) -> None:
    app, agent = concierge(store, [{"text": "Wednesday is full."}])
    orphan = app.run(agent, "Anything on Wednesday?")
    listed_before = [s.id for s in app.sessions.list()]
    rescued = app.sessions.commit(orphan.session)
    listed_after = [s.id for s in app.sessions.list()]
    assert listed_before == []
    assert (rescued.ok, rescued.version, rescued.appended) == (True, 1, 6)
    assert listed_after == [orphan.session.id]


# -- the session service ----------------------------------------------------------------------


def test_create_get_list_commit_delete(store: Any) -> None:
    app, agent = concierge(store, [{"text": "a"}, {"text": "b"}])
    session = app.sessions.create("s-1", scopes={})
    assert session.version == 1 and app.sessions.get("s-1").events == []
    assert app.sessions.get("s-2") is None
    app.run(agent, "one", session=session)
    first = app.sessions.commit(session)
    app.run(agent, "two", session=session)
    second = app.sessions.commit(session)
    assert (first.version, first.appended, second.version, second.appended) == (2, 6, 3, 6)
    again = app.sessions.commit(session)  # nothing new: no write, same version
    assert (again.ok, again.version, again.appended) == (True, 3, 0)
    assert len(app.sessions.get("s-1").events) == 12
    (listing,) = app.sessions.list()
    assert (listing.id, listing.version, listing.status) == ("s-1", 3, "completed")
    app.sessions.delete("s-1")
    assert app.sessions.get("s-1") is None and app.sessions.list() == []


def test_require_raises_session_not_found_where_get_returns_none(store: Any) -> None:
    app, _ = concierge(store, [])
    app.sessions.create("s-1")
    assert app.sessions.require("s-1").id == "s-1"
    with pytest.raises(SessionNotFound) as caught:
        app.sessions.require("s-2")
    assert caught.value.session_id == "s-2" and http_status(caught.value) == 404
    with pytest.raises(InvalidSessionId):
        app.sessions.require("has space")


def test_creating_a_taken_id_and_committing_a_stale_session_conflict(store: Any) -> None:
    app, _ = concierge(store, [])
    app.sessions.create("s-1")
    with pytest.raises(VersionConflict) as caught:
        app.sessions.create("s-1")
    assert (caught.value.expected_version, caught.value.actual_version) == (0, 1)
    a, b = app.sessions.get("s-1"), app.sessions.get("s-1")
    a.input.message("from a")
    b.input.message("from b")
    app.sessions.commit(a)
    with pytest.raises(VersionConflict) as stale:
        app.sessions.commit(b)
    assert stale.value.actual_version == 2
    assert [e.text for e in app.sessions.get("s-1").events] == ["from a"]
    assert b.version == 1 and len(b.uncommitted_events) == 1  # b is left as it was, to retry or merge


@pytest.mark.parametrize("bad", ["", "a" * 129, "has space", "hash#sign", "slash/y", "-leading", 7])
def test_session_ids_are_validated(bad: Any) -> None:
    app = adk(name="x")
    with pytest.raises(InvalidSessionId):
        app.sessions.create(bad)
    with pytest.raises(InvalidSessionId):
        app.sessions.get(bad)


def test_commit_says_what_it_takes() -> None:
    app = adk(name="x")
    with pytest.raises(InputError, match="commit takes a Session") as caught:
        app.sessions.commit("s-1")  # type: ignore[arg-type]
    assert caught.value.field == "session"
    with pytest.raises(InputError, match="belongs to another app"):
        app.sessions.commit(adk(name="x").sessions.ephemeral())


@pytest.mark.parametrize("scopes", [["user", "u-1"], "u-1", [("user", "u-1")]])
def test_scopes_that_are_not_a_dict_are_a_typed_error(scopes: Any) -> None:
    app = adk(name="x", schema={"user": UserProfile})
    for attempt in (app.sessions.create, app.sessions.ephemeral):
        with pytest.raises(InputError, match="scopes is a dict") as caught:
            attempt(scopes=scopes)
        assert caught.value.field == "scopes"
    assert app.sessions.list() == []


def test_scope_bindings_are_validated() -> None:
    app = adk(name="x", schema={"user": UserProfile})
    with pytest.raises(InvalidSessionId):
        app.sessions.create(scopes={"user": "has space"})
    with pytest.raises(InputError, match="binds shared scopes") as caught:
        app.sessions.create(scopes={"session": "x"})
    assert caught.value.field == "scopes.session"
    assert app.sessions.list() == []


def test_close_closes_the_store(tmp_path: Path) -> None:
    app = adk(name="x", store=sqlite_store(tmp_path / "s.db"))
    app.sessions.create("s-1")
    app.close()
    with pytest.raises(StoreClosed):
        app.sessions.get("s-1")
    app.close()  # twice is harmless


# -- shared scopes ----------------------------------------------------------------------------


class UserProfile(BaseModel):
    display_name: str = "friend"
    visits: int = 0


class Counter(BaseModel):
    sessions_seen: int = 0


def profile_app(store: Any, responses: list[dict[str, Any]]) -> Any:
    scripted = MockAdapter(responses)
    app = adk(name="profiles", schema={"user": UserProfile, "app": Counter}, store=store, adapters={"openai": scripted})

    def greet(ctx: Any) -> str:
        ctx.state.user.visits = ctx.state.user.visits + 1
        ctx.state.app.sessions_seen = ctx.state.app.sessions_seen + 1
        return f"hello {ctx.state.user.display_name}"

    def rename(ctx: Any) -> str:
        ctx.state.user.display_name = "Ada L."
        return "renamed"

    tools = [
        app.tool(name="greet", description="", execute=greet),
        app.tool(name="rename", description="", execute=rename),
    ]
    agent = app.agent(name="a", model=openai("m"), context=[app.context.history()], tools=tools)
    return app, scripted, agent


def test_shared_scope_writes_ride_on_the_commit_and_another_session_sees_them(store: Any) -> None:
    app, _scripted, agent = profile_app(store, [{"tool_calls": [{"name": "greet", "args": {}}]}, {"text": "hi"}] * 2)
    store.save_scoped_state("profiles", "user", "u-1", {"display_name": "Ada"})
    first = app.sessions.create(scopes={"user": "u-1"})
    run = app.run(agent, "hi", session=first)
    assert run.status == "completed"
    assert store.load_scoped_state("profiles", "user", "u-1") == {"display_name": "Ada"}  # not yet committed
    app.sessions.commit(first)
    assert store.load_scoped_state("profiles", "user", "u-1") == {"display_name": "Ada", "visits": 1}
    assert store.load_scoped_state("profiles", "app", "app") == {"sessions_seen": 1}  # app: shared, no binding

    second = app.sessions.create(scopes={"user": "u-1"})
    app.run(agent, "hi", session=second)
    app.sessions.commit(second)
    assert store.load_scoped_state("profiles", "user", "u-1")["visits"] == 2
    assert store.load_scoped_state("profiles", "app", "app") == {"sessions_seen": 2}
    # The second session read values another session stored: the ledger says so, as observations.
    observed = [
        (e.scope, e.scope_id, e.changes[0].key, e.changes[0].new_value)
        for e in second.events
        if isinstance(e, StateChangeEvent) and e.source == "observation"
    ]
    assert ("user", "u-1", "visits", 1) in observed and ("user", "u-1", "display_name", "Ada") in observed
    assert ("app", "app", "sessions_seen", 1) in observed
    mutation = next(e for e in second.events if isinstance(e, StateChangeEvent) and e.source == "mutation")
    assert (mutation.scope_id, mutation.changes[0].old_value, mutation.changes[0].new_value) == ("u-1", 1, 2)


def test_a_value_moved_by_another_session_between_reads_is_observed_again(store: Any) -> None:
    app, scripted, agent = profile_app(store, [])
    session = app.sessions.create(scopes={"user": "u-1"})
    store.save_scoped_state("profiles", "user", "u-1", {"display_name": "Ada"})
    scripted.set_responses([{"tool_calls": [{"name": "greet", "args": {}}]}, {"text": "hi"}])
    app.run(agent, "hi", session=session)
    app.sessions.commit(session)
    store.save_scoped_state("profiles", "user", "u-1", {"display_name": "Ada Lovelace"})  # elsewhere
    scripted.set_responses([{"tool_calls": [{"name": "greet", "args": {}}]}, {"text": "hi"}])
    run = app.run(agent, "hi again", session=session)
    assert run.events[-2].type == "assistant"
    names = [
        (e.changes[0].old_value, e.changes[0].new_value)
        for e in session.events
        if isinstance(e, StateChangeEvent) and e.source == "observation" and e.changes[0].key == "display_name"
    ]
    assert names == [(None, "Ada"), ("Ada", "Ada Lovelace")]
    assert next(e for e in run.events if e.type == "tool_result").result == "hello Ada Lovelace"  # type: ignore[union-attr]


def test_a_write_to_an_unbound_shared_scope_is_a_typed_error(store: Any) -> None:
    app, _scripted, agent = profile_app(store, [{"tool_calls": [{"name": "rename", "args": {}}]}, {"text": "done"}])
    run = app.run(agent, "rename me")  # an ephemeral session: no user bound
    result = next(e for e in run.events if e.type == "tool_result")
    assert result.error is not None and "'user' is not bound" in result.error  # type: ignore[union-attr]
    assert str(ScopeNotBound("user")).startswith("shared scope 'user' is not bound")


def test_a_commit_writing_a_shared_scope_id_the_session_is_not_bound_to_is_refused(store: Any) -> None:
    """A run cannot write another user's state (``ScopeNotBound``); a commit carrying such a write, however
    the events were assembled, is refused the same way, through ``serving.commit`` too, writing nothing."""
    from dormant.serving import commit

    app, _scripted, _agent = profile_app(store, [])
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    for scope, scope_id in (("user", "u-2"), ("team", "t-1"), ("app", "not-app")):
        stranger = app.sessions.require("s-1")
        stranger.append(UserEvent(text="hi"))
        change = {"key": "visits", "old_value": None, "new_value": 99}
        stranger.append(StateChangeEvent(scope=scope, scope_id=scope_id, source="direct", changes=[change]))
        for committing in (app.sessions.commit, lambda s: commit(app, s)):
            with pytest.raises(ScopeNotBound) as caught:
                committing(stranger)
            assert (caught.value.field, caught.value.scope, caught.value.scope_id) == (
                "events.1.scope_id",
                scope,
                scope_id,
            )
        assert store.load_scoped_state("profiles", scope, scope_id) == {}
    assert app.sessions.require("s-1").version == session.version
    mine = app.sessions.require("s-1")
    mine.append(StateChangeEvent(scope="user", scope_id="u-1", source="direct", changes=[change]))
    app.sessions.commit(mine)  # its own id: stored
    assert store.load_scoped_state("profiles", "user", "u-1") == {"visits": 99}


def test_a_direct_write_on_a_loaded_session_is_recorded_and_persisted(store: Any) -> None:
    app, _ = concierge(store, [])
    app.sessions.create("s-1", scopes={})
    loaded = app.sessions.get("s-1")
    loaded.state.cart = ["sku-1"]
    event = loaded.events[-1]
    assert isinstance(event, StateChangeEvent) and (event.source, event.invocation_id) == ("direct", None)
    app.sessions.commit(loaded)
    assert app.sessions.get("s-1").state.cart == ["sku-1"]


def test_seeding_a_bound_shared_scope_never_overwrites_what_is_stored(store: Any) -> None:
    app, _scripted, agent = profile_app(store, [{"text": "hi"}])
    store.save_scoped_state("profiles", "user", "u-1", {"display_name": "Ada"})
    session = app.sessions.create(scopes={"user": "u-1"})
    app.run(agent, {"message": "hi", "initial_state": {"user": {"display_name": "Someone"}}}, session=session)
    app.sessions.commit(session)
    assert store.load_scoped_state("profiles", "user", "u-1") == {"display_name": "Ada", "visits": 0}


def test_initial_state_seeds_only_keys_not_already_set() -> None:
    t = triage()
    t.model.set_responses([{"text": "one"}, {"text": "two"}])
    session = t.app.sessions.ephemeral()
    t.app.run(t.agent, {"message": "a", "initial_state": {"session": {"stage": "collecting"}}}, session=session)
    count = len(session.events)
    t.app.run(t.agent, {"message": "b", "initial_state": {"session": {"stage": "intake"}}}, session=session)
    assert session.state.stage == "collecting"
    assert [e.type for e in session.events[count:]][:1] == ["invocation_start"]


def test_listing_arguments_are_checked(store: Any) -> None:
    app, _ = concierge(store, [])
    for limit in (0, True, 1.5, "3"):
        with pytest.raises(InputError) as bad_limit:
            app.sessions.list(limit=limit)  # type: ignore[arg-type]
        assert bad_limit.value.field == "limit"
    with pytest.raises(InputError) as bad_cursor:
        app.sessions.list(cursor="not-a-cursor")
    assert bad_cursor.value.field == "cursor"


def test_scoped_changes_hold_the_last_uncommitted_write_per_key(store: Any) -> None:
    app, _scripted, _agent = profile_app(store, [])
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    unbound = app.sessions.ephemeral()
    unbound.state.user.visits = 9  # seeded while unbound: it lives in that ledger only
    assert unbound.scoped_changes() == []
    session.state.user.visits = 1
    session.state.user.visits = 2
    session.state.user.display_name = "Ada"
    session.state.app.sessions_seen = 4
    del session.state.user.display_name
    assert sorted(session.scoped_changes(), key=lambda c: (c.scope, c.key)) == [
        ScopedStateChange("app", "app", "sessions_seen", 4),
        ScopedStateChange("user", "u-1", "display_name", None),
        ScopedStateChange("user", "u-1", "visits", 2),
    ]
    app.sessions.commit(session)
    assert session.scoped_changes() == []
    assert store.load_scoped_state("profiles", "user", "u-1") == {"visits": 2}
    session.state.user.visits = 3
    assert session.scoped_changes() == [ScopedStateChange("user", "u-1", "visits", 3)]
    # A session rebuilt from its events holds them all as uncommitted, so their writes too.
    rebuilt = app.sessions.from_events(list(session.events), scopes={"user": "u-1"})
    assert sorted(c.key for c in rebuilt.scoped_changes()) == ["display_name", "sessions_seen", "visits"]
    assert app.sessions.get("s-1").scoped_changes() == []
