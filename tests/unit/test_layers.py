"""The library's boundaries: no module reaches into a Session's private attributes.

(The import layers are checked by ``lint-imports`` in ``make lint``; see docs/development.md.)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dormant
from dormant import adk
from dormant.session import Session

PACKAGE = Path(dormant.__file__).parent


def session_private_names() -> set[str]:
    session = adk(name="layers").sessions.ephemeral()
    names = set(vars(session)) | {n for klass in Session.__mro__ for n in vars(klass)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_reaches(package: Path, private: set[str]) -> list[str]:
    """``x._name`` for a Session private ``_name``, anywhere but session.py, where ``x`` is not ``self``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "session.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno} .{node.attr}")
    return found


def test_the_scan_sees_a_private_reach(tmp_path: Path) -> None:
    (tmp_path / "session.py").write_text("class Session:\n    pass\n")
    (tmp_path / "loop.py").write_text("def f(session):\n    return session._events, self_._x\n")
    assert private_reaches(tmp_path, {"_events"}) == ["loop.py:2 ._events"]


def test_no_module_outside_session_touches_a_session_private_attribute() -> None:
    private = session_private_names()
    assert {"_events", "_projection", "_runtime"} <= private
    assert private_reaches(PACKAGE, private) == []


def test_importing_dormant_does_not_import_the_provider_sdks() -> None:
    code = (
        "import sys, dormant, dormant.models.openai, dormant.models.bedrock; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'openai', 'boto3', 'botocore', 'httpx', 'httpx2'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
