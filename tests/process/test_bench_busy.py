"""``python -m bench busy``: a busy day in the fidelity harness, at AWS's capacity, on the quick sizes (CI): per
function a turn's latency (p50, p99) and its throttles, the throttles elsewhere, and the cost per turn at load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.busy import percentile

ROOT = Path(__file__).resolve().parents[2]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 0.99) == 3.0


@pytest.mark.backend("dynamodb")
@pytest.mark.timeout(900)
def test_bench_busy_prints_each_functions_latency_throttles_and_the_cost_per_turn(dynamodb_endpoint: str) -> None:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    env = {**os.environ, "BENCH_QUICK": "1", "TEST_DYNAMODB_ENDPOINT": dynamodb_endpoint}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "layers/dormant/python"), str(ROOT / "samples"), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "bench", "busy"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^\s+20 turns posted at once \(\d+ in the hot tenant\), \d+ answers, 40 sleeping", out, re.M), out
    rows = {m[0]: (int(m[1]), float(m[2]), float(m[3]), int(m[4])) for m in ROW.findall(out)}
    # every function a turn runs through, with its latency at load (p99 at least p50) and its throttles
    assert {"run", "resume", "park", "tools", "sessions"} <= set(rows), out
    for name, (calls, p50, p99, _) in rows.items():
        assert p99 >= p50 >= 0 and (calls > 0 or rows[name][3] > 0), (name, rows[name])
    assert rows["run"][0] >= 20  # each posted turn ran once at least
    assert re.search(r"^\s+throttles: .+; client answers: \{", out, re.M), out
    cost = re.search(r"AWS cost per turn at load: \$([\d,]+) per million turns \(dynamodb writes \$([\d,]+)", out)
    assert cost and float(cost[1].replace(",", "")) > 0, out
    # every partition's units summed: a turn writes at least its events and head (about 20 units: $12.50 a million)
    assert float(cost[2].replace(",", "")) >= 10, out


ROW = re.compile(r"^\s+(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", re.M)
