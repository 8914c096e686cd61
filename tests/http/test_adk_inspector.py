"""An ADK session in the session inspector, in a real headless browser (as ``tests/http/test_inspector.py`` drives it):
its ADK events and its state, shown as any session's are."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the ADK bridge needs google-adk (pip install 'dormant[adk]')")
pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.cli import default_pages
from dormant.serving.local import LocalAPI, LocalServer
from dormant.serving.runtime import load_served
from dormant.stores.sqlite import sqlite_store
from tests.support.adk_app import seed
from tests.support.browser import headless_chromium

WAIT = 30


@pytest.fixture
def driver() -> Iterator[Any]:
    with headless_chromium(WAIT) as chrome:
        yield chrome


@pytest.mark.backend("browser")
def test_an_adk_session_shows_its_events_and_state_in_the_inspector(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    db = tmp_path / "adk.db"
    seed(db, tenant="local")
    store = sqlite_store(db)
    api = LocalAPI(load_served("tests.support.adk_app:INSPECTED", store), principal="local", pages=default_pages())
    server = LocalServer(api, "127.0.0.1", 0, log_requests=False)
    try:
        with server.running():
            driver.get(server.url + "/inspect/sessions/ada.s1")
            rows = WebDriverWait(driver, WAIT).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, '#timeline li.event[data-type="adk_event"]') or False,
                message="the ADK event's row",
            )
            assert len(rows) == 1
            assert "ADK EVENT" in rows[0].text.upper() and "ada says hello" in rows[0].text and "user" in rows[0].text
            types = [
                li.get_attribute("data-type") for li in driver.find_elements(By.CSS_SELECTOR, "#timeline li.event")
            ]
            assert types == ["state_change", "state_change", "adk_event", "state_change", "state_change"]
            scopes = {
                section.get_attribute("data-scope"): section.text
                for section in driver.find_elements(By.CSS_SELECTOR, "#state-panel section.scope")
            }
            assert "topic" in scopes["session"] and "seen" in scopes["user"]
            assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        store.close()
