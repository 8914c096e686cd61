"""``dormant.audit``: the diff between two points of a session, and the history of one key."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dormant.audit import key_history, state_diff
from dormant.events import (
    Event,
    InvocationStartEvent,
    ModelRef,
    ModelStartEvent,
    StateChange,
    StateChangeEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from dormant.projection import Projection, StateSnapshot

scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | st.text(max_size=3)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=6,
)
scope_values = st.dictionaries(st.sampled_from("abcd"), values.filter(lambda v: v is not None), max_size=4)
scoped = st.dictionaries(st.sampled_from(["user", "app"]), scope_values, max_size=2)


def snapshot(session: dict[str, Any], scopes: dict[str, dict[str, Any]]) -> StateSnapshot:
    return StateSnapshot(0, session, scopes, "idle", None, [], [])


@given(scope_values, scoped, scope_values, scoped)
def test_applying_the_diff_to_the_first_state_gives_the_second(
    s1: dict[str, Any], o1: dict[str, dict[str, Any]], s2: dict[str, Any], o2: dict[str, dict[str, Any]]
) -> None:
    before, after = snapshot(s1, o1), snapshot(s2, o2)
    diffs = state_diff(before, after)
    state = {"session": dict(s1), **{scope: dict(v) for scope, v in o1.items()}}
    for diff in diffs:
        target = state.setdefault(diff.scope, {})
        assert repr(target.get(diff.key)) == repr(diff.before)
        if diff.after is None:
            target.pop(diff.key, None)
        else:
            target[diff.key] = diff.after
    expected = {"session": s2, **o2}
    assert {k: v for k, v in state.items() if v} == {k: v for k, v in expected.items() if v}
    # no difference with itself; the other way round, the same keys with before and after swapped
    assert state_diff(after, after) == []
    assert [(d.scope, d.key, d.after, d.before) for d in state_diff(after, before)] == [
        (d.scope, d.key, d.before, d.after) for d in diffs
    ]


def test_json_equality_tells_true_from_1() -> None:
    (diff,) = state_diff(snapshot({"a": 1}, {}), snapshot({"a": True}, {}))
    assert (diff.before, diff.after) == (1, True)
    assert state_diff(snapshot({"a": [1, {"b": 2}]}, {}), snapshot({"a": [1, {"b": 2}]}, {})) == []


def change(key: str, new: Any, invocation: str | None = "inv-1", source: Any = None) -> StateChangeEvent:
    """A change as release 0.1 wrote it: without the tool call that made it."""
    return StateChangeEvent(
        scope="session",
        source=source or ("mutation" if invocation else "direct"),
        changes=[StateChange(key=key, new_value=new)],
        invocation_id=invocation,
    )


def test_a_change_belongs_to_the_tool_whose_result_follows_it() -> None:
    model = ModelRef(provider="scripted", name="m")
    events: list[Event] = [
        change("k", 0, invocation=None),  # seeded before any invocation: no tool
        InvocationStartEvent(invocation_id="inv-1", agent_name="a"),
        ToolCallEvent(call_id="c1", name="first", invocation_id="inv-1"),
        ToolCallEvent(call_id="c2", name="second", invocation_id="inv-1"),
        change("k", 1),  # while "first" runs
        ToolResultEvent(call_id="c1", name="first", invocation_id="inv-1"),
        ToolResultEvent(call_id="c2", name="second", invocation_id="inv-1"),  # "second" changed nothing
        change("k", 2),  # while the context is rendered for the next model call: no tool
        ModelStartEvent(invocation_id="inv-1", model=model, input=[], message_count=0, digest="d"),
        ToolCallEvent(call_id="c3", name="third", invocation_id="inv-1"),
        change("other", 9),
        change("k", 8, source="observation"),  # what "third" saw stored: not a change it made
        change("k", 3),  # while "third" runs
        ToolResultEvent(call_id="c3", name="third", invocation_id="inv-1"),
        change("k", 4),  # the ledger ends with it: no tool
    ]
    history = key_history(events, "session", "k")
    assert [(c.index, c.new_value, c.tool, c.call_id) for c in history] == [
        (0, 0, None, None),
        (4, 1, "first", "c1"),
        (7, 2, None, None),
        (11, 8, None, None),
        (12, 3, "third", "c3"),
        (14, 4, None, None),
    ]
    assert key_history(events, "user", "k") == []
    # replaying the history gives the key's value as the fold has it
    projection = Projection()
    for event in events:
        projection.apply(event)
    assert projection.session_state["k"] == history[-1].new_value


def test_properties_have_no_wall_clock_window() -> None:
    """On a shared, loaded machine a draw can take seconds: Hypothesis's deadline and its too-slow health
    check would fail a correct property on timing alone (the rule: no wall-clock windows in tests)."""
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check
