"""The DynamoDB store on a real DynamoDB Local: the compliance suite, plus what only this store has."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("boto3")

from dormant.clock import frozen_clock
from dormant.errors import ConfigurationError, EventTooLarge, InputError, StoreClosed, StoreError, StoreUnavailable
from dormant.events import UserEvent
from dormant.ids import new_id
from dormant.stores.base import ScopedStateChange, SessionStore, StoredSession, StoredSnapshot
from dormant.stores.dynamodb import TABLE, DynamoDBSessionStore, create_table, dynamo_store
from dormant.stores.dynamodb.keys import CHUNK_BYTES, IdFilter, listing_keys, session_pk
from dormant.stores.dynamodb.store import _touch_in_finish
from dormant.stores.dynamodb.table import LISTING_INDEX, STATUS_INDEX
from dormant.testing import StoreContract
from tests.support.dynamodb_faults import Died, Faults
from tests.support.servers.dynamodb import client as local_client

pytestmark = pytest.mark.backend("dynamodb")


class TestDynamoDBStore(StoreContract):
    store_options: ClassVar[dict[str, Any]] = {}
    """What each store of the suite is opened with, beyond its table and client."""

    @pytest.fixture(autouse=True)
    def _table(self, dynamodb_endpoint: str, dynamodb_table: str) -> Iterator[None]:
        yield from self._clients_on(dynamodb_endpoint, dynamodb_table)

    def _clients_on(self, endpoint: str, table: str) -> Iterator[None]:
        """The stores of one test on ``table``; their clients closed after it."""
        self.endpoint, self.table = endpoint, table
        self.clients: list[Any] = []
        yield
        for c in self.clients:
            c.close()

    def make_store(self) -> SessionStore:
        c = local_client(self.endpoint)
        self.clients.append(c)
        return dynamo_store(self.table, client=c, **self.store_options)

    def make_peer(self, store: SessionStore) -> SessionStore:
        return self.make_store()


class TestDynamoDBStoreGated(TestDynamoDBStore):
    """The suite again with every commit on the gated protocol (gate, batches, finish), as a commit too large
    for one ``TransactWriteItems`` is written."""

    store_options: ClassVar[dict[str, Any]] = {"single_call_items": 0}


class TestDynamoDBStoreOneShard(TestDynamoDBStore):
    """The suite again with the listing unsharded: ``{app}`` as the listing key (a table of its own: shard
    counts are fixed per table)."""

    store_options: ClassVar[dict[str, Any]] = {"listing_shards": 1}

    @pytest.fixture(autouse=True)
    def _table(self, dynamodb_endpoint: str, layout_table: Callable[[int], str]) -> Iterator[None]:
        yield from self._clients_on(dynamodb_endpoint, layout_table(1))


# -- what only the DynamoDB store has ---------------------------------------------------------------


@pytest.fixture(scope="session")
def layout_table(dynamodb_endpoint: str) -> Iterator[Callable[..., str]]:
    """A table for each listing (and pending) shard count a test opens stores with, made on first use: the
    table records the counts of its first store and refuses others."""
    made: dict[tuple[int, int], str] = {}
    c = local_client(dynamodb_endpoint)

    def table(listing: int, pending: int = 8) -> str:
        if (listing, pending) not in made:
            made[listing, pending] = f"dormant-layout-{uuid.uuid4().hex[:8]}"
            create_table(made[listing, pending], client=c)
        return made[listing, pending]

    yield table
    c.close()


@pytest.fixture
def app() -> str:
    return f"app-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(ddb: Any, dynamodb_table: str) -> DynamoDBSessionStore:
    """A store on the gated protocol (gate, batches, finish): most tests here are about it."""
    return _warm(dynamo_store(dynamodb_table, client=ddb, single_call_items=0))


def _warm(store: DynamoDBSessionStore) -> DynamoDBSessionStore:
    """The store after its first call, which reads the table's shard counts (one GetItem): what the tests
    count is the calls after it."""
    store.load("warm-up", "nothing")
    return store


def _row(app: str, sid: str = "s-1", **extra: Any) -> StoredSession:
    return StoredSession(id=sid, app_name=app, created_at=1, **extra)


def _event(n: int | str, text: str = "x") -> UserEvent:
    return UserEvent(id=f"evt-{n}", created_at=1, text=text)


def _raw_items(ddb: Any, table: str, pk: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": pk}},
        "ConsistentRead": True,
    }
    while True:
        page = ddb.query(**kwargs)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_a_commit_is_a_gate_its_batches_and_a_finish(store: DynamoDBSessionStore, ddb: Any, app: str) -> None:
    faults = Faults(ddb)
    row = _row(app, scopes={"user": "u-1"})
    assert store.commit(row, [_event(n) for n in range(5)], 0).ok
    # a create of a bound session puts its binding entry (what an erasure reads) in the gate's transaction
    # and the finish is the meta item's update alone: it is the session's listing entry, no touch to write
    assert dict(faults.calls) == {"TransactWriteItems": 1, "BatchWriteItem": 1, "UpdateItem": 1}
    faults.calls.clear()
    # 60 events: 60 event items, then their 60 id items, in 5 batches of 25
    assert store.commit(row, [_event(n) for n in range(5, 65)], 1).ok
    assert dict(faults.calls) == {"UpdateItem": 2, "BatchWriteItem": 5}
    faults.calls.clear()
    changes = [ScopedStateChange("user", "u-1", "k", 1)]
    assert store.commit(row, [_event(99)], 2, changes).ok
    assert dict(faults.calls) == {"UpdateItem": 1, "BatchWriteItem": 1, "TransactWriteItems": 1}


def test_a_conflict_is_one_call_and_says_the_actual_version(store: DynamoDBSessionStore, ddb: Any, app: str) -> None:
    store.commit(_row(app), [_event(1)], 0)
    store.commit(_row(app), [_event(2)], 1)
    faults = Faults(ddb)
    result = store.commit(_row(app), [_event(3)], 1)
    assert (result.ok, result.version) == (False, 2)
    assert dict(faults.calls) == {"UpdateItem": 1}  # ReturnValuesOnConditionCheckFailure: no second read


def test_a_resent_id_is_looked_up_alone_not_in_the_history(store: DynamoDBSessionStore, ddb: Any, app: str) -> None:
    store.commit(_row(app), [_event(n) for n in range(200)], 0)
    faults = Faults(ddb)
    result = store.commit(_row(app), [_event(7), _event(200), _event(150), _event(201)], 1)
    assert (result.ok, result.appended) == (True, 2)
    # the re-sent ids' id items, by key, in one consistent BatchGetItem: no Query, no index
    (read,) = [params for op, params in faults.params if op == "BatchGetItem"]
    ((_table, request),) = read["RequestItems"].items()
    assert request["ConsistentRead"] is True
    assert {key["sk"]["S"] for key in request["Keys"]} == {"I#evt-7", "I#evt-150"}
    # "evt-150" came after "evt-99" (not in order): its id item answers. "evt-7" came in order (greater than
    # every id before it): no id item, so one probe of the binary search (one commit) and one read of that commit.
    queries = [params for op, params in faults.params if op == "Query"]
    assert [q.get("Limit") for q in queries] == [1, None]
    loaded = store.load(app, "s-1")
    assert loaded is not None and [e.id for e in loaded.events][-3:] == ["evt-199", "evt-200", "evt-201"]
    # The marker was recounted for the items really written: a repair would judge the commit by them.
    assert faults.calls["UpdateItem"] == 3  # the gate, the recount and the finish (no touch: not a transaction)


def test_new_ids_cost_no_lookup(store: DynamoDBSessionStore, ddb: Any, app: str) -> None:
    store.commit(_row(app), [_event(n) for n in range(500)], 0)
    faults = Faults(ddb)
    for version in range(1, 21):
        store.commit(_row(app), [_event(f"new-{version}-{k}") for k in range(5)], version)
    # 100 new ids against 500 stored: the filter may flag one by chance (about 1 in 10,000 each).
    assert faults.calls["BatchGetItem"] <= 1 and faults.calls["Query"] == 0


def test_ids_minted_after_the_stored_ones_cost_no_lookup_however_full_the_filter(
    store: DynamoDBSessionStore, ddb: Any, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(IdFilter, "BITS", 64)  # saturated after a few dozen ids, as 16,384 bits are by ~10,000
    store.commit(_row(app), [], 0)  # created empty, as sessions.create() does
    stored = [UserEvent(id=new_id(), created_at=1, text="x") for _ in range(100)]
    store.commit(_row(app), stored, 1)
    bits_alone = IdFilter(IdFilter(None).add(e.id for e in stored).dump(), None)
    assert all(bits_alone.may_hold(new_id()) for _ in range(20))  # the bits flag every id now
    faults = Faults(ddb)
    for version in range(2, 12):
        result = store.commit(_row(app), [UserEvent(id=new_id(), created_at=1, text="y") for _ in range(5)], version)
        assert (result.ok, result.appended) == (True, 5)
    assert faults.calls["BatchGetItem"] == 0  # above the greatest stored id: new without asking the filter
    resent = store.commit(_row(app), [stored[40], UserEvent(id=new_id(), created_at=1, text="z")], 12)
    assert (resent.ok, resent.appended) == (True, 1)  # the re-sent id is still found (looked up) and skipped
    assert faults.calls["BatchGetItem"] == 1


def test_the_id_filter_answers_alone_for_a_meta_item_without_the_greatest_id() -> None:
    stored = [new_id() for _ in range(20_000)]
    later = [new_id() for _ in range(100)]
    ids = IdFilter(None).add(stored)
    assert ids.greatest == max(stored) and not any(ids.may_hold(i) for i in later)
    assert all(ids.may_hold(i) for i in stored[::97])
    legacy = IdFilter(ids.dump(), None)  # written before the greatest id was kept: the bits decide
    assert sum(legacy.may_hold(i) for i in later) > 90 and all(legacy.may_hold(i) for i in stored[::97])


def test_loading_the_tail_reads_only_the_tail(store: DynamoDBSessionStore, ddb: Any, app: str) -> None:
    for version in range(3):
        store.commit(_row(app), [_event(f"{version}-{n}") for n in range(30)], version)
    faults = Faults(ddb)
    tail = store.load(app, "s-1", after=2)
    assert tail is not None and tail.row.version == 3
    assert [e.id for e in tail.events] == [f"evt-2-{n}" for n in range(30)]
    assert dict(faults.calls) == {"GetItem": 1, "Query": 1}
    ((_, query),) = [(op, p) for op, p in faults.params if op == "Query"]
    assert "BETWEEN" in query["KeyConditionExpression"]  # a key range, not the partition
    current = store.load(app, "s-1", after=3)
    assert current is not None and current.events == []


def test_an_event_too_large_for_one_item_is_chunked_and_reassembled(
    store: DynamoDBSessionStore, ddb: Any, dynamodb_table: str, app: str
) -> None:
    big = UserEvent(id="big", created_at=1, text="naïve ☃ " * 90_000)  # about 990 KB of JSON
    events = [_event(1), big, _event(2)]
    assert store.commit(_row(app), events, 0).ok
    items = _raw_items(ddb, dynamodb_table, session_pk(app, "s-1"))
    # meta (its own listing entry), evt-1, big in 3 chunks, evt-2, and the id item of "big" (below "evt-1")
    assert len(items) == 1 + 1 + 3 + 1 + 1
    assert sorted(i["sk"]["S"] for i in items if i["sk"]["S"].startswith("I#")) == ["I#big"]
    assert all(len(i.get("d", {}).get("B", b"")) <= CHUNK_BYTES for i in items)
    loaded = store.load(app, "s-1")
    assert loaded is not None and loaded.events == events


def test_an_event_over_the_hard_limit_is_refused_before_the_gate(
    store: DynamoDBSessionStore, ddb: Any, app: str
) -> None:
    store.commit(_row(app), [_event(1)], 0)
    limit = store.limits.max_event_bytes
    huge = UserEvent(id="huge", created_at=1, text="x" * limit)
    faults = Faults(ddb)
    with pytest.raises(EventTooLarge) as info:
        store.commit(_row(app), [_event(2), huge], 1)
    assert (info.value.event_id, info.value.field, info.value.limit) == ("huge", "new_events", limit)
    assert "huge" in str(info.value) and info.value.size > limit
    assert not faults.calls  # nothing was sent
    loaded = store.load(app, "s-1")
    assert loaded is not None and loaded.row.version == 1 and [e.id for e in loaded.events] == ["evt-1"]


def test_a_session_of_several_megabytes_loads_whole_a_page_per_megabyte(
    store: DynamoDBSessionStore, ddb: Any, app: str
) -> None:
    text = "y" * 100_000
    version = 0
    for batch in range(3):
        events = [_event(f"{batch}-{n:02d}", text) for n in range(20)]
        version = store.commit(_row(app), events, version).version
    faults = Faults(ddb)
    loaded = store.load(app, "s-1")
    assert loaded is not None and len(loaded.events) == 60
    assert [e.id for e in loaded.events] == [f"evt-{b}-{n:02d}" for b in range(3) for n in range(20)]
    assert 6 <= faults.calls["Query"] <= 8  # about 6 MB: one page per MB, no more


def test_too_many_scoped_keys_are_refused_before_anything_is_written(
    store: DynamoDBSessionStore, ddb: Any, app: str
) -> None:
    changes = [ScopedStateChange("user", "u-1", f"k{n}", n) for n in range(98)]
    faults = Faults(ddb)
    with pytest.raises(InputError) as info:
        store.commit(_row(app, scopes={"user": "u-1"}), [_event(1)], 0, changes)
    assert info.value.field == "scoped_changes"
    assert not faults.calls
    assert store.load(app, "s-1") is None


def test_the_most_scoped_keys_fit_one_finish_with_the_touches(store: DynamoDBSessionStore, app: str) -> None:
    """97 keys, the meta update, the touch and the marking of the superseded touch: 100 items, the most one
    transaction holds."""
    row = _row(app, scopes={"user": "u-1"})
    with frozen_clock(1_800_000_000_000) as clock:
        for version in range(2):
            assert store.commit(row, [_event(version)], version).ok
            clock.advance(1000)
        changes = [ScopedStateChange("user", "u-1", f"k{n:02d}", n) for n in range(97)]
        assert store.commit(row, [], 2, changes).ok
    assert store.load_scoped_state(app, "user", "u-1") == {f"k{n:02d}": n for n in range(97)}
    assert [(s.version, s.updated_at) for s in store.list(app)] == [(3, 1_800_000_002_000)]


def test_a_session_bound_to_too_many_scopes_is_refused_before_anything_is_written(
    store: DynamoDBSessionStore, ddb: Any, app: str
) -> None:
    faults = Faults(ddb)
    with pytest.raises(InputError) as info:
        store.commit(_row(app, scopes={f"s{n}": "x" for n in range(100)}), [], 0)
    assert info.value.field == "scopes"
    assert not faults.calls
    assert store.load(app, "s-1") is None


def test_listing_is_sharded_by_session_and_merged(ddb: Any, dynamodb_table: str, app: str) -> None:
    store = dynamo_store(dynamodb_table, client=ddb, listing_shards=4)
    for n in range(12):
        store.commit(_row(app, f"s{n:02d}"), [], 0)
    shards: dict[str, int] = {}
    for n in range(12):
        (touch,) = [i for i in _raw_items(ddb, dynamodb_table, session_pk(app, f"s{n:02d}")) if "lpk" in i]
        shards[touch["lpk"]["S"]] = shards.get(touch["lpk"]["S"], 0) + 1
    assert set(shards) <= {f"{app}#{k}" for k in range(4)} and len(shards) > 1
    listed = store.list(app)
    assert len(listed) == 12
    assert [(s.updated_at, s.id) for s in listed] == sorted(((s.updated_at, s.id) for s in listed), reverse=True)
    faults = Faults(ddb)
    page = store.list(app, limit=5)
    assert [s.id for s in page] == [s.id for s in listed[:5]]
    assert faults.calls["Query"] == 4  # one page from each shard
    assert "BatchGetItem" not in faults.calls  # the index projects the rows: Queries only
    rest = store.list(app, cursor=page[-1].cursor)
    assert [s.id for s in page + rest] == [s.id for s in listed]
    # Another shard count would list nothing of these: the table refuses a store opened with one.
    with pytest.raises(ConfigurationError, match=r"listing_shards=4 .*listing_shards=1"):
        dynamo_store(dynamodb_table, client=ddb, listing_shards=1).list(app)


def test_listing_ties_on_updated_at_page_by_id(ddb: Any, layout_table: Callable[..., str], app: str) -> None:
    store = dynamo_store(layout_table(3), client=ddb, listing_shards=3)
    with frozen_clock(1_800_000_000_000):
        for n in range(9):
            store.commit(_row(app, f"s{n}"), [], 0)
    pages: list[str] = []
    cursor = None
    while page := store.list(app, limit=2, cursor=cursor):
        pages += [s.id for s in page]
        cursor = page[-1].cursor
    assert pages == [f"s{n}" for n in reversed(range(9))]


def test_a_delete_racing_a_commit_never_shows_the_old_incarnation(
    store: DynamoDBSessionStore, ddb: Any, dynamodb_table: str, app: str
) -> None:
    store.commit(_row(app), [_event(1)], 0)
    arrived, resume = threading.Event(), threading.Event()
    slow_client = local_client(ddb.meta.endpoint_url)
    try:
        faults = Faults(slow_client)
        faults.pause("BatchWriteItem", 1, arrived, resume)
        faults.die("UpdateItem", 2)  # it dies at its finish (the gate is the first): its items stay behind
        slow = dynamo_store(dynamodb_table, client=slow_client)
        died: list[BaseException] = []

        def write() -> None:
            try:
                slow.commit(_row(app), [_event("old-2")], 1)
            except Died as exc:
                died.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        assert arrived.wait(timeout=30)
        store.delete(app, "s-1")
        assert store.commit(_row(app), [_event(9)], 0).ok  # a new session under the same id
        resume.set()
        writer.join(timeout=30)
        assert not writer.is_alive() and died
    finally:
        slow_client.close()
    assert store.commit(_row(app), [_event(10)], 1).ok  # version 2, like the straggler's items
    loaded = store.load(app, "s-1")
    assert loaded is not None and [e.id for e in loaded.events] == ["evt-9", "evt-10"]
    raw = _raw_items(ddb, dynamodb_table, session_pk(app, "s-1"))
    assert any(i.get("eid", {}).get("S") == "evt-old-2" for i in raw)  # there, and not shown


# -- construction, imports, the table --------------------------------------------------------------------


def test_import_dormant_loads_no_aws_sdk() -> None:
    code = (
        "import sys, dormant, dormant.stores.dynamodb, dormant.stores.dynamodb.table;"
        "assert not {'boto3', 'botocore'} & set(sys.modules), sorted(m for m in sys.modules if 'boto' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_dynamo_store_builds_its_client_lazily_and_closes_only_its_own(dynamodb_table: str, ddb: Any) -> None:
    built = dynamo_store(dynamodb_table, endpoint_url="http://127.0.0.1:1", region="eu-west-2")
    assert built._client.meta.region_name == "eu-west-2"
    assert built._client.meta.config.retries["mode"] == "standard"
    built.close()
    with pytest.raises(StoreClosed):
        built.load("app", "s")
    given = dynamo_store(dynamodb_table, client=ddb)
    given.close()
    assert ddb.list_tables()["TableNames"]  # still usable
    with pytest.raises(ConfigurationError, match="not both"):
        dynamo_store(dynamodb_table, client=ddb, region="eu-west-2")
    with pytest.raises(ConfigurationError, match="at least 3"):
        dynamo_store("ab", client=ddb)
    with pytest.raises(ConfigurationError, match="listing_shards"):
        dynamo_store(dynamodb_table, client=ddb, listing_shards=0)


def test_an_unreachable_endpoint_is_store_unavailable(dynamodb_table: str) -> None:
    store = dynamo_store(
        dynamodb_table, client=local_client("http://127.0.0.1:1", retries={"max_attempts": 1}, connect_timeout=1)
    )
    with pytest.raises(StoreUnavailable, match="DynamoDB get_item failed"):  # its first call: the shard counts
        store.load("app", "s")


def test_a_missing_table_says_how_to_make_one(ddb: Any) -> None:
    with pytest.raises(StoreError, match="create_table"):
        dynamo_store("no-such-table", client=ddb).load("app", "s")


def test_create_table_builds_the_shape_once(ddb: Any) -> None:
    name = f"dormant-shape-{uuid.uuid4().hex[:8]}"
    assert create_table(name, client=ddb) is True
    assert create_table(name, client=ddb) is False
    described = ddb.describe_table(TableName=name)["Table"]
    request = TABLE.create_table_request(name)
    assert {i["IndexName"] for i in described["GlobalSecondaryIndexes"]} == {
        "due",
        "listing",
        "pending",
        "running",
        "status",
    }
    assert "LocalSecondaryIndexes" not in described  # no item collection capped at 10 GB
    assert described["KeySchema"] == request["KeySchema"]
    ttl = ddb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"
    ddb.delete_table(TableName=name)


# -- the listing index: one touch per commit -----------------------------------------------------------


class _Units:
    """Write units by index, read from ``ReturnConsumedCapacity=INDEXES`` (added to every write by a hook)."""

    def __init__(self, client: Any) -> None:
        self.by_index: dict[str, float] = {}
        client.meta.events.register("before-parameter-build.dynamodb", self._ask)
        client.meta.events.register("after-call.dynamodb", self._read)

    def _ask(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in {"UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}:
            params["ReturnConsumedCapacity"] = "INDEXES"

    def _read(self, parsed: dict[str, Any], **_: Any) -> None:
        consumed = parsed.get("ConsumedCapacity") or []
        for entry in consumed if isinstance(consumed, list) else [consumed]:
            for name, used in (entry.get("GlobalSecondaryIndexes") or {}).items():
                self.by_index[name] = self.by_index.get(name, 0.0) + used["CapacityUnits"]

    def take(self, index: str) -> float:
        return self.by_index.pop(index, 0.0)


def _touches(ddb: Any, table: str, app: str, sid: str) -> list[dict[str, Any]]:
    return [i for i in _raw_items(ddb, table, session_pk(app, sid)) if i["sk"]["S"].startswith("T#")]


def _entries(ddb: Any, table: str, app: str, sid: str) -> list[dict[str, Any]]:
    """The session's items that are listing entries (``lpk``): its meta item, or an earlier layout's touches."""
    return [i for i in _raw_items(ddb, table, session_pk(app, sid)) if "lpk" in i]


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_a_commit_moves_the_sessions_one_listing_entry_its_meta_item(
    ddb: Any, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """The meta item is the session's listing (and status) entry, carrying the row a listing shows: each commit
    moves it with its own write (the index's delete and put), no touch item put or deleted beside it. A running
    turn's step (``running`` after ``running``) moves the head alone: the entry stays as the claim wrote it, no
    index written, while a load has the step; the next commit that is no step moves the entry."""
    store = _warm(dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items))
    units = _Units(ddb)
    with frozen_clock(1_800_000_000_000) as clock:
        statuses = ["idle", "running", "running", "running", "waiting", "running", "done", "done", "late"]
        listed = 0
        for version, status in enumerate(statuses):
            assert store.commit(_row(app, status=status), [_event(version)], version).ok
            step = status == "running" and statuses[version - 1] == "running"
            listed = listed if step else version + 1
            # DynamoDB Local's figures (bench/units.py bills AWS's): a move, or for a step nothing in any index
            moved = {index: units.take(index) for index in ("listing", "status", "running", "due")}
            assert (moved == dict.fromkeys(moved, 0.0)) if step else moved["listing"] > 0, (version, moved)
            (entry,) = _entries(ddb, dynamodb_table, app, "s-1")
            assert entry["sk"]["S"] == "#M" and _touches(ddb, dynamodb_table, app, "s-1") == []
            assert (entry["version"]["N"], entry["status"]["S"]) == (str(listed), status)
            assert entry["spk"]["S"] == f"{status}#{entry['lpk']['S']}"
            assert [(s.id, s.version) for s in store.list(app, status=status)] == [("s-1", listed)]
            loaded = store.load(app, "s-1")
            assert loaded is not None and loaded.row.version == version + 1 and len(loaded.events) == version + 1
            clock.advance(1000)
        (shown,) = store.list(app)
        assert (shown.version, shown.status, shown.updated_at) == (9, "late", int(entry["lsk"]["N"]))
        assert store.list(app, status="done") == [] and store.list(app, status="running") == []


def test_a_running_sessions_commit_takes_the_path_that_bills_fewer_write_units(
    ddb: Any, dynamodb_table: str, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction bills each item twice; the gated protocol writes the events once and the meta item twice with
    a ``pending`` entry put and deleted. A commit building on a ``running`` session (a step, a yield, the end) takes
    whichever bills fewer units (AWS's billing, ``bench/units.py``): gated from 3 event units on, one call below.
    Every other commit stays one call, however many events. Both land the same ledger."""
    from bench.units import Table, labelled_units
    from tests.support.fidelity import capture

    store = _warm(dynamo_store(dynamodb_table, client=ddb))
    table = Table.described(ddb.describe_table(TableName=dynamodb_table)["Table"])
    records = capture.recorded(ddb, monkeypatch)

    def commit(status: str, events: int, expected: int) -> tuple[list[str], float]:
        records.clear()
        batch = [_event(f"{expected}-{n}", "y" * 300) for n in range(events)]
        assert store.commit(_row(app, status=status), batch, expected).ok
        writes = [r["operation"] for r in records if r["operation"] not in ("GetItem", "Query")]
        billed = sum(
            units
            for record in records
            for (_, kind, _), units in labelled_units(record, {table.name: table}).items()
            if kind == "write"
        )
        return writes, billed

    assert commit("idle", 5, 0)[0] == ["TransactWriteItems"]  # a create: one call
    assert commit("idle", 5, 1)[0] == ["TransactWriteItems"]  # not running: one call, whatever it saves
    assert commit("running", 5, 2)[0] == ["TransactWriteItems"]  # the claim builds on an idle session
    step, gated = commit("running", 5, 3)  # a step of 5 events: gated
    assert step == ["UpdateItem", "BatchWriteItem", "UpdateItem"]
    assert commit("running", 2, 4)[0] == ["TransactWriteItems"]  # 2 event units: a transaction bills no more
    ended, _ = commit("idle", 3, 5)  # the end of the turn, 3 events: gated, and the row is listed again
    assert ended == ["UpdateItem", "BatchWriteItem", "UpdateItem"]
    assert [(r.id, r.version, r.status) for r in store.list(app)] == [("s-1", 6, "idle")]
    assert commit("running", 1, 6)[0] == ["TransactWriteItems"]  # the next claim
    # The same 5-event step as one transaction (the choice turned off): it bills more.
    monkeypatch.setattr("dormant.stores.dynamodb.commit._gated_is_cheaper", lambda *_: False)
    one_call_writes, one_call = commit("running", 5, 7)
    assert one_call_writes == ["TransactWriteItems"] and gated < one_call, (gated, one_call)
    monkeypatch.undo()
    loaded = store.load(app, "s-1")
    assert loaded is not None and loaded.row.version == 8 and len(loaded.events) == 5 * 4 + 2 + 3 + 1 + 5
    assert [(r.id, r.version, r.status) for r in store.list(app)] == [("s-1", 7, "running")]  # the claim's row


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_after_a_step_every_condition_is_on_the_head_not_the_listed_version(
    ddb: Any, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """A step leaves ``version`` at the claim's and keeps the head in ``sv``: a writer still at the claim's version is
    refused (by a store that knows the item and by one that does not), the head's writer lands, a snapshot is
    checked against the head, the running index reads the head's time, and a delete conditioned on the head
    goes through."""
    store = _warm(dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items))
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app, status="running"), [_event(0)], 0).ok  # the claim: listed at version 1
        clock.advance(1000)
        assert store.commit(_row(app, status="running"), [_event(1)], 1).ok  # a step: the head is 2
        clock.advance(1000)
        stale = store.commit(_row(app, status="running"), [_event("stale")], 1)
        other = _warm(dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items))
        unknown = other.commit(_row(app, status="running"), [_event("stale-2")], 1)
        assert (stale.ok, stale.version, unknown.ok, unknown.version) == (False, 2, False, 2)
        assert store.commit(_row(app, status="running"), [_event(2)], 2).ok  # the head's writer: a step, head 3
        (entry,) = _entries(ddb, dynamodb_table, app, "s-1")
        assert (entry["version"]["N"], entry["sv"]["N"]) == ("1", "3")
        assert store.save_snapshot(app, "s-1", StoredSnapshot(3, "{}"))
        assert not store.save_snapshot(app, "s-1", StoredSnapshot(4, "{}"))
        (running,) = [r for r in store.running_sessions() if r.session_id == "s-1" and r.app_name == app]
        assert running.updated_at == 1_800_000_002_000  # the head's, not the claim's
        loaded = store.load(app, "s-1")
        assert loaded is not None and [e.id for e in loaded.events] == ["evt-0", "evt-1", "evt-2"]
        assert store.commit(_row(app, status="idle"), [_event(3)], 3).ok  # the turn's end: listed again
        (entry,) = _entries(ddb, dynamodb_table, app, "s-1")
        assert entry["version"]["N"] == "4" and "sv" not in entry and "su" not in entry
        assert [(r.id, r.version) for r in store.list(app)] == [("s-1", 4)]
        assert store.commit(_row(app, status="running"), [_event(4)], 4).ok
        assert store.commit(_row(app, status="running"), [_event(5)], 5).ok
        store.delete(app, "s-1")
        assert store.load(app, "s-1") is None and store.list(app) == []


