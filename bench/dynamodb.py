"""DynamoDB store vs raw boto3 writing the same items, on DynamoDB Local (W1, W2, W4, calls, capacity units).

The endpoint is ``TEST_DYNAMODB_ENDPOINT`` when set, else a DynamoDB Local started for the run
(``tests/support/servers/dynamodb.py``). The floor is the least a store on this table must do, in raw boto3:
a commit of under 100 items is one ``TransactWriteItems`` of the same items the store writes (the
conditional meta update with the id filter and the listing key, the event items and their id items: the
meta item is the session's listing entry); a load is the session partition's ``Query`` pages
with ``json.loads`` of each event; a listing queries the same listing shards and merges their entries,
with the rows the index projects (Queries only, as the store). The floor has no crash safety. The timed
workloads (W1, W2 with ``sessions.get`` beside ``store.load``, W4) are every store's
(``bench/workloads.py``).

Calls are counted and capacity units read (``ReturnConsumedCapacity=INDEXES`` on every write, ``TOTAL``
on every read, added by a botocore hook) on the clients themselves; the store's code is not touched.
DynamoDB Local's latency is not AWS's: the times compare the two codes on one engine; the calls and units
carry over to AWS as they are.

Why one module: it is one section of ``make bench``, its floor and its meter written against the same items
and read together; what other sections share (the workloads, the bill of a commit) lives beside it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from dormant.stores.base import StoredSession

from .commit_bill import commit_bills
from .common import QUICK, Figure
from .prices import PRICES
from .workloads import EVENTS_PER_TURN, LOAD_SIZES, TURNS, W4_SESSIONS, _row, events, store_workloads, turns

REPEAT = 2 if QUICK else 3
_WRITES = {"UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
_READS = {"Query", "BatchGetItem"}


class Meter:
    """Counts a client's calls by operation, sums the write capacity units by table and index, and the read units."""

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        self.units: defaultdict[str, float] = defaultdict(float)
        self.read_units = 0.0
        events = client.meta.events
        events.register("before-parameter-build.dynamodb", self._params)
        events.register("after-call.dynamodb", self._answer)

    def reset(self) -> None:
        self.calls.clear()
        self.units.clear()
        self.read_units = 0.0

    def _params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name in _WRITES or model.name in _READS:
            params["ReturnConsumedCapacity"] = "INDEXES" if model.name in _WRITES else "TOTAL"

    def _answer(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        consumed = parsed.get("ConsumedCapacity") or []
        entries = consumed if isinstance(consumed, list) else [consumed]
        if model.name in _READS:
            self.read_units += sum(entry.get("CapacityUnits", 0.0) for entry in entries)
            return
        for entry in entries:
            self.units["table"] += entry.get("Table", {}).get("CapacityUnits", 0.0)
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
                for name, used in (entry.get(kind) or {}).items():
                    self.units[name] += used.get("CapacityUnits", 0.0)


class Floor:
    """Raw boto3 on the store's table, writing the items the store writes: a commit of up to 100 items is one
    ``TransactWriteItems`` of the conditional meta update (version and incarnation checked; the new version,
    ``updated_at``, id filter and greatest id, and the listing key: the meta item is the session's listing entry),
    the event items (each with the greatest id once the commit lands) and one id item per event whose id is not
    above every id before it (issue 36: ids in order have none). A larger one is the update, then
    ``BatchWriteItem``."""

    def __init__(self, client: Any, table: str, shards: int) -> None:
        self.client, self.table, self.shards = client, table, shards
        self.sessions: dict[str, Any] = {}  # pk -> its id filter

    def commit(self, app: str, sid: str, rows: list[dict[str, Any]], version: int) -> None:
        from dormant.stores.dynamodb.keys import IdFilter, id_sk, listing_key, session_pk

        pk, now, grant, inc = session_pk(app, sid), time.time_ns() // 1_000_000, secrets.token_hex(4), "0f1e2d3c"
        ids = self.sessions.get(pk, IdFilter(None)) if version else IdFilter(None)
        running, itemised = ids.greatest or "", []
        for row in rows:  # an id not above every id before it keeps its id item
            if row["id"] <= running:
                itemised.append(row["id"])
            running = max(running, row["id"])
        ids.add(row["id"] for row in rows)
        self.sessions[pk] = ids
        values = {
            ":v": {"N": str(version + 1)},
            ":u": {"N": str(now)},
            ":bf": {"B": ids.dump()},
            ":hi": {"S": ids.greatest or ""},
            ":inc": {"S": inc},
            ":k": {"S": listing_key(app, sid, self.shards)},
        }
        if version == 0:
            update = "SET version = :v, lsk = :u, lpk = :k, bf = :bf, hi = :hi, #id = :id, created_at = :u, inc = :inc"
            condition = "attribute_not_exists(pk)"
            values[":id"] = {"S": sid}
        else:
            update, condition = (
                "SET version = :v, lsk = :u, lpk = :k, bf = :bf, hi = :hi",
                "version = :e AND inc = :inc",
            )
            values[":e"] = {"N": str(version)}
        version_value, grant_value, inc_value, key = {"N": str(version + 1)}, {"S": grant}, {"S": inc}, {"S": pk}
        items = [
            {
                "pk": key,
                "sk": {"S": f"E#{version + 1:012d}#{grant}#{n:05d}"},
                "inc": inc_value,
                "d": {"B": json.dumps(row, separators=(",", ":")).encode()},
                "eid": {"S": row["id"]},
                "hi": {"S": ids.greatest or ""},
            }
            for n, row in enumerate(rows)
        ]
        items += [
            {"pk": key, "sk": {"S": id_sk(event_id)}, "inc": inc_value, "v": version_value, "t": grant_value}
            for event_id in itemised
        ]
        if len(items) < 98:  # the same items in one TransactWriteItems
            change: dict[str, Any] = {
                "TableName": self.table,
                "Key": {"pk": key, "sk": {"S": "#M"}},
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeValues": values,
            }
            if version == 0:
                change["ExpressionAttributeNames"] = {"#id": "id"}
            writes = [{"Update": change}, *({"Put": {"TableName": self.table, "Item": item}} for item in items)]
            self.client.transact_write_items(TransactItems=writes)
            return
        self.client.update_item(
            TableName=self.table,
            Key={"pk": key, "sk": {"S": "#M"}},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            **({"ExpressionAttributeNames": {"#id": "id"}} if version == 0 else {}),
        )
        requests = [{"PutRequest": {"Item": item}} for item in items]
        for start in range(0, len(requests), 25):
            batch = requests[start : start + 25]
            while batch:
                answer = self.client.batch_write_item(RequestItems={self.table: batch})
                batch = answer.get("UnprocessedItems", {}).get(self.table, [])

    def load(self, app: str, sid: str) -> list[Any]:
        from dormant.stores.dynamodb.keys import session_pk

        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk AND sk < :i",  # the meta item and the events, not the id items
            "ExpressionAttributeValues": {":pk": {"S": session_pk(app, sid)}, ":i": {"S": "I#"}},
            "ConsistentRead": True,
        }
        rows = []
        while True:
            page = self.client.query(**kwargs)
            rows += [json.loads(item["d"]["B"]) for item in page["Items"] if "d" in item]
            if "LastEvaluatedKey" not in page:
                return rows
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def list(self, app: str) -> list[tuple[int, str, int, str | None]]:
        """The index entries of every shard, newest first, with the rows the index projects: Queries only,
        as the store's listing. No dedupe, no expiry check."""
        from dormant.stores.dynamodb.keys import listing_keys, split_session_pk

        entries = []
        for key in listing_keys(app, self.shards):
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "IndexName": "listing",
                "KeyConditionExpression": "lpk = :k",
                "ExpressionAttributeValues": {":k": {"S": key}},
                "ScanIndexForward": False,
            }
            while True:
                page = self.client.query(**kwargs)
                entries += [
                    (
                        int(i["lsk"]["N"]),
                        split_session_pk(i["pk"]["S"])[1],
                        int(i["version"]["N"]),
                        i.get("status", {}).get("S"),
                    )
                    for i in page["Items"]
                ]
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        entries.sort(reverse=True)
        return entries


