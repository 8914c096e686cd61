"""The DynamoDB store under faults, on a real DynamoDB Local: a reader sees all of a commit or none of it.

Faults come from botocore event hooks on the writer's client (``dynamodb_faults.Faults``); the reader,
the sweeper and the second writer use clean clients. After every fault the session is repaired (or
repairs itself) and takes the next commit.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")

from dormant.clock import FrozenClock, frozen_clock
from dormant.errors import CommitIncomplete, StoreBusy, StoreError, StoreThrottled, StoreUnavailable, http_status
from dormant.events import UserEvent
from dormant.stores.base import ScopedStateChange, StoredSession
from dormant.stores.dynamodb import DynamoDBSessionStore
from dormant.stores.dynamodb.keys import session_pk
from tests.support.dynamodb_faults import Died, Faults
from tests.support.servers.dynamodb import client as local_client

pytestmark = pytest.mark.backend("dynamodb")


def _events(prefix: str, count: int) -> list[UserEvent]:
    return [UserEvent(id=f"{prefix}-{n:03d}", created_at=1, text=f"{prefix} {n}") for n in range(count)]


def _ids(store: DynamoDBSessionStore, app: str, sid: str) -> list[str]:
    loaded = store.load(app, sid)
    return [] if loaded is None else [e.id for e in loaded.events]


class World:
    """One session, a writer whose client takes faults, and clean clients for everyone else."""

    def __init__(self, endpoint: str, table: str, clock: FrozenClock) -> None:
        self.endpoint, self.table = endpoint, table
        self.clock = clock  # markers go stale when the test moves it, without waiting
        self.app = f"app-{uuid.uuid4().hex[:10]}"
        self.sid = "s-1"
        self.clients: list[Any] = []
        self.writer_client = self._client()
        self.faults = Faults(self.writer_client)
        self.writer = self.store(self.writer_client)
        self.reader = self.store()

    def _client(self, **config: Any) -> Any:
        c = local_client(self.endpoint, **config)
        self.clients.append(c)
        return c

    def store(self, client: Any = None, **options: Any) -> DynamoDBSessionStore:
        # The gated protocol unless a test asks for one-call commits (``single_call_items=100``): its faults
        # are what most tests here inject.
        options = {"live_wait_s": 0.5, "unprocessed_retries": 3, "single_call_items": 0, **options}
        return DynamoDBSessionStore(client or self._client(), self.table, **options)

    def row(self, **extra: Any) -> StoredSession:
        return StoredSession(id=self.sid, app_name=self.app, created_at=1, **extra)

    def ids(self) -> list[str]:
        return _ids(self.reader, self.app, self.sid)

    def version(self) -> int:
        loaded = self.reader.load(self.app, self.sid)
        return 0 if loaded is None else loaded.row.version

    def raw_event_items(self) -> int:
        """Event items in the session partition, visible or not (what a repair must clean up)."""
        answer = self.writer_client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :e)",
            ExpressionAttributeValues={":pk": {"S": session_pk(self.app, self.sid)}, ":e": {"S": "E#"}},
            ConsistentRead=True,
            Select="COUNT",
        )
        return int(answer["Count"])

    def close(self) -> None:
        for c in self.clients:
            c.close()


@pytest.fixture
def world(dynamodb_endpoint: str, dynamodb_table: str) -> Iterator[World]:
    with frozen_clock(1_800_000_000_000) as clock:
        w = World(dynamodb_endpoint, dynamodb_table, clock)
        try:
            yield w
        finally:
            w.close()


def _seeded(world: World) -> None:
    """Version 1 with ten events: what every fault must leave untouched."""
    assert world.writer.commit(world.row(), _events("base", 10), 0).ok


def _untouched_and_unmarked(world: World) -> None:
    """A failed commit left the seeded session as it was and no marker behind: the next commit takes it on."""
    assert world.ids() == _events_ids("base", 10)
    world.clock.advance(1)
    assert world.store().repair_pending(older_than_s=0) == []  # no marker was left
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def _dies_at(world: World, call: str, nth: int, *commit: Any) -> None:
    """The writer's ``commit(*commit)`` dies at its ``nth`` ``call`` to DynamoDB, the calls before it written."""
    world.faults.die(call, nth=nth)
    with pytest.raises(Died):
        world.writer.commit(*commit)


def _takes_the_next_commit(world: World, version: int, before: list[str]) -> None:
    fresh = world.store()
    result = fresh.commit(world.row(), _events("next", 3), version)
    assert (result.ok, result.version, result.appended) == (True, version + 1, 3)
    assert world.ids() == [*before, "next-000", "next-001", "next-002"]


# -- the events' BatchWriteItem ------------------------------------------------------------------


def test_the_nth_batch_write_raising_leaves_nothing_visible_and_repair_rolls_it_back(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    _seeded(world)
    world.faults.fail("BatchWriteItem", nth=2)  # 60 events: three calls; the second one fails
    with pytest.raises(CommitIncomplete) as info:
        world.writer.commit(world.row(), _events("big", 60), 1)
    assert info.value.version == 2
    assert world.ids() == _events_ids("base", 10) and world.version() == 1
    assert world.raw_event_items() == 10 + 25  # the first call's items landed, invisible

    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.version, report.items_found, report.items_expected) == ("rolled_back", 2, 25, 60)
    logged = [r for r in caplog.records if r.name == "dormant.stores.dynamodb"]
    assert [r.levelname for r in logged] == ["WARNING"]
    assert "rolled back version 2 of session 's-1'" in logged[0].getMessage()
    assert "25 of 60 event items present" in logged[0].getMessage()
    assert world.raw_event_items() == 10
    assert world.store().repair_pending(older_than_s=0) == []
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def _events_ids(prefix: str, count: int) -> list[str]:
    return [e.id for e in _events(prefix, count)]


def test_unprocessed_items_are_resent_until_they_land(world: World) -> None:
    _seeded(world)
    before = world.faults.calls["BatchWriteItem"]
    world.faults.unprocessed(nth=1, times=3, keep=0.4)
    result = world.writer.commit(world.row(), _events("big", 60), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 60)
    assert world.faults.calls["BatchWriteItem"] - before > 3  # the re-sends
    assert world.ids() == _events_ids("base", 10) + _events_ids("big", 60)