@pytest.mark.parametrize("dies_at", [1, 2], ids=["after-its-gate", "at-its-finish"])
def test_a_step_whose_writer_died_is_repaired_as_a_step(
    store: DynamoDBSessionStore, ddb: Any, dynamodb_table: str, app: str, dies_at: int
) -> None:
    """A step's writer killed mid-commit on the gated path (after its gate, its events not written; or at its
    finish, every event written): the repair rolls it back, or forward as the step it was, the head in ``sv``
    and the listed row the claim's, and the turn's next step lands on the head."""
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app, status="running"), [_event(0)], 0).ok  # the claim
        clock.advance(1000)
        assert store.commit(_row(app, status="running"), [_event(1)], 1).ok  # a step: head 2
        dying = local_client(ddb.meta.endpoint_url)
        faults = Faults(dying)
        if dies_at == 1:
            faults.die("BatchWriteItem", 1)  # the gate landed; none of its events did
        else:
            faults.die("UpdateItem", 2)  # the finish (the gate is the first): its events are all written
        clock.advance(1000)
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying, single_call_items=0).commit(
                _row(app, status="running"), [_event(2)], 2
            )
        dying.close()
        report = store.repair_session(app, "s-1")
        assert report is not None and report.action == ("rolled_back" if dies_at == 1 else "rolled_forward")
        head = 2 if dies_at == 1 else 3
        (entry,) = _entries(ddb, dynamodb_table, app, "s-1")
        assert (entry["version"]["N"], entry["sv"]["N"], "pending" in entry) == ("1", str(head), False)
        assert [(s.version, s.status) for s in store.list(app)] == [(1, "running")]
        assert store.commit(_row(app, status="running"), [_event(3)], head).ok
        loaded = store.load(app, "s-1")
        assert loaded is not None and loaded.row.version == head + 1
        kept = ["evt-0", "evt-1", *(["evt-2"] if dies_at == 2 else []), "evt-3"]
        assert [e.id for e in loaded.events] == kept


