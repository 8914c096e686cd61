"""``DormantSessionService`` held to what ADK's own session services promise (issue 28).

Every test of the contract runs on four services: ADK's ``InMemorySessionService`` and
``DatabaseSessionService`` (SQLite), which prove the expectation is ADK's real behaviour, and
``DormantSessionService`` on dormant's memory and SQLite stores. The expectations are those of ADK's
session-service tests and its services' source (written here in our words, not copied).
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")
pytestmark = pytest.mark.backend("adk")

from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig  # noqa: E402
from google.adk.sessions.session import Session  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402

from dormant.bridges.adk import NONE, DormantSessionService, session_key  # noqa: E402
from dormant.errors import InvalidSessionId  # noqa: E402
from dormant.events import AdkEvent, StateChangeEvent  # noqa: E402
from dormant.stores.memory import in_memory_store  # noqa: E402
from dormant.stores.sqlite import sqlite_store  # noqa: E402

SERVICES = ["adk-memory", "adk-database", "dormant-memory", "dormant-sqlite"]
DORMANT = ["dormant-memory", "dormant-sqlite"]


def sync(body: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(body(*args, **kwargs))

    return run


class Made:
    """A service and what closes it (an async engine must be disposed inside a loop)."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.store: Any = None
        if kind == "adk-memory":
            self.service: BaseSessionService = InMemorySessionService()
        elif kind == "adk-database":
            pytest.importorskip("sqlalchemy", reason="ADK's DatabaseSessionService needs sqlalchemy")
            from google.adk.sessions.database_session_service import DatabaseSessionService

            self.service = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp / 'adk.db'}")
        else:
            self.store = in_memory_store() if kind == "dormant-memory" else sqlite_store(tmp / "dormant.db")
            self.service = DormantSessionService(self.store)

    async def close(self) -> None:
        close = getattr(self.service, "close", None)
        if close is not None:
            await close()
        if self.store is not None:
            self.store.close()


@pytest.fixture(params=SERVICES)
def made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Made]:
    m = Made(request.param, tmp_path)
    yield m
    asyncio.run(m.close())


@pytest.fixture(params=[k for k in SERVICES if k != "adk-memory"])
def checked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Made]:
    """The services that check for a stale session and serialise state (ADK's in-memory one does neither)."""
    m = Made(request.param, tmp_path)
    yield m
    asyncio.run(m.close())


@pytest.fixture(params=DORMANT)
def ours(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Made]:
    m = Made(request.param, tmp_path)
    yield m
    asyncio.run(m.close())


def delta(**values: Any) -> EventActions:
    return EventActions(state_delta=values)


def keyed(**values: Any) -> dict[str, Any]:
    """``keyed(user__k=1)`` -> ``{"user:k": 1}`` (prefixes are not Python names)."""
    return {k.replace("__", ":"): v for k, v in values.items()}


# -- create, get, list, delete ------------------------------------------------------------------------


@sync
async def test_get_of_a_missing_session_is_none(made: Made) -> None:
    assert await made.service.get_session(app_name="my_app", user_id="u", session_id="123") is None


@sync
async def test_create_get_delete(made: Made) -> None:
    s = made.service
    session = await s.create_session(app_name="my_app", user_id="u1", state={"key": "value"})
    assert (session.app_name, session.user_id, session.state) == ("my_app", "u1", {"key": "value"})
    assert session.id and session.events == [] and session.last_update_time <= time.time()
    got = await s.get_session(app_name="my_app", user_id="u1", session_id=session.id)
    assert got == session  # timestamps included
    await s.delete_session(app_name="my_app", user_id="u1", session_id=session.id)
    assert await s.get_session(app_name="my_app", user_id="u1", session_id=session.id) is None
    await s.delete_session(app_name="my_app", user_id="u1", session_id=session.id)  # a missing one: no error