@contextlib.contextmanager
def _endpoint() -> Iterator[str]:
    endpoint = os.environ.get("TEST_DYNAMODB_ENDPOINT")
    if endpoint:
        yield endpoint
        return
    from tests.support.servers.dynamodb import dynamodb_local

    with dynamodb_local() as started:
        yield started


def run() -> list[Figure]:
    try:
        from dormant.stores.dynamodb import create_table, dynamo_store
        from dormant.stores.dynamodb.store import DEFAULT_LISTING_SHARDS
        from tests.support.servers.dynamodb import LocalUnavailable, client
    except ImportError as exc:
        print(f"  skipped: the DynamoDB store needs boto3 (pip install 'dormant[dynamodb]'): {exc}")
        return []
    try:
        with _endpoint() as endpoint:
            table = f"dormant-bench-{uuid.uuid4().hex[:8]}"
            ours_client, floor_client = client(endpoint), client(endpoint)
            try:
                create_table(table, client=ours_client)
                store = dynamo_store(table, client=ours_client)
                floor = Floor(floor_client, table, DEFAULT_LISTING_SHARDS)
                return _measure(store, floor, Meter(ours_client), Meter(floor_client), ours_client, endpoint)
            finally:
                with contextlib.suppress(Exception):
                    ours_client.delete_table(TableName=table)
                ours_client.close()
                floor_client.close()
    except LocalUnavailable as exc:
        print(f"  skipped: no DynamoDB to measure against ({exc})")
        return []


