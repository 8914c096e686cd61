"""``dormant migrate-table`` on release 0.1's table and on one of this release (DynamoDB Local), and the store
refusing an old layout."""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")


from dormant.clock import now_ms
from dormant.errors import ConfigurationError
from dormant.stores.base import StoredSession
from dormant.stores.dynamodb import create_table, dynamo_store
from dormant.stores.dynamodb.keys import session_pk
from dormant.stores.dynamodb.migrate import PROGRESS_PK, MigrationReport, migrate_table
from tests.support.dynamodb_faults import Died, Faults
from tests.support.release_fixtures import APP, DONE, WAITING, old_dynamodb_table, write_sessions

pytestmark = pytest.mark.backend("dynamodb")

RELEASE = "release-0.1"


@pytest.fixture
def tables(ddb: Any) -> Iterator[list[str]]:
    """Tables a test makes, deleted after it (a test that failed before making one leaves it out)."""
    made: list[str] = []
    yield made
    for table in made:
        with contextlib.suppress(ddb.exceptions.ResourceNotFoundException):
            ddb.delete_table(TableName=table)


def _old(ddb: Any, tables: list[str]) -> str:
    tables.append(old_dynamodb_table(ddb, RELEASE))
    return tables[-1]


def _current(ddb: Any, tables: list[str]) -> str:
    """A table of this release's layout holding the fixture sessions, as this release's store wrote them."""
    tables.append(f"current-{uuid.uuid4().hex[:8]}")
    create_table(tables[-1], client=ddb)
    write_sessions(dynamo_store(tables[-1], client=ddb))
    return tables[-1]


def _source(ddb: Any, tables: list[str], layout: str) -> str:
    return _old(ddb, tables) if layout == RELEASE else _current(ddb, tables)


def _puts(faults: Faults, table: str) -> Counter[tuple[str, str]]:
    """The keys put into ``table`` (batches and single puts), counted, but its progress and layout items."""
    items = []
    for operation, params in faults.params:
        if operation == "BatchWriteItem":
            items += [r["PutRequest"]["Item"] for r in params["RequestItems"].get(table, []) if "PutRequest" in r]
        elif operation == "PutItem" and params["TableName"] == table:
            items.append(params["Item"])
    return Counter((i["pk"]["S"], i["sk"]["S"]) for i in items if i["pk"]["S"] not in (PROGRESS_PK, "#layout"))


def _new(tables: list[str]) -> str:
    tables.append(f"migrated-{uuid.uuid4().hex[:8]}")
    return tables[-1]