@sync
async def test_a_duplicate_id_raises_already_exists(made: Made) -> None:
    s = made.service
    await s.create_session(app_name="my_app", user_id="u1", session_id="dup", state={"keep": "first"})
    with pytest.raises(AlreadyExistsError):
        await s.create_session(app_name="my_app", user_id="u1", session_id="dup", state={"keep": "second"})
    got = await s.get_session(app_name="my_app", user_id="u1", session_id="dup")
    assert got is not None and got.state == {"keep": "first"}


@sync
async def test_the_same_session_id_under_two_users_is_two_sessions(made: Made) -> None:
    s = made.service
    first = await s.create_session(app_name="my_app", user_id="u1", session_id="s1", state={"who": "u1"})
    await s.append_event(first, Event(invocation_id="inv1", author="user"))
    await s.create_session(app_name="my_app", user_id="u2", session_id="s1", state={"who": "u2"})
    second = await s.get_session(app_name="my_app", user_id="u2", session_id="s1")
    assert second is not None and second.user_id == "u2" and second.events == [] and second.state == {"who": "u2"}
    await s.delete_session(app_name="my_app", user_id="u1", session_id="s1")
    assert await s.get_session(app_name="my_app", user_id="u1", session_id="s1") is None
    assert await s.get_session(app_name="my_app", user_id="u2", session_id="s1") is not None


@sync
async def test_list_by_user_and_for_all_users(made: Made) -> None:
    s = made.service
    for user, sid in (("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")):
        await s.create_session(app_name="my_app", user_id=user, session_id=sid, state={"key": "v" + sid})
    await s.create_session(app_name="other_app", user_id="user1", session_id="elsewhere")
    one = (await s.list_sessions(app_name="my_app", user_id="user1")).sessions
    assert {x.id: x.state for x in one} == {"s1a": {"key": "vs1a"}, "s1b": {"key": "vs1b"}}
    assert all(x.events == [] for x in one)
    everyone = (await s.list_sessions(app_name="my_app", user_id=None)).sessions
    assert {(x.user_id, x.id) for x in everyone} == {("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")}
    assert (await s.list_sessions(app_name="my_app", user_id="nobody")).sessions == []
    assert (await s.list_sessions(app_name="no_app")).sessions == []


@sync
async def test_list_is_least_recently_updated_first(made: Made) -> None:
    s = made.service
    for sid in ("a", "b", "c"):
        await s.create_session(app_name="my_app", user_id="u", session_id=sid)
    a = await s.get_session(app_name="my_app", user_id="u", session_id="a")
    assert a is not None
    await asyncio.sleep(0.01)
    await s.append_event(a, Event(invocation_id="inv", author="user"))
    listed = (await s.list_sessions(app_name="my_app", user_id="u")).sessions
    assert [x.id for x in listed] == ["b", "c", "a"]
    assert listed[-1].last_update_time == a.last_update_time


@sync
async def test_listed_sessions_carry_merged_state_without_temp(made: Made) -> None:
    s = made.service
    session = await s.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state=keyed(app__a="av", user__u="uv", sk="sv", temp__t="tv")
    )
    await s.append_event(session, Event(invocation_id="inv1", author="user", actions=delta(sk2="sv2")))
    (listed,) = (await s.list_sessions(app_name="my_app", user_id="u1")).sessions
    assert listed.events == []
    assert listed.state == keyed(app__a="av", user__u="uv", sk="sv", sk2="sv2")


# -- GetSessionConfig ---------------------------------------------------------------------------------


@sync
async def test_get_session_config(made: Made) -> None:
    s = made.service
    base = int(time.time())
    session = await s.create_session(app_name="my_app", user_id="u")
    for i in range(1, 6):
        await s.append_event(session, Event(author="user", timestamp=base + i))

    async def stamps(config: GetSessionConfig | None) -> list[float]:
        got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id, config=config)
        assert got is not None
        return [e.timestamp for e in got.events]

    assert await stamps(None) == [base + i for i in range(1, 6)]
    assert await stamps(GetSessionConfig(num_recent_events=0)) == []
    assert await stamps(GetSessionConfig(num_recent_events=3)) == [base + 3, base + 4, base + 5]
    assert await stamps(GetSessionConfig(after_timestamp=base + 4)) == [base + 4, base + 5]  # inclusive
    assert await stamps(GetSessionConfig(after_timestamp=base + 50)) == []
    assert await stamps(GetSessionConfig(num_recent_events=3, after_timestamp=base + 4)) == [base + 4, base + 5]
    zero = await s.get_session(
        app_name="my_app", user_id="u", session_id=session.id, config=GetSessionConfig(num_recent_events=0)
    )
    assert zero is not None and zero.last_update_time == pytest.approx(base + 5)  # state and time, no events


