"""The Postgres store on a real server: the compliance suite, plus what only Postgres has — pools, DDL, roles."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")
from psycopg.conninfo import make_conninfo  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402
from psycopg_pool import ConnectionPool  # noqa: E402

from dormant.errors import ConfigurationError, StoreBusy, StoreClosed, StoreError  # noqa: E402
from dormant.events import UserEvent  # noqa: E402
from dormant.stores.base import ScopedStateChange, SessionStore, StoredSession, StoredSnapshot  # noqa: E402
from dormant.stores.postgres import PostgresSessionStore, postgres_store  # noqa: E402
from dormant.testing import StoreContract  # noqa: E402

pytestmark = pytest.mark.backend("postgres")
WAIT = 60  # seconds: the bound on every wait for another thread


def _event(n: int | str) -> UserEvent:
    return UserEvent(id=f"evt-{n}", created_at=1_700_000_000_000, text=f"message {n}")


def _row(app: str, session_id: str | None = None, **extra: Any) -> StoredSession:
    return StoredSession(id=session_id or f"s-{uuid.uuid4().hex[:12]}", app_name=app, created_at=1, **extra)


def _sql(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Raw SQL on its own autocommit connection, to look at what the store wrote."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def app() -> str:
    return f"app-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fresh_schema(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A new, empty schema and a URL whose search_path points at it; dropped afterwards."""
    schema = f"dormant_test_{uuid.uuid4().hex[:12]}"
    _sql(postgres_url, f'CREATE SCHEMA "{schema}"')
    try:
        yield schema, make_conninfo(postgres_url, options=f"-c search_path={schema}")
    finally:
        _sql(postgres_url, f'DROP SCHEMA "{schema}" CASCADE')


class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, postgres_url: str) -> None:
        self.url = postgres_url

    def make_store(self) -> SessionStore:
        return postgres_store(self.url)

    def make_peer(self, store: SessionStore) -> SessionStore:
        return postgres_store(self.url)  # another store object, with a pool of its own


class TestPostgresStoreOnAPoolItDoesNotOwn(StoreContract):
    """The suite again, on a pool the store must take as it is: connections not in autocommit, rows as dicts."""

    @pytest.fixture(autouse=True)
    def _pool(self, postgres_url: str) -> Iterator[None]:
        # Every connection made before the test (min_size = max_size, waited for): the pool makes one in a worker
        # thread with psycopg_pool's jitter from the global ``random``, and Hypothesis fails an example during which
        # the global random state moved (a flaky HypothesisDeprecationWarning).
        pool = ConnectionPool(postgres_url, min_size=6, max_size=6, kwargs={"row_factory": dict_row}, open=True)
        with pool:
            pool.wait()
            self.pool = pool
            yield

    def make_store(self) -> SessionStore:
        return postgres_store(pool=self.pool)

    def make_peer(self, store: SessionStore) -> SessionStore:
        return postgres_store(pool=self.pool)


# -- construction and pools -----------------------------------------------------------------------


def test_construction_takes_exactly_one_of_a_connection_string_or_a_pool(postgres_url: str) -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        postgres_store()
    pool: ConnectionPool[Any] = ConnectionPool(postgres_url, open=False)
    with pytest.raises(ConfigurationError, match="exactly one"):
        postgres_store(postgres_url, pool=pool)
    with pytest.raises(ConfigurationError, match="size your own pool"):
        postgres_store(pool=pool, max_size=3)
    with pytest.raises(ConfigurationError, match="not a PostgreSQL connection string"):
        postgres_store("host=127.0.0.1 port")


def test_an_injected_pool_is_used_as_is_and_never_closed(postgres_url: str, app: str) -> None:
    # The pool's connections are not autocommit and hand out dicts: the store must cope, and change neither.
    with ConnectionPool(postgres_url, min_size=1, max_size=2, kwargs={"row_factory": dict_row}, open=True) as pool:
        store = postgres_store(pool=pool)
        session_row = _row(app, scopes={"user": "u-1"})
        assert store.commit(session_row, [_event(1)], 0, [ScopedStateChange("user", "u-1", "k", [1])]).ok
        loaded = store.load(app, session_row.id)
        assert loaded is not None and [e.id for e in loaded.events] == ["evt-1"]
        assert store.load_scoped_state(app, "user", "u-1") == {"k": [1]}
        assert [s.id for s in store.list(app)] == [session_row.id]
        store.close()
        with pytest.raises(StoreClosed):
            store.load(app, session_row.id)
        assert not pool.closed and pool.max_size == 2
        with pool.connection() as conn:
            assert conn.autocommit is False
            row: Any = conn.execute("SELECT 1 AS one").fetchone()
            assert row == {"one": 1}  # its row factory untouched


