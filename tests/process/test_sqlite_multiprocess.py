"""Several processes on one SQLite file: optimistic concurrency decides, nothing is lost or doubled.

The count that matters is of versions granted: every version from 2 to 1 + all commits exactly once.
Counting events alone would pass with a broken version check (two writers granted the same version).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from dormant import adk
from dormant.errors import VersionConflict
from dormant.events import UserEvent
from dormant.stores.sqlite import sqlite_store

PROCESSES, COMMITS = 4, 50
WAIT = 240  # seconds: the bound on every wait for another process
_start: dict[str, Any] = {}  # in a committer process: "barrier", which releases all of them at once


def _init(barrier: Any) -> None:
    _start["barrier"] = barrier


def committer(path: str, worker: int) -> tuple[list[int], int]:
    """Commit COMMITS messages to session s-1, reloading and retrying whenever another process won.

    Returns the versions granted to this process, and the conflicts it met.
    """
    app = adk(name="multi", store=sqlite_store(path))
    versions, conflicts = [], 0
    assert app.sessions.get("s-1") is not None  # opened and read: now race
    _start["barrier"].wait(WAIT)
    for n in range(COMMITS):
        while True:
            session = app.sessions.get("s-1")
            assert session is not None
            session.input.message(f"p{worker}-{n}")
            try:
                versions.append(app.sessions.commit(session).version)
                break
            except VersionConflict:
                conflicts += 1
    app.close()
    return versions, conflicts


@pytest.mark.slow
def test_four_processes_times_fifty_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "multi.db")
    adk(name="multi", store=sqlite_store(path)).sessions.create("s-1")
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES, initializer=_init, initargs=(context.Barrier(PROCESSES),)) as pool:
        outcomes = pool.starmap_async(committer, [(path, w) for w in range(PROCESSES)]).get(WAIT)
    assert sum(conflicts for _, conflicts in outcomes) > 0, "the processes never met: nothing was tested"
    versions = sorted(v for vs, _ in outcomes for v in vs)
    assert versions == list(range(2, 2 + PROCESSES * COMMITS))  # contiguous, none granted twice
    for mine, _ in outcomes:
        assert mine == sorted(mine)
    session = adk(name="multi", store=sqlite_store(path)).sessions.get("s-1")
    assert session is not None and session.version == 1 + PROCESSES * COMMITS
    said = [e.text for e in session.events if isinstance(e, UserEvent)]
    assert len(said) == PROCESSES * COMMITS == len(set(said))
    for w in range(PROCESSES):
        assert [t for t in said if t.startswith(f"p{w}-")] == [f"p{w}-{n}" for n in range(COMMITS)]
