"""``dormant migrate-table --from OLD --to NEW``: copy a table of an earlier layout into one of this release's.

A table made by release 0.1 (and by this code until the id items) cannot be served in place: its ``ids``
local index can never be dropped (and caps every item collection at 10 GB), and its listing index projects
another row (a global index's projection cannot change in place). So it is copied, item by item, into a
table of ``table.TABLE``'s shape, converting what changed:

* every event item is copied as it is. A table of an earlier layout has no **id items** (``keys.id_sk``:
  incarnation, version and grant): each is derived from the event item it names (its key, its expiry), for
  the events the meta item does not disown (its incarnation's, not of a rolled-back grant), so that a
  rolled-back writer's event never stands for a live one with the same id. A table of this layout has them:
  they are copied as they are and none is derived (one put per key, never two in one batch);
* every meta item is copied without the listing entry a release 0.1 meta item carried itself (``lpk``) and
  without an earlier layout's superseded touch (``plsk``), with the running index's key (``rpk``) for a
  running session, the due index's (``dpk`` + ``due``: its own, else its last commit) for a waiting one, and a
  pending marker's key (``ppk``), for the new table's shard counts; and the meta item is the session's listing
  and status entry (``lpk``/``spk`` for the new shard counts, with the row a listing shows: ``touches`` counts
  them). The old table's touches are not copied: a session has exactly one entry in the new table;
* snapshots, shared-scope values (``X#``), binding entries (``B#``) and any other item (the API's
  idempotency records) are copied as they are; the old layout item is replaced by the new table's.

**Resumable, idempotent.** The copy is one ``Scan`` of the old table (strongly consistent pages); after each
page is written, the position is kept on a progress item in the new table (``#migration``, the old table's
name), so a run that stopped resumes from the last page written. Every write is a put of a key the old item
determines, so re-doing a page, or running again after it finished (a second full pass, for what changed
meanwhile), writes no item twice (``MigrationReport.written`` counts the puts: one per key a run); a meta
item is put only if the new table does not hold the session at a later version (a session committed in the
new table is never moved back). Stop the writers first: commits to the old table after its page was copied
are not in the new one until a pass copies them again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...errors import ConfigurationError, StoreError
from .items import MetaItem, _dead, head_is
from .keys import (
    ID_PREFIX,
    META_SK,
    SNAPSHOT_SK,
    id_sk,
    listing_key,
    parse_event_sk,
    pending_key,
    running_key,
    split_session_pk,
)
from .store import DEFAULT_LISTING_SHARDS, DEFAULT_PENDING_SHARDS, LAYOUT_KEY, create_table
from .table import LAYOUT_FORMAT, TABLE

__all__ = ["MigrationReport", "migrate_table"]

PROGRESS_PK = "#migration"
_BATCH = 25
_RUNNING = "running"
_WAITING = ("awaiting_input", "resumable")
_ID_ITEMS_FORMAT = 2
"""The layout format from which a table holds id items (an earlier table records none, or no format)."""


@dataclass
class MigrationReport:
    """What a run copied, by kind of item (counts of this run: a resumed run counts from where it resumed)."""

    source: str
    target: str
    created: bool = False
    """The new table was made by this run."""
    resumed: bool = False
    """This run went on from the position an earlier, unfinished run left."""
    listing_shards: int = DEFAULT_LISTING_SHARDS
    pending_shards: int = DEFAULT_PENDING_SHARDS
    pages: int = 0
    items_read: int = 0
    sessions: int = 0
    """Meta items written (each its own listing entry, once it has a committed version)."""
    events: int = 0
    """Event items copied (chunks included)."""
    id_items: int = 0
    touches: int = 0
    snapshots: int = 0
    scoped: int = 0
    bindings: int = 0
    other: int = 0
    not_copied: int = 0
    """The old table's touches (each session's entry is its meta item), its layout and progress items."""
    kept_newer: int = 0
    """Sessions the new table already held at a later version (left as they were, with their events copied)."""
    written: int = 0
    """Items put into the new table (its progress and layout items aside): each key at most once a run."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrate_table(
    client: Any,
    source: str,
    target: str,
    *,
    listing_shards: int | None = None,
    pending_shards: int | None = None,
    create: bool = True,
    page_size: int | None = None,
    on_page: Callable[[MigrationReport], None] | None = None,
) -> MigrationReport:
    """Copy ``source`` into ``target`` (made with ``create_table`` when missing and ``create``), converting
    what the layout changed; return the counts. The shard counts default to the ones ``source`` records
    (else the store's defaults); the new table records them (a migration is how they change)."""
    if source == target:
        raise ConfigurationError("migrate-table copies into another table: --from and --to name the same one")
    recorded = _call(client, "get_item", TableName=source, Key=LAYOUT_KEY, ConsistentRead=True).get("Item") or {}
    # None means "the source's count"; 0 is refused below, as the command line refuses it.
    listing = int(recorded.get("listing_shards", {}).get("N", DEFAULT_LISTING_SHARDS))
    listing = listing if listing_shards is None else listing_shards
    pending = int(recorded.get("pending_shards", {}).get("N", DEFAULT_PENDING_SHARDS))
    pending = pending if pending_shards is None else pending_shards
    for name, value in (("listing_shards", listing), ("pending_shards", pending)):
        if not 1 <= value <= 1000:
            raise ConfigurationError(f"{name} is a whole number from 1 to 1000, not {value!r}")
    report = MigrationReport(source, target, listing_shards=listing, pending_shards=pending)
    report.created = _ready(client, target, create)
    has_ids = int(recorded.get("format", {}).get("N", "1")) >= _ID_ITEMS_FORMAT
    _record_layout(client, target, listing, pending)

    progress_key = {"pk": {"S": PROGRESS_PK}, "sk": {"S": source}}
    progress = _call(client, "get_item", TableName=target, Key=progress_key, ConsistentRead=True).get("Item")
    scan: dict[str, Any] = {"TableName": source, "ConsistentRead": True}
    if page_size:
        scan["Limit"] = page_size
    if progress is not None and not progress.get("done", {}).get("BOOL", False) and "last" in progress:
        scan["ExclusiveStartKey"] = json.loads(progress["last"]["S"])
        report.resumed = True
    copier = _Copier(client, source, target, listing, pending, report, derive_ids=not has_ids)
    while True:
        page = _call(client, "scan", **scan)
        for item in page.get("Items", []):
            copier.add(item)
        copier.flush()
        report.pages += 1
        last = page.get("LastEvaluatedKey")
        state: dict[str, Any] = {**progress_key, "done": {"BOOL": last is None}}
        if last is not None:
            state["last"] = {"S": json.dumps(last, sort_keys=True)}
        _call(client, "put_item", TableName=target, Item=state)
        if on_page is not None:
            on_page(report)
        if last is None:
            return report
        scan["ExclusiveStartKey"] = last


