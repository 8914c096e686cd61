"""Limits: what one commit, one event and one scoped value may carry (the store's ``limits``)."""

from __future__ import annotations

import pytest

from ...errors import (
    CommitTooLarge,
    EventTooLarge,
)
from ...stores.base import (
    ScopedStateChange,
    SessionStore,
)
from .base import ContractBase, _event


class LimitsContract(ContractBase):
    # -- limits -----------------------------------------------------------------------------

    def test_an_event_at_the_size_limit_is_stored_and_one_byte_more_is_refused(
        self, store: SessionStore, app: str
    ) -> None:
        limit = self.limits(store).max_event_bytes
        row = self.row(app)
        overhead = len(_event("big", "").model_dump_json().encode())
        # Multi-byte text, so a store that counts characters instead of bytes lets the second one through.
        fits = _event("big", "é" * ((limit - overhead) // 2) + "x" * ((limit - overhead) % 2))
        assert len(fits.model_dump_json().encode()) == limit
        assert store.commit(row, [fits], 0).appended == 1
        over = _event("over", "é" * ((limit - overhead) // 2 + 1))
        with pytest.raises(EventTooLarge) as caught:
            store.commit(row, [_event(1), over], 1)
        assert (caught.value.event_id, caught.value.limit) == ("evt-over", limit)
        assert caught.value.size > limit
        loaded = store.load(app, row.id)
        assert loaded is not None and loaded.row.version == 1 and loaded.events == [fits]

    def test_a_commit_over_the_event_count_limit_is_refused_and_writes_nothing(
        self, store: SessionStore, app: str
    ) -> None:
        most = self.limits(store).max_events_per_commit
        row = self.row(app, scopes={"user": "u-1"})
        store.commit(row, [], 0)
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(row, [_event(n) for n in range(most + 1)], 1, [ScopedStateChange("user", "u-1", "k", 1)])
        assert (caught.value.size, caught.value.limit) == (most + 1, most)
        loaded = store.load(app, row.id)
        assert loaded is not None and loaded.row.version == 1 and loaded.events == []
        assert store.load_scoped_state(app, "user", "u-1") == {}
        # Re-sent ids are one event each: a batch that repeats ids counts what it carries once.
        assert store.commit(row, [_event(n % most) for n in range(most + 1)], 1).appended == most

    def test_a_commit_over_the_byte_limit_is_refused(self, store: SessionStore, app: str) -> None:
        limits = self.limits(store)
        per_event = limits.max_event_bytes
        count = limits.max_commit_bytes // per_event + 1
        if count > limits.max_events_per_commit:
            pytest.skip("this store's event count limit is reached before its byte limit")
        overhead = len(_event(0, "").model_dump_json().encode()) + 8
        events = [_event(n, "x" * (per_event - overhead)) for n in range(count)]
        row = self.row(app)
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(row, events, 0)
        assert caught.value.limit == limits.max_commit_bytes
        assert store.load(app, row.id) is None

    def test_a_scoped_value_over_its_limit_is_refused(self, store: SessionStore, app: str) -> None:
        limit = self.limits(store).max_scoped_value_bytes
        row = self.row(app, scopes={"user": "u-1"})
        with pytest.raises(CommitTooLarge) as caught:
            store.commit(row, [_event(1)], 0, [ScopedStateChange("user", "u-1", "notes", "x" * limit)])
        assert caught.value.field == "state.user.notes"
        assert store.load(app, row.id) is None
        fits = "x" * (limit - 2)  # the quotes make it exactly the limit
        assert store.commit(row, [_event(1)], 0, [ScopedStateChange("user", "u-1", "notes", fits)]).ok
        assert store.load_scoped_state(app, "user", "u-1") == {"notes": fits}
