"""The one table of prices ``python -m bench cost`` uses: AWS list prices, on-demand, for one region and date.

Change a figure here and every printed cost follows. Sources: the AWS pricing pages of each service
(DynamoDB on-demand, Lambda, API Gateway REST, Step Functions Standard, CloudWatch Logs).
"""

from __future__ import annotations

from typing import Any

REGION = "us-east-1"
DATE = "2026-12-01"
PRICES = {
    "dynamodb_write_unit": 0.625 / 1e6,  # on-demand, per write request unit
    "dynamodb_read_unit": 0.125 / 1e6,  # on-demand, per read request unit
    "lambda_gb_second": 0.0000133334,  # arm64, first 7.5 billion GB-s a month
    "lambda_request": 0.20 / 1e6,
    "api_request": 3.50 / 1e6,  # REST API, first 333 million a month
    "state_transition": 0.025 / 1e3,  # Step Functions Standard
    "log_gb": 0.50,  # CloudWatch Logs ingestion (standard class), per GB
}
"""USD per unit."""
MODEL: dict[str, Any] = {
    "name": "a mid-size hosted model",
    "input_per_million": 3.00,  # USD per million input tokens
    "output_per_million": 15.00,  # USD per million output tokens
    "input_tokens_per_call": 2_000,  # a system prompt, the history and the tool schemas
    "output_tokens_per_call": 150,
    "latency_seconds": 3.0,  # one call's wait, which the function that makes it is billed for
}
"""The stated model price, call size and latency the README sets beside the AWS bill (the scripted sample model is
free and instant: a deployed turn's function waits ``latency_seconds`` per call, billed as Lambda time)."""
LONG_POLL_SECONDS = 25
"""The client's ``GET /sessions/{id}/events?wait=25`` while a turn runs: one request per 25 s of the turn."""
