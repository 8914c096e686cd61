"""The ledger: create, append in order, optimistic concurrency, delete, fork fields and loading the tail."""

from __future__ import annotations

from typing import Any

import pytest

from ...errors import (
    InputError,
)
from ...events import (
    Event,
    StateChange,
    StateChangeEvent,
    ToolCallEvent,
    UserEvent,
)
from ...stores.base import (
    ScopedStateChange,
    SessionStore,
)
from .base import ContractBase, _event, _ids


class LedgerContract(ContractBase):
    # -- load and create --------------------------------------------------------------------

    def test_load_of_a_missing_session_is_none(self, store: SessionStore, app: str) -> None:
        assert store.load(app, "no-such-session") is None

    def test_create_with_expected_zero_gives_version_one(self, store: SessionStore, app: str) -> None:
        row = self.row(app, scopes={"user": "u-1"}, status="idle")
        result = store.commit(row, [], 0)
        assert (result.ok, result.version, result.appended) == (True, 1, 0)
        loaded = store.load(app, row.id)
        assert loaded is not None
        assert (loaded.row.id, loaded.row.app_name, loaded.row.version) == (row.id, app, 1)
        assert loaded.row.scopes == {"user": "u-1"}
        assert loaded.row.created_at == row.created_at
        assert loaded.row.status == "idle"
        assert loaded.events == []

    def test_create_with_events(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        result = store.commit(row, [_event(1), _event(2)], 0)
        assert (result.ok, result.version, result.appended) == (True, 1, 2)
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]

    def test_create_twice_conflicts(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1)], 0)
        again = store.commit(row, [_event(2)], 0)
        assert (again.ok, again.version, again.appended) == (False, 1, 0)
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1"]

    # -- append and order -------------------------------------------------------------------

    def test_append_bumps_the_version_by_one(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1)], 0)
        result = store.commit(row, [_event(2), _event(3)], 1)
        assert (result.ok, result.version, result.appended) == (True, 2, 2)
        empty = store.commit(row, [], 2)
        assert (empty.ok, empty.version, empty.appended) == (True, 3, 0)
        loaded = store.load(app, row.id)
        assert loaded is not None and loaded.row.version == 3

    def test_order_within_and_across_batches(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        # Ids that sort in a different order than they were appended, and identical timestamps:
        # only the append order may decide.
        batches = [["z", "a", "m"], ["b", "y"], ["c"]]
        version = 0
        for batch in batches:
            events = [UserEvent(id=i, created_at=1, text=i) for i in batch]
            version = store.commit(row, events, version).version
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["z", "a", "m", "b", "y", "c"]

    def test_recommitted_ids_are_not_duplicated_and_new_ones_land_in_order(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1), _event(2)], 0)
        # A retried batch that overlaps stored history: event 2 is stored, 3 and 4 are not.
        result = store.commit(row, [_event(2), _event(3), _event(1), _event(4)], 1)
        assert (result.ok, result.version, result.appended) == (True, 2, 2)
        store.commit(row, [_event(5)], 2)
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"]

    def test_an_id_repeated_inside_one_batch_lands_once(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        result = store.commit(row, [_event(1), _event(2), _event(1)], 0)
        assert result.appended == 2
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]

    def test_a_sixty_event_batch(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        events = [_event(n) for n in range(60)]
        result = store.commit(row, events, 0)
        assert (result.ok, result.appended) == (True, 60)
        more = [_event(n) for n in range(55, 130)]  # 5 already stored, 70 new, across batch boundaries
        assert store.commit(row, more, 1).appended == 70
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == [f"evt-{n}" for n in range(130)]

    def test_the_same_event_id_may_live_in_two_sessions(self, store: SessionStore, app: str) -> None:
        first, second = self.row(app), self.row(app)
        store.commit(first, [_event(1, "first")], 0)
        assert store.commit(second, [_event(1, "second")], 0).appended == 1
        a, b = store.load(app, first.id), store.load(app, second.id)
        assert a is not None and b is not None
        assert [e.text for e in a.events if isinstance(e, UserEvent)] == ["first"]
        assert [e.text for e in b.events if isinstance(e, UserEvent)] == ["second"]

    def test_events_round_trip_exactly(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
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
        store.commit(row, events, 0)
        loaded = store.load(app, row.id)
        assert loaded is not None and loaded.events == events

    # -- optimistic concurrency -------------------------------------------------------------

    def test_a_stale_commit_is_refused_and_writes_nothing(self, store: SessionStore, app: str) -> None:
        row = self.row(app, scopes={"user": "u-1"})
        store.commit(row, [_event(1)], 0)
        store.commit(row, [_event(2)], 1)
        stale = store.commit(row, [_event(3)], 1, [ScopedStateChange("user", "u-stale", "theme", "dark")])
        assert (stale.ok, stale.version, stale.appended) == (False, 2, 0)
        loaded = store.load(app, row.id)
        assert loaded is not None and _ids(loaded.events) == ["evt-1", "evt-2"]
        assert loaded.row.version == 2
        assert store.load_scoped_state(app, "user", "u-stale") == {}

    def test_a_commit_ahead_of_the_store_is_refused(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1)], 0)
        ahead = store.commit(row, [_event(2)], 5)
        assert (ahead.ok, ahead.version) == (False, 1)

    def test_a_commit_to_a_missing_session_conflicts_with_version_zero(self, store: SessionStore, app: str) -> None:
        result = store.commit(self.row(app), [_event(1)], 3)
        assert (result.ok, result.version, result.appended) == (False, 0, 0)

    def test_a_commit_against_a_deleted_session_conflicts(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1)], 0)
        store.delete(app, row.id)
        result = store.commit(row, [_event(2)], 1, [ScopedStateChange("user", "u-del", "k", 1)])
        assert (result.ok, result.version) == (False, 0)
        assert store.load(app, row.id) is None
        assert store.load_scoped_state(app, "user", "u-del") == {}

    # -- delete -----------------------------------------------------------------------------

    def test_delete_removes_the_row_and_its_events(self, store: SessionStore, app: str) -> None:
        row, other = self.row(app), self.row(app)
        store.commit(row, [_event(1), _event(2)], 0)
        store.commit(other, [_event(1)], 0)
        store.delete(app, row.id)
        assert store.load(app, row.id) is None
        assert [s.id for s in store.list(app)] == [other.id]
        # The id can be created afresh, and holds none of the old events.
        assert store.commit(row, [_event(9)], 0).ok
        again = store.load(app, row.id)
        assert again is not None and _ids(again.events) == ["evt-9"]
        other_loaded = store.load(app, other.id)
        assert other_loaded is not None and _ids(other_loaded.events) == ["evt-1"]

    def test_deleting_a_missing_session_is_harmless(self, store: SessionStore, app: str) -> None:
        store.delete(app, "never-was")

    # -- fork fields ------------------------------------------------------------------------

    def test_fork_fields_are_kept_from_creation(self, store: SessionStore, app: str) -> None:
        fork = self.row(app, forked_from="s-origin", fork_reason="both answered tool call c1")
        store.commit(fork, [_event(1)], 0)
        plain = self.row(app)
        store.commit(plain, [], 0)
        store.commit(self.row(app, fork.id), [_event(2)], 1)  # a later commit that does not repeat them
        loaded, other = store.load(app, fork.id), store.load(app, plain.id)
        assert loaded is not None and other is not None
        assert (loaded.row.forked_from, loaded.row.fork_reason) == ("s-origin", "both answered tool call c1")
        assert (other.row.forked_from, other.row.fork_reason) == (None, None)

    # -- loading the tail -------------------------------------------------------------------

    def test_load_after_a_version_returns_only_the_later_events(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [_event(1), _event(2)], 0)  # version 1
        store.commit(row, [], 1)  # version 2: no events
        store.commit(row, [_event(3)], 2)  # version 3
        store.commit(row, [_event(2), _event(4), _event(5)], 3)  # version 4: evt-2 is stored already
        tails = {}
        for after in (None, 0, 1, 2, 3, 4, 99):
            loaded = store.load(app, row.id, after=after)
            assert loaded is not None and loaded.row.version == 4
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