_STATUSES = st.sampled_from(["running", "running", "idle", "awaiting_input", None])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statuses=st.lists(_STATUSES, min_size=1, max_size=8), gated=st.lists(st.booleans(), min_size=8, max_size=8))
def test_steps_keep_the_listed_row_and_the_head_moves_on_every_commit(
    ddb: Any, dynamodb_table: str, statuses: list[str | None], gated: list[bool]
) -> None:
    """Any sequence of statuses, each commit on either path by a store that read the session (or one that did
    not): the head moves on every commit (a load has every event, the running index its time); the listed row
    moves on every commit but a step (``running`` after ``running``); a writer one version behind the head is
    refused whatever the listed version says."""
    app = f"app-{uuid.uuid4().hex[:12]}"
    stores = {True: dynamo_store(dynamodb_table, client=ddb, single_call_items=0)}
    stores[False] = dynamo_store(dynamodb_table, client=ddb, single_call_items=100)
    # Writers that read the session just before each commit and commit on what they read after it: one that
    # builds on the item it read (one call), one that goes through the gate.
    late = [dynamo_store(dynamodb_table, client=ddb, single_call_items=n) for n in (100, 0)]
    listed = None
    with frozen_clock(1_800_000_000_000) as clock:
        for version, status in enumerate(statuses):
            for writer in late:
                writer.load(app, "s-1")
            store = stores[gated[version]]
            assert store.commit(_row(app, status=status), [_event(version)], version).ok, (version, status)
            step = version > 0 and status == "running" and statuses[version - 1] == "running"
            listed = listed if step else (version + 1, clock.ms)
            for writer in late if version else ():
                stale = writer.commit(_row(app, status=status), [_event("stale")], version)
                assert (stale.ok, stale.version) == (False, version + 1)
            loaded = store.load(app, "s-1")
            assert loaded is not None and loaded.row.version == version + 1
            assert [e.id for e in loaded.events] == [f"evt-{n}" for n in range(version + 1)]
            assert loaded.row.updated_at == clock.ms
            (shown,) = store.list(app)
            assert (shown.version, shown.updated_at, shown.status) == (*listed, status)
            running = [r for r in store.running_sessions() if r.app_name == app]
            assert [r.updated_at for r in running] == ([clock.ms] if status == "running" else [])
            clock.advance(1000)


