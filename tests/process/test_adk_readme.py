"""The "Using dormant from Google ADK" example (docs/adk.md, linked from the README) runs as written, through
ADK's ``Runner``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")
pytestmark = pytest.mark.backend("adk")

PAGE = Path(__file__).parents[2] / "docs" / "adk.md"


def test_the_adk_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    [block] = [
        b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S) if "DormantSessionService" in b
    ]
    monkeypatch.chdir(tmp_path)  # it writes adk-triage.db where it runs
    exec(compile(block, "docs/adk.md (Google ADK)", "exec", dont_inherit=True), {"__name__": "readme_adk"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Noted. Anything else?"
    kinds = ast.literal_eval(out[1])  # the ledger's event types, as printed
    assert kinds.count("adk_event") == 4 and kinds.count("state_change") == 2
    assert out[2] == "['ada.visit-1']"
    assert (tmp_path / "adk-triage.db").exists()
