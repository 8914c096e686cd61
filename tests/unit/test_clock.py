"""The clock seam: every timestamp dormant writes comes from ``dormant.clock``."""

from __future__ import annotations

import threading

import pytest

from dormant import adk
from dormant.clock import frozen_clock, now_ms, system_ms, use_clock
from dormant.errors import ConfigurationError
from dormant.events import UserEvent
from dormant.ids import check_id, new_id
from dormant.testing import MockAdapter

T0 = 1_700_000_000_000


def test_a_frozen_clock_stamps_events_sessions_and_store_rows() -> None:
    app = adk(name="clock", adapters={"openai": MockAdapter([{"text": "hi"}])})
    agent = app.agent(name="a", model={"provider": "openai", "name": "m"})
    with frozen_clock(T0) as clock:
        session = app.sessions.create("s-1")
        clock.advance(5_000)
        run = app.run(agent, "hello", session=session)
        clock.advance(1_000)
        app.sessions.commit(session)
    assert session.created_at == T0
    assert {event.created_at for event in run.events} == {T0 + 5_000}
    [listing] = app.sessions.list()
    assert (listing.created_at, listing.updated_at) == (T0, T0 + 6_000)


def test_the_clock_is_restored_and_nests() -> None:
    with frozen_clock(T0):
        assert now_ms() == T0
        with use_clock(lambda: 42):
            assert now_ms() == UserEvent(text="x").created_at == 42
        assert now_ms() == T0
    assert abs(now_ms() - system_ms()) < 60_000


def test_the_clock_is_process_wide() -> None:
    seen: list[int] = []
    with frozen_clock(T0):
        thread = threading.Thread(target=lambda: seen.append(now_ms()))
        thread.start()
        thread.join(timeout=30)
    assert seen == [T0]


def test_use_clock_takes_a_function() -> None:
    with pytest.raises(ConfigurationError), use_clock(T0):  # type: ignore[arg-type]
        pass


def test_new_ids_sort_in_the_order_they_were_made_whatever_the_clock_says() -> None:
    with frozen_clock(1_000):  # ids take the system clock: a frozen or earlier clock changes nothing
        minted = [new_id() for _ in range(5_000)]
    minted += [UserEvent(text="later").id for _ in range(100)]
    assert minted == sorted(minted) and len(set(minted)) == len(minted)
    assert all(len(i) == 32 and check_id(i) for i in minted)