def test_unprocessed_items_past_the_retries_fail_typed_and_leave_the_marker_for_repair(world: World) -> None:
    _seeded(world)
    before = world.faults.calls["BatchWriteItem"]
    world.faults.unprocessed(nth=1, times=100, keep=0)
    with pytest.raises(CommitIncomplete, match="did not write all its events"):
        world.writer.commit(world.row(), _events("big", 5), 1)
    assert world.faults.calls["BatchWriteItem"] - before == 4  # the call and its three re-sends: bounded
    assert world.ids() == _events_ids("base", 10)
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found) == ("rolled_back", 0)
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


# -- throttling --------------------------------------------------------------------------------------


def test_throttled_calls_are_retried_by_botocore(world: World) -> None:
    _seeded(world)
    before = world.faults.sent["UpdateItem"]
    world.faults.throttle("UpdateItem", 2)
    world.faults.throttle("BatchWriteItem", 2)
    result = world.writer.commit(world.row(), _events("t", 5), 1)
    assert result.ok and result.version == 2
    assert world.faults.sent["UpdateItem"] - before == 4  # the gate after two throttled attempts, the finish
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)


def test_a_gate_throttled_past_the_retries_is_store_busy_and_writes_nothing(world: World) -> None:
    _seeded(world)
    store = world.store(world._client(retries={"mode": "standard", "max_attempts": 2}))
    faults = Faults(store._client)
    faults.throttle("UpdateItem", 5)
    with pytest.raises(StoreThrottled, match="throttled") as info:  # a StoreBusy, answered 429 over HTTP
        store.commit(world.row(), _events("t", 5), 1)
    assert isinstance(info.value, StoreBusy) and http_status(info.value) == 429
    _untouched_and_unmarked(world)


def test_events_throttled_past_the_retries_fail_typed(world: World) -> None:
    _seeded(world)
    store = world.store(world._client(retries={"mode": "standard", "max_attempts": 2}))
    Faults(store._client).throttle("BatchWriteItem", 5)
    with pytest.raises(CommitIncomplete) as info:
        store.commit(world.row(), _events("t", 5), 1)
    assert isinstance(info.value.__cause__, StoreBusy)
    assert world.ids() == _events_ids("base", 10)
    world.clock.advance(1)
    assert [r.action for r in world.store().repair_pending(older_than_s=0)] == ["rolled_back"]
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


# -- the writer dies --------------------------------------------------------------------------------


def test_writer_dies_right_after_the_gate_and_the_next_writer_repairs_the_stale_marker(world: World) -> None:
    _seeded(world)
    _dies_at(world, "BatchWriteItem", 1, world.row(), _events("lost", 5), 1)
    assert world.ids() == _events_ids("base", 10) and world.version() == 1

    # A second writer while the marker is live: it waits a moment, then gives up, writing nothing.
    with pytest.raises(StoreBusy, match="in flight"):
        world.store().commit(world.row(), _events("early", 1), 1)
    assert world.ids() == _events_ids("base", 10)

    world.clock.advance(31_000)  # past stale_after_s: the next writer repairs first, then commits
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def test_writer_dies_after_the_events_before_the_marker_is_cleared(world: World) -> None:
    _seeded(world)
    # the finish: the meta item's update (the gate was the first), which moves its listing entry
    _dies_at(world, "UpdateItem", 2, world.row(status="done"), _events("whole", 30), 1)
    assert world.raw_event_items() == 40  # every event item is there...
    assert world.ids() == _events_ids("base", 10) and world.version() == 1  # ...and none is visible
    assert [s.version for s in world.reader.list(world.app)] == [1]

    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found, report.items_expected) == ("rolled_forward", 30, 30)
    assert world.ids() == _events_ids("base", 10) + _events_ids("whole", 30)
    (listing,) = world.reader.list(world.app)
    assert (listing.version, listing.status) == (2, "done")
    # The rolled-forward commit's ids are known to the id filter: re-sending them adds nothing.
    again = world.store().commit(world.row(), _events("whole", 30), 2)
    assert (again.ok, again.appended) == (True, 0)
    _takes_the_next_commit(world, 3, _events_ids("base", 10) + _events_ids("whole", 30))


def test_a_rolled_forward_commit_lands_its_scoped_changes(world: World) -> None:
    _seeded(world)
    changes = [ScopedStateChange("user", "u-1", "name", "Ada"), ScopedStateChange("user", "u-1", "n", 2)]
    # with scoped changes, the finish is a transaction
    _dies_at(world, "TransactWriteItems", 1, world.row(), _events("s", 3), 1, changes)
    assert world.reader.load_scoped_state(world.app, "user", "u-1") == {}  # not before the commit lands
    world.clock.advance(31_000)
    # The next writer meets the stale marker, rolls it forward, and so conflicts: version 2 is taken.
    late = world.store().commit(world.row(), _events("late", 1), 1)
    assert (late.ok, late.version) == (False, 2)
    assert world.reader.load_scoped_state(world.app, "user", "u-1") == {"name": "Ada", "n": 2}
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("s", 3))


# -- a commit's finish moves the session's listing entry (its meta item), events or none -----------------


def _entries(world: World) -> dict[int, str | None]:
    """The session's listing entries (items with ``lpk``): its meta item, ``updated_at`` -> the grant of its last
    commit, and any touch an earlier layout left (not marked expired) -> the grant that wrote it."""
    answer = world.writer_client.query(
        TableName=world.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": session_pk(world.app, world.sid)}},
        ProjectionExpression="sk, lpk, lsk, t, g, expires_at",
        ConsistentRead=True,
    )
    entries = [e for e in answer["Items"] if "lpk" in e and (e["sk"]["S"] == "#M" or "expires_at" not in e)]
    return {int(e["lsk"]["N"]): (e.get("t") or e.get("g", {})).get("S") for e in entries}


