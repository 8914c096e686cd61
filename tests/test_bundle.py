"""The layers ship their modules compiled for the Lambda runtime's Python, so no cold start compiles them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra.bundle import PYTHON_VERSION, bundle_app, compile_for_runtime, runtime_python

RUNTIME_PYTHON = runtime_python()
# CI requires this backend (DORMANT_REQUIRE_BACKENDS): the layers built there ship compiled modules.
needs_runtime_python = pytest.mark.skipif(
    RUNTIME_PYTHON is None,
    reason=f"no Python {PYTHON_VERSION} (DORMANT_LAYER_PYTHON, python{PYTHON_VERSION} on PATH, or pyenv)",
)


@pytest.mark.backend("runtime-python")
@needs_runtime_python
def test_the_app_layer_ships_unchecked_hash_pyc_that_the_runtime_python_loads(tmp_path: Path) -> None:
    source = tmp_path / "src" / "agentapp"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "tools.py").write_text("ANSWER = 42\n")
    bundle_app(tmp_path / "out", [source])
    package = tmp_path / "out" / "python" / "agentapp"
    tag = f"cpython-{PYTHON_VERSION.replace('.', '')}"
    for name in ("__init__", "tools"):
        compiled = package / "__pycache__" / f"{name}.{tag}.pyc"
        assert compiled.exists(), compiled
        flags = int.from_bytes(compiled.read_bytes()[4:8], "little")
        assert flags == 0b01  # hash-based, unchecked: no file times involved, no source read at import
    # Read-only on Lambda: the runtime's Python must load these, not compile the sources again.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "out" / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run(
        [str(RUNTIME_PYTHON), "-v", "-c", "import agentapp.tools"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert f"code object from '{package / '__pycache__' / f'tools.{tag}.pyc'}'" in done.stderr
    assert f"code object from {package / 'tools.py'}" not in done.stderr


def test_without_the_runtime_python_the_layer_ships_sources_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "module.py").write_text("X = 1\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.delenv("DORMANT_LAYER_PYTHON", raising=False)
    assert compile_for_runtime(tmp_path) is False
    assert "ships no .pyc" in capsys.readouterr().err
    assert not (tmp_path / "__pycache__").exists()
