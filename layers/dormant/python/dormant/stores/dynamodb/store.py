"""The DynamoDB store: one table, a gated commit of versioned event batches, sharded listing, repair.

An ordinary commit is one ``TransactWriteItems`` (``_one_call``). One too large for a transaction is three
steps, each safe to be interrupted after, in at most ``2 + ceil(2 x events / 25)`` calls whatever the count
(the batches carry each event's item, then its id item):

1. **Gate**: a conditional ``UpdateItem`` of the meta item (``attribute_not_exists`` to create, else
   ``version = expected``, the same scopes, and no marker) that records a pending marker: the version it
   grants, a random grant token, the number of event items to come, the time, what the commit will
   set on the row and in scoped state. It does not touch ``version``
   or any listed attribute, so it writes no listing entry. On a conflict DynamoDB returns the stored item
   (``ReturnValuesOnConditionCheckFailure``): the actual version comes without a second read. A create
   of a bound session makes it a ``TransactWriteItems`` with the session's binding entries
   (``keys.binding_pk``): the meta item never exists without them, so an erasure never misses it.
2. **Events**: ``BatchWriteItem`` calls of 25 items keyed by the granted version, the grant and the
   position in the batch. ``UnprocessedItems`` are re-sent with bounded, jittered backoff (the client's
   botocore retry configuration handles throttled calls); when that is exhausted the commit raises
   ``CommitIncomplete`` and leaves its marker for repair.
3. **Finish**: one write conditional on the grant (``grant = ours``) that sets the new version,
   ``updated_at``, status and expiry and the listing keys (the meta item is the session's listing and status
   entry: this moves it), and clears the marker; a ``TransactWriteItems`` with the scoped changes when there
   are some (and the delete of a touch an earlier layout listed the session by). A commit whose marker was
   rolled back can therefore never land scoped values or move its listing entry, however late its writer
   wakes up.

A commit that fits one ``TransactWriteItems`` skips all three (``_one_call``): the same writes in one call.

**Listing** (``_list``): Queries of the listing index alone, which projects the row each meta item carries.
**Retention**: with ``row.retention_ms`` every item carries ``expires_at``, never
below the meta item's (``_Plan``); an expired session is gone for readers and writers at once.

Readers show events only up to the meta item's ``version``: a pending version is invisible, and so are
the items of a rolled-back grant (listed in ``dead``) and of a deleted incarnation of the session
(``inc``). One ``Query`` of the session partition returns the meta item first, then the events in order;
``load(after=v)`` reads the meta item, then only the key range of the later versions.

The checks, encoding, limits and the ``CommitResult``/``ScopeMismatch`` bookkeeping come from
``BaseSessionStore``; this module supplies its primitives, plus ``repair_pending``.

**Idempotency by event id** without reading history: the meta item carries the greatest stored id and
a Bloom filter of the stored ids (``keys.IdFilter``), which the gate returns (``ReturnValues=ALL_OLD``)
at no extra call. An id above the greatest (``new_id`` mints them in order), or one the filter rules
out, is new. The ids it flags are looked up by key: every event whose id is not in order is written with an
id item (``keys.id_sk``: its incarnation, version and grant), read with one strongly consistent
``BatchGetItem`` (``_stored_ids``); an id stored in order has none, and is found by a binary search of the
event items' ``hi`` (``_in_order_commit``). Only re-sent ids and rare false positives pay those reads. The
table has no local index, so no item collection is capped at 10 GB.

**Repair** (``repair_pending``; and a writer that meets a stale marker runs the same code first): a
marker's version is rolled forward when all of its event items are present — with its touch, written
last, when the touch went in the batches; at least one, when it rides in the finish — (finish, as the
writer would have), else rolled back (the grant is added to ``dead``, the marker removed, the partial
items and the touch deleted).
Both are conditional on the marker's grant, so sweepers racing each other or a slow writer agree.

**Liveness** (``_call``, ``_pass_gate``): a call refused because another request's transaction held one of
its items (``TransactionConflict``) was not applied and is re-sent with ``_backoff``, then ``StoreBusy``. A
gate re-sent after its answer was lost finds its own marker (the attempt's grant) and goes on as granted;
one that got no answer at all takes its marker back before raising.
"""

from __future__ import annotations

