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