def _items(ddb: Any, table: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every item but the migration's progress item, by key."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = ddb.scan(**kwargs)
        found |= {(i["pk"]["S"], i["sk"]["S"]): i for i in page["Items"] if i["pk"]["S"] != PROGRESS_PK}
        if "LastEvaluatedKey" not in page:
            return found
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_the_store_refuses_an_old_layout_naming_the_command_and_writes_nothing(ddb: Any, tables: list[str]) -> None:
    old = _old(ddb, tables)
    store = dynamo_store(old, client=ddb)
    faults = Faults(ddb)
    with pytest.raises(ConfigurationError, match="local index 'ids'") as info:
        store.load(APP, DONE)
    assert f"dormant migrate-table --from {old} --to NEW_TABLE" in str(info.value)
    assert dict(faults.calls) == {"GetItem": 1, "DescribeTable": 1}
    with pytest.raises(ConfigurationError):  # every call, not only the first
        store.commit(StoredSession(id="s-new", app_name=APP, created_at=1), [], 0)
    assert ddb.get_item(TableName=old, Key={"pk": {"S": "#layout"}, "sk": {"S": "#layout"}}).get("Item") is None

    # A table an earlier store recorded its counts on (no format: it had the local index) is refused from that
    # item alone, without asking for the table's shape.
    earlier = _new(tables)
    create_table(earlier, client=ddb)
    layout = {
        "pk": {"S": "#layout"},
        "sk": {"S": "#layout"},
        "listing_shards": {"N": "4"},
        "pending_shards": {"N": "8"},
    }
    ddb.put_item(TableName=earlier, Item=layout)
    faults.calls.clear()
    with pytest.raises(ConfigurationError, match=r"format 1.*dormant migrate-table"):
        dynamo_store(earlier, client=ddb).load(APP, DONE)
    assert dict(faults.calls) == {"GetItem": 1}


def test_a_new_table_is_checked_once_and_records_its_format(ddb: Any, tables: list[str]) -> None:
    table = _new(tables)
    create_table(table, client=ddb)
    faults = Faults(ddb)
    dynamo_store(table, client=ddb).load(APP, DONE)
    assert faults.calls["DescribeTable"] == 1  # the first store on the table checks its shape...
    layout = ddb.get_item(TableName=table, Key={"pk": {"S": "#layout"}, "sk": {"S": "#layout"}})["Item"]
    assert layout["format"] == {"N": "2"}
    faults.calls.clear()
    dynamo_store(table, client=ddb).load(APP, DONE)
    assert dict(faults.calls) == {"GetItem": 1, "Query": 1}  # ...and every later one reads the recorded format


def test_migrated_sessions_load_list_commit_and_know_their_ids(ddb: Any, tables: list[str]) -> None:
    old, new = _old(ddb, tables), _new(tables)
    report = migrate_table(ddb, old, new)
    assert report.created and not report.resumed
    assert (report.sessions, report.touches, report.scoped, report.not_copied) == (2, 2, 2, 0)
    assert report.events == report.id_items == 27  # 9 events of one session, 18 of the other
    store = dynamo_store(new, client=ddb, single_call_items=0)
    done = store.load(APP, DONE)
    assert done is not None and done.row.version == 3 and done.row.status == "completed"
    listed = [(s.id, s.version, s.status) for s in store.list(APP)]
    assert listed == [(WAITING, 2, "awaiting_input"), (DONE, 3, "completed")]  # one clock: by id

    # Every event id release 0.1 stored is known: re-sent, on the gated path and on the one-call path, none is
    # appended again (their id items are read; no index).
    stored = [e for e in done.events]
    faults = Faults(ddb)
    again = store.commit(done.row, stored[:3], 3)
    assert (again.ok, again.appended) == (True, 0)
    assert faults.calls["BatchGetItem"] == 1
    one_call = dynamo_store(new, client=ddb)
    loaded = one_call.load(APP, DONE)
    assert loaded is not None
    mixed = [stored[-1], *stored[3:5]]
    again = one_call.commit(loaded.row, mixed, loaded.row.version)
    assert (again.ok, again.appended) == (True, 0)
    reloaded = store.load(APP, DONE)
    assert reloaded is not None and [e.id for e in reloaded.events] == [e.id for e in stored]


def test_migration_resumes_where_it_stopped_and_a_second_pass_writes_nothing_twice(ddb: Any, tables: list[str]) -> None:
    old, new, whole = _old(ddb, tables), _new(tables), _new(tables)
    # A session its runner left running: the new table's running index must find it.
    key = {"pk": {"S": f"S#{APP}#{WAITING}"}, "sk": {"S": "#M"}}
    ddb.update_item(
        TableName=old,
        Key=key,
        UpdateExpression="SET #s = :r",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":r": {"S": "running"}},
    )

    class Stop(Exception):
        pass

    def stop_after_two(report: MigrationReport) -> None:
        if report.pages == 2:
            raise Stop

    with pytest.raises(Stop):
        migrate_table(ddb, old, new, page_size=5, on_page=stop_after_two)
    partial = _items(ddb, new)
    resumed = migrate_table(ddb, old, new, page_size=5)
    assert resumed.resumed and resumed.items_read < 31  # went on from the third page
    migrate_table(ddb, old, whole)  # the same copy, in one run
    copied = _items(ddb, new)
    assert set(partial) < set(copied)
    assert copied == _items(ddb, whole)

    again = migrate_table(ddb, old, new)  # a second full pass
    assert not again.resumed and again.items_read == 31
    assert _items(ddb, new) == copied  # the same items: none twice, none changed

    store = dynamo_store(new, client=ddb)
    assert [(r.app_name, r.session_id) for r in store.running_sessions()] == [(APP, WAITING)]
    # A session committed in the new table is never moved back by another pass.
    loaded = store.load(APP, WAITING)
    assert loaded is not None
    assert store.commit(loaded.row, [], loaded.row.version).ok
    later = migrate_table(ddb, old, new)
    assert later.kept_newer == 1
    reloaded = store.load(APP, WAITING)
    assert reloaded is not None and reloaded.row.version == loaded.row.version + 1
    assert [s.id for s in store.list(APP)].count(WAITING) == 1


