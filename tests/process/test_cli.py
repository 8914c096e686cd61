"""``dormant erase`` and ``dormant purge``: the app named as the handlers name it, on a store URL, per tenant."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dormant.cli import main
from dormant.clock import frozen_clock, system_ms
from dormant.serving.runtime import for_tenant, load_served
from dormant.stores.sqlite import sqlite_store

DAY_MS = 24 * 3600 * 1000
RETAINED_APP = """
import bookings


def build(store):
    served = bookings.build(store=store)
    served.app.retention_ms = {ms}
    return served
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite file holding the Bookings app's sessions: user alex-doe in tenants t-1 and t-2, and sam-roe."""
    path = tmp_path / "dormant.db"
    store = sqlite_store(path)
    app = load_served("bookings:build", store).app
    for tenant in ("t-1", "t-2"):
        view = for_tenant(app, tenant)
        view.sessions.create("s-alex", scopes={"user": "alex-doe"})
        view.sessions.create("s-sam", scopes={"user": "sam-roe"})
        store.save_scoped_state(view.name, "user", "alex-doe", {"name": "Alex Doe"})
    store.close()
    return path


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_erase_removes_one_person_in_one_tenant(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run(
        "erase", "--store", f"sqlite:///{db}", "--tenant", "t-1", "--scope", "user", "--id", "alex-doe", capsys=capsys
    )
    assert code == 0
    # residue None: the store zeroed what it deleted and truncated its write-ahead log
    assert report == {
        "scope": "user",
        "scope_id": "alex-doe",
        "sessions": ["s-alex"],
        "scoped_keys": ["name"],
        "residue": None,
        "principal": None,  # run by the operator on the store, not by an API caller
    }
    store = sqlite_store(db, create=False)
    try:
        assert store.load("bookings@t-1", "s-alex") is None and store.load("bookings@t-1", "s-sam") is not None
        assert store.load_scoped_state("bookings@t-1", "user", "alex-doe") == {}
        assert store.load("bookings@t-2", "s-alex") is not None  # another tenant's alex-doe: untouched
        assert store.load_scoped_state("bookings@t-2", "user", "alex-doe") == {"name": "Alex Doe"}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--scope", "session", "--id", "s-alex"], "field: scope"),
        (["--scope", "user", "--id", "alex doe"], "field: scope_id"),
        (["--scope", "user", "--id", "alex-doe", "--tenant", "t@1"], "field: tenant"),
    ],
)
def test_bad_input_exits_2_naming_the_field_and_erases_nothing(
    db: Path, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    code, out, err = run("erase", "--store", f"sqlite:///{db}", "--tenant", "t-1", *argv, capsys=capsys)
    assert (code, out) == (2, None)
    assert named in err and "Traceback" not in err
    store = sqlite_store(db, create=False)
    try:
        assert store.load("bookings@t-1", "s-alex") is not None
        assert store.load_scoped_state("bookings@t-1", "user", "alex-doe") == {"name": "Alex Doe"}
    finally:
        store.close()


def test_a_missing_database_is_an_error_not_a_new_empty_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo.db"
    code, out, err = run("purge", "--store", f"sqlite:///{missing}", capsys=capsys)
    assert (code, out) == (2, None) and "typo.db" in err
    assert not missing.exists()


def test_purge_deletes_expired_sessions_in_every_tenant(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "retained.py").write_text(RETAINED_APP.format(ms=30 * DAY_MS))
    monkeypatch.syspath_prepend(str(tmp_path))
    url = f"sqlite:///{db}"
    with frozen_clock(system_ms() + 31 * DAY_MS) as clock:  # the fixture's sessions are 31 days idle
        store = sqlite_store(db, create=False)
        for_tenant(load_served("retained:build", store).app, "t-1").sessions.create("s-new")
        store.close()
        code, done, _ = run("purge", "--app", "retained:build", "--store", url, "--tenant", "t-2", capsys=capsys)
        assert code == 0 and done == {"purged": {"bookings@t-2": ["s-sam", "s-alex"]}}
        code, done, _ = run("purge", "--app", "retained:build", "--store", url, capsys=capsys)
        assert code == 0 and done == {"purged": {"bookings@t-1": ["s-sam", "s-alex"]}}
        clock.advance(31 * DAY_MS)
        code, done, _ = run("purge", "--app", "retained:build", "--store", url, capsys=capsys)
        assert done == {"purged": {"bookings@t-1": ["s-new"]}}
    code, done, err = run("purge", "--store", url, capsys=capsys)  # Bookings itself keeps sessions for ever
    assert (code, done) == (0, {"purged": {}}) and "no retention" in err


def test_the_console_script_runs_as_its_own_process(db: Path) -> None:
    script = Path(sys.executable).parent / "dormant"
    argv = [str(script), "erase", "--store", f"sqlite:///{db}", "--tenant", "t-2", "--scope", "user", "--id", "sam-roe"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sessions"] == ["s-sam"]


def test_erase_that_leaves_residue_exits_3_naming_it_and_a_second_run_exits_0(db: Path) -> None:
    """Another process reading the SQLite file holds its write-ahead log, so the erased rows stay in the
    ``-wal`` file: the erasure is done as far as the database goes, but not gone from the disk."""
    script = Path(sys.executable).parent / "dormant"
    argv = [str(script), "erase", "--store", f"sqlite:///{db}", "--tenant", "t-1", "--scope", "user", "--id"]
    reader = sqlite3.connect(db, isolation_level=None, timeout=5)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM sessions").fetchone()[0] > 0  # a read snapshot held
        done = subprocess.run([*argv, "alex-doe"], capture_output=True, text=True, timeout=120, check=False)
    finally:
        reader.close()
    assert done.returncode == 3, (done.returncode, done.stderr)
    report = json.loads(done.stdout)  # the report is still printed: what was removed, what remains
    assert report["sessions"] == ["s-alex"] and f"{db}-wal" in report["residue"]
    assert "dormant erase:" in done.stderr and f"{db}-wal" in done.stderr and "Traceback" not in done.stderr

    again = subprocess.run([*argv, "alex-doe"], capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "scope": "user",
        "scope_id": "alex-doe",
        "sessions": [],
        "scoped_keys": [],
        "residue": None,
        "principal": None,
    }


@pytest.mark.backend("dynamodb")
def test_erase_on_dynamodb_removes_the_apis_results_kept_for_retries(
    dynamodb_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run over the API with an Idempotency-Key keeps its answer (the patient's name in it) for retries:
    ``dormant erase`` deletes those records with the sessions, in the tenant erased only."""
    import uuid

    from dormant.serving.api import records
    from dormant.serving.idempotency import DynamoDBIdempotency
    from dormant.stores.dynamodb import DynamoDBSessionStore
    from dormant.stores.url import store_from_url
    from tests.support.servers.dynamodb import ACCESS_KEY, REGION
    from tests.support.servers.dynamodb import client as dynamodb_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    url = f"dynamodb://cli-{uuid.uuid4().hex[:12]}?endpoint={dynamodb_endpoint}&region={REGION}"
    store = store_from_url(url)
    assert isinstance(store, DynamoDBSessionStore)
    ddb = dynamodb_client(dynamodb_endpoint)
    try:
        app = load_served("bookings:build", store).app
        context = SimpleNamespace(function_name="dormant-cli-test", get_remaining_time_in_millis=lambda: 29_000)
        idempotency = DynamoDBIdempotency(store.table_name, client=ddb)
        for tenant in ("t-1", "t-2"):
            view = for_tenant(app, tenant)
            view.sessions.create("s-alex", scopes={"user": "alex-doe"})
            idempotency.once(
                records(view, "s-alex"), "k-1", "POST /sessions/s-alex/runs", lambda: {"for": "Alex Doe"}, context
            )

        def kept() -> set[str]:
            return {
                i["pk"]["S"] for i in ddb.scan(TableName=store.table_name)["Items"] if i["pk"]["S"].startswith("I#")
            }

        assert kept() == {"I#bookings@t-1#s-alex", "I#bookings@t-2#s-alex"}
        code, report, _ = run(
            "erase", "--store", url, "--tenant", "t-1", "--scope", "user", "--id", "alex-doe", capsys=capsys
        )
        assert code == 0 and report["sessions"] == ["s-alex"]
        assert kept() == {"I#bookings@t-2#s-alex"}
    finally:
        ddb.close()
        store.close()


# -- options a newcomer mistypes: a usage error (exit 2) naming the option, never a traceback ----------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--port", "-1"], "--port"),
        (["serve", "--port", "eighty"], "--port"),
        (["serve", "--sweep-every", "-1"], "--sweep-every"),
        (["serve", "--sweep-every", "nan"], "--sweep-every"),
        (["serve", "--sweep-every", "inf"], "--sweep-every"),
        (["migrate-table", "--from", "a", "--to", "b", "--listing-shards", "0"], "--listing-shards"),
        (["migrate-table", "--from", "a", "--to", "b", "--pending-shards", "0"], "--pending-shards"),
        (["migrate-table", "--from", "a", "--to", "b", "--listing-shards", "-3"], "--listing-shards"),
        (["migrate-table", "--from", "a", "--to", "b", "--pending-shards", "-3"], "--pending-shards"),
    ],
)
def test_an_option_out_of_its_range_is_a_usage_error_naming_it(tmp_path: Path, argv: list[str], option: str) -> None:
    """One rule for every count and number: out of range is refused before anything starts (the shard counts'
    0 was read as "the old table's", and a port past 65535 was an OverflowError from the socket)."""
    done = subprocess.run(
        [sys.executable, "-m", "dormant.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done
    assert f"argument {option}:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # no store made, no table touched


def test_serve_makes_a_missing_sqlite_store_and_says_so_where_erase_and_purge_refuse_it(tmp_path: Path) -> None:
    """The rule (docs/development.md): a command that starts a store (``dormant serve``, ``bookings ask``) makes a
    missing one, folders too, and says where on stderr so a typo shows; one that acts on stored data (``erase``,
    ``purge``, bookings' other commands) refuses a missing one, exit 2."""
    from tests.support.serve_calls import call
    from tests.support.servers.serve import dormant_serve

    pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")
    url = "sqlite:///typo/dir/x.db"
    for operation in (["purge"], ["erase", "--scope", "user", "--id", "alex-doe"]):
        done = subprocess.run(
            [sys.executable, "-m", "dormant.cli", *operation, "--store", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert list(tmp_path.iterdir()) == []
    with dormant_serve("--store", url, "--quiet", "--workers", "1", cwd=tmp_path) as server:
        assert call(f"{server.url}/sessions")[0] == 200
    made = "no store at typo/dir/x.db: made a new, empty one there and the folder typo"
    assert made in server.output() and (tmp_path / "typo/dir/x.db").is_file()
    with dormant_serve("--store", url, "--quiet", "--workers", "1", cwd=tmp_path) as again:
        pass
    assert "no store at" not in again.output()


def test_serve_help_lists_the_routes_and_says_what_holds_a_worker(tmp_path: Path) -> None:
    """``dormant serve --help`` is the API's first page: its epilog is formatted (a brace in it once crashed it)."""
    done = subprocess.run(
        [sys.executable, "-m", "dormant.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "GET /sessions/{id}/events" in done.stdout and "A long-poll" in done.stdout