import builtins
import itertools
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ...clock import now_ms
from ...errors import ConfigurationError, StoreBusy
from ..base import ScopedWrite, StoredSession, StoredSnapshot
from .admin import LAYOUT_KEY, _Admin, _client, create_table
from .calls import _Cancelled
from .items import (
    MAX_TRANSACT_ITEMS,
    STEP_VERSION,
    TTL,
    MetaItem,
    _binding_keys,
    _expired,
    _key,
    _row_of,
    _transact_item,
    _visible_events,
    head_is,
)
from .keys import (
    ID_PREFIX,
    META_SK,
    SNAPSHOT_SK,
    IdFilter,  # noqa: F401 (a test patches it here)
    binding_pk,
    event_prefix,
    scoped_pk,
    session_pk,
    touch_sk,
)
from .listing import _Listing
from .plan import (
    _touch_in_finish,  # noqa: F401 (a test reads it here)
)
from .repair import RepairReport, _Repair

__all__ = [
    "DEFAULT_LISTING_SHARDS",
    "DEFAULT_PENDING_SHARDS",
    "LAYOUT_KEY",
    "DynamoDBSessionStore",
    "RepairReport",
    "create_table",
    "dynamo_store",
]

DEFAULT_LISTING_SHARDS = 4
"""Listing-index shards per app. A commit moves one listing entry (its meta item's: a delete and a put) and one
index partition takes about 1,000 writes/s: one shard caps an app near 500 commits/s, four near 2,000, at the
price of four Queries per listing page (docs/dynamodb.md)."""
DEFAULT_PENDING_SHARDS = 8
"""Pending-marker index shards for the whole table (a marker is put and deleted by every commit: about
500 commits/s a shard). Every store and the sweeper on one table must use the same number."""