def _as_the_earlier_layout(ddb: Any, table: str, app: str, sid: str) -> int:
    """Make the session's entry what the layout before this one kept: a touch ``T#{lsk}`` carrying the listed row,
    the meta item without ``lpk``/``spk``. Returns its ``updated_at``."""
    key = {"pk": {"S": session_pk(app, sid)}, "sk": {"S": "#M"}}
    meta = ddb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    touch = {
        name: meta[name] for name in ("pk", "lpk", "lsk", "spk", "version", "status", "created_at") if name in meta
    }
    touch |= {"sk": {"S": f"T#{int(meta['lsk']['N']):013d}"}, "t": {"S": "0badc0de"}}
    ddb.put_item(TableName=table, Item=touch)
    ddb.update_item(TableName=table, Key=key, UpdateExpression="REMOVE lpk, spk, g")
    return int(meta["lsk"]["N"])


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_a_session_listed_by_an_earlier_layouts_touch_moves_to_its_meta_item_at_its_next_commit(
    ddb: Any, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """A session written by the layout before this one is listed by its touch until its next commit, which
    deletes that touch in its own write (a transaction) and makes the meta item the entry: listed once throughout,
    by status too, and no touch left behind, whichever commit path takes it."""
    store = dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items)
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app, status="idle"), [_event(1)], 0).ok
        at = _as_the_earlier_layout(ddb, dynamodb_table, app, "s-1")
        reader = dynamo_store(dynamodb_table, client=ddb)
        assert [(s.id, s.version, s.updated_at) for s in reader.list(app)] == [("s-1", 1, at)]
        assert [s.id for s in reader.list(app, status="idle")] == ["s-1"]
        clock.advance(1000)
        store.load(app, "s-1")  # the store knows the meta item as stored now: no lpk
        assert store.commit(_row(app, status="running"), [_event(2)], 1).ok
        assert _touches(ddb, dynamodb_table, app, "s-1") == []  # the earlier layout's entry went with the commit
        (entry,) = _entries(ddb, dynamodb_table, app, "s-1")
        assert entry["sk"]["S"] == "#M"
        assert [(s.id, s.version, s.updated_at) for s in reader.list(app)] == [("s-1", 2, at + 1000)]
        assert reader.list(app, status="idle") == [] and [s.id for s in reader.list(app, status="running")] == ["s-1"]