def _measure(
    store: Any, floor: Floor, ours_meter: Meter, floor_meter: Meter, ours_client: Any, endpoint: str
) -> list[Figure]:
    # The timed workloads are every store's (bench/workloads.py), paired with the floor; fewer runs, as
    # DynamoDB Local is slow. What follows them is this store's own: calls, pages and capacity units.
    # W1's floor is one raw TransactWriteItems of the same items: the one-call commit must be close to it.
    figures = store_workloads(
        "dynamodb", store, floor, repeat=REPEAT, create_repeat=1, w1_target=0.9, w1_interleaved=True
    )
    batches = turns()

    # Calls and capacity of one W1 run, metered (the timed runs are not).
    ours_meter.reset()
    floor_meter.reset()
    per_commit: list[int] = []
    for version, batch in enumerate(batches):
        before = sum(ours_meter.calls.values())
        assert store.commit(_row("w1-metered", "w1", version), batch, version).ok
        per_commit.append(sum(ours_meter.calls.values()) - before)
    for version, batch in enumerate(batches):
        floor.commit("w1-metered-floor", "w1", [e.model_dump(mode="json") for e in batch], version)
    ours_calls, floor_calls = sum(per_commit) / TURNS, sum(floor_meter.calls.values()) / TURNS
    ours_units = {k: v / TURNS for k, v in ours_meter.units.items()}
    floor_units = {k: v / TURNS for k, v in floor_meter.units.items()}
    ours_ops, floor_ops = dict(ours_meter.calls), dict(floor_meter.calls)

    load_pages: dict[int, tuple[int, float]] = {}
    for size in LOAD_SIZES:
        ours_meter.reset()
        loaded = store.load("w2", f"w2-{size}")  # stored by the W2 workload
        megabytes = sum(len(e.model_dump_json()) for e in loaded.events) / 1e6
        load_pages[size] = (ours_meter.calls["Query"], megabytes)

    page = 50
    ours_meter.reset()
    listed = store.list("w4-ours-1", limit=page)  # the W4 workload's sessions
    assert len(listed) == page
    list_calls, list_reads = dict(ours_meter.calls), ours_meter.read_units
    figures.append(
        Figure(
            "dynamodb",
            f"W4 BatchGetItem calls per listing page of {page}",
            f"{list_calls.get('BatchGetItem', 0)}",
            "0",
            float(list_calls.get("BatchGetItem", 0)),
            0,
            "lower",
            f"Queries only: {list_calls.get('Query', 0)} (one per shard)",
            counted=True,
        )
    )

    target_calls = 1  # it fits one TransactWriteItems
    over = sum(1 for calls in per_commit if calls > target_calls)
    figures.append(
        Figure(
            "dynamodb",
            f"W1 DynamoDB calls per commit ({EVENTS_PER_TURN} events), median",
            f"{statistics.median(per_commit):g} (mean {ours_calls:.3f})",
            f"{floor_calls:.2f}",
            statistics.median(per_commit) / target_calls,
            1,
            "lower",
            f"target <= {target_calls}; {over} of {TURNS} commits took the gated protocol (an id the filter flags)",
        )
    )
    for size, (pages, megabytes) in load_pages.items():
        allowed = math.ceil(megabytes) + 1
        figures.append(
            Figure(
                "dynamodb",
                f"W2 load {size:,} events, Query pages",
                f"{pages} pages",
                f"{megabytes:.1f} MB",
                pages / allowed,
                1,
                "lower",
                f"target <= one page per MB (+1): {allowed}",
            )
        )
    print("  write capacity units per W1 commit (ReturnConsumedCapacity=INDEXES):")
    for name in sorted(set(ours_units) | set(floor_units)):
        print(f"    {name:<10} dormant {ours_units.get(name, 0.0):6.2f}   floor {floor_units.get(name, 0.0):6.2f}")
    print(f"  calls in {TURNS} W1 commits: dormant {ours_ops}, floor {floor_ops}")
    print(f"  a listing page of {page} (of {W4_SESSIONS:,} sessions): calls {list_calls}, read units {list_reads:.1f}")
    paths = _billed(endpoint)
    # As AWS bills it (from the items the commit wrote), not DynamoDB Local's figure for a transaction's index
    # writes, which counts the meta item's entry moved in a transaction twice (the floor's too: the same items).
    listing_writes = paths["one call"].units.get("index listing", 0.0)
    figures.append(
        Figure(
            "dynamodb",
            "W1 listing-index writes per commit (as AWS bills)",
            f"{listing_writes:.2f} WCU",
            f"{floor_units.get('listing', 0.0):.2f} WCU (Local)",
            listing_writes,
            2,
            "lower",
            f"target <= 2 (issue 24): the meta item's entry moved, a delete and a put; Local reports"
            f" {ours_units.get('listing', 0.0):.2f}",
            counted=True,
        )
    )
    figures.append(_edge_commits(store, ours_meter))
    _small_commits(store, ours_client, ours_meter)
    return figures