class _Copier:
    """Converts the old table's items and writes them in batches of 25 (meta items one at a time, conditional)."""

    def __init__(
        self,
        client: Any,
        source: str,
        table: str,
        listing: int,
        pending: int,
        report: MigrationReport,
        *,
        derive_ids: bool,
    ) -> None:
        self.client, self.source, self.table, self.report = client, source, table, report
        self.listing, self.pending, self.derive_ids = listing, pending, derive_ids
        self.puts: dict[tuple[str, str], dict[str, Any]] = {}
        """By key: a later put of a key replaces an earlier one still unsent (a batch may not name a key twice)."""
        self.owner: tuple[str, Mapping[str, Any] | None] = ("", None)
        """The partition being read and its meta item in the old table (a scan reads a partition's items in
        key order, the meta item first; a run resumed mid-partition reads it)."""

    def _put(self, item: dict[str, Any]) -> None:
        self.puts[item["pk"]["S"], item["sk"]["S"]] = item

    def add(self, item: dict[str, Any]) -> None:
        report = self.report
        report.items_read += 1
        pk, sk = item["pk"]["S"], item["sk"]["S"]
        if pk in (LAYOUT_KEY["pk"]["S"], PROGRESS_PK):
            report.not_copied += 1
        elif pk.startswith("S#"):
            self._session_item(pk, sk, item)
        elif pk.startswith("X#"):
            report.scoped += 1
            self._put(item)
        elif pk.startswith("B#"):
            report.bindings += 1
            self._put(item)
        else:
            report.other += 1
            self._put(item)
        if len(self.puts) >= _BATCH:
            self.flush()

    def _session_item(self, pk: str, sk: str, item: dict[str, Any]) -> None:
        report = self.report
        if sk == META_SK:
            self.owner = (pk, item)
            self._meta(pk, item)
        elif sk.startswith("T#"):
            report.not_copied += 1  # rebuilt from the meta item
        elif sk == SNAPSHOT_SK:
            report.snapshots += 1
            self._put(item)
        elif sk.startswith(ID_PREFIX):
            report.id_items += 1  # a table of this layout: its id items, as they are
            self._put(item)
        else:
            key = parse_event_sk(sk)
            if key is None:
                report.other += 1
                self._put(item)
                return
            report.events += 1
            self._put(item)
            if self.derive_ids and "eid" in item and self._owns(pk, item, f"{key.version}#{key.grant}"):
                id_item: dict[str, Any] = {
                    "pk": item["pk"],
                    "sk": {"S": id_sk(item["eid"]["S"])},
                    "inc": item["inc"],
                    "v": {"N": str(key.version)},
                    "t": {"S": key.grant},
                }
                if "expires_at" in item:
                    id_item["expires_at"] = item["expires_at"]
                report.id_items += 1
                self._put(id_item)

    def _owns(self, pk: str, event: Mapping[str, Any], grant: str) -> bool:
        """Whether the session's meta item owns this event item: its incarnation's, of a grant not rolled back."""
        if self.owner[0] != pk:
            meta = _call(
                self.client,
                "get_item",
                TableName=self.source,
                Key={"pk": {"S": pk}, "sk": {"S": META_SK}},
                ConsistentRead=True,
            ).get("Item")
            self.owner = (pk, meta)
        meta = self.owner[1]
        return meta is not None and meta.get("inc") == event.get("inc") and grant not in _dead(meta)

    def _meta(self, pk: str, item: dict[str, Any]) -> None:
        app_name, session_id = split_session_pk(pk)
        dropped = ("lpk", "spk", "plsk", "rpk", "ppk", "dpk")
        meta = {name: value for name, value in item.items() if name not in dropped}
        status = meta.get("status", {}).get("S")
        if int(meta.get("version", {"N": "0"})["N"]) > 0 and "lsk" in meta:
            # The meta item is the session's listing (and status) entry, keyed for the new shard counts.
            meta["lpk"] = {"S": listing_key(app_name, session_id, self.listing)}
            if status is not None:
                meta["spk"] = {"S": f"{status}#{meta['lpk']['S']}"}
        if status == _RUNNING:
            meta["rpk"] = {"S": running_key(app_name, session_id, self.pending)}
        elif status in _WAITING:  # a wait is on the due index, as a commit puts it; due when it was (else now)
            meta["dpk"] = {"S": running_key(app_name, session_id, self.pending, waiting=True)}
            meta["due"] = meta.get("due") or meta.get("lsk") or {"N": "0"}
        else:
            meta.pop("due", None)
        if "pending" in meta:
            meta["ppk"] = {"S": pending_key(app_name, session_id, self.pending)}
        put = _call(
            self.client,
            "put_item",
            refusable=True,
            TableName=self.table,
            Item=meta,
            ConditionExpression=f"attribute_not_exists(pk) OR {head_is(':v', 'version', '<=')}",  # heads compared
            ExpressionAttributeValues={":v": {"N": str(MetaItem.from_item(meta).version)}},
        )
        if put is None:  # the new table holds the session at a later version
            self.report.kept_newer += 1
            return
        self.report.written += 1
        self.report.sessions += 1
        if "lpk" in meta:
            self.report.touches += 1  # its listing entry: the meta item itself

    def flush(self) -> None:
        waiting = list(self.puts.values())
        self.puts = {}
        while waiting:
            batch, waiting = waiting[:_BATCH], waiting[_BATCH:]
            self.report.written += len(batch)
            requests = [{"PutRequest": {"Item": item}} for item in batch]
            for attempt in range(12):
                answer = _call(self.client, "batch_write_item", RequestItems={self.table: requests})
                requests = answer.get("UnprocessedItems", {}).get(self.table, [])
                if not requests:
                    break
                time.sleep(min(1.0, 0.05 * 2**attempt))
            else:
                raise StoreError(f"DynamoDB left {len(requests)} items unwritten in {self.table!r}: run again")