def test_a_listing_shows_only_committed_rows_whatever_touches_are_left(
    ddb: Any, layout_table: Callable[..., str], app: str
) -> None:
    dynamodb_table = layout_table(2)
    store = dynamo_store(dynamodb_table, client=ddb, listing_shards=2)
    with frozen_clock(1_800_000_000_000) as clock:
        for n in range(5):
            for version in range(3):
                assert store.commit(_row(app, f"s{n}"), [_event(f"{n}-{version}")], version).ok
                clock.advance(10)
        # A commit in flight: its events are written, its finish (which carries its touch) is not.
        dying = local_client(ddb.meta.endpoint_url)
        faults = Faults(dying)
        faults.die("UpdateItem", nth=2)  # the finish (the gate is the first)
        clock.advance(10)
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying, listing_shards=2).commit(
                _row(app, "s0", status="late"), [_event("late")], 3
            )
        dying.close()
        assert len(_entries(ddb, dynamodb_table, app, "s0")) == 1  # its meta item, at the committed commit
        listed = store.list(app)
        assert [s.id for s in listed] == ["s4", "s3", "s2", "s1", "s0"]  # once each, s0 at its committed place
        assert [(s.version, s.status) for s in listed][-1] == (3, None)
        pages, cursor = [], None
        while page := store.list(app, limit=2, cursor=cursor):
            pages += [s.id for s in page]
            cursor = page[-1].cursor
        assert pages == ["s4", "s3", "s2", "s1", "s0"]

        # Repair finds an event item missing (deleted here), so it rolls the commit back: its touch goes too.
        late_id = {"S": "evt-late"}
        (event_item,) = [i for i in _raw_items(ddb, dynamodb_table, session_pk(app, "s0")) if i.get("eid") == late_id]
        ddb.delete_item(TableName=dynamodb_table, Key={"pk": event_item["pk"], "sk": event_item["sk"]})
        (report,) = dynamo_store(dynamodb_table, client=ddb, listing_shards=2).repair_pending(older_than_s=0)
        assert report.action == "rolled_back"
        assert len(_entries(ddb, dynamodb_table, app, "s0")) == 1
        assert [s.id for s in store.list(app)] == ["s4", "s3", "s2", "s1", "s0"]
        clock.advance(10)
        assert store.commit(_row(app, "s0"), [_event("again")], 3).ok
        assert [s.id for s in store.list(app)] == ["s0", "s4", "s3", "s2", "s1"]
        store.delete(app, "s1")
        assert [s.id for s in store.list(app)] == ["s0", "s4", "s3", "s2"]


