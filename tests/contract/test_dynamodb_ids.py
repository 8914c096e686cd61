"""Re-sent event ids on DynamoDB when only ids *not in order* get an id item (issue 36).

An id greater than every id stored before it (the meta item's ``hi``) is stored with no id item; its event item
carries ``hi`` (the greatest id once its commit landed), and a re-send finds it by a binary search over the
commits. These tests hold the store's promise against that layout: a re-sent id is never stored twice, a new
id is never taken for a stored one, across in-order, out-of-order and re-sent mixes, rolled-back grants,
repairs, and sessions an earlier layout wrote.
"""

from __future__ import annotations

import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dormant.clock import frozen_clock
from dormant.events import UserEvent
from dormant.stores.base import StoredSession
from dormant.stores.dynamodb import DynamoDBSessionStore
from dormant.stores.dynamodb.keys import session_pk
from tests.support.dynamodb_faults import Died, Faults
from tests.support.servers.dynamodb import client as local_client

pytestmark = pytest.mark.backend("dynamodb")

SATURATED = zlib.compress(b"\xff" * 2048)
"""A filter that flags every id not above ``hi``: as a long session's nearly is, so every such id is looked up."""


class Session:
    """One session on the shared table, with stores on either commit path and a raw client."""

    def __init__(self, endpoint: str, table: str) -> None:
        self.endpoint, self.table = endpoint, table
        self.app, self.sid = f"app-{uuid.uuid4().hex[:10]}", "s-1"
        self.pk = session_pk(self.app, self.sid)
        self.clients: list[Any] = []
        self.raw = self._client()

    def _client(self) -> Any:
        c = local_client(self.endpoint)
        self.clients.append(c)
        return c

    def store(self, client: Any = None, **options: Any) -> DynamoDBSessionStore:
        options = {"live_wait_s": 0.5, "unprocessed_retries": 3, **options}
        return DynamoDBSessionStore(client or self._client(), self.table, **options)

    def row(self) -> StoredSession:
        return StoredSession(id=self.sid, app_name=self.app, created_at=1)

    def ids(self) -> list[str]:
        loaded = self.store().load(self.app, self.sid)
        return [] if loaded is None else [e.id for e in loaded.events]

    def items(self, prefix: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.raw.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
            ExpressionAttributeValues={":pk": {"S": self.pk}, ":p": {"S": prefix}},
            ConsistentRead=True,
        )["Items"]
        return items

    def id_items(self) -> set[str]:
        return {item["sk"]["S"][2:] for item in self.items("I#")}

    def saturate(self) -> None:
        """Every id at or below ``hi`` flagged from here on (a filter full of ones)."""
        self.raw.update_item(
            TableName=self.table,
            Key={"pk": {"S": self.pk}, "sk": {"S": "#M"}},
            UpdateExpression="SET bf = :bf",
            ExpressionAttributeValues={":bf": {"B": SATURATED}},
        )

    def close(self) -> None:
        for c in self.clients:
            c.close()


@pytest.fixture
def session(dynamodb_endpoint: str, dynamodb_table: str) -> Iterator[Session]:
    s = Session(dynamodb_endpoint, dynamodb_table)
    yield s
    s.close()


def _events(ids: list[str]) -> list[UserEvent]:
    return [UserEvent(id=i, created_at=1, text=f"text of {i}") for i in ids]


def _commit(store: DynamoDBSessionStore, session: Session, ids: list[str], version: int) -> int:
    result = store.commit(session.row(), _events(ids), version)
    assert result.ok and result.version == version + 1, result
    return result.appended


# -- which ids get an id item ---------------------------------------------------------------------------


