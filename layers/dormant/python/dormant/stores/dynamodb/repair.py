"""Repair: a pending marker rolled forward when all its event items are present, else rolled back, both
conditional on its grant."""

from __future__ import annotations

import builtins
import contextlib
import logging
from dataclasses import dataclass
from typing import Literal

from ...clock import now_ms
from ...errors import StoreBusy, StoreError
from .calls import _ConditionFailed, _Exhausted
from .commit import _Commit
from .items import MetaItem, _key
from .keys import META_SK, IdFilter, event_prefix, session_pk, split_session_pk
from .plan import (
    _id_items,
    _itemised,
    _Marker,
    _MarkerGone,
    _plan,
)
from .table import PENDING_INDEX

log = logging.getLogger("dormant.stores.dynamodb")


@dataclass(frozen=True)
class RepairReport:
    """One pending marker repaired: what was found and which way it went."""

    app_name: str
    session_id: str
    version: int
    action: Literal["rolled_forward", "rolled_back"]
    items_found: int
    items_expected: int
    marker_age_s: float


class _Repair(_Commit):
    """Repair of pending markers: rolled forward when every event item is there, else rolled back."""

    def repair_pending(self, older_than_s: float = 60.0) -> builtins.list[RepairReport]:
        """Finish or undo every commit whose marker is older than ``older_than_s``; say what was done.

        Finds the markers through the pending-marker index (every shard of it), so it costs a Query per
        shard plus the repairs. Safe to run from several sweepers at once, and beside live writers.
        """
        self._check_open()
        cutoff = now_ms() - int(older_than_s * 1000)
        reports: builtins.list[RepairReport] = []
        for shard in range(self._pending_shards):
            markers = self._query(
                TableName=self._table,
                IndexName=PENDING_INDEX,
                KeyConditionExpression="ppk = :p AND psk <= :cutoff",
                ExpressionAttributeValues={":p": {"S": f"P#{shard}"}, ":cutoff": {"N": str(cutoff)}},
            )
            for found in markers:
                report = self._repair(found["pk"]["S"], cutoff)
                if report is not None:
                    reports.append(report)
        return reports

    def repair_session(self, app_name: str, session_id: str) -> RepairReport | None:
        """Finish or undo the commit pending on one session now, whatever its marker's age: for a caller that
        knows the writer is gone (a workflow's retried run, whose first attempt was killed mid-commit), so the
        session is not held for ``stale_after_s``. A live writer's commit undone this way fails, nothing half
        written (the finish is conditional on its grant)."""
        self._check_open()
        return self._repair(session_pk(app_name, session_id), now_ms())

    def _repair(self, pk: str, cutoff: int) -> RepairReport | None:
        """Roll the session's marker forward or back if it is at least as old as ``cutoff``."""
        meta = self._call("get_item", TableName=self._table, Key=_key(pk, META_SK), ConsistentRead=True).get("Item")
        marker = _Marker.of(meta) if meta else None
        if meta is None or marker is None or marker.at > cutoff:
            return None  # finished, repaired by someone else, or not stale (any more)
        items = self._query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": {"S": pk}, ":prefix": {"S": event_prefix(marker.version, marker.grant)}},
            ProjectionExpression="pk, sk, eid, hi",
            ConsistentRead=True,
        )
        plan = _plan(marker, meta)
        complete = len(items) == marker.items
        if marker.touch_in_finish:
            # Its touch rides in the finish: the event items alone prove the writer got there (they follow any
            # expiry refresh). A commit with none (a create, a status change) has nothing to show its writer
            # got past the gate: undone, as when its touch went in a batch of its own.
            complete = complete and marker.items > 0
        elif complete:
            # The writer put its touch last (after any expiry refresh and every event item): with it, all is there.
            touch = self._call(
                "get_item",
                TableName=self._table,
                Key=_key(pk, plan.touch),
                ProjectionExpression="t",
                ConsistentRead=True,
            ).get("Item")
            complete = touch is not None and touch.get("t", {}).get("S") == marker.grant
        app_name, session_id = split_session_pk(pk)
        try:
            if complete:
                firsts = [i for i in items if "eid" in i]
                event_ids = [i["eid"]["S"] for i in firsts]
                # The writer put its id items after its event items: put them again, as some may be missing. Its
                # ids in order have none (``_in_order``, from the same meta item); an earlier layout's writer
                # (event items without ``hi``) gave every id its item.
                greatest = IdFilter.of(meta).greatest
                itemised = _itemised(greatest, event_ids) if all("hi" in i for i in firsts) else event_ids
                try:
                    ids_of = _id_items(pk, marker, meta["inc"]["S"], itemised, plan.horizon)
                    self._write_batches([{"PutRequest": {"Item": item}} for item in ids_of])
                except _Exhausted as exc:
                    raise StoreBusy(f"repair of session {split_session_pk(pk)[1]!r}: {exc}; try again") from None
                ids = IdFilter.of(meta).add(event_ids)
                self._finish(pk, marker, meta["inc"]["S"], ids, plan, meta)
            else:
                self._roll_back(pk, marker, create=MetaItem.from_item(meta).version == 0)
        except _MarkerGone:
            return None  # another sweeper, or the writer itself, got there first
        if not complete:
            with contextlib.suppress(StoreError):  # invisible already; a later repair or delete finds the rest
                self._write_batches([{"DeleteRequest": {"Key": {"pk": i["pk"], "sk": i["sk"]}}} for i in items])
                if not marker.touch_in_finish:  # an earlier layout's writer put its touch in the batches
                    self._drop_touch(pk, plan, marker.grant, meta)
        report = RepairReport(
            app_name,
            session_id,
            marker.version,
            "rolled_forward" if complete else "rolled_back",
            len(items),
            marker.items,
            (now_ms() - marker.at) / 1000,
        )
        log.warning(
            "repaired a pending commit: %s version %d of session %r (app %r): %d of %d event items present",
            report.action.replace("_", " "),
            report.version,
            session_id,
            app_name,
            report.items_found,
            report.items_expected,
        )
        return report

    def _roll_back(self, pk: str, marker: _Marker, *, create: bool) -> None:
        """Undo a marker: its grant joins ``dead`` (a create that never landed removes the meta item)."""
        condition = {"ConditionExpression": "pending.t = :t", "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        try:
            if create:
                self._call(
                    "delete_item",
                    TableName=self._table,
                    Key=_key(pk, META_SK),
                    ExpressionAttributeValues={":t": {"S": marker.grant}},
                    **condition,
                )
            else:
                self._call(
                    "update_item",
                    TableName=self._table,
                    Key=_key(pk, META_SK),
                    UpdateExpression="REMOVE pending, ppk, psk ADD dead :dead",
                    ExpressionAttributeValues={
                        ":t": {"S": marker.grant},
                        ":dead": {"SS": [f"{marker.version}#{marker.grant}"]},
                    },
                    **condition,
                )
        except _ConditionFailed as failed:
            raise _MarkerGone(failed.item) from None