def _billed(endpoint: str) -> dict[str, Any]:
    """Write units of a W1 commit on each commit path as AWS bills them: the store's calls captured and billed from
    the items they wrote (``bench/commit_bill.py``, by ``bench/units.py``'s rules, which ``bench cost`` prints
    too); DynamoDB Local under-reports a transaction and gives no index units for one."""
    paths = commit_bills(endpoint)
    found = paths["one call"].sizes  # ids minted in order: no id item (issue 36)
    sizes = ", ".join(f"{kind} {found[kind]} B" for kind in ("meta", "an event", "an id item") if kind in found)
    print(f"  write units per {EVENTS_PER_TURN}-event commit as AWS bills them ({sizes}):")
    for name, commit in paths.items():
        places = sorted(commit.units.items(), key=lambda place: (place[0] != "table", place[0]))
        detail = ", ".join(f"{place.removeprefix('index ')} {units:g}" for place, units in places)
        usd = commit.total * PRICES["dynamodb_write_unit"] * 1e6
        print(f"    {name:<9} {commit.total:g} WCU ({detail}): ${usd:.2f} per million commits")
    return paths


def _edge_commits(store: Any, meter: Meter) -> Figure:
    """The commits at the edges of the call bound: none or few free slots in the last batch of 25 (the touch
    and the marking of the superseded touch ride in the finish's transaction then), and creates, with and
    without binding entries (those ride in the gate's transaction)."""
    repeat = 3 if QUICK else 20
    app = f"edge-{uuid.uuid4().hex[:6]}"
    cases: list[tuple[str, int, dict[str, str] | None]] = [
        ("create, 0 events", 0, None),
        ("create bound to a scope, 0 events", 0, {"user": "u-1"}),
        ("create bound to a scope, 24 events", 24, {"user": "u-1"}),
        *((f"{count} events", count, {}) for count in (0, 1, 23, 24, 25, 49, 50)),
    ]
    worst = 0.0
    print("  commits at the edges of the bound (calls: max over the runs; WCU per commit, mean):")
    for case, (label, count, scopes) in enumerate(cases):
        sid = f"c{case}"
        if scopes == {}:  # a later commit: two before it, so it also marks a superseded touch
            for version in range(2):
                assert store.commit(_row(app, sid, version), events(1, f"{sid}-s{version}-"), version).ok
        calls: list[int] = []
        meter.reset()
        started = time.perf_counter()
        for n in range(repeat):
            batch = events(count, f"{sid}-{n}-")
            if scopes is None or scopes:
                row = StoredSession(id=f"{sid}-{n}", app_name=app, created_at=1, scopes=scopes or {})
                version = 0
            else:
                row, version = _row(app, sid, 2 + n), 2 + n
            before = sum(meter.calls.values())
            assert store.commit(row, batch, version).ok
            calls.append(sum(meter.calls.values()) - before)
        seconds = (time.perf_counter() - started) / repeat
        bound = 2 + math.ceil(2 * count / 25)  # the gated protocol's batches: event items, then their id items
        worst = max(worst, max(calls) / bound)
        units = ", ".join(f"{k} {v / repeat:.2f}" for k, v in sorted(meter.units.items()))
        ops = ", ".join(f"{k} {v / repeat:g}" for k, v in sorted(meter.calls.items()))
        print(f"    {label:<36} {max(calls)} calls (bound {bound}: {ops})  {seconds * 1000:6.2f} ms  WCU: {units}")
    return Figure(
        "dynamodb",
        "calls per commit at the edges (0-50 events, creates), worst",
        f"{worst:.2f}x the bound",
        "2 + ceil(2 x events/25)",
        worst,
        1,
        "lower",
        "0, 1, 23, 24, 25, 49, 50 events and creates with and without scopes: the figures above",
        counted=True,
    )


