"""The compliance suite for the stores that need no server (Postgres and DynamoDB have modules of their own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dormant import in_memory_store
from dormant.stores.base import ErasableStore, LimitedStore, SessionStore, SnapshotStore
from dormant.stores.sqlite import sqlite_store
from dormant.testing import StoreContract
from tests.support.wrapped_stores import SixMethods


class TestInMemoryStore(StoreContract):
    def make_store(self) -> SessionStore:
        return in_memory_store()


class TestSQLiteFileStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "nested" / "dir" / "sessions.db"

    def make_store(self) -> SessionStore:
        return sqlite_store(self.path)

    def make_peer(self, store: SessionStore) -> SessionStore:
        return sqlite_store(self.path)  # a second connection on the same file


class TestAStoreOfTheUsersOwn(StoreContract):
    """The suite on a store that offers the six methods alone: the limits it declares none of are the defaults
    (``LimitedStore``), the binding tests are skipped by design (``ErasableStore``), everything else runs."""

    def make_store(self) -> SessionStore:
        store = SixMethods()
        assert isinstance(store, SessionStore) and not isinstance(store, LimitedStore | ErasableStore)
        return store


def test_the_built_in_stores_offer_every_capability(tmp_path: Path) -> None:
    for store in (in_memory_store(), sqlite_store(tmp_path / "caps.db")):
        assert all(isinstance(store, kind) for kind in (SessionStore, LimitedStore, ErasableStore, SnapshotStore))
        store.close()


class TestSQLiteMemoryStore(StoreContract):
    def make_store(self) -> SessionStore:
        return sqlite_store(":memory:")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_commit_of_exactly_the_byte_limit_is_stored_and_one_byte_more_is_refused(kind: str, tmp_path: Path) -> None:
    """The byte limit is inclusive (``CommitTooLarge`` only past it): limits small enough to reach in a test."""
    from dormant.errors import CommitTooLarge
    from dormant.events import UserEvent
    from dormant.stores.base import StoredSession, StoreLimits
    from dormant.stores.memory import MemorySessionStore
    from dormant.stores.sqlite import SQLiteSessionStore

    events = [UserEvent(id=f"evt-{n}", created_at=1_700_000_000_000, text="x" * (100 + n)) for n in range(3)]
    total = sum(len(event.model_dump_json().encode()) for event in events)

    def store(limit: int) -> SessionStore:
        base: type[MemorySessionStore] | type[SQLiteSessionStore] = (
            MemorySessionStore if kind == "memory" else SQLiteSessionStore
        )
        limited = type("Limited", (base,), {"limits": StoreLimits(max_commit_bytes=limit)})
        return limited() if kind == "memory" else limited(tmp_path / f"{limit}.db")  # type: ignore[no-any-return]

    row = StoredSession(id="s-1", app_name="app", created_at=1)
    exact = store(total)
    assert exact.commit(row, events, 0).ok
    loaded = exact.load("app", "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == [e.id for e in events]
    short = store(total - 1)
    with pytest.raises(CommitTooLarge) as caught:
        short.commit(row, events, 0)
    assert (caught.value.size, caught.value.limit) == (total, total - 1)
    assert short.load("app", "s-1") is None


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_load_encoded_is_load_before_decoding(kind: str, tmp_path: Path) -> None:
    """``load_encoded`` hands back what ``load`` decodes: the row and each event's stored text, after a version."""
    from dormant.events import UserEvent
    from dormant.stores.base import BaseSessionStore, StoredSession

    store = in_memory_store() if kind == "memory" else sqlite_store(tmp_path / "e.db")
    assert isinstance(store, BaseSessionStore)
    row = StoredSession(id="s", app_name="a", scopes={}, created_at=1)
    assert store.commit(row, [UserEvent(text="one")], 0).ok
    assert store.commit(row, [UserEvent(text="two"), UserEvent(text="three")], 1).ok
    for after in (None, 1, 2):
        loaded, encoded = store.load("a", "s", after=after), store.load_encoded("a", "s", after=after)
        assert loaded is not None and encoded is not None
        assert encoded[0] == loaded.row and [store.decode_event(t) for t in encoded[1]] == loaded.events
    assert store.load_encoded("a", "missing") is None
    store.close()
