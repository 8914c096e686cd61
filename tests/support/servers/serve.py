"""``dormant serve`` as a separate process, for tests and benchmarks: started on a free port, stopped with Ctrl-C.

``dormant_serve("--store", url)`` runs the installed ``dormant`` command (the one beside this Python), waits
for the line that says where it listens, yields the running ``ServeProcess``, then sends SIGINT and waits
for a clean exit. Its output goes to files, so a long run never fills a pipe; every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LISTENING = re.compile(r" at (http://\S+) ")


@dataclass
class ServeProcess:
    url: str
    process: subprocess.Popen[bytes]
    logs: Path
    kept: str | None = None
    """The output, kept once the server stopped (its log files are gone then)."""

    def output(self) -> str:
        """What the server wrote so far (stdout, then stderr)."""
        if self.kept is not None:
            return self.kept
        return "\n".join((self.logs / name).read_text(errors="replace") for name in ("stdout", "stderr"))

    def stop(self, timeout: float = 30) -> int:
        """Ctrl-C, then wait for the exit; its exit code. A server that does not stop dumps its threads and dies."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)  # faulthandler (PYTHONFAULTHANDLER) prints every thread's stack
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
            raise TimeoutError(f"dormant serve did not stop in {timeout} s:\n{self.output()}") from None


FIDELITY_APPS = Path(__file__).resolve().parents[1] / "fidelity"
"""Where ``fidelity_app`` lives: ``--app fidelity_app:build`` needs it on the server's path."""


def fidelity_app_env() -> dict[str, str]:
    """The environment of a ``dormant serve --app fidelity_app:build``: the fidelity app and this checkout on its
    path, and the AWS keys (when set) that a DynamoDB Local store needs."""
    root = Path(__file__).resolve().parents[3]
    env = {"PYTHONPATH": os.pathsep.join([str(FIDELITY_APPS), str(root), *sys.path])}
    env.update(
        {name: os.environ[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if name in os.environ}
    )
    return env


def shown_once_past(url: str, session_id: str, statuses: Container[str], timeout: float, every: float = 0.1) -> Any:
    """``GET /sessions/{session_id}`` of the server at ``url`` until its status is none of ``statuses`` (within
    ``timeout`` seconds, or the assertion fails): the session as it shows then."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{url}/sessions/{session_id}", timeout=30) as response:
            shown = json.loads(response.read())
        if shown["status"] not in statuses:
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(every)


def command() -> list[str]:
    script = Path(sys.executable).with_name("dormant")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dormant.cli"]


@contextlib.contextmanager
def dormant_serve(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60,
    ignoring_sigint: bool = False,
) -> Iterator[ServeProcess]:
    """``dormant serve --port 0 *args`` running for the ``with`` block (``ignoring_sigint``: started as a
    shell starts a background job, with SIGINT ignored)."""
    argv = [*command(), "serve", "--port", "0", *args]
    with serving_process(argv, env=env, cwd=cwd, timeout=timeout, ignoring_sigint=ignoring_sigint) as server:
        yield server


@contextlib.contextmanager
def clinic_serve(store: tuple[str, Mapping[str, str]], cwd: Path, timeout: float) -> Iterator[ServeProcess]:
    """``dormant serve`` of the Bookings sample on ``store`` (its URL and environment) as the principal ``clinic``;
    once it stops, its log holds no traceback."""
    url, env = store
    with dormant_serve("--store", url, "--principal", "clinic", env=env, cwd=cwd, timeout=timeout) as process:
        yield process
    assert "Traceback" not in process.output()


@contextlib.contextmanager
def serving_process(
    argv: list[str],
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60,
    ignoring_sigint: bool = False,
) -> Iterator[ServeProcess]:
    """Any server process that prints ``... at http://host:port ...`` once it listens, and stops on SIGINT."""
    with tempfile.TemporaryDirectory(prefix="dormant-serve-") as scratch:
        logs = Path(scratch)
        with (logs / "stdout").open("wb") as stdout, (logs / "stderr").open("wb") as stderr:
            process = subprocess.Popen(
                ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv] if ignoring_sigint else argv,
                stdout=stdout,
                stderr=stderr,
                cwd=cwd,
                env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
            )
        server = ServeProcess("", process, logs)
        try:
            deadline = time.monotonic() + timeout
            while not (found := _LISTENING.search((logs / "stdout").read_text(errors="replace"))):
                if process.poll() is not None:
                    raise RuntimeError(f"{argv[0]} exited with {process.returncode}:\n{server.output()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{argv[0]} did not start in {timeout} s:\n{server.output()}")
                time.sleep(0.05)
            server.url = found.group(1)
            yield server
        finally:
            try:
                server.stop()
            finally:
                server.kept = server.output()
