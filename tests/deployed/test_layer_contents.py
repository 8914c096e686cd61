"""What the Lambda layer ships: the library, nothing else (no samples, no helpers that start servers, no
web page). The library is copied as ``infra.bundle`` copies it into the layer (without the wheels pip adds).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from infra.bundle import LEFT_OUT, copy_packages
from infra.bundle import LIBRARY as SOURCE


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("layer") / "python"
    copy_packages(target, [SOURCE], leave_out=LEFT_OUT)
    return target


# The store compliance suite, a package by topic (``StoreContract`` is composed in its ``__init__``).
STORE_CONTRACT_MODULES = (
    "__init__",
    "base",
    "concurrency",
    "keys",
    "ledger",
    "lifecycle",
    "limits",
    "listing",
    "scoped",
)

# Every top-level entry of the package. A new one is a decision: add it here on purpose.
SHIPPED = {
    "__init__.py",
    "cli.py",
    "agents",
    "app.py",
    "audit.py",
    "aws.py",  # the process's one botocore session and its clients
    "bridges",  # dormant.bridges.adk: an ADK agent on Lambda brings google-adk itself
    "clock.py",
    "committed.py",
    "errors.py",
    "events.py",
    "ids.py",
    "lazy_ledger.py",
    "ledger.py",
    "merge.py",
    "metrics.py",
    "models",
    "people.py",
    "projection.py",
    "py.typed",
    "serving",
    "session.py",
    "session_input.py",
    "snapshots.py",
    "state",
    "stores",
    "testing",
    "transcript.py",
    "writes.py",
}


def _files(layer: Path) -> list[Path]:
    return [p for p in layer.rglob("*") if p.is_file()]


def test_the_layer_holds_the_dormant_package_only(layer: Path) -> None:
    assert {p.name for p in layer.iterdir()} == {"dormant"}
    assert {p.name for p in (layer / "dormant").iterdir()} == SHIPPED
    # the source holds the inspector too; the copy leaves it (and any bytecode) out
    assert {p.name for p in SOURCE.iterdir() if p.name != "__pycache__"} == SHIPPED | {"inspector"}
    assert not [p for p in _files(layer) if p.suffix == ".pyc" or "__pycache__" in p.parts]


def test_the_layer_ships_no_sample_and_no_test_server(layer: Path) -> None:
    paths = {p.relative_to(layer).as_posix() for p in _files(layer)}
    assert not [p for p in paths if "sample" in p or "bookings" in p]
    assert {p for p in paths if p.startswith("dormant/testing/")} == {
        "dormant/testing/__init__.py",
        "dormant/testing/mock.py",
        *(f"dormant/testing/store_contract/{m}.py" for m in STORE_CONTRACT_MODULES),
    }
    assert all(p.endswith(".py") or p.endswith("py.typed") for p in paths), sorted(paths)


def test_nothing_in_the_layer_imports_the_sample_or_starts_processes(layer: Path) -> None:
    for path in (layer / "dormant").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in {"bookings", "subprocess", "tests"}, f"{path.relative_to(layer)} imports {name}"
