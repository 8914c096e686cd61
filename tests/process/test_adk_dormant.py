"""ADK sessions read the dormant way: two processes racing on one session, ``dormant erase``, the inspector's API.

(``test_adk_bridge.py`` holds ``DormantSessionService`` to ADK's own services; this file to dormant's.)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")
pytestmark = pytest.mark.backend("adk")

from google.adk.errors import StaleSessionError  # noqa: E402

from dormant.bridges.adk import DormantSessionService, session_key  # noqa: E402
from dormant.cli import main  # noqa: E402
from dormant.serving.local import LocalAPI  # noqa: E402
from dormant.serving.runtime import load_served  # noqa: E402
from dormant.stores.sqlite import sqlite_store  # noqa: E402
from tests.support.adk_app import APP, said, seed  # noqa: E402

# -- two processes, one session -----------------------------------------------------------------------


def _append_after_both_loaded(db: str, name: str, barrier: Any, outcome: Any) -> None:
    """A process of its own: load the session, wait until the other one has loaded it too, append."""

    async def work() -> str:
        store = sqlite_store(db)
        try:
            service = DormantSessionService(store)
            session = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
            assert session is not None
            barrier.wait(30)
            try:
                await service.append_event(session, said(f"from {name}", **{name: True, "user:last": name}))
            except StaleSessionError:
                # what a caller does with the stale error: reload and append again, losing nothing
                session = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
                assert session is not None
                await service.append_event(session, said(f"from {name}, again", **{name: True}))
                return "stale"
            return "won"
        finally:
            store.close()

    outcome[name] = asyncio.run(work())


@pytest.mark.slow
def test_two_processes_append_to_one_session_one_wins_the_other_is_stale_and_nothing_is_lost(tmp_path: Path) -> None:
    db = str(tmp_path / "adk.db")

    async def create() -> None:
        store = sqlite_store(db)
        try:
            await DormantSessionService(store).create_session(app_name=APP, user_id="ada", session_id="s1")
        finally:
            store.close()

    asyncio.run(create())
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no store, loop or lock inherited
    with context.Manager() as manager:
        barrier, outcome = manager.Barrier(2), manager.dict()
        procs = [
            context.Process(target=_append_after_both_loaded, args=(db, name, barrier, outcome))
            for name in ("p1", "p2")
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        results = dict(outcome)
    assert sorted(results.values()) == ["stale", "won"]
    winner = next(name for name, how in results.items() if how == "won")
    loser = next(name for name, how in results.items() if how == "stale")

    async def read() -> Any:
        store = sqlite_store(db)
        try:
            service = DormantSessionService(store)
            return await service.get_session(app_name=APP, user_id="ada", session_id="s1"), store.load(
                APP, session_key("ada", "s1")
            )
        finally:
            store.close()

    session, loaded = asyncio.run(read())
    texts = [e.content.parts[0].text for e in session.events]
    assert texts == [f"from {winner}", f"from {loser}, again"]  # the stale first try wrote nothing
    assert session.state == {"p1": True, "p2": True, "user:last": winner}
    assert loaded.row.version == 3  # create, the winner's append, the loser's retry


# -- erase ----------------------------------------------------------------------------------------------


def test_dormant_erase_removes_an_adk_users_sessions_and_user_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "adk.db"
    seed(db)
    store_url = f"sqlite:///{db}"
    code = main(
        [
            "erase",
            "--app",
            "tests.support.adk_app:INSPECTED",
            "--store",
            store_url,
            "--scope",
            "user",
            "--id",
            "ada",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["sessions"] == [session_key("ada", "s1"), session_key("ada", "s2")]
    assert report["scoped_keys"] == ["name", "seen"]

    async def after() -> None:
        store = sqlite_store(db)
        try:
            service = DormantSessionService(store)
            assert await service.get_session(app_name=APP, user_id="ada", session_id="s1") is None
            assert (await service.list_sessions(app_name=APP, user_id="ada")).sessions == []
            assert await service.get_user_state(app_name=APP, user_id="ada") == {}
            bob = await service.get_session(app_name=APP, user_id="bob", session_id="s1")  # another user: untouched
            assert bob is not None and bob.state == {
                "topic": "s1",
                "user:name": "Bob",
                "user:seen": 1,
                "app:motd": "hi",
            }
        finally:
            store.close()

    asyncio.run(after())
    assert b"ada says hello" not in db.read_bytes()


# -- the inspector's API --------------------------------------------------------------------------------


def test_the_inspector_api_shows_an_adk_session_like_any_other(tmp_path: Path) -> None:
    db = tmp_path / "adk.db"
    seed(db, tenant="local")
    store = sqlite_store(db)
    try:
        api = LocalAPI(load_served("tests.support.adk_app:INSPECTED", store), principal="local")

        def get(path: str) -> Any:
            reply = api.handle("GET", path, [], b"", "127.0.0.1")
            assert reply.status == 200, reply.json()
            return reply.json()

        listed = get("/sessions")
        assert {s["id"] for s in listed["sessions"]} == {"ada.s1", "ada.s2", "bob.s1"}
        one = get("/sessions/ada.s1")
        assert one["scopes"] == {"user": "ada"}
        assert one["state"]["session"] == {"topic": "s1"}
        assert one["state"]["user"] == {"name": "Ada", "seen": 1}
        events = get("/sessions/ada.s1/events")["events"]
        adk = [e for e in events if e["type"] == "adk_event"]
        assert [e["event"]["content"]["parts"][0]["text"] for e in adk] == ["ada says hello"]
        changes = [(e["scope"], c["key"]) for e in events if e["type"] == "state_change" for c in e["changes"]]
        assert changes == [("user", "name"), ("app", "motd"), ("session", "topic"), ("user", "seen")]
        audit = get("/sessions/ada.s1/audit?scope=session&key=topic")
        assert audit
    finally:
        store.close()
