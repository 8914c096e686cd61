"""``make bench`` imports most of what it needs inside the functions that need it (a section runs without the
others' drivers), so a name moved elsewhere shows only when that section runs. This reads every ``from ... import``
in bench/, at any depth, and checks each name of dormant, of the bench or of the test helpers is there."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
OURS = ("bench", "dormant", "tests")


def _imports() -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            # ``from .units import x``, and ``from . import cost_docs`` (a module of the package itself)
            module = "bench" + (f".{node.module}" if node.module else "") if node.level == 1 else (node.module or "")
            if module.split(".")[0] in OURS:
                found += [(path.name, node.lineno, module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize(("where", "line", "module", "name"), _imports())
def test_every_name_the_bench_imports_is_there(where: str, line: int, module: str, name: str) -> None:
    imported = importlib.import_module(module)
    if not hasattr(imported, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: raises if it is not one either


def test_the_scan_sees_the_bench_imports() -> None:
    assert len(_imports()) > 50 and any(module == "bench.postgres" for _, _, module, _ in _imports())
