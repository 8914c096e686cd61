"""Cold start: each Lambda handler module imported by a fresh interpreter, against ``import boto3``.

A Lambda cold start pays the interpreter, the handler module's imports and its module-level setup (the
app, the store's client, the Powertools resolver). Each figure is the median CPU time of 10 fresh interpreters
loading ``functions/<name>/app.py`` as Lambda does, with the deployed configuration (the DynamoDB store,
tracing off), over the median of 10 running ``import boto3`` (the AWS SDK, which any handler that
talks to AWS was expected to pay), the two interleaved so both see the same machine load.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .common import Figure, millis, paired, scale

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
TARGET = 1.5
LOAD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert callable(module.handler)
"""
SERVE = """
import json, types
context = types.SimpleNamespace(function_name="bench", memory_limit_in_mb=512, aws_request_id="bench",
                                invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:bench")
answer = module.handler(json.loads(open(sys.argv[2]).read()), context)
assert answer["statusCode"] < 500, answer
"""
FIRST_REQUESTS = {"sessions": "create_session.json", "commit": "commit.json"}
"""The functions that never run an agent, and a first request of each (a sample event of its route)."""
ENV = {
    "DORMANT_STORE": "dynamodb://bench-table?region=us-east-1",
    "DORMANT_APP": "bookings:build",
    "DORMANT_STATE_MACHINE": "arn:aws:states:us-east-1:123456789012:stateMachine:bench",
    "DORMANT_IDEMPOTENCY_TABLE": "bench-table",
    "POWERTOOLS_SERVICE_NAME": "dormant",
    "POWERTOOLS_METRICS_NAMESPACE": "dormant",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "PYDANTIC_DISABLE_PLUGINS": "__all__",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
}


def fresh_interpreter(args: list[str], env: dict[str, str]) -> float:
    """CPU time (user + system) of ``python <args>`` in a new process.

    CPU, not wall time: importing is CPU-bound, and on a shared machine the wall time mostly measures
    the other processes (the floor's own wall time varied 3x under load, its CPU time hardly at all).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run() -> list[Figure]:
    runs = scale(10, 2)
    figures = []
    with tempfile.TemporaryDirectory() as pycache:
        # Compiled once, in the warm-up, into a cache of its own: a deployed layer ships its .pyc, so no
        # figure may include compiling the sources (which PYTHONDONTWRITEBYTECODE would force on every run).
        env = {**os.environ, **ENV, "PYTHONPYCACHEPREFIX": pycache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for path in sorted(FUNCTIONS.glob("*/app.py")):
            name = path.parent.name
            ours, floor = paired(
                importing(path, env),
                lambda n: fresh_interpreter(["-c", "import boto3"], env),
                runs,
            )
            figures.append(
                Figure(
                    "cold_start",
                    f"cold import of functions/{name}",
                    millis(ours),
                    millis(floor) + " (import boto3)",
                    ours / floor,
                    TARGET,
                    "lower",
                )
            )
            if name in FIRST_REQUESTS:
                first_request(name, path, env, runs, Path(pycache))
    return figures


def importing(path: Path, env: dict[str, str]) -> Callable[[int], float]:
    return lambda n: fresh_interpreter(["-c", LOAD, str(path)], env)


def first_request(name: str, path: Path, env: dict[str, str], runs: int, scratch: Path) -> None:
    """Print what the import leaves to the first request: the app, and the validators its route builds.

    Printed for reference, not judged: on AWS the first request also makes the store's client and its
    first calls, which no local figure measures fairly. The store is a SQLite file holding the sample
    session (``create_session.json``), copied afresh for each run, so the figure is the library's work.
    The import alone is measured again, interleaved, so both see the same machine.
    """
    template, db = scratch / "first-request.db", scratch / "served.db"
    env = {**env, "DORMANT_STORE": f"sqlite:///{db}"}
    env.pop("DORMANT_IDEMPOTENCY_TABLE")  # no Idempotency-Key in these events: no table needed
    if not template.exists():
        serve(FUNCTIONS / "sessions" / "app.py", "create_session.json", env)
        shutil.copyfile(db, template)

    def served(n: int) -> float:
        shutil.copyfile(template, db)
        return serve(path, FIRST_REQUESTS[name], env)

    both, imported = paired(served, importing(path, env), runs)
    print(
        f"  (for reference) functions/{name} imported and serving its first request ({FIRST_REQUESTS[name]}): "
        f"{millis(both)}, the import alone {millis(imported)}: the request adds {millis(both - imported)}"
    )


def serve(path: Path, event: str, env: dict[str, str]) -> float:
    return fresh_interpreter(["-c", LOAD + SERVE, str(path), str(ROOT / "events" / "api" / event)], env)
