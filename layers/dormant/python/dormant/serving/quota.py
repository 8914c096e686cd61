"""A per-tenant turn quota, counted in the store itself, so it holds on every store and every function.

``DORMANT_TURN_QUOTA=N/SECONDS`` (the stack's ``-c turn_quota=N/SECONDS``; unset or empty: no quota) lets
each tenant claim N turns per window of SECONDS. ``POST /runs`` takes one turn of the quota before anything
is started or claimed; past it the caller gets ``TurnQuotaExceeded`` (429, naming the quota) with nothing run
or written. A request whose claim is then refused (409 ``AwaitingInput``, 409 held by a live run, any 4xx:
nothing claimed) gives its turn back: the quota counts turns that were claimed, not refusals.

The count is two counter sessions per tenant and window (app ``<app>+quota``, out of every tenant's listing
and of the sweeper's views; ids: a digest of the tenant and the window's start, and that with ``-back``),
whose stored versions are the turns taken and the turns given back: a turn is one commit of one event at the
version read, under the store's own optimistic concurrency, so two racing callers never both take the last
turn (one taken by a request that is then refused is free again once it is given back). A counter outlives
its window by one window (the store's retention: DynamoDB's TTL; the SQL stores keep it until the app purges
it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from ..clock import now_ms
from ..errors import ConfigurationError, StoreBusy, TurnQuotaExceeded
from ..events import UserEvent
from ..stores.base import LoadedSession, SessionStore, StoredSession

__all__ = ["QUOTA_ENV", "Taken", "TurnQuota", "quota_from_env"]

QUOTA_ENV = "DORMANT_TURN_QUOTA"
_ATTEMPTS = 8
_LATEST = 1 << 62
"""``load(after=)`` past any version: the counter's row, none of its events."""


@dataclass(frozen=True)
class TurnQuota:
    turns: int
    seconds: int

    @classmethod
    def parse(cls, text: str) -> TurnQuota:
        turns, _, seconds = text.partition("/")
        if not (turns.isdigit() and seconds.isdigit() and int(turns) > 0 and int(seconds) > 0):
            raise ConfigurationError(f"{QUOTA_ENV} is TURNS/SECONDS, both whole numbers > 0, not {text!r}")
        return cls(int(turns), int(seconds))

    def take(self, store: SessionStore, app_name: str, tenant: str) -> Taken:
        """Take one turn of ``tenant``'s quota (``app_name``: the served app's name): what ``give_back`` needs,
        and the turns left after it. Raises ``TurnQuotaExceeded`` when none is left, having written nothing."""
        window_ms = self.seconds * 1000
        now = now_ms()
        start = now - now % window_ms
        counter = hashlib.sha256(f"{tenant}\n{start}".encode()).hexdigest()[:40]
        name = f"{app_name}+quota"
        for _ in range(_ATTEMPTS):
            loaded = store.load(name, counter, after=_LATEST)  # the turns taken, committed on at this version
            given = store.load(name, f"{counter}-back", after=_LATEST)
            taken = _version(loaded) - _version(given)
            if taken >= self.turns:
                raise TurnQuotaExceeded(self.turns, self.seconds, max(1, -(-(start + window_ms - now) // 1000)))
            if _bump(store, name, counter, loaded, window_ms, now):
                return Taken(name, counter, window_ms, self.turns - taken - 1)
        raise StoreBusy(f"the turn quota's counter kept moving: {_ATTEMPTS} attempts lost the race; try again")

    def give_back(self, store: SessionStore, taken: Taken) -> None:
        """Give back a turn ``take`` took for a request whose claim was refused (nothing claimed)."""
        for _ in range(_ATTEMPTS):
            back = f"{taken.counter}-back"
            if _bump(store, taken.app_name, back, store.load(taken.app_name, back, after=_LATEST), taken.window_ms):
                return
        raise StoreBusy(f"the turn quota's counter kept moving: {_ATTEMPTS} attempts lost the race; try again")


@dataclass(frozen=True)
class Taken:
    """A turn taken of a tenant's quota: which counter, and how many turns are left after it."""

    app_name: str
    counter: str
    window_ms: int
    left: int


def _version(loaded: LoadedSession | None) -> int:
    return loaded.row.version if loaded is not None else 0


def _bump(
    store: SessionStore, name: str, counter: str, loaded: LoadedSession | None, window_ms: int, now: int | None = None
) -> bool:
    """One more on a counter, at the version ``loaded`` read: ``False`` when another caller moved it first."""
    now = now_ms() if now is None else now
    version = _version(loaded)
    row = StoredSession(
        id=counter,
        app_name=name,
        version=version,
        created_at=loaded.row.created_at if loaded is not None else now,
        updated_at=now,
        retention_ms=2 * window_ms,
    )
    return store.commit(row, [UserEvent(text="turn")], version).ok


def quota_from_env() -> TurnQuota | None:
    """``DORMANT_TURN_QUOTA`` as a ``TurnQuota`` (``None``: no quota)."""
    text = os.environ.get(QUOTA_ENV, "").strip()
    return TurnQuota.parse(text) if text else None
