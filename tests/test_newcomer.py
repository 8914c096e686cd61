"""A newcomer's first commands: ``make demo``, then ``make serve`` (or ``dormant serve``), then the README's curl.

A fresh venv is too slow for a test, so the venv ``make demo`` builds (dormant alone, no lambda extra) is
played by a ``dormant serve`` whose import of Powertools fails, as it fails there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_WITHOUT = """
import sys
sys.modules[{module!r}] = None  # import of it raises ModuleNotFoundError, as in a venv without it
from dormant.cli import main
sys.exit(main(["serve", "--port", "0", "--store", "memory:", "--sweep-every", "0"]))
"""


def _serve_without(module: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_dormant_serve_without_the_lambda_extra_says_how_to_get_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    done = _serve_without("aws_lambda_powertools", tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("dormant serve: needs the lambda extra")
    assert "make serve" in line and ".[lambda]" in line and "aws_lambda_powertools is not installed" in line


def test_a_module_missing_for_another_reason_is_not_blamed_on_the_extra(tmp_path: Path) -> None:
    done = _serve_without("dormant.serving.local", tmp_path)  # a bug, not a missing extra: its traceback shows it
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "needs the lambda extra" not in done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_serve_installs_the_lambda_extra_then_runs_dormant_serve(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # make -n: what it would run, into a venv of its own (nothing is run)
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "serve", f"VENV={venv}", "SERVE_ARGS=--port 8001"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("make")]
    install = next(n for n, line in enumerate(lines) if "pip install" in line)
    assert lines[install].endswith("-e '.[lambda]'")
    assert lines[-1] == f"{venv}/bin/dormant serve --port 8001"
    assert install < len(lines) - 1
