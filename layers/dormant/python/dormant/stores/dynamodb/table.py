"""The DynamoDB table's shape, defined once: ``create_table`` and the CDK stack both build from it.

Pure data, no boto3: the CDK app imports it without the AWS SDK, and a test holds the two readings
(the ``CreateTable`` request and the synthesized template) against each other.

Key design (one table, string ``pk``/``sk``):

* a session partition ``pk = "S#{app}#{session_id}"`` holds the meta item, the event items, one id item per
  event (``keys``); the meta item is the session's listing entry;
* scoped state lives in ``pk = "X#{app}#{scope}#{scope_id}"``, one item per key;
* the listing index (``LISTING_INDEX``) is keyed by ``lpk`` — the app name, write-sharded as
  ``{app}#{k}`` when a store lists over more than one shard — and sorted by ``lsk`` (``updated_at``).
  Its entries are the sessions' meta items, one per session, moved by the write that lands each commit
  (an earlier layout's *touch* item, ``keys.touch_sk``, until the session's next commit), and the index
  projects the row a listing shows: a listing is Queries of this index alone;
* the status index (``STATUS_INDEX``) holds the same entries keyed by ``spk`` = ``{status}#{listing key}``
  (sparse: only a session with a status carries it) and sorted by ``lsk``, projecting the same row: a
  ``list(status=)`` page is Queries of the status's shards alone, never a filter over other statuses'
  entries. It costs each commit the same as the listing index: the entry moved, a delete and a put;
* the pending-marker index (``PENDING_INDEX``) is sparse: only a meta item with a live commit marker
  carries ``ppk``/``psk``, so the sweeper queries stale markers instead of scanning;
* the running index (``RUNNING_INDEX``) is sparse too: only a meta item whose stored status is ``running``
  carries ``rpk`` (``R#{shard}``, the pending index's table-wide shards), keyed on the item's own ``pk``,
  keys only, so the sweeper finds the sessions whose runner may have died without a list of apps. A
  session that waits (``awaiting_input``, ``resumable``) carries ``W#{shard}`` there instead: the sweeper's
  waits whose wake-up may be lost. The finish that stores the status sets or removes ``rpk``: an index
  write only when a session goes into or out of ``running`` or of waiting, none for the commits in between.
  A session that waits carries no ``rpk`` since the due index came: ``W#`` entries there are an earlier
  release's waits, each given a due time (and taken out of this index) by the first sweep that meets it;
* the due index (``DUE_INDEX``) is sparse: only a waiting session's meta item carries ``dpk`` (``W#{shard}``, the
  pending index's shards) and ``due`` (epoch ms: when the sweeper is next to look at it). A commit into a waiting
  status sets ``due`` to its time, ``set_due`` moves it (to the wait's timeout once its execution parked), any
  other status removes both. A sweep Queries ``due <= now - grace`` per shard: what it reads follows the waits
  that are due, never the healthy ones. A table made before it gets the index in place (``UpdateTable``; the
  stack adds it on deploy);
* no local secondary index: a re-sent event id is found through the session's id items
  (``keys.id_sk``), read by key, or (an id stored in order, which has none) by a binary search of its event
  items' ``hi``. A local index would cap every partition key's item collection (a
  session, a scope id's shared state, its binding entries) at 10 GB and keep its partition from splitting;
* ``TTL_ATTRIBUTE`` holds an epoch-seconds expiry for retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DUE_INDEX",
    "LAYOUT_FORMAT",
    "LISTING_INDEX",
    "PENDING_INDEX",
    "RUNNING_INDEX",
    "STATUS_INDEX",
    "TABLE",
    "IndexShape",
    "TableShape",
]

AttributeType = Literal["S", "N", "B"]


@dataclass(frozen=True)
class IndexShape:
    """A global secondary index: its key attributes and what it projects."""

    name: str
    partition_key: tuple[str, AttributeType]
    sort_key: tuple[str, AttributeType]
    projection: Literal["KEYS_ONLY", "INCLUDE", "ALL"] = "KEYS_ONLY"
    non_key_attributes: tuple[str, ...] = ()
    local: bool = False
    """A local secondary index: same partition key as the table, strongly consistent reads, and it can
    only be made with the table. ``definition()`` gives a ``LocalSecondaryIndexes`` entry for it."""

    def definition(self) -> dict[str, Any]:
        """This index as a ``CreateTable`` ``GlobalSecondaryIndexes`` (or ``LocalSecondaryIndexes``) entry."""
        projection: dict[str, Any] = {"ProjectionType": self.projection}
        if self.projection == "INCLUDE":
            projection["NonKeyAttributes"] = list(self.non_key_attributes)
        return {
            "IndexName": self.name,
            "KeySchema": [
                {"AttributeName": self.partition_key[0], "KeyType": "HASH"},
                {"AttributeName": self.sort_key[0], "KeyType": "RANGE"},
            ],
            "Projection": projection,
        }


@dataclass(frozen=True)
class TableShape:
    partition_key: tuple[str, AttributeType] = ("pk", "S")
    sort_key: tuple[str, AttributeType] = ("sk", "S")
    indexes: tuple[IndexShape, ...] = field(default_factory=tuple)
    ttl_attribute: str = "expires_at"

    def index(self, name: str) -> IndexShape:
        return next(index for index in self.indexes if index.name == name)

    def attribute_definitions(self) -> list[dict[str, str]]:
        keys = [self.partition_key, self.sort_key]
        for index in self.indexes:
            keys += [index.partition_key, index.sort_key]
        unique = dict(keys)
        return [{"AttributeName": name, "AttributeType": kind} for name, kind in unique.items()]

    def differences(self, described: dict[str, Any]) -> list[str]:
        """What keeps a table (``DescribeTable``'s ``Table``) from serving this shape: a local index (it caps
        item collections at 10 GB and can never be dropped), a missing global index, or one keyed or projected
        otherwise (a projection cannot change in place). Extra global indexes are the owner's business."""
        found: list[str] = []
        wanted_keys = [
            {"AttributeName": self.partition_key[0], "KeyType": "HASH"},
            {"AttributeName": self.sort_key[0], "KeyType": "RANGE"},
        ]
        if described.get("KeySchema") != wanted_keys:
            found.append(f"key schema {described.get('KeySchema')} (wanted {wanted_keys})")
        for index in described.get("LocalSecondaryIndexes") or []:
            found.append(f"local index {index['IndexName']!r}")
        present = {index["IndexName"]: index for index in described.get("GlobalSecondaryIndexes") or []}
        for index in self.indexes:
            if index.local:
                continue
            wanted = index.definition()
            have = present.get(index.name)
            if have is None:
                found.append(f"no global index {index.name!r}")
            elif have.get("KeySchema") != wanted["KeySchema"] or _projection(have) != _projection(wanted):
                found.append(f"global index {index.name!r} keyed or projected otherwise")
        return found

    def create_table_request(self, table_name: str) -> dict[str, Any]:
        """The ``CreateTable`` arguments for this shape (on-demand billing)."""
        request: dict[str, Any] = {
            "TableName": table_name,
            "AttributeDefinitions": self.attribute_definitions(),
            "KeySchema": [
                {"AttributeName": self.partition_key[0], "KeyType": "HASH"},
                {"AttributeName": self.sort_key[0], "KeyType": "RANGE"},
            ],
            "BillingMode": "PAY_PER_REQUEST",
        }
        for key, local in (("GlobalSecondaryIndexes", False), ("LocalSecondaryIndexes", True)):
            indexes = [index.definition() for index in self.indexes if index.local == local]
            if indexes:
                request[key] = indexes
        return request