def test_a_rolled_back_commit_in_the_same_millisecond_keeps_the_live_touch(
    ddb: Any, dynamodb_table: str, app: str
) -> None:
    store = dynamo_store(dynamodb_table, client=ddb)
    with frozen_clock(1_800_000_000_000):  # every commit at the same updated_at: one touch key for all
        assert store.commit(_row(app), [_event(1)], 0).ok
        dying = local_client(ddb.meta.endpoint_url)
        Faults(dying).die("UpdateItem", nth=2)  # the finish
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(_row(app), [_event(2), _event(3)], 1)
        dying.close()
        items = _raw_items(ddb, dynamodb_table, session_pk(app, "s-1"))
        (event_item,) = [i for i in items if i.get("eid") == {"S": "evt-3"}]
        ddb.delete_item(TableName=dynamodb_table, Key={"pk": event_item["pk"], "sk": event_item["sk"]})
        (report,) = store.repair_pending(older_than_s=0)
        assert report.action == "rolled_back"
        assert len(_entries(ddb, dynamodb_table, app, "s-1")) == 1 and _touches(ddb, dynamodb_table, app, "s-1") == []
        assert [(s.id, s.version) for s in store.list(app)] == [("s-1", 1)]


def test_repair_rolls_back_a_commit_with_no_events_that_never_finished(ddb: Any, dynamodb_table: str, app: str) -> None:
    """A commit with no events writes nothing between its gate and its finish (which carries its touch):
    nothing shows its writer got past the gate, so it is undone."""
    store = dynamo_store(dynamodb_table, client=ddb)
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app), [_event(1)], 0).ok
        clock.advance(1000)
        dying = local_client(ddb.meta.endpoint_url)
        Faults(dying).die("UpdateItem", nth=2)  # the finish, which moves the listing entry
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(_row(app, status="done"), [], 1)
        dying.close()
        (report,) = store.repair_pending(older_than_s=0)
        assert (report.action, report.items_found, report.items_expected) == ("rolled_back", 0, 0)
        assert [(s.id, s.version, s.status) for s in store.list(app)] == [("s-1", 1, None)]
        assert len(_entries(ddb, dynamodb_table, app, "s-1")) == 1 and _touches(ddb, dynamodb_table, app, "s-1") == []


def _strip_touch_flag(ddb: Any, table: str, app: str, sid: str) -> None:
    """Make the session's pending marker one written before touches could ride in the finish."""
    ddb.update_item(
        TableName=table,
        Key={"pk": {"S": session_pk(app, sid)}, "sk": {"S": "#M"}},
        UpdateExpression="REMOVE pending.f",
        ConditionExpression="attribute_exists(pending.f)",
    )


def test_an_old_marker_still_needs_its_touch_to_roll_forward(ddb: Any, dynamodb_table: str, app: str) -> None:
    """A marker without the flag was written by a writer that put its touch last in its batches: all of its
    event items without the touch means that writer died before its last batch completed. Rolled back."""
    store = dynamo_store(dynamodb_table, client=ddb)
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app), [_event(1)], 0).ok
        clock.advance(1000)
        dying = local_client(ddb.meta.endpoint_url)
        Faults(dying).die("UpdateItem", nth=2)  # the finish, after the 24 events
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(_row(app), [_event(n) for n in range(2, 26)], 1)
        dying.close()
        _strip_touch_flag(ddb, dynamodb_table, app, "s-1")
        (report,) = store.repair_pending(older_than_s=0)
        assert (report.action, report.items_found, report.items_expected) == ("rolled_back", 24, 24)
        assert [(s.id, s.version) for s in store.list(app)] == [("s-1", 1)]


def test_an_old_marker_with_its_touch_rolls_forward_and_the_meta_item_takes_over_the_entry(
    ddb: Any, dynamodb_table: str, app: str
) -> None:
    """A marker without the flag whose writer (the layout before this one) put its touch last in its batches and
    died before its finish: rolled forward, and the finish deletes that touch as it makes the meta item the
    session's entry, so the session is listed once, at the rolled-forward commit."""
    store = dynamo_store(dynamodb_table, client=ddb)
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app), [_event(1)], 0).ok
        at = clock.advance(1000)
        dying = local_client(ddb.meta.endpoint_url)
        Faults(dying).die("UpdateItem", nth=2)  # the finish, after its 7 events
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(
                _row(app, status="done"), [_event(n) for n in range(2, 9)], 1
            )
        dying.close()
        _strip_touch_flag(ddb, dynamodb_table, app, "s-1")
        key = {"pk": {"S": session_pk(app, "s-1")}, "sk": {"S": "#M"}}
        meta = ddb.get_item(TableName=dynamodb_table, Key=key, ConsistentRead=True)["Item"]
        grant, lpk = meta["pending"]["M"]["t"]["S"], meta["lpk"]["S"]
        ddb.put_item(  # what that writer put last: its touch, the commit's listing entry
            TableName=dynamodb_table,
            Item={
                "pk": key["pk"],
                "sk": {"S": f"T#{at:013d}"},
                "lpk": {"S": lpk},
                "lsk": {"N": str(at)},
                "spk": {"S": f"done#{lpk}"},
                "t": {"S": grant},
                "version": {"N": "2"},
                "status": {"S": "done"},
            },
        )
        (report,) = store.repair_pending(older_than_s=0)
        assert (report.action, report.items_found) == ("rolled_forward", 7)
        assert _touches(ddb, dynamodb_table, app, "s-1") == []
        assert [(s.id, s.version, s.status, s.updated_at) for s in store.list(app)] == [("s-1", 2, "done", at)]


# -- the running index: what the sweeper reads, written only on a change of status into or out of running --


def _running_entry(ddb: Any, table: str, app: str, sid: str) -> str | None:
    key = {"pk": {"S": session_pk(app, sid)}, "sk": {"S": "#M"}}
    item = ddb.get_item(TableName=table, Key=key, ConsistentRead=True)
    return item.get("Item", {}).get("rpk", {}).get("S")


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_the_running_index_is_written_only_when_a_session_goes_into_or_out_of_running(
    ddb: Any, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """A session's running entry is put by the commit that makes it ``running`` and deleted by the one that
    ends that: the commits in between (a new ``updated_at``, new events) write no index entry. And no call
    is added: a 5-event commit stays one transaction, or a gate, one batch and a finish (what a commit building
    on a running session takes, as it bills fewer units)."""
    store = _warm(dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items))
    gated = {"UpdateItem": 2, "BatchWriteItem": 1}  # the gate, the events, the finish (it moves the entry)
    units, faults = _Units(ddb), Faults(ddb)
    statuses = ["idle", "running", "running", "running", "completed", "completed", "running"]
    expected_units = [0, 1, 0, 0, 1, 0, 1]
    with frozen_clock(1_800_000_000_000) as clock:
        for version, (status, cost) in enumerate(zip(statuses, expected_units, strict=True)):
            faults.calls.clear()
            assert store.commit(_row(app, status=status), [_event(f"{version}-{n}") for n in range(5)], version).ok
            one_call = single_call_items and statuses[version - 1 : version] != ["running"]
            billed = 2 if one_call else 1  # in a transaction billed twice; the gated finish is an update
            assert units.take("running") == cost * billed, (version, status)
            assert dict(faults.calls) == ({"TransactWriteItems": 1} if one_call else gated), (version, status)
            clock.advance(1000)
    assert _running_entry(ddb, dynamodb_table, app, "s-1") is not None
    assert [(r.session_id, r.updated_at) for r in store.running_sessions() if r.app_name == app] == [
        ("s-1", 1_800_000_006_000)
    ]