def _ready(client: Any, table: str, create: bool) -> bool:
    """Make the new table, or check one that exists has this release's shape; whether it was made here."""
    try:
        described = client.describe_table(TableName=table)["Table"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise StoreError(f"DynamoDB describe_table failed: {exc}") from exc
        if not create:
            raise ConfigurationError(f"DynamoDB table {table!r} does not exist (let migrate-table create it)") from None
        return create_table(table, client=client)
    problems = TABLE.differences(described)
    if problems:
        raise ConfigurationError(
            f"DynamoDB table {table!r} is not of this release's layout ({'; '.join(problems)}): "
            "migrate into a new table"
        )
    return False


def _record_layout(client: Any, table: str, listing: int, pending: int) -> None:
    """The new table's layout item, as its first store would record it; refuse a table that records other counts."""
    item = {
        **LAYOUT_KEY,
        "listing_shards": {"N": str(listing)},
        "pending_shards": {"N": str(pending)},
        "format": {"N": str(LAYOUT_FORMAT)},
    }
    if (
        _call(
            client,
            "put_item",
            refusable=True,
            TableName=table,
            Item=item,
            ConditionExpression="attribute_not_exists(pk)",
        )
        is not None
    ):
        return
    found = _call(client, "get_item", TableName=table, Key=LAYOUT_KEY, ConsistentRead=True).get("Item") or {}
    if {name: found.get(name) for name in item} != item:
        theirs = {name: found.get(name, {}).get("N") for name in ("listing_shards", "pending_shards", "format")}
        raise ConfigurationError(
            f"DynamoDB table {table!r} already records {theirs}, not listing_shards={listing}, "
            f"pending_shards={pending}, format={LAYOUT_FORMAT}: migrate into a new table, or pass its counts"
        )


def _call(client: Any, operation: str, *, refusable: bool = False, **kwargs: Any) -> Any:
    """One DynamoDB call, its errors as dormant's; with ``refusable``, ``None`` when its condition failed."""
    try:
        return getattr(client, operation)(**kwargs)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if refusable and code == "ConditionalCheckFailedException":
            return None
        if code == "ResourceNotFoundException":
            raise ConfigurationError(f"DynamoDB table {kwargs.get('TableName')!r} does not exist") from None
        raise StoreError(f"DynamoDB {operation} failed: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"DynamoDB {operation} failed: {exc}") from exc
