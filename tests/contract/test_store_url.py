"""``store_from_url``: one string names the store the handlers, the CLI and the tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

from dormant.errors import ConfigurationError
from dormant.stores.base import StoredSession
from dormant.stores.memory import MemorySessionStore
from dormant.stores.sqlite import SQLiteSessionStore
from dormant.stores.url import store_from_url


def test_memory() -> None:
    assert isinstance(store_from_url("memory:"), MemorySessionStore)


def test_sqlite_file_is_created_where_the_url_says(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "d.db"
    store = store_from_url(f"sqlite:///{path}")
    try:
        assert isinstance(store, SQLiteSessionStore)
        assert store.commit(StoredSession(id="s", app_name="a"), [], 0).ok
        assert path.exists()
    finally:
        store.close()


@pytest.mark.parametrize("url", ["", "sqlite://relative.db", "sqlite:///", "mongodb://x", "nothing"])
def test_a_bad_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)


def test_dynamodb_names_the_table_region_endpoint_and_shards() -> None:
    pytest.importorskip("boto3")
    from dormant.stores.dynamodb import DynamoDBSessionStore

    # (an endpoint= also creates a missing table: see the DynamoDB Local test below)
    store = store_from_url("dynamodb://sessions-table?region=eu-west-2&shards=8&pending_shards=16")
    try:
        assert isinstance(store, DynamoDBSessionStore)
        assert (store._table, store._listing_shards, store._pending_shards) == ("sessions-table", 8, 16)
        assert store._client.meta.region_name == "eu-west-2"
    finally:
        store.close()
    default = store_from_url("dynamodb://sessions-table?region=eu-west-2")
    assert isinstance(default, DynamoDBSessionStore) and (default._listing_shards, default._pending_shards) == (4, 8)
    default.close()


@pytest.mark.backend("dynamodb")
def test_a_dynamodb_url_reaches_the_table(
    dynamodb_endpoint: str, dynamodb_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dormantlocal")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dormantlocal")
    store = store_from_url(f"dynamodb://{dynamodb_table}?region=us-east-1&endpoint={dynamodb_endpoint}")
    try:
        assert store.commit(StoredSession(id="s", app_name="url-app"), [], 0).ok
        assert [s.id for s in store.list("url-app")] == ["s"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "url",
    [
        "dynamodb://",
        "dynamodb://t?color=red",
        "dynamodb://t?shards=x",
        "dynamodb://t?pending_shards=-1",
        "dynamodb://t/path",
        "dynamodb://t?region",
    ],
)
def test_a_bad_dynamodb_url_is_a_configuration_error(url: str) -> None:
    pytest.importorskip("boto3")
    with pytest.raises(ConfigurationError):
        store_from_url(url)


@pytest.mark.backend("dynamodb")
def test_a_dynamodb_url_with_an_endpoint_creates_a_missing_table(
    dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dormantlocal")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dormantlocal")
    table = f"url-created-{uuid.uuid4().hex[:8]}"
    url = f"dynamodb://{table}?region=us-east-1&endpoint={dynamodb_endpoint}"
    store = store_from_url(url)
    try:
        assert store._client.meta.endpoint_url == dynamodb_endpoint
        assert store.commit(StoredSession(id="s", app_name="url-app"), [], 0).ok
    finally:
        store.close()
    again = store_from_url(url)  # the table exists now: used as it is
    try:
        assert [s.id for s in again.list("url-app")] == ["s"]
    finally:
        again.close()