def test_reads_hand_a_pool_connection_back_idle(postgres_url: str, app: str, caplog: pytest.LogCaptureFixture) -> None:
    # On connections not in autocommit a read opens a transaction: the store ends it, as pool.connection()
    # would, so the pool never has to roll one back (psycopg_pool warns when it does).
    with ConnectionPool(postgres_url, min_size=1, max_size=1, open=True) as pool:
        store = postgres_store(pool=pool)
        row = _row(app)
        assert store.commit(row, [_event(1)], 0).ok
        with caplog.at_level("WARNING", logger="psycopg.pool"):
            assert [s.id for s in store.list(app)] == [row.id]
            assert store.load_scoped_state(app, "user", "u-1") == {}
        conn = pool.getconn()
        try:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            pool.putconn(conn)
        assert not [r for r in caplog.records if "rolling back" in r.getMessage()], caplog.text


def _connections_named(url: str, name: str) -> int:
    (row,) = _sql(url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))
    return int(row[0])


def test_a_store_built_from_a_connection_string_closes_its_connections(postgres_url: str, app: str) -> None:
    name = f"dormant-test-{uuid.uuid4().hex[:8]}"  # tells this store's connections apart on the server
    store = postgres_store(make_conninfo(postgres_url, application_name=name), max_size=2)
    assert isinstance(store, PostgresSessionStore)
    assert store.commit(_row(app), [], 0).ok
    assert _connections_named(postgres_url, name) >= 1
    store.close()
    deadline = time.monotonic() + 5
    while _connections_named(postgres_url, name) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server notices a closed connection a moment after the client closes it
    assert _connections_named(postgres_url, name) == 0


def test_one_thread_holds_one_connection(postgres_url: str, app: str) -> None:
    # A single-threaded process (a Lambda function) needs one connection: a pool that grows a second one on
    # its first call (still opening the first) then takes them in turn, doubling the server's connections.
    name = f"dormant-test-{uuid.uuid4().hex[:8]}"
    store = postgres_store(make_conninfo(postgres_url, application_name=name))
    row = _row(app)
    try:
        for version in range(20):
            assert store.commit(row, [_event(version)], version).ok
            assert store.load(app, row.id) is not None
        assert _connections_named(postgres_url, name) == 1
    finally:
        store.close()


def test_an_unreachable_server_is_a_store_error_not_a_psycopg_one() -> None:
    # Port 1 on localhost refuses connections; the pool gives up after its timeout.
    with ConnectionPool("postgresql://postgres@127.0.0.1:1/postgres", min_size=1, timeout=1.0, open=True) as pool:
        store = postgres_store(pool=pool)
        with pytest.raises(StoreBusy, match="no database connection came free"):
            store.load("app", "s-1")


# -- tables: where, when, how often -------------------------------------------------------------


def test_tables_land_in_the_search_path_schema_as_jsonb(postgres_url: str, fresh_schema: tuple[str, str]) -> None:
    schema, url = fresh_schema
    store = postgres_store(url)
    try:
        assert store.commit(_row("app", "s-1"), [_event(1)], 0, [ScopedStateChange("user", "u-1", "k", 1)]).ok
    finally:
        store.close()
    columns = dict(
        ((table, column), kind)
        for table, column, kind in _sql(
            postgres_url,
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = %s",
            (schema,),
        )
    )
    assert {table for table, _ in columns} == {"sessions", "events", "scoped_state", "snapshots", "idempotency"}
    assert columns["snapshots", "data"] == "text"  # opaque to the store: never parsed by the server
    assert columns["events", "data"] == columns["sessions", "scopes"] == columns["scoped_state", "value"] == "jsonb"
    assert columns["sessions", "created_at"] == columns["sessions", "updated_at"] == "bigint"
    assert columns["events", "version"] == columns["events", "seq"] == "integer"
    assert columns["sessions", "status"] == "text"
    indexes = {
        name for (name,) in _sql(postgres_url, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))
    }
    assert {"idx_sessions_updated", "idx_events_order"} <= indexes
    # The events are real JSONB: the server can look inside them.
    assert _sql(postgres_url, f"SELECT data->>'type', data->>'text' FROM \"{schema}\".events") == [
        ("user", "message 1")
    ]


