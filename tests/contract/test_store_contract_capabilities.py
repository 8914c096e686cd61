"""The compliance suite asks a store for its capabilities by protocol: a store of the user's own that lists its
running and waiting sessions (``SweepableStore``) is held to those listings, not skipped for being no
``BaseSessionStore``."""

from __future__ import annotations

import uuid

import pytest

from dormant.stores.base import SessionStore, SweepableStore
from dormant.testing import StoreContract
from tests.support.wrapped_stores import Sweepable


class _OnASweepableStore(StoreContract):  # not collected: only the two listing tests are run, below
    def make_store(self) -> SessionStore:
        return Sweepable()


@pytest.mark.parametrize(
    "test",
    [
        StoreContract.test_running_sessions_are_the_running_ones_of_every_app,
        StoreContract.test_waiting_sessions_are_the_waiting_ones_of_every_app,
    ],
)
def test_the_suite_holds_a_sweepable_store_of_ones_own_to_its_listings(test: object) -> None:
    suite = _OnASweepableStore()
    store = suite.make_store()
    assert isinstance(store, SweepableStore) and not hasattr(store, "bound_sessions")  # no BaseSessionStore
    try:
        test(suite, store, f"app-{uuid.uuid4().hex[:12]}")  # type: ignore[operator]
    except pytest.skip.Exception as skipped:
        pytest.fail(f"the suite skipped a store that offers the listings: {skipped}")
    finally:
        store.close()
