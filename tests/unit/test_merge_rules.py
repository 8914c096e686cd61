"""The merge rules are pure ledger logic (``dormant.merge``): asked of events alone, with no session or store."""

from __future__ import annotations

from dormant.events import InvocationStartEvent, StateChange, StateChangeEvent, ToolResultEvent, UserEvent
from dormant.merge import conflicts


def _bound(scope: str) -> str | None:
    return {"user": "u-1"}.get(scope)


def _wrote(scope: str, key: str, scope_id: str | None = None) -> StateChangeEvent:
    change = StateChange(key=key, new_value=1)
    return StateChangeEvent(scope=scope, scope_id=scope_id, source="direct", changes=[change])


def test_disjoint_events_merge() -> None:
    landed = [UserEvent(text="a"), _wrote("user", "a")]
    mine = [_wrote("user", "b"), ToolResultEvent(call_id="c2", name="t", invocation_id="i2")]
    assert conflicts(landed, mine, scope_id=_bound, open_invocation=None) == []


def test_each_rule_names_its_conflict() -> None:
    landed = [_wrote("user", "k"), ToolResultEvent(call_id="c1", name="t", invocation_id="i1")]
    mine = [
        _wrote("user", "k", scope_id="u-1"),  # the same key: one names the bound id, the other leaves it implied
        ToolResultEvent(call_id="c1", name="t", invocation_id="i1"),
        InvocationStartEvent(invocation_id="i9", agent_name="a"),
    ]
    assert conflicts(landed, mine, scope_id=_bound, open_invocation="i1") == [
        "both wrote user/u-1.k",
        "both answered or ran tool call c1",
        "both continued invocation i1",
        "invocation i1 is still open in the stored ledger",
    ]
