"""The commit plan: the pending marker the gate records, and what a granted commit writes besides it (its event
and id items, the meta item's new attributes), worked out the same way by the writer and by a repair."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..base import RUNNING_STATUS
from .items import _BATCH, STEP_UPDATED_AT, STEP_VERSION, TTL, MetaItem
from .keys import IdFilter, chunks, event_sk, id_sk, touch_sk

MAX_SCOPED_KEYS = 97
"""Scoped keys one commit may change: they are written in one ``TransactWriteItems`` (at most 100 items)
with the finish's meta update, the touch and the delete of the touch it supersedes."""
MAX_BOUND_SCOPES = 99
"""Scopes one session may bind: a create puts their binding entries in the gate's ``TransactWriteItems``."""
MAX_MARKER_BYTES = 300_000
"""What a pending marker may hold (the scoped changes, as JSON): it lives on the 400 KB meta item."""
_KNOWN_SESSIONS = 1000
"""Meta items a store remembers for one-call commits (``_known``): the least recently stored go first."""
_SET_MARKER = "pending = :p, ppk = :ppk, psk = :psk"


@dataclass(frozen=True)
class _Marker:
    """A commit in flight, as recorded on the meta item by the gate."""

    version: int
    grant: str
    items: int
    at: int
    status: str | None
    scoped: str
    """JSON ``[[scope, scope_id, key, value JSON or null], ...]``."""
    retention: int | None = None
    """The session's retention (ms after its last commit; ``None``: for ever), from the row."""
    touch_in_finish: bool = False
    """The commit's touch (and the marking of the superseded one) is written by the finish, in its
    ``TransactWriteItems``, not after the events: there are none, or the touch would spill into a batch of
    its own (``_touch_in_finish``). Its event items alone then prove the commit complete. A marker written
    before this existed has none: its touch went last in the batches."""

    def attribute(self) -> dict[str, Any]:
        marker = {
            "v": {"N": str(self.version)},
            "t": {"S": self.grant},
            "n": {"N": str(self.items)},
            "at": {"N": str(self.at)},
            "st": {"NULL": True} if self.status is None else {"S": self.status},
            "sc": {"S": self.scoped},
        }
        if self.retention is not None:
            marker["r"] = {"N": str(self.retention)}
        if self.touch_in_finish:
            marker["f"] = {"BOOL": True}
        return {"M": marker}

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> _Marker | None:
        if "pending" not in meta:
            return None
        m = meta["pending"]["M"]
        return cls(
            int(m["v"]["N"]),
            m["t"]["S"],
            int(m["n"]["N"]),
            int(m["at"]["N"]),
            m["st"].get("S"),
            m["sc"]["S"],
            int(m["r"]["N"]) if "r" in m else None,
            m.get("f", {}).get("BOOL", False),
        )


def _touch_in_finish(items: int, create: bool) -> bool:
    """Whether the commit's touches must ride in the finish to keep it at ``2 + ceil(items / 25)`` calls:
    no event items, or too few free slots in the last batch of 25 for the touch and the marking of the
    superseded touch. Decided at the gate, before the plan is known, so it counts the marking a create
    never has but any later commit may (``_Plan.stale``)."""
    return (-items) % _BATCH < (1 if create else 2)


@dataclass(frozen=True)
class _Plan:
    """What a granted commit writes besides its events, worked out from its marker and the meta item as
    the gate found it — so the writer and a repair rolling the commit forward reach the same values.

    Expiry (retention): the meta item's ``expires_at`` is ``updated_at + retention``; every other item
    of the session carries ``expires_at >= horizon`` (``xh`` on the meta item), and ``horizon >=`` the
    meta's. A commit whose new expiry passes the horizon first rewrites every item's ``expires_at`` to a
    new horizon, half a retention further (``refresh``), so AWS never deletes a piece of a living session.
    """

    updated_at: int
    touch: str
    """The sort key of this commit's touch item."""
    stale: int | None
    """The ``updated_at`` of a superseded touch to mark expired now (the meta item's ``plsk``)."""
    previous: int | None
    """The touch an earlier layout listed the session by (the meta item it builds on has no ``lpk``), which
    this commit deletes as it makes the meta item the entry."""
    expires: int | None
    """The meta item's ``expires_at`` (epoch seconds), or ``None``: kept for ever."""
    horizon: int | None
    refresh: bool
    """Items stored before this commit carry an expiry below ``horizon`` (or one that must go)."""
    step: bool = False
    """A step of a running turn (``running`` before and after): it moves the head (``sv``, ``su``) and leaves the
    listing and status entries (``version``, ``lsk``, the status) as the turn's claim wrote them."""


