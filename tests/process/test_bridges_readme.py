"""The README's "Using dormant from LangGraph" and "... from the OpenAI Agents SDK" examples run as written: a real
``StateGraph`` interrupted for a person's answer and resumed by a fresh saver; a real ``Runner.run`` on a session."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def _block(heading: str) -> str:
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return str(block)


@pytest.mark.backend("langgraph")
def test_the_langgraph_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("langgraph.graph")
    block = _block("Using dormant from LangGraph")
    assert "interrupt(" in block and "Command(resume=" in block and block.count("DormantSaver(") == 2
    monkeypatch.chdir(tmp_path)  # it writes refunds.db where it runs
    exec(compile(block, "README.md (LangGraph)", "exec", dont_inherit=True), {"__name__": "readme_langgraph"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Refund 30 EUR?"
    assert ast.literal_eval(out[1]) == {"amount": 30, "approved": True}
    kinds = ast.literal_eval(out[2])
    assert kinds.count("checkpoint") == 3 and "writes" in kinds  # small values ride in their checkpoint's event
    assert (tmp_path / "refunds.db").exists()


@pytest.mark.backend("openai-agents")
def test_the_agents_sdk_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("agents")
    block = _block("Using dormant from the OpenAI Agents SDK")
    assert "Runner.run(" in block and "(Model)" in block
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md (Agents SDK)", "exec", dont_inherit=True), {"__name__": "readme_agents"})
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["That makes 1 messages.", "That makes 2 messages."]  # the second run saw the first
    assert ast.literal_eval(out[2]) == ["user", "assistant", "user", "assistant"]
    assert ast.literal_eval(out[3]) == ["openai_agents"] * 4