class _CountingStore(PostgresSessionStore):
    """Counts the times the DDL really runs (the store's own code, only observed)."""

    def __init__(self, url: str) -> None:
        pool: ConnectionPool[Any] = ConnectionPool(url, max_size=10, kwargs={"autocommit": True}, open=True)
        super().__init__(pool, owns_pool=True)
        self.ddl_runs = 0

    def _create_tables(self, conn: Any) -> None:
        self.ddl_runs += 1
        super()._create_tables(conn)


def _race(workers: int, work: Any) -> list[BaseException]:
    """Run ``work(n)`` in ``workers`` threads released at the same instant; return what they raised."""
    barrier = threading.Barrier(workers, timeout=WAIT)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait()
            work(n)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads), f"a worker was still running after {WAIT} s"
    return errors


def test_eight_threads_on_a_fresh_store_run_the_ddl_once(fresh_schema: tuple[str, str]) -> None:
    _, url = fresh_schema
    store = _CountingStore(url)
    try:
        errors = _race(8, lambda n: store.commit(_row("app", f"s-{n}"), [_event(n)], 0))
        assert errors == []
        assert store.ddl_runs == 1
        assert len(store.list("app")) == 8
        store.load("app", "s-0")
        assert store.ddl_runs == 1
    finally:
        store.close()


def test_eight_stores_racing_on_a_fresh_database_all_get_their_tables(fresh_schema: tuple[str, str]) -> None:
    # Separate stores, separate connections: this is the several-processes-booting case. Unguarded,
    # concurrent CREATE TABLE IF NOT EXISTS can fail with a unique violation in pg_type.
    _, url = fresh_schema
    stores = [postgres_store(url) for _ in range(8)]
    try:
        errors = _race(8, lambda n: stores[n].commit(_row("app", f"s-{n}"), [_event(n)], 0))
        assert errors == []
        assert sorted(s.id for s in stores[0].list("app")) == [f"s-{n}" for n in range(8)]
    finally:
        for store in stores:
            store.close()


def test_a_load_from_the_snapshot_is_one_read(postgres_url: str, app: str) -> None:
    # What a state read runs: the row, its snapshot and the events after it, in one transaction taken on one
    # connection (one round trip), not the snapshot and then the rest.
    store = postgres_store(postgres_url)
    try:
        row = _row(app)
        assert store.commit(row, [_event(1)], 0, snapshot=StoredSnapshot(1, '{"n": 1}')).ok
        assert store.commit(row, [_event(2)], 1).ok
        before = store._pool.get_stats()["requests_num"]
        snapshot, loaded = store.load_with_snapshot(app, row.id)
        assert store._pool.get_stats()["requests_num"] - before == 1
        assert snapshot == StoredSnapshot(1, '{"n": 1}')
        assert loaded is not None and loaded.row.version == 2 and [e.id for e in loaded.events] == ["evt-2"]
        assert store.load_with_snapshot(app, "s-none") == (None, None)
    finally:
        store.close()


def test_tables_that_cannot_be_made_are_a_store_error(fresh_schema: tuple[str, str]) -> None:
    # A view named like a table the store keeps: its DDL fails (no index on a view); the caller gets the
    # store's typed error, and the connection goes back to the pool (the next call meets the same answer).
    schema, url = fresh_schema
    _sql(url, f'CREATE VIEW "{schema}".sessions AS SELECT 1 AS x')
    store = postgres_store(url, max_size=1)
    try:
        for _ in range(2):
            with pytest.raises(StoreError, match="PostgreSQL refused"):
                store.list("app")
    finally:
        store.close()


