"""Listing: the binding index an erasure reads, the per-app listing by status, and the running and waiting
sessions the sweeper reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ...clock import frozen_clock
from ...errors import (
    InputError,
)
from ...events import (
    Event,
    InvocationEndEvent,
    InvocationStartEvent,
)
from ...stores.base import (
    NOT_DUE,
    DueStore,
    ErasableStore,
    RunningSession,
    ScopedStateChange,
    SessionStore,
    SweepableStore,
)
from .base import ContractBase, _event


class ListingContract(ContractBase):
    # -- bindings (what an erasure reads) -----------------------------------------------------

    def test_bound_sessions_names_the_sessions_bound_to_one_id(self, store: SessionStore, app: str) -> None:
        if not isinstance(store, ErasableStore):
            pytest.skip("bound_sessions is part of ErasableStore, which this store is not")
        store.commit(self.row(app, "s-b", scopes={"user": "u-1", "org": "o-1"}), [_event(1)], 0)
        store.commit(self.row(app, "s-a", scopes={"user": "u-1"}), [], 0)
        store.commit(self.row(app, "s-c", scopes={"user": "u-2", "org": "o-1"}), [], 0)
        store.commit(self.row(f"{app}-other", "s-d", scopes={"user": "u-1"}), [], 0)
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
        mine = [self.row(app) for _ in range(3)]
        for row in mine:
            store.commit(row, [_event(1)], 0)
        store.commit(self.row(other_app), [_event(1)], 0)
        listed = store.list(app)
        assert sorted(s.id for s in listed) == sorted(m.id for m in mine)
        assert all(s.updated_at > 0 for s in listed)
        assert [s.id for s in store.list(other_app)] != [] and not {s.id for s in store.list(other_app)} & {
            m.id for m in mine
        }
        assert store.list(f"{app}-empty") == []

    def test_list_puts_the_most_recently_updated_first_and_pages(self, store: SessionStore, app: str) -> None:
        rows = [self.row(app, f"s{n}") for n in range(5)]
        with frozen_clock(1_800_000_000_000) as clock:
            for row in rows:
                clock.advance(1)
                store.commit(row, [], 0)
            clock.advance(1)
            store.commit(rows[0], [_event(1)], 1)  # touched last: listed first
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
        row = self.row(app, status="running")
        store.commit(row, [_event(1)], 0)
        store.commit(self.row(app, row.id, status="awaiting_input"), [_event(2)], 1)
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
                store.commit(self.row(app, sid, status=status), [_event(n)], 0)
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
            store.commit(self.row(app, "other", status="running"), [_event(0)], 0)
            clock.advance(1)
            store.commit(self.row(app, "moving", status="running"), [_event(1)], 0)
            assert [s.id for s in store.list(app, status="running")] == ["moving", "other"]
            assert store.list(app, status="awaiting_input") == []
            clock.advance(1)
            store.commit(self.row(app, "moving", status="awaiting_input"), [_event(2)], 1)
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
        if not isinstance(store, SweepableStore):
            pytest.skip("running_sessions is part of SweepableStore, which this store is not")
        other = f"{app}-other"
        made: list[tuple[str, str]] = []

        def commit(owner: str, sid: str, status: str, events: Sequence[Event], expected: int) -> bool:
            made.append((owner, sid))
            return store.commit(self.row(owner, sid, status=status), events, expected).ok

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
                assert loaded is not None and loaded.row.updated_at == t + 10
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
        if not isinstance(store, SweepableStore):
            pytest.skip("waiting_sessions is part of SweepableStore, which this store is not")
        other = f"{app}-other"
        made: list[tuple[str, str]] = []

        def commit(owner: str, sid: str, status: str, n: int, expected: int) -> bool:
            made.append((owner, sid))
            return store.commit(self.row(owner, sid, status=status), [_event(n)], expected).ok

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

    def test_due_waits_are_the_waits_due_by_a_time(self, store: SessionStore, app: str) -> None:
        """A commit into a waiting status makes the session due from its time; ``set_due`` moves it while the
        session waits at the version given (never after a later commit, never a session that does not wait);
        ``due_waits`` pages the due ones by ``(due_at, app, id)`` past a cursor row, each with its version; a
        session that runs, ends or is deleted leaves; ``NOT_DUE`` keeps a wait out of every sweep's range."""
        if not isinstance(store, DueStore):
            pytest.skip("due_waits is part of DueStore, which this store is not")
        other = f"{app}-other"
        made: list[tuple[str, str]] = []

        def commit(owner: str, sid: str, status: str, n: int, expected: int) -> bool:
            made.append((owner, sid))
            return store.commit(self.row(owner, sid, status=status), [_event(n)], expected).ok

        def due(before: int, limit: int = 1) -> list[tuple[str, str, int | None, str, int | None]]:
            """Every page of ``limit`` rows, the cursor carried from page to page; only this test's sessions."""
            rows: list[RunningSession] = []
            after: RunningSession | None = None
            while True:
                page = store.due_waits(before, limit=limit, after=after)
                assert len(page) <= limit
                rows += page
                if len(page) < limit:
                    break
                after = page[-1]
            assert [(r.due_at, r.app_name, r.session_id) for r in rows] == sorted(
                (r.due_at, r.app_name, r.session_id) for r in rows
            )
            return [
                (r.app_name, r.session_id, r.due_at, r.status, r.version) for r in rows if r.app_name in (app, other)
            ]

        t = 1_000_000_000
        try:
            with frozen_clock(t) as clock:
                for owner, sid, status in (
                    (app, "s-asks", "awaiting_input"),  # t+1
                    (other, "s-answered", "resumable"),  # t+2
                    (app, "s-runs", "running"),  # t+3
                    (app, "s-parks", "awaiting_input"),  # t+4
                    (other, "s-idle", "idle"),  # t+5
                    (app, "s-deleted", "awaiting_input"),  # t+6
                ):
                    clock.advance(1)
                    assert commit(owner, sid, status, 1, 0)
                everything = [
                    (app, "s-asks", t + 1, "awaiting_input", 1),
                    (other, "s-answered", t + 2, "resumable", 1),
                    (app, "s-parks", t + 4, "awaiting_input", 1),
                    (app, "s-deleted", t + 6, "awaiting_input", 1),
                ]
                assert due(t + 10) == due(t + 10, limit=100) == everything
                assert due(t + 4) == everything[:3]  # due by then: t+4 included, t+6 not
                assert due(t) == []
                # Parked: due at its timeout. A stale version, a session that does not wait: nothing set.
                assert store.set_due(app, "s-parks", 1, t + 1_000)
                assert not store.set_due(app, "s-asks", 7, t + 1_000)
                assert not store.set_due(app, "s-runs", 1, t + 1_000)
                assert not store.set_due(app, "s-never", 1, t + 1_000)
                assert store.set_due(other, "s-answered", 1, t + 1)  # a tie with s-asks: the app name orders
                assert due(t + 10) == [
                    (app, "s-asks", t + 1, "awaiting_input", 1),
                    (other, "s-answered", t + 1, "resumable", 1),
                    (app, "s-deleted", t + 6, "awaiting_input", 1),
                ]
                assert due(t + 1_000)[-1] == (app, "s-parks", t + 1_000, "awaiting_input", 1)
                clock.advance(10)  # t+16
                assert commit(app, "s-parks", "resumable", 2, 1)  # answered: due from the answer
                assert commit(app, "s-asks", "running", 2, 1)  # resumed: no longer waits
                assert commit(app, "s-runs", "awaiting_input", 2, 1)  # yielded: due from the yield
                store.delete(app, "s-deleted")
                assert not store.set_due(app, "s-parks", 1, t + 1_000)  # the answer's commit moved it on
                assert store.set_due(other, "s-answered", 1, NOT_DUE)  # needs nobody until its next commit
                assert due(t + 10**9, limit=100) == [
                    (app, "s-parks", t + 16, "resumable", 2),
                    (app, "s-runs", t + 16, "awaiting_input", 2),
                ]
                assert (other, "s-answered", NOT_DUE, "resumable", 1) in due(NOT_DUE, limit=100)
                if isinstance(store, SweepableStore):  # a wait kept out of every sweep is still listed
                    assert ("s-answered", "resumable") in [
                        (r.session_id, r.status) for r in store.waiting_sessions() if r.app_name == other
                    ]
                for call, field in (
                    (lambda: store.due_waits(-1), "before"),
                    (lambda: store.due_waits(t, limit=0), "limit"),
                    (lambda: store.due_waits(t, after=RunningSession(app, "s-x", t)), "after"),
                    (lambda: store.set_due(app, "s-runs", 0, t), "version"),
                    (lambda: store.set_due(app, "s-runs", 2, NOT_DUE + 1), "due_at"),
                ):
                    with pytest.raises(InputError) as refused:
                        call()
                    assert refused.value.field == field
        finally:
            for owner, sid in set(made):
                store.delete(owner, sid)
        assert due(NOT_DUE, limit=100) == []

    def test_set_due_with_scoped_changes_writes_them_with_it_and_moves_nothing_else(
        self, store: SessionStore, app: str
    ) -> None:
        """``set_due(scoped_changes=)`` (park's wait record): the shared-scope writes land with the due time, in
        one atomic write, and only when it is set (a stale version, a session that does not wait: neither). The
        session is not committed: its version, ``updated_at``, listing row and place in the list stay."""
        if not isinstance(store, DueStore):
            pytest.skip("set_due is part of DueStore, which this store is not")
        t = 1_000_000_000
        record = {"task_token": "t-1", "wait_version": 1}
        try:
            with frozen_clock(t) as clock:
                assert store.commit(self.row(app, "s-waits", status="awaiting_input"), [_event(1)], 0).ok
                clock.advance(1)
                assert store.commit(self.row(app, "s-later", status="idle"), [_event(1)], 0).ok
                listed = [(r.id, r.version, r.updated_at, r.status) for r in store.list(app)]
                assert listed == [("s-later", 1, t + 1, "idle"), ("s-waits", 1, t, "awaiting_input")]
                clock.advance(5)
                wait = [ScopedStateChange("workflow", "s-waits", "wait", record)]
                assert not store.set_due(app, "s-waits", 2, t + 9_000, scoped_changes=wait)  # a stale version
                assert not store.set_due(app, "s-later", 1, t + 9_000, scoped_changes=wait)  # does not wait
                assert store.load_scoped_state(app, "workflow", "s-waits") == {}
                assert store.set_due(app, "s-waits", 1, t + 9_000, scoped_changes=wait)
                assert store.load_scoped_state(app, "workflow", "s-waits") == {"wait": record}
                assert [(r.id, r.version, r.updated_at, r.status) for r in store.list(app)] == listed
                assert [r.id for r in store.list(app, status="awaiting_input")] == ["s-waits"]
                loaded = store.load(app, "s-waits")
                assert loaded is not None and (loaded.row.version, loaded.row.updated_at) == (1, t)
                waits = [(r.session_id, r.due_at, r.version) for r in store.due_waits(t + 9_000) if r.app_name == app]
                assert waits == [("s-waits", t + 9_000, 1)] and store.due_waits(t + 8_999) == []
                clock.advance(1)
                assert store.commit(self.row(app, "s-waits", status="resumable"), [_event(2)], 1).ok  # answered
                assert not store.set_due(app, "s-waits", 1, NOT_DUE, scoped_changes=wait)  # its commit moved it
        finally:
            for sid in ("s-waits", "s-later"):
                store.delete(app, sid)
