"""Fixtures of the HTTP tier: the Lambda handlers in this process, over the Bookings app on each store.

The handler modules import lazily: a module of this tier without the lambda extra skips itself (importorskip),
and this file must not fail the tier's collection first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.lambda_events import Client

if TYPE_CHECKING:
    from dormant.serving.runtime import Served


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def served(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The Bookings app on a SQLite file, and on a fresh table in DynamoDB Local (named by a store URL)."""
    from dormant.serving.runtime import load_served
    from dormant.stores.url import store_from_url

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'dormant.db'}"
    else:
        from tests.support.servers.dynamodb import ACCESS_KEY, REGION

        endpoint = request.getfixturevalue("dynamodb_endpoint")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
        url = f"dynamodb://handlers-{uuid.uuid4().hex[:12]}?endpoint={endpoint}&region={REGION}"
    store = store_from_url(url)
    yield load_served("bookings:build", store)
    store.close()


@pytest.fixture
def client(served: Served) -> Client:
    from dormant.serving.api import api_handler
    from dormant.serving.workflow import in_process_hooks

    return Client(api_handler(in_process_hooks(served), served))