def _projection(index: dict[str, Any]) -> tuple[str, frozenset[str]]:
    projection = index.get("Projection") or {}
    return projection.get("ProjectionType", ""), frozenset(projection.get("NonKeyAttributes") or ())


DUE_INDEX = "due"
LISTING_INDEX = "listing"
PENDING_INDEX = "pending"
RUNNING_INDEX = "running"
STATUS_INDEX = "status"
LAYOUT_FORMAT = 2
"""The layout this release writes and reads, recorded on the table's layout item (``format``). Format 1 (every
table made before it: release 0.1 and its successors until the id items) has the ``ids`` local index, which a
table can never drop, and listing entries without the row: ``dormant migrate-table`` copies it into a new table."""

TABLE = TableShape(
    indexes=(
        # Projects the row a listing shows, so a listing page is Queries of this index alone: the meta item
        # carries it, ``expires_at`` its expiry (an earlier layout's touch carried ``mx`` for it, as its own
        # ``expires_at`` was its horizon).
        IndexShape(
            LISTING_INDEX,
            ("lpk", "S"),
            ("lsk", "N"),
            "INCLUDE",
            ("version", "status", "created_at", "forked_from", "mx", "expires_at"),
        ),
        # The listing by status (``list(status=)``): the same meta items, partitioned by ``spk``
        # (``{status}#{listing key}``) instead, projecting the same row. Only a touch with a status carries it.
        IndexShape(
            STATUS_INDEX,
            ("spk", "S"),
            ("lsk", "N"),
            "INCLUDE",
            ("version", "status", "created_at", "forked_from", "mx", "expires_at"),
        ),
        IndexShape(PENDING_INDEX, ("ppk", "S"), ("psk", "N"), "KEYS_ONLY"),
        # Sorted by the table's own key, which never changes: a running session's later commits (a new
        # ``updated_at``, expiry, filter) rewrite nothing of its entry. ``running_sessions`` reads the rows.
        IndexShape(RUNNING_INDEX, ("rpk", "S"), ("pk", "S"), "KEYS_ONLY"),
        # The waits by when the sweeper is next to look at each (``due``): a sweep Queries ``due <= now`` and
        # reads nothing of a healthy wait. Projects what the sweeper's page shows, so a page is Queries alone.
        IndexShape(DUE_INDEX, ("dpk", "S"), ("due", "N"), "INCLUDE", ("status", "version", "lsk", "expires_at")),
    ),
)
