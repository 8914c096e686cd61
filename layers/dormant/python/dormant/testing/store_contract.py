"""The store compliance suite: the contract of ``dormant.stores.base``, as pytest tests any store can run.

Prove a store in a few lines — subclass, give it a name starting with ``Test``, and build the store::

    from dormant.testing import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self):
            return MyStore(...)

A store that implements the optional ``SnapshotStore`` part is checked on it too; one that does not
reports those tests skipped.

The key rule (``dormant.ids``) is part of the contract: every key kind with every defect is refused the same
way on every store with nothing written, the longest keys are kept, and ``{app}@{tenant}`` has one reading
(no app can be named like another's tenant, through lists, purges and erasures).

Override ``make_peer(store)`` to return a second handle on the same storage (another connection,
another client) and the concurrency tests race the two. Every test uses fresh app and session ids,
so a shared database (a Postgres server, a DynamoDB table) needs no cleaning between runs.
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ..clock import frozen_clock
from ..errors import (
    CommitTooLarge,
    ConfigurationError,
    EventTooLarge,
    InputError,
    InvalidKey,
    InvalidSessionId,
    ScopeMismatch,
    StoreClosed,
    ValueNotStorable,
)
from ..events import (
    Event,
    InvocationEndEvent,
    InvocationStartEvent,
    StateChange,
    StateChangeEvent,
    ToolCallEvent,
    UserEvent,
)
from ..ids import MAX_CURSOR_LENGTH, MAX_KEY_LENGTH, TENANT_SEPARATOR
from ..stores.base import (
    MAX_CURSOR_TIME,
    BaseSessionStore,
    ErasableStore,
    LimitedStore,
    RunningSession,
    ScopedStateChange,
    SessionStore,
    SnapshotStore,
    StoredSession,
    StoredSnapshot,
    StoreLimits,
    encode_cursor,
)

__all__ = ["StoreContract"]

WAIT = 120  # seconds: the bound on every wait for another thread, never reached when the store is right


def _event(n: int | str, text: str | None = None) -> UserEvent:
    return UserEvent(
        id=f"evt-{n}",
        created_at=1_700_000_000_000 + (n if isinstance(n, int) else 0),
        text=f"message {n}" if text is None else text,
    )


class _Owner(BaseModel):
    """The user scope of the tenant test's apps: which app wrote it."""

    owner: str = ""


def _ids(events: Sequence[Event]) -> list[str]:
    return [e.id for e in events]


