"""A session's commit bookkeeping: which of its events are stored, the row a commit writes, the shared-scope writes
it carries, and what a commit path records once the store said yes (``mark_committed``).

``Session`` is a ``CommittedLedger``; ``dormant.app`` (``app.sessions.commit``), ``dormant.writes`` and
``dormant.snapshots`` read and record through the methods here (``snapshot_at``: the events the latest snapshot this
session knows of covers, kept by ``dormant.snapshots``).
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

from .events import Event
from .lazy_ledger import HasStore, LazyLedger
from .projection import Projection
from .state.schema import Schema
from .stores.base import ScopedStateChange, StoredSession

__all__ = ["CommittedLedger"]


class _App(HasStore, Protocol):
    """What the bookkeeping needs of the app: its schema (a value's stored form) and its retention."""

    @property
    def schema(self) -> Schema: ...

    @property
    def retention_ms(self) -> int | None: ...


class CommittedLedger(LazyLedger):
    """The commit bookkeeping of a ledger, which a session loads lazily (``Session`` sets the attributes below)."""

    id: str
    app_name: str
    version: int
    scopes: dict[str, str]
    created_at: int
    forked_from: str | None
    fork_reason: str | None
    snapshot_at: int
    """Events covered by the latest snapshot this session knows of (``dormant.snapshots`` keeps it)."""
    _runtime: _App
    _projection: Projection
    _writes: dict[tuple[str, str], dict[str, Any]]
    """Shared-scope writes not yet committed, kept as they are appended: (scope, scope id) -> key -> value."""

    @property
    def uncommitted_events(self) -> list[Event]:
        return self._events[self._committed - self._base :]

    @property
    def committed_count(self) -> int:
        """How many events (from the start of the ledger) this session knows to be stored."""
        return self._committed

    @property
    def committed_events(self) -> list[Event]:
        """The events this session knows to be stored (fetched first on a session loaded from a snapshot)."""
        return self.events[: self._committed]

    def scoped_changes(self) -> list[ScopedStateChange]:
        """The shared-scope writes of the uncommitted events, one per key (the last write wins)."""
        schema = self._runtime.schema
        return [
            ScopedStateChange(scope, scope_id, key, schema[scope].stored_form(value) if scope in schema else value)
            for (scope, scope_id), writes in self._writes.items()
            for key, value in writes.items()
        ]

    def row(self) -> StoredSession:
        """This session's row, as a commit stores it (``Session.from_row`` builds a session from one)."""
        return StoredSession(
            id=self.id,
            app_name=self.app_name,
            version=self.version,
            scopes=dict(self.scopes),
            created_at=self.created_at,
            status=self._projection.status,
            forked_from=self.forked_from,
            fork_reason=self.fork_reason,
            retention_ms=self._runtime.retention_ms,
        )

    def stored(self) -> StoredSession:
        """Deprecated in 0.2 (``docs/concepts.md``): ``row()``; 0.3 drops it."""
        warnings.warn(
            "Session.stored() is deprecated: use Session.row() (docs/concepts.md)", DeprecationWarning, stacklevel=2
        )
        return self.row()

    def mark_committed(self, version: int) -> None:
        """Every event is now stored, at ``version`` (a commit path calls this once the store said yes)."""
        self.version = version
        self._committed = self._base + len(self._events)
        self._writes = {}
        self.note_anchors([(version, self._committed)])