def _listed(world: World) -> list[tuple[str, int, str | None, int]]:
    return [(s.id, s.version, s.status, s.updated_at) for s in world.reader.list(world.app)]


@pytest.mark.parametrize("count", [24, 50])
def test_writer_dies_before_a_finish_carrying_the_touch_and_repair_rolls_it_forward(world: World, count: int) -> None:
    _seeded(world)
    at = world.clock.advance(1000)
    # the events filled their batches; the finish (the gate was the first update) would move the entry
    _dies_at(world, "UpdateItem", 2, world.row(status="done"), _events("full", count), 1)
    assert world.raw_event_items() == 10 + count  # every event item is there...
    assert world.ids() == _events_ids("base", 10) and at not in _entries(world)  # ...none visible, not moved
    assert [row[:3] for row in _listed(world)] == [("s-1", 1, None)]

    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found, report.items_expected) == ("rolled_forward", count, count)
    assert world.ids() == _events_ids("base", 10) + _events_ids("full", count)
    assert _listed(world) == [("s-1", 2, "done", at)]  # listed once, at the commit's own time
    assert _entries(world)[at] is not None  # the roll-forward moved the entry with the finish
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("full", count))
    assert len(_listed(world)) == 1


@pytest.mark.parametrize("scopes", [{}, {"user": "u-1"}])
def test_a_create_with_no_events_dying_after_its_gate_is_rolled_back(world: World, scopes: dict[str, str]) -> None:
    # The gate is an UpdateItem, or with bound scopes a transaction with the binding entries; the finish, the
    # meta item's update.
    _dies_at(world, "UpdateItem", 1 if scopes else 2, world.row(scopes=scopes), [], 0)
    assert world.reader.load(world.app, world.sid) is None and _listed(world) == []
    # While its marker stands the create is in flight: an erasure of its scope finds it.
    assert world.reader.bound_sessions(world.app, "user", "u-1") == (["s-1"] if scopes else [])

    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found, report.items_expected) == ("rolled_back", 0, 0)
    assert world.reader.load(world.app, world.sid) is None and _listed(world) == [] and _entries(world) == {}
    assert world.reader.bound_sessions(world.app, "user", "u-1") == []
    assert world.store().repair_pending(older_than_s=0) == []
    created = world.store().commit(world.row(scopes=scopes), [], 0)
    assert (created.ok, created.version) == (True, 1)
    assert [row[:2] for row in _listed(world)] == [("s-1", 1)]


def test_a_bound_create_dying_in_its_gate_writes_nothing_and_a_refused_one_no_binding(world: World) -> None:
    _dies_at(world, "TransactWriteItems", 1, world.row(scopes={"user": "u-1"}), [], 0)
    raw = world.writer_client.query(
        TableName=world.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"B#{world.app}#user#u-1"}},
        ConsistentRead=True,
    )
    assert raw["Items"] == [] and world.reader.load(world.app, world.sid) is None
    assert world.store().commit(world.row(scopes={"user": "u-1"}), [], 0).ok
    refused = world.store().commit(world.row(scopes={"user": "u-2"}), [], 0)  # the id is taken
    assert (refused.ok, refused.version) == (False, 1)
    assert world.reader.bound_sessions(world.app, "user", "u-1") == ["s-1"]
    raw = world.writer_client.query(
        TableName=world.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"B#{world.app}#user#u-2"}},
        ConsistentRead=True,
    )
    assert raw["Items"] == []  # the refused create's binding entry went with its gate


def test_a_sweeper_rolling_back_a_slow_writer_with_no_events_keeps_its_touch_out(world: World) -> None:
    _seeded(world)
    at = world.clock.advance(1000)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("UpdateItem", 2, arrived, resume)  # a status change: its gate, then its finish
    results: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: results.update(r=world.writer.commit(world.row(status="x"), [], 1)))
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert report.action == "rolled_back"
    resume.set()  # its finish (moving the entry) is refused: the marker is gone
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert (results["r"].ok, results["r"].version) == (False, 1)
    assert [row[:3] for row in _listed(world)] == [("s-1", 1, None)] and at not in _entries(world)
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def test_a_sweeper_rolling_back_a_slow_writer_mid_events_on_the_finish_touch_path(world: World) -> None:
    _seeded(world)
    slow_at = world.clock.advance(1000)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)  # 49 events: 25 written, 24 to go, touch in the finish
    results: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: results.update(r=world.writer.commit(world.row(), _events("slow", 49), 1)))
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found, report.items_expected) == ("rolled_back", 25, 49)
    assert world.store().commit(world.row(), _events("other", 2), 1).ok  # version 2, another grant
    resume.set()
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert (results["r"].ok, results["r"].version) == (False, 2)
    assert world.ids() == _events_ids("base", 10) + _events_ids("other", 2)
    assert [row[:2] for row in _listed(world)] == [("s-1", 2)] and slow_at not in _entries(world)
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("other", 2))


# -- another request's transaction (TransactionConflict): re-sent, never a 500 ---------------------------

_CONFLICT = "TransactionConflictException"
_CANCELLED = "TransactionCanceledException"


def test_a_gate_meeting_a_transaction_is_resent_and_the_commit_lands_once(world: World) -> None:
    _seeded(world)
    before = world.faults.sent["UpdateItem"]
    world.faults.error("UpdateItem", _CONFLICT, attempts=3)
    result = world.writer.commit(world.row(), _events("t", 5), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert world.faults.sent["UpdateItem"] - before == 3 + 1 + 1  # three refused gates, the gate, the finish
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("t", 5))


