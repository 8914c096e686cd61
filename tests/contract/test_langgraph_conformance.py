"""``DormantSaver`` judged by LangGraph's own conformance suite (``langgraph-checkpoint-conformance``): every base
capability and the extended ones, on each dormant store (one store per test: the suite is run store by store)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="needs langgraph-checkpoint-conformance (dev extra)")
pytestmark = pytest.mark.backend("langgraph")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402

from dormant.bridges.langgraph import DormantSaver  # noqa: E402
from dormant.stores.base import SessionStore  # noqa: E402
from dormant.stores.memory import in_memory_store  # noqa: E402
from dormant.stores.sqlite import sqlite_store  # noqa: E402


def _conforms(name: str, make: Callable[[], SessionStore]) -> None:
    """Run the whole suite; each capability gets a fresh saver on a fresh app of the store."""
    stores: list[SessionStore] = []

    @checkpointer_test(name=f"DormantSaver[{name}]")
    async def saver() -> AsyncGenerator[DormantSaver, None]:
        store = make()
        stores.append(store)
        yield DormantSaver(store, app_name=f"lg-{uuid.uuid4().hex[:10]}")

    try:
        report = asyncio.run(validate(saver))
    finally:
        for store in stores:
            store.close()
    ran = {cap: result for cap, result in report.results.items() if result.detected}
    assert set(ran) == {cap.value for cap in ALL_CAPABILITIES}, f"capabilities not detected: {report.results}"
    failures = [f for result in ran.values() for f in result.failures]
    assert not failures, "\n".join(failures)
    assert all(result.passed is True and result.tests_passed > 0 for result in ran.values())
    assert report.passed_all_base() and report.passed_all()


def test_memory_store() -> None:
    _conforms("memory", in_memory_store)


def test_sqlite_store(tmp_path: Path) -> None:
    files = iter(range(100))
    _conforms("sqlite", lambda: sqlite_store(tmp_path / f"lg-{next(files)}.db"))


@pytest.mark.backend("postgres")
def test_postgres_store(postgres_schema: str) -> None:
    from dormant.stores.postgres import postgres_store

    _conforms("postgres", lambda: postgres_store(postgres_schema))


@pytest.mark.backend("dynamodb")
def test_dynamodb_store(dynamodb_endpoint: str, dynamodb_table: str, monkeypatch: Any) -> None:
    from dormant.stores.url import store_from_url
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    _conforms(
        "dynamodb", lambda: store_from_url(f"dynamodb://{dynamodb_table}?endpoint={dynamodb_endpoint}&region={REGION}")
    )