# -- state by scope -----------------------------------------------------------------------------------


@sync
async def test_app_state_is_shared_by_every_user(made: Made) -> None:
    s = made.service
    one = await s.create_session(app_name="my_app", user_id="u1", session_id="s1", state=keyed(app__k1="v1"))
    await s.append_event(one, Event(invocation_id="inv1", author="user", actions=delta(**keyed(app__k2="v2"))))
    two = await s.create_session(app_name="my_app", user_id="u2", session_id="s2")
    assert two.state == keyed(app__k1="v1", app__k2="v2")
    again = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert again is not None and again.state == keyed(app__k1="v1", app__k2="v2")
    other = await s.create_session(app_name="other_app", user_id="u1", session_id="s1")
    assert other.state == {}


@sync
async def test_user_state_is_shared_by_that_users_sessions_only(made: Made) -> None:
    s = made.service
    one = await s.create_session(app_name="my_app", user_id="u1", session_id="s1", state=keyed(user__k1="v1"))
    await s.append_event(one, Event(invocation_id="inv1", author="user", actions=delta(**keyed(user__k2="v2"))))
    sibling = await s.create_session(app_name="my_app", user_id="u1", session_id="s1b")
    assert sibling.state == keyed(user__k1="v1", user__k2="v2")
    stranger = await s.create_session(app_name="my_app", user_id="u2", session_id="s2")
    assert stranger.state == {}


@sync
async def test_session_state_is_not_shared(made: Made) -> None:
    s = made.service
    one = await s.create_session(app_name="my_app", user_id="u1", session_id="s1", state={"sk1": "v1"})
    await s.append_event(one, Event(invocation_id="inv1", author="user", actions=delta(sk2="v2")))
    again = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert again is not None and again.state == {"sk1": "v1", "sk2": "v2"}
    assert (await s.create_session(app_name="my_app", user_id="u1", session_id="s1b")).state == {}


@sync
async def test_temp_state_is_in_hand_for_the_invocation_and_never_stored(made: Made) -> None:
    s = made.service
    session = await s.create_session(app_name="my_app", user_id="u1", session_id="s1")
    event = Event(invocation_id="inv1", author="user", actions=delta(**keyed(temp__k1="v1", sk="v2")))
    await s.append_event(session, event)
    assert session.state["temp:k1"] == "v1" and session.state["sk"] == "v2"
    assert "temp:k1" not in event.actions.state_delta
    got = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got is not None and got.state == {"sk": "v2"}
    assert got.events[0].actions.state_delta == {"sk": "v2"}


@sync
async def test_none_in_a_delta_is_stored_not_deleted(made: Made) -> None:
    s = made.service
    one = await s.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state=keyed(flag=True, user__pref="dark", app__cfg=1)
    )
    await s.append_event(
        one,
        Event(invocation_id="inv1", author="user", actions=delta(**keyed(flag=None, user__pref=None, app__cfg=None))),
    )
    got = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got is not None and got.state == keyed(flag=None, user__pref=None, app__cfg=None)
    sibling = await s.create_session(app_name="my_app", user_id="u1", session_id="s1b")
    assert sibling.state == keyed(user__pref=None, app__cfg=None)
    assert one.state == keyed(flag=None, user__pref=None, app__cfg=None)
    assert await s.get_user_state(app_name="my_app", user_id="u1") == {"pref": None}


