"""The ADK app of the ADK tests: its sessions read the dormant way (``INSPECTED``), and a few users' sessions to
seed a store with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from dormant.bridges.adk import DormantSessionService, inspected
from dormant.stores.sqlite import sqlite_store

APP = "helpdesk"
INSPECTED = inspected(APP)
"""What ``DORMANT_APP`` names to serve the ADK app's sessions (``tests.support.adk_app:INSPECTED``)."""


def said(text: str, author: str = "user", **state: Any) -> Event:
    return Event(
        invocation_id="inv",
        author=author,
        content=types.Content(role="user" if author == "user" else "model", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=state),
    )


def seed(db: Path, tenant: str | None = None) -> None:
    async def go() -> None:
        store = sqlite_store(db)
        try:
            service = DormantSessionService(store, tenant=tenant)
            for user, sid in (("ada", "s1"), ("ada", "s2"), ("bob", "s1")):
                session = await service.create_session(
                    app_name=APP, user_id=user, session_id=sid, state={"user:name": user.title(), "app:motd": "hi"}
                )
                await service.append_event(session, said(f"{user} says hello", **{"user:seen": 1, "topic": sid}))
        finally:
            store.close()

    asyncio.run(go())
