"""The suite's own layout (tests/README.md): every test module in a tier folder, marked with its tier, and helpers
imported one way, from ``tests.support``; no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIERS = {"unit", "contract", "http", "deployed", "process"}
HELPERS = {path.stem for path in (TESTS / "support").iterdir() if path.suffix == ".py" or path.is_dir()}


def test_every_test_module_is_in_a_tier_folder() -> None:
    misplaced = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.parent.parent != TESTS or path.parent.name not in TIERS
    ]
    assert misplaced == [], "put each in the folder of its tier (tests/README.md)"


def imported(path: Path) -> list[str]:
    """The modules a file imports by name (``import x``, ``from x import y``; not relative imports)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_helpers_come_from_tests_support_and_no_test_module_imports_another() -> None:
    wrong = [
        f"{path.relative_to(TESTS)}: {name}"
        for path in TESTS.rglob("*.py")
        for name in imported(path)
        if (name.startswith("tests.") and not name.startswith("tests.support"))
        or name.split(".")[0] in HELPERS
        or name.split(".")[0].startswith("test_")
    ]
    assert wrong == []


def test_a_test_carries_the_marker_of_its_tier(request: pytest.FixtureRequest) -> None:
    assert {marker.name for marker in request.node.iter_markers()} & TIERS == {"unit"}
