"""The table's items as the store reads and writes them: keys, expiry, the meta item's row and its visible events."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..base import Refused, ScopedWrite, StoredSession
from .keys import binding_pk, parse_event_sk, scoped_pk, split_session_pk
from .table import TABLE

_BATCH = 25
MAX_TRANSACT_ITEMS = 100
"""DynamoDB's most items in one ``TransactWriteItems``."""
MAX_TRANSACT_BYTES = 4_000_000
"""What the items of one ``TransactWriteItems`` may total (AWS: 4 MB), less room for the request's expressions."""
TTL = TABLE.ttl_attribute


def _number(item: Mapping[str, Any], name: str) -> int | None:
    return int(item[name]["N"]) if name in item else None


STEP_VERSION = "sv"
"""The meta item's attribute holding the head while a running turn's steps commit (``STEP_UPDATED_AT`` its
``updated_at``): a step leaves ``version`` and ``lsk``, which the listing and status indexes key and project,
as the turn's claim wrote them, so it writes no index entry. The next commit that is no step removes both."""
STEP_UPDATED_AT = "su"


def head_is(value: str, version: str = "#v", op: str = "=") -> str:
    """A condition: the session's head (``sv`` after a running turn's step, else ``version``) ``op`` ``value`` (a
    placeholder). ``version`` is how the expression names the ``version`` attribute (an alias, or the name)."""
    return f"({STEP_VERSION} {op} {value} OR (attribute_not_exists({STEP_VERSION}) AND {version} {op} {value}))"


class MetaItem(NamedTuple):
    """The numbers and the incarnation of a session's meta item (``sk = #M``), read once, by name: the
    attribute names (``lsk``, ``plsk``, ``xh``) are the table's, these are what they mean."""

    version: int
    """The last landed version, its head (0: a session deleted, or none); a pending version is on the marker."""
    inc: str | None
    """The session's incarnation: items of an earlier one (a deleted session's) are not its own."""
    updated_at: int | None
    """The ``updated_at`` of its last commit: ``lsk``, which its listing entry is keyed by, unless a running
    turn's steps committed since (``su``)."""
    previous: int | None
    """``plsk``: the superseded touch the next commit marks expired."""
    horizon: int | None
    """``xh``: every other item of the session expires no earlier (with retention)."""
    expires: int | None
    """``expires_at`` (epoch seconds), with retention."""

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> MetaItem:
        """``item`` may be ``{}`` (no meta item yet: version 0)."""
        return cls(
            _number(item, STEP_VERSION) or _number(item, "version") or 0,
            item["inc"]["S"] if "inc" in item else None,
            _number(item, STEP_UPDATED_AT) or _number(item, "lsk"),
            _number(item, "plsk"),
            _number(item, "xh"),
            _number(item, TTL),
        )


def _refused(meta: Mapping[str, Any]) -> Refused:
    """A commit refused by this meta item: its version and scopes."""
    return Refused(MetaItem.from_item(meta).version, json.loads(meta["scopes"]["S"]))


def _origin(row: StoredSession) -> dict[str, Any]:
    """What a create's touch keeps from its row (a later commit's comes from the meta item)."""
    origin: dict[str, Any] = {"created_at": {"N": str(row.created_at)}}
    if row.forked_from is not None:
        origin["forked_from"] = {"S": row.forked_from}
    return origin


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _expired(meta: Mapping[str, Any], now: int) -> bool:
    """Past its expiry (``now`` in ms): gone for readers and writers, whenever AWS's TTL gets to deleting it."""
    expires = MetaItem.from_item(meta).expires
    return expires is not None and expires * 1000 <= now


def _expiring(item: Mapping[str, Any], expires: int | None) -> dict[str, Any]:
    """``item`` with the TTL attribute set to ``expires`` (removed when ``None``)."""
    renewed = {name: value for name, value in item.items() if name != TTL}
    if expires is not None:
        renewed[TTL] = {"N": str(expires)}
    return renewed


def _binding_keys(app_name: str, session_id: str, scopes: Mapping[str, str]) -> list[dict[str, Any]]:
    return [_key(binding_pk(app_name, scope, scope_id), session_id) for scope, scope_id in scopes.items()]


def _dead(meta: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(meta["dead"]["SS"]) if "dead" in meta else frozenset()


def _row_of(meta: Mapping[str, Any], pk: str) -> StoredSession:
    """The session's row as its meta item keeps it (the item is the DynamoDB dict; the row is what a load answers)."""
    app_name, session_id = split_session_pk(pk)
    view = MetaItem.from_item(meta)
    return StoredSession(
        id=session_id,
        app_name=app_name,
        version=view.version,
        scopes=json.loads(meta["scopes"]["S"]),
        created_at=int(meta["created_at"]["N"]),
        status=meta["status"]["S"] if "status" in meta else None,
        updated_at=view.updated_at or 0,
        forked_from=meta["forked_from"]["S"] if "forked_from" in meta else None,
        fork_reason=meta["fork_reason"]["S"] if "fork_reason" in meta else None,
    )


def _visible_events(meta: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> list[str]:
    """The encoded events among ``items`` (in key order) that the meta item vouches for, chunks joined.

    Up to its version, of its incarnation, and not of a rolled-back grant.
    """
    view = MetaItem.from_item(meta)
    version, inc, dead = view.version, meta["inc"]["S"], _dead(meta)
    events: list[str] = []
    parts: list[bytes] = []
    expected = 0
    for item in items:
        key = parse_event_sk(item["sk"]["S"])
        if key is None or key.version > version or item["inc"]["S"] != inc or f"{key.version}#{key.grant}" in dead:
            continue
        if key.chunk == 0:
            parts, expected = [], int(item["c"]["N"]) if "c" in item else 1
        parts.append(item["d"]["B"])
        if len(parts) == expected:
            events.append(b"".join(parts).decode())
    return events


def _transact_item(table: str, app_name: str, write: ScopedWrite) -> dict[str, Any]:
    key = _key(scoped_pk(app_name, write.scope, write.scope_id), write.key)
    if write.value is None:
        return {"Delete": {"TableName": table, "Key": key}}
    return {"Put": {"TableName": table, "Item": {**key, "v": {"S": write.value}}}}
