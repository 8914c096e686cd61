"""Scopes are fixed when a session is created: through app.sessions.commit and dormant.serving.commit too.

The store refuses (``ScopeMismatch``, nothing written) a commit whose scopes differ from the stored
row's; these tests check that the refusal reaches callers of the two commit paths, on a real SQLite file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from dormant import App, Session, adk
from dormant.errors import ScopeMismatch
from dormant.serving import commit as serving_commit
from dormant.stores.sqlite import sqlite_store


class Profile(BaseModel):
    name: str = ""


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with adk(name="scopes", store=sqlite_store(tmp_path / "s.db"), schema={"user": Profile}) as app:
        yield app


def _impostor(app: App, session_id: str, scopes: dict[str, str] | None) -> Session:
    """The stored session's ledger and version, claimed with other scopes (what issue 10 #4 did)."""
    stored = app.sessions.get(session_id)
    assert stored is not None
    session = Session(app, session_id=session_id, scopes=scopes, version=stored.version, events=stored.events)
    session.input.message("hello")
    if scopes:
        session.state.user.name = "Bob"  # a shared-scope write that must not land either
    return session


def _by_sessions(app: App, session: Session) -> object:
    return app.sessions.commit(session)


def _by_serving(app: App, session: Session) -> object:
    return serving_commit(app, session)


@pytest.mark.parametrize("commit", [_by_sessions, _by_serving], ids=["sessions.commit", "serving.commit"])
@pytest.mark.parametrize(("scopes", "named"), [({"user": "bob"}, "user"), (None, "user")], ids=["rebound", "unbound"])
def test_a_commit_with_other_scopes_is_refused_and_writes_nothing(
    app: App, commit: Callable[[App, Session], object], scopes: dict[str, str] | None, named: str
) -> None:
    original = app.sessions.create("s-1", scopes={"user": "alice"})
    original.input.message("first")
    app.sessions.commit(original)
    impostor = _impostor(app, "s-1", scopes)
    with pytest.raises(ScopeMismatch) as caught:
        commit(app, impostor)
    assert caught.value.scope == named and caught.value.field == f"scopes.{named}"
    stored = app.sessions.get("s-1")
    assert stored is not None
    assert (stored.version, stored.scopes, len(stored.events)) == (2, {"user": "alice"}, len(original.events))
    assert [s.id for s in app.sessions.list()] == ["s-1"]  # no fork either
    assert app.store.load_scoped_state(app.name, "user", "bob") == {}


def test_serving_commit_refuses_even_when_the_version_moved(app: App) -> None:
    original = app.sessions.create("s-1", scopes={"user": "alice"})
    impostor = _impostor(app, "s-1", {"user": "bob"})
    original.input.message("landed first")
    app.sessions.commit(original)  # the impostor is now stale as well
    with pytest.raises(ScopeMismatch):
        serving_commit(app, impostor)
    stored = app.sessions.get("s-1")
    assert stored is not None and stored.version == 2 and stored.scopes == {"user": "alice"}
    assert [s.id for s in app.sessions.list()] == ["s-1"]
