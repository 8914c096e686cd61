"""``DormantSession`` held to what the OpenAI Agents SDK's own sessions do (its docs and ``SQLiteSession``).

Every test runs on the SDK's ``SQLiteSession`` (which proves the expectation is the SDK's real behaviour) and on
``DormantSession`` over dormant's memory and SQLite stores (expectations in our words, none of the SDK's tests).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the Agents SDK bridge needs openai-agents (pip install 'dormant[openai-agents]')")
pytestmark = pytest.mark.backend("openai-agents")

from agents.memory import Session, SessionSettings, SQLiteSession  # noqa: E402

from dormant.bridges.openai_agents import ITEM_PART_CHARS, DormantSession, session_key  # noqa: E402
from dormant.errors import InvalidSessionId  # noqa: E402
from dormant.events import Event, OpenAIAgentsEvent, ToolResultEvent  # noqa: E402
from dormant.stores.base import SessionStore, StoredSession  # noqa: E402
from dormant.stores.memory import in_memory_store  # noqa: E402
from dormant.stores.sqlite import sqlite_store  # noqa: E402

KINDS = ["sdk-sqlite", "dormant-memory", "dormant-sqlite"]


def sync(body: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(body(*args, **kwargs))

    return run


class Sessions:
    """Makes sessions of one kind on one database, so two objects may share a session id."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind, self.tmp = kind, tmp
        self.store: SessionStore | None = None
        if kind == "dormant-memory":
            self.store = in_memory_store()
        elif kind == "dormant-sqlite":
            self.store = sqlite_store(tmp / "dormant.db")
        self.made: list[Any] = []

    def __call__(self, session_id: str, settings: SessionSettings | None = None) -> Session:
        if self.store is None:
            made: Any = SQLiteSession(session_id, str(self.tmp / "sdk.db"), session_settings=settings)
        else:
            made = DormantSession(session_id, self.store, session_settings=settings)
        self.made.append(made)
        return made  # type: ignore[no-any-return]

    def close(self) -> None:
        for made in self.made:
            if isinstance(made, SQLiteSession):
                made.close()
        if self.store is not None:
            self.store.close()


@pytest.fixture(params=KINDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sessions]:
    made = Sessions(request.param, tmp_path)
    yield made
    made.close()


def msg(text: str, role: str = "user") -> Any:
    return {"role": role, "content": text}


def test_it_is_the_sdks_session_protocol() -> None:
    assert isinstance(DormantSession("s", in_memory_store()), Session)


@sync
async def test_items_come_back_whole_in_the_order_they_were_added(sessions: Sessions) -> None:
    s = sessions("conv-1")
    assert await s.get_items() == []
    nested: Any = {
        "type": "function_call",
        "call_id": "c1",
        "name": "lookup",
        "arguments": '{"q": 1}',
        "extra": {"deep": [1, 2.5, None, True, {"k": "v"}]},
    }
    await s.add_items([msg("one"), msg("two", "assistant")])
    await s.add_items([nested])
    await s.add_items([])
    assert await s.get_items() == [msg("one"), msg("two", "assistant"), nested]
    assert await sessions("conv-1").get_items() == [msg("one"), msg("two", "assistant"), nested]  # another object
    assert await sessions("conv-2").get_items() == []  # sessions are apart


@sync
async def test_limit_returns_the_latest_items_in_order(sessions: Sessions) -> None:
    s = sessions("conv-1")
    await s.add_items([msg(str(i)) for i in range(5)])
    assert await s.get_items(limit=2) == [msg("3"), msg("4")]
    assert await s.get_items(limit=1) == [msg("4")]
    assert await s.get_items(limit=10) == [msg(str(i)) for i in range(5)]
    assert await s.get_items(limit=0) == []
    assert await s.get_items(limit=-1) == [msg(str(i)) for i in range(5)]  # negative: all (SQLite's LIMIT -1)
    limited = sessions("conv-1", SessionSettings(limit=3))
    assert await limited.get_items() == [msg("2"), msg("3"), msg("4")]  # the settings' limit by default
    assert await limited.get_items(limit=1) == [msg("4")]  # an explicit limit wins


@sync
async def test_pop_item_removes_the_latest_and_returns_none_when_empty(sessions: Sessions) -> None:
    s = sessions("conv-1")
    assert await s.pop_item() is None
    await s.add_items([msg("a"), msg("b")])
    assert await s.pop_item() == msg("b")
    assert await sessions("conv-1").get_items() == [msg("a")]
    await s.add_items([msg("c")])
    assert await s.get_items() == [msg("a"), msg("c")]
    assert await s.pop_item() == msg("c")
    assert await s.pop_item() == msg("a")
    assert await s.pop_item() is None
    assert await s.get_items() == []


@sync
async def test_clear_session_empties_it_and_it_can_be_used_again(sessions: Sessions) -> None:
    s, other = sessions("conv-1"), sessions("conv-2")
    await s.add_items([msg("a"), msg("b")])
    await other.add_items([msg("kept")])
    await s.clear_session()
    assert await s.get_items() == []
    assert await sessions("conv-1").get_items() == []
    assert await other.get_items() == [msg("kept")]
    await s.add_items([msg("again")])
    assert await sessions("conv-1").get_items() == [msg("again")]


@sync
async def test_a_session_object_sees_what_another_wrote(sessions: Sessions) -> None:
    first, second = sessions("conv-1"), sessions("conv-1")
    await first.add_items([msg("from first")])
    await second.add_items([msg("from second")])  # second never read: appended after first's all the same
    await first.add_items([msg("first again")])
    expected = [msg("from first"), msg("from second"), msg("first again")]
    assert await first.get_items() == expected and await second.get_items() == expected
    assert await second.pop_item() == msg("first again")
    assert await first.get_items() == expected[:2]


