"""Stores of a user's own, for the capability protocols (``dormant.stores.base``): each forwards to a memory store
and is no ``BaseSessionStore``, so only the protocols can tell what it offers."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from dormant.events import Event
from dormant.stores.base import (
    BaseSessionStore,
    CommitResult,
    LoadedSession,
    RunningSession,
    ScopedStateChange,
    SessionListing,
    StoredSession,
    StoredSnapshot,
)
from dormant.stores.memory import MemorySessionStore


class SixMethods:
    """The ``SessionStore`` protocol's six methods and nothing more: no erasure, no purge across tenants, no
    declared ``limits`` (the memory store under it keeps the default ones)."""

    def __init__(self, inner: BaseSessionStore | None = None) -> None:
        self.inner = inner if inner is not None else MemorySessionStore()

    def load(self, app_name: str, session_id: str, *, after: int | None = None) -> LoadedSession | None:
        return self.inner.load(app_name, session_id, after=after)

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        return self.inner.commit(session, new_events, expected_version, scoped_changes)

    def delete(self, app_name: str, session_id: str) -> None:
        self.inner.delete(app_name, session_id)

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        return self.inner.load_scoped_state(app_name, scope, scope_id)

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None, status: str | None = None
    ) -> builtins.list[SessionListing]:
        return self.inner.list(app_name, limit=limit, cursor=cursor, status=status)

    def close(self) -> None:
        self.inner.close()


class Erasable(SixMethods):
    """The six methods and ``ErasableStore``'s: an erasure and a purge across tenants run on it."""

    def bound_sessions(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        return self.inner.bound_sessions(app_name, scope, scope_id)

    def forget_bound(self, app_name: str, scope: str, scope_id: str) -> None:
        self.inner.forget_bound(app_name, scope, scope_id)

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None:
        self.inner.save_scoped_state(app_name, scope, scope_id, state)

    def scrub(self) -> str | None:
        return self.inner.scrub()

    def app_names(self, prefix: str) -> builtins.list[str] | None:
        return self.inner.app_names(prefix)


class Sweepable(SixMethods):
    """The six methods and ``SweepableStore``'s: the sweeper finds its running and waiting sessions."""

    def running_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]:
        return self.inner.running_sessions(limit)

    def waiting_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]:
        return self.inner.waiting_sessions(limit)


class BindingIndex(SixMethods):
    """The six methods and ``BindingIndexStore``'s, counting the index's reads."""

    bound_reads = 0

    def bound_sessions(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        self.bound_reads += 1
        return self.inner.bound_sessions(app_name, scope, scope_id)


class Snapshots(SixMethods):
    """The six methods and ``SnapshotStore``'s, counting the snapshot reads (the inner store's snapshots)."""

    snapshot_reads = 0

    def save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        return self.inner.save_snapshot(app_name, session_id, snapshot)

    def load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        self.snapshot_reads += 1
        return self.inner.load_snapshot(app_name, session_id)


class SnapshotInCommit(Snapshots):
    """``Snapshots`` and ``SnapshotInCommitStore``'s: a commit keeps the snapshot it is handed (give it a SQL store)."""

    @property
    def snapshots_in_commit(self) -> bool:
        return self.inner.snapshots_in_commit

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
        *,
        snapshot: StoredSnapshot | None = None,
    ) -> CommitResult:
        return self.inner.commit(session, new_events, expected_version, scoped_changes, snapshot=snapshot)


class OneReadSnapshots(Snapshots):
    """``Snapshots`` and ``OneReadSnapshotStore``'s, counting the one-read loads."""

    one_reads = 0

    def load_with_snapshot(self, app_name: str, session_id: str) -> tuple[StoredSnapshot | None, LoadedSession | None]:
        self.one_reads += 1
        return self.inner.load_with_snapshot(app_name, session_id)