@pytest.mark.parametrize("single_call_items", [100, 0], ids=["one-call", "gated"])
def test_only_ids_not_in_order_get_an_id_item(session: Session, single_call_items: int) -> None:
    store = session.store(single_call_items=single_call_items)
    _commit(store, session, ["m-1", "m-2", "c-1", "m-3", "m-3a"], 0)  # c-1 < m-2: not in order
    _commit(store, session, ["a-9", "n-1", "b-1"], 1)  # a-9 and b-1 below m-3a
    assert session.id_items() == {"c-1", "a-9", "b-1"}
    firsts = {item["eid"]["S"]: item["hi"]["S"] for item in session.items("E#")}
    # Each event item carries the greatest id once its commit landed: non-decreasing along the events.
    assert firsts == {"m-1": "m-3a", "m-2": "m-3a", "c-1": "m-3a", "m-3": "m-3a", "m-3a": "m-3a"} | {
        "a-9": "n-1",
        "n-1": "n-1",
        "b-1": "n-1",
    }


def test_a_chat_turn_of_new_ids_writes_no_id_item_and_reads_nothing(session: Session) -> None:
    from dormant.ids import new_id

    store = session.store(single_call_items=100)
    _commit(store, session, [], 0)
    for version in range(1, 6):
        _commit(store, session, [new_id() for _ in range(7)], version)
    assert session.id_items() == set()
    faults = Faults(store._client)  # the store's own client: what a turn sends
    _commit(store, session, [new_id() for _ in range(7)], 6)
    assert dict(faults.calls) == {"TransactWriteItems": 1}


# -- re-sent ids found, new ids not: the property ------------------------------------------------------------