def test_a_finish_meeting_a_transaction_is_resent_and_the_commit_lands_once(world: World) -> None:
    _seeded(world)
    world.faults.error("UpdateItem", _CONFLICT, attempts=2, nth=2)  # the second UpdateItem: the finish
    result = world.writer.commit(world.row(), _events("t", 5), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    assert world.store().repair_pending(older_than_s=0) == []  # no marker left behind


def test_a_finish_transaction_cancelled_for_a_conflict_is_resent_and_lands_its_scoped_changes(world: World) -> None:
    _seeded(world)
    world.faults.error("TransactWriteItems", _CANCELLED, attempts=2, reasons=["None", "TransactionConflict", "None"])
    changes = [ScopedStateChange("user", "u-1", "name", "Ada")]
    result = world.writer.commit(world.row(), _events("s", 3), 1, changes)
    assert (result.ok, result.version, result.appended) == (True, 2, 3)
    assert world.reader.load_scoped_state(world.app, "user", "u-1") == {"name": "Ada"}
    assert world.ids() == _events_ids("base", 10) + _events_ids("s", 3)


def test_a_bound_create_gate_cancelled_for_a_conflict_is_resent_and_binds_once(world: World) -> None:
    world.faults.error("TransactWriteItems", _CANCELLED, attempts=2, reasons=["TransactionConflict", "None"])
    result = world.writer.commit(world.row(scopes={"user": "u-1"}), _events("c", 2), 0)
    assert (result.ok, result.version, result.appended) == (True, 1, 2)
    assert world.ids() == _events_ids("c", 2)
    assert world.reader.bound_sessions(world.app, "user", "u-1") == ["s-1"]


def test_a_gate_meeting_transactions_past_the_retries_is_store_busy_and_writes_nothing(world: World) -> None:
    _seeded(world)
    store = world.store(world.writer_client, conflict_retries=2)
    before = world.faults.sent["UpdateItem"]
    world.faults.error("UpdateItem", _CONFLICT, attempts=10)
    with pytest.raises(StoreBusy, match="another request's transaction"):
        store.commit(world.row(), _events("t", 5), 1)
    assert world.faults.sent["UpdateItem"] - before == 3  # the call and two re-sends: bounded
    world.faults._errors.clear()  # the seven conflicts left unused
    _untouched_and_unmarked(world)


def test_a_rollback_meeting_a_transaction_is_resent(world: World) -> None:
    _seeded(world)
    _dies_at(world, "BatchWriteItem", 1, world.row(), _events("d", 5), 1)
    world.clock.advance(1)
    sweeper_client = world._client()
    sweeper_faults = Faults(sweeper_client)
    sweeper_faults.error("UpdateItem", _CONFLICT, attempts=2)  # the roll-back's UpdateItem
    (report,) = world.store(sweeper_client).repair_pending(older_than_s=0)
    assert report.action == "rolled_back"
    assert sweeper_faults.sent["UpdateItem"] == 3
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


# -- a gate whose answer was lost: it finds its own marker and goes on ----------------------------------


def test_a_gate_whose_answer_was_lost_finds_its_own_marker_and_commits(world: World) -> None:
    _seeded(world)
    before = world.faults.sent["UpdateItem"]
    world.faults.lose("UpdateItem")  # DynamoDB applies the gate; botocore times out and sends it again
    result = world.writer.commit(world.row(), _events("t", 5), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert world.faults.sent["UpdateItem"] - before == 3  # the lost gate, its re-send, the finish
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    assert world.store().repair_pending(older_than_s=0) == []
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("t", 5))


def test_a_lost_gate_resent_by_the_store_after_a_conflict_finds_its_own_marker(world: World) -> None:
    _seeded(world)
    # The gate applies, its answer is lost; botocore's re-send meets a transaction (which botocore does not
    # retry); the store's own re-send then finds the marker the first attempt left.
    world.faults.lose("UpdateItem")
    world.faults.error("UpdateItem", _CONFLICT)
    changes = [ScopedStateChange("user", "u-1", "name", "Ada")]
    result = world.writer.commit(world.row(), _events("t", 5), 1, changes)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    assert world.reader.load_scoped_state(world.app, "user", "u-1") == {"name": "Ada"}


@pytest.mark.parametrize("scopes", [{}, {"user": "u-1"}])
def test_a_create_whose_gate_answer_was_lost_finds_its_own_marker(world: World, scopes: dict[str, str]) -> None:
    # Unbound, the gate is an UpdateItem; bound, a transaction with the binding entries, which botocore
    # re-sends with the same idempotency token (harmless): here that re-send meets another transaction, and
    # the store's own re-send (a new token) finds the marker.
    if scopes:
        world.faults.lose("TransactWriteItems")
        world.faults.error("TransactWriteItems", _CANCELLED, reasons=["TransactionConflict", "None"])
    else:
        world.faults.lose("UpdateItem")
    result = world.writer.commit(world.row(scopes=scopes), _events("c", 3), 0)
    assert (result.ok, result.version, result.appended) == (True, 1, 3)
    assert world.ids() == _events_ids("c", 3)
    assert world.reader.bound_sessions(world.app, "user", "u-1") == (["s-1"] if scopes else [])
    after = world.store().commit(world.row(scopes=scopes), _events("next", 1), 1)
    assert (after.ok, after.version) == (True, 2)


@pytest.mark.parametrize("changes", [[], [ScopedStateChange("user", "u-1", "name", "Ada")]])
def test_a_finish_whose_answer_was_lost_is_a_commit_that_landed_once(
    world: World, changes: list[ScopedStateChange]
) -> None:
    _seeded(world)
    # DynamoDB applies the finish and its answer is lost; botocore sends it again and finds the marker gone.
    # The finish is the meta item's update (the gate was the first), or with scoped changes a TransactWriteItems
    # (its re-send carries the same idempotency token).
    world.faults.lose("TransactWriteItems" if changes else "UpdateItem", nth=1 if changes else 2)
    before = world.faults.sent["UpdateItem"]
    result = world.writer.commit(world.row(), _events("t", 5), 1, changes)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    assert world.reader.load_scoped_state(world.app, "user", "u-1") == ({"name": "Ada"} if changes else {})
    assert world.faults.sent["UpdateItem"] - before == (1 if changes else 3)  # the gate (the finish, its re-send)
    assert world.store().repair_pending(older_than_s=0) == []


def test_a_gate_left_unanswered_past_the_retries_takes_its_marker_back(world: World) -> None:
    _seeded(world)
    store = world.store(world._client(retries={"mode": "standard", "total_max_attempts": 1}))
    faults = Faults(store._client)
    faults.lose("UpdateItem")  # applied, and no retry left: the caller sees the timeout
    with pytest.raises(StoreUnavailable):
        store.commit(world.row(), _events("t", 5), 1)
    assert world.ids() == _events_ids("base", 10)
    # The session is free at once: the caller's retry does not wait out a marker nobody will finish.
    retried = world.store(live_wait_s=0).commit(world.row(), _events("t", 5), 1)
    assert (retried.ok, retried.version, retried.appended) == (True, 2, 5)
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)


