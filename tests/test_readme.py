"""The README's tour runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_the_tour_runs(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tour = blocks[0]
    assert "app.run(" in tour and "triage" in tour
    exec(compile(tour, "README.md (tour)", "exec", dont_inherit=True), {})


def test_the_first_lines_are_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[2] == "```sh" and lines[3].startswith("make demo") and lines[4].startswith("make test")
