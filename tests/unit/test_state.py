"""State: the schema, the write rules, typed reads, temp, time travel and forks (see docs/decisions.md)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from dormant import adk
from dormant.errors import (
    EventIndexError,
    SchemaError,
    ScopeNotAssignable,
    StateValidationError,
    TempOutsideInvocation,
    UnknownEventId,
    UnknownScope,
    UnknownStateKey,
    ValueNotStorable,
)
from dormant.events import SessionForkedEvent, StateChangeEvent


class Slot(BaseModel):
    day: str
    time: str


class SessionState(BaseModel):
    stage: Literal["intake", "collecting", "triaged"] = "intake"
    concerns: list[str] = []
    count: int = 0
    flag: bool = False
    slot: Slot | None = None
    note: str | None = None

    @field_validator("concerns")
    @classmethod
    def _stripped(cls, value: list[str]) -> list[str]:
        return [v.strip() for v in value]


class UserState(BaseModel):
    display_name: str = "friend"


class TempState(BaseModel):
    scratch: int = 0


class OpenOrg(BaseModel):
    model_config = ConfigDict(extra="allow")
    plan: str = "free"


def make_app(**extra: Any) -> Any:
    schema = {"session": SessionState, "user": UserState, "temp": TempState, "org": OpenOrg, **extra}
    return adk(name="state-tests", schema=schema)


def changes(session: Any) -> list[tuple[str, str, str, Any, Any]]:
    return [
        (e.scope, e.source, c.key, c.old_value, c.new_value)
        for e in session.events
        if isinstance(e, StateChangeEvent)
        for c in e.changes
    ]


# -- the schema, checked at adk() -----------------------------------------------------------


def test_an_unknown_scope_is_refused_by_name() -> None:
    with pytest.raises(SchemaError, match="'household'") as caught:
        adk(name="x", schema={"household": UserState})
    assert caught.value.scope == "household"


@pytest.mark.parametrize("bad", [dict, UserState(), "UserState", None])
def test_a_schema_value_that_is_not_a_model_class_is_refused_naming_the_scope(bad: Any) -> None:
    with pytest.raises(SchemaError, match="schema\\['user'\\]") as caught:
        adk(name="x", schema={"user": bad})
    assert caught.value.scope == "user"


def test_a_session_key_that_shadows_the_state_view_is_refused() -> None:
    class Clash(BaseModel):
        update: int = 0

    with pytest.raises(SchemaError, match="'update'"):
        adk(name="x", schema={"session": Clash})


def test_every_scope_is_accepted() -> None:
    scopes = ["session", "user", "patient", "practice", "org", "team", "app", "temp"]
    app = adk(name="x", schema={s: UserState for s in scopes})
    assert set(app.schema.scopes) == set(scopes)


# -- writes -----------------------------------------------------------------------------------


def test_assignment_records_one_direct_event_per_changed_key() -> None:
    session = make_app().sessions.ephemeral()
    session.state.stage = "collecting"
    session.state.count = 2
    assert changes(session) == [
        ("session", "direct", "stage", None, "collecting"),
        ("session", "direct", "count", None, 2),
    ]
    assert all(e.invocation_id is None for e in session.events)


def test_update_records_each_changed_key_and_skips_equal_ones() -> None:
    session = make_app().sessions.ephemeral()
    session.state.update({"stage": "collecting", "count": 1})
    session.state.update({"stage": "collecting", "count": 2, "concerns": []})
    assert changes(session) == [
        ("session", "direct", "stage", None, "collecting"),
        ("session", "direct", "count", None, 1),
        ("session", "direct", "count", 1, 2),
        ("session", "direct", "concerns", None, []),
    ]


def test_a_deep_equal_write_records_nothing() -> None:
    session = make_app().sessions.ephemeral()
    session.state.slot = {"day": "Tue", "time": "14:30"}
    before = len(session.events)
    session.state.slot = Slot(day="Tue", time="14:30")  # same value, given as a model
    session.state.concerns = []
    session.state.concerns = []
    assert len(session.events) == before + 1


def test_equality_is_strict_about_json_types() -> None:
    app = adk(name="x")  # untyped session scope
    session = app.sessions.ephemeral()
    session.state.value = 1
    session.state.value = True
    session.state.value = 1.0
    assert [c[4] for c in changes(session)] == [1, True, 1.0]


def test_none_and_del_delete_the_key() -> None:
    session = make_app().sessions.ephemeral()
    session.state.note = "hello"
    session.state.note = None
    session.state.count = 3
    del session.state.count
    assert changes(session)[1] == ("session", "direct", "note", "hello", None)
    assert changes(session)[3] == ("session", "direct", "count", 3, None)
    assert "note" not in session.state and "count" not in session.state
    assert session.state.count == 0  # a read of an absent key gives the schema's default
    before = len(session.events)
    del session.state.count  # already absent: nothing changes, nothing recorded
    assert len(session.events) == before


def test_an_invalid_value_raises_naming_scope_and_key_and_records_nothing() -> None:
    session = make_app().sessions.ephemeral()
    with pytest.raises(StateValidationError) as caught:
        session.state.stage = "discharged"
    assert (caught.value.scope, caught.value.key, caught.value.field) == ("session", "stage", "state.session.stage")
    with pytest.raises(StateValidationError, match="count"):
        session.state.update({"stage": "triaged", "count": "many"})  # one bad key: nothing of the batch
    assert list(session.events) == []
    assert "stage" not in session.state


def test_writes_run_the_models_own_validators() -> None:
    session = make_app().sessions.ephemeral()
    session.state.concerns = ["  cough "]
    assert session.state.concerns == ["cough"]
    assert changes(session)[0][4] == ["cough"]


def test_an_undeclared_key_is_refused_unless_the_model_allows_extra() -> None:
    session = make_app().sessions.ephemeral()
    with pytest.raises(StateValidationError, match="no key 'stgae'"):
        session.state.stgae = "intake"
    with pytest.raises(UnknownStateKey):
        session.state.stgae
    session.state.org.anything = {"goes": [1]}  # OpenOrg has extra="allow"
    assert session.state.org.anything == {"goes": [1]}


def test_without_a_session_model_any_json_value_is_accepted() -> None:
    session = adk(name="x").sessions.ephemeral()
    session.state.cart = [{"sku": "a", "qty": 2}]
    assert session.state.cart == [{"sku": "a", "qty": 2}]
    with pytest.raises(StateValidationError, match="JSON"):
        session.state.when = object()


# -- reads ------------------------------------------------------------------------------------


def test_reads_are_typed_and_are_copies() -> None:
    session = make_app().sessions.ephemeral()
    session.state.slot = {"day": "Tue", "time": "14:30"}
    session.state.concerns = ["cough"]
    slot = session.state.slot
    assert isinstance(slot, Slot) and slot.day == "Tue"
    concerns = session.state.concerns
    concerns.append("sneaked in")  # mutating a read value changes nothing
    assert session.state.concerns == ["cough"]
    assert session.state.to_dict() == {"slot": {"day": "Tue", "time": "14:30"}, "concerns": ["cough"]}


def test_defaults_fill_reads_of_absent_keys() -> None:
    session = make_app().sessions.ephemeral()
    assert (session.state.stage, session.state.concerns, session.state.note) == ("intake", [], None)
    assert session.state.user.display_name == "friend"
    assert session.state.get("stage", "absent") == "absent"


def test_shared_scopes_hang_off_the_state_by_attribute() -> None:
    session = make_app().sessions.ephemeral()
    session.state.user.display_name = "Ada"  # a direct write (seeding): recorded, unbound
    assert session.state.user.display_name == "Ada"
    assert changes(session) == [("user", "direct", "display_name", None, "Ada")]
    with pytest.raises(UnknownScope):
        session.state.patient
    with pytest.raises(ScopeNotAssignable, match="is a scope") as caught:
        session.state.user = {"display_name": "x"}
    assert isinstance(caught.value, AttributeError) and caught.value.field == "state.user"
    assert changes(session) == [("user", "direct", "display_name", None, "Ada")]  # nothing recorded


def test_a_state_view_converts_to_a_dict() -> None:
    session = make_app().sessions.ephemeral(scopes={"user": "u-1"})
    assert dict(session.state) == {}
    session.state.update({"stage": "collecting", "count": 2})
    session.state.user.display_name = "Ada"
    assert dict(session.state) == {"stage": "collecting", "count": 2} == session.state.to_dict()
    assert dict(session.state.user) == {"display_name": "Ada"}
    assert sorted(session.state.keys()) == ["count", "stage"]


def test_temp_exists_only_inside_an_invocation() -> None:
    session = make_app().sessions.ephemeral()
    with pytest.raises(TempOutsideInvocation):
        session.state.temp.scratch
    with pytest.raises(TempOutsideInvocation):
        session.state.temp.scratch = 1
    assert list(session.events) == []


# -- time travel ------------------------------------------------------------------------------


def test_state_at_event_index_of_and_their_typed_errors() -> None:
    session = make_app().sessions.ephemeral()
    session.state.stage = "collecting"
    session.state.stage = "triaged"
    assert session.state_at(0).session_state == {"stage": "collecting"}
    assert session.state_at(1).session_state == {"stage": "triaged"}
    assert session.state_at(-1).session_state == {"stage": "triaged"}
    assert session.event_index_of(session.events[1].id) == 1
    with pytest.raises(EventIndexError):
        session.state_at(2)
    with pytest.raises(IndexError):
        session.state_at(-3)
    with pytest.raises(UnknownEventId):
        session.event_index_of("nope")
    with pytest.raises(KeyError):
        session.event_index_of("nope")


def test_a_snapshot_is_detached_from_the_session() -> None:
    session = make_app().sessions.ephemeral()
    session.state.concerns = ["a"]
    snapshot = session.state_at(0)
    snapshot.session_state["concerns"].append("b")
    assert session.state.concerns == ["a"] and session.state_at(0).session_state == {"concerns": ["a"]}


def test_fork_at_copies_a_prefix_under_a_new_id_and_leaves_the_original() -> None:
    session = make_app().sessions.ephemeral()
    session.state.stage = "collecting"
    session.state.count = 5
    session.state.stage = "triaged"
    fork = session.fork_at(1)
    assert fork.id != session.id
    assert [e.id for e in fork.events[:2]] == [e.id for e in session.events[:2]]
    assert fork.events[0] is not session.events[0]
    # The fork says where it came from: on the session (and so its stored row) and in its ledger.
    marker = fork.events[2]
    assert isinstance(marker, SessionForkedEvent) and len(fork.events) == 3
    assert (marker.from_session_id, marker.at_event_id, marker.reason) == (session.id, session.events[1].id, "fork_at")
    assert (fork.forked_from, fork.fork_reason) == (session.id, "fork_at")
    assert (fork.row().forked_from, fork.row().fork_reason) == (session.id, "fork_at")
    assert (fork.state.stage, fork.state.count) == ("collecting", 5)
    fork.state.count = 6
    assert session.state.count == 5 and len(session.events) == 3
    assert fork.version == 0 and fork.uncommitted_events == list(fork.events)
    with pytest.raises(EventIndexError):
        session.fork_at(3)
    with pytest.raises(ValueNotStorable):
        session.fork_at(1, reason="bad\x00reason")


def test_a_committed_fork_keeps_its_marks_when_loaded() -> None:
    app = make_app()
    session = app.sessions.create("s-1")
    session.state.stage = "collecting"
    app.sessions.commit(session)
    fork = session.fork_at(0, reason="try another path")
    app.sessions.commit(fork)
    loaded = app.sessions.require(fork.id)
    assert (loaded.forked_from, loaded.fork_reason) == ("s-1", "try another path")
    assert loaded.events == fork.events and loaded.events[-1].type == "session_forked"
    assert loaded.state.stage == "collecting" and loaded.status == "idle"
    assert app.sessions.require("s-1").forked_from is None


def test_state_at_reports_status_and_scoped_states() -> None:
    session = make_app().sessions.ephemeral()
    session.state.user.display_name = "Ada"
    snapshot = session.state_at(0)
    assert snapshot.scoped_states == {"user": {"display_name": "Ada"}}
    assert snapshot.status == "idle" and snapshot.current_agent_name is None
    assert snapshot.yielded_tools == [] and snapshot.invocations == []