def test_a_gate_resent_after_a_repair_undid_it_writes_nothing(world: World) -> None:
    _seeded(world)

    def swept() -> None:  # the answer stays lost so long that a sweeper rolls the marker back
        world.clock.advance(61_000)
        reports = world.store().repair_pending(older_than_s=60)
        assert [r.action for r in reports if r.app_name == world.app] == ["rolled_back"]

    world.faults.lose("UpdateItem", then=swept)
    with pytest.raises(StoreBusy, match="unanswered"):
        world.writer.commit(world.row(), _events("t", 5), 1)
    assert world.version() == 1 and world.ids() == _events_ids("base", 10)
    assert world.raw_event_items() == 10
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


# -- a second writer, a sweeper, and a slow writer ------------------------------------------------------


def test_a_second_writer_waits_out_a_live_marker_and_then_conflicts(world: World) -> None:
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 1, arrived, resume)
    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.update(a=world.writer.commit(world.row(), _events("a", 5), 1)))
    first.start()
    assert arrived.wait(timeout=30)
    second = world.store(live_wait_s=20)
    releaser = threading.Timer(0.3, resume.set)  # the slow writer finishes while the second one waits
    releaser.start()
    results["b"] = second.commit(world.row(), _events("b", 5), 1)
    first.join(timeout=30)
    releaser.join(timeout=30)
    assert not first.is_alive()
    assert (results["a"].ok, results["a"].version) == (True, 2)
    assert (results["b"].ok, results["b"].version, results["b"].appended) == (False, 2, 0)
    assert world.ids() == _events_ids("base", 10) + _events_ids("a", 5)


def test_a_sweeper_rolling_back_a_slow_writer_keeps_its_late_writes_invisible(world: World) -> None:
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)  # after 25 of 60 items
    results: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: results.update(r=world.writer.commit(world.row(), _events("slow", 60), 1)))
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert (report.action, report.items_found) == ("rolled_back", 25)
    # Another writer takes version 2 before the slow one wakes up and writes the rest of its items.
    assert world.store().commit(world.row(), _events("other", 2), 1).ok
    resume.set()
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert (results["r"].ok, results["r"].version) == (False, 2)
    assert world.ids() == _events_ids("base", 10) + _events_ids("other", 2)
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("other", 2))


def test_a_rolled_back_writer_dying_after_its_late_writes_leaves_them_invisible(world: World) -> None:
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)  # after 25 of 60 items
    world.faults.die("UpdateItem", 2)  # and it dies at its finish, so it never cleans up after itself
    died: list[BaseException] = []

    def slow() -> None:
        try:
            world.writer.commit(world.row(), _events("slow", 60), 1)
        except Died as exc:
            died.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    assert [r.action for r in world.store().repair_pending(older_than_s=0)] == ["rolled_back"]
    assert world.store().commit(world.row(), _events("other", 2), 1).ok  # version 2, another grant
    resume.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and died
    assert world.raw_event_items() == 10 + 2 + 35  # the dead grant's late items are there...
    assert world.ids() == _events_ids("base", 10) + _events_ids("other", 2)  # ...and never shown
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("other", 2))


def test_a_rolled_back_commit_never_lands_its_scoped_changes(world: World) -> None:
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)
    results: dict[str, Any] = {}
    changes = [ScopedStateChange("user", "u-9", "plan", "pro")]
    slow = threading.Thread(
        target=lambda: results.update(r=world.writer.commit(world.row(), _events("slow", 60), 1, changes))
    )
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    assert [r.action for r in world.store().repair_pending(older_than_s=0)] == ["rolled_back"]
    resume.set()  # it writes the rest of its events, then its finish finds the marker gone
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert (results["r"].ok, results["r"].version) == (False, 1)
    assert world.reader.load_scoped_state(world.app, "user", "u-9") == {}
    assert world.ids() == _events_ids("base", 10)


@pytest.mark.parametrize(
    ("finish", "nth", "count"),
    [("UpdateItem", 2, 7), ("UpdateItem", 2, 24)],  # the finish: the gate was the first update
    ids=["a-batch-with-room", "a-full-batch"],
)
def test_a_sweeper_rolling_forward_a_slow_writer_lets_the_writer_succeed(
    world: World, finish: str, nth: int, count: int
) -> None:
    _seeded(world)
    at = world.clock.advance(1000)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause(finish, nth, arrived, resume)  # events written, the finish not yet sent
    results: dict[str, Any] = {}
    slow = threading.Thread(
        target=lambda: results.update(r=world.writer.commit(world.row(), _events("slow", count), 1))
    )
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert report.action == "rolled_forward"
    resume.set()  # its finish finds the marker gone, and the commit landed: it succeeded
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert (results["r"].ok, results["r"].version, results["r"].appended) == (True, 2, count)
    assert world.ids() == _events_ids("base", 10) + _events_ids("slow", count)
    assert [row[:2] for row in _listed(world)] == [("s-1", 2)] and at in _entries(world)


def test_two_sweepers_racing_repair_a_marker_once(world: World) -> None:
    _seeded(world)
    _dies_at(world, "UpdateItem", 2, world.row(), _events("x", 4), 1)  # the finish
    world.clock.advance(1)
    sweepers = [world.store() for _ in range(4)]
    barrier = threading.Barrier(len(sweepers), timeout=30)
    reports: list[Any] = []

    def sweep(store: DynamoDBSessionStore) -> None:
        barrier.wait()
        reports.extend(store.repair_pending(older_than_s=0))

    threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert [r.action for r in reports] == ["rolled_forward"]
    assert world.ids() == _events_ids("base", 10) + _events_ids("x", 4)
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("x", 4))