def test_migrate_table_refuses_a_target_of_another_layout(ddb: Any, tables: list[str]) -> None:
    old, other = _old(ddb, tables), _old(ddb, tables)
    with pytest.raises(ConfigurationError, match="not of this release's layout"):
        migrate_table(ddb, old, other)
    with pytest.raises(ConfigurationError, match="same one"):
        migrate_table(ddb, old, old)


@pytest.mark.parametrize("counts", [{"listing_shards": 0}, {"pending_shards": 0}, {"listing_shards": -3}])
def test_a_shard_count_under_one_is_refused_not_read_as_the_default(
    ddb: Any, tables: list[str], counts: dict[str, int]
) -> None:
    old, target = _old(ddb, tables), _new(tables)  # the library says what the command line says: 0 is no count
    [name] = counts
    with pytest.raises(ConfigurationError, match=f"{name} is a whole number from 1 to 1000"):
        migrate_table(ddb, old, target, **counts)
    assert target not in ddb.list_tables()["TableNames"]  # refused before anything was made


LAYOUTS = [RELEASE, "this release"]


def test_a_table_of_this_release_is_copied_once_a_key_and_a_second_pass_puts_the_same_keys(
    ddb: Any, tables: list[str]
) -> None:
    """A table of this layout holds its id items already (an id stored in order has none: its event item's
    ``hi`` and the meta item's ``hv`` find it, copied with them): copied as they are, none derived next to them
    (which put two items of one key in one batch: "Provided list of item keys contains duplicates")."""
    old, new = _current(ddb, tables), _new(tables)
    id_items = [key for key in _items(ddb, old) if key[1].startswith("I#")]
    faults = Faults(ddb)
    report = migrate_table(ddb, old, new, page_size=7)
    assert report.pages > 2 and report.events == 27 and report.id_items == len(id_items) < 27
    first = _puts(faults, new)
    copied = _items(ddb, new)
    assert max(first.values()) == 1  # no key put twice in the run
    assert sum(first.values()) == report.written == len(copied) - 1  # every item the new table holds, its layout aside
    source = _items(ddb, old)
    for key, item in source.items():  # every item as it was (each meta item its own listing entry), but the layout
        if key[0] != "#layout":
            assert copied[key] == item, key
    assert not any(k[1].startswith("T#") for k in copied)  # no touch: the meta items are the listing entries

    faults.params.clear()
    again = migrate_table(ddb, old, new)
    second = _puts(faults, new)
    assert max(second.values()) == 1 and set(second) == set(first) and again.written == sum(second.values())
    assert _items(ddb, new) == copied

    store = dynamo_store(new, client=ddb)
    done, before = store.load(APP, DONE), dynamo_store(old, client=ddb).load(APP, DONE)
    assert done is not None and before is not None
    assert (done.row, [e.id for e in done.events]) == (before.row, [e.id for e in before.events])
    resent = store.commit(done.row, list(done.events), done.row.version)
    assert (resent.ok, resent.appended) == (True, 0)  # its id items came along: every id is known


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_copy_killed_midway_completes_when_run_again(ddb: Any, tables: list[str], layout: str) -> None:
    old, new, whole = _source(ddb, tables, layout), _new(tables), _new(tables)
    faults = Faults(ddb)
    faults.die("BatchWriteItem", nth=3)  # the process dies inside its third page, two pages written
    with pytest.raises(Died):
        migrate_table(ddb, old, new, page_size=10)
    resumed = migrate_table(ddb, old, new, page_size=10)
    assert resumed.resumed and resumed.items_read < len(_items(ddb, old))
    migrate_table(ddb, old, whole)
    assert _items(ddb, new) == _items(ddb, whole)
    store = dynamo_store(new, client=ddb)
    assert [s.id for s in store.list(APP)] == [WAITING, DONE]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_waiting_session_is_on_the_due_index_where_the_sweeper_reads(
    ddb: Any, tables: list[str], layout: str
) -> None:
    old, new = _source(ddb, tables, layout), _new(tables)
    migrate_table(ddb, old, new)
    meta = ddb.get_item(TableName=new, Key={"pk": {"S": session_pk(APP, WAITING)}, "sk": {"S": "#M"}})["Item"]
    assert meta["status"] == {"S": "awaiting_input"} and meta["dpk"]["S"].startswith("W#") and "rpk" not in meta
    store = dynamo_store(new, client=ddb)
    assert [(r.app_name, r.session_id) for r in store.due_waits(before=now_ms())] == [(APP, WAITING)]
    assert [(r.app_name, r.session_id, r.status) for r in store.waiting_sessions()] == [
        (APP, WAITING, "awaiting_input")
    ]
    assert store.running_sessions() == []


