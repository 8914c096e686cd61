"""``DormantSaver``'s commits: the writes LangGraph sends from several threads at once share one commit, each
call returning only once its own events are stored; a commit that fails fails every write queued on it (nothing
of them stored); a step's task writes wait briefly for the checkpoint that follows them."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="the LangGraph bridge needs langgraph (dormant[langgraph])")
pytestmark = pytest.mark.backend("langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402

from dormant.bridges import langgraph as bridge  # noqa: E402
from dormant.bridges.langgraph import DormantSaver, ThreadChanged  # noqa: E402
from dormant.stores.base import SessionStore  # noqa: E402
from dormant.stores.memory import in_memory_store  # noqa: E402


class _Counted:
    """A store whose commits are counted, and held while ``hold`` is set (a slow network)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.commits: list[list[str]] = []
        self.hold: threading.Event | None = None
        self.held = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit(self, session: Any, events: Any, expected: int, *args: Any, **kwargs: Any) -> Any:
        if self.hold is not None:
            hold, self.hold = self.hold, None
            self.held.set()
            assert hold.wait(10)
        self.commits.append([e.kind for e in events])
        return self.store.commit(session, events, expected, *args, **kwargs)


def _put(saver: DormantSaver, parent: RunnableConfig | None, value: int) -> RunnableConfig:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=-1))
    checkpoint["channel_values"] = {"n": value}
    checkpoint["channel_versions"] = {"n": saver.get_next_version(None, None)}
    config: RunnableConfig = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"source": "loop", "step": value}, checkpoint["channel_versions"])


def _started(target: Any, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker


def _queued(saver: DormantSaver, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(saver._queued.get("t", [])) < count:
        assert time.monotonic() < deadline, "the writes were never queued"
        time.sleep(0.005)


def test_writes_arriving_while_a_commit_is_under_way_share_the_next_commit() -> None:
    store = _Counted(in_memory_store())
    saver = DormantSaver(store)  # type: ignore[arg-type]
    first = _put(saver, None, 0)
    errors: list[BaseException] = []
    store.hold = threading.Event()
    release = store.hold
    workers = [_started(lambda: saver.put_writes(first, [("n", 1)], "a"), errors)]
    assert store.held.wait(10)  # a's commit is under way
    workers += [_started(lambda t=t: saver.put_writes(first, [("n", 2)], t), errors) for t in ("b", "c")]
    _queued(saver, 2)
    workers.append(_started(lambda: _put(saver, first, 3), errors))
    _queued(saver, 3)
    release.set()
    for worker in workers:
        worker.join(10)
    assert not errors
    assert len(store.commits) == 3  # the first checkpoint; a's writes; b's, c's and the next checkpoint together
    assert sorted(store.commits[2]) == ["checkpoint", "writes", "writes"]  # the new value inside the checkpoint's
    fresh = DormantSaver(store.store)
    stored = fresh.get_tuple(first)
    assert stored is not None and sorted(task for task, _, _ in stored.pending_writes or []) == ["a", "b", "c"]
    latest = fresh.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None and latest.checkpoint["channel_values"] == {"n": 3}


def test_a_commit_that_fails_fails_every_write_queued_on_it_and_stores_none_of_them() -> None:
    store = _Counted(in_memory_store())
    saver = DormantSaver(store)  # type: ignore[arg-type]
    first = _put(saver, None, 0)
    errors: list[BaseException] = []
    store.hold = threading.Event()
    release = store.hold
    workers = [_started(lambda: saver.put_writes(first, [("n", 1)], "a"), errors)]
    assert store.held.wait(10)
    workers += [_started(lambda t=t: saver.put_writes(first, [("n", 2)], t), errors) for t in ("b", "c")]
    _queued(saver, 2)
    DormantSaver(store.store).put_writes(first, [("n", 9)], "other")  # another process, meanwhile
    release.set()
    for worker in workers:
        worker.join(10)
    assert len(errors) == 3 and all(isinstance(e, ThreadChanged) for e in errors)
    stored = DormantSaver(store.store).get_tuple(first)
    assert stored is not None and [task for task, _, _ in stored.pending_writes or []] == ["other"]
    saver.put_writes(first, [("n", 1)], "a")  # read again, the saver writes on top of it
    again = saver.get_tuple(first)
    assert again is not None and sorted(task for task, _, _ in again.pending_writes or []) == ["a", "other"]


def test_a_steps_task_writes_wait_for_the_checkpoint_that_follows_them(monkeypatch: Any) -> None:
    monkeypatch.setattr(bridge, "LINGER_SECONDS", 5.0)
    store = _Counted(in_memory_store())
    saver = DormantSaver(store)  # type: ignore[arg-type]
    first = _put(saver, None, 0)
    saver._commit_seconds = 20.0  # a slow store: half a commit is worth waiting for
    errors: list[BaseException] = []
    started = time.monotonic()
    writer = _started(lambda: saver.put_writes(first, [("n", 1)], "a"), errors)
    _queued(saver, 1)
    time.sleep(0.05)
    _put(saver, first, 1)
    writer.join(10)
    assert not errors and time.monotonic() - started < 4  # the checkpoint ended the wait, not the clock
    assert len(store.commits) == 2 and sorted(store.commits[1]) == ["checkpoint", "writes"]


def test_async_task_writes_do_not_wait_for_a_checkpoint_the_blocked_event_loop_could_not_put(monkeypatch: Any) -> None:
    monkeypatch.setattr(bridge, "LINGER_SECONDS", 5.0)
    store = _Counted(in_memory_store())
    saver = DormantSaver(store)  # type: ignore[arg-type]
    first = _put(saver, None, 0)
    saver._commit_seconds = 20.0
    started = time.monotonic()
    asyncio.run(saver.aput_writes(first, [("n", 1)], "a"))
    assert time.monotonic() - started < 2 and len(store.commits) == 2
