"""Many writers, one session, a real PostgreSQL: OCC must neither lose, double nor reorder an event.

Eight threads sharing one store (and its pool), then four processes with a store each, make 50 commits
apiece to one session, each commit one uniquely-id'd event, retrying on conflict. Afterwards every
version from 2 to 1 + all commits was granted exactly once, every event is stored exactly once, and
each writer's events are in the order it wrote them.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("psycopg")

from dormant.events import UserEvent
from dormant.stores.base import SessionStore, StoredSession
from dormant.stores.postgres import postgres_store

pytestmark = [pytest.mark.backend("postgres"), pytest.mark.slow]

COMMITS = 50
WAIT = 240  # seconds: the bound on every wait for another thread or process
_start: dict[str, Any] = {}  # in a writer process: "barrier", which releases all the writers at once


def _init_writer(barrier: Any) -> None:
    _start["barrier"] = barrier


def _writer_event(writer: int, n: int) -> UserEvent:
    return UserEvent(id=f"w{writer}-{n:03d}", created_at=1_700_000_000_000 + n, text=f"writer {writer}, commit {n}")


def _write_loading(store: SessionStore, row: StoredSession, writer: int) -> tuple[list[int], int]:
    """Each attempt loads the session for its version. Returns the versions granted, and the conflicts met."""
    granted, conflicts = [], 0
    for n in range(COMMITS):
        event = _writer_event(writer, n)
        while True:
            loaded = store.load(row.app_name, row.id)
            assert loaded is not None
            result = store.commit(row, [event], loaded.row.version)
            if result.ok:
                granted.append(result.version)
                break
            conflicts += 1
    return granted, conflicts


def _write_tracking(url: str, app: str, session_id: str, writer: int) -> tuple[list[int], int]:
    """In a process of its own: track the version from commit results (a conflict reports the actual one)."""
    store = postgres_store(url, max_size=1)
    row = StoredSession(id=session_id, app_name=app)
    try:
        assert store.load(app, session_id) is not None  # connected, tables checked: now race
        _start["barrier"].wait(WAIT)
        granted, conflicts = [], 0
        version = 1
        for n in range(COMMITS):
            event = _writer_event(writer, n)
            while True:
                result = store.commit(row, [event], version)
                version = result.version
                if result.ok:
                    granted.append(result.version)
                    break
                conflicts += 1
        return granted, conflicts
    finally:
        store.close()


def _check(store: SessionStore, row: StoredSession, writers: int, outcomes: list[tuple[list[int], int]]) -> None:
    granted = [mine for mine, _ in outcomes]
    assert sum(conflicts for _, conflicts in outcomes) > 0, "the writers never met: nothing was tested"
    total = writers * COMMITS
    versions = sorted(v for mine in granted for v in mine)
    assert versions == list(range(2, 2 + total)), "versions granted with a gap or twice"
    loaded = store.load(row.app_name, row.id)
    assert loaded is not None
    assert loaded.row.version == 1 + total
    ids = [event.id for event in loaded.events]
    assert len(ids) == total and set(ids) == {f"w{w}-{n:03d}" for w in range(writers) for n in range(COMMITS)}
    for w in range(writers):
        assert [i for i in ids if i.startswith(f"w{w}-")] == [f"w{w}-{n:03d}" for n in range(COMMITS)]
    for w, mine in enumerate(granted):
        assert mine == sorted(mine), f"writer {w} was granted versions out of order"


def test_eight_threads_commit_fifty_times_each_to_one_session(postgres_url: str) -> None:
    store = postgres_store(postgres_url, max_size=8)
    row = StoredSession(id="shared", app_name=f"app-{uuid.uuid4().hex[:12]}")
    try:
        assert store.commit(row, [], 0).version == 1
        outcomes: list[tuple[list[int], int]] = [([], 0) for _ in range(8)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(8, timeout=WAIT)

        def run(writer: int) -> None:
            try:
                barrier.wait()
                outcomes[writer] = _write_loading(store, row, writer)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(thread.is_alive() for thread in threads), f"a writer was still running after {WAIT} s"
        assert errors == []
        _check(store, row, 8, outcomes)
    finally:
        store.close()


def test_four_processes_commit_fifty_times_each_to_one_session(postgres_url: str) -> None:
    store = postgres_store(postgres_url)
    row = StoredSession(id="shared", app_name=f"app-{uuid.uuid4().hex[:12]}")
    try:
        assert store.commit(row, [], 0).version == 1
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(4, initializer=_init_writer, initargs=(spawn.Barrier(4),)) as pool:
            work = [(postgres_url, row.app_name, row.id, w) for w in range(4)]
            outcomes = pool.starmap_async(_write_tracking, work).get(WAIT)
        _check(store, row, 4, outcomes)
    finally:
        store.close()
