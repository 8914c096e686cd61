"""Test-wide rules.

Backends: a test marked ``@pytest.mark.backend("postgres")`` (or a module with that ``pytestmark``)
needs that backend. Without it the test skips with the reason — but a backend named in
``DORMANT_REQUIRE_BACKENDS`` (CI sets it) must run: any skip of its tests fails the whole session.
"""

from __future__ import annotations

import os

import pytest

REQUIRED = {name.strip() for name in os.environ.get("DORMANT_REQUIRE_BACKENDS", "").split(",") if name.strip()}
_backend_of: dict[str, str] = {}
_skipped_required: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("backend")
        if marker is not None and marker.args:
            _backend_of[item.nodeid] = str(marker.args[0])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    backend = _backend_of.get(report.nodeid)
    if report.skipped and backend in REQUIRED:
        _skipped_required.append(f"{report.nodeid} ({backend})")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped_required:
        terminalreporter.section("required backends were skipped", red=True)
        for line in _skipped_required:
            terminalreporter.line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_required and session.exitstatus == 0:
        session.exitstatus = 1
