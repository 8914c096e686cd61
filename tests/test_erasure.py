"""Erasure: ``app.erase(scope="user", scope_id=...)`` removes that person's shared state and every session
bound to them from every store; a scan of the raw rows (items) finds no trace of a marker value, and
other people's data is untouched."""

from __future__ import annotations

import base64
import sqlite3
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, in_memory_store
from dormant.errors import InputError
from dormant.stores.sqlite import sqlite_store


class Profile(BaseModel):
    secret: str = ""


GONE, KEPT = "MARKER-gone-7f3a", "MARKER-kept-91c2"


def _sqlite_raw(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return repr([conn.execute(f"SELECT * FROM {t}").fetchall() for t in ("sessions", "events", "scoped_state")])


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.backend("postgres")),
        pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb")),
    ]
)
def store_and_raw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A store and a function returning everything it holds, as raw text (rows, items, decoded binaries)."""
    if request.param == "sqlite":
        path = tmp_path / "erase.db"
        made = sqlite_store(path)
        yield made, lambda: _sqlite_raw(path)
    elif request.param == "postgres":
        import psycopg

        from dormant.stores.postgres import postgres_store

        url = request.getfixturevalue("postgres_url")

        def pg_raw() -> str:
            with psycopg.connect(url, autocommit=True) as conn:
                return repr(
                    [
                        conn.execute(f"SELECT t::text FROM {t} t").fetchall()
                        for t in ("sessions", "events", "scoped_state")
                    ]
                )

        made = postgres_store(url)
        yield made, pg_raw
    else:
        from dormant.stores.dynamodb import dynamo_store
        from tests.servers.dynamodb import client

        table = request.getfixturevalue("dynamodb_table")
        ddb = client(request.getfixturevalue("dynamodb_endpoint"))

        def unpack(value: Any) -> Any:
            if isinstance(value, bytes):
                try:
                    return zlib.decompress(value).decode(errors="replace")
                except zlib.error:
                    return value.decode(errors="replace") + base64.b64encode(value).decode()
            if isinstance(value, dict):
                return {k: unpack(v) for k, v in value.items()}
            if isinstance(value, list):
                return [unpack(v) for v in value]
            return value

        def ddb_raw() -> str:
            items = [i for page in ddb.get_paginator("scan").paginate(TableName=table) for i in page["Items"]]
            return repr(unpack(items))

        made = dynamo_store(table, client=ddb)
        yield made, ddb_raw
        ddb.close()
    made.close()


def test_erase_removes_every_trace_of_one_user_and_nothing_of_another(store_and_raw: tuple[Any, Any]) -> None:
    store, raw = store_and_raw
    app = adk(name=f"erase-{uuid.uuid4().hex[:10]}", store=store, schema={"user": Profile})
    for user, marker in (("u-gone", GONE), ("u-kept", KEPT)):
        for n in range(2):
            session = app.sessions.create(f"s-{user}-{n}", scopes={"user": user})
            session.input.message(f"my secret is {marker}")
            session.state.user.update({"secret": marker})
            app.sessions.commit(session)
        app.sessions.commit(app.sessions.require(f"s-{user}-0").fork_at(0, reason="copy"))
    unbound = app.sessions.create("s-nobody")
    unbound.input.message(f"no user here {KEPT}")
    app.sessions.commit(unbound)
    assert GONE in raw() and KEPT in raw()

    report = app.erase(scope="user", scope_id="u-gone")

    assert sorted(report.sessions)[:2] == ["s-u-gone-0", "s-u-gone-1"] and len(report.sessions) == 3
    assert report.scoped_keys == ["secret"]
    assert GONE not in raw() and "u-gone" not in raw()
    assert KEPT in raw()
    listed = {s.id for s in app.sessions.list()}
    assert not any("u-gone" in s for s in listed) and {"s-u-kept-0", "s-u-kept-1", "s-nobody"} <= listed
    assert store.load_scoped_state(app.name, "user", "u-kept") == {"secret": KEPT}
    assert app.erase(scope="user", scope_id="u-gone").sessions == []


def test_erase_refuses_what_is_not_a_bound_scope() -> None:
    app = adk(name="erase-input", store=in_memory_store())
    with pytest.raises(InputError, match="shared scope"):
        app.erase(scope="session", scope_id="x")
    with pytest.raises(InputError, match="shared scope"):
        app.erase(scope="app", scope_id="app")
