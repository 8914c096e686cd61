"""The cost table docs/operating.md shows, generated from a ``bench cost`` run, and the bill's dollar targets.

``python -m bench cost --write-docs`` rewrites the table between the page's markers, so the page says what the
bench measured, not what someone copied from it. Each row is one arc's bill per million turns, with its floor
beside it: the DynamoDB lines at the floor's writes (the turn's event items, each once, and the session's
head, in one transaction per turn the client waits on), and the AWS total with DynamoDB at that floor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .common import Figure

DOCS = Path(__file__).resolve().parents[1] / "docs" / "operating.md"
BEGIN, END = "<!-- bench cost: begin -->", "<!-- bench cost: end -->"
"""The markers around the generated table; what lies between them is rewritten, nothing else."""

TARGETS = {"chat": 30.0, "approval": 120.0}
"""Issue 36's targets for a turn's AWS bill, USD per million turns (the model's own price beside it, not in it)."""

ROWS = {
    "chat": "chat (1 model call)",
    "approval": "approval (run, park, answer, resume; 4 model calls)",
    "approval_day": "the approval answered a day later",
    "approval_timeout": "the approval never answered (run, park, Expire at the 7-day timeout; 2 model calls)",
    "commit": "a remote runner's turn (`POST /commit`, 2 events)",
}
HEADER = (
    "| turn | DynamoDB (of it, index writes) | its floor | DynamoDB write units: turn / floor "
    "| Lambda (of it, the model wait) | API Gateway (+ the client's long-poll) | Step Functions (+ its logs) | logs "
    "| AWS total | its floor: DynamoDB at the floor | the model, beside it |"
)

Bill = dict[str, float]
"""USD of one arc by bill line (``bench.cost.bill``)."""


def at_floor(costs: Bill, floors: Bill) -> float:
    """The arc's AWS total (USD) with its DynamoDB lines at their floor."""
    return aws_total(costs) - sum(costs[line] - floors[line] for line in floors)


def aws_total(costs: Bill) -> float:
    """The AWS bill of an arc: every line but the model's own price."""
    return sum(v for k, v in costs.items() if k != "model")


def target_figures(bills: dict[str, tuple[Bill, Bill]]) -> list[Figure]:
    """One figure per ``TARGETS`` arc that was measured: its AWS bill against the target, the floor beside it.

    ``bills``: per arc, its bill and its floor's DynamoDB lines (``bench.cost._floor_costs``). Dollar figures
    include measured Lambda time, so they are not ``counted``."""
    out = []
    for name, target in TARGETS.items():
        if name not in bills:
            continue
        costs, floors = bills[name]
        total = aws_total(costs)
        out.append(
            Figure(
                "cost",
                f"AWS bill of {'an' if name[0] in 'aeiou' else 'a'} {name} turn / ${target:g} per million",
                f"${total * 1e6:,.2f}/M",
                f"${at_floor(costs, floors) * 1e6:,.2f}/M with DynamoDB at its floor",
                total * 1e6 / target,
                1.0,
                "lower",
            )
        )
    return out


def table(arcs: dict[str, dict[str, Any]], bills: dict[str, tuple[Bill, Bill]]) -> list[str]:
    """The markdown table: a row per measured arc of ``ROWS``, dollars per million turns.

    ``arcs`` gives each arc's write units (``written``) and floor (``floor``: ``write`` units); the late arcs'
    rows say how far they are from their like (the approval at once; the timed-out one, its path at once:
    ``ended_at_once``, USD)."""
    rows = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for name, label in ROWS.items():
        if name not in bills:
            continue
        costs, floors = bills[name]
        m = {line: usd * 1e6 for line, usd in costs.items()}
        dynamodb = m["dynamodb writes"] + m["dynamodb index writes"] + m["dynamodb reads"]
        floor_usd = sum(floors.values()) * 1e6 + m["dynamodb reads"]
        written, floor_units = arcs[name]["written"], arcs[name]["floor"]
        units = f"{written:.0f} / {floor_units:.0f} ({written / floor_units:.1f}x)" if floor_units else "-"
        total = aws_total(costs) * 1e6
        beside = ""
        if name == "approval_day" and "approval" in bills:
            beside = f": {(total / (aws_total(bills['approval'][0]) * 1e6) - 1) * 100:+.1f}% against at once"
        elif name == "approval_timeout" and arcs[name].get("ended_at_once"):
            beside = f": {(total / (arcs[name]['ended_at_once'] * 1e6) - 1) * 100:+.1f}% against its path at once"
        target = f" (target ${TARGETS[name]:g})" if name in TARGETS else ""
        model = f"${m['model']:,.0f}" if m["model"] else "the runner's own"
        rows.append(
            f"| {label} | ${dynamodb:,.2f} (${m['dynamodb index writes']:,.2f}) | ${floor_usd:,.2f} | {units} "
            f"| ${m['lambda'] + m['lambda model wait']:,.2f} (${m['lambda model wait']:,.2f}) "
            f"| ${m['api gateway']:,.2f} (+ ${m['client long-poll']:,.2f}) "
            f"| ${m['step functions']:,.2f} (+ ${m['step functions logs']:,.2f}) | ${m['logs']:,.2f} "
            f"| **${total:,.2f}**{target}{beside} | ${at_floor(costs, floors) * 1e6:,.2f} | {model} |"
        )
    return rows


def write(rows: list[str], page: Path = DOCS) -> None:
    """Put ``rows`` between the page's markers, leaving the rest of the page as it is."""
    text = page.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{page} has no {BEGIN} ... {END} markers for the cost table")
    page.write_text(pattern.sub(lambda _: "\n".join([BEGIN, *rows, END]), text, count=1))
