"""Erasure: ``app.erase(scope="user", scope_id=...)`` removes that person's shared state and every session
bound to them from every store; a scan of the raw rows (items) — and for SQLite, of the bytes of the
database file and its ``-wal`` and ``-shm`` files — finds no trace of a marker value, and other people's
data is untouched."""

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
from dormant.errors import ConfigurationError, InputError
from dormant.stores.base import BaseSessionStore, ErasableStore, StoredSession
from dormant.stores.sqlite import sqlite_store
from tests.support.wrapped_stores import Erasable, SixMethods


class Profile(BaseModel):
    secret: str = ""


GONE, KEPT = "MARKER-gone-7f3a", "MARKER-kept-91c2"


def _sqlite_raw(path: Path) -> str:
    """The rows, then every byte of the database file, its write-ahead log and its shared-memory index."""
    with sqlite3.connect(path) as conn:
        rows = repr([conn.execute(f"SELECT * FROM {t}").fetchall() for t in ("sessions", "events", "scoped_state")])
    files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
    return rows + "".join(f.read_bytes().decode("latin-1") for f in files if f.exists())


def _build_without_secure_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new SQLite connection starts with ``secure_delete`` OFF, as on a build whose default leaves
    deleted bytes in the pages (this machine's defaults to ON)."""
    connect = sqlite3.connect

    def connect_off(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.execute("PRAGMA secure_delete=OFF")
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect_off)


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
        _build_without_secure_delete(request.getfixturevalue("monkeypatch"))
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
        from tests.support.servers.dynamodb import client

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
    # Only Postgres says something may remain: deleted row versions, until VACUUM FULL.
    assert (report.residue is not None) == ("postgres" in type(store).__module__), report.residue
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


def test_erase_refuses_a_store_that_is_not_erasable_and_removes_nothing() -> None:
    """A store of the user's own with the six methods alone has no binding index to find a person's sessions by:
    ``erase`` refuses it with a ``ConfigurationError`` naming the protocol, before it deletes anything."""
    store = SixMethods()
    assert not isinstance(store, ErasableStore)
    app = adk(name="erase-six", store=store, schema={"user": Profile})
    session = app.sessions.create("s-1", scopes={"user": "u-1"})
    session.state.user.secret = GONE
    app.sessions.commit(session)
    with pytest.raises(ConfigurationError, match="ErasableStore"):
        app.erase(scope="user", scope_id="u-1")
    assert app.sessions.get("s-1") is not None and store.load_scoped_state(app.name, "user", "u-1") == {"secret": GONE}


def test_erase_runs_on_any_store_with_the_erasure_methods_not_only_the_built_in_ones() -> None:
    """``erase`` asks the ``ErasableStore`` protocol, not for a ``BaseSessionStore``: a wrapper that forwards the
    erasure methods is erased like the store it wraps."""
    store = Erasable()
    assert isinstance(store, ErasableStore) and not isinstance(store, BaseSessionStore)
    app = adk(name="erase-wrapped", store=store, schema={"user": Profile})
    for user in ("u-gone", "u-kept"):
        session = app.sessions.create(f"s-{user}", scopes={"user": user})
        session.state.user.secret = user
        app.sessions.commit(session)
    report = app.erase(scope="user", scope_id="u-gone")
    assert (report.sessions, report.scoped_keys) == (["s-u-gone"], ["secret"])
    assert app.sessions.get("s-u-gone") is None and app.sessions.get("s-u-kept") is not None
    assert store.load_scoped_state(app.name, "user", "u-gone") == {}


def test_erase_reads_the_persons_sessions_through_the_binding_index_not_the_apps(
    store_and_raw: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = store_and_raw
    app = adk(name=f"erase-{uuid.uuid4().hex[:10]}", store=store, schema={"user": Profile, "org": Profile})
    for n in range(12):
        app.sessions.create(f"s-other-{n}", scopes={"user": f"u-{n}", "org": "o-1"})
    mine = [app.sessions.create(f"s-mine-{n}", scopes={"user": "u-gone", "org": "o-1"}).id for n in range(2)]
    loads: list[str] = []
    real_read = store._read

    def no_listing(*args: Any) -> Any:
        raise AssertionError("erase listed the app's sessions")

    def read(app_name: str, session_id: str, after: int) -> Any:
        loads.append(session_id)
        return real_read(app_name, session_id, after)

    monkeypatch.setattr(store, "_list", no_listing)
    monkeypatch.setattr(store, "_read", read)
    report = app.erase(scope="user", scope_id="u-gone")
    assert report.sessions == mine
    assert set(loads) <= set(mine)  # no other session's row is read
    monkeypatch.undo()
    assert store.bound_sessions(app.name, "user", "u-gone") == []
    assert len(store.bound_sessions(app.name, "org", "o-1")) == 12 and len(app.sessions.list()) == 12


def test_a_sqlite_reader_holding_the_log_is_reported_and_a_second_erasure_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _build_without_secure_delete(monkeypatch)
    monkeypatch.setattr("dormant.stores.sqlite._SCRUB_WAIT", 0.2)
    path = tmp_path / "held.db"
    store = sqlite_store(path)
    try:
        app = adk(name="held", store=store, schema={"user": Profile})
        session = app.sessions.create("s-1", scopes={"user": "u-gone"})
        session.input.message(f"my secret is {GONE}")
        app.sessions.commit(session)
        reader = sqlite3.connect(path, isolation_level=None, timeout=5)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM events").fetchone()[0] > 0  # reading the log's frames
        report = app.erase(scope="user", scope_id="u-gone")
        assert report.sessions == ["s-1"]
        assert report.residue is not None and f"{path}-wal" in report.residue
        assert GONE in Path(f"{path}-wal").read_bytes().decode("latin-1")  # so the report is right to say so
        reader.execute("COMMIT")
        reader.close()
        again = app.erase(scope="user", scope_id="u-gone")
        assert (again.sessions, again.residue) == ([], None)
        assert GONE not in _sqlite_raw(path)
    finally:
        store.close()


def test_the_sqlite_binding_lookup_is_an_index_search(tmp_path: Path) -> None:
    """The statement ``bound_sessions`` runs, as SQLite plans it on a file with many sessions of the app."""
    store = sqlite_store(tmp_path / "plan.db")
    try:
        app = adk(
            name="plan",
            store=store,
            schema={scope: Profile for scope in ("user", "patient", "practice", "org", "team")},
        )
        for n in range(50):
            app.sessions.create(f"s-{n}", scopes={"user": f"u-{n}", "org": "o-1"})
        for scope in ("user", "patient", "practice", "org", "team"):
            ran: list[str] = []
            store._conn.set_trace_callback(ran.append)
            store.bound_sessions("plan", scope, "u-1")
            store._conn.set_trace_callback(None)
            [query] = [q for q in ran if q.startswith("SELECT")]
            plan = store._conn.execute(f"EXPLAIN QUERY PLAN {query}").fetchall()
            assert f"USING INDEX idx_sessions_bound_{scope}" in repr(plan), plan
    finally:
        store.close()


def test_a_file_made_before_the_binding_index_gains_it_and_finds_older_sessions(tmp_path: Path) -> None:
    path = tmp_path / "older.db"
    store = sqlite_store(path)
    app = adk(name="older", store=store, schema={"user": Profile})
    app.sessions.create("s-1", scopes={"user": "u-1"})
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX idx_sessions_bound_user")
    reopened = sqlite_store(path, create=False)
    try:
        assert reopened.bound_sessions("older", "user", "u-1") == ["s-1"]
        with sqlite3.connect(path) as conn:
            names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "idx_sessions_bound_user" in names
    finally:
        reopened.close()


@pytest.mark.backend("dynamodb")
def test_erase_on_dynamodb_checks_each_binding_and_leaves_none_behind(
    dynamodb_table: str, dynamodb_endpoint: str
) -> None:
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    ddb = client(dynamodb_endpoint)
    store = dynamo_store(dynamodb_table, client=ddb)
    try:
        app = adk(name=f"erase-{uuid.uuid4().hex[:10]}", store=store, schema={"user": Profile})
        app.sessions.create("s-theirs", scopes={"user": "u-kept"})
        app.sessions.create("s-mine", scopes={"user": "u-gone"})
        # entries a refused create or a cut-short delete leaves: one names another's session, one none
        for stale in ("s-theirs", "s-vanished"):
            ddb.put_item(TableName=dynamodb_table, Item={"pk": {"S": f"B#{app.name}#user#u-gone"}, "sk": {"S": stale}})
        assert app.erase(scope="user", scope_id="u-gone").sessions == ["s-mine"]
        assert app.sessions.get("s-theirs") is not None
        left = ddb.query(
            TableName=dynamodb_table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"B#{app.name}#user#u-gone"}},
        )["Items"]
        assert left == []
        assert store.bound_sessions(app.name, "user", "u-kept") == ["s-theirs"]
    finally:
        store.close()
        ddb.close()


@pytest.mark.backend("postgres")
def test_the_postgres_binding_lookup_uses_its_index(postgres_url: str) -> None:
    """The statement ``bound_sessions`` runs, as PostgreSQL plans it once the app has many sessions."""
    import psycopg

    from dormant.stores.postgres import postgres_store
    from dormant.stores.sql_schema import bound_id

    store = postgres_store(postgres_url)
    name = f"plan-{uuid.uuid4().hex[:8]}"
    try:
        app = adk(name=name, store=store, schema={"user": Profile})
        for n in range(2000):
            store.commit(StoredSession(id=f"s-{n}", app_name=name, scopes={"user": f"u-{n}"}, created_at=1), [], 0)
        assert app.erase(scope="user", scope_id="u-7").sessions == ["s-7"]
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")  # no ANALYZE: the statistics are shared with other tests
            query = f"SELECT id FROM sessions WHERE app_name = %s AND {bound_id('JSONB', 'user')} = %s"  # the store's
            plan = conn.execute(f"EXPLAIN {query}", (name, "u-8")).fetchall()
            assert "idx_sessions_bound_user" in repr(plan), plan
    finally:
        store.close()