def test_the_ddl_is_not_run_again_after_first_use(postgres_url: str, fresh_schema: tuple[str, str]) -> None:
    schema, url = fresh_schema
    store = postgres_store(url)
    try:
        assert store.commit(_row("app", "s-1"), [], 0).ok
        _sql(postgres_url, f'DROP TABLE "{schema}".events')
        # This store made its tables once; it does not check again on every call.
        with pytest.raises(StoreError, match="missing"):
            store.load("app", "s-1")
    finally:
        store.close()
    again = postgres_store(url)  # a new store object makes them again
    try:
        assert again.load("app", "s-1") is not None
    finally:
        again.close()


@pytest.fixture
def restricted_role(postgres_url: str, fresh_schema: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """A login role with USAGE (not CREATE) on the fresh schema: (role, its URL)."""
    schema, url = fresh_schema
    role, password = f"dormant_ro_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    try:
        _sql(postgres_url, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the TEST_DATABASE_URL role may not create roles")
    try:
        _sql(postgres_url, f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        yield role, make_conninfo(url, user=role, password=password)
    finally:
        _sql(postgres_url, f"DROP OWNED BY {role}")
        _sql(postgres_url, f"DROP ROLE {role}")


def test_a_role_without_create_rights_fails_on_first_use_saying_so(
    postgres_url: str, fresh_schema: tuple[str, str], restricted_role: tuple[str, str]
) -> None:
    schema, admin_url = fresh_schema
    role, url = restricted_role
    store = postgres_store(url)
    try:
        needs = f"role '{role}' needs CREATE rights on schema '{schema}' on first use"
        with pytest.raises(ConfigurationError, match=needs):
            store.load("app", "s-1")
    finally:
        store.close()
    assert (
        _sql(postgres_url, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)) == []
    )

    # Once a role with the rights has made the tables, the restricted role only needs to read and write rows.
    creator = postgres_store(admin_url)
    try:
        creator.list("app")
    finally:
        creator.close()
    _sql(postgres_url, f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {role}')
    store = postgres_store(url)
    try:
        assert store.commit(_row("app", "s-1"), [_event(1)], 0).ok
        loaded = store.load("app", "s-1")
        assert loaded is not None and [e.id for e in loaded.events] == ["evt-1"]
    finally:
        store.close()


# -- a refused commit writes nothing, seen from SQL ---------------------------------------------------


def test_a_refused_commit_leaves_no_rows_behind(postgres_url: str, app: str) -> None:
    store = postgres_store(postgres_url)
    try:
        row = _row(app, scopes={"user": "u-1"})
        assert store.commit(row, [_event(1)], 0).ok
        scoped = [ScopedStateChange("user", f"{app}-u", "k", "v")]
        refusals = [
            store.commit(row, [_event(2), _event(3)], 0, scoped),  # create again
            store.commit(row, [_event(2)], 5, scoped),  # ahead
            store.commit(_row(app, "never-created"), [_event(9)], 3, scoped),  # no row at all
        ]
        assert [(r.ok, r.version, r.appended) for r in refusals] == [(False, 1, 0), (False, 1, 0), (False, 0, 0)]
    finally:
        store.close()

    def count(query: str) -> int:
        (row,) = _sql(postgres_url, query, (app,))
        return int(row[0])

    assert count("SELECT count(*) FROM events WHERE app_name = %s") == 1
    assert count("SELECT count(*) FROM sessions WHERE app_name = %s") == 1
    assert count("SELECT max(version) FROM sessions WHERE app_name = %s") == 1
    assert count("SELECT count(*) FROM scoped_state WHERE app_name = %s") == 0


def test_appended_events_keep_batch_order_at_their_commit_after_skipped_ids(postgres_url: str, app: str) -> None:
    store = postgres_store(postgres_url)
    try:
        row = _row(app)
        store.commit(row, [_event(1), _event(2)], 0)
        resent = store.commit(row, [_event(2), _event(3), _event(1), _event(3), _event(4)], 1)
    finally:
        store.close()
    assert resent.appended == 2
    rows = _sql(
        postgres_url, "SELECT event_id, version, seq FROM events WHERE app_name = %s ORDER BY version, seq", (app,)
    )
    # A skipped id keeps its place in the numbering: evt-3 and evt-4 are 2nd and 4th of the de-duplicated batch.
    assert rows == [("evt-1", 1, 0), ("evt-2", 1, 1), ("evt-3", 2, 1), ("evt-4", 2, 3)]


class _PausingCursor(psycopg.Cursor[Any]):
    """A cursor that runs ``before_events`` (set on its class by a test) before it sends the read of the tail
    after the snapshot: the moment a writer is let in, between the row's read and the tail's."""

    before_events: Any = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if (
            isinstance(query, str)
            and query.startswith("SELECT data::text FROM events")
            and _PausingCursor.before_events
        ):
            _PausingCursor.before_events(self.connection)
        return super().execute(query, params, **kwargs)


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT} s for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("read", ["state read", "load"])
def test_a_read_sees_the_row_snapshot_and_tail_of_one_moment(postgres_url: str, app: str, read: str) -> None:
    """A commit landing between the read of the row (with its snapshot) and the read of the tail is in neither:
    they are read in one REPEATABLE READ transaction, not each at its own moment."""

    def autocommit_pausing(conn: psycopg.Connection[Any]) -> None:
        conn.cursor_factory = _PausingCursor

    # The store's own pools are autocommit (the pipelined path): this one is too, its cursors pausing.
    with ConnectionPool(
        postgres_url, min_size=1, max_size=1, kwargs={"autocommit": True}, configure=autocommit_pausing, open=True
    ) as pool:
        reader, writer = postgres_store(pool=pool), postgres_store(postgres_url)
        try:
            row = _row(app)
            assert writer.commit(row, [_event(1)], 0, snapshot=StoredSnapshot(1, '{"n": 1}')).ok

            def commit_meanwhile(conn: psycopg.Connection[Any]) -> None:
                pid = conn.info.backend_pid
                _until(  # the row's read has reached the server and run there
                    lambda: _sql(
                        postgres_url,
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query LIKE %s",
                        (pid, "%FROM sessions%"),
                    ),
                    "the row's read",
                )
                time.sleep(0.2)
                assert writer.commit(row, [_event(2)], 1).ok  # lands before the tail's read is sent

            def tail() -> tuple[int, list[str]]:
                if read == "load":
                    loaded = reader.load(app, row.id, after=1)
                else:
                    snapshot, loaded = reader.load_with_snapshot(app, row.id)
                    assert snapshot == StoredSnapshot(1, '{"n": 1}')
                assert loaded is not None
                return loaded.row.version, [e.id for e in loaded.events]

            _PausingCursor.before_events = commit_meanwhile
            try:
                assert tail() == (1, [])
            finally:
                _PausingCursor.before_events = None
            assert tail() == (2, ["evt-2"])
        finally:
            writer.close()


def test_the_store_builds_a_pool_of_the_callers_max_size(postgres_url: str, app: str) -> None:
    """Four threads committing to a session whose row another transaction holds locked: each commit holds its
    connection while it waits, so the server sees as many as the pool may open — max_size=2, not the default."""
    name = f"dormant-test-{uuid.uuid4().hex[:8]}"
    store = postgres_store(make_conninfo(postgres_url, application_name=name), max_size=2)
    row = _row(app)
    try:
        assert store.commit(row, [], 0).ok
        results: list[bool] = []
        with psycopg.connect(postgres_url) as holder:  # a transaction holding the session row's lock
            holder.execute("SELECT 1 FROM sessions WHERE app_name = %s AND id = %s FOR UPDATE", (app, row.id))
            threads = [
                threading.Thread(target=lambda n=n: results.append(store.commit(row, [_event(n)], 1).ok))
                for n in range(4)
            ]
            for thread in threads:
                thread.start()

            def stuck() -> int:  # commits waiting on the lock (on the server) or for a connection (in the pool)
                (locked,) = _sql(
                    postgres_url,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                    (name,),
                )
                return int(locked[0]) + int(store._pool.get_stats().get("requests_waiting", 0))

            _until(lambda: stuck() == 4, "four commits held up")
            assert _connections_named(postgres_url, name) == 2
        for thread in threads:
            thread.join(timeout=WAIT)
        assert sorted(results) == [False, False, False, True]  # one took version 2, the others conflicted
    finally:
        store.close()
