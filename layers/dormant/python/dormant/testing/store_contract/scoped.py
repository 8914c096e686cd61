"""Scoped state: merged with a commit, kept in its JSON shape, and scopes fixed at creation."""

from __future__ import annotations

import pytest

from ...errors import (
    ScopeMismatch,
)
from ...stores.base import (
    ScopedStateChange,
    SessionStore,
)
from .base import ContractBase, _event, _ids


class ScopedStateContract(ContractBase):
    # -- scoped state -----------------------------------------------------------------------

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
        row = self.row(app, scopes={"user": "u-1"})
        self.seed(store, app, "user", "u-1", {"keep": 1, "drop": 2})
        changes = [
            ScopedStateChange("user", "u-1", "name", "Ada"),
            ScopedStateChange("user", "u-1", "drop", None),
            ScopedStateChange("user", "u-1", "name", "Ada L."),  # a later change to a key wins
            ScopedStateChange("team", "t-1", "size", 3),
        ]
        assert store.commit(row, [_event(1)], 0, changes).ok
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
        row = self.row(app, scopes={"user": "alice"})
        store.commit(row, [_event(1)], 0)
        other = self.row(app, row.id, scopes=given)
        for expected in (1, 5):  # at the right version, and at a wrong one: retrying cannot fix it
            with pytest.raises(ScopeMismatch) as caught:
                store.commit(other, [_event(2)], expected, [ScopedStateChange("user", "bob", "k", 1)])
            assert (caught.value.scope, caught.value.field) == (scope, f"scopes.{scope}")
        loaded = store.load(app, row.id)
        assert loaded is not None
        assert (loaded.row.version, loaded.row.scopes, _ids(loaded.events)) == (1, {"user": "alice"}, ["evt-1"])
        assert store.load_scoped_state(app, "user", "bob") == {}
        assert store.commit(row, [_event(2)], 1).ok  # the session itself goes on

    def test_creating_a_taken_id_with_other_scopes_is_a_conflict(self, store: SessionStore, app: str) -> None:
        row = self.row(app, scopes={"user": "alice"})
        store.commit(row, [], 0)
        again = store.commit(self.row(app, row.id, scopes={"user": "bob"}), [_event(1)], 0)
        assert (again.ok, again.version, again.appended) == (False, 1, 0)