def test_a_young_marker_is_left_alone_by_the_sweeper(world: World) -> None:
    _seeded(world)
    _dies_at(world, "BatchWriteItem", 1, world.row(), _events("x", 4), 1)
    world.clock.advance(5_000)
    assert world.store().repair_pending(older_than_s=60) == []
    world.clock.advance(60_000)
    assert [r.action for r in world.store().repair_pending(older_than_s=60)] == ["rolled_back"]


# -- several processes ---------------------------------------------------------------------------------


def _racer(endpoint: str, table: str, app: str, writer: int, commits: int, out: Any) -> None:
    from dormant.events import UserEvent
    from dormant.stores.base import StoredSession
    from dormant.stores.dynamodb import dynamo_store
    from tests.support.servers.dynamodb import client

    c = client(endpoint)
    store = dynamo_store(table, client=c)
    row = StoredSession(id="race", app_name=app, created_at=1)
    versions = []
    for n in range(commits):
        events = [UserEvent(id=f"w{writer}-{n}-{k}", created_at=1, text="x") for k in range(3)]
        for _attempt in range(2000):
            loaded = store.load(app, "race")
            assert loaded is not None
            result = store.commit(row, events, loaded.row.version)
            if result.ok:
                versions.append(result.version)
                break
        else:
            raise AssertionError("never committed")
    out.put((writer, versions))
    c.close()


@pytest.mark.slow
def test_writers_racing_from_several_processes_get_contiguous_versions(
    dynamodb_endpoint: str, dynamodb_table: str
) -> None:
    app = f"app-{uuid.uuid4().hex[:10]}"
    c = local_client(dynamodb_endpoint)
    store = DynamoDBSessionStore(c, dynamodb_table)
    assert store.commit(StoredSession(id="race", app_name=app, created_at=1), [], 0).ok
    writers, commits = 4, 8
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(dynamodb_endpoint, dynamodb_table, app, w, commits, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    versions = sorted(v for vs in results.values() for v in vs)
    assert versions == list(range(2, 2 + writers * commits))
    loaded = store.load(app, "race")
    assert loaded is not None and loaded.row.version == 1 + writers * commits
    ids = [e.id for e in loaded.events]
    assert len(ids) == len(set(ids)) == writers * commits * 3
    for w in range(writers):
        assert [i for i in ids if i.startswith(f"w{w}-")] == [f"w{w}-{n}-{k}" for n in range(commits) for k in range(3)]
    c.close()


# -- one-call commits: one TransactWriteItems, no marker ----------------------------------------------


def _pending_markers(world: World) -> int:
    key = {"pk": {"S": session_pk(world.app, world.sid)}, "sk": {"S": "#M"}}
    item = world.writer_client.get_item(TableName=world.table, Key=key, ConsistentRead=True).get("Item", {})
    return int("pending" in item)


def test_a_commit_that_fits_one_transaction_is_one_call(world: World) -> None:
    one = world.store(world.writer_client, single_call_items=100)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    world.faults.calls.clear()
    assert one.commit(world.row(status="idle"), _events("turn", 5), 1).ok
    assert dict(world.faults.calls) == {"TransactWriteItems": 1}
    # A store that never saw the session takes the gated protocol once, then knows it: one call again.
    other_client = world._client()
    other, faults = world.store(other_client, single_call_items=100), Faults(other_client)
    other.load("warm-up", "nothing")  # its first call reads the table's shard counts
    faults.calls.clear()
    assert other.commit(world.row(), _events("o", 2), 2).ok
    assert dict(faults.calls) == {"UpdateItem": 2, "BatchWriteItem": 1}
    faults.calls.clear()
    assert other.commit(world.row(), _events("p", 2), 3).ok
    assert dict(faults.calls) == {"TransactWriteItems": 1}
    # ...and one that loaded it builds on what it read.
    third_client = world._client()
    third, faults = world.store(third_client, single_call_items=100), Faults(third_client)
    third.load("warm-up", "nothing")
    third.load(world.app, world.sid)
    faults.calls.clear()
    assert third.commit(world.row(), _events("q", 2), 4).ok
    assert dict(faults.calls) == {"TransactWriteItems": 1}
    # The first store's knowledge is stale now: its transaction is refused (nothing written) and it conflicts.
    result = one.commit(world.row(), _events("late", 2), 2)
    assert (result.ok, result.version) == (False, 5)
    later = ["o-000", "o-001", "p-000", "p-001", "q-000", "q-001"]
    assert world.ids() == [*_events_ids("base", 10), *_events_ids("turn", 5), *later]


def test_a_one_call_commit_that_raises_leaves_nothing_and_needs_no_repair(world: World) -> None:
    one = world.store(world.writer_client, single_call_items=100)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    world.faults.error("TransactWriteItems", "InternalServerError", attempts=10)  # every retry refused
    with pytest.raises(StoreError):
        one.commit(world.row(), _events("x", 5), 1)
    assert world.ids() == _events_ids("base", 10) and world.raw_event_items() == 10
    assert _pending_markers(world) == 0
    assert world.store().repair_pending(older_than_s=0) == []
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def test_a_one_call_commit_cancelled_for_throttling_is_resent_and_lands_once(world: World) -> None:
    """A transaction cancelled ``ThrottlingError`` (an index's back-pressure) was not applied and botocore does not
    retry it: the store re-sends it with a throttle's backoff, as its client retries a throttled call."""
    one = world.store(world.writer_client, single_call_items=100)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    world.faults.calls.clear()
    world.faults.error("TransactWriteItems", _CANCELLED, attempts=3, reasons=["None", "ThrottlingError"])
    result = one.commit(world.row(), _events("t", 5), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)
    assert dict(world.faults.calls) == {"TransactWriteItems": 4}  # three cancelled, the fourth landed
    assert world.ids() == _events_ids("base", 10) + _events_ids("t", 5)
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("t", 5))


