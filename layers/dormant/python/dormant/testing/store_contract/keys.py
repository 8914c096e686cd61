"""The one key rule (``dormant.ids``), the same on every store, and ``{app}@{tenant}`` with one reading."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar

import pytest

from ...clock import frozen_clock
from ...errors import (
    ConfigurationError,
    InputError,
    InvalidKey,
    InvalidSessionId,
    ValueNotStorable,
)
from ...events import (
    UserEvent,
)
from ...ids import MAX_CURSOR_LENGTH, MAX_KEY_LENGTH, TENANT_SEPARATOR
from ...stores.base import (
    MAX_CURSOR_TIME,
    ErasableStore,
    ScopedStateChange,
    SessionStore,
    StoredSession,
    encode_cursor,
)
from .base import ContractBase, _event, _ids, _Owner


class KeysContract(ContractBase):
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
        row = StoredSession(
            id=parts["session_id"], app_name=parts["app_name"], scopes={"user": parts["binding_scope_id"]}
        )
        change = ScopedStateChange(parts["scope"], parts["scope_id"], parts["scoped_key"], "Ada")
        with pytest.raises(error) as caught:
            store.commit(row, [_event(1)], 0, [change])
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
        row = self.row(app, "s-1")
        bad = UserEvent(id=self.KEY_DEFECTS[defect], created_at=1_700_000_000_000, text="hello")
        with pytest.raises(InputError) as caught:
            store.commit(row, [_event(1), bad], 0)
        assert type(caught.value) is InvalidKey and caught.value.field == "new_events.1.id"
        assert store.load(app, "s-1") is None and store.list(app) == []
        assert store.commit(row, [_event(1)], 0).ok
        with pytest.raises(InvalidKey):
            store.commit(row, [_event(2), bad], 1)
        loaded = store.load(app, "s-1")
        assert loaded is not None and loaded.row.version == 1 and _ids(loaded.events) == ["evt-1"]

    def test_scoped_keys_at_the_key_rule_s_limits_are_kept(self, store: SessionStore, app: str) -> None:
        keys = ["k", "k" * MAX_KEY_LENGTH, "\u00e9" * MAX_KEY_LENGTH, "\U0001f600" * MAX_KEY_LENGTH, "a#b@c d"]
        row = self.row(app, scopes={"user": "u-1"})
        assert store.commit(
            row, [_event(1)], 0, [ScopedStateChange("user", "u-1", k, n) for n, k in enumerate(keys)]
        ).ok
        assert store.load_scoped_state(app, "user", "u-1") == {k: n for n, k in enumerate(keys)}

    def test_ids_at_the_key_rule_s_limit_are_kept_in_every_key(self, store: SessionStore) -> None:
        """The longest app name, tenant, session id, scope id and scoped key at once: every key the store builds
        from them (DynamoDB's partition and sort keys with their prefixes) still fits."""
        longest = "a" * MAX_KEY_LENGTH
        app = f"{uuid.uuid4().hex}{'a' * (MAX_KEY_LENGTH - 32)}{TENANT_SEPARATOR}{longest}"
        sid, key = "s" * MAX_KEY_LENGTH, "\U0001f600" * MAX_KEY_LENGTH
        row = StoredSession(id=sid, app_name=app, scopes={"user": longest, "org": longest})
        change = ScopedStateChange("user", longest, key, 1)
        assert store.commit(row, [_event(1)], 0, [change]).ok
        assert store.commit(StoredSession(id=sid, app_name=app, scopes=row.scopes), [_event(2)], 1).ok
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
        row = self.row(app)
        for scope in ("", "s" * 129, "a\ud800", "a\x00", "a#b", "a@b"):
            with pytest.raises(InvalidKey) as caught:
                store.commit(row, [_event(1)], 0, [ScopedStateChange(scope, "u-1", "k", 1)])
            assert caught.value.field == "scoped_changes.0.scope"
            with pytest.raises(InvalidKey) as caught:
                store.load_scoped_state(app, scope, "u-1")
            assert caught.value.field == "scope"
            with pytest.raises(InvalidKey) as caught:
                store.commit(self.row(app, scopes={scope: "u-1"}), [_event(1)], 0)
            assert caught.value.field == "scopes"
        assert store.load(app, row.id) is None

    # -- tenants: "{app}@{tenant}" has one reading -------------------------------------------

    def test_an_app_named_like_a_tenant_cannot_reach_the_tenant_nor_the_tenant_it(
        self, store: SessionStore, app: str
    ) -> None:
        """``clinic@eu`` is tenant ``eu`` of ``clinic`` and nothing else: no app may take that name (nor any
        name with ``@``), so none sees, lists, purges or erases the tenant's sessions, and the tenant none of
        theirs. The apps whose names come closest (``clinic.eu``, ``clinic-eu``, ``clinic@eu.x`` as tenant
        ``eu.x``, tenant ``eu`` of ``clinic.x``) keep to their own keys, through every path."""
        from ...app import App, adk
        from ...serving.runtime import for_tenant, purge_tenants

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
                store.commit(self.row(crafted, "s-1"), [_event(1)], 0)
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
        assert store.commit(self.row(app), [_event(1)], 0).ok
        with pytest.raises(InvalidKey) as caught:
            store.list(app, limit=5, cursor=cursor)
        assert type(caught.value) is InvalidKey and caught.value.field == "cursor"

    def test_the_longest_cursor_is_within_its_limit(self, store: SessionStore, app: str) -> None:
        longest = encode_cursor(MAX_CURSOR_TIME, "s" * MAX_KEY_LENGTH)
        assert len(longest) == MAX_CURSOR_LENGTH  # the limit is the longest cursor a listing can return
        assert store.list(app, limit=5, cursor=longest) == []

    def test_a_cursor_at_the_greatest_time_lists_from_the_top(self, store: SessionStore, app: str) -> None:
        row = self.row(app, "s-only")
        assert store.commit(row, [_event(1)], 0).ok
        assert [s.id for s in store.list(app, limit=5, cursor=encode_cursor(MAX_CURSOR_TIME, "s-zzz"))] == ["s-only"]
        assert store.list(app, limit=5, cursor=encode_cursor(0, "s-0")) == []
