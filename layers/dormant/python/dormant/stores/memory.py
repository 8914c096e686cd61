"""The in-memory store: the default, and a faithful stand-in for the others in tests.

It keeps events and scoped values encoded, exactly as the SQL stores do, so a value that would not
survive a real store does not survive this one either; one lock makes each call atomic across threads.
"""

from __future__ import annotations

import bisect
import builtins
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .base import (
    RUNNING_STATUS,
    WAITING_STATUSES,
    BaseSessionStore,
    PreparedCommit,
    Refused,
    RunningSession,
    ScopedWrite,
    SessionListing,
    StoredSession,
    StoredSnapshot,
)

__all__ = ["MemorySessionStore", "in_memory_store"]


@dataclass
class _Entry:
    """What the store keeps of one session: its row, its events, and its snapshot."""

    row: StoredSession
    events: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The version that stored each event (ascending: ``load(after=)`` bisects it)."""
    ids: set[str] = field(default_factory=set)
    snapshot: StoredSnapshot | None = None
    due: int | None = None
    """While it waits: when the sweeper is next to look at it (``set_due``; from each commit, its time)."""


class MemorySessionStore(BaseSessionStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], _Entry] = {}
        self._scoped: dict[tuple[str, str, str], dict[str, str]] = {}

    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        with self._lock:
            entry = self._sessions.get((app_name, session_id))
            if entry is None:
                return None
            return entry.row, entry.events[bisect.bisect_right(entry.versions, after) :]

    def _write(self, commit: PreparedCommit) -> int | Refused:
        key = (commit.row.app_name, commit.row.id)
        with self._lock:
            entry = self._sessions.get(key)
            if entry is not None and commit.replaces(entry.row.updated_at):  # an expired session: its id starts afresh
                del self._sessions[key]
                entry = None
            row = entry.row if entry is not None else None
            if not commit.admits(row.version if row else 0, row.scopes if row else None):
                return Refused(row.version, row.scopes) if row else Refused(0)
            if entry is None:
                entry = self._sessions[key] = _Entry(commit.row)
            else:
                entry.row = replace(
                    commit.row,
                    created_at=entry.row.created_at,
                    forked_from=entry.row.forked_from,
                    fork_reason=entry.row.fork_reason,
                    updated_at=max(commit.row.updated_at, entry.row.updated_at),
                )
            entry.due = entry.row.updated_at if entry.row.status in WAITING_STATUSES else None
            fresh = commit.fresh(entry.ids)
            entry.events += [event.data for event in fresh]
            entry.versions += [commit.row.version] * len(fresh)
            entry.ids.update(event.id for event in fresh)
            self._merge(commit.row.app_name, commit.scoped)
            return len(fresh)

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        with self._lock:
            entry = self._sessions.get((app_name, session_id))
            if entry is None or entry.row.version < snapshot.version:
                return False
            if entry.snapshot is not None and entry.snapshot.version >= snapshot.version:
                return False
            entry.snapshot = snapshot
            return True

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        with self._lock:
            entry = self._sessions.get((app_name, session_id))
            return entry.snapshot if entry is not None else None

    def _save_scoped(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        with self._lock:
            self._merge(app_name, writes)

    def _load_scoped(self, app_name: str, scope: str, scope_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._scoped.get((app_name, scope, scope_id), {}))

    def _delete(self, app_name: str, session_id: str) -> None:
        with self._lock:
            self._sessions.pop((app_name, session_id), None)

    def _list(
        self, app_name: str, limit: int | None, after: tuple[int, str] | None, status: str | None
    ) -> builtins.list[SessionListing]:
        with self._lock:
            rows = [
                entry.row
                for (app, _), entry in self._sessions.items()
                if app == app_name and (status is None or entry.row.status == status)
            ]
        rows.sort(key=lambda r: (r.updated_at, r.id), reverse=True)
        if after is not None:
            rows = [r for r in rows if (r.updated_at, r.id) < after]
        if limit is not None:
            rows = rows[:limit]
        return [SessionListing(r.id, r.updated_at, r.created_at, r.version, r.status) for r in rows]

    def _running(self, limit: int) -> builtins.list[RunningSession]:
        with self._lock:
            running = [
                RunningSession(app, sid, entry.row.updated_at)
                for (app, sid), entry in self._sessions.items()
                if entry.row.status == RUNNING_STATUS
            ]
        running.sort(key=lambda r: (r.updated_at, r.app_name, r.session_id))
        return running[:limit]

    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        with self._lock:
            waiting = [
                RunningSession(app, sid, entry.row.updated_at, entry.row.status)
                for (app, sid), entry in self._sessions.items()
                if entry.row.status in WAITING_STATUSES
            ]
        waiting.sort(key=lambda r: (r.updated_at, r.app_name, r.session_id))
        return waiting[:limit]

    def _due(self, before: int, limit: int, after: RunningSession | None) -> builtins.list[RunningSession]:
        start = (-1, "", "") if after is None else (after.due_at or 0, after.app_name, after.session_id)
        with self._lock:
            due = [
                RunningSession(app, sid, entry.row.updated_at, entry.row.status or "", entry.due, entry.row.version)
                for (app, sid), entry in self._sessions.items()
                if entry.due is not None and entry.due <= before and (entry.due, app, sid) > start
            ]
        due.sort(key=lambda r: (r.due_at or 0, r.app_name, r.session_id))
        return due[:limit]

    def _set_due(
        self, app_name: str, session_id: str, version: int, due_at: int, writes: Sequence[ScopedWrite] = ()
    ) -> bool:
        with self._lock:
            entry = self._sessions.get((app_name, session_id))
            if entry is None or entry.due is None or entry.row.version != version:
                return False
            entry.due = due_at
            self._merge(app_name, writes)
            return True

    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        with self._lock:
            return sorted(
                sid
                for (app, sid), entry in self._sessions.items()
                if app == app_name and entry.row.scopes.get(scope) == scope_id
            )

    def _app_names(self, prefix: str) -> builtins.list[str]:
        with self._lock:
            return sorted({app for app, _ in self._sessions if app.startswith(prefix)})

    def _close(self) -> None:
        """Nothing to release: the data goes with the object."""

    def _merge(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        for write in writes:
            target = self._scoped.setdefault((app_name, write.scope, write.scope_id), {})
            if write.value is None:
                target.pop(write.key, None)
            else:
                target[write.key] = write.value


def in_memory_store() -> MemorySessionStore:
    """A store held in this process's memory: gone when the process exits."""
    return MemorySessionStore()