@sync
async def test_unicode_items_and_ids(sessions: Sessions) -> None:
    text = "Grüße, 你好, مرحبا, emoji 🧭👩🏽‍🚀, combining e\u0301, zero\u200bwidth"
    s = sessions("sessão/ü 1")
    await s.add_items([msg(text), {"role": "user", "content": [{"type": "input_text", "text": text}]}])
    assert await sessions("sessão/ü 1").get_items() == [
        msg(text),
        {"role": "user", "content": [{"type": "input_text", "text": text}]},
    ]


@sync
async def test_large_items(sessions: Sessions) -> None:
    big = "x" * 300_000  # over a part: stored in pieces, read whole
    huge = "é🧭" * 400_000  # 2.4 MB of UTF-8, over DynamoDB's 400 KB item and dormant's 1 MiB event
    s = sessions("conv-1")
    await s.add_items([msg(big), msg("small")])
    await s.add_items([msg(huge, "assistant")])
    assert await sessions("conv-1").get_items() == [msg(big), msg("small"), msg(huge, "assistant")]
    assert await s.get_items(limit=1) == [msg(huge, "assistant")]
    assert await s.pop_item() == msg(huge, "assistant")
    assert await sessions("conv-1").get_items() == [msg(big), msg("small")]


def test_the_ledger_keeps_each_item_whole_and_the_pop_beside_it() -> None:
    store = in_memory_store()
    s = DormantSession("conv-1", store)
    asyncio.run(s.add_items([msg("a"), msg("b")]))
    asyncio.run(s.pop_item())
    loaded = store.load("openai-agents", "conv-1")
    assert loaded is not None
    events = [e for e in loaded.events if isinstance(e, OpenAIAgentsEvent)]
    assert [(e.kind, e.item) for e in events[:2]] == [("item", msg("a")), ("item", msg("b"))]
    assert events[2].kind == "pop" and events[2].popped == events[1].id
    big = DormantSession("conv-2", store)
    asyncio.run(big.add_items([msg("y" * (ITEM_PART_CHARS + 10))]))
    loaded = store.load("openai-agents", "conv-2")
    assert loaded is not None and [e.kind for e in loaded.events if isinstance(e, OpenAIAgentsEvent)] == [
        "part",
        "part",
        "item",
    ]


def test_a_session_id_is_stored_under_a_key_no_url_escapes() -> None:
    assert session_key("conv-1") == "conv-1"
    assert session_key("a b") == "x_" + b"a b".hex()
    with pytest.raises(InvalidSessionId):
        session_key("")


class _Interleaved:
    """A store whose first commit by the popping object lets another object pop first (two processes, in turn)."""

    def __init__(self, store: SessionStore, before_first: Callable[[], None]) -> None:
        self.store, self.before_first = store, before_first

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.before_first is not None:
            run, self.before_first = self.before_first, None  # type: ignore[assignment]
            run()
        return self.store.commit(*args, **kwargs)


def test_two_pops_at_once_never_pop_one_item_twice() -> None:
    store = in_memory_store()
    asyncio.run(DormantSession("s", store).add_items([msg("a"), msg("b")]))
    popped: list[Any] = []
    other = DormantSession("s", store)

    def other_pops() -> None:  # on a thread of its own, as another process would
        worker = threading.Thread(target=lambda: popped.append(asyncio.run(other.pop_item())))
        worker.start()
        worker.join()

    mine = DormantSession("s", _Interleaved(store, other_pops))
    popped.append(asyncio.run(mine.pop_item()))  # read [a, b], then the other popped b: this pop takes a
    assert popped == [msg("b"), msg("a")]
    assert asyncio.run(DormantSession("s", store).get_items()) == []


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_fresh_read_takes_items_from_the_stored_text_only_when_it_is_an_item_events_whole(
    kind: str, tmp_path: Path
) -> None:
    """A read takes an item's JSON straight from the stored text of an item event as dormant encodes it; an item
    event stored otherwise (with names that need escapes, an extra field) or another event holding such text in
    its payload is read through the store's decoding: each read as its event says."""
    store = in_memory_store() if kind == "memory" else sqlite_store(tmp_path / "d.db")
    asyncio.run(DormantSession("s", store).add_items([msg("plain"), msg('quote " and \\ slash')]))
    loaded = store.load("openai-agents", "s")
    assert loaded is not None
    lookalike = store.encode_event(OpenAIAgentsEvent(kind="item", item=msg("inside")))
    written: list[Event] = [
        OpenAIAgentsEvent(kind="item", item=msg("named"), agent_name='a "quoted", \\ name', invocation_id="i-1"),
        OpenAIAgentsEvent.model_validate({"kind": "item", "item": msg("extra"), "note": "an extra field"}),
        ToolResultEvent(call_id="c", name="t", result={"stored": lookalike, "as": json.loads(lookalike)}),
        OpenAIAgentsEvent(kind="item", item=[1, {"k": None}, "ü"]),
    ]
    row = StoredSession(id="s", app_name="openai-agents", scopes={}, created_at=loaded.row.created_at)
    assert store.commit(row, written, loaded.row.version).ok
    items = asyncio.run(DormantSession("s", store).get_items())
    assert items == [msg("plain"), msg('quote " and \\ slash'), msg("named"), msg("extra"), [1, {"k": None}, "ü"]]
    store.close()
