"""How the DynamoDB store lays sessions out in its one table: keys, shards, chunks and the id filter.

Pure functions over plain values (no boto3), so they are tested on their own and shared by the commit,
the loader, the repair code and ``migrate``.

A session partition ``S#{app}#{session_id}`` holds, in sort-key order:

* the meta item, ``sk = "#M"`` (sorts before every event item, so a load's first page starts with it);
* the session's snapshot, ``sk = "#S"`` (after the meta item, before the events; one item, overwritten);
* one item per event (more for a large one), ``sk = "E#{version:012d}#{grant}#{seq:05d}"`` — the version
  the gate granted, the writer's random grant token, and the position in the batch. Known before
  writing, so events need no read-before-write and no counter. The token keeps a writer whose commit was
  rolled back (and who writes on, unaware) from ever touching the items of the commit that took its
  version next: the meta item lists rolled-back grants in ``dead`` and readers skip their items.
* the chunks of an event larger than one item, ``sk = "{event sk}#{chunk:03d}"`` (chunk 0 is the event
  item itself, which carries the id and the chunk count);
* one small *id* item per event whose id is not in order (not above every id stored before it:
  ``plan._in_order``), ``sk = "I#{event id}"`` (``id_sk``), written with the event (in the same
  transaction, or the same batches before the finish): its incarnation, version and grant, so a re-sent
  id the meta item's filter flags is found with one consistent ``GetItem``/``BatchGetItem`` of these keys,
  without a local index (which would cap the partition at 10 GB and keep it from splitting). It sorts
  after the events, so a load (``sk < "I#"``) never reads it. An id in order has none: its event item's
  ``hi`` (the greatest id once its commit landed) lets a binary search find it;
* the meta item is the session's listing and status entry (``lpk``, ``spk``, ``lsk``), moved by each
  commit's write of it. The layout before kept a small *touch* item per session, ``sk = "T#{updated_at:013d}"``,
  as that entry: its next commit deletes it.

Outside it, ``B#{app}#{scope}#{scope_id}`` lists the sessions bound to one person (``sk`` = session id):
written with the gate that creates the session (one transaction), deleted with it, read by an erasure.
``X#{app}#{scope}#{scope_id}`` holds that scope id's shared state, one item per key. Both are one
partition per scope id (a person, an organisation), never one per app: with no local index on the table,
an item collection has no size cap and DynamoDB splits a partition by sort key when it grows.
``I#{app}#{session_id}`` holds the session's ``Idempotency-Key`` records (Powertools' own items; ``sk`` = the
hashed key), expiring through the table's TTL and deleted with the session.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ...errors import StoreError

__all__ = [
    "CHUNK_BYTES",
    "ID_PREFIX",
    "META_SK",
    "SNAPSHOT_SK",
    "EventKey",
    "IdFilter",
    "binding_pk",
    "chunks",
    "event_prefix",
    "event_sk",
    "id_sk",
    "idempotency_pk",
    "item_bytes",
    "listing_key",
    "listing_keys",
    "parse_event_sk",
    "touch_sk",
    "pending_key",
    "running_key",
    "running_keys",
    "scoped_pk",
    "session_pk",
    "shard_of",
    "split_session_pk",
]

META_SK = "#M"
SNAPSHOT_SK = "#S"
EVENT_PREFIX = "E#"
ID_PREFIX = "I#"
"""The id items' prefix: after ``E#`` (a load reads ``sk < ID_PREFIX``), before ``T#``."""
TOUCH_PREFIX = "T#"
CHUNK_BYTES = 350_000
"""Bytes of event JSON per item: DynamoDB's item limit is 400 KB, keys and attribute names included.
An event at the stores' limit (``StoreLimits.max_event_bytes``, 1 MiB) takes 3 items."""
GRANT_LENGTH = 8


def session_pk(app_name: str, session_id: str) -> str:
    return f"S#{app_name}#{session_id}"


def split_session_pk(pk: str) -> tuple[str, str]:
    """``(app_name, session_id)`` back from a session partition key (ids never hold ``#``)."""
    _, app_name, session_id = pk.split("#", 2)
    return app_name, session_id


def idempotency_pk(partition: str) -> str:
    """The partition of the ``Idempotency-Key`` records of ``partition`` (``serving.http.idempotency.records``)."""
    return f"I#{partition}"


def scoped_pk(app_name: str, scope: str, scope_id: str) -> str:
    return f"X#{app_name}#{scope}#{scope_id}"


def binding_pk(app_name: str, scope: str, scope_id: str) -> str:
    """The partition listing the sessions bound to ``scope_id`` (one item each, ``sk`` = the session id)."""
    return f"B#{app_name}#{scope}#{scope_id}"


def shard_of(session_id: str, shards: int) -> int:
    """A stable shard for a session (the same in every process: not Python's salted ``hash``)."""
    if shards <= 1:
        return 0
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def listing_key(app_name: str, session_id: str, shards: int) -> str:
    """The listing index's partition key: the app, write-sharded as ``{app}#{k}`` when ``shards > 1``."""
    return app_name if shards <= 1 else f"{app_name}#{shard_of(session_id, shards)}"


def listing_keys(app_name: str, shards: int) -> list[str]:
    """Every listing partition of an app: what ``list`` queries and merges."""
    return [app_name] if shards <= 1 else [f"{app_name}#{k}" for k in range(shards)]


def pending_key(app_name: str, session_id: str, shards: int) -> str:
    """The pending-marker index's partition key: table-wide shards, so the sweeper needs no list of apps."""
    return f"P#{shard_of(f'{app_name}#{session_id}', shards)}"