class StoreContract:
    """Behaviour every ``SessionStore`` must have. Subclass it and implement ``make_store``."""

    def make_store(self) -> SessionStore:
        raise NotImplementedError("a StoreContract subclass builds its store in make_store()")

    def make_peer(self, store: SessionStore) -> SessionStore:
        """Another handle on the same storage as ``store``; by default, the same object."""
        return store

    # -- fixtures and helpers ---------------------------------------------------------------

    @pytest.fixture
    def store(self) -> Iterator[SessionStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def app(self) -> str:
        return f"app-{uuid.uuid4().hex[:12]}"

    @staticmethod
    def meta(app: str, session_id: str | None = None, version: int = 0, **extra: Any) -> StoredSession:
        return StoredSession(
            id=session_id or f"s-{uuid.uuid4().hex[:12]}",
            app_name=app,
            version=version,
            created_at=1_700_000_000_000,
            **extra,
        )

    # -- load and create --------------------------------------------------------------------

    def test_load_of_a_missing_session_is_none(self, store: SessionStore, app: str) -> None:
        assert store.load(app, "no-such-session") is None

    def test_create_with_expected_zero_gives_version_one(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, scopes={"user": "u-1"}, status="idle")
        result = store.commit(meta, [], 0)
        assert (result.ok, result.version, result.appended) == (True, 1, 0)
        loaded = store.load(app, meta.id)
        assert loaded is not None
        assert (loaded.session.id, loaded.session.app_name, loaded.session.version) == (meta.id, app, 1)
        assert loaded.session.scopes == {"user": "u-1"}
        assert loaded.session.created_at == meta.created_at
        assert loaded.session.status == "idle"
        assert loaded.events == []

    def test_create_with_events(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        result = store.commit(meta, [_event(1), _event(2)], 0)
        assert (result.ok, result.version, result.appended) == (True, 1, 2)
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]

    def test_create_twice_conflicts(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1)], 0)
        again = store.commit(meta, [_event(2)], 0)
        assert (again.ok, again.version, again.appended) == (False, 1, 0)
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1"]

    # -- append and order -------------------------------------------------------------------

    def test_append_bumps_the_version_by_one(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1)], 0)
        result = store.commit(meta, [_event(2), _event(3)], 1)
        assert (result.ok, result.version, result.appended) == (True, 2, 2)
        empty = store.commit(meta, [], 2)
        assert (empty.ok, empty.version, empty.appended) == (True, 3, 0)
        loaded = store.load(app, meta.id)
        assert loaded is not None and loaded.session.version == 3

    def test_order_within_and_across_batches(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        # Ids that sort in a different order than they were appended, and identical timestamps:
        # only the append order may decide.
        batches = [["z", "a", "m"], ["b", "y"], ["c"]]
        version = 0
        for batch in batches:
            events = [UserEvent(id=i, created_at=1, text=i) for i in batch]
            version = store.commit(meta, events, version).version
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["z", "a", "m", "b", "y", "c"]

    def test_recommitted_ids_are_not_duplicated_and_new_ones_land_in_order(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1), _event(2)], 0)
        # A retried batch that overlaps stored history: event 2 is stored, 3 and 4 are not.
        result = store.commit(meta, [_event(2), _event(3), _event(1), _event(4)], 1)
        assert (result.ok, result.version, result.appended) == (True, 2, 2)
        store.commit(meta, [_event(5)], 2)
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"]

    def test_an_id_repeated_inside_one_batch_lands_once(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        result = store.commit(meta, [_event(1), _event(2), _event(1)], 0)
        assert result.appended == 2
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]

    def test_a_sixty_event_batch(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        events = [_event(n) for n in range(60)]
        result = store.commit(meta, events, 0)
        assert (result.ok, result.appended) == (True, 60)
        more = [_event(n) for n in range(55, 130)]  # 5 already stored, 70 new, across batch boundaries
        assert store.commit(meta, more, 1).appended == 70
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == [f"evt-{n}" for n in range(130)]

    def test_the_same_event_id_may_live_in_two_sessions(self, store: SessionStore, app: str) -> None:
        first, second = self.meta(app), self.meta(app)
        store.commit(first, [_event(1, "first")], 0)
        assert store.commit(second, [_event(1, "second")], 0).appended == 1
        a, b = store.load(app, first.id), store.load(app, second.id)
        assert a is not None and b is not None
        assert [e.text for e in a.events if isinstance(e, UserEvent)] == ["first"]
        assert [e.text for e in b.events if isinstance(e, UserEvent)] == ["second"]

    def test_events_round_trip_exactly(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        events: list[Event] = [
            UserEvent(id="u", created_at=5, text='naïve ☃ "quoted" \n line', invocation_id="inv-1"),
            ToolCallEvent(
                id="t", created_at=6, call_id="c1", name="find", args={"n": 1.5, "deep": {"x": [1, None, True]}}
            ),
            StateChangeEvent(
                id="s",
                created_at=7,
                scope="user",
                scope_id="u-1",
                source="mutation",
                changes=[StateChange(key="k", old_value=None, new_value={"a": [1, 2]})],
            ),
        ]
        store.commit(meta, events, 0)
        loaded = store.load(app, meta.id)
        assert loaded is not None and loaded.events == events

    # -- optimistic concurrency -------------------------------------------------------------

    def test_a_stale_commit_is_refused_and_writes_nothing(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, scopes={"user": "u-1"})
        store.commit(meta, [_event(1)], 0)
        store.commit(meta, [_event(2)], 1)
        stale = store.commit(meta, [_event(3)], 1, [ScopedStateChange("user", "u-stale", "theme", "dark")])
        assert (stale.ok, stale.version, stale.appended) == (False, 2, 0)
        loaded = store.load(app, meta.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]
        assert loaded.session.version == 2
        assert store.load_scoped_state(app, "user", "u-stale") == {}

    def test_a_commit_ahead_of_the_store_is_refused(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1)], 0)
        ahead = store.commit(meta, [_event(2)], 5)
        assert (ahead.ok, ahead.version) == (False, 1)

    def test_a_commit_to_a_missing_session_conflicts_with_version_zero(self, store: SessionStore, app: str) -> None:
        result = store.commit(self.meta(app), [_event(1)], 3)
        assert (result.ok, result.version, result.appended) == (False, 0, 0)

    def test_a_commit_against_a_deleted_session_conflicts(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1)], 0)
        store.delete(app, meta.id)
        result = store.commit(meta, [_event(2)], 1, [ScopedStateChange("user", "u-del", "k", 1)])
        assert (result.ok, result.version) == (False, 0)
        assert store.load(app, meta.id) is None
        assert store.load_scoped_state(app, "user", "u-del") == {}

    # -- delete -----------------------------------------------------------------------------

    def test_delete_removes_the_row_and_its_events(self, store: SessionStore, app: str) -> None:
        meta, other = self.meta(app), self.meta(app)
        store.commit(meta, [_event(1), _event(2)], 0)
        store.commit(other, [_event(1)], 0)
        store.delete(app, meta.id)
        assert store.load(app, meta.id) is None
        assert [s.id for s in store.list(app)] == [other.id]
        # The id can be created afresh, and holds none of the old events.
        assert store.commit(meta, [_event(9)], 0).ok
        again = store.load(app, meta.id)
        assert again is not None and _ids(again.events) == ["evt-9"]
        other_loaded = store.load(app, other.id)
        assert other_loaded is not None and _ids(other_loaded.events) == ["evt-1"]

    def test_deleting_a_missing_session_is_harmless(self, store: SessionStore, app: str) -> None:
        store.delete(app, "never-was")

    # -- bindings (what an erasure reads) -----------------------------------------------------

    def test_bound_sessions_names_the_sessions_bound_to_one_id(self, store: SessionStore, app: str) -> None:
        if not isinstance(store, ErasableStore):
            pytest.skip("bound_sessions is part of ErasableStore, which this store is not")
        store.commit(self.meta(app, "s-b", scopes={"user": "u-1", "org": "o-1"}), [_event(1)], 0)
        store.commit(self.meta(app, "s-a", scopes={"user": "u-1"}), [], 0)
        store.commit(self.meta(app, "s-c", scopes={"user": "u-2", "org": "o-1"}), [], 0)
        store.commit(self.meta(f"{app}-other", "s-d", scopes={"user": "u-1"}), [], 0)
        assert store.bound_sessions(app, "user", "u-1") == ["s-a", "s-b"]
        assert store.bound_sessions(app, "org", "o-1") == ["s-b", "s-c"]
        assert store.bound_sessions(app, "patient", "u-1") == []
        store.delete(app, "s-b")
        assert store.bound_sessions(app, "user", "u-1") == ["s-a"]
        assert store.bound_sessions(app, "org", "o-1") == ["s-c"]
        with pytest.raises(InputError) as refused:
            store.bound_sessions(app, "app", "app")
        assert refused.value.field == "scope"

    # -- listing ----------------------------------------------------------------------------

    def test_list_is_per_app_with_updated_at(self, store: SessionStore, app: str) -> None:
        other_app = f"{app}-other"
        mine = [self.meta(app) for _ in range(3)]
        for meta in mine:
            store.commit(meta, [_event(1)], 0)
        store.commit(self.meta(other_app), [_event(1)], 0)
        listed = store.list(app)
        assert sorted(s.id for s in listed) == sorted(m.id for m in mine)
        assert all(s.updated_at > 0 for s in listed)
        assert [s.id for s in store.list(other_app)] != [] and not {s.id for s in store.list(other_app)} & {
            m.id for m in mine
        }
        assert store.list(f"{app}-empty") == []

    def test_list_puts_the_most_recently_updated_first_and_pages(self, store: SessionStore, app: str) -> None:
        metas = [self.meta(app, f"s{n}") for n in range(5)]
        with frozen_clock(1_800_000_000_000) as clock:
            for meta in metas:
                clock.advance(1)
                store.commit(meta, [], 0)
            clock.advance(1)
            store.commit(metas[0], [_event(1)], 1)  # touched last: listed first
        listed = store.list(app)
        assert [s.id for s in listed] == ["s0", "s4", "s3", "s2", "s1"]
        assert [s.updated_at for s in listed] == sorted((s.updated_at for s in listed), reverse=True)
        assert listed[0].version == 2
        for size in (1, 2):
            pages: list[str] = []
            cursor = None
            for _ in range(len(listed) + 1):  # bounded: a cursor that lists its own session again never ends
                page = store.list(app, limit=size, cursor=cursor)
                assert len(page) <= size
                if not page:
                    break
                assert cursor is None or cursor not in {s.cursor for s in page}, "a page repeats the cursor's session"
                pages += [s.id for s in page]
                cursor = page[-1].cursor
            assert pages == [s.id for s in listed]

    def test_list_carries_the_status_saved_with_the_commit(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, status="running")
        store.commit(meta, [_event(1)], 0)
        store.commit(self.meta(app, meta.id, status="awaiting_input"), [_event(2)], 1)
        (listing,) = store.list(app)
        assert listing.status == "awaiting_input"

    def test_list_by_status_pages_through_that_status_alone(self, store: SessionStore, app: str) -> None:
        """``list(status=)`` among interleaved sessions of other statuses (two per millisecond, so cursors break
        ties on the id): every page full until the last, no omission, no duplicate, a cursor that goes on
        within the status, and a status nothing has lists nothing."""
        statuses = ("running", "idle", "awaiting_input")
        made: list[tuple[int, str, str]] = []
        with frozen_clock(1_800_000_000_000) as clock:
            for n in range(15):
                if n % 2 == 0:
                    clock.advance(1)
                sid, status = f"s{n:02d}", statuses[n % 3]
                store.commit(self.meta(app, sid, status=status), [_event(n)], 0)
                made.append((clock.ms, sid, status))
        for status in statuses:
            expected = [sid for _, sid, s in sorted(made, reverse=True) if s == status]
            listed = store.list(app, status=status)
            assert [s.id for s in listed] == expected
            assert {s.status for s in listed} == {status}
            for size in (1, 2, 4):
                pages: list[list[str]] = []
                cursor = None
                for _ in range(len(expected) + 2):  # bounded: a cursor that lists its own session again never ends
                    page = store.list(app, limit=size, cursor=cursor, status=status)
                    pages.append([s.id for s in page])
                    if len(page) < size:
                        break
                    cursor = page[-1].cursor
                    rest = listed[sum(map(len, pages)) :]
                    assert store.list(app, cursor=cursor, status=status) == rest, "a cursor round trip lists the rest"
                flat = [sid for page in pages for sid in page]
                assert flat == expected, f"paging by {size}: omitted or repeated sessions"
                assert all(len(page) == size for page in pages[:-1]), "a page came back short while more matched"
        assert store.list(app, status="error") == []

    def test_a_status_change_moves_the_session_between_status_listings(self, store: SessionStore, app: str) -> None:
        with frozen_clock(1_800_000_000_000) as clock:
            store.commit(self.meta(app, "other", status="running"), [_event(0)], 0)
            clock.advance(1)
            store.commit(self.meta(app, "moving", status="running"), [_event(1)], 0)
            assert [s.id for s in store.list(app, status="running")] == ["moving", "other"]
            assert store.list(app, status="awaiting_input") == []
            clock.advance(1)
            store.commit(self.meta(app, "moving", status="awaiting_input"), [_event(2)], 1)
        assert [s.id for s in store.list(app, status="running")] == ["other"]
        ((sid, version, status),) = [(s.id, s.version, s.status) for s in store.list(app, status="awaiting_input")]
        assert (sid, version, status) == ("moving", 2, "awaiting_input")
        assert sorted(s.id for s in store.list(app)) == ["moving", "other"]

    @pytest.mark.parametrize("status", ["", "Running", "running#0", "x" * 33, 7])
    def test_a_status_outside_the_rule_is_an_input_error_naming_status(
        self, store: SessionStore, app: str, status: Any
    ) -> None:
        with pytest.raises(InputError) as caught:
            store.list(app, status=status)
        assert caught.value.field == "status"

    # -- running sessions (what the sweeper reads) -------------------------------------------

    def test_running_sessions_are_the_running_ones_of_every_app(self, store: SessionStore, app: str) -> None:
        """The sessions whose stored status is ``running``, across apps, oldest first: one that ends its
        invocation, is paused, or is deleted leaves; one that starts later joins; a refused commit changes
        nothing; a running session's later commits move its ``updated_at``."""
        if not isinstance(store, BaseSessionStore):
            pytest.skip("running_sessions is part of BaseSessionStore")
        other = f"{app}-other"
        made: list[tuple[str, str]] = []

        def commit(owner: str, sid: str, status: str, events: Sequence[Event], expected: int) -> bool:
            made.append((owner, sid))
            return store.commit(self.meta(owner, sid, status=status), events, expected).ok

        def start(n: int) -> InvocationStartEvent:
            return InvocationStartEvent(id=f"start-{n}", invocation_id=f"inv-{n}", agent_name="agent", deadline=1)

        def end(n: int) -> InvocationEndEvent:
            return InvocationEndEvent(id=f"end-{n}", invocation_id=f"inv-{n}", status="completed")

        def running(limit: int = 100_000) -> list[tuple[str, str, int]]:
            # Other tests' sessions share a Postgres schema or a DynamoDB table: keep this test's apps.
            return [
                (r.app_name, r.session_id, r.updated_at)
                for r in store.running_sessions(limit)
                if r.app_name in (app, other)
            ]

        t = 1_000_000_000  # early: older than any session stored at the real time, so first in line
        try:
            with frozen_clock(t) as clock:
                for owner, sid, status, events in (
                    (app, "s-run", "running", [start(1)]),  # t+1
                    (app, "s-idle", "idle", [_event(1)]),  # t+2
                    (other, "s-later", "idle", [_event(1)]),  # t+3, running from t+4
                    (other, "s-ends", "running", [start(1)]),  # t+5
                    (app, "s-deleted", "running", [start(1)]),  # t+6
                    (other, "s-refused", "running", [start(1)]),  # t+7
                    (app, "s-paused", "running", [start(1)]),  # t+8
                ):
                    clock.advance(1)
                    assert commit(owner, sid, status, events, 0)
                    if sid == "s-later":
                        clock.advance(1)
                        assert commit(other, sid, "running", [start(2)], 1)
                assert running() == [
                    (app, "s-run", t + 1),
                    (other, "s-later", t + 4),
                    (other, "s-ends", t + 5),
                    (app, "s-deleted", t + 6),
                    (other, "s-refused", t + 7),
                    (app, "s-paused", t + 8),
                ]
                assert running(limit=2) == [(app, "s-run", t + 1), (other, "s-later", t + 4)]
                clock.advance(1)
                assert commit(other, "s-ends", "completed", [end(1)], 1)  # t+9
                assert not commit(other, "s-refused", "completed", [end(1)], 5)  # a conflict: nothing changes
                assert commit(app, "s-paused", "awaiting_input", [_event(2)], 1)
                store.delete(app, "s-deleted")
                clock.advance(1)
                assert commit(app, "s-run", "running", [_event(2)], 1)  # t+10: still running, updated
                assert running() == [(other, "s-later", t + 4), (other, "s-refused", t + 7), (app, "s-run", t + 10)]
                loaded = store.load(app, "s-run")
                assert loaded is not None and loaded.session.updated_at == t + 10
                assert running(limit=1) == [(other, "s-later", t + 4)]
                with pytest.raises(InputError) as refused:
                    store.running_sessions(0)
                assert refused.value.field == "limit"
        finally:
            for owner, sid in set(made):
                store.delete(owner, sid)
        assert running() == []

    def test_waiting_sessions_are_the_waiting_ones_of_every_app(self, store: SessionStore, app: str) -> None:
        """The sessions whose stored status is ``awaiting_input`` or ``resumable``, across apps, oldest first,
        with that status: one answered (awaiting -> resumable) stays, one that runs, ends or is deleted leaves,
        a refused commit changes nothing; ``running_sessions`` lists none of them."""
        if not isinstance(store, BaseSessionStore):
            pytest.skip("waiting_sessions is part of BaseSessionStore")
        other = f"{app}-other"
        made: list[tuple[str, str]] = []

        def commit(owner: str, sid: str, status: str, n: int, expected: int) -> bool:
            made.append((owner, sid))
            return store.commit(self.meta(owner, sid, status=status), [_event(n)], expected).ok

        def listed(rows: Sequence[RunningSession]) -> list[tuple[str, str, int, str]]:
            return [(r.app_name, r.session_id, r.updated_at, r.status) for r in rows if r.app_name in (app, other)]

        def waiting(limit: int = 100_000) -> list[tuple[str, str, int, str]]:
            return listed(store.waiting_sessions(limit))

        t = 1_000_000_000
        try:
            with frozen_clock(t) as clock:
                for owner, sid, status in (
                    (app, "s-asks", "awaiting_input"),  # t+1
                    (other, "s-answered", "resumable"),  # t+2
                    (app, "s-runs", "running"),  # t+3
                    (other, "s-idle", "idle"),  # t+4
                    (app, "s-resumed", "awaiting_input"),  # t+5
                    (other, "s-refused", "awaiting_input"),  # t+6
                    (app, "s-deleted", "awaiting_input"),  # t+7
                ):
                    clock.advance(1)
                    assert commit(owner, sid, status, 1, 0)
                assert waiting() == [
                    (app, "s-asks", t + 1, "awaiting_input"),
                    (other, "s-answered", t + 2, "resumable"),
                    (app, "s-resumed", t + 5, "awaiting_input"),
                    (other, "s-refused", t + 6, "awaiting_input"),
                    (app, "s-deleted", t + 7, "awaiting_input"),
                ]
                assert waiting(limit=2) == waiting()[:2]
                assert [r[1] for r in listed(store.running_sessions())] == ["s-runs"]
                clock.advance(1)  # t+8
                assert commit(app, "s-asks", "resumable", 2, 1)  # answered: still waits (for its runner)
                assert commit(app, "s-resumed", "running", 2, 1)  # resumed: running, not waiting
                assert commit(other, "s-answered", "completed", 2, 1)  # ended
                assert commit(app, "s-runs", "awaiting_input", 2, 1)  # yielded: waits now
                assert not commit(other, "s-refused", "completed", 2, 5)  # a conflict: nothing changes
                store.delete(app, "s-deleted")
                assert waiting() == [
                    (other, "s-refused", t + 6, "awaiting_input"),
                    (app, "s-asks", t + 8, "resumable"),
                    (app, "s-runs", t + 8, "awaiting_input"),
                ]
                assert [r[1] for r in listed(store.running_sessions())] == ["s-resumed"]
                with pytest.raises(InputError) as refused:
                    store.waiting_sessions(0)
                assert refused.value.field == "limit"
        finally:
            for owner, sid in set(made):
                store.delete(owner, sid)
        assert waiting() == []

    # -- scoped state -----------------------------------------------------------------------

    def seed(self, store: SessionStore, app: str, scope: str, scope_id: str, values: dict[str, Any]) -> None:
        """Write scoped values the way the runtime does: riding on a commit (of a session of their own)."""
        changes = [ScopedStateChange(scope, scope_id, key, value) for key, value in values.items()]
        assert store.commit(self.meta(app), [], 0, changes).ok

    def test_scoped_state_merges_and_none_deletes(self, store: SessionStore, app: str) -> None:
        self.seed(store, app, "user", "u-1", {"theme": "dark", "locale": "en-GB", "n": 1})
        self.seed(store, app, "user", "u-1", {"theme": "light", "locale": None})
        assert store.load_scoped_state(app, "user", "u-1") == {"theme": "light", "n": 1}
        assert store.load_scoped_state(app, "user", "u-2") == {}
        assert store.load_scoped_state(f"{app}-other", "user", "u-1") == {}
        assert store.load_scoped_state(app, "patient", "u-1") == {}

    def test_save_scoped_state_merges_when_the_store_offers_it(self, store: SessionStore, app: str) -> None:
        save = getattr(store, "save_scoped_state", None)
        if save is None:
            pytest.skip("this store has no save_scoped_state (it is not part of the SessionStore protocol)")
        save(app, "user", "u-1", {"theme": "dark", "locale": "en-GB", "n": 1})
        save(app, "user", "u-1", {"theme": "light", "locale": None})
        assert store.load_scoped_state(app, "user", "u-1") == {"theme": "light", "n": 1}

    def test_scoped_values_keep_their_json_shape(self, store: SessionStore, app: str) -> None:
        value = {"list": [1, 2.5, "x", None, False], "nested": {"a": {"b": "c"}}}
        self.seed(store, app, "org", "o-1", {"v": value, "flag": False, "zero": 0, "empty": "", "one": "1"})
        assert store.load_scoped_state(app, "org", "o-1") == {
            "v": value,
            "flag": False,
            "zero": 0,
            "empty": "",
            "one": "1",
        }

    def test_scoped_changes_land_with_the_commit(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, scopes={"user": "u-1"})
        self.seed(store, app, "user", "u-1", {"keep": 1, "drop": 2})
        changes = [
            ScopedStateChange("user", "u-1", "name", "Ada"),
            ScopedStateChange("user", "u-1", "drop", None),
            ScopedStateChange("user", "u-1", "name", "Ada L."),  # a later change to a key wins
            ScopedStateChange("team", "t-1", "size", 3),
        ]
        assert store.commit(meta, [_event(1)], 0, changes).ok
        assert store.load_scoped_state(app, "user", "u-1") == {"keep": 1, "name": "Ada L."}
        assert store.load_scoped_state(app, "team", "t-1") == {"size": 3}

    # -- scopes are fixed at creation -------------------------------------------------------

    @pytest.mark.parametrize(
        ("given", "scope"),
        [({"user": "bob"}, "user"), ({}, "user"), ({"user": "alice", "team": "t-1"}, "team")],
        ids=["rebound", "dropped", "added"],
    )
    def test_a_commit_with_other_scopes_is_refused_and_writes_nothing(
        self, store: SessionStore, app: str, given: dict[str, str], scope: str
    ) -> None:
        meta = self.meta(app, scopes={"user": "alice"})
        store.commit(meta, [_event(1)], 0)
        other = self.meta(app, meta.id, scopes=given)
        for expected in (1, 5):  # at the right version, and at a wrong one: retrying cannot fix it
            with pytest.raises(ScopeMismatch) as caught:
                store.commit(other, [_event(2)], expected, [ScopedStateChange("user", "bob", "k", 1)])
            assert (caught.value.scope, caught.value.field) == (scope, f"scopes.{scope}")
        loaded = store.load(app, meta.id)
        assert loaded is not None
        assert (loaded.session.version, loaded.session.scopes, _ids(loaded.events)) == (1, {"user": "alice"}, ["evt-1"])
        assert store.load_scoped_state(app, "user", "bob") == {}
        assert store.commit(meta, [_event(2)], 1).ok  # the session itself goes on

    def test_creating_a_taken_id_with_other_scopes_is_a_conflict(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, scopes={"user": "alice"})
        store.commit(meta, [], 0)
        again = store.commit(self.meta(app, meta.id, scopes={"user": "bob"}), [_event(1)], 0)
        assert (again.ok, again.version, again.appended) == (False, 1, 0)

    # -- fork fields ------------------------------------------------------------------------

    def test_fork_fields_are_kept_from_creation(self, store: SessionStore, app: str) -> None:
        fork = self.meta(app, forked_from="s-origin", fork_reason="both answered tool call c1")
        store.commit(fork, [_event(1)], 0)
        plain = self.meta(app)
        store.commit(plain, [], 0)
        store.commit(self.meta(app, fork.id), [_event(2)], 1)  # a later commit that does not repeat them
        loaded, other = store.load(app, fork.id), store.load(app, plain.id)
        assert loaded is not None and other is not None
        assert (loaded.session.forked_from, loaded.session.fork_reason) == ("s-origin", "both answered tool call c1")
        assert (other.session.forked_from, other.session.fork_reason) == (None, None)

    # -- loading the tail -------------------------------------------------------------------

    def test_load_after_a_version_returns_only_the_later_events(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [_event(1), _event(2)], 0)  # version 1
        store.commit(meta, [], 1)  # version 2: no events
        store.commit(meta, [_event(3)], 2)  # version 3
        store.commit(meta, [_event(2), _event(4), _event(5)], 3)  # version 4: evt-2 is stored already
        tails = {}
        for after in (None, 0, 1, 2, 3, 4, 99):
            loaded = store.load(app, meta.id, after=after)
            assert loaded is not None and loaded.session.version == 4
            tails[after] = _ids(loaded.events)
        assert tails == {
            None: ["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"],
            0: ["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"],
            1: ["evt-3", "evt-4", "evt-5"],
            2: ["evt-3", "evt-4", "evt-5"],
            3: ["evt-4", "evt-5"],
            4: [],
            99: [],
        }
        assert store.load(app, "no-such-session", after=1) is None

    @pytest.mark.parametrize("after", [-1, True, 1.0, "1"])
    def test_load_after_takes_a_version(self, store: SessionStore, app: str, after: Any) -> None:
        with pytest.raises(InputError) as caught:
            store.load(app, "any", after=after)
        assert caught.value.field == "after"

    # -- limits -----------------------------------------------------------------------------

    @staticmethod
    def limits(store: SessionStore) -> StoreLimits:
        """The store's declared limits (``LimitedStore``); a store that declares none is held to the defaults."""
        return store.limits if isinstance(store, LimitedStore) else StoreLimits()

    def test_an_event_at_the_size_limit_is_stored_and_one_byte_more_is_refused(
        self, store: SessionStore, app: str
    ) -> None:
        limit = self.limits(store).max_event_bytes
        meta = self.meta(app)
        overhead = len(_event("big", "").model_dump_json().encode())
        # Multi-byte text, so a store that counts characters instead of bytes lets the second one through.
        fits = _event("big", "é" * ((limit - overhead) // 2) + "x" * ((limit - overhead) % 2))
        assert len(fits.model_dump_json().encode()) == limit
        assert store.commit(meta, [fits], 0).appended == 1
        over = _event("over", "é" * ((limit - overhead) // 2 + 1))
        with pytest.raises(EventTooLarge) as caught:
            store.commit(meta, [_event(1), over], 1)
        assert (caught.value.event_id, caught.value.limit) == ("evt-over", limit)
        assert caught.value.size > limit
        loaded = store.load(app, meta.id)
        assert loaded is not None and loaded.session.version == 1 and loaded.events == [fits]

    def test_a_commit_over_the_event_count_limit_is_refused_and_writes_nothing(
        self, store: SessionStore, app: str
    ) -> None:
        most = self.limits(store).max_events_per_commit
        meta = self.meta(app, scopes={"user": "u-1"})
        store.commit(meta, [], 0)
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(meta, [_event(n) for n in range(most + 1)], 1, [ScopedStateChange("user", "u-1", "k", 1)])
        assert (caught.value.size, caught.value.limit) == (most + 1, most)
        loaded = store.load(app, meta.id)
        assert loaded is not None and loaded.session.version == 1 and loaded.events == []
        assert store.load_scoped_state(app, "user", "u-1") == {}
        # Re-sent ids are one event each: a batch that repeats ids counts what it carries once.
        assert store.commit(meta, [_event(n % most) for n in range(most + 1)], 1).appended == most

    def test_a_commit_over_the_byte_limit_is_refused(self, store: SessionStore, app: str) -> None:
        limits = self.limits(store)
        per_event = limits.max_event_bytes
        count = limits.max_commit_bytes // per_event + 1
        if count > limits.max_events_per_commit:
            pytest.skip("this store's event count limit is reached before its byte limit")
        overhead = len(_event(0, "").model_dump_json().encode()) + 8
        events = [_event(n, "x" * (per_event - overhead)) for n in range(count)]
        meta = self.meta(app)
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(meta, events, 0)
        assert caught.value.limit == limits.max_commit_bytes
        assert store.load(app, meta.id) is None

    def test_a_scoped_value_over_its_limit_is_refused(self, store: SessionStore, app: str) -> None:
        limit = self.limits(store).max_scoped_value_bytes
        meta = self.meta(app, scopes={"user": "u-1"})
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(meta, [_event(1)], 0, [ScopedStateChange("user", "u-1", "notes", "x" * limit)])
        assert caught.value.field == "state.user.notes"
        assert store.load(app, meta.id) is None
        fits = "x" * (limit - 2)  # the quotes make it exactly the limit
        assert store.commit(meta, [_event(1)], 0, [ScopedStateChange("user", "u-1", "notes", fits)]).ok
        assert store.load_scoped_state(app, "user", "u-1") == {"notes": fits}

    # -- the one key rule: refused before anything is written, the same on every store ----------

    # Each key kind with each way of breaking the rule (``dormant.ids``): what the store must raise, exactly.
    KEY_DEFECTS: ClassVar[dict[str, str]] = {
        "empty": "",
        "nul": "a\x00b",
        "lone-surrogate": "a\ud800b",
        "too-long": "k" * (MAX_KEY_LENGTH + 1),
    }
    KEY_KINDS: ClassVar[dict[str, tuple[str, type[InputError]]]] = {
        # kind: (the field the refusal names, the error for a key that is no key of that kind)
        "app_name": ("app_name", InvalidKey),
        "tenant": ("app_name", InvalidKey),  # the part of the stored app name after the '@'
        "session_id": ("session_id", InvalidSessionId),
        "binding_scope_id": ("scopes.user", InvalidSessionId),  # session.scopes, a key of the binding index
        "scope": ("scoped_changes.0.scope", InvalidKey),
        "scope_id": ("scoped_changes.0.scope_id", InvalidSessionId),
        "scoped_key": ("scoped_changes.0.key", InvalidKey),
    }

    @pytest.mark.parametrize("defect", sorted(KEY_DEFECTS))
    @pytest.mark.parametrize("kind", sorted(KEY_KINDS))
    def test_every_key_kind_outside_the_key_rule_is_refused_the_same_and_writes_nothing(
        self, store: SessionStore, app: str, kind: str, defect: str
    ) -> None:
        bad = self.KEY_DEFECTS[defect]
        field_name, error = self.KEY_KINDS[kind]
        if kind == "scoped_key" and defect in ("nul", "lone-surrogate"):
            error = ValueNotStorable  # text no store can keep, as a value with a NUL is (a 422)
        parts = {"app_name": app, "session_id": "s-1", "scope": "user", "scope_id": "u-1", "scoped_key": "name"}
        parts["binding_scope_id"] = "u-1"
        if kind == "tenant":
            parts["app_name"] = f"{app}{TENANT_SEPARATOR}{bad}"
        else:
            parts[kind] = bad
        meta = StoredSession(
            id=parts["session_id"], app_name=parts["app_name"], scopes={"user": parts["binding_scope_id"]}
        )
        change = ScopedStateChange(parts["scope"], parts["scope_id"], parts["scoped_key"], "Ada")
        with pytest.raises(error) as caught:
            store.commit(meta, [_event(1)], 0, [change])
        assert type(caught.value) is error and caught.value.field == field_name
        # The reads that take the key refuse it the same way (no 500, no driver error, no empty answer).
        reads: list[Callable[[], object]] = []
        if kind in ("app_name", "tenant", "session_id"):
            reads += [lambda: store.load(parts["app_name"], parts["session_id"])]
            reads += [lambda: store.delete(parts["app_name"], parts["session_id"])]
        if kind in ("app_name", "tenant"):
            reads += [lambda: store.list(parts["app_name"], limit=5)]
        if kind in ("app_name", "tenant", "scope", "scope_id"):
            reads += [lambda: store.load_scoped_state(parts["app_name"], parts["scope"], parts["scope_id"])]
        for read in reads:
            with pytest.raises(error) as refused:
                read()
            assert type(refused.value) is error
        # Nothing written: not the session, not its listing, not the scoped change.
        assert store.load(app, "s-1") is None and store.list(app) == []
        assert store.load_scoped_state(app, "user", "u-1") == {}
        if isinstance(store, ErasableStore):
            assert store.bound_sessions(app, "user", "u-1") == []
        # And nothing held: the same session, with good keys, is created at once.
        good = StoredSession(id="s-1", app_name=app, scopes={"user": "u-1"})
        assert store.commit(good, [_event(1)], 0, [ScopedStateChange("user", "u-1", "name", "Ada")]).ok

    @pytest.mark.parametrize("defect", sorted(KEY_DEFECTS))
    def test_an_event_id_outside_the_key_rule_is_refused_and_writes_nothing(
        self, store: SessionStore, app: str, defect: str
    ) -> None:
        """An event id is a key too (DynamoDB's id index sorts on it, the SQL stores key events by it)."""
        meta = self.meta(app, "s-1")
        bad = UserEvent(id=self.KEY_DEFECTS[defect], created_at=1_700_000_000_000, text="hello")
        with pytest.raises(InputError) as caught:
            store.commit(meta, [_event(1), bad], 0)
        assert type(caught.value) is InvalidKey and caught.value.field == "new_events.1.id"
        assert store.load(app, "s-1") is None and store.list(app) == []
        assert store.commit(meta, [_event(1)], 0).ok
        with pytest.raises(InvalidKey):
            store.commit(meta, [_event(2), bad], 1)
        loaded = store.load(app, "s-1")
        assert loaded is not None and loaded.session.version == 1 and _ids(loaded.events) == ["evt-1"]

    def test_scoped_keys_at_the_key_rule_s_limits_are_kept(self, store: SessionStore, app: str) -> None:
        keys = ["k", "k" * MAX_KEY_LENGTH, "\u00e9" * MAX_KEY_LENGTH, "\U0001f600" * MAX_KEY_LENGTH, "a#b@c d"]
        meta = self.meta(app, scopes={"user": "u-1"})
        assert store.commit(
            meta, [_event(1)], 0, [ScopedStateChange("user", "u-1", k, n) for n, k in enumerate(keys)]
        ).ok
        assert store.load_scoped_state(app, "user", "u-1") == {k: n for n, k in enumerate(keys)}

    def test_ids_at_the_key_rule_s_limit_are_kept_in_every_key(self, store: SessionStore) -> None:
        """The longest app name, tenant, session id, scope id and scoped key at once: every key the store builds
        from them (DynamoDB's partition and sort keys with their prefixes) still fits."""
        longest = "a" * MAX_KEY_LENGTH
        app = f"{uuid.uuid4().hex}{'a' * (MAX_KEY_LENGTH - 32)}{TENANT_SEPARATOR}{longest}"
        sid, key = "s" * MAX_KEY_LENGTH, "\U0001f600" * MAX_KEY_LENGTH
        meta = StoredSession(id=sid, app_name=app, scopes={"user": longest, "org": longest})
        change = ScopedStateChange("user", longest, key, 1)
        assert store.commit(meta, [_event(1)], 0, [change]).ok
        assert store.commit(StoredSession(id=sid, app_name=app, scopes=meta.scopes), [_event(2)], 1).ok
        loaded = store.load(app, sid)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]
        assert store.load_scoped_state(app, "user", longest) == {key: 1}
        listed = store.list(app, limit=1)
        assert [s.id for s in listed] == [sid]
        assert store.list(app, limit=1, cursor=listed[0].cursor) == []
        if isinstance(store, ErasableStore):
            assert store.bound_sessions(app, "org", longest) == [sid]
        store.delete(app, sid)
        assert store.load(app, sid) is None

    def test_a_scope_name_outside_the_key_rule_is_refused(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        for scope in ("", "s" * 129, "a\ud800", "a\x00", "a#b", "a@b"):
            with pytest.raises(InvalidKey) as caught:
                store.commit(meta, [_event(1)], 0, [ScopedStateChange(scope, "u-1", "k", 1)])
            assert caught.value.field == "scoped_changes.0.scope"
            with pytest.raises(InvalidKey) as caught:
                store.load_scoped_state(app, scope, "u-1")
            assert caught.value.field == "scope"
            with pytest.raises(InvalidKey) as caught:
                store.commit(self.meta(app, scopes={scope: "u-1"}), [_event(1)], 0)
            assert caught.value.field == "scopes"
        assert store.load(app, meta.id) is None

    # -- tenants: "{app}@{tenant}" has one reading -------------------------------------------

    def test_an_app_named_like_a_tenant_cannot_reach_the_tenant_nor_the_tenant_it(
        self, store: SessionStore, app: str
    ) -> None:
        """``clinic@eu`` is tenant ``eu`` of ``clinic`` and nothing else: no app may take that name (nor any
        name with ``@``), so none sees, lists, purges or erases the tenant's sessions, and the tenant none of
        theirs. The apps whose names come closest (``clinic.eu``, ``clinic-eu``, ``clinic@eu.x`` as tenant
        ``eu.x``, tenant ``eu`` of ``clinic.x``) keep to their own keys, through every path."""
        from ..app import App, adk
        from ..serving.runtime import for_tenant, purge_tenants

        hour = 3_600_000

        def make(name: str) -> App:
            return adk(name=name, store=store, schema={"user": _Owner}, retention=timedelta(milliseconds=hour))

        clinic = make(app)
        for name in (f"{app}@eu", f"{app}@eu@x", f"@{app}", f"{app}@"):
            with pytest.raises(InvalidKey) as caught:
                adk(name=name, store=store)
            assert caught.value.field == "app_name"
        for crafted in (f"{app}@eu@x", f"{app}@@eu", f"@{app}", f"{app}@"):
            with pytest.raises(InvalidKey) as caught:
                store.commit(self.meta(crafted, "s-1"), [_event(1)], 0)
            assert caught.value.field == "app_name"
        with pytest.raises(InvalidKey) as caught:
            for_tenant(clinic, "eu@x")
        assert caught.value.field == "tenant"

        tenant = for_tenant(clinic, "eu")
        assert tenant.name == f"{app}@eu"
        others = [
            clinic,
            make(f"{app}.eu"),
            make(f"{app}-eu"),
            for_tenant(clinic, "eu.x"),
            for_tenant(make(f"{app}.x"), "eu"),
        ]
        views = [tenant, *others]
        lists_tenants = isinstance(store, ErasableStore) and store.app_names(f"{app}@") is not None
        with frozen_clock(2_000_000_000_000) as clock:
            for view in views:  # the same ids everywhere: only the app name keeps them apart
                view.sessions.create("s-old", scopes={"user": "u-1"})
            clock.advance(hour // 2)
            for view in views:
                view.sessions.create("s-new", scopes={"user": "u-1"})
                assert store.commit(
                    StoredSession(id="s-new", app_name=view.name, scopes={"user": "u-1"}, retention_ms=hour),
                    [_event(1, view.name)],
                    1,
                    [ScopedStateChange("user", "u-1", "owner", view.name)],
                ).ok
            clock.advance(hour // 2)  # every s-old is past its hour, every s-new within it
            for view in views:
                loaded = store.load(view.name, "s-new")
                assert loaded is not None and [e.text for e in loaded.events if isinstance(e, UserEvent)] == [view.name]
                assert store.load_scoped_state(view.name, "user", "u-1") == {"owner": view.name}
                assert [s.id for s in view.sessions.list()] == ["s-new"]
            if lists_tenants:
                assert isinstance(store, ErasableStore)
                assert store.app_names(f"{app}@") == sorted([f"{app}@eu", f"{app}@eu.x"])
                assert store.app_names(f"{app}.x@") == [f"{app}.x@eu"]
            # The clinic's purge takes its own and its tenants' expired sessions, never another app's.
            purged = purge_tenants(clinic)
            tenants_of_clinic = (app, f"{app}@eu", f"{app}@eu.x")
            assert purged == ({name: ["s-old"] for name in tenants_of_clinic} if lists_tenants else {})
            for view in others[1:3] + others[4:]:
                # Still listed (expired) unless the store expires rows itself (DynamoDB): only its own purge deletes it.
                listed = [s.id for s in store.list(view.name)]
                assert view.sessions.purge() == (["s-old"] if "s-old" in listed else [])
                assert store.load(view.name, "s-old") is None or "s-old" not in listed
            for view in views:
                assert store.load(view.name, "s-new") is not None
        if not isinstance(store, ErasableStore):  # no binding index to erase by: refused, by design
            with pytest.raises(ConfigurationError, match="ErasableStore"):
                tenant.erase(scope="user", scope_id="u-1")
            return
        # An erasure in one view removes that view's sessions and state of u-1, and nobody else's.
        for eraser in (others[1], tenant):
            report = eraser.erase(scope="user", scope_id="u-1")
            assert "s-new" in report.sessions and set(report.sessions) <= {"s-new", "s-old"}
            assert report.scoped_keys == ["owner"]
            for view in views:
                erased = view is others[1] or (view is tenant and eraser is tenant)
                assert (store.load(view.name, "s-new") is None) is erased, (eraser.name, view.name)
                assert (store.load_scoped_state(view.name, "user", "u-1") == {}) is erased
        assert "s-new" in store.bound_sessions(f"{app}@eu.x", "user", "u-1")

    @pytest.mark.parametrize(
        "cursor",
        [
            *(
                base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
                for text in (
                    '[1e40, "s-1"]',
                    '[1e308, "s-1"]',
                    '[Infinity, "s-1"]',
                    '[1.5, "s-1"]',
                    '[-1, "s-1"]',
                    '[true, "s-1"]',
                    f'[{MAX_CURSOR_TIME + 1}, "s-1"]',
                    '[1, "\\ud800"]',
                    '[1, "a\\u0000"]',
                    '[1, ""]',
                    '[1, "a b"]',
                    "[1, 2]",
                    '[1, "s-1", 2]',
                    "{}",
                )
            ),
            encode_cursor(1, "s" * (MAX_KEY_LENGTH + 1)),
            "A" * (MAX_CURSOR_LENGTH + 1),
            "garbage!",
            "",
            "\x00",
            "\ud800",
            "\u00e9t\u00e9",
        ],
    )
    def test_a_crafted_cursor_is_an_input_error_naming_cursor(self, store: SessionStore, app: str, cursor: str) -> None:
        assert store.commit(self.meta(app), [_event(1)], 0).ok
        with pytest.raises(InvalidKey) as caught:
            store.list(app, limit=5, cursor=cursor)
        assert type(caught.value) is InvalidKey and caught.value.field == "cursor"

    def test_the_longest_cursor_is_within_its_limit(self, store: SessionStore, app: str) -> None:
        longest = encode_cursor(MAX_CURSOR_TIME, "s" * MAX_KEY_LENGTH)
        assert len(longest) == MAX_CURSOR_LENGTH  # the limit is the longest cursor a listing can return
        assert store.list(app, limit=5, cursor=longest) == []

    def test_a_cursor_at_the_greatest_time_lists_from_the_top(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app, "s-only")
        assert store.commit(meta, [_event(1)], 0).ok
        assert [s.id for s in store.list(app, limit=5, cursor=encode_cursor(MAX_CURSOR_TIME, "s-zzz"))] == ["s-only"]
        assert store.list(app, limit=5, cursor=encode_cursor(0, "s-0")) == []

    # -- expiry -----------------------------------------------------------------------------

    def test_creating_the_id_of_an_expired_session_starts_it_afresh(self, store: SessionStore, app: str) -> None:
        """A session past its retention is gone for writers on every store: creating its id again starts a
        new session (version 1, none of the old events), never a conflict revealing the old version; while it
        lives, its id is taken."""
        hour = 3_600_000
        with frozen_clock(2_000_000_000_000) as clock:
            meta = self.meta(app, "s-again", retention_ms=hour)
            assert store.commit(meta, [_event(1), _event(2)], 0).ok
            assert store.commit(meta, [_event(3)], 1).ok
            clock.advance(hour // 2)
            taken = store.commit(meta, [_event(9)], 0)
            assert (taken.ok, taken.version) == (False, 2)
            clock.advance(hour)  # an hour and a half after its last commit
            again = store.commit(meta, [_event(1), _event(9)], 0)
            assert (again.ok, again.version, again.appended) == (True, 1, 2)  # evt-1 is new to this session
            loaded = store.load(app, "s-again")
            assert loaded is not None and loaded.session.version == 1
            assert _ids(loaded.events) == ["evt-1", "evt-9"]
            assert [(s.id, s.version) for s in store.list(app)] == [("s-again", 1)]
            assert store.commit(meta, [_event(10)], 1).ok
            assert store.commit(meta, [_event(11)], 0).version == 2  # and the new one's id is taken

    # -- the clock --------------------------------------------------------------------------

    def test_updated_at_never_goes_backwards(self, store: SessionStore, app: str) -> None:
        """A writer whose clock is behind (another machine) must not move a session down the listing."""
        first, second = self.meta(app, "s-first"), self.meta(app, "s-second")
        with frozen_clock(2_000_000_000_000) as clock:
            store.commit(first, [_event(1)], 0)
            store.commit(second, [_event(1)], 0)  # the same instant: ties are broken by id
            clock.advance(-1_000_000_000_000)
            store.commit(first, [_event(2)], 1)
        loaded = store.load(app, first.id)
        assert loaded is not None and loaded.session.updated_at == 2_000_000_000_000
        listed = store.list(app)
        assert [(s.id, s.updated_at) for s in listed] == [
            ("s-second", 2_000_000_000_000),
            ("s-first", 2_000_000_000_000),
        ]

    # -- concurrency ------------------------------------------------------------------------

    def test_concurrent_committers_never_lose_or_double_an_event(self, store: SessionStore, app: str) -> None:
        meta = self.meta(app)
        store.commit(meta, [], 0)
        writers, per_writer = 4, 15
        peers = [self.make_peer(store) for _ in range(writers)]
        versions: list[int] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        start = threading.Barrier(writers, timeout=WAIT)

        def write(w: int, peer: SessionStore) -> None:
            try:
                start.wait()
                for n in range(per_writer):
                    event = _event(f"w{w}-{n}")
                    for _attempt in range(1000):
                        loaded = peer.load(app, meta.id)
                        assert loaded is not None
                        result = peer.commit(meta, [event], loaded.session.version)
                        if result.ok:
                            with lock:
                                versions.append(result.version)
                            break
                    else:
                        raise AssertionError(f"writer {w} never got a commit through")
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w, peer)) for w, peer in enumerate(peers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(thread.is_alive() for thread in threads), f"a writer was still running after {WAIT} s"
        for peer in peers:
            if peer is not store:
                peer.close()
        assert errors == []
        loaded = store.load(app, meta.id)
        assert loaded is not None
        ids = _ids(loaded.events)
        expected = {f"evt-w{w}-{n}" for w in range(writers) for n in range(per_writer)}
        assert len(ids) == len(expected) and set(ids) == expected
        assert sorted(versions) == list(range(2, 2 + writers * per_writer))
        assert loaded.session.version == 1 + writers * per_writer
        for w in range(writers):  # each writer's events in its own order
            mine = [i for i in ids if i.startswith(f"evt-w{w}-")]
            assert mine == [f"evt-w{w}-{n}" for n in range(per_writer)]

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(
        steps=st.lists(
            st.tuples(
                st.lists(st.integers(min_value=0, max_value=30), max_size=6),  # event numbers in the batch
                st.integers(min_value=-1, max_value=1),  # version skew: -1 stale, 0 right, 1 ahead
            ),
            min_size=1,
            max_size=12,
        )
    )
    def test_any_sequence_of_commits_matches_a_reference_ledger(
        self, store: SessionStore, app: str, steps: list[tuple[list[int], int]]
    ) -> None:
        """Against a plain-Python model of the contract: order, idempotency and OCC, whatever the mix."""
        meta = self.meta(app)
        ledger: list[str] = []
        version = 0
        for numbers, skew in steps:
            expected = max(0, version + skew)
            events = [_event(n) for n in numbers]
            result = store.commit(meta, events, expected)
            if expected == version:
                new = []
                for event in events:
                    if event.id not in ledger and event.id not in new:
                        new.append(event.id)
                ledger += new
                version += 1
                assert (result.ok, result.version, result.appended) == (True, version, len(new))
            else:
                assert (result.ok, result.version, result.appended) == (False, version, 0)
        loaded = store.load(app, meta.id)
        assert (loaded is None) == (version == 0)
        if loaded is not None:
            assert _ids(loaded.events) == ledger and loaded.session.version == version

    # -- snapshots (the optional part) ------------------------------------------------------

    def snapshots_of(self, store: SessionStore) -> SnapshotStore:
        """The store as a ``SnapshotStore``; a store that keeps no snapshots reports these tests skipped."""
        if not isinstance(store, SnapshotStore):
            pytest.skip("this store has no snapshots (loads read the whole ledger)")
        return store

    def test_a_snapshot_is_kept_newest_first_and_goes_with_its_session(self, store: SessionStore, app: str) -> None:
        snaps = self.snapshots_of(store)
        meta = self.meta(app)
        assert not snaps.save_snapshot(app, meta.id, StoredSnapshot(1, "none yet")), "no row: nothing kept"
        store.commit(meta, [_event(1)], 0)
        if not snaps.save_snapshot(app, meta.id, StoredSnapshot(1, "at 1")):
            pytest.skip("this store keeps no snapshots (loads read the whole ledger)")
        assert snaps.load_snapshot(app, meta.id) == StoredSnapshot(1, "at 1")
        assert not snaps.save_snapshot(app, meta.id, StoredSnapshot(2, "ahead of the row"))
        store.commit(meta, [_event(2)], 1)
        store.commit(meta, [_event(3)], 2)
        assert snaps.save_snapshot(app, meta.id, StoredSnapshot(3, "at 3"))
        assert not snaps.save_snapshot(app, meta.id, StoredSnapshot(2, "older: a slow writer"))
        assert not snaps.save_snapshot(app, meta.id, StoredSnapshot(3, "the same version again"))
        assert snaps.load_snapshot(app, meta.id) == StoredSnapshot(3, "at 3")
        other = self.meta(app)
        store.commit(other, [_event(1)], 0)
        assert snaps.load_snapshot(app, other.id) is None
        assert snaps.load_snapshot(f"{app}-other", meta.id) is None
        store.delete(app, meta.id)
        assert snaps.load_snapshot(app, meta.id) is None
        store.commit(meta, [_event(1), _event(2), _event(3), _event(4)], 0)  # made again: no snapshot of the old one
        for version in range(1, 4):
            store.commit(meta, [], version)
        assert snaps.load_snapshot(app, meta.id) is None

    def test_a_snapshot_over_its_limit_is_not_kept_and_bad_ones_are_refused(
        self, store: SessionStore, app: str
    ) -> None:
        snaps = self.snapshots_of(store)
        meta = self.meta(app)
        store.commit(meta, [_event(1)], 0)
        store.commit(meta, [_event(2)], 1)
        limit = self.limits(store).max_snapshot_bytes
        if not snaps.save_snapshot(app, meta.id, StoredSnapshot(1, "é" * (limit // 2))):
            pytest.skip("this store keeps no snapshots (loads read the whole ledger)")
        assert not snaps.save_snapshot(app, meta.id, StoredSnapshot(2, "é" * (limit // 2 + 1)))  # bytes, not chars
        assert snaps.load_snapshot(app, meta.id) == StoredSnapshot(1, "é" * (limit // 2))
        for bad in (StoredSnapshot(0, "x"), StoredSnapshot(-1, "x"), "x"):
            with pytest.raises(InputError) as caught:
                snaps.save_snapshot(app, meta.id, bad)  # type: ignore[arg-type]
            assert caught.value.field == "snapshot"

    # -- lifecycle --------------------------------------------------------------------------

    def test_close_twice_is_harmless_and_a_closed_store_says_so(self, app: str) -> None:
        store = self.make_store()
        store.close()
        store.close()
        with pytest.raises(StoreClosed):
            store.load(app, "any")
