"""Cold start: each Lambda handler module imported by a fresh interpreter, against ``import boto3``.

A Lambda cold start pays the interpreter, the handler module's imports and its module-level setup (the
app, the store's client, the Powertools resolver). Each figure is the median of 10 fresh interpreters
loading ``functions/<name>/app.py`` as Lambda does, with the deployed configuration (the DynamoDB store,
tracing off), over the median of 10 running ``import boto3``: the floor every handler on AWS pays.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .common import Figure, millis, scale

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
ENV = {
    "DORMANT_STORE": "dynamodb://bench-table?region=us-east-1",
    "DORMANT_APP": "bookings:build",
    "DORMANT_STATE_MACHINE": "arn:aws:states:us-east-1:123456789012:stateMachine:bench",
    "DORMANT_IDEMPOTENCY_TABLE": "bench-table",
    "POWERTOOLS_SERVICE_NAME": "dormant",
    "POWERTOOLS_METRICS_NAMESPACE": "dormant",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
}


def fresh_interpreter(args: list[str], runs: int) -> float:
    """Median wall time of ``python <args>`` in a new process, after one discarded warm-up (``.pyc`` written)."""
    env = {**os.environ, **ENV}
    samples = []
    for attempt in range(runs + 1):
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
        if attempt:
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def run() -> list[Figure]:
    runs = scale(10, 2)
    floor = fresh_interpreter(["-c", "import boto3"], runs)
    figures = []
    for path in sorted(FUNCTIONS.glob("*/app.py")):
        name = path.parent.name
        ours = fresh_interpreter(["-c", LOAD, str(path)], runs)
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
    return figures