@sync
async def test_values_that_look_like_the_none_marker_round_trip(made: Made) -> None:
    s = made.service
    tricky = {"flag": dict(NONE), "nested": {"$adk": "dict", "value": 1}, "user:m": dict(NONE)}
    session = await s.create_session(app_name="my_app", user_id="u1", session_id="s1", state=tricky)
    await s.append_event(session, Event(author="user", actions=delta(later=dict(NONE))))
    got = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got is not None and got.state == {**tricky, "later": dict(NONE)}


@sync
async def test_a_dict_in_a_delta_replaces_the_value(made: Made) -> None:
    s = made.service
    session = await s.create_session(
        app_name="my_app", user_id="u1", session_id="s1", state=keyed(profile={"name": "ada", "role": "admin"})
    )
    await s.append_event(session, Event(invocation_id="inv1", author="user", actions=delta(profile={"name": "bob"})))
    got = await s.get_session(app_name="my_app", user_id="u1", session_id="s1")
    assert got is not None and got.state["profile"] == {"name": "bob"} == session.state["profile"]


@sync
async def test_a_value_with_no_json_form_is_stored_as_text(checked: Made) -> None:
    s = checked.service
    session = await s.create_session(app_name="my_app", user_id="u")
    await s.append_event(session, Event(author="user", actions=delta(callback=lambda: 1, ok=2)))
    got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert got is not None and got.state["ok"] == 2 and isinstance(got.state["callback"], str)


@sync
async def test_get_user_state(made: Made) -> None:
    s = made.service
    assert await s.get_user_state(app_name="my_app", user_id="u1") == {}
    session = await s.create_session(app_name="my_app", user_id="u1")
    await s.append_event(session, Event(author="system", actions=delta(**keyed(user__profile={"n": "A"}, sk=1))))
    await s.append_event(session, Event(author="system", actions=delta(**keyed(user__counter=1))))
    await s.append_event(session, Event(author="system", actions=delta(**keyed(user__counter=2))))
    assert await s.get_user_state(app_name="my_app", user_id="u1") == {"profile": {"n": "A"}, "counter": 2}
    assert await s.get_user_state(app_name="my_app", user_id="u2") == {}
    assert await s.get_user_state(app_name="other_app", user_id="u1") == {}


# -- events -------------------------------------------------------------------------------------------


def every_field_event() -> Event:
    return Event(
        invocation_id="invocation",
        author="agent",
        branch="root.sub",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="text"),
                types.Part.from_bytes(data=b"\x00\xffimage", mime_type="image/png"),
                types.Part(function_call=types.FunctionCall(id="c1", name="f", args={"x": [1, None]})),
            ],
        ),
        turn_complete=True,
        partial=False,
        actions=EventActions(
            state_delta={"sk": "v", "user:uk": 1},
            artifact_delta={"file": 0},
            transfer_to_agent="other",
            escalate=True,
            skip_summarization=True,
            requested_tool_confirmations={"c1": ToolConfirmation(hint="ok?", confirmed=False, payload={"a": 1})},
        ),
        long_running_tool_ids={"c1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(
            web_search_queries=["q"], search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob")
        ),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1_700_000_000.123,
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=True),
    )


@sync
async def test_an_event_round_trips_every_field_and_the_reload_equals_the_session_in_hand(made: Made) -> None:
    s = made.service
    session = await s.create_session(app_name="my_app", user_id="u", state={"start": 1})
    event = every_field_event()
    await s.append_event(session, event)
    await s.append_event(session, Event(author="user", timestamp=1_700_000_001.5, actions=delta(after=None)))
    got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert got is not None
    assert got.events[0] == event
    assert got == session
    assert got.last_update_time == session.last_update_time == 1_700_000_001.5


@sync
async def test_the_update_time_is_the_last_events_timestamp(made: Made) -> None:
    s = made.service
    session = await s.create_session(app_name="my_app", user_id="u")
    created = session.last_update_time
    await s.append_event(session, Event(invocation_id="i", author="user", timestamp=created + 10))
    assert session.last_update_time == pytest.approx(created + 10, abs=1e-6)
    got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert got is not None and got.last_update_time == pytest.approx(created + 10, abs=1e-6)


