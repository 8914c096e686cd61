"""What the writes of an approval's wait leave in each of the table's indexes, billed as AWS bills them
(``bench/units.py``) from the items before and after each call (``tests/support/fidelity/capture.py``), on
DynamoDB Local: the figures ``docs/dynamodb.md`` gives for park, held here so a change that moves more is seen.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

pytest.importorskip("boto3")

from bench.units import Table, labelled_units
from dormant.serving.runtime import Served
from dormant.serving.turns import claim_turn, run_to_end
from dormant.serving.workflow import StepFunctions, wait_record
from dormant.stores.dynamodb import dynamo_store
from tests.support.fidelity import capture
from tests.support.fidelity.fidelity_app import build as build_fidelity

pytestmark = pytest.mark.backend("dynamodb")


def _writes(records: list[dict[str, Any]], table: Table) -> dict[tuple[str, str], float]:
    """Write units by (place: ``table`` or the index's name, item kind)."""
    units: dict[tuple[str, str], float] = defaultdict(float)
    for record in records:
        for (place, kind, label), value in labelled_units(record, {table.name: table}).items():
            if kind == "write":
                units[(place.partition("/")[2] or "table", label)] += value
    return dict(units)


def test_park_writes_its_wait_record_and_moves_the_due_entry_once(
    ddb: Any, dynamodb_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Park is not a commit: one transaction of the token record and the meta item's ``due`` (gated on the version
    the wait is at). The session's listing and status entries stay where the commit into the wait put them (no
    ``lsk``, version or status moved), the running index is not touched, and the due entry moves once: 2 units
    for the key it moves on, none in any other index."""
    fidelity = build_fidelity(dynamo_store(dynamodb_table, client=ddb))
    view = Served(fidelity.app, {fidelity.agent.name: fidelity.agent}).for_tenant("local")
    view.sessions.create("parks")
    outcome = run_to_end(view, claim_turn(view, fidelity.agent, "parks", "signoffs=1"), lambda _: fidelity.agent)
    assert outcome.status == "yielded_tool"
    waiting = view.sessions.require("parks")
    invocation = waiting.projection.open_invocation
    assert invocation is not None
    table = Table.described(ddb.describe_table(TableName=dynamodb_table)["Table"])
    records = capture.recorded(ddb, monkeypatch)

    answer = StepFunctions().park(view, "parks", invocation, "token-1", execution="arn:exec:1", wait_seconds=60)

    monkeypatch.undo()
    assert answer == {"woke": False, "status": "awaiting_input"}
    assert [r["operation"] for r in records if "images" in r] == ["TransactWriteItems"]
    assert _writes(records, table) == {("table", "meta"): 2, ("table", "token record"): 2, ("due", "meta"): 2}
    parked = view.sessions.require("parks")
    assert (parked.version, parked.updated_at) == (waiting.version, waiting.updated_at)
    assert wait_record(view, "parks")["wait_version"] == parked.version
    fidelity.app.close()
