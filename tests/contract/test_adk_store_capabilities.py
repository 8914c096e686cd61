"""The ADK bridge lists one user's sessions from the store's binding index when it has one (``BindingIndexStore``,
asked by protocol, never by class) and, on a store without it, from all the app's sessions: the same answer."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")

from dormant.bridges.adk import DormantSessionService
from dormant.stores.base import BindingIndexStore, SessionStore
from tests.support.wrapped_stores import BindingIndex, SixMethods


def _listed(store: SessionStore) -> set[tuple[str, str]]:
    async def run() -> set[tuple[str, str]]:
        service = DormantSessionService(store)
        for user, sid in (("u1", "a"), ("u1", "b"), ("u2", "c")):
            await service.create_session(app_name="my_app", user_id=user, session_id=sid)
        listed = (await service.list_sessions(app_name="my_app", user_id="u1")).sessions
        return {(s.user_id, s.id) for s in listed}

    return asyncio.run(run())


def test_a_store_of_ones_own_with_a_binding_index_lists_from_it() -> None:
    store = BindingIndex()
    assert isinstance(store, BindingIndexStore) and not hasattr(store, "running_sessions")  # no BaseSessionStore
    assert _listed(store) == {("u1", "a"), ("u1", "b")}
    assert store.bound_reads == 1


def test_a_store_without_one_lists_the_users_sessions_all_the_same() -> None:
    store = SixMethods()
    assert not isinstance(store, BindingIndexStore)
    assert _listed(store) == {("u1", "a"), ("u1", "b")}
