"""The in-memory store: the default, and a faithful stand-in for the others in tests.

It keeps events and scoped values as JSON text, exactly as the SQL stores do, so a value that would not
survive a real store does not survive this one either; one lock makes each call atomic across threads.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import StoreClosed
from ..events import Event
from ..ids import check_id, now_ms
from .base import (
    CommitResult,
    LoadedSession,
    ScopedStateChange,
    SessionListing,
    StoredSession,
    check_commit,
    decode_cursor,
    encode_values,
    event_from_json,
    event_to_json,
    merge_scoped_changes,
    unique_new,
)

__all__ = ["MemorySessionStore", "in_memory_store"]


@dataclass
class _Row:
    meta: StoredSession
    events: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)


class MemorySessionStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], _Row] = {}
        self._scoped: dict[tuple[str, str, str], dict[str, str]] = {}
        self._closed = False

    def load(self, app_name: str, session_id: str) -> LoadedSession | None:
        with self._lock:
            self._check_open()
            row = self._sessions.get((app_name, session_id))
            if row is None:
                return None
            meta, events = row.meta, list(row.events)
        return LoadedSession(meta, [event_from_json(e) for e in events])

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        check_commit(session, new_events, expected_version)
        grouped = merge_scoped_changes(scoped_changes)
        encoded_scoped = {target: encode_values(values) for target, values in grouped.items()}
        with self._lock:
            self._check_open()
            key = (session.app_name, session.id)
            row = self._sessions.get(key)
            actual = row.meta.version if row is not None else 0
            if actual != expected_version:
                return CommitResult(ok=False, version=actual, appended=0)
            fresh = unique_new(new_events, row.ids if row is not None else frozenset())
            encoded = [event_to_json(e) for e in fresh]
            now = now_ms()
            if row is None:
                row = _Row(replace(session, version=0, created_at=session.created_at or now))
                self._sessions[key] = row
            row.events.extend(encoded)
            row.ids.update(e.id for e in fresh)
            row.meta = replace(
                row.meta,
                version=expected_version + 1,
                scopes=dict(session.scopes),
                status=session.status,
                updated_at=max(now, row.meta.updated_at),
            )
            for (scope, scope_id), values in encoded_scoped.items():
                self._merge(session.app_name, scope, scope_id, values)
            return CommitResult(ok=True, version=row.meta.version, appended=len(fresh))

    def delete(self, app_name: str, session_id: str) -> None:
        with self._lock:
            self._check_open()
            self._sessions.pop((app_name, session_id), None)

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        with self._lock:
            self._check_open()
            values = dict(self._scoped.get((app_name, scope, scope_id), {}))
        return {key: json.loads(value) for key, value in values.items()}

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None:
        check_id(scope_id, "scope id")
        encoded = encode_values(state)
        with self._lock:
            self._check_open()
            self._merge(app_name, scope, scope_id, encoded)

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> builtins.list[SessionListing]:
        after = decode_cursor(cursor) if cursor else None
        with self._lock:
            self._check_open()
            metas = [row.meta for (app, _), row in self._sessions.items() if app == app_name]
        metas.sort(key=lambda m: (m.updated_at, m.id), reverse=True)
        if after is not None:
            metas = [m for m in metas if (m.updated_at, m.id) < after]
        if limit is not None:
            metas = metas[:limit]
        return [SessionListing(m.id, m.updated_at, m.created_at, m.version, m.status) for m in metas]

    def close(self) -> None:
        self._closed = True

    def _merge(self, app_name: str, scope: str, scope_id: str, values: Mapping[str, str | None]) -> None:
        target = self._scoped.setdefault((app_name, scope, scope_id), {})
        for key, value in values.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("this store was closed")


def in_memory_store() -> MemorySessionStore:
    """A store held in this process's memory: gone when the process exits."""
    return MemorySessionStore()
