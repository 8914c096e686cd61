"""The compliance suite for the stores that need no server (Postgres and DynamoDB have modules of their own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dormant import in_memory_store
from dormant.stores.base import SessionStore
from dormant.stores.sqlite import sqlite_store
from dormant.testing import StoreContract


class TestInMemoryStore(StoreContract):
    def make_store(self) -> SessionStore:
        return in_memory_store()


class TestSQLiteFileStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "nested" / "dir" / "sessions.db"

    def make_store(self) -> SessionStore:
        return sqlite_store(self.path)

    def make_peer(self, store: SessionStore) -> SessionStore:
        return sqlite_store(self.path)  # a second connection on the same file


class TestSQLiteMemoryStore(StoreContract):
    def make_store(self) -> SessionStore:
        return sqlite_store(":memory:")