def test_a_one_call_commit_throttled_past_the_clients_retries_is_store_throttled_and_writes_nothing(
    world: World,
) -> None:
    """Re-sent as often as the client retries (here 2), then ``StoreThrottled`` (a 429 over HTTP), nothing written."""
    client = world._client(retries={"mode": "standard", "max_attempts": 2})
    one, faults = world.store(client, single_call_items=100), Faults(client)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    faults.calls.clear()
    faults.error("TransactWriteItems", _CANCELLED, attempts=10, reasons=["None", "ThrottlingError"])
    with pytest.raises(StoreThrottled, match="3 times") as info:
        one.commit(world.row(), _events("x", 5), 1)
    assert http_status(info.value) == 429
    assert dict(faults.calls) == {"TransactWriteItems": 3}
    assert world.ids() == _events_ids("base", 10) and _pending_markers(world) == 0


def test_a_one_call_commit_whose_answer_was_lost_lands_once(world: World) -> None:
    one = world.store(world.writer_client, single_call_items=100)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    world.faults.lose("TransactWriteItems", attempts=50)  # applied; every answer lost, botocore's retries too
    result = one.commit(world.row(status="done"), _events("x", 5), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 5)  # its touch says it landed
    assert world.ids() == _events_ids("base", 10) + _events_ids("x", 5)
    assert _pending_markers(world) == 0
    _takes_the_next_commit(world, 2, _events_ids("base", 10) + _events_ids("x", 5))


def test_a_one_call_commit_that_never_reached_dynamodb_says_so_and_wrote_nothing(world: World) -> None:
    one = world.store(world.writer_client, single_call_items=100)
    assert one.commit(world.row(), _events("base", 10), 0).ok
    world.faults.fail("TransactWriteItems", times=10)  # connection refused, past botocore's retries
    with pytest.raises(StoreUnavailable):
        one.commit(world.row(), _events("x", 5), 1)
    assert world.ids() == _events_ids("base", 10) and world.raw_event_items() == 10
    _takes_the_next_commit(world, 1, _events_ids("base", 10))


def test_a_large_commit_racing_a_small_one_holds_it_off_then_it_conflicts(world: World) -> None:
    """A 200-event commit takes the gated protocol; a 2-event commit racing it from another store would be one
    transaction, but the large one's marker refuses it: it waits out the marker, then conflicts."""
    _seeded(world)
    small = world.store(single_call_items=100, live_wait_s=20)
    small.load(world.app, world.sid)  # it knows version 1: its transaction is built, and refused by the marker
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 3, arrived, resume)  # after 50 of 200 event items
    results: dict[str, Any] = {}
    large = threading.Thread(target=lambda: results.update(a=world.writer.commit(world.row(), _events("a", 200), 1)))
    large.start()
    assert arrived.wait(timeout=30)
    releaser = threading.Timer(0.3, resume.set)
    releaser.start()
    results["b"] = small.commit(world.row(), _events("b", 2), 1)
    large.join(timeout=60)
    releaser.join(timeout=30)
    assert (results["a"].ok, results["a"].version) == (True, 2)
    assert (results["b"].ok, results["b"].version, results["b"].appended) == (False, 2, 0)
    assert world.ids() == _events_ids("base", 10) + _events_ids("a", 200)
    # ...and at version 2 it is one call again (its refusal told it the stored item).
    small_faults = Faults(small.client)
    assert small.commit(world.row(), _events("b", 2), 2).ok
    assert dict(small_faults.calls) == {"TransactWriteItems": 1}


def test_a_small_commit_landing_first_makes_the_large_one_conflict_at_its_gate(world: World) -> None:
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("UpdateItem", 1, arrived, resume)  # the large commit's gate, not yet sent
    results: dict[str, Any] = {}
    large = threading.Thread(target=lambda: results.update(a=world.writer.commit(world.row(), _events("a", 200), 1)))
    large.start()
    assert arrived.wait(timeout=30)
    small = world.store(single_call_items=100)
    small.load(world.app, world.sid)
    assert small.commit(world.row(), _events("b", 2), 1).ok
    resume.set()
    large.join(timeout=60)
    assert (results["a"].ok, results["a"].version) == (False, 2)
    assert world.ids() == _events_ids("base", 10) + _events_ids("b", 2)
    assert world.raw_event_items() == 12  # the large commit wrote nothing past its refused gate


def test_a_one_call_commit_on_a_re_created_session_lands_in_the_new_incarnation(world: World) -> None:
    """A store that knew the session before it was deleted and created again (same id, same version) holds
    the old incarnation: its transaction is refused on it, and the commit lands visible, in the new one."""
    stale = world.store(single_call_items=100)
    assert stale.commit(world.row(), _events("old", 2), 0).ok  # it knows version 1, incarnation one
    world.reader.delete(world.app, world.sid)
    assert world.reader.commit(world.row(), _events("new", 2), 0).ok  # version 1 again, incarnation two
    result = stale.commit(world.row(), _events("x", 2), 1)
    assert (result.ok, result.version, result.appended) == (True, 2, 2)
    assert world.ids() == ["new-000", "new-001", "x-000", "x-001"]


# -- re-sent ids without a local index: the id items ------------------------------------------------------


def _id_items(world: World) -> dict[str, dict[str, Any]]:
    answer = world.writer_client.query(
        TableName=world.table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :i)",
        ExpressionAttributeValues={":pk": {"S": session_pk(world.app, world.sid)}, ":i": {"S": "I#"}},
        ConsistentRead=True,
    )
    return {item["sk"]["S"][2:]: item for item in answer["Items"]}


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "not-in-order"])
@pytest.mark.parametrize("first", ["one-call", "gated"])
def test_an_id_stored_by_either_path_is_found_when_re_sent_on_the_other(
    world: World, first: str, in_order: bool
) -> None:
    """Ids stored in order have no id item (found by the search of the event items' ``hi``); "a" after "b" are
    not in order: each has its id item."""
    paths = {"one-call": world.store(single_call_items=100), "gated": world.store(single_call_items=0)}
    storing, resending = paths[first], paths["gated" if first == "one-call" else "one-call"]
    one, two = ("a", "b") if in_order else ("b", "a")
    assert storing.commit(world.row(), _events(one, 5), 0).ok
    assert storing.commit(world.row(), _events(two, 5), 1).ok
    assert set(_id_items(world)) == (set() if in_order else set(_events_ids("a", 5)))
    resending.load(world.app, world.sid)  # the one-call store knows the session: only its filter sends it gated
    again = resending.commit(world.row(), [*_events("a", 5)[1:3], *_events("b", 5)[4:], *_events("c", 2)], 2)
    assert (again.ok, again.appended) == (True, 2)
    assert world.ids() == _events_ids(one, 5) + _events_ids(two, 5) + _events_ids("c", 2)
    _takes_the_next_commit(world, 3, world.ids())


