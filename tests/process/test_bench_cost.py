"""``python -m bench cost`` on the quick sizes (CI): it runs and prints its table; item sizes and
transactional units are billed as AWS bills them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cost import bill, item_size, transaction_units, value_size

ROOT = Path(__file__).resolve().parents[2]


def test_item_sizes_and_transaction_units() -> None:
    assert value_size({"S": "héllo"}) == 6
    assert value_size({"N": "12345"}) == 4  # (5 digits + 1) // 2 + 1
    assert value_size({"BOOL": True}) == 1
    assert value_size({"M": {"a": {"S": "xy"}}}) == 3 + 1 + 1 + 2
    assert item_size({"pk": {"S": "a" * 10}, "n": {"N": "7"}}) == 2 + 10 + 1 + 2
    # 2 write units per KB of each item, rounded up: a 1-byte, a 1 KB and a 1.5 KB item
    assert [transaction_units(s) for s in (1, 1024, 1536)] == [2, 2, 4]


def test_the_bill_prices_each_line_from_the_one_table() -> None:
    from bench.prices import PRICES

    units = {("run", "t", "write"): 10.0, ("run", "t", "read"): 4.0}
    harness = {"gbs:run": 2.0, "lambda_requests": 1, "api_requests": 1, "transitions": 4, "log_bytes": 1e9}
    costs = bill(units, harness, 0)
    assert costs["dynamodb writes"] == pytest.approx(10 * PRICES["dynamodb_write_unit"])
    assert costs["step functions"] == pytest.approx(4 * PRICES["state_transition"])
    assert costs["logs"] == pytest.approx(PRICES["log_gb"]) and costs["model"] == 0


@pytest.mark.backend("dynamodb")
def test_bench_cost_runs_on_the_quick_sizes_and_prints_its_table(dynamodb_endpoint: str) -> None:
    pytest.importorskip("aws_cdk", reason="the harness synthesizes the CDK app (the infra extra)")
    env = {**os.environ, "BENCH_QUICK": "1", "TEST_DYNAMODB_ENDPOINT": dynamodb_endpoint}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "layers/dormant/python"), str(ROOT / "samples"), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "bench", "cost"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # Index lines are not required: an ordinary commit is now one TransactWriteItems, for which DynamoDB Local
    # reports no per-index units (the bill's index writes of transactions are an open gap, issue 25).
    for heading in ("chat turn", "approval turn", "gbs:resume", "transitions", "dynamodb run      table"):
        assert heading in out, heading
    assert out.count("AWS total") == 2 and "per million turns" in out
