"""Sessions stored by earlier releases load, resume and commit under this one, in every store.

Each ``tests/fixtures/release-*`` directory holds what that release stored, in each store's own format
(written by its ``generate.py``): a SQLite file, the Postgres rows as INSERT statements, the raw
DynamoDB items. Each is loaded into a real store of its kind, untouched, and must keep working.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from dormant.audit import key_history
from dormant.events import StateChangeEvent, ToolResultEvent
from dormant.stores.sql_schema import RUNNING_QUERY, WAITING_QUERY
from dormant.stores.sqlite import sqlite_store
from tests.support.release_fixtures import APP, DONE, FIXTURES, USER, WAITING, fixture_app, old_dynamodb_table

RELEASES = sorted(path.name for path in FIXTURES.iterdir() if (path / "generate.py").exists())


def check_resumes(store: Any) -> None:
    """The fixture sessions load as stored, the waiting one resumes and commits on top of what is there."""
    app, scripted, agent = fixture_app(store)
    assert {WAITING, DONE} <= {listing.id for listing in app.sessions.list()}

    done = app.sessions.require(DONE)
    assert done.status == "completed" and done.state.approved is True and done.output.text == "Booked."
    # 0.1 recorded no tool call on a state change: the field reads as absent, the audit infers it
    assert all(e.call_id is None for e in done.events if isinstance(e, StateChangeEvent))
    history = key_history(done.events, "session", "approved")
    assert [(c.source, c.tool, c.call_id) for c in history] == [("direct", None, None), ("mutation", "book", "call-1")]

    waiting = app.sessions.require(WAITING)
    before = list(waiting.events)
    assert any(isinstance(e, StateChangeEvent) for e in before)
    assert {e.v for e in before} == {1}  # release 0.1 wrote event format 1
    assert waiting.status == "awaiting_input" and [y.call_id for y in waiting.yielded_tools] == ["call-1"]
    assert waiting.state.reason == "check-up" and waiting.state.user.display_name == "Ada"
    assert store.load_scoped_state(APP, "user", USER)["visits"] == 1  # the completed session's booking

    waiting.input.answer("call-1", {"approved": True})
    scripted.set_responses([{"text": "Booked."}])
    run = app.run(agent, session=waiting)
    assert run.status == "completed"
    app.sessions.commit(run.session)

    again = app.sessions.require(WAITING)
    assert list(again.events)[: len(before)] == before  # what the old release stored is untouched
    made = [e for e in list(again.events)[len(before) :] if isinstance(e, StateChangeEvent)]
    assert {(e.call_id, e.tool) for e in made if e.source == "mutation"} == {("call-1", "book")}  # recorded now
    assert again.status == "completed" and again.state.approved is True
    assert [e.result for e in again.events if isinstance(e, ToolResultEvent)] == ["booked"]
    assert store.load_scoped_state(APP, "user", USER)["visits"] == 2


def test_there_is_a_fixture_for_every_release_so_far() -> None:
    assert "release-0.1" in RELEASES
    for release in RELEASES:
        assert {"sessions.sqlite", "postgres.sql", "dynamodb.json"} <= {p.name for p in (FIXTURES / release).iterdir()}


@pytest.mark.parametrize("release", RELEASES)
def test_a_stored_sqlite_file_loads_resumes_and_commits(release: str, tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    shutil.copyfile(FIXTURES / release / "sessions.sqlite", path)  # the fixture itself is never written
    store = sqlite_store(path, create=False)
    try:
        check_resumes(store)
    finally:
        store.close()


@pytest.mark.parametrize("release", RELEASES)
def test_a_sqlite_file_made_before_the_running_index_gets_it_whole(release: str, tmp_path: Path) -> None:
    """A session the old release left running (its runner died before the upgrade) is what the sweeper most
    needs to find: opening the file builds the running index from the rows, and the query reads it."""
    import sqlite3

    path = tmp_path / "sessions.sqlite"
    shutil.copyfile(FIXTURES / release / "sessions.sqlite", path)
    raw = sqlite3.connect(path)
    with raw:
        assert not raw.execute("SELECT name FROM sqlite_master WHERE name = 'idx_sessions_running'").fetchall()
        raw.execute("UPDATE sessions SET status = 'running' WHERE id = ?", (WAITING,))
    raw.close()
    store = sqlite_store(path, create=False)
    try:
        assert [(r.app_name, r.session_id) for r in store.running_sessions()] == [(APP, WAITING)]
        plan = store._conn.execute("EXPLAIN QUERY PLAN " + RUNNING_QUERY.format(mark="?"), (10,)).fetchall()
        assert "idx_sessions_running" in str(plan)
        plan = store._conn.execute("EXPLAIN QUERY PLAN " + WAITING_QUERY.format(mark="?"), (10,)).fetchall()
        assert "idx_sessions_waiting" in str(plan)  # made on open too: the sweeper's waits read no other row
    finally:
        store.close()


@pytest.mark.backend("postgres")
@pytest.mark.parametrize("release", RELEASES)
def test_a_postgres_dump_restores_resumes_and_commits(release: str, postgres_schema: str) -> None:
    import psycopg

    from dormant.stores.postgres import postgres_store

    store = postgres_store(postgres_schema)
    try:
        store.list(APP)  # the store makes its tables on first use; the dump holds only rows
        statements = (FIXTURES / release / "postgres.sql").read_text().splitlines()
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())
        check_resumes(store)
    finally:
        store.close()


@pytest.mark.backend("postgres")
def test_a_postgres_schema_made_before_the_running_index_gets_it_whole(postgres_schema: str) -> None:
    """Tables made by a release without the running index, holding a running session: the next store to
    open them makes the index, over the rows already there."""
    import psycopg

    from dormant.stores.postgres import postgres_store

    store = postgres_store(postgres_schema)
    store.list(APP)  # the tables, as this release makes them; then back to a release without the index
    store.close()
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute("DROP INDEX idx_sessions_running")
        conn.execute(
            "INSERT INTO sessions (app_name, id, version, status, created_at, updated_at)"
            " VALUES (%s, 's-died', 1, 'running', 1, 1), (%s, 's-idle', 1, 'idle', 1, 1)",
            (APP, APP),
        )
    store = postgres_store(postgres_schema)
    try:
        assert [(r.app_name, r.session_id, r.updated_at) for r in store.running_sessions()] == [(APP, "s-died", 1)]
        with psycopg.connect(postgres_schema, autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")  # a handful of rows: make the planner show it can use it
            plan = conn.execute("EXPLAIN " + RUNNING_QUERY.format(mark="10")).fetchall()
            waiting = conn.execute("EXPLAIN " + WAITING_QUERY.format(mark="10")).fetchall()
        assert "idx_sessions_running" in str(plan)
        assert "idx_sessions_waiting" in str(waiting)
    finally:
        store.close()


@pytest.mark.backend("dynamodb")
@pytest.mark.parametrize("release", RELEASES)
def test_dynamodb_items_migrate_then_resume_and_commit(
    release: str, dynamodb_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table the release made cannot be served in place (its local index can never be dropped): the store
    refuses it, naming the command; ``dormant migrate-table`` copies it, and the sessions load, list, resume and
    commit in the new table."""
    from dormant.cli import main
    from dormant.errors import ConfigurationError
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    ddb = client(dynamodb_endpoint)
    old = old_dynamodb_table(ddb, release)
    new = f"migrated-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(ConfigurationError, match=f"dormant migrate-table --from {old}"):
            dynamo_store(old, client=ddb).load(APP, DONE)
        assert main(["migrate-table", "--from", old, "--to", new, "--endpoint", dynamodb_endpoint]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["sessions"], report["touches"], report["scoped"]) == (2, 2, 2)
        assert report["events"] == report["id_items"] > 0
        store = dynamo_store(new, client=ddb)
        assert [s.id for s in store.list(APP, status="awaiting_input")] == [WAITING]  # the status index too
        assert [s.id for s in store.list(APP, status="completed")] == [DONE]
        check_resumes(store)
        # Release 0.1 kept each session's listing entry on its meta item; so does this layout, keyed afresh.
        assert [listing.id for listing in store.list(APP)][:2] == [WAITING, DONE]
        assert len(store.list(APP)) == len({listing.id for listing in store.list(APP)})
        meta = ddb.get_item(TableName=new, Key={"pk": {"S": f"S#{APP}#{WAITING}"}, "sk": {"S": "#M"}})["Item"]
        assert meta["lpk"]["S"].startswith(APP) and meta["spk"]["S"] == f"{meta['status']['S']}#{meta['lpk']['S']}"
        store.close()
    finally:
        for table in (old, new):
            ddb.delete_table(TableName=table)
        ddb.close()
