"""``dormant migrate-table`` on release 0.1's table (DynamoDB Local), and the store refusing an old layout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")


from dormant.errors import ConfigurationError
from dormant.stores.base import StoredSession
from dormant.stores.dynamodb import create_table, dynamo_store
from dormant.stores.dynamodb.migrate import PROGRESS_PK, MigrationReport, migrate_table
from tests.support.dynamodb_faults import Faults
from tests.support.release_fixtures import APP, DONE, WAITING, old_dynamodb_table

pytestmark = pytest.mark.backend("dynamodb")

RELEASE = "release-0.1"


@pytest.fixture
def tables(ddb: Any) -> Iterator[list[str]]:
    """Tables a test makes, deleted after it."""
    made: list[str] = []
    yield made
    for table in made:
        ddb.delete_table(TableName=table)


def _old(ddb: Any, tables: list[str]) -> str:
    tables.append(old_dynamodb_table(ddb, RELEASE))
    return tables[-1]


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
