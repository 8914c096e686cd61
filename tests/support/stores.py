"""Stores the way a test opens several handles on one: the same memory store, the same SQLite file, the same
DynamoDB Local table (each handle its own connection or client)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dormant import in_memory_store
from dormant.stores.sqlite import sqlite_store


def store_maker(kind: str, request: pytest.FixtureRequest, directory: Path) -> Callable[[], Any]:
    if kind == "memory":
        shared = in_memory_store()  # one process's memory: every handle is the same store
        return lambda: shared
    if kind == "sqlite":
        path = directory / "writes.db"
        return lambda: sqlite_store(path)
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    table, endpoint = request.getfixturevalue("dynamodb_table"), request.getfixturevalue("dynamodb_endpoint")
    return lambda: dynamo_store(table, client=client(endpoint))