def test_a_repair_carries_the_running_entry_with_the_status(ddb: Any, dynamodb_table: str, app: str) -> None:
    """A writer that died after its events: rolled forward, the running status lands with its entry; one that
    died before them: rolled back, the status (and the entry) stay as they were."""
    store = dynamo_store(dynamodb_table, client=ddb)
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app, "s-fwd", status="idle"), [_event(1)], 0).ok
        assert store.commit(_row(app, "s-back", status="running"), [_event(1)], 0).ok
        clock.advance(1000)
        dying = local_client(ddb.meta.endpoint_url)
        Faults(dying).die("UpdateItem", nth=2)  # the finish, after the events
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(_row(app, "s-fwd", status="running"), [_event(2)], 1)
        Faults(dying).die("BatchWriteItem", nth=1)  # the events: nothing of the commit but its gate
        with pytest.raises(Died):
            dynamo_store(dynamodb_table, client=dying).commit(_row(app, "s-back", status="completed"), [_event(2)], 1)
        dying.close()
        assert _running_entry(ddb, dynamodb_table, app, "s-fwd") is None
        assert [r.session_id for r in store.running_sessions() if r.app_name == app] == ["s-back"]
        reports = {r.session_id: r.action for r in store.repair_pending(older_than_s=0) if r.app_name == app}
        assert reports == {"s-fwd": "rolled_forward", "s-back": "rolled_back"}
        assert [r.session_id for r in store.running_sessions() if r.app_name == app] == ["s-back", "s-fwd"]
        assert _running_entry(ddb, dynamodb_table, app, "s-fwd") is not None


def test_running_sessions_skip_an_expired_session_and_an_entry_the_index_still_holds(
    ddb: Any, dynamodb_table: str, app: str
) -> None:
    """The index still holds an expired session's entry until AWS's TTL deletes its meta item, and on AWS it
    lags the table (an entry outlives the commit that ended the run for a moment): neither is listed, as the
    meta item decides."""
    store = dynamo_store(dynamodb_table, client=ddb)
    hour = 3_600_000
    assert store.commit(_row(app, "s-ended", status="completed"), [_event(1)], 0).ok
    ddb.update_item(  # what a lagging index shows: the entry of the session's running days
        TableName=dynamodb_table,
        Key={"pk": {"S": session_pk(app, "s-ended")}, "sk": {"S": "#M"}},
        UpdateExpression="SET rpk = :r",
        ExpressionAttributeValues={":r": {"S": "R#0"}},
    )
    with frozen_clock(1_800_000_000_000) as clock:
        assert store.commit(_row(app, "s-old", status="running", retention_ms=hour), [_event(1)], 0).ok
        assert store.commit(_row(app, "s-live", status="running"), [_event(1)], 0).ok
        running = [r.session_id for r in store.running_sessions() if r.app_name == app]
        assert running == ["s-live", "s-old"]  # the same updated_at: by id
        clock.advance(hour + 1000)
        assert [r.session_id for r in store.running_sessions() if r.app_name == app] == ["s-live"]


# -- calls per commit: 2 + ceil(2 x events / 25), whatever the count ------------------------------


