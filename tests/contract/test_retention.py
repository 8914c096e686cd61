"""Retention: a session past the app's ``retention`` is gone from loads and listings at once, in every
store, and ``app.sessions.purge()`` deletes it from the store (time moves on an injected clock).

DynamoDB expires sessions itself (its TTL attribute, tests/contract/test_dynamodb_ttl.py): its store hides an
expired session too, and AWS deletes it, so ``purge`` finds nothing left to delete there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dormant import adk, in_memory_store
from dormant.clock import frozen_clock
from dormant.errors import ConfigurationError
from dormant.stores.sqlite import sqlite_store
from tests.support.wrapped_stores import Erasable, SixMethods

DAY = timedelta(days=1)
T0 = 1_767_225_600_000


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.backend("postgres")),
        pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        made = in_memory_store()
    elif request.param == "sqlite":
        made = sqlite_store(tmp_path / "retention.db")
    elif request.param == "postgres":
        from dormant.stores.postgres import postgres_store

        made = postgres_store(request.getfixturevalue("postgres_url"))
    else:
        from dormant.stores.dynamodb import dynamo_store
        from tests.support.servers.dynamodb import client

        made = dynamo_store(
            request.getfixturevalue("dynamodb_table"), client=client(request.getfixturevalue("dynamodb_endpoint"))
        )
    yield made
    made.close()


def test_an_expired_session_is_gone_from_loads_and_listings_before_it_is_purged(store: Any) -> None:
    app = adk(name=f"ret-{uuid.uuid4().hex[:10]}", store=store, retention=30 * DAY)
    with frozen_clock(T0) as clock:
        old = app.sessions.create("s-old")
        clock.advance(int(DAY.total_seconds() * 1000) * 20)
        fresh = app.sessions.create("s-fresh")
        fresh.input.message("still here")
        app.sessions.commit(fresh)
        assert [s.id for s in app.sessions.list()] == ["s-fresh", "s-old"]

        clock.advance(int(DAY.total_seconds() * 1000) * 10)  # s-old is 30 days idle, s-fresh 10
        assert app.sessions.get(old.id) is None
        assert [s.id for s in app.sessions.list()] == ["s-fresh"]
        assert app.sessions.get(fresh.id) is not None
        if _expires_itself(store):
            assert store.load(app.name, old.id) is None and app.sessions.purge() == []
            return
        assert store.load(app.name, old.id) is not None  # still stored: expiry hides it first

        assert app.sessions.purge() == ["s-old"]
        assert store.load(app.name, old.id) is None and store.load(app.name, fresh.id) is not None
        assert app.sessions.purge() == []


def test_purge_reads_every_page(store: Any) -> None:
    app = adk(name=f"ret-{uuid.uuid4().hex[:10]}", store=store, retention=DAY)
    with frozen_clock(T0) as clock:
        for n in range(5):
            app.sessions.create(f"s-{n}")
            clock.advance(1)
        clock.advance(int(DAY.total_seconds() * 1000))
        purged = [] if _expires_itself(store) else [f"s-{n}" for n in range(5)]
        assert sorted(app.sessions.purge(page=2)) == purged
        assert store.list(app.name) == []


def test_a_purge_across_tenants_asks_the_store_for_its_tenants_only_when_it_can_list_them() -> None:
    """``purge_tenants`` (the sweeper's, ``dormant purge``'s) lists an app's tenants through
    ``ErasableStore.app_names``: a store of the user's own with the six methods alone is not asked (nothing purged
    across tenants, no ``AttributeError``); a wrapper with the method purges the app and each tenant."""
    from dormant.serving.runtime import for_tenant, purge_tenants

    for store, purged in ((SixMethods(), {}), (Erasable(), {"clinic": ["s-old"], "clinic@eu": ["s-old"]})):
        app = adk(name="clinic", store=store, retention=DAY)
        with frozen_clock(T0) as clock:
            app.sessions.create("s-old")
            for_tenant(app, "eu").sessions.create("s-old")
            clock.advance(int(DAY.total_seconds() * 1000))
            assert purge_tenants(app) == purged, type(store).__name__
            assert app.sessions.purge() == ([] if purged else ["s-old"])  # the app's own purge needs no more


def _expires_itself(store: Any) -> bool:
    return type(store).__name__ == "DynamoDBSessionStore"


def test_without_retention_nothing_expires_and_a_bad_retention_is_refused() -> None:
    app = adk(name="keep")
    with frozen_clock(T0) as clock:
        app.sessions.create("s-1")
        clock.advance(10**12)
        assert app.sessions.get("s-1") is not None and app.sessions.purge() == []
    with pytest.raises(ConfigurationError, match="retention"):
        adk(name="x", retention=timedelta(0))
    with pytest.raises(ConfigurationError, match="retention"):
        adk(name="x", retention=30)  # type: ignore[arg-type]


def test_a_commit_to_an_expired_session_finds_it_gone_and_writes_nothing(store: Any) -> None:
    """A runner that loaded the session before it expired commits after: gone, like a load (no fork either)."""
    from dormant.errors import SessionNotFound
    from dormant.serving import commit

    app = adk(name=f"ret-{uuid.uuid4().hex[:10]}", store=store, retention=30 * DAY)
    with frozen_clock(T0) as clock:
        held = app.sessions.create("s-held")
        held.input.message("written after it expired")
        clock.advance(int(DAY.total_seconds() * 1000) * 31)
        with pytest.raises(SessionNotFound):
            commit(app, held)
        with pytest.raises(SessionNotFound):
            app.sessions.commit(held)
        with frozen_clock(T0):  # as the store held it before it expired (DynamoDB hides expired rows itself)
            loaded = store.load(app.name, "s-held")
            assert loaded is not None and loaded.row.version == 1 and loaded.events == []
            assert [s.id for s in store.list(app.name)] == ["s-held"]  # no fork was written either

        app.sessions.purge()  # once purged, the same: gone, not a conflict that forks
        with pytest.raises(SessionNotFound):
            commit(app, held)
        assert store.list(app.name) == []


def test_a_commit_to_a_session_another_writer_kept_alive_goes_on(store: Any) -> None:
    """The held copy is old, but the stored row is not: the commit is a conflict to merge, not a gone session."""
    from dormant.serving import commit

    app = adk(name=f"ret-{uuid.uuid4().hex[:10]}", store=store, retention=30 * DAY)
    with frozen_clock(T0) as clock:
        held = app.sessions.create("s-busy")
        clock.advance(int(DAY.total_seconds() * 1000) * 20)
        other = app.sessions.require("s-busy")
        other.input.message("kept alive")
        app.sessions.commit(other)
        clock.advance(int(DAY.total_seconds() * 1000) * 11)  # held's own view is 31 days old; the row 11
        held.input.message("late but welcome")
        outcome = commit(app, held)
        assert outcome.status == "merged" and outcome.version == 3
        texts = [e.text for e in app.sessions.require("s-busy").events if e.type == "user"]  # type: ignore[union-attr]
        assert texts == ["kept alive", "late but welcome"]
