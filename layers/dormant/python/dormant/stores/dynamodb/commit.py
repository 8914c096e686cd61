"""The commit protocol: the one-call transaction, and the gated path (gate, event batches, finish) with its
idempotency by event id.

Why one module: the gate, the batches and the finish are one protocol whose steps each assume what the step
before it wrote (the marker, the grant, the plan); read apart, the order that makes each safe to interrupt is lost.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...clock import now_ms
from ...errors import CommitIncomplete, CommitTooLarge, StoreBusy, StoreError, StoreUnavailable
from ...ids import MAX_KEY_LENGTH
from ..base import RUNNING_STATUS, WAITING_STATUSES, PreparedCommit, Refused, ScopedWrite, StoredSession
from .calls import _backoff, _Calls, _Cancelled, _ConditionFailed, _Exhausted
from .items import (
    MAX_TRANSACT_BYTES,
    STEP_UPDATED_AT,
    STEP_VERSION,
    TTL,
    MetaItem,
    _binding_keys,
    _dead,
    _expired,
    _expiring,
    _key,
    _origin,
    _refused,
    _transact_item,
    head_is,
)
from .keys import (
    GRANT_LENGTH,
    ID_PREFIX,
    META_SK,
    SNAPSHOT_SK,
    IdFilter,
    chunks,
    event_prefix,
    id_sk,
    item_bytes,
    listing_key,
    parse_event_sk,
    pending_key,
    running_key,
    session_pk,
    split_session_pk,
    touch_sk,
)
from .plan import (
    _KNOWN_SESSIONS,
    _SET_MARKER,
    MAX_BOUND_SCOPES,
    MAX_MARKER_BYTES,
    MAX_SCOPED_KEYS,
    _event_items,
    _id_items,
    _itemised,
    _known_after,
    _Marker,
    _MarkerGone,
    _Plan,
    _plan,
)


def _write_units(size: int) -> int:
    """What AWS bills a standard write of an item of ``size`` bytes: 1 unit per KB, rounded up, at least 1."""
    return max(1, -(-size // 1024))


def _gated_is_cheaper(old: Mapping[str, Any], marking: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a commit to a running session (a turn's step, its yield, its end) bills fewer write units gated
    than as one transaction, which bills each item twice: the gate and the finish write the meta item (with the
    marker) once each and put and delete a ``pending`` entry, the event items are written once.

    Only while the session is ``running``: its own runner holds the turn, so the marker's two more round trips
    (milliseconds, against a model call's seconds) keep no one else waiting; other commits stay one call."""
    if old.get("status", {}).get("S") != RUNNING_STATUS:
        return False
    events = sum(_write_units(item_bytes(item)) for item in items)
    meta = item_bytes(old)
    marked = meta + item_bytes(marking)  # what the gate adds (``_Commit._marking``), billed in the gate and finish
    return 2 * (_write_units(marked) + 1) + events < 2 * (_write_units(meta) + events)