def running_key(app_name: str, session_id: str, shards: int, *, waiting: bool = False) -> str:
    """The running index's partition key: the pending index's table-wide shards, under their own prefix
    (``W#`` for a session that waits, ``R#`` for a running one: the two listings read only their own)."""
    return f"{'W' if waiting else 'R'}#{shard_of(f'{app_name}#{session_id}', shards)}"


def running_keys(shards: int, *, waiting: bool = False) -> list[str]:
    """Every partition of the running index: what ``running_sessions`` (``waiting_sessions``) queries."""
    return [f"{'W' if waiting else 'R'}#{k}" for k in range(shards)]


class EventKey(NamedTuple):
    version: int
    grant: str
    seq: int
    chunk: int


def event_prefix(version: int, grant: str | None = None) -> str:
    """The sort-key prefix of a version's event items (of one grant of it, when given)."""
    return f"{EVENT_PREFIX}{version:012d}#" + (f"{grant}#" if grant is not None else "")


def event_sk(version: int, grant: str, seq: int, chunk: int = 0) -> str:
    base = f"{event_prefix(version, grant)}{seq:05d}"
    return base if chunk == 0 else f"{base}#{chunk:03d}"


def id_sk(event_id: str) -> str:
    """The sort key of the item recording which commit stored ``event_id`` (ids never hold ``#``)."""
    return f"{ID_PREFIX}{event_id}"


def touch_sk(updated_at: int) -> str:
    """The sort key of the touch a commit at ``updated_at`` (epoch ms) leaves in the listing index."""
    return f"{TOUCH_PREFIX}{updated_at:013d}"


def parse_event_sk(sk: str) -> EventKey | None:
    """The parts of an event item's sort key, or ``None`` for an item that is not an event."""
    if not sk.startswith(EVENT_PREFIX):
        return None
    parts = sk.split("#")
    return EventKey(int(parts[1]), parts[2], int(parts[3]), int(parts[4]) if len(parts) > 4 else 0)


def chunks(data: bytes) -> list[bytes]:
    """An event's JSON cut into item-sized pieces (one piece for nearly every event)."""
    return [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]


def _value_bytes(value: Mapping[str, Any]) -> int:
    ((kind, data),) = value.items()
    if kind == "S":
        return len(data.encode())
    if kind == "B":
        return len(data)
    if kind == "N":  # DynamoDB: about one byte per two significant digits, plus one
        return (len(data.lstrip("-").replace(".", "").strip("0")) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(v.encode()) for v in data)
    if kind == "BS":
        return sum(len(v) for v in data)
    if kind == "NS":
        return sum(_value_bytes({"N": v}) for v in data)
    if kind == "M":
        return 3 + sum(len(k.encode()) + _value_bytes(v) + 1 for k, v in data.items())
    if kind == "L":
        return 3 + sum(_value_bytes(v) + 1 for v in data)
    raise StoreError(f"an attribute of unknown DynamoDB type {kind!r}: not a value this store writes")


def item_bytes(item: Mapping[str, Mapping[str, Any]]) -> int:
    """An item's size as DynamoDB counts it (attribute names plus values): what a write is billed on, 1 unit
    per KB (2 in a transaction), and what the 400 KB item and 4 MB transaction limits are checked against."""
    return sum(len(name.encode()) + _value_bytes(value) for name, value in item.items())


class IdFilter:
    """A Bloom filter of a session's stored event ids, and the greatest of them, kept on its meta item.

    An id greater than every stored one is new: ``new_id`` mints ids in the order they are made, so the
    events of a turn pass on that comparison alone, however long the session. Other ids (re-sent ones,
    ids from a process whose clock is behind, ids a caller chose) ask the filter, which answers
    "certainly not stored" for nearly every new one; only ids it flags (re-sent ones, and false
    positives) cost a consistent read of their id items (``id_sk``), and, when they have none, a binary search
    of the event items' ``hi`` (``_Commit._in_order_commit``). 16,384 bits and 7 hashes: a new id
    is flagged about 1 time in 1,600 at 1,000 stored events, 1 in 50 at 2,000, 1 in 10 at 3,000, 2 in 5
    at 5,000 (docs/dynamodb.md).
    Stored zlib-compressed, so the filter of a short session costs a few hundred bytes of the meta item
    and at most 2 KB.
    """

    BITS = 16_384
    HASHES = 7

    def __init__(self, data: bytes | None = None, greatest: str | None = None) -> None:
        self._bits = bytearray(zlib.decompress(data)) if data else bytearray(self.BITS // 8)
        self.greatest = greatest if data else ""
        """The greatest id stored; ``None`` when not known (a meta item written before it was kept)."""

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> IdFilter:
        """The filter a meta item holds (attributes ``bf`` and ``hi``)."""
        return cls(meta["bf"]["B"] if "bf" in meta else None, meta["hi"]["S"] if "hi" in meta else None)

    @classmethod
    def _positions(cls, event_id: str) -> list[int]:
        digest = hashlib.blake2b(event_id.encode(), digest_size=16).digest()
        h1, h2 = int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big") | 1
        return [(h1 + i * h2) % cls.BITS for i in range(cls.HASHES)]

    def may_hold(self, event_id: str) -> bool:
        if self.greatest is not None and event_id > self.greatest:
            return False
        return all(self._bits[p >> 3] & (1 << (p & 7)) for p in self._positions(event_id))

    def add(self, event_ids: Iterable[str]) -> IdFilter:
        for event_id in event_ids:
            if self.greatest is not None and event_id > self.greatest:
                self.greatest = event_id
            for p in self._positions(event_id):
                self._bits[p >> 3] |= 1 << (p & 7)
        return self

    def dump(self) -> bytes:
        return zlib.compress(bytes(self._bits), 6)