def test_derived_id_items_keep_their_events_expiry(ddb: Any, tables: list[str]) -> None:
    old, new = _old(ddb, tables), _new(tables)
    expiry = {"N": "4102444800"}  # 2100-01-01: a session with retention, every item expiring with it
    events = [i for k, i in _items(ddb, old).items() if k[0] == session_pk(APP, DONE) and k[1].startswith("E#")]
    for item in events:
        ddb.update_item(
            TableName=old,
            Key={"pk": item["pk"], "sk": item["sk"]},
            UpdateExpression="SET expires_at = :x",
            ExpressionAttributeValues={":x": expiry},
        )
    migrate_table(ddb, old, new)
    ids = [i for k, i in _items(ddb, new).items() if k[0] == session_pk(APP, DONE) and k[1].startswith("I#")]
    assert len(ids) == len({i["eid"]["S"] for i in events}) > 0
    assert all(i.get("expires_at") == expiry for i in ids)


def test_an_id_item_is_derived_from_the_live_event_never_a_rolled_back_writers(ddb: Any, tables: list[str]) -> None:
    """A rolled-back writer's event item (its grant in the meta item's ``dead``) holding an id a live event holds
    too: the id item names the live one, whichever sorts last."""
    old, new = _old(ddb, tables), _new(tables)
    pk = session_pk(APP, DONE)
    live = max(
        (i for k, i in _items(ddb, old).items() if k[0] == pk and k[1].startswith("E#")), key=lambda i: i["sk"]["S"]
    )
    _, version, grant, seq = live["sk"]["S"].split("#")
    dead = {**live, "sk": {"S": f"E#{version}#ffffffff#{seq}"}}  # sorts after every live grant of its version
    ddb.put_item(TableName=old, Item=dead)
    ddb.update_item(
        TableName=old,
        Key={"pk": {"S": pk}, "sk": {"S": "#M"}},
        UpdateExpression="ADD dead :d",
        ExpressionAttributeValues={":d": {"SS": [f"{int(version)}#ffffffff"]}},
    )
    migrate_table(ddb, old, new)
    id_item = _items(ddb, new)[pk, f"I#{live['eid']['S']}"]
    assert (id_item["v"], id_item["t"]) == ({"N": str(int(version))}, {"S": grant})