def _small_commits(store: Any, client: Any, meter: Meter) -> None:
    """A claim-sized commit (two events) on the gated path vs one TransactWriteItems carrying it whole.

    The transaction needs the meta item's id filter before it is built (a consistent GetItem): two calls
    against the gated path's three, at twice the write units of every item it carries.
    """
    from dormant.stores.dynamodb.keys import session_pk

    count = 20 if QUICK else 100
    pair = [events(2, f"c{n}-") for n in range(count)]
    app = f"small-{uuid.uuid4().hex[:6]}"
    assert store.commit(_row(app, "gated"), [], 0).ok
    meter.reset()
    started = time.perf_counter()
    for version, batch in enumerate(pair, start=1):
        assert store.commit(_row(app, "gated"), batch, version).ok
    gated_time = (time.perf_counter() - started) / count
    gated_calls, gated_units = sum(meter.calls.values()) / count, {k: v / count for k, v in meter.units.items()}

    pk = session_pk(app, "transact")
    client.put_item(TableName=store._table, Item={"pk": {"S": pk}, "sk": {"S": "#M"}, "version": {"N": "1"}})
    meter.reset()
    started = time.perf_counter()
    for version, batch in enumerate(pair, start=1):
        client.get_item(TableName=store._table, Key={"pk": {"S": pk}, "sk": {"S": "#M"}}, ConsistentRead=True)
        puts = [
            {
                "Put": {
                    "TableName": store._table,
                    "Item": {
                        "pk": {"S": pk},
                        "sk": {"S": f"E#{version + 1:012d}#{n:05d}"},
                        "eid": {"S": e.id},
                        "d": {"B": e.model_dump_json().encode()},
                    },
                }
            }
            for n, e in enumerate(batch)
        ]
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": store._table,
                        "Key": {"pk": {"S": pk}, "sk": {"S": "#M"}},
                        "UpdateExpression": "SET version = :v, lsk = :u, lpk = :k",
                        "ConditionExpression": "version = :e",
                        "ExpressionAttributeValues": {
                            ":v": {"N": str(version + 1)},
                            ":e": {"N": str(version)},
                            ":u": {"N": str(time.time_ns() // 1_000_000)},
                            ":k": {"S": app},
                        },
                    }
                },
                *puts,
            ]
        )
    transact_time = (time.perf_counter() - started) / count
    transact_calls, transact_units = sum(meter.calls.values()) / count, {k: v / count for k, v in meter.units.items()}
    print("  a two-event commit (a claim), gated path vs one TransactWriteItems (+ the GetItem it needs):")
    for name, calls, units, seconds in (
        ("gated", gated_calls, gated_units, gated_time),
        ("transact", transact_calls, transact_units, transact_time),
    ):
        detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(units.items()))
        print(f"    {name:<9} {calls:.2f} calls  {seconds * 1000:6.2f} ms  WCU: {detail}")