@sync
async def test_partial_events_are_not_stored(made: Made) -> None:
    s = made.service
    session = await s.create_session(app_name="my_app", user_id="u")
    await s.append_event(session, Event(author="user", partial=True))
    got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert session.events == [] and got is not None and got.events == []


@sync
async def test_appending_to_an_unknown_or_deleted_session_raises_not_found(made: Made) -> None:
    s = made.service
    with pytest.raises(SessionNotFoundError):
        await s.append_event(Session(app_name="my_app", user_id="u", id="never"), Event(author="user"))
    session = await s.create_session(app_name="my_app", user_id="u")
    await s.delete_session(app_name="my_app", user_id="u", session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await s.append_event(session, Event(invocation_id="inv1", author="user"))


@sync
async def test_a_stale_session_gets_the_stale_error_and_writes_nothing(checked: Made) -> None:
    s = checked.service
    now = time.time()
    original = await s.create_session(app_name="my_app", user_id="u")
    await s.append_event(original, Event(invocation_id="inv1", author="user", timestamp=now + 1, actions=delta(sk1=1)))
    fresh = await s.get_session(app_name="my_app", user_id="u", session_id=original.id)
    assert fresh is not None
    await s.append_event(fresh, Event(invocation_id="inv2", author="user", timestamp=now + 2, actions=delta(sk2=2)))
    with pytest.raises(StaleSessionError, match="modified in storage") as caught:
        await s.append_event(
            original,
            Event(invocation_id="inv3", author="user", timestamp=now + 3, actions=delta(**keyed(sk3=3, user__u=3))),
        )
    assert isinstance(caught.value, ValueError)
    final = await s.get_session(app_name="my_app", user_id="u", session_id=original.id)
    assert final is not None and [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert final.state == {"sk1": 1, "sk2": 2}
    assert await s.get_user_state(app_name="my_app", user_id="u") == {}


@sync
async def test_two_stale_copies_racing_one_wins(checked: Made) -> None:
    s = checked.service
    session = await s.create_session(app_name="my_app", user_id="u")
    for i in range(4):
        latest = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
        assert latest is not None
        copies = [latest.model_copy(deep=True), latest.model_copy(deep=True)]
        results = await asyncio.gather(
            *(
                s.append_event(c, Event(invocation_id=f"inv{i}-{n}", author="user", actions=delta(**{f"k{i}-{n}": n})))
                for n, c in enumerate(copies)
            ),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["Event", "StaleSessionError"]
    final = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert final is not None and len(final.events) == 4 and len(final.state) == 4


@sync
async def test_a_session_object_without_a_marker_is_checked_against_the_stored_last_event(checked: Made) -> None:
    s = checked.service
    session = await s.create_session(app_name="my_app", user_id="u", session_id="s1")
    await s.append_event(session, Event(invocation_id="inv1", author="user"))
    session._storage_update_marker = None
    await s.append_event(session, Event(invocation_id="inv2", author="user"))  # still current: accepted
    behind = session.model_copy(deep=True)
    await s.append_event(session, Event(invocation_id="inv3", author="user"))
    behind._storage_update_marker = None
    with pytest.raises(StaleSessionError):
        await s.append_event(behind, Event(invocation_id="late", author="user"))
    got = await s.get_session(app_name="my_app", user_id="u", session_id="s1")
    assert got is not None and [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]


@sync
async def test_an_equal_event_delivered_twice_is_stored_once(ours: Made) -> None:
    s = ours.service
    session = await s.create_session(app_name="my_app", user_id="u")
    event = Event(invocation_id="inv", author="user", actions=delta(counter=1))
    await s.append_event(session, event)
    await s.append_event(session, event)
    await s.append_event(session, event.model_copy(deep=True))
    e1, e2 = Event(id="shared", invocation_id="a", author="user"), Event(id="shared", invocation_id="b", author="agent")
    await s.append_event(session, e1)
    await s.append_event(session, e2)  # another event under the same id: both kept, as ADK's in-memory service
    got = await s.get_session(app_name="my_app", user_id="u", session_id=session.id)
    assert got is not None and [e.author for e in got.events] == ["user", "user", "agent"]
    assert got == session


# -- how dormant holds it -----------------------------------------------------------------------------


@sync
async def test_the_ledger_holds_each_adk_event_whole_and_its_state_by_scope(ours: Made) -> None:
    s = ours.service
    session = await s.create_session(app_name="my_app", user_id="ada", session_id="s1", state=keyed(app__a=1))
    event = Event(
        invocation_id="inv", author="agent", actions=delta(**keyed(sk=1, user__uk=None, app__ak=3, temp__t=4))
    )
    await s.append_event(session, event)
    loaded = ours.store.load("my_app", session_key("ada", "s1"))
    assert loaded.row.scopes == {"user": "ada"}
    kinds = [(e.type, getattr(e, "scope", None)) for e in loaded.events]
    assert kinds == [
        ("state_change", "app"),
        ("adk_event", None),
        ("state_change", "session"),
        ("state_change", "user"),
        ("state_change", "app"),
    ]
    adk = loaded.events[1]
    assert isinstance(adk, AdkEvent) and Event.model_validate(adk.event) == event and adk.invocation_id == "inv"
    changes = [e for e in loaded.events if isinstance(e, StateChangeEvent)]
    assert [(c.scope, c.scope_id, c.source) for c in changes] == [
        ("app", "app", "direct"),
        ("session", None, "mutation"),
        ("user", "ada", "mutation"),
        ("app", "app", "mutation"),
    ]
    assert changes[2].changes[0].new_value == NONE  # a None is stored, not a deletion
    assert "temp" not in str([e.model_dump() for e in loaded.events])
    assert ours.store.load_scoped_state("my_app", "user", "ada") == {"uk": NONE}
    assert ours.store.load_scoped_state("my_app", "app", "app") == {"a": 1, "ak": 3}


@sync
async def test_ids_outside_dormants_characters_are_escaped_and_round_trip(ours: Made) -> None:
    s = ours.service
    session = await s.create_session(app_name="my_app", user_id="ada lovelace/1", session_id=" id:with=odd/chars ")
    assert session.id == "id:with=odd/chars"  # padded ids are trimmed, as ADK's in-memory service does
    await s.append_event(session, Event(author="user", actions=delta(**keyed(user__k=1))))
    got = await s.get_session(app_name="my_app", user_id="ada lovelace/1", session_id="id:with=odd/chars")
    assert got == session
    (listed,) = (await s.list_sessions(app_name="my_app")).sessions
    assert (listed.user_id, listed.id) == ("ada lovelace/1", "id:with=odd/chars")
    assert await s.get_user_state(app_name="my_app", user_id="ada lovelace/1") == {"k": 1}
    # every stored id is made of characters no URL escapes (the inspector links to sessions by id)
    assert session_key("ada", "s1") == "ada.s1"
    for user, sid in (("ada@example.com", "a+b=c:d"), ("x_41", "_lead"), ("ada lovelace/1", "id:with=odd/chars")):
        key = session_key(user, sid)
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", key), key
    assert session_key("x_41", "s") != session_key("A", "s")  # a plain part never looks escaped


@sync
async def test_an_id_with_an_underscore_is_escaped_so_none_reads_back_as_another(ours: Made) -> None:
    """``x_41`` left as it is would read back as the escaped form of ``A``: an id holding ``_`` is escaped."""
    s = ours.service
    for user, sid in (("x_41", "x_42"), ("A", "B"), ("ada_lovelace", "s_1")):
        await s.create_session(app_name="my_app", user_id=user, session_id=sid, state=keyed(user__who=user))
    listed = sorted((x.user_id, x.id) for x in (await s.list_sessions(app_name="my_app")).sessions)
    assert listed == [("A", "B"), ("ada_lovelace", "s_1"), ("x_41", "x_42")]
    for user in ("x_41", "A", "ada_lovelace"):
        assert await s.get_user_state(app_name="my_app", user_id=user) == {"who": user}
        assert [x.user_id for x in (await s.list_sessions(app_name="my_app", user_id=user)).sessions] == [user]
    assert "_" not in session_key("ada_lovelace", "s_1").replace("x_", "", 2)  # each part escaped whole


def test_a_tenant_holding_the_tenant_separator_is_refused(tmp_path: Path) -> None:
    """``{app}@{tenant}`` is split at its ``@``: a tenant holding one would name another tenant's key space."""
    with closing(sqlite_store(tmp_path / "t.db")) as store:
        with pytest.raises(InvalidSessionId, match="'@'") as refused:
            DormantSessionService(store, tenant="acme@other")
        assert refused.value.field == "tenant"
        assert DormantSessionService(store, tenant="acme").dormant_name("my_app") == "my_app@acme"


@sync
async def test_user_writes_from_two_sessions_of_one_user_are_all_kept(ours: Made) -> None:
    s = ours.service
    first = await s.create_session(app_name="my_app", user_id="u", session_id="a")
    second = await s.create_session(app_name="my_app", user_id="u", session_id="b")
    await asyncio.gather(
        *(
            s.append_event(session, Event(author="user", actions=delta(**{f"user:{session.id}{n}": n})))
            for n in range(5)
            for session in (first, second)
        )
    )
    expected = {f"{sid}{n}": n for n in range(5) for sid in "ab"}
    assert await s.get_user_state(app_name="my_app", user_id="u") == expected
    fresh = await s.create_session(app_name="my_app", user_id="u", session_id="c")
    assert fresh.state == {f"user:{k}": v for k, v in expected.items()}


@sync
async def test_a_service_reads_what_another_service_wrote_since_its_last_read(ours: Made, tmp_path: Path) -> None:
    """Each service keeps the events it parsed; the store stays the truth (another process's writes, a
    session deleted and made again under the same id)."""
    store = ours.store if ours.kind == "dormant-memory" else sqlite_store(tmp_path / "dormant.db")
    mine, theirs = ours.service, DormantSessionService(store)
    try:
        session = await mine.create_session(app_name="my_app", user_id="u", session_id="s1")
        await mine.append_event(session, Event(author="user", invocation_id="a", actions=delta(k=1)))
        first = await mine.get_session(app_name="my_app", user_id="u", session_id="s1")
        assert first is not None and [e.invocation_id for e in first.events] == ["a"]
        first.events.append(Event(author="user", invocation_id="local only"))  # the caller's list, not the kept one
        other = await theirs.get_session(app_name="my_app", user_id="u", session_id="s1")
        assert other is not None
        await theirs.append_event(other, Event(author="agent", invocation_id="b", actions=delta(k=2)))
        again = await mine.get_session(app_name="my_app", user_id="u", session_id="s1")
        assert again is not None and [e.invocation_id for e in again.events] == ["a", "b"] and again.state == {"k": 2}
        assert again == other
        await theirs.delete_session(app_name="my_app", user_id="u", session_id="s1")
        await asyncio.sleep(0.002)
        remade = await theirs.create_session(app_name="my_app", user_id="u", session_id="s1", state={"new": True})
        for n in range(3):
            await theirs.append_event(remade, Event(author="user", invocation_id=f"new{n}"))
        now = await mine.get_session(app_name="my_app", user_id="u", session_id="s1")
        assert now is not None and now == remade and now.state == {"new": True}
    finally:
        if store is not ours.store:
            store.close()


@sync
async def test_changing_a_read_sessions_state_in_place_changes_no_later_read(ours: Made) -> None:
    s = ours.service
    await s.create_session(app_name="my_app", user_id="u", session_id="s1", state={"profile": {"name": "ada"}})
    got = await s.get_session(app_name="my_app", user_id="u", session_id="s1")
    assert got is not None
    got.state["profile"]["name"] = "mallory"  # never appended
    again = await s.get_session(app_name="my_app", user_id="u", session_id="s1")
    assert again is not None and again.state == {"profile": {"name": "ada"}}