class DynamoDBSessionStore(_Repair, _Listing, _Admin):
    """Sessions in one DynamoDB table (see the module docstring). Build it with ``dynamo_store()``."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        owns_client: bool = False,
        listing_shards: int = DEFAULT_LISTING_SHARDS,
        pending_shards: int = DEFAULT_PENDING_SHARDS,
        stale_after_s: float = 30.0,
        live_wait_s: float = 10.0,
        unprocessed_retries: int = 8,
        conflict_retries: int = 8,
        single_call_items: int = MAX_TRANSACT_ITEMS,
        recovery_days: int | None = None,
    ) -> None:
        if recovery_days is not None and (
            not isinstance(recovery_days, int) or isinstance(recovery_days, bool) or not 1 <= recovery_days <= 35
        ):
            raise ConfigurationError(f"recovery_days is an int from 1 to 35 (PITR's period), not {recovery_days!r}")
        if (
            not isinstance(single_call_items, int)
            or isinstance(single_call_items, bool)
            or not 0 <= single_call_items <= MAX_TRANSACT_ITEMS
        ):
            raise ConfigurationError(
                f"single_call_items must be an int from 0 to {MAX_TRANSACT_ITEMS}, not {single_call_items!r}"
            )
        for name, value in (("listing_shards", listing_shards), ("pending_shards", pending_shards)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
                raise ConfigurationError(f"{name} must be an int from 1 to 1000, not {value!r}")
        self._client = client
        self._table = table_name
        self._owns_client = owns_client
        self._listing_shards = listing_shards
        self._pending_shards = pending_shards
        self._stale_after_ms = int(stale_after_s * 1000)
        self._live_wait_s = live_wait_s
        self._unprocessed_retries = unprocessed_retries
        self._conflict_retries = conflict_retries
        self._single_call_items = single_call_items
        self._recovery_days = recovery_days
        self._layout_checked = False
        self._known: dict[str, dict[str, Any]] = {}
        """Meta items as this store last read or wrote them, by ``pk`` (no marker on them): what a one-call
        commit builds on. Only a hint: its transaction is conditional on the version and incarnation."""

    @property
    def table_name(self) -> str:
        return self._table

    def _scrub(self) -> str | None:
        """A delete is final in the table, but point-in-time recovery (``recovery_days``, the table's period) can
        restore the table as it was at any moment of the period, the erased items with it: the residue, named
        with the day it ends. On-demand backups and AWS Backup keep their own copies, until they are deleted."""
        if self._recovery_days is None:
            return None
        until = datetime.fromtimestamp(now_ms() / 1000, UTC) + timedelta(days=self._recovery_days)
        return (
            f"point-in-time recovery keeps the erased items restorable for {self._recovery_days} days, until "
            f"{until.strftime('%Y-%m-%dT%H:%M:%SZ')}; on-demand backups keep them until those are deleted"
        )

    @property
    def client(self) -> Any:
        """The boto3 DynamoDB client the store uses (``dormant serve`` keeps idempotency records with it)."""
        return self._client

    # -- the primitives of BaseSessionStore ------------------------------------------------------

    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        """One Query of the partition (meta item first); with ``after``, the meta item, then the tail's range."""
        pk = session_pk(app_name, session_id)
        now = now_ms()
        if after:
            meta = self._call("get_item", TableName=self._table, Key=_key(pk, META_SK), ConsistentRead=True).get("Item")
            if meta is not None and _expired(meta, now):
                return None
            if meta is not None:
                self._remember(pk, meta)
            version = 0 if meta is None else MetaItem.from_item(meta).version
            if meta is None or version <= after:
                return None if meta is None or version == 0 else (_row_of(meta, pk), [])
            # Committed versions are immutable: events read after the meta item are the ones it vouches for.
            items = self._query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :from AND :to",
                ExpressionAttributeValues={
                    ":pk": {"S": pk},
                    ":from": {"S": event_prefix(after + 1)},
                    ":to": {"S": event_prefix(version) + "~"},
                },
                ConsistentRead=True,
            )
            return _row_of(meta, pk), _visible_events(meta, items)
        everything = self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND sk < :ids",  # the meta item, snapshot and events: no id items
            ExpressionAttributeValues={":pk": {"S": pk}, ":ids": {"S": ID_PREFIX}},
            ConsistentRead=True,
        )
        if not everything or everything[0]["sk"]["S"] != META_SK:
            return None  # no session (or a deleted one's stragglers)
        meta = everything[0]
        if MetaItem.from_item(meta).version == 0 or _expired(meta, now):
            return None  # its creating commit is still pending, or it expired
        self._remember(pk, meta)
        return _row_of(meta, pk), _visible_events(meta, everything[1:])

    def _delete(self, app_name: str, session_id: str) -> None:
        pk = session_pk(app_name, session_id)
        self._known.pop(pk, None)
        # The meta item and the session's touches (its listing entries) go in one transaction, conditional on
        # the version read: a listing never shows a session whose delete was cut short, and a commit landing
        # in between makes the delete read again. From there every commit conflicts and every load is None.
        for attempt in itertools.count():
            items = self._query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": pk}},
                ProjectionExpression=f"pk, sk, version, {STEP_VERSION}, scopes",
                ConsistentRead=True,
            )
            keys = [{"pk": i["pk"], "sk": i["sk"]} for i in items]
            meta = next((i for i in items if i["sk"]["S"] == META_SK), None)
            if meta is None:
                break
            touches = [k for k in keys if k["sk"]["S"].startswith(touch_sk(0)[:2])][: MAX_TRANSACT_ITEMS - 1]
            condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(#v)"}
            condition["ExpressionAttributeNames"] = {"#v": "version"}
            if "version" in meta:
                head = {"N": str(MetaItem.from_item(meta).version)}
                condition |= {"ConditionExpression": head_is(":v"), "ExpressionAttributeValues": {":v": head}}
            try:
                self._transact(
                    [
                        {"Delete": {"TableName": self._table, "Key": _key(pk, META_SK), **condition}},
                        *({"Delete": {"TableName": self._table, "Key": key}} for key in touches),
                    ]
                )
            except _Cancelled:
                if attempt >= self._conflict_retries:
                    raise StoreBusy(f"session {session_id!r} kept taking commits while it was deleted") from None
                continue
            keys = [k for k in keys if k not in touches and k["sk"]["S"] != META_SK]
            if "scopes" in meta:  # and the session's entries in the binding partitions
                keys += _binding_keys(app_name, session_id, json.loads(meta["scopes"]["S"]))
            self._write_batches([{"DeleteRequest": {"Key": key}} for key in keys])
            return
        self._write_batches([{"DeleteRequest": {"Key": {"pk": i["pk"], "sk": i["sk"]}}} for i in items])

    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        """The binding partition, each entry checked against its session's meta item (an entry may outlive a
        create the gate refused, or a delete cut short); a create still in flight counts as bound."""
        entries = self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": binding_pk(app_name, scope, scope_id)}},
            ProjectionExpression="sk",
            ConsistentRead=True,
        )
        bound = []
        for entry in entries:
            session_id = entry["sk"]["S"]
            key = _key(session_pk(app_name, session_id), META_SK)
            meta = self._call(
                "get_item", TableName=self._table, Key=key, ProjectionExpression="scopes", ConsistentRead=True
            ).get("Item")
            if meta is not None and json.loads(meta["scopes"]["S"]).get(scope) == scope_id:
                bound.append(session_id)
        return bound

    def _forget_bound(self, app_name: str, scope: str, scope_id: str) -> None:
        keys = self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": binding_pk(app_name, scope, scope_id)}},
            ProjectionExpression="pk, sk",
            ConsistentRead=True,
        )
        self._write_batches([{"DeleteRequest": {"Key": key}} for key in keys])

    def _load_scoped(self, app_name: str, scope: str, scope_id: str) -> dict[str, str]:
        items = self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": scoped_pk(app_name, scope, scope_id)}},
            ConsistentRead=True,
        )
        return {item["sk"]["S"]: item["v"]["S"] for item in items}

    def _save_scoped(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        """In ``TransactWriteItems`` of up to 100 keys: atomic up to 100 keys (more are written 100 at a time)."""
        for start in range(0, len(writes), 100):
            self._transact([_transact_item(self._table, app_name, write) for write in writes[start : start + 100]])

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        """One ``TransactWriteItems``: a check that the meta item is at the snapshot's version or later, and a
        put of the snapshot item over an older one. A snapshot is at most ``limits.max_snapshot_bytes``
        (256 KiB): one item, never chunked (the base keeps none larger)."""
        pk, version = session_pk(app_name, session_id), {":v": {"N": str(snapshot.version)}}
        # It expires with the session's other items (the horizon, ``xh``); the check below holds the meta
        # item to that horizon, so an expiry refresh in between leaves this snapshot unkept (a cache).
        meta = self._call(
            "get_item", TableName=self._table, Key=_key(pk, META_SK), ProjectionExpression="xh", ConsistentRead=True
        ).get("Item")
        if meta is None:
            return False
        item = {**_key(pk, SNAPSHOT_SK), "ver": version[":v"], "d": {"S": snapshot.data}}
        at_or_after = head_is(":v", "version", ">=")
        check, check_values = f"{at_or_after} AND attribute_not_exists(xh)", dict(version)
        if "xh" in meta:
            item[TTL] = meta["xh"]
            check, check_values = f"{at_or_after} AND xh = :h", {**version, ":h": meta["xh"]}
        try:
            self._transact(
                [
                    {
                        "ConditionCheck": {
                            "TableName": self._table,
                            "Key": _key(pk, META_SK),
                            "ConditionExpression": check,
                            "ExpressionAttributeValues": check_values,
                        }
                    },
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": item,
                            "ConditionExpression": "attribute_not_exists(ver) OR ver < :v",
                            "ExpressionAttributeValues": version,
                        }
                    },
                ]
            )
        except _Cancelled:
            return False
        return True

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        key = _key(session_pk(app_name, session_id), SNAPSHOT_SK)
        item = self._call("get_item", TableName=self._table, Key=key, ConsistentRead=True).get("Item")
        return StoredSnapshot(int(item["ver"]["N"]), item["d"]["S"]) if item else None

    def _close(self) -> None:
        """Close the client the store built; a client given to the store is left open, for its owner."""
        if self._owns_client:
            self._client.close()

    # -- repair -----------------------------------------------------------------------------

    # -- the commit's steps -----------------------------------------------------------------

    # -- listing ----------------------------------------------------------------------------

    # -- calls ------------------------------------------------------------------------------


