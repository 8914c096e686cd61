"""What ``DormantSaver`` promises beyond LangGraph's conformance suite: a thread is a dormant session whose ledger
grows with what changed, checkpoints past DynamoDB's 400 KB item limit, and a clear error for a stale writer."""

from __future__ import annotations

import operator
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph", reason="the LangGraph bridge needs langgraph (pip install 'dormant[langgraph]')")
pytestmark = pytest.mark.backend("langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from dormant.bridges.langgraph import DormantSaver, ThreadChanged, thread_key  # noqa: E402
from dormant.errors import InputError, InvalidSessionId  # noqa: E402
from dormant.events import LangGraphEvent  # noqa: E402
from dormant.stores.base import SessionStore  # noqa: E402
from dormant.stores.memory import in_memory_store  # noqa: E402
from dormant.stores.sqlite import sqlite_store  # noqa: E402


class Chat(TypedDict):
    profile: str
    turns: Annotated[list[str], operator.add]


def _graph(saver: DormantSaver) -> Any:
    def reply(state: Chat) -> dict[str, list[str]]:
        return {"turns": [f"reply {len(state['turns'])}"]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def _blobs(store: SessionStore, app: str, thread: str) -> list[dict[str, Any]]:
    loaded = store.load(app, thread_key(thread))
    assert loaded is not None
    found: list[dict[str, Any]] = []
    for e in loaded.events:  # a value: a blob event, or one of the values a checkpoint's event holds
        if isinstance(e, LangGraphEvent) and e.kind in ("blob", "checkpoint"):
            found += [dict(e.data)] if e.kind == "blob" else [dict(v) for v in e.data.get("values") or []]  # type: ignore[union-attr,arg-type]
    return found


def test_a_channel_value_that_did_not_change_is_written_once(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "lg.db")
    graph = _graph(DormantSaver(store))
    config = {"configurable": {"thread_id": "t1"}}
    profile = "a long profile " * 2000
    graph.invoke({"profile": profile, "turns": ["hello"]}, config)
    for i in range(5):
        graph.invoke({"turns": [f"message {i}"]}, config)  # profile unchanged: never written again
    channels = [b["channel"] for b in _blobs(store, "langgraph", "t1")]
    assert channels.count("profile") == 1
    assert channels.count("turns") >= 6  # the channel that changed is written at each new version
    state = _graph(DormantSaver(store)).get_state(config)  # a fresh saver reads it all back
    assert state.values["profile"] == profile and state.values["turns"][-1] == "reply 11"
    store.close()


def _put_big(saver: DormantSaver, thread: str, value: str) -> RunnableConfig:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=-1))
    checkpoint["channel_values"] = {"doc": value, "small": 1}
    checkpoint["channel_versions"] = {"doc": saver.get_next_version(None, None), "small": 1}
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"])
    saver.put_writes(stored, [("doc", value)], "task-1")
    return stored


def _big_value() -> str:
    return "".join(f"{i:07d}é🧭" for i in range(180_000))  # about 2.5 MB of UTF-8 (5x DynamoDB's 400 KB item)


def test_a_checkpoint_larger_than_a_dynamodb_item_round_trips(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "lg.db")
    value = _big_value()
    stored = _put_big(DormantSaver(store), "big", value)
    found = DormantSaver(store).get_tuple(stored)
    assert found is not None and found.checkpoint["channel_values"] == {"doc": value, "small": 1}
    assert found.pending_writes == [("task-1", "doc", value)]
    assert len(_blobs(store, "langgraph", "big")) > 2  # the value kept in pieces, each under dormant's event limit
    store.close()