def _plan(marker: _Marker, old: Mapping[str, Any]) -> _Plan:
    """``old`` is the meta item before the gate (``{}`` for a create)."""
    was = MetaItem.from_item(old)
    old_lsk, old_previous = was.updated_at, was.previous
    updated_at = max(marker.at, old_lsk or 0)
    step = (
        marker.status == RUNNING_STATUS
        and old.get("status", {}).get("S") == RUNNING_STATUS
        and "lpk" in old
        and was.version > 0
    )
    # A meta item of this layout is its own listing entry ("lpk"): no touch to supersede. One an earlier layout
    # wrote was listed by its touch (``T#{lsk}``), which this commit deletes.
    superseded = old_lsk is not None and "lpk" not in old
    stale = old_previous if old_previous is not None and old_previous not in (old_lsk, updated_at) else None
    old_horizon = was.horizon
    retention = marker.retention
    if retention is None:
        expires = horizon = None
        refresh = old_horizon is not None
    else:
        expires = (updated_at + retention) // 1000  # rounded down: gone no later than the app says
        slack = -(-retention // 2000)
        if step and was.expires is not None and 0 <= expires - was.expires < slack:
            # A step keeps the expiry its claim set (projected by the listing indexes: moving it would write their
            # entries); the turn's next commit that is no step moves it. Half a retention at most behind.
            expires = was.expires
        if old_horizon is not None and expires <= old_horizon <= expires + 2 * slack:
            horizon, refresh = old_horizon, False
        else:  # past the horizon, never given one, or a retention cut short: rewrite the items' expiry
            horizon, refresh = expires + slack, marker.version > 1
    return _Plan(
        updated_at,
        touch_sk(updated_at),
        stale,
        old_lsk if superseded else None,
        expires,
        horizon,
        refresh,
        step,
    )


class _MarkerGone(Exception):
    """The finishing write found the marker it was finishing gone; ``item`` is the meta item now."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        self.item = item


def _known_after(
    inc: str, version: int, ids: IdFilter, plan: _Plan, update: Mapping[str, Any], origin: Mapping[str, Any]
) -> dict[str, Any]:
    """The attributes of a meta item a commit just landed (by ``update``) that a one-call commit after it builds on:
    its head (``version`` and ``lsk``, or a step's ``sv`` and ``su``), its status, its own listing entry."""
    values = update["ExpressionAttributeValues"]
    head = {"N": str(version)}, {"N": str(plan.updated_at)}
    # Its own listing entry (a step leaves ``lpk`` as it was: only its presence is read), so no touch to supersede.
    item: dict[str, Any] = {"inc": {"S": inc}, "lpk": values.get(":lpk", {"S": ""})}
    item.update(zip((STEP_VERSION, STEP_UPDATED_AT) if plan.step else ("version", "lsk"), head, strict=True))
    if plan.step:
        item["status"] = {"S": RUNNING_STATUS}
    elif ":st" in values:
        item["status"] = values[":st"]
    item["bf"] = update["ExpressionAttributeValues"][":bf"]
    if ids.greatest is not None:
        item["hi"] = {"S": ids.greatest}
    for name, value in ((TTL, plan.expires), ("xh", plan.horizon)):
        if value is not None:
            item[name] = {"N": str(value)}
    for name in ("created_at", "forked_from"):
        if name in origin:
            item[name] = origin[name]
    return item


def _in_order(greatest: str | None, event_ids: Sequence[str]) -> list[bool]:
    """Which of a commit's ids are *in order*: each greater than every id stored before it (the meta item's
    ``hi``, then the commit's own ids before it). Such an id needs no id item: a lookup finds it by a binary
    search of the event items' ``hi`` (``_Commit._stored_in_order``). ``greatest`` is the meta item's ``hi``
    before the commit; ``None`` (a meta item written before ``hi`` was kept): none is, every id gets its item.
    The writer and a repair rolling its commit forward reach the same answer from the same meta item."""
    if greatest is None:
        return [False] * len(event_ids)
    flags = []
    for event_id in event_ids:
        flags.append(event_id > greatest)
        greatest = max(greatest, event_id)
    return flags


def _itemised(greatest: str | None, event_ids: Sequence[str]) -> list[str]:
    """The ids of a commit that get an id item: those not in order (``_in_order``)."""
    flags = _in_order(greatest, event_ids)
    return [event_id for event_id, in_order in zip(event_ids, flags, strict=True) if not in_order]


def _event_items(
    pk: str,
    marker: _Marker,
    inc: str,
    events: Sequence[tuple[str, bytes]],
    expires: int | None,
    greatest: str | None = None,
) -> list[dict[str, Any]]:
    """The commit's event items. With the meta item's ``hi`` before the commit (``greatest``), each event's
    first item carries ``hi``: the greatest id stored once this commit lands, non-decreasing along the
    session's live events (what ``_Commit._stored_in_order`` searches)."""
    after = None if greatest is None else max([greatest, *(event_id for event_id, _ in events)])
    items: list[dict[str, Any]] = []
    for seq, (event_id, data) in enumerate(events):
        pieces = chunks(data)
        for n, piece in enumerate(pieces):
            item: dict[str, Any] = {
                "pk": {"S": pk},
                "sk": {"S": event_sk(marker.version, marker.grant, seq, n)},
                "inc": {"S": inc},
                "d": {"B": piece},
            }
            if n == 0:
                item["eid"] = {"S": event_id}
                if len(pieces) > 1:
                    item["c"] = {"N": str(len(pieces))}
                if after is not None:
                    item["hi"] = {"S": after}
            if expires is not None:
                item[TTL] = {"N": str(expires)}
            items.append(item)
    return items


def _id_items(
    pk: str, marker: _Marker, inc: str, event_ids: Sequence[str], expires: int | None
) -> list[dict[str, Any]]:
    """One item per event id given (``keys.id_sk``; the ids not in order, ``_in_order``): which incarnation,
    version and grant stored it — what a lookup of a re-sent id needs to tell a live event from a rolled-back
    or deleted one. About 100 bytes: 1 write unit (2 in a transaction)."""
    version = {"N": str(marker.version)}
    grant, incarnation = {"S": marker.grant}, {"S": inc}
    items: list[dict[str, Any]] = []
    for event_id in event_ids:
        item: dict[str, Any] = {
            "pk": {"S": pk},
            "sk": {"S": id_sk(event_id)},
            "inc": incarnation,
            "v": version,
            "t": grant,
        }
        if expires is not None:
            item[TTL] = {"N": str(expires)}
        items.append(item)
    return items
