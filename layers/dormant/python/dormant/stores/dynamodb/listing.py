"""Listing: Queries of the sharded listing and status indexes merged newest first, and the running index's sessions."""

from __future__ import annotations

import builtins
import heapq
from collections.abc import Iterator, Sequence
from typing import Any

from ...clock import now_ms
from ..base import NOT_DUE, RUNNING_STATUS, WAITING_STATUSES, RunningSession, ScopedWrite, SessionListing
from .calls import _Calls, _Cancelled, _ConditionFailed
from .items import STEP_UPDATED_AT, STEP_VERSION, TTL, MetaItem, _expired, _key, _transact_item, head_is
from .keys import META_SK, listing_keys, running_key, running_keys, session_pk, split_session_pk
from .table import DUE_INDEX, LISTING_INDEX, RUNNING_INDEX, STATUS_INDEX


class _Listing(_Calls):
    """Listing sessions: by app from the sharded listing index, the running and waiting ones from the running index."""

    def _list(
        self, app_name: str, limit: int | None, after: tuple[int, str] | None, status: str | None
    ) -> builtins.list[SessionListing]:
        """The shards' entries merged newest first: Queries of the listing index only, no read of the table.

        Each entry is a session's meta item, moved by the write that lands each commit (its transaction or its
        finish), carrying the row a listing shows (``version``, ``status``, ``created_at``, the expiry), which the
        index projects. So the index holds only committed positions, and while it lags a commit it still
        holds the session's previous position: a listing shows every committed session, at its newest
        position once the index has caught up, and never twice (a session's first, newest, entry wins, while
        an earlier layout's touch, ``mx`` its expiry, is on its way out at the session's next commit).

        With ``status``, the same from the status index, whose partitions hold only that status's touches: the
        shard streams read on (page after page) until the listing is full or they run out, so a page is never
        short while more match. A release 0.1 meta item has no ``spk``: it joins on its next commit."""
        page = None if limit is None else limit + 2  # about one entry a session, and one more while the index lags
        keys = listing_keys(app_name, self._listing_shards)
        streams = [self._shard_stream(key, after, page, status) for key in keys]
        listed: builtins.list[SessionListing] = []
        seen: set[str] = set()
        now_s = now_ms() // 1000
        for updated_at, session_id, entry in heapq.merge(*streams, key=lambda e: e[:2], reverse=True):
            if session_id in seen:
                continue
            seen.add(session_id)
            expiry = entry.get("mx", entry.get(TTL) if entry["sk"]["S"] == META_SK else None)
            if int(entry.get("version", {"N": "0"})["N"]) == 0 or (expiry is not None and int(expiry["N"]) <= now_s):
                continue  # a create still pending (release 0.1's meta entry), or an expired session
            listed.append(
                SessionListing(
                    session_id,
                    updated_at,
                    int(entry["created_at"]["N"]) if "created_at" in entry else 0,
                    int(entry["version"]["N"]),
                    entry["status"]["S"] if "status" in entry else None,
                )
            )
            if limit is not None and len(listed) == limit:
                break
        return listed

    def _running(self, limit: int) -> builtins.list[RunningSession]:
        """Every ``R#`` shard of the running index (keys only), then the meta items it names, read strongly
        consistent in batches: the index lags the table, so only a session whose meta item says ``running``
        now (live, created, not expired) is kept, its ``updated_at`` from the item. Reads every running
        session's meta item to order them oldest first; ``limit`` caps the answer, not the reads."""
        return self._indexed(running_keys(self._pending_shards), (RUNNING_STATUS,), limit)

    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        """As ``_running``, for the sessions that wait (``WAITING_STATUSES``): every entry of the due index, and an
        earlier release's waits still on the running index's ``W#`` shards, their meta items read as there."""
        pks = [item["pk"]["S"] for item in self._due_entries(NOT_DUE, None)]
        return self._indexed(running_keys(self._pending_shards, waiting=True), WAITING_STATUSES, limit, pks)

    def _due(self, before: int, limit: int, after: RunningSession | None) -> builtins.list[RunningSession]:
        """Each due-index shard's entries due by ``before`` past ``after``, merged: Queries of the index alone,
        which projects the row (a shard stops once it has ``limit`` and the next entry is due later). Then an
        earlier release's waits (the running index's ``W#`` shards: empty once the first sweep met each),
        due from their last commit. Entries the index still shows after the session moved on are the sweeper's
        to skip: it reads the session before acting."""
        start = (-1, "", "") if after is None else (after.due_at or 0, after.app_name, after.session_id)
        now = now_ms()
        found: dict[str, RunningSession] = {}
        for item in self._due_entries(before, after, limit):
            app_name, session_id = split_session_pk(item["pk"]["S"])
            expiry = item.get(TTL)
            if expiry is not None and int(expiry["N"]) * 1000 <= now:
                continue  # an expired session: gone, whenever TTL deletes it
            due = int(item["due"]["N"])
            row = RunningSession(
                app_name,
                session_id,
                int(item["lsk"]["N"]) if "lsk" in item else 0,
                item["status"]["S"] if "status" in item else "",
                due,
                int(item["version"]["N"]) if "version" in item else 0,
            )
            if row.status in WAITING_STATUSES and (due, app_name, session_id) > start:
                found[item["pk"]["S"]] = row
        for row in self._indexed(running_keys(self._pending_shards, waiting=True), WAITING_STATUSES, None, (), True):
            pk = session_pk(row.app_name, row.session_id)
            if pk not in found and row.updated_at <= before and (row.updated_at, *row[:2]) > start:
                found[pk] = row._replace(due_at=row.updated_at)
        return sorted(found.values(), key=lambda r: (r.due_at or 0, r.app_name, r.session_id))[:limit]

    def _due_entries(
        self, before: int, after: RunningSession | None, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The due index's entries due by ``before`` past ``after`` (the merge's order), shard by shard; with
        ``limit``, a shard stops once it has that many and the next is due later."""
        start = (-1, "", "") if after is None else (after.due_at or 0, after.app_name, after.session_id)
        for key in running_keys(self._pending_shards, waiting=True):
            values = {":k": {"S": key}, ":b": {"N": str(before)}}
            condition = "dpk = :k AND #du <= :b"
            if after is not None:
                condition = "dpk = :k AND #du BETWEEN :a AND :b"
                values[":a"] = {"N": str(after.due_at or 0)}
            pages = self._query_pages(
                TableName=self._table,
                IndexName=DUE_INDEX,
                KeyConditionExpression=condition,
                ExpressionAttributeNames={"#du": "due"},
                ExpressionAttributeValues=values,
                **({"Limit": limit + 1} if limit is not None else {}),
            )
            taken, last = 0, -1
            for item in pages:
                due = int(item["due"]["N"])
                if after is not None and (due, *split_session_pk(item["pk"]["S"])) <= start:
                    continue  # the cursor's tie, or before it: read on the page before
                if limit is not None and taken >= limit and due > last:
                    break  # this shard's page is full (ties on the last due time kept: the merge orders them)
                taken, last = taken + 1, due
                yield item

    def _set_due(
        self, app_name: str, session_id: str, version: int, due_at: int, writes: Sequence[ScopedWrite] = ()
    ) -> bool:
        """Move the wait's ``due`` (one conditional update of its meta item); an earlier release's wait leaves the
        running index for the due index here. With ``writes`` (park's wait record), one ``TransactWriteItems`` of
        that update and their items: the meta item's ``due`` is all it changes of the session (no version, no
        ``lsk``: its listing and status entries stay), so the due entry moves once and nothing else is indexed."""
        update = {
            "TableName": self._table,
            "Key": _key(session_pk(app_name, session_id), META_SK),
            "UpdateExpression": "SET #du = :du, dpk = :dpk REMOVE rpk",
            "ConditionExpression": f"{head_is(':v')} AND #st IN (:aw, :rs)",
            "ExpressionAttributeNames": {"#du": "due", "#v": "version", "#st": "status"},
            "ExpressionAttributeValues": {
                ":du": {"N": str(due_at)},
                ":dpk": {"S": running_key(app_name, session_id, self._pending_shards, waiting=True)},
                ":v": {"N": str(version)},
                ":aw": {"S": WAITING_STATUSES[0]},
                ":rs": {"S": WAITING_STATUSES[1]},
            },
        }
        if writes:
            try:
                self._transact([{"Update": update}, *(_transact_item(self._table, app_name, w) for w in writes)])
            except _Cancelled:
                return False
            return True
        try:
            self._call("update_item", **update)
        except _ConditionFailed:
            return False
        return True

    def _indexed(
        self,
        keys: Sequence[str],
        statuses: Sequence[str],
        limit: int | None,
        more: Sequence[str] = (),
        with_version: bool = False,
    ) -> builtins.list[RunningSession]:
        """The sessions the running index's ``keys`` name (and ``more`` partition keys), whose meta item, read
        strongly consistent, has one of ``statuses`` now; oldest first."""
        pks = [
            item["pk"]["S"]
            for key in keys
            for item in self._query_pages(
                TableName=self._table,
                IndexName=RUNNING_INDEX,
                KeyConditionExpression="rpk = :r",
                ExpressionAttributeValues={":r": {"S": key}},
            )
        ]
        pks += more
        now = now_ms()
        found = []
        for pk, meta in self._metas(pks, consistent=True).items():
            status = None if meta is None else meta.get("status", {}).get("S")
            if meta is None or MetaItem.from_item(meta).version == 0 or status not in statuses or _expired(meta, now):
                continue
            app_name, session_id = split_session_pk(pk)
            item = MetaItem.from_item(meta)
            version = item.version if with_version else None
            found.append(RunningSession(app_name, session_id, item.updated_at or 0, str(status), None, version))
        found.sort(key=lambda r: (r.updated_at, r.app_name, r.session_id))
        return found[:limit]

    def _metas(self, pks: Sequence[str], *, consistent: bool = False) -> dict[str, dict[str, Any] | None]:
        """The listed attributes of these sessions' meta items (``None``: no item), by ``BatchGetItem``."""
        found: dict[str, dict[str, Any] | None] = dict.fromkeys(pks)
        keys = [_key(pk, META_SK) for pk in found]
        projection = f"pk, version, created_at, lsk, {STEP_VERSION}, {STEP_UPDATED_AT}, #st, #x"
        names = {"#st": "status", "#x": TTL}
        for item in self._get_items(keys, projection, names=names, consistent=consistent, what="meta items"):
            found[item["pk"]["S"]] = item
        return found

    def _shard_stream(
        self, key: str, after: tuple[int, str] | None, limit: int | None, status: str | None = None
    ) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """One shard's entries as ``(updated_at, session id, entry)``, newest first; ties on ``updated_at`` by id,
        descending, like the merge. With ``status``, the shard's partition of the status index."""
        index, attribute = (LISTING_INDEX, "lpk") if status is None else (STATUS_INDEX, "spk")
        condition, values = f"{attribute} = :k", {":k": {"S": key if status is None else f"{status}#{key}"}}
        if after is not None:
            condition += " AND lsk <= :u"
            values[":u"] = {"N": str(after[0])}
        pages = self._query_pages(
            TableName=self._table,
            IndexName=index,
            KeyConditionExpression=condition,
            ExpressionAttributeValues=values,
            ScanIndexForward=False,
            **({"Limit": limit + 1} if limit is not None else {}),
        )
        group: builtins.list[tuple[int, str, dict[str, Any]]] = []
        for item in pages:
            entry = (int(item["lsk"]["N"]), split_session_pk(item["pk"]["S"])[1], item)
            if after is not None and entry[:2] >= after:
                continue
            if group and group[0][0] != entry[0]:
                yield from sorted(group, key=lambda e: e[:2], reverse=True)
                group = []
            group.append(entry)
        yield from sorted(group, key=lambda e: e[:2], reverse=True)