@pytest.mark.backend("dynamodb")
def test_a_checkpoint_larger_than_a_dynamodb_item_round_trips_on_dynamodb(
    dynamodb_endpoint: str, dynamodb_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dormant.stores.url import store_from_url
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    store = store_from_url(f"dynamodb://{dynamodb_table}?endpoint={dynamodb_endpoint}&region={REGION}")
    app = f"lg-{uuid.uuid4().hex[:8]}"
    value = _big_value()
    stored = _put_big(DormantSaver(store, app_name=app), "big", value)
    found = DormantSaver(store, app_name=app).get_tuple(stored)
    assert found is not None and found.checkpoint["channel_values"] == {"doc": value, "small": 1}
    assert found.pending_writes == [("task-1", "doc", value)]
    # and a real graph thread of 200 turns whose state passes 400 KB keeps going, turn after turn
    graph = _graph(DormantSaver(store, app_name=app))
    config: RunnableConfig = {"configurable": {"thread_id": "growing"}}
    graph.invoke({"profile": "p", "turns": ["x" * 2000]}, config)
    for i in range(199):
        graph.invoke({"turns": [f"{i:04d}" + "y" * 2500]}, config)
    state = _graph(DormantSaver(store, app_name=app)).get_state(config)
    assert len(state.values["turns"]) == 400 and state.values["turns"][-2].startswith("0198")
    assert len(str(state.values["turns"])) > 500_000  # past DynamoDB's 400 KB item limit
    store.close()


def test_a_saver_that_read_an_older_version_gets_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "lg.db"
    first, second = DormantSaver(sqlite_store(path)), DormantSaver(sqlite_store(path))  # as two processes
    config = {"configurable": {"thread_id": "t1"}}
    graph_a, graph_b = _graph(first), _graph(second)
    graph_a.invoke({"profile": "p", "turns": ["a0"]}, config)
    seen = graph_b.get_state(config).config  # both have read the thread
    graph_a.invoke({"turns": ["a1"]}, config)  # first writes on
    before = sqlite_store(path).load("langgraph", "t1")
    assert before is not None
    with pytest.raises(ThreadChanged, match="another process wrote it") as raised:
        second.put_writes(seen, [("turns", ["b"])], "task")  # a write of the second, from what it read
    assert raised.value.http_status == 409 and raised.value.actual_version == before.row.version
    after = sqlite_store(path).load("langgraph", "t1")
    assert after is not None and after.row.version == before.row.version  # nothing written
    graph_b.invoke({"turns": ["b1"]}, config)  # a run reads the thread first: the second saver carries on
    assert graph_b.get_state(config).values["turns"][-3:] == ["reply 3", "b1", "reply 5"]


def test_bad_input_is_a_typed_error() -> None:
    saver = DormantSaver(in_memory_store())
    with pytest.raises(InputError, match="thread_id"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(InvalidSessionId):
        thread_key("")
    with pytest.raises(InputError, match="strategy"):
        saver.prune(["t"], strategy="keep_some")
    with pytest.raises(InputError, match="limit"):
        list(saver.list(None, limit=-1))
    assert thread_key("a b/ü") == "x_" + "a b/ü".encode().hex()


def test_a_retried_tasks_writes_are_stored_once() -> None:
    store = in_memory_store()
    saver = DormantSaver(store)
    config: RunnableConfig = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
    saver.put_writes(stored, [("a", 1), ("b", 2)], "task")
    saver.put_writes(stored, [("a", 1), ("b", 2)], "task")  # the same task again: nothing new to store
    saver.put_writes(stored, [("a", 1), ("b", 2), ("c", 3)], "task")  # only the new index is stored
    loaded = store.load("langgraph", "t1")
    assert loaded is not None
    writes = [e.data["writes"] for e in loaded.events if isinstance(e, LangGraphEvent) and e.kind == "writes"]
    assert [[row[1] for row in rows] for rows in writes if isinstance(rows, list)] == [["a", "b"], ["c"]]  # type: ignore[index]
    found = DormantSaver(store).get_tuple(stored)
    assert found is not None and found.pending_writes == [("task", "a", 1), ("task", "b", 2), ("task", "c", 3)]


def test_a_growing_list_is_stored_as_what_was_appended(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "lg.db")
    graph = _graph(DormantSaver(store))
    config: RunnableConfig = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"profile": "p", "turns": ["first " * 200]}, config)
    for i in range(40):
        graph.invoke({"turns": [f"message {i} " * 100]}, config)
    stored = sum(len(str(b["data"])) for b in _blobs(store, "langgraph", "t1") if b["channel"] == "turns")
    state = _graph(DormantSaver(store)).get_state(config)  # a fresh saver joins the pieces back
    final = len(str(state.values["turns"]))
    assert len(state.values["turns"]) == 82 and state.values["turns"][-2] == "message 39 " * 100
    assert stored < 3 * final  # linear in the turns (a whole list at every turn would be about 20x)
    history = list(DormantSaver(store).list(config))  # and every older checkpoint reads its own length
    assert [len(t.checkpoint["channel_values"].get("turns", [])) for t in history][:3] == [82, 81, 80]
    store.close()


def test_a_list_that_changed_otherwise_than_by_appends_is_stored_whole() -> None:
    store = in_memory_store()
    saver = DormantSaver(store)
    parent: RunnableConfig = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    values = [["a" * 900, "b" * 900], ["a" * 900, "b" * 900, "c"], ["z" * 900, "b" * 900, "c", "d"], ["z" * 900]]
    stored = []
    for i, value in enumerate(values):  # appended, then the first element replaced, then shortened
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=-1))
        checkpoint["channel_values"] = {"items": value}
        checkpoint["channel_versions"] = {"items": i + 1}
        parent = saver.put(parent, checkpoint, {"source": "loop", "step": i}, {"items": i + 1})
        stored.append(parent)
    fresh = DormantSaver(store)
    assert [fresh.get_tuple(c).checkpoint["channel_values"]["items"] for c in stored] == values  # type: ignore[union-attr]
    assert (
        len(_blobs(store, "langgraph", "t1")) == 4 and sum("base" in b for b in _blobs(store, "langgraph", "t1")) == 1
    )


def test_an_async_graph_is_interrupted_and_resumed_by_a_fresh_saver(tmp_path: Path) -> None:
    import asyncio

    from langgraph.types import Command, interrupt

    class Ask(TypedDict):
        question: str
        answer: str

    def ask(state: Ask) -> dict[str, str]:
        return {"answer": interrupt(state["question"])}

    builder = StateGraph(Ask)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    config: RunnableConfig = {"configurable": {"thread_id": "async-1"}}
    path = tmp_path / "lg.db"

    async def run() -> tuple[Any, Any]:
        paused = await builder.compile(checkpointer=DormantSaver(sqlite_store(path))).ainvoke(
            {"question": "Which room?", "answer": ""}, config
        )
        resumed = await builder.compile(checkpointer=DormantSaver(sqlite_store(path))).ainvoke(
            Command(resume="B12"), config
        )
        return paused, resumed

    paused, resumed = asyncio.run(run())
    assert paused["__interrupt__"][0].value == "Which room?"
    assert resumed == {"question": "Which room?", "answer": "B12"}

    async def listed() -> list[Any]:
        return [t async for t in DormantSaver(sqlite_store(path)).alist(config, filter={"source": "loop"})]

    assert [t.metadata["source"] for t in asyncio.run(listed())] == ["loop", "loop"]
