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
class _Row:
    meta: StoredSession
    events: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The version that stored each event (ascending: ``load(after=)`` bisects it)."""
    ids: set[str] = field(default_factory=set)
    snapshot: StoredSnapshot | None = None


class MemorySessionStore(BaseSessionStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], _Row] = {}
        self._scoped: dict[tuple[str, str, str], dict[str, str]] = {}

    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        with self._lock:
            row = self._sessions.get((app_name, session_id))
            if row is None:
                return None
            return row.meta, row.events[bisect.bisect_right(row.versions, after) :]

    def _write(self, commit: PreparedCommit) -> int | Refused:
        key = (commit.row.app_name, commit.row.id)
        with self._lock:
            row = self._sessions.get(key)
            if row is not None and commit.replaces(row.meta.updated_at):  # an expired session: its id starts afresh
                del self._sessions[key]
                row = None
            stored = row.meta if row is not None else None
            if not commit.admits(stored.version if stored else 0, stored.scopes if stored else None):
                return Refused(stored.version, stored.scopes) if stored else Refused(0)
            if row is None:
                row = self._sessions[key] = _Row(commit.row)
            else:
                row.meta = replace(
                    commit.row,
                    created_at=row.meta.created_at,
                    forked_from=row.meta.forked_from,
                    fork_reason=row.meta.fork_reason,
                    updated_at=max(commit.row.updated_at, row.meta.updated_at),
                )
            fresh = commit.fresh(row.ids)
            row.events += [event.data for event in fresh]
            row.versions += [commit.row.version] * len(fresh)
            row.ids.update(event.id for event in fresh)
            self._merge(commit.row.app_name, commit.scoped)
            return len(fresh)

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        with self._lock:
            row = self._sessions.get((app_name, session_id))
            if row is None or row.meta.version < snapshot.version:
                return False
            if row.snapshot is not None and row.snapshot.version >= snapshot.version:
                return False
            row.snapshot = snapshot
            return True

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        with self._lock:
            row = self._sessions.get((app_name, session_id))
            return row.snapshot if row is not None else None

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
            metas = [
                row.meta
                for (app, _), row in self._sessions.items()
                if app == app_name and (status is None or row.meta.status == status)
            ]
        metas.sort(key=lambda m: (m.updated_at, m.id), reverse=True)
        if after is not None:
            metas = [m for m in metas if (m.updated_at, m.id) < after]
        if limit is not None:
            metas = metas[:limit]
        return [SessionListing(m.id, m.updated_at, m.created_at, m.version, m.status) for m in metas]

    def _running(self, limit: int) -> builtins.list[RunningSession]:
        with self._lock:
            running = [
                RunningSession(app, sid, row.meta.updated_at)
                for (app, sid), row in self._sessions.items()
                if row.meta.status == RUNNING_STATUS
            ]
        running.sort(key=lambda r: (r.updated_at, r.app_name, r.session_id))
        return running[:limit]

    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        with self._lock:
            waiting = [
                RunningSession(app, sid, row.meta.updated_at, row.meta.status)
                for (app, sid), row in self._sessions.items()
                if row.meta.status in WAITING_STATUSES
            ]
        waiting.sort(key=lambda r: (r.updated_at, r.app_name, r.session_id))
        return waiting[:limit]

    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        with self._lock:
            return sorted(
                sid
                for (app, sid), row in self._sessions.items()
                if app == app_name and row.meta.scopes.get(scope) == scope_id
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
