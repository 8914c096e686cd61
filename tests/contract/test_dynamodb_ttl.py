"""Retention on DynamoDB: every item of a session carries the TTL attribute, never below the meta item's.

DynamoDB Local does not delete expired items, so these tests read the raw items' ``expires_at`` and check
that the store hides an expired session itself (AWS deletes lazily, up to days late).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("boto3")

from dormant import adk
from dormant.clock import frozen_clock
from dormant.stores.base import StoredSession
from dormant.stores.dynamodb import DynamoDBSessionStore, dynamo_store
from dormant.stores.dynamodb.keys import session_pk
from tests.support.servers.dynamodb import client as local_client

pytestmark = pytest.mark.backend("dynamodb")

DAY_MS = 86_400_000
T0 = 1_800_000_000_000


@pytest.fixture
def store(ddb: Any, dynamodb_table: str) -> DynamoDBSessionStore:
    return dynamo_store(dynamodb_table, client=ddb)


def _items(ddb: Any, table: str, app: str, sid: str) -> list[dict[str, Any]]:
    answer = ddb.query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": session_pk(app, sid)}},
        ConsistentRead=True,
    )
    assert "LastEvaluatedKey" not in answer
    return list(answer["Items"])


def _expiries(
    ddb: Any, table: str, app: str, sid: str, now_ms: int, *, live_only: bool = False
) -> tuple[int | None, dict[str, int | None]]:
    """The meta item's expires_at, and every other live item's (superseded touches, already expired, left out).

    ``live_only``: only the current incarnation's items (a session made again after it expired leaves the
    old one's items to expire at their own, earlier time; readers never show them).
    """
    items = _items(ddb, table, app, sid)
    (meta_item,) = [i for i in items if i["sk"]["S"] == "#M"]
    meta = int(meta_item["expires_at"]["N"]) if "expires_at" in meta_item else None
    others = {}
    for item in items:
        expiry = int(item["expires_at"]["N"]) if "expires_at" in item else None
        if item is meta_item or (expiry is not None and expiry * 1000 <= now_ms):
            continue
        old_touch = item["sk"]["S"].startswith("T#") and int(item["lsk"]["N"]) < int(meta_item["created_at"]["N"])
        if live_only and (item.get("inc", meta_item["inc"]) != meta_item["inc"] or old_touch):
            continue
        others[item["sk"]["S"]] = expiry
    return meta, others


def test_every_item_outlives_the_meta_item_as_the_expiry_slides(ddb: Any, dynamodb_table: str, store: Any) -> None:
    app = adk(name=f"ttl-{uuid.uuid4().hex[:8]}", store=store, retention=timedelta(days=30), snapshot_every=4)
    refreshes = 0
    with frozen_clock(T0) as clock:
        session = app.sessions.create("s-1")
        # Turns an hour to three weeks apart, over about five months: the expiry slides far past where it began.
        gaps_h = [1, 2, 30, 200, 5, 400, 1, 1, 500, 72, 300, 24, 450, 3, 100, 480, 2, 350, 12, 6]
        previous: dict[str, int | None] = {}
        for turn, gap in enumerate(gaps_h):
            clock.advance(gap * 3_600_000)
            session.input.message(f"turn {turn}")
            app.sessions.commit(session)
            now = clock()
            meta, others = _expiries(ddb, dynamodb_table, app.name, "s-1", now)
            loaded = store.load(app.name, "s-1", after=session.version)
            assert meta == (loaded.row.updated_at + 30 * DAY_MS) // 1000
            assert turn < 4 or "#S" in others  # the snapshot too, once there is one
            assert all(e is not None and meta <= e <= meta + 30 * 86_400 for e in others.values()), (turn, others)
            if any(previous.get(sk) not in (None, e) for sk, e in others.items()):
                refreshes += 1
            previous = others
    # About five months of 30-day retention, refreshed when the expiry passes a horizon half a retention ahead.
    assert 3 <= refreshes <= 10
    loaded = app.sessions.get("s-1")
    assert loaded is not None and len([e for e in loaded.events if e.type == "user"]) == len(gaps_h)


def test_an_expired_session_is_hidden_refused_and_its_id_free_before_aws_deletes_it(
    ddb: Any, dynamodb_table: str, store: Any
) -> None:
    app = adk(name=f"ttl-{uuid.uuid4().hex[:8]}", store=store, retention=timedelta(days=1))
    with frozen_clock(T0) as clock:
        old = app.sessions.create("s-old")
        old.input.message("keep me a day")
        app.sessions.commit(old)
        keep = app.sessions.create("s-keep")
        clock.advance(DAY_MS // 2)
        keep.input.message("still here")
        app.sessions.commit(keep)
        clock.advance(DAY_MS // 2 + 1000)
        # Past its expiry: the store itself shows nothing of it, though every item is still stored.
        assert store.load(app.name, "s-old") is None and store.load(app.name, "s-old", after=1) is None
        assert [s.id for s in store.list(app.name)] == ["s-keep"]
        stored = _items(ddb, dynamodb_table, app.name, "s-old")
        assert len(stored) >= 2  # the meta item and an event (an id minted in order has no id item)
        # A writer holding it from before cannot bring it back: it is gone, as if deleted (nothing written).
        late = store.commit(StoredSession(id="s-old", app_name=app.name, created_at=T0), [], 2)
        assert (late.ok, late.version) == (False, 0)
        assert _items(ddb, dynamodb_table, app.name, "s-old") == stored
        # Its id may be taken again: a new session, none of the old one's events.
        again = app.sessions.create("s-old")
        assert again.version == 1
        loaded = app.sessions.get("s-old")
        assert loaded is not None and list(loaded.events) == []
        assert [s.id for s in store.list(app.name)] == ["s-old", "s-keep"]


def test_items_stored_without_expiry_get_one_and_lose_it_when_retention_goes(
    ddb: Any, dynamodb_table: str, store: Any
) -> None:
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    forever = adk(name=name, store=store)
    kept = adk(name=name, store=store, retention=timedelta(days=7))
    with frozen_clock(T0) as clock:
        session = forever.sessions.create("s-1")
        session.input.message("before retention")
        forever.sessions.commit(session)
        meta, others = _expiries(ddb, dynamodb_table, name, "s-1", clock())
        assert meta is None and set(others.values()) == {None}

        clock.advance(1000)
        later = kept.sessions.require("s-1")
        later.input.message("under retention")
        kept.sessions.commit(later)
        meta, others = _expiries(ddb, dynamodb_table, name, "s-1", clock())
        assert meta is not None and len(others) >= 2 and all(e is not None and e >= meta for e in others.values())

        clock.advance(1000)
        last = forever.sessions.require("s-1")
        last.input.message("retention lifted")
        forever.sessions.commit(last)
        meta, others = _expiries(ddb, dynamodb_table, name, "s-1", clock())
        assert meta is None and set(others.values()) == {None}


@pytest.mark.parametrize(
    ("count", "finish", "action"),
    [
        (30, ("UpdateItem", 2), "rolled_forward"),  # 30 events: the finish, the meta item's update (the gate first)
        (24, ("UpdateItem", 2), "rolled_forward"),  # a full last batch: the same finish
        (0, ("UpdateItem", 2), "rolled_back"),  # nothing shows it got past its gate (and refresh)
    ],
)
def test_a_commit_cut_off_during_or_after_its_refresh_never_leaves_an_item_below_the_meta_item(
    ddb: Any, dynamodb_table: str, store: Any, count: int, finish: tuple[str, int], action: str
) -> None:
    from dormant.events import UserEvent
    from tests.support.dynamodb_faults import Died, Faults

    app, retention = f"ttl-{uuid.uuid4().hex[:8]}", 10 * DAY_MS

    def row() -> StoredSession:
        return StoredSession(id="s-1", app_name=app, created_at=T0, retention_ms=retention)

    def events(prefix: str, count: int = count) -> list[UserEvent]:
        return [UserEvent(id=f"{prefix}-{n}", created_at=1, text="x") for n in range(count)]

    def dying(operation: str, nth: int) -> DynamoDBSessionStore:
        c = local_client(ddb.meta.endpoint_url)
        Faults(c).die(operation, nth)
        return dynamo_store(dynamodb_table, client=c)

    def check(now: int) -> int:
        meta, others = _expiries(ddb, dynamodb_table, app, "s-1", now)
        assert meta is not None and all(e is not None and e >= meta for e in others.values()), (meta, others)
        return meta

    with frozen_clock(T0) as clock:
        assert store.commit(row(), events("a", 30), 0).ok
        first = check(clock())
        clock.advance(8 * DAY_MS)  # the new expiry passes the horizon (5 days past the first): a refresh
        with pytest.raises(Died):
            dying("BatchWriteItem", 1).commit(row(), events("b"), 1)  # dies in the refresh's first batch
        assert check(clock()) == first
        (report,) = store.repair_pending(older_than_s=0)
        assert report.action == "rolled_back"  # no touch: the commit never got past its refresh
        assert check(clock()) == first

        clock.advance(1000)
        with pytest.raises(Died):
            dying(*finish).commit(row(), events("c"), 1)  # refresh and items written, no finish
        (report,) = store.repair_pending(older_than_s=0)
        assert report.action == action
        loaded = store.load(app, "s-1")
        assert loaded is not None
        if action == "rolled_back":
            assert check(clock()) == first and [s.version for s in store.list(app)] == [1]
            return
        assert check(clock()) == (clock() + retention) // 1000 > first
        assert [e.id for e in loaded.events][-1] == f"c-{count - 1}"
        assert [s.version for s in store.list(app)] == [2]


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    retention_h=st.integers(min_value=1, max_value=24 * 60),
    gaps=st.lists(st.floats(min_value=0, max_value=3), min_size=1, max_size=6),
)
@example(retention_h=1, gaps=[2.46875, 1.0])  # expired exactly at a retention, at a time of no whole second
def test_whatever_the_retention_and_the_gaps_no_item_expires_before_the_meta_item(
    ddb: Any, dynamodb_table: str, store: Any, retention_h: int, gaps: list[float]
) -> None:
    """Gaps between commits in retentions (0 to 3): some within the horizon, some past it, some past expiry."""
    retention = retention_h * 3_600_000
    app = adk(
        name=f"ttl-{uuid.uuid4().hex[:8]}",
        store=store,
        retention=timedelta(milliseconds=retention),
        snapshot_every=None,
    )
    with frozen_clock(T0) as clock:
        session = app.sessions.create("s-1")
        for gap in gaps:
            clock.advance(int(gap * retention))
            if app.sessions.get("s-1") is None:  # expired: gone, and its id free again
                session = app.sessions.create("s-1")
            session.input.message("turn")
            app.sessions.commit(session)
            meta, others = _expiries(ddb, dynamodb_table, app.name, "s-1", clock(), live_only=True)
            assert meta is not None and others
            assert all(e is not None and meta <= e <= meta + -(-retention // 1000) for e in others.values())


def test_a_shorter_retention_pulls_every_items_expiry_in_at_the_next_commit(
    ddb: Any, dynamodb_table: str, store: Any
) -> None:
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    with frozen_clock(T0) as clock:
        long = adk(name=name, store=store, retention=timedelta(days=60))
        session = long.sessions.create("s-1")
        session.input.message("kept two months")
        long.sessions.commit(session)
        short = adk(name=name, store=store, retention=timedelta(days=1))
        clock.advance(1000)
        again = short.sessions.require("s-1")
        again.input.message("now a day")
        short.sessions.commit(again)
        meta, others = _expiries(ddb, dynamodb_table, name, "s-1", clock())
        assert meta == (clock() + DAY_MS) // 1000
        assert len(others) >= 2 and all(e is not None and meta <= e <= meta + 86_400 for e in others.values())


def test_a_bound_sessions_binding_entries_expire_with_it(ddb: Any, dynamodb_table: str, store: Any) -> None:
    """The entries an erasure finds a person's sessions by live outside the session's partition: they get the
    horizon too, and follow it when it moves."""
    from dormant.events import UserEvent
    from dormant.stores.dynamodb.keys import binding_pk

    app = f"ttl-{uuid.uuid4().hex[:8]}"
    row = StoredSession(id="s-1", app_name=app, scopes={"user": "u-1"}, created_at=T0, retention_ms=10 * DAY_MS)

    def binding() -> int | None:
        key = {"pk": {"S": binding_pk(app, "user", "u-1")}, "sk": {"S": "s-1"}}
        item = ddb.get_item(TableName=dynamodb_table, Key=key, ConsistentRead=True)["Item"]
        return int(item["expires_at"]["N"]) if "expires_at" in item else None

    with frozen_clock(T0) as clock:
        assert store.commit(row, [UserEvent(id="e-1", created_at=1, text="x")], 0).ok
        first = binding()
        meta, _ = _expiries(ddb, dynamodb_table, app, "s-1", clock())
        assert meta is not None and first is not None and meta <= first
        clock.advance(8 * DAY_MS)  # past the horizon: the next commit refreshes it
        assert store.commit(row, [UserEvent(id="e-2", created_at=1, text="y")], 1).ok
        meta, _ = _expiries(ddb, dynamodb_table, app, "s-1", clock())
        moved = binding()
        assert meta is not None and moved is not None and first < meta <= moved


def test_the_expiry_follows_the_stored_updated_at_not_a_late_writers_clock(
    ddb: Any, dynamodb_table: str, store: Any
) -> None:
    """A writer whose clock runs behind the session's stored ``updated_at`` (it keeps the later one) must not
    pull the expiry in: ``expires_at`` is the stored ``updated_at`` plus the retention."""
    app = adk(name=f"ttl-{uuid.uuid4().hex[:8]}", store=store, retention=timedelta(days=30))
    with frozen_clock(T0 + 10 * 3_600_000):
        session = app.sessions.create("s-1")
        session.input.message("on time")
        app.sessions.commit(session)
    with frozen_clock(T0 + 3_600_000) as clock:  # another writer, nine hours behind
        late = app.sessions.get("s-1")
        assert late is not None
        late.input.message("from a slow clock")
        app.sessions.commit(late)
        meta, _ = _expiries(ddb, dynamodb_table, app.name, "s-1", clock())
    loaded = store.load(app.name, "s-1")
    assert loaded.row.updated_at == T0 + 10 * 3_600_000  # the later time stays
    assert meta == (T0 + 10 * 3_600_000 + 30 * DAY_MS) // 1000


def test_an_id_stored_by_an_expired_incarnation_is_not_taken_as_stored_by_the_new_one(
    ddb: Any, dynamodb_table: str, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expired session's items wait for AWS's TTL; the id made again is a new incarnation, and an event id
    only the old one stored is new to it. The id filter is told to suspect every id, so the exact lookup on the
    id index (which must match the incarnation) decides."""
    from dormant.events import UserEvent
    from dormant.stores.dynamodb import store as dynamodb_module

    app = adk(name=f"ttl-{uuid.uuid4().hex[:8]}", store=store, retention=timedelta(days=1))
    with frozen_clock(T0) as clock:
        first = app.sessions.create("s-1")
        first.append(UserEvent(id="evt-x", created_at=clock(), text="first life"))
        app.sessions.commit(first)
        clock.advance(2 * DAY_MS)
        again = app.sessions.create("s-1")
        assert again.version == 1 and list(again.events) == []
        again.append(UserEvent(id="evt-y", created_at=clock(), text="to reach the old item's version"))
        app.sessions.commit(again)
        monkeypatch.setattr(dynamodb_module.IdFilter, "may_hold", lambda self, event_id: True)
        again.append(UserEvent(id="evt-x", created_at=clock(), text="second life"))
        assert app.sessions.commit(again).appended == 1
        loaded = app.sessions.get("s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["evt-y", "evt-x"]
