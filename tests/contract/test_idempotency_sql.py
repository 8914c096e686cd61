"""``Idempotency-Key`` records in a SQL store's own database (``serving.idempotency.SQLPersistenceLayer``), on
SQLite and on a real Postgres: when a request's record may be taken over by another request with its key."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="Idempotency-Key needs the lambda extra")

from dormant.errors import RequestInProgress
from dormant.serving.idempotency import Idempotency, idempotency_for
from dormant.stores.base import SessionStore
from dormant.stores.sqlite import sqlite_store


class _Context:
    """A Lambda context with ``remaining_ms`` left: what bounds how long a record stays in progress."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.backend("postgres"))])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        made: SessionStore = sqlite_store(tmp_path / "idem.db")
    else:
        from dormant.stores.postgres import postgres_store

        made = postgres_store(str(request.getfixturevalue("postgres_url")), max_size=2)
    with closing(made):
        yield made


def _records(store: SessionStore) -> Idempotency:
    found = idempotency_for(store)
    assert found is not None
    return found


def test_a_completed_record_is_kept_past_its_in_progress_deadline(store: SessionStore) -> None:
    """A record once completed answers every retry until it expires, however long after the first request's
    in-progress deadline (its Lambda's remaining time) the retry comes: only an in-progress record whose
    deadline passed (its request cut off) is taken over by the next request."""
    records, partition, runs = _records(store), f"p-{uuid.uuid4().hex[:12]}", []

    def work() -> dict[str, Any]:
        runs.append(1)
        with pytest.raises(RequestInProgress):  # a retry while it runs: held, its deadline not passed
            records.once(partition, "k-1", "runs", work, _Context(60_000), payload="body")
        return {"ran": len(runs)}

    first = records.once(partition, "k-1", "runs", work, _Context(100), payload="body")
    time.sleep(0.3)  # past the first request's in-progress deadline, long before the record's expiry
    assert records.once(partition, "k-1", "runs", work, _Context(100), payload="body") == first == {"ran": 1}
    assert len(runs) == 1