def test_a_repair_rolling_forward_puts_the_id_items_the_writer_never_wrote(world: World) -> None:
    _seeded(world)
    # 30 events below "base-009" (not in order: each gets an id item): their 30 items, then their 30 id items, in
    # batches of 25: the third batch holds the last 10 id items
    _dies_at(world, "BatchWriteItem", 3, world.row(), _events("a", 30), 1)
    assert world.raw_event_items() == 40
    assert len([i for i in _id_items(world) if i.startswith("a-")]) == 20  # ten id items missing
    world.clock.advance(1)
    (report,) = world.store().repair_pending(older_than_s=0)
    assert report.action == "rolled_forward"
    assert len([i for i in _id_items(world) if i.startswith("a-")]) == 30
    again = world.store().commit(world.row(), _events("a", 30), 2)  # the writer's retry: every id is known
    assert (again.ok, again.appended) == (True, 0)
    assert world.ids() == _events_ids("base", 10) + _events_ids("a", 30)


def test_a_rolled_back_writer_putting_its_id_items_late_does_not_hide_the_live_ones(world: World) -> None:
    """A writer rolled back while paused, whose retry (the same events) lands first: when it wakes, it puts its
    id items (a batch: no condition) over the live commit's. A re-send must still find every id. (Ids below
    "base-009", not in order, so each has an id item; test_dynamodb_ids has the in-order case.)"""
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)  # after 25 of its 30 event items
    results: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: results.update(r=world.writer.commit(world.row(), _events("a", 30), 1)))
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    assert [r.action for r in world.store().repair_pending(older_than_s=0)] == ["rolled_back"]
    retry = world.store().commit(world.row(), _events("a", 30), 1)  # the turn again, as a retried run sends it
    assert (retry.ok, retry.version, retry.appended) == (True, 2, 30)
    live = _id_items(world)
    resume.set()
    slow.join(timeout=30)
    assert not slow.is_alive() and (results["r"].ok, results["r"].version) == (False, 2)
    late = _id_items(world)
    assert any(late[i]["t"] != live[i]["t"] for i in late if i.startswith("a-"))  # the dead grant's, over the live
    for version, store in enumerate((world.store(single_call_items=0), world.store(single_call_items=100)), start=2):
        store.load(world.app, world.sid)
        again = store.commit(world.row(), _events("a", 30), version)
        assert (again.ok, again.appended) == (True, 0)  # found by reading the events from the dead grant's version
    assert world.ids() == _events_ids("base", 10) + _events_ids("a", 30)


@pytest.mark.parametrize("dies", [False, True], ids=["cleans-up", "dies-at-its-finish"])
def test_an_id_item_of_a_rolled_back_writer_never_makes_its_event_look_stored(world: World, dies: bool) -> None:
    """A rolled-back writer's id items (put late, with its dead grant) name events that were never committed:
    a commit sending those ids again appends them. The meta item's filter flags every id here (saturated, as a
    long session's nearly is), so each is looked up in its id item, then in the events from its version (where
    a writer that died before cleaning up left some of its own, of its dead grant)."""
    _seeded(world)
    arrived, resume = threading.Event(), threading.Event()
    world.faults.pause("BatchWriteItem", 2, arrived, resume)  # after 25 of its 30 event items, no id item yet
    if dies:
        world.faults.die("UpdateItem", 2)  # its finish: it never cleans up after itself
    results: dict[str, Any] = {}

    def commit() -> None:
        try:
            results["r"] = world.writer.commit(world.row(), _events("a", 30), 1)
        except Died as exc:
            results["r"] = exc

    slow = threading.Thread(target=commit)
    slow.start()
    assert arrived.wait(timeout=30)
    world.clock.advance(1)
    assert [r.action for r in world.store().repair_pending(older_than_s=0)] == ["rolled_back"]
    assert world.store().commit(world.row(), _events("z", 2), 1).ok  # version 2, another grant; "z" > "a"
    resume.set()  # the slow writer puts the rest of its items (its 30 id items: version 2, its dead grant)
    slow.join(timeout=30)
    assert not slow.is_alive()
    if dies:
        assert isinstance(results["r"], Died) and world.raw_event_items() == 10 + 2 + 5  # its last 5 are there
    else:
        assert (results["r"].ok, results["r"].version) == (False, 2)
    late = {i: item for i, item in _id_items(world).items() if i.startswith("a-")}
    assert len(late) == 30 and all(item["v"] == {"N": "2"} for item in late.values())
    world.writer_client.update_item(
        TableName=world.table,
        Key={"pk": {"S": session_pk(world.app, world.sid)}, "sk": {"S": "#M"}},
        UpdateExpression="SET bf = :bf",
        ExpressionAttributeValues={":bf": {"B": zlib.compress(b"\xff" * 2048)}},
    )
    for version, store in enumerate((world.store(single_call_items=0), world.store(single_call_items=100)), start=2):
        store.load(world.app, world.sid)
        resent = store.commit(world.row(), _events("a", 30)[version - 2 :: 2], version)  # half on each path
        assert (resent.ok, resent.appended) == (True, 15)
    assert world.ids() == [
        *_events_ids("base", 10),
        *_events_ids("z", 2),
        *_events_ids("a", 30)[::2],
        *_events_ids("a", 30)[1::2],
    ]
