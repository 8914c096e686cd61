"""The store compliance suite: the contract of ``dormant.stores.base``, as pytest tests any store can run.

Prove a store in a few lines — subclass, give it a name starting with ``Test``, and build the store::

    from dormant.testing import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self):
            return MyStore(...)

A store that implements the optional ``SnapshotStore`` part is checked on it too; one that does not
reports those tests skipped.

The key rule (``dormant.ids``) is part of the contract: every key kind with every defect is refused the same
way on every store with nothing written, the longest keys are kept, and ``{app}@{tenant}`` has one reading
(no app can be named like another's tenant, through lists, purges and erasures).

Override ``make_peer(store)`` to return a second handle on the same storage (another connection,
another client) and the concurrency tests race the two. Every test uses fresh app and session ids,
so a shared database (a Postgres server, a DynamoDB table) needs no cleaning between runs.
"""

from __future__ import annotations

from .concurrency import ConcurrencyContract
from .keys import KeysContract
from .ledger import LedgerContract
from .lifecycle import LifecycleContract
from .limits import LimitsContract
from .listing import ListingContract
from .scoped import ScopedStateContract

__all__ = ["StoreContract"]


class StoreContract(
    LedgerContract,
    ListingContract,
    ScopedStateContract,
    LimitsContract,
    KeysContract,
    ConcurrencyContract,
    LifecycleContract,
):
    """Behaviour every ``SessionStore`` must have. Subclass it and implement ``make_store``."""
