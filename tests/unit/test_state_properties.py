"""Property: the incrementally folded state equals a full replay of the ledger, and what was written."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from dormant import adk
from dormant.projection import Projection


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


SCOPES = ["session", "user", "org", "app"]
WRITTEN_SCOPES = st.sampled_from(["session", "user", "user", "org", "app"])
KEYS = ["a", "b"]
VALUES = st.one_of(
    st.none(),
    st.integers(-2, 2),
    st.booleans(),
    st.sampled_from(["x", "y"]),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["k", "l"]), st.integers(0, 1), max_size=2),
)
WRITE = st.tuples(
    WRITTEN_SCOPES,
    st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=3),
    st.booleans(),  # inside an invocation (mutation) or outside (direct)
)


def _replay(events: Any) -> Projection:
    projection = Projection()
    for event in events:
        projection.apply(event)
    return projection


@settings(max_examples=300, deadline=None)
@given(writes=st.lists(WRITE, max_size=25))
def test_incremental_state_equals_replay_and_what_was_written(writes: list[tuple[str, dict[str, Any], bool]]) -> None:
    app = adk(name="props", schema={"session": Open, "user": Open, "org": Open, "app": Open})
    session = app.sessions.create(scopes={"user": "u-1", "org": "o-1"})
    invocation = session.invocation("inv-1", "agent")
    expected: dict[str, dict[str, Any]] = {scope: {} for scope in SCOPES}
    recorded = 0
    for scope, values, inside in writes:
        state = invocation.state if inside else session.state
        target = state if scope == "session" else getattr(state, scope)
        if len(values) == 1:
            ((key, value),) = values.items()
            setattr(target, key, value)
        else:
            target.update(values)
        for key, value in values.items():
            before = expected[scope].get(key)
            if value is None:
                expected[scope].pop(key, None)
            else:
                expected[scope][key] = value
            after = expected[scope].get(key)
            recorded += before != after or type(before) is not type(after)
    assert len(session.events) == recorded
    assert session.state.to_dict() == expected["session"]
    for scope in ("user", "org", "app"):
        assert getattr(session.state, scope).to_dict() == expected[scope]
    replay = _replay(session.events)
    assert replay.session_state == session.projection.session_state
    assert replay.scoped_states == session.projection.scoped_states
    if len(session.events):
        last = session.state_at(len(session.events) - 1)
        assert last.session_state == expected["session"]
        assert {k: v for k, v in last.scoped_states.items() if v} == {
            scope: values for scope, values in expected.items() if scope != "session" and values
        }
    # Every prefix replays to the state recorded by the changes up to it.
    running: dict[str, dict[str, Any]] = {scope: {} for scope in SCOPES}
    for index, event in enumerate(session.events):
        for change in event.changes:  # type: ignore[union-attr]
            if change.new_value is None:
                running[event.scope].pop(change.key, None)  # type: ignore[union-attr]
            else:
                running[event.scope][change.key] = change.new_value  # type: ignore[union-attr]
        assert session.state_at(index).session_state == running["session"]
