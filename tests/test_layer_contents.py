"""What the Lambda layer ships: the library, nothing else (no samples, no helpers that start servers)."""

from __future__ import annotations

import ast
from pathlib import Path

LAYER = Path(__file__).resolve().parents[1] / "layers" / "dormant" / "python"
LIBRARY = LAYER / "dormant"

# Every top-level entry of the package. A new one is a decision: add it here on purpose.
SHIPPED = {
    "__init__.py",
    "cli.py",
    "agents",
    "app.py",
    "clock.py",
    "errors.py",
    "events.py",
    "ids.py",
    "models",
    "projection.py",
    "serving",
    "session.py",
    "snapshots.py",
    "state",
    "stores",
    "testing",
    "transcript.py",
}


def _files() -> list[Path]:
    return [p for p in LAYER.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def test_the_layer_holds_the_dormant_package_only() -> None:
    assert {p.name for p in LAYER.iterdir() if p.name != "__pycache__"} == {"dormant"}
    assert {p.name for p in LIBRARY.iterdir() if p.name != "__pycache__"} == SHIPPED


def test_the_layer_ships_no_sample_and_no_test_server() -> None:
    paths = {p.relative_to(LAYER).as_posix() for p in _files()}
    assert not [p for p in paths if "sample" in p or "bookings" in p]
    assert {p for p in paths if p.startswith("dormant/testing/")} == {
        "dormant/testing/__init__.py",
        "dormant/testing/mock.py",
        "dormant/testing/store_contract.py",
    }
    assert all(p.endswith(".py") or p.endswith("py.typed") for p in paths), sorted(paths)


def test_nothing_in_the_layer_imports_the_sample_or_starts_processes() -> None:
    for path in LIBRARY.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in {"bookings", "subprocess", "tests"}, f"{path.relative_to(LAYER)} imports {name}"
