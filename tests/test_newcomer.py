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


def _invoke(*args: str, cwd: Path, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "functions" / "invoke.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env={
            **{k: v for k, v in os.environ.items() if k != "DORMANT_STATE_MACHINE"},
            "PYTHONPATH": os.pathsep.join(sys.path),
            "DORMANT_STORE": store,
            "DORMANT_APP": "bookings:build",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        },
    )


def test_make_invoke_runs_every_sample_event_in_order_and_again(tmp_path: Path) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    store = f"sqlite:///{tmp_path / 'invoke.db'}"
    samples = sorted(str(p.relative_to(ROOT / "events")) for p in (ROOT / "events").rglob("*.json"))
    seen: list[set[str]] = []
    for _ in range(2):  # fresh sessions each time: the same store takes it again
        done = _invoke("--all", cwd=tmp_path, store=store)
        assert done.returncode == 0, done.stdout + done.stderr
        steps = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "BAD"))]
        assert steps and all(line.startswith("ok ") for line in steps), done.stdout
        assert sorted({line.split()[3].rstrip(":") for line in steps}) == samples  # every sample, none left out
        assert "Traceback" not in done.stderr
        seen.append({line.split()[1] for line in steps})
    assert len(seen[0]) == 3 and not seen[0] & seen[1]  # three sessions a run, new ids the second time
    for line in steps:  # what the events that failed before now answer
        if "api/tools.json" in line:
            assert ": 202 " in line  # the call the run yielded, answered (the sample's call-sample was a 400)
        if "api/commit.json" in line:
            assert ": 200 " in line  # after the version it read (the sample's fixed 1 was a 409)


def test_invoking_run_alone_says_it_needs_the_state_machine(tmp_path: Path) -> None:
    done = _invoke("run", str(ROOT / "events" / "api" / "run.json"), cwd=tmp_path, store="memory:")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "needs DORMANT_STATE_MACHINE" in done.stderr and "--all" in done.stderr
