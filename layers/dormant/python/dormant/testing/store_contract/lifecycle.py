"""A store's life: expiry, the clock, snapshots (the optional part) and close."""

from __future__ import annotations

import pytest

from ...clock import frozen_clock
from ...errors import (
    InputError,
    StoreClosed,
)
from ...stores.base import (
    SessionStore,
    StoredSnapshot,
)
from .base import ContractBase, _event, _ids


class LifecycleContract(ContractBase):
    # -- expiry -----------------------------------------------------------------------------

    def test_creating_the_id_of_an_expired_session_starts_it_afresh(self, store: SessionStore, app: str) -> None:
        """A session past its retention is gone for writers on every store: creating its id again starts a
        new session (version 1, none of the old events), never a conflict revealing the old version; while it
        lives, its id is taken."""
        hour = 3_600_000
        with frozen_clock(2_000_000_000_000) as clock:
            row = self.row(app, "s-again", retention_ms=hour)
            assert store.commit(row, [_event(1), _event(2)], 0).ok
            assert store.commit(row, [_event(3)], 1).ok
            clock.advance(hour // 2)
            taken = store.commit(row, [_event(9)], 0)
            assert (taken.ok, taken.version) == (False, 2)
            clock.advance(hour)  # an hour and a half after its last commit
            again = store.commit(row, [_event(1), _event(9)], 0)
            assert (again.ok, again.version, again.appended) == (True, 1, 2)  # evt-1 is new to this session
            loaded = store.load(app, "s-again")
            assert loaded is not None and loaded.row.version == 1
            assert _ids(loaded.events) == ["evt-1", "evt-9"]
            assert [(s.id, s.version) for s in store.list(app)] == [("s-again", 1)]
            assert store.commit(row, [_event(10)], 1).ok
            assert store.commit(row, [_event(11)], 0).version == 2  # and the new one's id is taken

    # -- the clock --------------------------------------------------------------------------

    def test_updated_at_never_goes_backwards(self, store: SessionStore, app: str) -> None:
        """A writer whose clock is behind (another machine) must not move a session down the listing."""
        first, second = self.row(app, "s-first"), self.row(app, "s-second")
        with frozen_clock(2_000_000_000_000) as clock:
            store.commit(first, [_event(1)], 0)
            store.commit(second, [_event(1)], 0)  # the same instant: ties are broken by id
            clock.advance(-1_000_000_000_000)
            store.commit(first, [_event(2)], 1)
        loaded = store.load(app, first.id)
        assert loaded is not None and loaded.row.updated_at == 2_000_000_000_000
        listed = store.list(app)
        assert [(s.id, s.updated_at) for s in listed] == [
            ("s-second", 2_000_000_000_000),
            ("s-first", 2_000_000_000_000),
        ]

    # -- snapshots (the optional part) ------------------------------------------------------

    def test_a_snapshot_is_kept_newest_first_and_goes_with_its_session(self, store: SessionStore, app: str) -> None:
        snaps = self.snapshots_of(store)
        row = self.row(app)
        assert not snaps.save_snapshot(app, row.id, StoredSnapshot(1, "none yet")), "no row: nothing kept"
        store.commit(row, [_event(1)], 0)
        if not snaps.save_snapshot(app, row.id, StoredSnapshot(1, "at 1")):
            pytest.skip("this store keeps no snapshots (loads read the whole ledger)")
        assert snaps.load_snapshot(app, row.id) == StoredSnapshot(1, "at 1")
        assert not snaps.save_snapshot(app, row.id, StoredSnapshot(2, "ahead of the row"))
        store.commit(row, [_event(2)], 1)
        store.commit(row, [_event(3)], 2)
        assert snaps.save_snapshot(app, row.id, StoredSnapshot(3, "at 3"))
        assert not snaps.save_snapshot(app, row.id, StoredSnapshot(2, "older: a slow writer"))
        assert not snaps.save_snapshot(app, row.id, StoredSnapshot(3, "the same version again"))
        assert snaps.load_snapshot(app, row.id) == StoredSnapshot(3, "at 3")
        other = self.row(app)
        store.commit(other, [_event(1)], 0)
        assert snaps.load_snapshot(app, other.id) is None
        assert snaps.load_snapshot(f"{app}-other", row.id) is None
        store.delete(app, row.id)
        assert snaps.load_snapshot(app, row.id) is None
        store.commit(row, [_event(1), _event(2), _event(3), _event(4)], 0)  # made again: no snapshot of the old one
        for version in range(1, 4):
            store.commit(row, [], version)
        assert snaps.load_snapshot(app, row.id) is None

    def test_a_snapshot_over_its_limit_is_not_kept_and_bad_ones_are_refused(
        self, store: SessionStore, app: str
    ) -> None:
        snaps = self.snapshots_of(store)
        row = self.row(app)
        store.commit(row, [_event(1)], 0)
        store.commit(row, [_event(2)], 1)
        limit = self.limits(store).max_snapshot_bytes
        if not snaps.save_snapshot(app, row.id, StoredSnapshot(1, "é" * (limit // 2))):
            pytest.skip("this store keeps no snapshots (loads read the whole ledger)")
        assert not snaps.save_snapshot(app, row.id, StoredSnapshot(2, "é" * (limit // 2 + 1)))  # bytes, not chars
        assert snaps.load_snapshot(app, row.id) == StoredSnapshot(1, "é" * (limit // 2))
        for bad in (StoredSnapshot(0, "x"), StoredSnapshot(-1, "x"), "x"):
            with pytest.raises(InputError) as caught:
                snaps.save_snapshot(app, row.id, bad)  # type: ignore[arg-type]
            assert caught.value.field == "snapshot"

    # -- lifecycle --------------------------------------------------------------------------

    def test_close_twice_is_harmless_and_a_closed_store_says_so(self, app: str) -> None:
        store = self.make_store()
        store.close()
        store.close()
        with pytest.raises(StoreClosed):
            store.load(app, "any")
