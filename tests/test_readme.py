"""The README's tour runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_the_tour_and_the_yielding_tools_run(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tour, yielding = blocks[0], next(block for block in blocks if "yield_schema=" in block)
    assert "app.run(" in tour and "triage" in tour
    namespace: dict[str, object] = {}
    exec(compile(tour, "README.md (tour)", "exec", dont_inherit=True), namespace)
    exec(compile(yielding, "README.md (yielding tools)", "exec", dont_inherit=True), namespace)
    session = namespace["session"]
    assert session.status == "completed" and session.version == 3  # type: ignore[attr-defined]


def test_the_first_lines_are_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[2] == "```sh" and lines[3].startswith("make demo") and lines[4].startswith("make test")