_KINDS = st.sampled_from(["next", "low", "high", "resend"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    commits=st.lists(st.lists(_KINDS, min_size=0, max_size=6), min_size=1, max_size=8),
    picks=st.randoms(use_true_random=False),
    saturated=st.booleans(),
    gated=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_re_sent_ids_are_found_and_new_ids_are_not(
    dynamodb_endpoint: str,
    dynamodb_table: str,
    commits: list[list[str]],
    picks: Any,
    saturated: bool,
    gated: list[bool],
) -> None:
    """Commits mixing ids in order ("next": above every id so far), below it ("low": a caller's, a clock
    behind), far above it ("high": the "next" ones after it are below), and ids already stored ("resend", of
    any kind). Each commit appends exactly its new ids, once; the session holds every id once, in order.
    With a saturated filter every id at or below ``hi`` is looked up, so new ones are searched for and must
    not be found (the filter's false positives)."""
    session = Session(dynamodb_endpoint, dynamodb_table)
    try:
        stores = {True: session.store(single_call_items=0), False: session.store(single_call_items=100)}
        stored: list[str] = []
        counter = 0
        for version, kinds in enumerate(commits):
            ids: list[str] = []
            for kind in kinds:
                counter += 1
                if kind == "resend" and stored:
                    candidate = picks.choice(stored)
                else:
                    prefix = {"next": "n", "low": "b", "high": "y", "resend": "n"}[kind]
                    candidate = f"{prefix}-{counter:04d}"
                if candidate not in ids:
                    ids.append(candidate)
            new = [i for i in ids if i not in stored]
            store = stores[gated[version]]
            store.load(session.app, session.sid)  # the one-call store builds on what it read
            assert _commit(store, session, ids, version) == len(new)
            stored += new
            if saturated and version == 0:
                session.saturate()
        assert session.ids() == stored
        again = stores[True].commit(session.row(), _events(stored), len(commits))  # the whole history re-sent
        assert (again.ok, again.appended) == (True, 0)
        assert session.ids() == stored
    finally:
        session.close()


# -- rolled-back grants, repairs, earlier layouts ------------------------------------------------------------


def test_a_re_sent_in_order_id_is_found_past_a_rolled_back_grants_late_events(session: Session) -> None:
    """A writer rolled back while paused, whose retry (the same in-order ids) lands first: when it wakes it puts
    the rest of its event items (its dead grant, at the live commit's version, with an ``hi`` of its own). The
    search steps over the dead grant: a re-send of every id appends nothing."""
    with frozen_clock(1_800_000_000_000) as clock:
        writer_client = session._client()
        faults = Faults(writer_client)
        writer = session.store(writer_client, single_call_items=0)
        _commit(writer, session, [f"base-{n:03d}" for n in range(10)], 0)
        arrived, resume = threading.Event(), threading.Event()
        faults.pause("BatchWriteItem", 2, arrived, resume)  # after 25 of its 30 event items
        results: dict[str, Any] = {}
        turn = [f"t-{n:03d}" for n in range(30)]
        slow = threading.Thread(target=lambda: results.update(r=writer.commit(session.row(), _events(turn), 1)))
        slow.start()
        assert arrived.wait(timeout=30)
        clock.advance(1)
        assert [r.action for r in session.store().repair_pending(older_than_s=0)] == ["rolled_back"]
        assert _commit(session.store(single_call_items=0), session, turn, 1) == 30
        resume.set()
        slow.join(timeout=30)
        assert not slow.is_alive() and (results["r"].ok, results["r"].version) == (False, 2)
    assert session.id_items() == set()
    session.saturate()
    for version, options in enumerate(({"single_call_items": 0}, {"single_call_items": 100}), start=2):
        store = session.store(**options)
        store.load(session.app, session.sid)
        base = [f"base-{n:03d}" for n in range(10)]
        again = store.commit(session.row(), _events([*base, *turn, f"u-{version}"]), version)
        assert (again.ok, again.appended) == (True, 1)
    assert session.ids() == [f"base-{n:03d}" for n in range(10)] + turn + ["u-2", "u-3"]


def test_a_repair_rolling_forward_puts_id_items_for_the_ids_not_in_order_only(session: Session) -> None:
    with frozen_clock(1_800_000_000_000) as clock:
        writer_client = session._client()
        faults = Faults(writer_client)
        writer = session.store(writer_client, single_call_items=0)
        _commit(writer, session, ["m-000"], 0)
        # 30 events (10 below "m-000"), then their 10 id items: the writer dies at its finish.
        ids = [f"a-{n:03d}" for n in range(10)] + [f"n-{n:03d}" for n in range(20)]
        faults.die("UpdateItem", nth=2)
        with pytest.raises(Died):
            writer.commit(session.row(), _events(ids), 1)
        assert session.id_items() == set(ids[:10])
        session.raw.delete_item(TableName=session.table, Key={"pk": {"S": session.pk}, "sk": {"S": "I#a-003"}})
        clock.advance(1)
        (report,) = session.store().repair_pending(older_than_s=0)
        assert report.action == "rolled_forward"
    assert session.id_items() == set(ids[:10])  # the missing one put again; none for the ids in order
    session.saturate()
    again = session.store(single_call_items=0).commit(session.row(), _events(["m-000", *ids, "z"]), 2)
    assert (again.ok, again.appended) == (True, 1)
    assert session.ids() == ["m-000", *ids, "z"]


def _as_an_earlier_layout_wrote_it(session: Session, *versions: int) -> None:
    """What the layout before this one left: an id item for every event, no ``hi`` on event items, no ``hv``
    (the events of ``versions`` only, when given: an earlier release's commits between this one's)."""
    for item in session.items("E#"):
        if versions and int(item["sk"]["S"].split("#")[1]) not in versions:
            continue
        if "eid" in item:
            session.raw.put_item(
                TableName=session.table,
                Item={
                    "pk": item["pk"],
                    "sk": {"S": f"I#{item['eid']['S']}"},
                    "inc": item["inc"],
                    "v": {"N": str(int(item["sk"]["S"].split("#")[1]))},
                    "t": {"S": item["sk"]["S"].split("#")[2]},
                },
            )
            session.raw.update_item(
                TableName=session.table, Key={"pk": item["pk"], "sk": item["sk"]}, UpdateExpression="REMOVE hi"
            )
    if not versions:
        session.raw.update_item(
            TableName=session.table, Key={"pk": {"S": session.pk}, "sk": {"S": "#M"}}, UpdateExpression="REMOVE hv"
        )


def test_a_session_an_earlier_layout_wrote_keeps_finding_its_ids_and_the_new_ones(session: Session) -> None:
    store = session.store(single_call_items=0)
    old = [f"n-{n:03d}" for n in range(12)]
    for version in range(4):
        _commit(store, session, old[version * 3 : version * 3 + 3], version)
    _as_an_earlier_layout_wrote_it(session)
    new = [f"p-{n:03d}" for n in range(6)]
    _commit(store, session, new[:3], 4)
    _commit(store, session, new[3:], 5)
    assert session.id_items() == set(old)  # the new ids, in order, have none
    session.saturate()
    again = session.store(single_call_items=0).commit(session.row(), _events([*old, *new, "p-100"]), 6)
    assert (again.ok, again.appended) == (True, 1)
    assert session.ids() == [*old, *new, "p-100"]


def test_an_earlier_releases_commits_between_this_ones_are_stepped_over(session: Session) -> None:
    """A rollback, then forward again: the earlier release's commits (items without ``hi``, every id with its
    item) sit between this release's. The search steps over them, not reading them as below every id."""
    store = session.store(single_call_items=0)
    _commit(store, session, ["p-000", "p-001", "p-002"], 0)
    for version, prefix in enumerate("qrstu", start=1):
        _commit(store, session, [f"{prefix}-000"], version)
    _as_an_earlier_layout_wrote_it(session, 3)  # version 3 ("r-000"): where the search's first probe lands
    session.saturate()
    everything = ["p-000", "p-001", "p-002", "q-000", "r-000", "s-000", "t-000", "u-000"]
    again = session.store(single_call_items=0).commit(session.row(), _events([*everything, "v-000"]), 6)
    assert (again.ok, again.appended) == (True, 1)
    assert session.ids() == [*everything, "v-000"]


def test_a_repair_of_an_earlier_releases_marker_puts_every_id_item(session: Session) -> None:
    """A writer of the layout before died at its finish (its event items without ``hi``, some of its id items
    missing): the repair puts an id item for every event, as that writer would have."""
    with frozen_clock(1_800_000_000_000) as clock:
        writer_client = session._client()
        faults = Faults(writer_client)
        writer = session.store(writer_client, single_call_items=0)
        _commit(writer, session, ["m-000"], 0)
        faults.die("UpdateItem", nth=2)
        ids = [f"n-{n:03d}" for n in range(5)]
        with pytest.raises(Died):
            writer.commit(session.row(), _events(ids), 1)
        for item in session.items("E#000000000002"):
            session.raw.update_item(
                TableName=session.table, Key={"pk": item["pk"], "sk": item["sk"]}, UpdateExpression="REMOVE hi"
            )
        clock.advance(1)
        (report,) = session.store().repair_pending(older_than_s=0)
        assert report.action == "rolled_forward"
    assert session.id_items() == set(ids)
    session.saturate()
    again = session.store(single_call_items=0).commit(session.row(), _events(["m-000", *ids, "z"]), 2)
    assert (again.ok, again.appended) == (True, 1)
    assert session.ids() == ["m-000", *ids, "z"]


def test_a_version_mark_of_another_incarnation_searches_from_the_first_commit(session: Session) -> None:
    """``hv`` left by an earlier incarnation (an earlier release re-created the session and kept it): the search
    starts at version 1, so an id stored in order below that mark is still found."""
    store = session.store(single_call_items=0)
    for version in range(4):
        _commit(store, session, [f"n-{version}"], version)
    session.raw.update_item(
        TableName=session.table,
        Key={"pk": {"S": session.pk}, "sk": {"S": "#M"}},
        UpdateExpression="SET hv = :hv",
        ExpressionAttributeValues={":hv": {"S": "another#3"}},
    )
    session.saturate()
    again = store.commit(session.row(), _events(["n-0", "n-1", "n-9"]), 4)
    assert (again.ok, again.appended) == (True, 1)


def test_a_re_created_session_searches_its_own_incarnation_only(session: Session) -> None:
    store = session.store(single_call_items=100)
    for version in range(3):
        _commit(store, session, [f"n-{version}"], version)
    store.delete(session.app, session.sid)
    _commit(store, session, ["n-1", "z"], 0)  # a new incarnation; "n-1" again is a new event of it
    session.saturate()
    again = session.store(single_call_items=0).commit(session.row(), _events(["n-0", "n-1", "n-2", "z"]), 1)
    assert (again.ok, again.appended) == (True, 2)  # n-0 and n-2 were the earlier incarnation's only
    assert session.ids() == ["n-1", "z", "n-0", "n-2"]


@pytest.mark.parametrize("whose", ["rolled-back", "another-incarnation"])
def test_event_items_not_live_are_stepped_over_by_the_search(session: Session, whose: str) -> None:
    """A rolled-back writer's items (its grant in ``dead``), or an earlier incarnation's left behind, at a
    version the live commit also holds, sorting first and with an ``hi`` above the live one: were the search to
    read their ``hi``, an id stored in order at a later version would look like it belonged there."""
    store = session.store(single_call_items=0)
    _commit(store, session, ["base"], 0)
    _commit(store, session, ["s-000", "s-001"], 1)  # version 2, the live grant
    _commit(store, session, ["t-005"], 2)  # version 3: above "s-001", in order
    (meta,) = session.items("#M")
    inc = meta["inc"]["S"] if whose == "rolled-back" else "another"
    session.raw.put_item(
        TableName=session.table,
        Item={
            "pk": {"S": session.pk},
            "sk": {"S": "E#000000000002#00000000#00000"},  # before the live grant's items
            "inc": {"S": inc},
            "d": {"B": b'{"id":"t-000"}'},
            "eid": {"S": "t-000"},
            "hi": {"S": "t-029"},
        },
    )
    if whose == "rolled-back":
        session.raw.update_item(
            TableName=session.table,
            Key={"pk": {"S": session.pk}, "sk": {"S": "#M"}},
            UpdateExpression="ADD dead :d",
            ExpressionAttributeValues={":d": {"SS": ["2#00000000"]}},
        )
    session.saturate()
    again = session.store(single_call_items=0).commit(session.row(), _events(["t-005", "s-001", "t-000"]), 3)
    assert (again.ok, again.appended) == (True, 1)  # "t-000" was never stored live: new
    assert session.ids() == ["base", "s-000", "s-001", "t-005", "t-000"]


def test_a_re_sent_id_costs_a_logarithmic_number_of_one_item_reads(session: Session) -> None:
    """64 commits of one in-order id each: a re-sent id is found in at most log2(64) + 1 probes of one item each
    and one read of its commit, never a read of the history."""
    store = session.store(single_call_items=100)
    ids = [f"n-{n:03d}" for n in range(64)]
    for version, event_id in enumerate(ids):
        _commit(store, session, [event_id], version)
    session.saturate()
    for version, resent in enumerate((ids[0], ids[21], ids[63]), start=64):
        reader = session.store(single_call_items=0)
        faults = Faults(reader._client)
        again = reader.commit(session.row(), _events([resent]), version)
        assert again.ok and again.appended == 0
        queries = [params for op, params in faults.params if op == "Query"]
        probes = [q for q in queries if q.get("Limit") == 1]
        assert len(probes) <= 7 and len(queries) == len(probes) + 1, resent
        (commit_read,) = [q for q in queries if "Limit" not in q]
        assert commit_read["KeyConditionExpression"] == "pk = :pk AND begins_with(sk, :v)"  # one commit's items