def test_the_touch_rides_in_the_finish_exactly_when_the_batches_have_no_room_for_it() -> None:
    """Every item count a commit can have (chunks included): after the events, the touch and the marking
    (a create has no marking) would add a batch exactly when the finish carries them instead."""
    for create, touches in ((True, 1), (False, 2)):
        for items in range(30_001):
            spills = -(-(items + touches) // 25) > -(-items // 25)
            assert _touch_in_finish(items, create) == spills, (items, create)


@pytest.mark.parametrize("count", [0, 1, 5, 23, 24, 25, 26, 49, 50])
def test_every_commit_takes_at_most_two_calls_plus_one_per_25_items(
    ddb: Any, dynamodb_table: str, app: str, count: int
) -> None:
    store = _warm(dynamo_store(dynamodb_table, client=ddb))
    faults = Faults(ddb)
    bound = 2 + -(-2 * count // 25)  # the gated protocol's batches: each event's item and its id item
    serial = iter(range(100_000))

    def commit(row: StoredSession, version: int, changes: list[ScopedStateChange] | None = None) -> None:
        events = [_event(f"{next(serial):05d}") for _ in range(count)]
        faults.calls.clear()
        result = store.commit(row, events, version, changes)
        calls = sum(faults.calls.values())
        assert (result.ok, result.version, result.appended) == (True, version + 1, count)
        assert calls <= bound, f"{row.id} at version {version}: {calls} calls ({dict(faults.calls)}), bound {bound}"

    with frozen_clock(1_800_000_000_000) as clock:
        plain, bound_to = _row(app, "plain"), _row(app, "bound", scopes={"user": "u-1", "org": "o-1"})
        commit(plain, 0)  # a create
        commit(bound_to, 0)  # a create of a session bound to shared scopes (its binding entries)
        for version in (1, 2, 3):  # each commit also deletes the touch it superseded
            clock.advance(1000)
            commit(bound_to, version)
        clock.advance(1000)
        commit(bound_to, 4, [ScopedStateChange("user", "u-1", "seen", count), ScopedStateChange("org", "o-1", "k", 1)])
        clock.advance(1000)
        commit(plain, 1, [ScopedStateChange("user", "u-2", "k", count)])

    # Whole, listed once each at its last commit, bound as it was created, the scoped changes landed.
    listed = {s.id: (s.version, s.updated_at) for s in store.list(app)}
    assert listed == {"bound": (5, 1_800_000_004_000), "plain": (2, 1_800_000_005_000)}
    loaded = store.load(app, "bound")
    assert loaded is not None and len(loaded.events) == 5 * count
    assert [e.id for e in loaded.events] == sorted(e.id for e in loaded.events)
    assert store.bound_sessions(app, "user", "u-1") == ["bound"]
    assert store.load_scoped_state(app, "user", "u-1") == {"seen": count}
    assert store.load_scoped_state(app, "user", "u-2") == {"k": count}
    (live,) = _entries(ddb, dynamodb_table, app, "bound")  # its meta item, moved by each commit
    assert int(live["lsk"]["N"]) == 1_800_000_004_000


# -- shard counts: fixed when the table is first used ---------------------------------------------------


def test_the_table_records_its_shard_counts_and_refuses_a_store_with_others(ddb: Any, app: str) -> None:
    name = f"dormant-layout-{uuid.uuid4().hex[:8]}"
    create_table(name, client=ddb)
    try:
        first = dynamo_store(name, client=ddb, listing_shards=2, pending_shards=3)
        assert first.commit(_row(app), [_event(1)], 0).ok
        layout = ddb.get_item(TableName=name, Key={"pk": {"S": "#layout"}, "sk": {"S": "#layout"}})["Item"]
        assert (layout["listing_shards"]["N"], layout["pending_shards"]["N"]) == ("2", "3")
        for listing, pending in ((2, 8), (4, 3)):
            other = dynamo_store(name, client=ddb, listing_shards=listing, pending_shards=pending)
            faults = Faults(ddb)
            with pytest.raises(ConfigurationError) as info:
                other.commit(_row(app, "s-2"), [_event(2)], 0)
            message = str(info.value)
            assert "listing_shards=2 and pending_shards=3" in message  # the table's
            assert f"listing_shards={listing} and pending_shards={pending}" in message  # the store's
            assert dict(faults.calls) == {"GetItem": 1}  # refused before anything was written
            with pytest.raises(ConfigurationError):  # every call, not only the first
                other.list(app)
        assert [s.id for s in first.list(app)] == ["s-1"]
        same = dynamo_store(name, client=ddb, listing_shards=2, pending_shards=3)
        assert [s.id for s in same.list(app)] == ["s-1"]
    finally:
        ddb.delete_table(TableName=name)


# -- listings while the index lags ------------------------------------------------------------------------


class _Answered:
    status_code = 200
    headers: dict[str, str] = {}  # noqa: RUF012


class _StaleIndex:
    """A botocore hook on a client that makes the listing index lag: each listing ``Query`` is answered with what
    the index returned to the same query the time before (run then on a clean client), as a global index that
    has not caught up with the commits since would answer."""

    def __init__(self, client: Any, clean: Any) -> None:
        self.clean = clean
        self.previous: dict[str, dict[str, Any]] = {}
        self.lagged = 0
        self._local = threading.local()
        client.meta.events.register("before-parameter-build.dynamodb.Query", self._params)
        client.meta.events.register("before-call.dynamodb.Query", self._answer)

    def _params(self, params: dict[str, Any], **_: Any) -> None:
        self._local.params = dict(params) if params.get("IndexName") == "listing" else None

    def _answer(self, **_: Any) -> Any:
        params = getattr(self._local, "params", None)
        if params is None:
            return None
        key = json.dumps(params, sort_keys=True, default=str)
        now = self.clean.query(**params)
        answer = self.previous.get(key, now)
        self.lagged += answer is not now
        self.previous[key] = now
        return _Answered(), answer


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_a_listing_never_omits_a_committed_session_while_the_index_lags(
    ddb: Any, dynamodb_endpoint: str, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """Commits and listings interleaved, the index one listing behind: every session committed before the index's
    view is listed, once, at a version no older than the one it had then (the index still holds its previous
    touch until it catches up: never nothing)."""
    writer = dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items)
    lister_client, clean = local_client(dynamodb_endpoint), local_client(dynamodb_endpoint)
    stale = _StaleIndex(lister_client, clean)
    lister = dynamo_store(dynamodb_table, client=lister_client)
    committed: dict[str, int] = {}
    in_view: dict[str, int] = {}  # what was committed when the index took the view it answers with now
    try:
        with frozen_clock(1_800_000_000_000) as clock:
            for round_ in range(6):
                for n in range(round_ + 1):  # every session so far takes a commit, and one more is created
                    sid = f"s{n}"
                    version = committed.get(sid, 0)
                    clock.advance(7)
                    row = _row(app, sid, status=f"r{round_}")
                    assert writer.commit(row, [_event(f"{sid}-{version}")], version).ok
                    committed[sid] = version + 1
                    listed = lister.list(app)
                    ids = [s.id for s in listed]
                    assert len(ids) == len(set(ids)), ids  # never twice
                    versions = {s.id: s.version for s in listed}
                    missing = {sid: v for sid, v in in_view.items() if versions.get(sid, 0) < v}
                    assert not missing, (round_, n, missing, versions)
                    in_view = dict(committed)
        assert stale.lagged > 10  # the hook did make the index lag
        caught_up = dynamo_store(dynamodb_table, client=clean)  # the index as it is now: every newest version
        assert {s.id: s.version for s in caught_up.list(app)} == committed
    finally:
        lister_client.close()
        clean.close()


# -- sessions at scale: 50,000 events, 100 MB ------------------------------------------------------------


@pytest.mark.slow
def test_a_session_of_50000_events_commits_loads_and_takes_one_call_turns(
    ddb: Any, dynamodb_table: str, app: str
) -> None:
    """Five commits of 10,000 events (the gated protocol: 400 batches each), then an ordinary turn, one call."""
    store = _warm(dynamo_store(dynamodb_table, client=ddb))
    ids = [new_id() for _ in range(50_000)]  # in the order they are made, as dormant mints them
    for version in range(5):
        events = [UserEvent(id=i, created_at=1, text="x") for i in ids[version * 10_000 : (version + 1) * 10_000]]
        assert store.commit(_row(app, "long"), events, version).ok
    loaded = store.load(app, "long")
    assert loaded is not None and len(loaded.events) == 50_000 and loaded.row.version == 5
    faults = Faults(ddb)
    assert store.commit(_row(app, "long"), [UserEvent(id=new_id(), created_at=1, text="turn")], 5).ok
    assert dict(faults.calls) == {"TransactWriteItems": 1}
    resent = store.commit(_row(app, "long"), [UserEvent(id=ids[12_345], created_at=1, text="again")], 6)
    assert (resent.ok, resent.appended) == (True, 0)  # a re-sent id, found among 50,000
    assert [(s.id, s.version) for s in store.list(app)] == [("long", 7)]


@pytest.mark.slow
def test_a_session_of_100_mb_commits_and_loads(ddb: Any, dynamodb_table: str, app: str) -> None:
    """100 events of 1 MB (3 items each) in four commits of 25 MB, then a one-call turn on top."""
    store = _warm(dynamo_store(dynamodb_table, client=ddb))
    text = "y" * 1_000_000
    for version in range(4):
        events = [UserEvent(id=f"b{version * 25 + n:04d}", created_at=1, text=text) for n in range(25)]
        assert store.commit(_row(app, "big"), events, version).ok
    assert store.commit(_row(app, "big"), [UserEvent(id=new_id(), created_at=1, text="small")], 4).ok
    loaded = store.load(app, "big")
    assert loaded is not None and len(loaded.events) == 101
    assert sum(len(e.text) for e in loaded.events if isinstance(e, UserEvent)) >= 100_000_000


def test_a_load_reads_the_meta_item_and_the_events_not_their_id_items(
    store: DynamoDBSessionStore, ddb: Any, app: str
) -> None:
    assert store.commit(_row(app), [_event(n) for n in range(5)], 0).ok
    counts: list[int] = []
    ddb.meta.events.register("after-call.dynamodb.Query", lambda parsed, **_: counts.append(parsed["Count"]))
    loaded = store.load(app, "s-1")
    assert loaded is not None and len(loaded.events) == 5
    assert counts == [1 + 5]  # the meta item and 5 event items: the 5 id items and the touch sort after them


def _index_entries(ddb: Any, table: str, app: str, shards: int = 4) -> list[dict[str, Any]]:
    """The listing and status index entries of ``app``'s sessions (every shard), read from the indexes."""
    entries: list[dict[str, Any]] = []
    for lpk in listing_keys(app, shards):
        entries += ddb.query(
            TableName=table,
            IndexName=LISTING_INDEX,
            KeyConditionExpression="lpk = :k",
            ExpressionAttributeValues={":k": {"S": lpk}},
        )["Items"]
        for status in ("waiting", "late"):
            entries += ddb.query(
                TableName=table,
                IndexName=STATUS_INDEX,
                KeyConditionExpression="spk = :k",
                ExpressionAttributeValues={":k": {"S": f"{status}#{lpk}"}},
            )["Items"]
    return entries


@pytest.mark.parametrize("single_call_items", [0, 100], ids=["gated", "one-call"])
def test_a_delete_leaves_none_of_the_sessions_touches_behind(
    ddb: Any, dynamodb_table: str, app: str, single_call_items: int
) -> None:
    """A touch left behind is a listing (and status) index entry of a session that is gone."""
    store = dynamo_store(dynamodb_table, client=ddb, single_call_items=single_call_items)
    with frozen_clock(1_800_000_000_000) as clock:
        for version, status in enumerate(("waiting", "late", "waiting")):
            assert store.commit(_row(app, status=status), [_event(version)], version).ok
            clock.advance(10)
        assert store.commit(_row(app, "s-2", status="late"), [_event("other")], 0).ok
        assert len(_entries(ddb, dynamodb_table, app, "s-1")) == 1 and _touches(ddb, dynamodb_table, app, "s-1") == []
        assert len(_index_entries(ddb, dynamodb_table, app)) == 4  # each session's touch, in both indexes
        store.delete(app, "s-1")
        assert _raw_items(ddb, dynamodb_table, session_pk(app, "s-1")) == []
        assert [e["pk"]["S"] for e in _index_entries(ddb, dynamodb_table, app)] == [session_pk(app, "s-2")] * 2
        assert [s.id for s in store.list(app)] == ["s-2"] and store.load(app, "s-1") is None
