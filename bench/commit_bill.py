"""What one W1 commit (5 events of 1 KB, the session's last of ``TURNS``) costs on each commit path of the DynamoDB
store, the one call and the gated protocol, as AWS bills it.

The store's calls are captured in this process (``tests/support/fidelity/capture.py``, as the harness captures a
deployed function's) and billed from the items they wrote by ``bench/units.py``, the one place that applies AWS's
rules: ``bench cost`` and ``bench dynamodb`` both print these figures, from this one count. DynamoDB Local's own
figures are not used: it reports 2 write units for a transaction of any size and no index units for one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .units import Table, call_units, item_size
from .workloads import _row, turns

KINDS = {"#M": "meta", "E#": "an event", "I#": "an id item", "T#": "a touch"}
"""The kinds of item a commit writes, by the start of their sort key (``dormant.stores.dynamodb.keys``)."""


@dataclass(frozen=True)
class CommitBill:
    """One commit, billed: write units by place (``table``, ``index <name>``), its calls, and the billed size in
    bytes of the largest item of each kind it wrote (``KINDS``)."""

    units: dict[str, float]
    calls: int
    sizes: dict[str, int]

    @property
    def total(self) -> float:
        return sum(self.units.values())


def bill_commit(records: list[dict[str, Any]], tables: dict[str, Table], table: str) -> CommitBill:
    """The bill of one commit's captured calls (``capture.py``'s records) on ``table``."""
    units: dict[str, float] = defaultdict(float)
    sizes: dict[str, int] = {}
    for record in records:
        for (place, kind), value in call_units(record, tables).items():
            if kind == "write":
                units["table" if place == table else f"index {place.split('/', 1)[1]}"] += value
        for _, after in record.get("images", []):
            if after is not None:
                kind = KINDS.get(after["sk"]["S"][:2], "other")
                sizes[kind] = max(sizes.get(kind, 0), item_size(after))
    return CommitBill(dict(units), len(records), sizes)


def commit_bills(endpoint: str) -> dict[str, CommitBill]:
    """The last W1 commit on each commit path (``one call``, ``gated``) of a fresh table on ``endpoint``, billed."""
    from botocore.client import BaseClient

    from dormant.stores.dynamodb import create_table
    from dormant.stores.dynamodb.store import DynamoDBSessionStore
    from tests.support.fidelity import capture
    from tests.support.servers.dynamodb import client

    name = f"cost-w1-{uuid.uuid4().hex[:8]}"
    setup = client(endpoint)
    create_table(name, client=setup)
    tables = {name: Table.described(setup.describe_table(TableName=name)["Table"])}
    records: list[dict[str, Any]] = []
    original = BaseClient._make_api_call
    capturing = False

    def captured(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if capturing and self.meta.service_model.endpoint_prefix == "dynamodb":
            return capture.observe(lambda op, p: original(self, op, p), operation, params, records.append)
        return original(self, operation, params)

    paths: dict[str, CommitBill] = {}
    BaseClient._make_api_call = captured
    try:
        for path in ("one call", "gated"):
            if path == "gated":  # no commit fits one call: each takes the gated protocol
                store = DynamoDBSessionStore(client(endpoint), name, single_call_items=0)
            else:
                store = DynamoDBSessionStore(client(endpoint), name)
            batches = turns(path[0])
            for version, batch in enumerate(batches):
                capturing = version == len(batches) - 1
                assert store.commit(_row(f"w1-{path[0]}", "w1", version), batch, version).ok
            capturing = False
            paths[path] = bill_commit(records, tables, name)
            records.clear()
    finally:
        BaseClient._make_api_call = original
        with contextlib.suppress(Exception):
            setup.delete_table(TableName=name)
        setup.close()
    return paths