class _Commit(_Calls):
    """The commit protocol: one TransactWriteItems when the commit fits, else gate, event batches and finish."""

    if TYPE_CHECKING:  # a writer meeting a stale marker repairs it first (repair)

        def _repair(self, pk: str, cutoff: int) -> object: ...

        def _roll_back(self, pk: str, marker: _Marker, *, create: bool) -> None: ...

    def _write(self, commit: PreparedCommit) -> int | Refused:
        row = commit.row
        scoped = [list(write) for write in commit.scoped]
        if len(scoped) > MAX_SCOPED_KEYS:
            raise CommitTooLarge(
                f"a commit changes at most {MAX_SCOPED_KEYS} scoped keys on DynamoDB, not {len(scoped)}",
                size=len(scoped),
                limit=MAX_SCOPED_KEYS,
                field="scoped_changes",
            )
        if commit.expected_version == 0 and len(row.scopes) > MAX_BOUND_SCOPES:
            raise CommitTooLarge(
                f"a session binds at most {MAX_BOUND_SCOPES} scopes on DynamoDB, not {len(row.scopes)}",
                size=len(row.scopes),
                limit=MAX_BOUND_SCOPES,
                field="scopes",
            )
        data = {event.id: event.data.encode() for event in commit.events}
        count = sum(len(chunks(data[e.id])) for e in commit.events)
        marker = _Marker(
            version=row.version,
            grant=secrets.token_hex(GRANT_LENGTH // 2),
            items=count,
            at=row.updated_at,
            status=row.status,
            scoped=json.dumps(scoped, separators=(",", ":")),
            retention=row.retention_ms,
            touch_in_finish=True,
        )
        if len(marker.scoped) > MAX_MARKER_BYTES:
            raise CommitTooLarge(
                f"a commit's scoped changes hold at most {MAX_MARKER_BYTES:,} bytes of JSON on DynamoDB, "
                f"not {len(marker.scoped):,}",
                size=len(marker.scoped),
                limit=MAX_MARKER_BYTES,
                field="scoped_changes",
            )
        pk = session_pk(row.app_name, row.id)
        done = self._one_call(pk, commit, marker, data)
        if done is not None:
            return done
        old = self._pass_gate(pk, commit, marker)
        if isinstance(old, Refused):
            return old
        inc = old["inc"]["S"]
        plan = _plan(marker, old)
        origin = old if "created_at" in old else _origin(row)
        ids = IdFilter.of(old)
        flagged = [e.id for e in commit.events if ids.may_hold(e.id)]
        stored = self._stored_ids(pk, flagged, old, commit.expected_version) if flagged else set()
        fresh = commit.fresh(stored)
        items = _event_items(pk, marker, inc, [(e.id, data[e.id]) for e in fresh], plan.horizon, ids.greatest)
        if len(items) != marker.items:  # re-sent ids were skipped: the marker must count what is written
            recounted = dataclasses.replace(marker, items=len(items))
            try:
                self._recount(pk, marker, recounted)
            except _MarkerGone as gone:
                return self._after_lost_marker(pk, marker, inc, gone.item, len(fresh), items, plan)
            marker = recounted
        # The id items (of the ids not in order) follow the event items: a repair rolling the commit forward
        # (every event item there) puts them again, so a crash among them leaves no such event without its item.
        writes = items + _id_items(pk, marker, inc, _itemised(ids.greatest, [e.id for e in fresh]), plan.horizon)
        try:
            if plan.refresh:
                self._refresh(pk, plan.horizon, row.scopes)
            self._write_batches([{"PutRequest": {"Item": item}} for item in writes])
        except (_Exhausted, StoreError) as exc:
            raise CommitIncomplete(
                f"commit of version {marker.version} to session {row.id!r} did not write all its events "
                f"({exc}); nothing of it is visible, and repair_pending() will roll it back",
                session_id=row.id,
                version=marker.version,
            ) from exc
        ids.add(e.id for e in fresh)
        try:
            finish = self._finish(pk, marker, inc, ids, plan, origin)
        except _MarkerGone as gone:
            return self._after_lost_marker(pk, marker, inc, gone.item, len(fresh), items, plan)
        except StoreError as exc:
            raise CommitIncomplete(
                f"commit of version {marker.version} to session {row.id!r} wrote its events but not its "
                f"finish ({exc}); repair_pending() will roll it forward",
                session_id=row.id,
                version=marker.version,
            ) from exc
        self._remember(pk, _known_after(inc, marker.version, ids, plan, finish, origin))
        self._drop_stale_touch(pk, plan)
        return len(fresh)

    def _one_call(
        self, pk: str, commit: PreparedCommit, marker: _Marker, data: Mapping[str, bytes]
    ) -> int | Refused | None:
        """The commit in one ``TransactWriteItems``, when it fits: the meta item's update (conditional on the
        expected version and incarnation, no marker, the same scopes, not expired), the event items, the
        touches, the scoped writes and, for a create, the binding entries. Atomic: no marker, nothing to
        repair. ``None`` when it cannot be one call (too large, the meta item not known, an id the filter
        flags, an expiry refresh due, a marker in the way): the gated protocol takes it from there.

        A create needs nothing stored; a later commit builds on the meta item this store last read or wrote
        (``_known``), which the transaction's condition checks: the version and incarnation pin every
        attribute the commit builds on (only a commit changes them)."""
        row, expected = commit.row, commit.expected_version
        if self._single_call_items == 0:
            return None
        if expected == 0:
            old: Mapping[str, Any] = {}
            inc = secrets.token_hex(4)
        else:
            known = self._known.get(pk)
            if known is None or MetaItem.from_item(known).version != expected or "inc" not in known:
                return None
            old, inc = known, known["inc"]["S"]
        plan = _plan(marker, old)
        ids = IdFilter.of(old)
        if plan.refresh or any(ids.may_hold(e.id) for e in commit.events):
            return None
        items = _event_items(pk, marker, inc, [(e.id, data[e.id]) for e in commit.events], plan.horizon, ids.greatest)
        items += _id_items(pk, marker, inc, _itemised(ids.greatest, [e.id for e in commit.events]), plan.horizon)
        app_name, session_id = row.app_name, row.id
        if expected == 0:
            items += [_expiring(key, plan.horizon) for key in _binding_keys(app_name, session_id, row.scopes)]
        origin = old if "created_at" in old else _origin(row)
        others = [*self._touches(pk, plan, marker, origin)]
        others += [_transact_item(self._table, app_name, write) for write in commit.scoped]
        if 1 + len(items) + len(others) > self._single_call_items:
            return None
        size = item_bytes(old) + 1024 + sum(item_bytes(w.get("Put", {}).get("Item", {})) + 1024 for w in others)
        # Event, id and binding items: their payload plus keys and small attributes (ids are at most
        # MAX_KEY_LENGTH characters) bound their size; counted exactly only when the bound is near the limit.
        bound = sum(len(data[e.id]) for e in commit.events) + len(items) * (len(pk) + 3 * MAX_KEY_LENGTH + 128)
        if size + bound > MAX_TRANSACT_BYTES and size + sum(map(item_bytes, items)) > MAX_TRANSACT_BYTES:
            return None
        if expected and not commit.scoped and _gated_is_cheaper(old, self._marking(row, marker), items):
            return None
        ids.add(e.id for e in commit.events)
        update = self._commit_update(pk, marker, inc, ids, plan)
        names, values = update["ExpressionAttributeNames"], update["ExpressionAttributeValues"]
        sets, removes = update["UpdateExpression"].removeprefix("SET ").split(" REMOVE ")
        now = now_ms()
        values |= {
            ":so": {"S": json.dumps(row.scopes, separators=(",", ":"), sort_keys=True)},
            ":inc": {"S": inc},
            ":now": {"N": str(now // 1000)},
        }
        if expected == 0:
            # What the gate and the finish of a create write together; an expired incarnation is replaced.
            sets += ", #id = :id, created_at = :created, scopes = :so, inc = :inc"
            names["#id"] = "id"
            values |= {":id": {"S": session_id}, ":created": {"N": str(row.created_at)}}
            removes += ", dead"
            for name, value in (("forked_from", row.forked_from), ("fork_reason", row.fork_reason)):
                if value is None:
                    removes += f", {name}"
                else:
                    sets += f", {name} = :{name}"
                    values[f":{name}"] = {"S": value}
            condition = "attribute_not_exists(pk) OR #x <= :now"
        else:
            condition = (
                f"{head_is(':e')} AND inc = :inc AND attribute_not_exists(pending) AND scopes = :so"
                " AND (attribute_not_exists(#x) OR #x > :now)"
            )
            values[":e"] = {"N": str(expected)}
            names["#v"] = "version"
        if expected:
            # The condition rules out a marker (``pending``, ``ppk``, ``psk``), and a superseded touch of an
            # earlier layout (``plsk``) only if the one known has it: none to remove. (A create may replace an
            # expired incarnation, whatever it held: it removes everything.)
            gone = {"pending", "ppk", "psk", *(name for name in ("plsk",) if name not in old)}
            removes = ", ".join(name for name in removes.split(", ") if name not in gone)
        update["UpdateExpression"] = f"SET {sets} REMOVE {removes}" if removes else f"SET {sets}"
        update["ConditionExpression"] = condition
        request = [{"Update": update}, *({"Put": {"TableName": self._table, "Item": i}} for i in items), *others]
        try:
            self._transact(request)
        except _Cancelled as cancelled:
            return self._one_call_refused(pk, commit, cancelled.items[0], now)
        except StoreUnavailable:
            # No answer: it applied or it did not, whole. Its touch (this grant's) says which.
            if not self._landed(pk, plan, marker.grant):
                raise
        self._remember(pk, _known_after(inc, marker.version, ids, plan, update, origin))
        self._drop_stale_touch(pk, plan)
        return len(commit.events)

    def _one_call_refused(
        self, pk: str, commit: PreparedCommit, item: Mapping[str, Any] | None, now: int
    ) -> Refused | None:
        """What a one-call commit's failed condition means: a refusal, or ``None`` for the gated protocol to
        sort out (a marker in the way: it waits or repairs; a meta item this store did not know)."""
        self._known.pop(pk, None)
        if item is None or _expired(item, now):
            return Refused(0) if commit.expected_version else None
        if "pending" in item:
            return None
        self._remember(pk, item)
        refused = _refused(item)
        if commit.expected_version == 0:
            return refused if refused.version else None
        if refused.version != commit.expected_version or refused.scopes != commit.row.scopes:
            return refused
        return None

    def _landed(self, pk: str, plan: _Plan, grant: str) -> bool:
        """Whether a one-call commit whose answer was lost applied: the meta item holds its grant (``g``, the
        last commit's), as only this transaction sets it."""
        meta = self._call(
            "get_item", TableName=self._table, Key=_key(pk, META_SK), ProjectionExpression="g", ConsistentRead=True
        ).get("Item")
        return meta is not None and meta.get("g", {}).get("S") == grant

    def _remember(self, pk: str, meta: Mapping[str, Any]) -> None:
        if "pending" in meta:
            return
        self._known.pop(pk, None)
        if len(self._known) >= _KNOWN_SESSIONS:
            self._known.pop(next(iter(self._known)))
        self._known[pk] = dict(meta)

    def _marking(self, row: StoredSession, marker: _Marker) -> dict[str, Any]:
        """What the gate sets on the meta item (``_SET_MARKER``): the marker and its ``pending`` index key."""
        return {
            "pending": marker.attribute(),
            "ppk": {"S": pending_key(row.app_name, row.id, self._pending_shards)},
            "psk": {"N": str(marker.at)},
        }

    def _pass_gate(self, pk: str, commit: PreparedCommit, marker: _Marker) -> dict[str, Any] | Refused:
        """Record the marker; return the meta item as it was before (``inc`` only, on create) or the refusal."""
        row, expected = commit.row, commit.expected_version
        app_name, session_id = row.app_name, row.id
        scopes = json.dumps(row.scopes, separators=(",", ":"), sort_keys=True)
        now = now_ms()
        marking = self._marking(row, marker)
        values: dict[str, Any] = {
            ":p": marking["pending"],
            ":ppk": marking["ppk"],
            ":psk": marking["psk"],
            ":now": {"N": str(now // 1000)},
        }
        names = {"#x": TTL}
        if expected == 0:
            inc = secrets.token_hex(4)  # this incarnation of the session id: a re-creation gets another
            update = "SET #id = :id, created_at = :created, scopes = :so, inc = :inc, version = :zero"
            # An expired session is gone: its id may be taken again, as after a delete (a new incarnation).
            condition = "attribute_not_exists(pk) OR #x <= :now"
            removes = ["bf", "hi", "hv", "dead", "lsk", "plsk", "xh", "#x", "#st", "lpk", "spk", "rpk", "dpk", "#du"]
            names["#st"] = "status"
            names["#du"] = "due"
            values |= {
                ":id": {"S": session_id},
                ":created": {"N": str(row.created_at)},
                ":so": {"S": scopes},
                ":inc": {"S": inc},
                ":zero": {"N": "0"},
            }
            for name, value in (("forked_from", row.forked_from), ("fork_reason", row.fork_reason)):
                if value is not None:
                    update += f", {name} = :{name}"
                    values[f":{name}"] = {"S": value}
                else:
                    removes.append(name)
            update += ", " + _SET_MARKER + " REMOVE " + ", ".join(removes)
            names["#id"] = "id"
        else:
            update = "SET " + _SET_MARKER
            # Scopes are fixed at creation: a commit naming others must not open the gate; nor may an expired
            # session take commits (AWS may have deleted some of its items already).
            # Nor may a grant a repair already rolled back open it again: a re-sent gate (its first answer lost
            # for longer than a marker takes to go stale) would land events its ``dead`` entry hides.
            condition = (
                f"{head_is(':e', 'version')} AND attribute_not_exists(pending) AND scopes = :so"
                " AND (attribute_not_exists(#x) OR #x > :now) AND NOT contains(dead, :vg)"
            )
            values |= {
                ":e": {"N": str(expected)},
                ":so": {"S": scopes},
                ":vg": {"S": f"{marker.version}#{marker.grant}"},
            }
        gate = {
            "TableName": self._table,
            "Key": _key(pk, META_SK),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
            "ExpressionAttributeNames": names,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        # A create of a bound session puts its binding entries (keys.binding_pk) in the gate's transaction:
        # the meta item never exists without them, so an erasure never misses the session. They expire with
        # the session's items (a create's horizon depends on nothing stored).
        bindings = []
        if expected == 0:
            horizon = _plan(marker, {}).horizon
            bindings = [
                {"Put": {"TableName": self._table, "Item": _expiring(key, horizon)}}
                for key in _binding_keys(app_name, session_id, row.scopes)
            ]
        deadline = time.monotonic() + self._live_wait_s
        polls = 0
        repaired = False
        while True:
            try:
                if bindings:
                    self._transact([{"Update": gate}, *bindings])
                    granted: dict[str, Any] = {}
                else:
                    granted = self._call("update_item", **gate, ReturnValues="ALL_OLD")
            except _ConditionFailed as failed:
                item = failed.item
            except _Cancelled as cancelled:
                item = cancelled.items[0]
            except StoreUnavailable:
                # No answer: the gate may have applied. Take our marker back (conditional on its grant, so a
                # foreign one is never touched) and the session is free for the caller's retry at once.
                with contextlib.suppress(StoreError, _MarkerGone):
                    self._roll_back(pk, marker, create=expected == 0)
                raise
            else:
                # A create starts from nothing (what ALL_OLD holds then is an expired incarnation's).
                return {"inc": {"S": inc}} if expected == 0 else dict(granted.get("Attributes") or {})
            blocking = None if item is None else _Marker.of(item)
            if item is not None and blocking == marker and (expected or item["inc"]["S"] == inc):
                # Our own gate: it applied, its answer was lost and the gate was sent again (by botocore or
                # by this loop). The item is as the gate left it: before it, it held all but the marker.
                if expected == 0:
                    return {"inc": {"S": inc}}
                return {name: value for name, value in item.items() if name not in ("pending", "ppk", "psk")}
            if item is None or _expired(item, now):
                return Refused(0)
            refused = _refused(item)
            if f"{marker.version}#{marker.grant}" in _dead(item):
                raise StoreBusy(
                    f"session {session_id!r}: this commit's gate went unanswered until a repair undid it; "
                    "nothing of it was written, try again"
                )
            if blocking is None or refused.version != expected or (expected and refused.scopes != row.scopes):
                self._remember(pk, item)  # the stored item: the caller's next try can be one call
                return refused
            if now_ms() - blocking.at >= self._stale_after_ms and not repaired:
                # A writer that died mid-commit: finish or undo its commit, then try the gate again.
                self._repair(pk, blocking.at)
                repaired = True
                continue
            if time.monotonic() >= deadline:
                raise StoreBusy(
                    f"session {session_id!r} has had a commit in flight for {self._live_wait_s:g} s; "
                    "nothing was written, try again (a stuck commit is repaired once its marker is stale)"
                )
            _backoff(polls, base=0.005, cap=0.2)
            polls += 1

    def _stored_ids(self, pk: str, event_ids: Sequence[str], meta: Mapping[str, Any], version: int) -> set[str]:
        """Which of these ids a committed event of this session holds (``meta``: its meta item before this
        commit, at ``version``).

        First their id items (``keys.id_sk``), read by key in consistent ``BatchGetItem`` calls of 100 — one call
        for a whole re-sent turn. An id item counts when its incarnation is the session's, its version committed
        and its grant not rolled back. An item that does not count is not the last word: a rolled-back writer
        waking late may have put it over the live one (a batch cannot be conditional), so the events from its
        version on (from the first, for another incarnation's) are read for the id. An id with no item that
        counts may have been stored *in order*, with no item (``plan._in_order``): a binary search of the event
        items finds it (``_stored_in_order``)."""
        inc, dead = meta["inc"]["S"], _dead(meta)
        stored: set[str] = set()
        unsure: builtins.list[tuple[str, int]] = []
        for found in self._get_items([_key(pk, id_sk(event_id)) for event_id in event_ids], "sk, inc, v, t"):
            event_id = found["sk"]["S"][len(ID_PREFIX) :]
            written_at = int(found["v"]["N"])
            if found["inc"]["S"] != inc:
                unsure.append((event_id, 1))
            elif written_at <= version and f"{written_at}#{found['t']['S']}" not in dead:
                stored.add(event_id)
            else:
                unsure.append((event_id, written_at))
        for event_id, since in unsure:
            if since <= version and self._held_from(pk, event_id, since, version, inc, dead):
                stored.add(event_id)
        start = self._in_order_since(meta)
        commits: dict[int, set[str]] = {}  # the ids of each commit a search ended at, read once
        for event_id in event_ids if start is not None else ():
            if event_id in stored:
                continue
            at = self._in_order_commit(pk, event_id, start or 1, version, inc, dead)
            if at is not None and at not in commits:
                commits[at] = self._held_in(pk, at, inc, dead)
            if at is not None and event_id in commits[at]:
                stored.add(event_id)
        return stored

    def _held_from(self, pk: str, event_id: str, since: int, version: int, inc: str, dead: frozenset[str]) -> bool:
        """Whether a live event item of versions ``since`` to ``version`` holds ``event_id`` (a consistent Query
        of that range, filtered on the id)."""
        for item in self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :from AND :to",
            FilterExpression="eid = :eid",
            ExpressionAttributeValues={
                ":pk": {"S": pk},
                ":from": {"S": event_prefix(since)},
                ":to": {"S": event_prefix(version) + "~"},
                ":eid": {"S": event_id},
            },
            ProjectionExpression="sk, inc",
            ConsistentRead=True,
        ):
            key = parse_event_sk(item["sk"]["S"])
            if key is not None and item["inc"]["S"] == inc and f"{key.version}#{key.grant}" not in dead:
                return True
        return False

    @staticmethod
    def _in_order_since(meta: Mapping[str, Any]) -> int | None:
        """The version from which this incarnation may hold in-order ids without id items (``hv``), 1 when an
        earlier release re-created the session over an incarnation that set it; ``None``: none (every id stored
        has its item)."""
        if "hv" not in meta:
            return None
        inc, version = meta["hv"]["S"].split("#")
        return int(version) if inc == meta["inc"]["S"] else 1

    def _in_order_commit(
        self, pk: str, event_id: str, start: int, version: int, inc: str, dead: frozenset[str]
    ) -> int | None:
        """The version of the commit that holds ``event_id`` if it was stored in order (greater than every id
        before it, so with no id item); ``None``: no commit could.

        Each live event item of this layout carries ``hi``, the greatest id stored once its commit landed:
        non-decreasing along the session's live events. An id stored in order is in the first commit whose
        ``hi`` reaches it (every commit before it stored smaller ids only), so a binary search over versions
        ``start`` to ``version`` finds that commit — ``log2(versions)`` consistent Queries of one item each —
        and one read of its items (``_held_in``) says whether the id is among them. Paid only by re-sent ids
        and the filter's false positives; a turn of new ids never gets here."""
        end = event_prefix(version) + "~"
        low, high, found = start, version, None
        while low <= high:
            middle = (low + high) // 2
            probe = self._first_commit_from(pk, event_prefix(middle), end, inc, dead)
            if probe is None or probe[1] >= event_id:
                found = found if probe is None else probe[0]
                high = middle - 1
            else:
                low = probe[0] + 1
        return found

    def _held_in(self, pk: str, version: int, inc: str, dead: frozenset[str]) -> set[str]:
        """The ids of the live event items of ``version`` (one consistent Query of that commit's items)."""
        held = set()
        for item in self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :v)",
            ExpressionAttributeValues={":pk": {"S": pk}, ":v": {"S": event_prefix(version)}},
            ProjectionExpression="sk, inc, eid",
            ConsistentRead=True,
        ):
            key = parse_event_sk(item["sk"]["S"])
            if key is not None and "eid" in item and item["inc"]["S"] == inc and f"{version}#{key.grant}" not in dead:
                held.add(item["eid"]["S"])
        return held

    def _first_commit_from(
        self, pk: str, start: str, end: str, inc: str, dead: frozenset[str]
    ) -> tuple[int, str] | None:
        """The version and ``hi`` of the first live event item of this layout from ``start`` to ``end``. A grant
        not live (rolled back, another incarnation's) or of an earlier layout (no ``hi``) is stepped over whole."""
        while start <= end:
            page = self._call(
                "query",
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :from AND :to",
                ExpressionAttributeValues={":pk": {"S": pk}, ":from": {"S": start}, ":to": {"S": end}},
                ProjectionExpression="sk, inc, hi",
                ConsistentRead=True,
                Limit=1,
            )
            items = page.get("Items", [])
            key = parse_event_sk(items[0]["sk"]["S"]) if items else None
            if key is None:
                return None
            item = items[0]
            if item["inc"]["S"] == inc and f"{key.version}#{key.grant}" not in dead and "hi" in item:
                return key.version, item["hi"]["S"]
            start = event_prefix(key.version, key.grant) + "~"
        return None

    def _recount(self, pk: str, marker: _Marker, recounted: _Marker) -> None:
        """Record the marker's corrected item count (and where its touch goes, which depends on it)."""
        try:
            self._call(
                "update_item",
                TableName=self._table,
                Key=_key(pk, META_SK),
                UpdateExpression="SET pending.n = :n, pending.f = :f",
                ConditionExpression="pending.t = :t",
                ExpressionAttributeValues={
                    ":n": {"N": str(recounted.items)},
                    ":f": {"BOOL": recounted.touch_in_finish},
                    ":t": {"S": marker.grant},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except _ConditionFailed as failed:
            raise _MarkerGone(failed.item) from None

    def _finish(
        self, pk: str, marker: _Marker, inc: str, ids: IdFilter, plan: _Plan, origin: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Make the marker's version the stored one and clear the marker (the meta item is the session's listing
        entry: this moves it); with its scoped writes and the delete of any touch an earlier layout left as the
        session's entry, atomically."""
        app_name = split_session_pk(pk)[0]
        update = self._commit_update(pk, marker, inc, ids, plan)
        update["ConditionExpression"] = "pending.t = :t"
        update["ExpressionAttributeValues"][":t"] = {"S": marker.grant}
        writes = [_transact_item(self._table, app_name, ScopedWrite(*write)) for write in json.loads(marker.scoped)]
        writes += self._touches(pk, plan, marker, origin)
        if not writes:
            try:
                self._call("update_item", **update)
            except _ConditionFailed as failed:
                raise _MarkerGone(failed.item) from None
            return update
        try:
            self._transact([{"Update": update}, *writes])
        except _Cancelled as cancelled:
            raise _MarkerGone(cancelled.items[0]) from None
        return update

    def _commit_update(self, pk: str, marker: _Marker, inc: str, ids: IdFilter, plan: _Plan) -> dict[str, Any]:
        """The meta item's update that lands a commit (no condition): what the finish and the one-call
        transaction both write, so the two paths leave the same item. Only the attribute names its expression
        uses are given (DynamoDB refuses others); a caller adding a condition adds its own."""
        app_name, session_id = split_session_pk(pk)
        values: dict[str, Any] = {
            ":v": {"N": str(marker.version)},
            ":u": {"N": str(plan.updated_at)},
            ":g": {"S": marker.grant},
            ":bf": {"B": ids.dump()},
        }
        removes = "pending, ppk, psk"
        removes += ", plsk"  # an earlier layout's superseded touch: deleted by this commit now
        if plan.step:
            # A running turn's step moves the head alone (``sv``, ``su``): the session's listing, status, running and
            # due entries (``version``, ``lsk``, the status, the expiry: ``_plan``) stay as its claim wrote them, so a
            # step writes no index entry. Readers take the head from ``MetaItem``.
            sets = f"{STEP_VERSION} = :v, {STEP_UPDATED_AT} = :u, g = :g, bf = :bf"
        else:
            # The meta item is the session's entry in the listing and status indexes (``lpk``/``spk`` with ``lsk``):
            # the commit's own write moves it, no touch item to put and none to delete (``_touches``).
            values[":lpk"] = {"S": listing_key(app_name, session_id, self._listing_shards)}
            sets = "#v = :v, lsk = :u, lpk = :lpk, g = :g, bf = :bf"
            removes += f", {STEP_VERSION}, {STEP_UPDATED_AT}"
        if ids.greatest is not None:  # "" (no event yet) too: only a meta item without it is read as unknown
            values[":hi"] = {"S": ids.greatest}
            sets += ", hi = :hi"
            # Where this incarnation's in-order ids (no id item, ``plan._in_order``) may start: its first commit
            # with a known ``hi`` (the session's create, for a session of this layout). ``_stored_in_order``
            # searches from there; the events before it (an earlier layout's) all have their id items.
            values[":hv"] = {"S": f"{inc}#{marker.version}"}
            sets += ", hv = :hv" if marker.version == 1 else ", hv = if_not_exists(hv, :hv)"
        for name, value in (("#x", plan.expires), ("xh", plan.horizon)):
            if value is None:
                removes += f", {name}"
            else:
                sets += f", {name} = :{name.lstrip('#')}"
                values[f":{name.lstrip('#')}"] = {"N": str(value)}
        if not plan.step:  # a step is running before and after: its status and index keys are unchanged
            more_sets, more_removes = self._status_keys(pk, marker.status, plan.updated_at, values)
            sets, removes = sets + more_sets, removes + more_removes
        expression = f"SET {sets} REMOVE {removes}"
        names = {"#v": "version", "#st": "status", "#x": TTL, "#du": "due"}
        return {
            "TableName": self._table,
            "Key": _key(pk, META_SK),
            "UpdateExpression": expression,
            "ExpressionAttributeNames": {alias: name for alias, name in names.items() if alias in expression},
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def _status_keys(self, pk: str, status: str | None, updated_at: int, values: dict[str, Any]) -> tuple[str, str]:
        """What a commit that is no step adds to its update for its status and the index keys that go with it:
        ``(", sets", ", removes")``, their values added to ``values``."""
        app_name, session_id = split_session_pk(pk)
        sets = removes = ""
        if status is None:
            removes += ", #st, spk"
        else:
            sets += ", #st = :st, spk = :spk"
            values[":st"] = {"S": status}
            values[":spk"] = {"S": f"{status}#{values[':lpk']['S']}"}  # its entry in the status index
        # The running index's key goes with the status, in this same write: an index write only when the
        # session goes into or out of ``running`` or of waiting (the value is the same on every commit in
        # between, and for ``awaiting_input`` and ``resumable`` alike).
        # A wait goes into the due index instead, due from this commit (``DueStore``): an index write on every
        # commit while it waits (its ``due`` moves), and the sweeper reads none of the healthy ones.
        if status == RUNNING_STATUS:
            sets += ", rpk = :rpk"
            values[":rpk"] = {"S": running_key(app_name, session_id, self._pending_shards)}
            removes += ", dpk, #du"
        elif status in WAITING_STATUSES:
            sets += ", dpk = :dpk, #du = :du"
            values[":dpk"] = {"S": running_key(app_name, session_id, self._pending_shards, waiting=True)}
            values[":du"] = {"N": str(updated_at)}
            removes += ", rpk"
        else:
            removes += ", rpk, dpk, #du"
        return sets, removes

    def _touches(
        self, pk: str, plan: _Plan, marker: _Marker, origin: Mapping[str, Any]
    ) -> builtins.list[dict[str, Any]]:
        """The deletes, as ``TransactWriteItems`` entries, of the touches an earlier layout kept as the session's
        listing entry: the one the meta item this commit builds on was listed by (``_Plan.previous``), and the
        commit's own when a writer of that layout put it in its batches (a marker without ``touch_in_finish``,
        rolled forward here). The meta item is the entry from this commit on, so a session of this layout has
        none: no write. ``origin`` is unused (the meta item keeps ``created_at`` and ``forked_from``)."""
        del origin
        stale = {plan.previous} if plan.previous is not None else set()
        if not marker.touch_in_finish:
            stale.add(plan.updated_at)
        return [{"Delete": {"TableName": self._table, "Key": _key(pk, touch_sk(at))}} for at in sorted(stale)]

    def _drop_stale_touch(self, pk: str, plan: _Plan) -> None:
        """Delete a touch an earlier layout left for the next commit to mark (``plsk``): once, best effort."""
        if plan.stale is not None:
            with contextlib.suppress(StoreError):
                self._call("delete_item", TableName=self._table, Key=_key(pk, touch_sk(plan.stale)))

    def _drop_touch(self, pk: str, plan: _Plan, grant: str, meta: Mapping[str, Any] | None) -> None:
        """Delete the touch of a commit that did not land, unless a later commit (or the meta item's own
        ``updated_at``) has made that key the session's live entry."""
        if meta is not None and MetaItem.from_item(meta).updated_at == plan.updated_at:
            return  # the same key as the live touch (a commit in the same millisecond): it stays
        with contextlib.suppress(_ConditionFailed):
            self._call(
                "delete_item",
                TableName=self._table,
                Key=_key(pk, plan.touch),
                ConditionExpression="t = :t",
                ExpressionAttributeValues={":t": {"S": grant}},
            )

    def _refresh(self, pk: str, horizon: int | None, scopes: Mapping[str, str]) -> None:
        """Rewrite every item of the session but the meta item — and its binding entries, outside its
        partition — to expire at ``horizon`` (``None``: never).

        Runs before the commit's own writes, while its marker holds the session; the meta item's new
        expiry lands only with the finish, after this. Items are immutable, so each is put back whole
        (BatchWriteItem), keys unchanged: no index write. The snapshot, which a concurrent save may
        replace, is updated in place instead.
        """
        now = now_ms() // 1000
        puts = []
        for item in self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND sk > :m",
            ExpressionAttributeValues={":pk": {"S": pk}, ":m": {"S": META_SK}},
            ConsistentRead=True,
        ):
            if TTL in item and int(item[TTL]["N"]) <= now:
                continue  # a superseded touch on its way out
            if item["sk"]["S"] == SNAPSHOT_SK:
                expiry: dict[str, Any] = {"UpdateExpression": "REMOVE #x"}
                if horizon is not None:
                    values = {":h": {"N": str(horizon)}}
                    expiry = {"UpdateExpression": "SET #x = :h", "ExpressionAttributeValues": values}
                with contextlib.suppress(_ConditionFailed):
                    self._call(
                        "update_item",
                        TableName=self._table,
                        Key=_key(pk, SNAPSHOT_SK),
                        ConditionExpression="attribute_exists(pk)",
                        ExpressionAttributeNames={"#x": TTL},
                        **expiry,
                    )
                continue
            puts.append({"PutRequest": {"Item": _expiring(item, horizon)}})
        app_name, session_id = split_session_pk(pk)
        puts += [
            {"PutRequest": {"Item": _expiring(key, horizon)}} for key in _binding_keys(app_name, session_id, scopes)
        ]
        self._write_batches(puts)

    def _after_lost_marker(
        self,
        pk: str,
        marker: _Marker,
        inc: str,
        item: Mapping[str, Any] | None,
        appended: int,
        items: Sequence[Mapping[str, Any]],
        plan: _Plan,
    ) -> int | Refused:
        """Our marker vanished under us: a repair finished or undid the commit, or the session was deleted."""
        if (
            item is not None
            and item.get("inc", {}).get("S") == inc
            and MetaItem.from_item(item).version >= marker.version
            and f"{marker.version}#{marker.grant}" not in _dead(item)
        ):
            return appended  # a repair rolled it forward: the commit landed
        with contextlib.suppress(StoreError):  # invisible already; deleting them only saves space
            self._write_batches([{"DeleteRequest": {"Key": {"pk": i["pk"], "sk": i["sk"]}}} for i in items])
            if not marker.touch_in_finish:  # an earlier layout's writer put its touch in the batches
                self._drop_touch(pk, plan, marker.grant, item)
        if item is None:
            return Refused(0)
        return _refused(item)
