"""A LangGraph thread and an Agents SDK session in the session inspector, in a real headless browser (as
``tests/http/test_adk_inspector.py`` drives an ADK session): their records shown as any session's events are."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.cli import default_pages
from dormant.serving.local import LocalAPI, LocalServer
from dormant.serving.runtime import load_served
from dormant.stores.sqlite import sqlite_store
from tests.support.browser import headless_chromium

WAIT = 30


@pytest.fixture
def driver() -> Iterator[Any]:
    with headless_chromium(WAIT) as chrome:
        yield chrome


def _rows(driver: Any, url: str, kind: str) -> list[Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    rows: list[Any] = WebDriverWait(driver, WAIT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#timeline li.event[data-type="{kind}"]') or False,
        message=f"the {kind} rows",
    )
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    return rows


@pytest.mark.backend("browser")
def test_a_langgraph_thread_shows_its_checkpoints_in_the_inspector(driver: Any, tmp_path: Path) -> None:
    pytest.importorskip("langgraph.graph")
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from dormant.bridges.langgraph import DormantSaver

    class Refund(TypedDict):
        amount: int
        approved: bool

    def ask(state: Refund) -> dict[str, bool]:
        return {"approved": interrupt("Refund?") == "yes"}

    db = tmp_path / "lg.db"
    store = sqlite_store(db)
    builder = StateGraph(Refund)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=DormantSaver(store, app_name="langgraph@local"))  # the local tenant
    graph.invoke({"amount": 30, "approved": False}, {"configurable": {"thread_id": "refund-42"}})
    api = LocalAPI(load_served("tests.support.bridge_apps:LANGGRAPH", store), principal="local", pages=default_pages())
    server = LocalServer(api, "127.0.0.1", 0, log_requests=False)
    try:
        with server.running():
            rows = _rows(driver, server.url + "/inspect/sessions/refund-42", "langgraph")
            from selenium.webdriver.common.by import By

            kinds = [row.find_element(By.CSS_SELECTOR, ".event-body strong").text for row in rows]
            assert kinds.count("checkpoint") == 2 and "writes" in kinds
            assert all("LANGGRAPH" in row.text.upper() for row in rows)
    finally:
        store.close()


@pytest.mark.backend("browser")
def test_an_agents_sdk_session_shows_its_items_in_the_inspector(driver: Any, tmp_path: Path) -> None:
    pytest.importorskip("agents")
    from dormant.bridges.openai_agents import DormantSession

    db = tmp_path / "agents.db"
    store = sqlite_store(db)
    session = DormantSession("conversation-1", store, app_name="openai-agents@local")
    said = [{"role": "user", "content": "Where is my parcel?"}, {"role": "assistant", "content": "On its way."}]
    asyncio.run(session.add_items(said))  # type: ignore[arg-type]
    api = LocalAPI(load_served("tests.support.bridge_apps:AGENTS", store), principal="local", pages=default_pages())
    server = LocalServer(api, "127.0.0.1", 0, log_requests=False)
    try:
        with server.running():
            rows = _rows(driver, server.url + "/inspect/sessions/conversation-1", "openai_agents")
            from selenium.webdriver.common.by import By

            assert len(rows) == 2
            shown = [
                (
                    row.find_element(By.CSS_SELECTOR, "strong.author").text,
                    row.find_element(By.CSS_SELECTOR, "p.text").text,
                )
                for row in rows
            ]
            assert shown == [("user", "Where is my parcel?"), ("assistant", "On its way.")]
    finally:
        store.close()
