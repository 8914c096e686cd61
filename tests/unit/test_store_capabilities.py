"""The sweeper asks the store for its running and waiting sessions through ``SweepableStore``, never its class: a
store of the user's own that lists them is swept like a built-in one, and one that does not is left alone."""

from __future__ import annotations

from dormant import adk
from dormant.clock import now_ms
from dormant.events import InvocationStartEvent, InvocationYieldEvent, PendingCall, ToolCallEvent
from dormant.serving.runtime import Served
from dormant.serving.workflow import running_turns, sweep_turns, waiting_turns
from dormant.stores.base import SessionStore, SweepableStore
from tests.support.wrapped_stores import SixMethods, Sweepable


def _stuck_and_waiting(store: SessionStore) -> Served:
    """An app (with no agents) holding a turn whose runner's deadline passed, and a session waiting on answers."""
    app = adk(name="a", store=store)
    stuck = app.sessions.create("stuck")
    stuck.append(InvocationStartEvent(invocation_id="inv-1", agent_name="gone", deadline=now_ms() - 60_000))
    app.sessions.commit(stuck)
    waiting = app.sessions.create("waiting")
    waiting.append(InvocationStartEvent(invocation_id="inv-2", agent_name="gone"))
    waiting.append(ToolCallEvent(call_id="c1", name="ask", invocation_id="inv-2", agent_name="gone"))
    waiting.append(
        InvocationYieldEvent(invocation_id="inv-2", agent_name="gone", pending=[PendingCall(call_id="c1", name="ask")])
    )
    app.sessions.commit(waiting)
    assert app.sessions.require("waiting").status == "awaiting_input"
    return Served(app, {})


def test_a_store_of_ones_own_that_lists_them_is_swept() -> None:
    store = Sweepable()
    assert isinstance(store, SweepableStore) and not hasattr(store, "bound_sessions")  # no BaseSessionStore
    served = _stuck_and_waiting(store)
    app = served.app
    assert [sid for _, sid in running_turns(app)] == ["stuck"]
    assert [row.session_id for _, row in waiting_turns(app)] == ["waiting"]
    # No agent can go on with the stuck turn: the sweep ends it, as it would in a built-in store.
    assert sweep_turns(served, app, grace_ms=0, wait_grace_ms=0) == ["stuck@inv-1: ended"]
    assert app.sessions.require("stuck").status == "error"


def test_a_store_that_lists_none_is_left_alone() -> None:
    """The documented behaviour (``SweepableStore``): no turn handed on, no wait woken, nothing written."""
    store = SixMethods()
    assert not isinstance(store, SweepableStore)
    served = _stuck_and_waiting(store)
    app = served.app
    assert list(running_turns(app)) == [] and list(waiting_turns(app)) == []
    assert sweep_turns(served, app, grace_ms=0, wait_grace_ms=0) == []
    assert app.sessions.require("stuck").status == "running"