# -- construction -----------------------------------------------------------------------------------


def dynamo_store(
    table_name: str,
    *,
    client: Any = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    listing_shards: int = DEFAULT_LISTING_SHARDS,
    pending_shards: int = DEFAULT_PENDING_SHARDS,
    stale_after_s: float = 30.0,
    single_call_items: int = MAX_TRANSACT_ITEMS,
    recovery_days: int | None = None,
) -> DynamoDBSessionStore:
    """A store on the DynamoDB table ``table_name`` (make it with ``create_table`` or the CDK stack).

    Pass ``client`` (a boto3 DynamoDB client you configured) or let the store build one from
    ``endpoint_url`` and ``region`` (and the usual AWS environment), with botocore's standard retry mode.
    Nothing is sent until the first call. ``close()`` closes a client the store built, never yours.
    ``stale_after_s`` is how old a pending marker must be before a writer meeting it repairs it first
    (marker ages come from ``dormant.clock``, so a test can move time instead of waiting).
    A commit of at most ``single_call_items`` items (and 4 MB) is one ``TransactWriteItems``; 0 sends every
    commit through the gated protocol (docs/dynamodb.md). ``recovery_days``: the table's point-in-time recovery
    period, which an erasure's report names as its residue (``None``: the table keeps no recovery window).
    """
    if not isinstance(table_name, str) or len(table_name) < 3:
        raise ConfigurationError(f"a DynamoDB table name has at least 3 characters, not {table_name!r}")
    if client is not None and (endpoint_url or region):
        raise ConfigurationError("pass a client or endpoint_url/region to build one, not both")
    owns = client is None
    return DynamoDBSessionStore(
        client if client is not None else _client(endpoint_url, region),
        table_name,
        owns_client=owns,
        listing_shards=listing_shards,
        pending_shards=pending_shards,
        stale_after_s=stale_after_s,
        single_call_items=single_call_items,
        recovery_days=recovery_days,
    )
