"""Several processes on one SQLite file: optimistic concurrency decides, nothing is lost or doubled."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from dormant import adk
from dormant.errors import VersionConflict
from dormant.events import UserEvent
from dormant.stores.sqlite import sqlite_store

PROCESSES, COMMITS = 4, 50


def committer(path: str, worker: int) -> list[int]:
    """Commit COMMITS messages to session s-1, reloading and retrying whenever another process won."""
    app = adk(name="multi", store=sqlite_store(path))
    versions = []
    for n in range(COMMITS):
        while True:
            session = app.sessions.get("s-1")
            assert session is not None
            session.input.message(f"p{worker}-{n}")
            try:
                versions.append(app.sessions.commit(session).version)
                break
            except VersionConflict:
                continue
    app.close()
    return versions


@pytest.mark.slow
def test_four_processes_times_fifty_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "multi.db")
    adk(name="multi", store=sqlite_store(path)).sessions.create("s-1")
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        per_process = pool.starmap(committer, [(path, w) for w in range(PROCESSES)])
    versions = sorted(v for vs in per_process for v in vs)
    assert versions == list(range(2, 2 + PROCESSES * COMMITS))  # contiguous, none granted twice
    session = adk(name="multi", store=sqlite_store(path)).sessions.get("s-1")
    assert session is not None and session.version == 1 + PROCESSES * COMMITS
    said = [e.text for e in session.events if isinstance(e, UserEvent)]
    assert len(said) == PROCESSES * COMMITS == len(set(said))
    for w in range(PROCESSES):
        assert [t for t in said if t.startswith(f"p{w}-")] == [f"p{w}-{n}" for n in range(COMMITS)]
