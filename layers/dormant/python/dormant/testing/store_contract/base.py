"""What every part of the store contract stands on: the store under test, fresh app ids, stored rows, events."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from ...events import (
    Event,
    UserEvent,
)
from ...stores.base import (
    LimitedStore,
    ScopedStateChange,
    SessionStore,
    SnapshotStore,
    StoredSession,
    StoreLimits,
)

WAIT = 120  # seconds: the bound on every wait for another thread, never reached when the store is right


def _event(n: int | str, text: str | None = None) -> UserEvent:
    return UserEvent(
        id=f"evt-{n}",
        created_at=1_700_000_000_000 + (n if isinstance(n, int) else 0),
        text=f"message {n}" if text is None else text,
    )


class _Owner(BaseModel):
    """The user scope of the tenant test's apps: which app wrote it."""

    owner: str = ""


def _ids(events: Sequence[Event]) -> list[str]:
    return [e.id for e in events]


class ContractBase:
    """The store under test (``make_store``, ``make_peer``), its fixtures and the helpers the topics share."""

    def make_store(self) -> SessionStore:
        raise NotImplementedError("a StoreContract subclass builds its store in make_store()")

    def make_peer(self, store: SessionStore) -> SessionStore:
        """Another handle on the same storage as ``store``; by default, the same object."""
        return store

    # -- fixtures and helpers ---------------------------------------------------------------

    @pytest.fixture
    def store(self) -> Iterator[SessionStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def app(self) -> str:
        return f"app-{uuid.uuid4().hex[:12]}"

    @staticmethod
    def row(app: str, session_id: str | None = None, version: int = 0, **extra: Any) -> StoredSession:
        """A session's row to commit (a fresh id unless ``session_id``)."""
        return StoredSession(
            id=session_id or f"s-{uuid.uuid4().hex[:12]}",
            app_name=app,
            version=version,
            created_at=1_700_000_000_000,
            **extra,
        )

    @classmethod
    def meta(cls, app: str, session_id: str | None = None, version: int = 0, **extra: Any) -> StoredSession:
        """Deprecated in 0.2 (``docs/concepts.md``): ``row``; 0.3 drops it."""
        warnings.warn(
            "StoreContract.meta is deprecated: use StoreContract.row (docs/concepts.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls.row(app, session_id, version, **extra)

    def seed(self, store: SessionStore, app: str, scope: str, scope_id: str, values: dict[str, Any]) -> None:
        """Write scoped values the way the runtime does: riding on a commit (of a session of their own)."""
        changes = [ScopedStateChange(scope, scope_id, key, value) for key, value in values.items()]
        assert store.commit(self.row(app), [], 0, changes).ok

    @staticmethod
    def limits(store: SessionStore) -> StoreLimits:
        """The store's declared limits (``LimitedStore``); a store that declares none is held to the defaults."""
        return store.limits if isinstance(store, LimitedStore) else StoreLimits()

    def snapshots_of(self, store: SessionStore) -> SnapshotStore:
        """The store as a ``SnapshotStore``; a store that keeps no snapshots reports these tests skipped."""
        if not isinstance(store, SnapshotStore):
            pytest.skip("this store has no snapshots (loads read the whole ledger)")
        return store
