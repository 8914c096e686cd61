"""The session inspector in a real headless browser: Debian's chromium, driven by Selenium through the
system's chromedriver (nothing is downloaded), against ``dormant serve``'s server over the Bookings app
(its scripted model) on a SQLite file.

The page is checked against the ledger the store holds, not against itself. ``DORMANT_SCREENSHOTS=DIR``
(``make screenshots``) writes docs/inspector.md's screenshots there; otherwise they go to a temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

from dormant.cli import default_pages
from dormant.clock import frozen_clock
from dormant.inspector import asset
from dormant.serving.local import LocalAPI, LocalServer
from dormant.serving.runtime import Served, load_served
from dormant.stores.url import store_from_url
from tests.support.browser import headless_chromium

PRINCIPAL = "local"
ASK = "I need physio on Tuesday afternoon, for Alex Doe"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>'
WAIT = 30  # seconds any one page condition may take (runs the agent in-process, on a busy machine)


# -- the page's files (no browser) ------------------------------------------------------------------------


def test_every_page_path_is_the_document_and_assets_are_typed() -> None:
    for path in ("/", "/inspect", "/inspect/sessions", "/inspect/sessions/s-1", "/inspect/sessions/s-1/audit"):
        found = asset(path)
        assert found is not None and found.headers["Content-Type"].startswith("text/html"), path
        assert b'<script type="module" src="/inspect/assets/app.js">' in found.body
    script = asset("/inspect/assets/app.js")
    assert script is not None and script.headers["Content-Type"].startswith("text/javascript")
    assert "script-src 'self'" in script.headers["Content-Security-Policy"]
    assert "unsafe-inline" not in script.headers["Content-Security-Policy"]
    for path in (
        "/sessions",
        "/favicon.ico",
        "/inspector",
        "/inspect/assets/../__init__.py",
        "/inspect/assets/nope.js",
    ):
        assert asset(path) is None, path
    assert asset("/inspect/assets/.hidden.js") is None and asset("/inspect/assets/__init__.py") is None


HTML_SINKS = (
    "innerHTML",
    "outerHTML",
    "insertAdjacentHTML",
    "document.write",
    # text parsed as HTML without touching innerHTML: a parser, a range's fragment, the newer setters, a frame
    "DOMParser",
    "parseFromString",
    "createContextualFragment",
    "setHTML",
    "srcdoc",
)


def test_no_script_of_the_page_writes_html() -> None:
    """Everything is rendered as text: no script assigns markup (the browser tests check the effect)."""
    static = Path(asset.__code__.co_filename).parent / "static"
    scripts = sorted(static.glob("*.js"))
    assert {p.name for p in scripts} >= {"app.js", "dom.js", "form.js", "timeline.js", "api.js"}
    for script in scripts:
        text = script.read_text(encoding="utf-8")
        for sink in (*HTML_SINKS, "eval(", "new Function"):
            assert sink not in text, f"{script.name} uses {sink}"


def test_the_dormant_serve_command_serves_the_page(tmp_path: Path) -> None:
    """The installed command, as a user starts it: the page at ``/``, its scripts, and the API beside it."""
    import urllib.request

    from tests.support.servers.serve import dormant_serve

    with dormant_serve("--store", f"sqlite:///{tmp_path / 'cli.db'}", "--quiet", cwd=tmp_path, timeout=60) as server:
        assert f"the session inspector is at {server.url}/" in server.output()
        for path, kind in (("/", "text/html"), ("/inspect/assets/app.js", "text/javascript")):
            with urllib.request.urlopen(server.url + path, timeout=60) as response:
                assert response.headers["Content-Type"].startswith(kind)
                assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        with urllib.request.urlopen(server.url + "/sessions", timeout=60) as response:
            assert json.load(response) == {"sessions": [], "cursor": None}


# -- the browser -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium(WAIT) as driver:
        yield driver


class Site:
    """``dormant serve``'s server on a free port, with the inspector as its page, over Bookings on SQLite."""

    def __init__(self, served: Served, server: LocalServer, api: LocalAPI) -> None:
        self.served = served
        self.server = server
        self.api = api

    def url(self, path: str) -> str:
        return self.server.url + path

    def call(self, method: str, path: str, body: Any = None, principal: str = PRINCIPAL) -> tuple[int, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if method == "POST" and path.endswith(("/runs", "/tools")):
            headers["Prefer"] = "wait=25"  # the turn's outcome, as the page asks for it
        reply = self.api.call(method, path, headers, raw, principal)
        return reply.status, reply.json()

    def ledger(self, session_id: str) -> list[dict[str, Any]]:
        session = self.served.for_tenant(PRINCIPAL).sessions.require(session_id)
        return [event.model_dump(mode="json") for event in session.events]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    store = store_from_url(f"sqlite:///{tmp_path / 'inspector.db'}")
    served = load_served("bookings:build", store)
    api = LocalAPI(served, principal=PRINCIPAL, pages=default_pages())  # what `dormant serve` serves
    server = LocalServer(api, "127.0.0.1", 0, log_requests=False)
    with server.running():
        yield Site(served, server, api)
    store.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("DORMANT_SCREENSHOTS") or tmp_path / "screenshots")
    target.mkdir(parents=True, exist_ok=True)
    return target


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # an element read while the page replaces it is stale: look again
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, WAIT, ignored_exceptions=ignored).until(
        condition, message=f"waited {WAIT}s for {what}"
    )


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def css_all(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def shown(selector: str) -> Callable[[Any], Any]:
    return lambda driver: css_all(driver, selector) or False


def settled(driver: Any) -> None:
    """The page finished loading what it asked for (no request in flight, the timeline's first page in)."""
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", "the document")


def no_page_errors(driver: Any) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def status_of(driver: Any) -> str:
    return str(css(driver, ".session-head .badge").get_attribute("title"))


def rendered(value: Any) -> str:
    """How the page shows a state value: a string as itself, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2) if isinstance(value, dict | list) else json.dumps(value)


def state_panel(driver: Any) -> dict[str, dict[str, str]]:
    """The time-travel panel's scopes as shown: scope -> key -> the value's text."""
    scopes: dict[str, dict[str, str]] = {}
    for section in css_all(driver, "#state-panel section.scope"):
        rows = {}
        for row in section.find_elements("css selector", "tr[data-key]"):
            rows[row.get_attribute("data-key")] = row.find_element("css selector", "td").text
        scopes[section.get_attribute("data-scope")] = rows
    return scopes


# -- the Bookings arc on the page --------------------------------------------------------------------------


@pytest.mark.backend("browser")
def test_a_booking_from_ask_through_approval_on_the_page_to_completion(browser: Any, site: Site, shots: Path) -> None:
    driver = browser
    driver.get(site.url("/"))
    wait_for(driver, shown("#new-session"), "the sessions view")
    assert css(driver, "h1").text == "Sessions" and css_all(driver, "#sessions") == []

    # ask: a new session bound to the patient, then the request as a new turn
    css(driver, "#new-session-id").send_keys("s-arc")
    css(driver, "#new-session-scopes").send_keys("user=alex-doe")
    css(driver, "#new-session button").click()
    wait_for(driver, lambda d: d.current_url.endswith("/inspect/sessions/s-arc"), "the new session's page")
    wait_for(driver, shown("#message"), "the message form")
    css(driver, "#message").send_keys(ASK)
    css(driver, "#message-form button").click()
    wait_for(driver, shown("#waiting .yielded"), "the approval waiting on a human")
    (waiting,) = css_all(driver, "#waiting .yielded")
    pending = site.served.for_tenant(PRINCIPAL).sessions.require("s-arc").yielded_tools
    assert waiting.get_attribute("data-name") == "request_approval"
    assert waiting.get_attribute("data-call-id") == pending[0].call_id
    assert status_of(driver) == "awaiting_input"

    # the listing marks it as waiting on a human
    driver.get(site.url("/inspect/sessions"))
    row = wait_for(driver, shown("#sessions tr[data-id='s-arc']"), "the listed session")[0]
    assert "waiting" in row.get_attribute("class") and "waiting on a human" in row.text
    row.find_element("css selector", "a").click()
    wait_for(driver, shown("#waiting form"), "the answer form")

    # the form is built from the yield schema: a required yes/no and an optional note; nothing chosen is refused
    # on the page, and nothing is sent
    version = site.call("GET", "/sessions/s-arc")[1]["version"]
    assert {e.get_attribute("data-choice") for e in css_all(driver, "#waiting input[type=radio]")} == {"true", "false"}
    css(driver, "#waiting button[type=submit]").click()
    wait_for(driver, lambda d: css(d, "#waiting .field-error").text == "choose one", "the missing answer marked")
    assert site.call("GET", "/sessions/s-arc")[1]["version"] == version

    css(driver, "#waiting input[data-choice='true']").click()
    css(driver, "#waiting textarea").send_keys("fine by the clinic")
    css(driver, "#waiting button[type=submit]").click()
    wait_for(driver, lambda d: css_all(d, ".session-head .badge[title='completed']"), "the booking to complete")
    assert css_all(driver, "#waiting") == []
    session = site.served.for_tenant(PRINCIPAL).sessions.require("s-arc")
    assert session.status == "completed"
    answer = next(e for e in session.events if e.type == "tool_input")
    assert answer.input == {"approved": True, "note": "fine by the clinic"}  # type: ignore[union-attr]

    # the timeline is the ledger: one row per event, in order, each kind rendered from its own fields
    ledger = site.ledger("s-arc")
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) == len(ledger), "the whole timeline")
    rows = css_all(driver, "#timeline li.event")
    assert [r.get_attribute("data-type") for r in rows] == [e["type"] for e in ledger]
    assert [r.get_attribute("data-index") for r in rows] == [str(i) for i in range(len(ledger))]
    for row, event in zip(rows, ledger, strict=True):
        body = row.find_element("css selector", ".event-body").text
        if event["type"] in ("user", "assistant"):
            assert body == event["text"]
        elif event["type"] in ("tool_call", "tool_result", "tool_input"):
            assert event["name"] in body and event["call_id"] in body
            if event["type"] == "tool_input":  # who answered: the page's caller, recorded by the API
                assert event["principal"] == PRINCIPAL and f"by {PRINCIPAL}" in body
        elif event["type"] == "state_change":
            (change,) = event["changes"]
            (shown_change,) = row.find_elements("css selector", "li.change")
            assert shown_change.get_attribute("data-scope") == event["scope"]
            assert shown_change.get_attribute("data-key") == change["key"]
            assert event["source"] in shown_change.text
            if event.get("call_id"):  # the tool call that wrote it
                assert f"by {event['tool']} [{event['call_id']}]" in shown_change.text
        elif event["type"] == "model_end":
            assert f"{event['usage']['total_tokens']} total" in body
        elif event["type"] == "model_start":  # a later call of the invocation holds its tools by reference
            held = f"and {len(event['tools'])} tools" if event["tools"] else "and the tools of its last call"
            assert f"asked with {event['message_count']} messages {held}" in body, body
        elif event["type"] == "invocation_end":
            assert event["status"] in body
    starts = [e for e in ledger if e["type"] == "model_start"]
    assert starts[0]["tools"] and all(e["tools_as_in"] == starts[0]["id"] for e in starts[1:]), starts
    # the invocation tree: the one invocation, its model calls and its tools
    tree = css(driver, "#invocations")
    assert "completed" in tree.text
    tools = [e["name"] for e in ledger if e["type"] == "tool_call"]
    assert [
        n.find_element("css selector", "code").text for n in tree.find_elements("css selector", ".node.tool")
    ] == tools
    assert len(tree.find_elements("css selector", ".node.model")) == sum(e["type"] == "model_end" for e in ledger)
    driver.execute_script("document.getElementById('invocations').scrollIntoView()")
    driver.save_screenshot(str(shots / "inspector-timeline.png"))

    # time travel: select the event that stored the approved slot
    at = next(
        i for i, e in enumerate(ledger) if e["type"] == "state_change" and e["changes"][0]["key"] == "approved_slot"
    )
    css(driver, f"#event-{at} .event-head a").click()
    wait_for(driver, lambda d: css(d, "#state-panel").get_attribute("data-at") == str(at), "the state panel")
    wait_for(driver, shown("#state-panel section.scope"), "the state at the event")
    assert driver.current_url.endswith(f"/inspect/sessions/s-arc?at={at}")
    assert "selected" in css(driver, f"#event-{at}").get_attribute("class")
    snapshot = session.state_at(at)
    expected = {"session": snapshot.session_state, **snapshot.scoped_states}
    assert state_panel(driver) == {
        scope: {key: rendered(value) for key, value in values.items()} for scope, values in expected.items()
    }
    changed = css_all(driver, "#state-panel tr.changed")
    assert [
        (r.find_element("xpath", "ancestor::section").get_attribute("data-scope"), r.get_attribute("data-key"))
        for r in changed
    ] == [("session", "approved_slot")]
    assert css(driver, "#changes h3").text.lower() == f"what event #{at} changed"
    driver.execute_script(f"document.getElementById('event-{at}').scrollIntoView({{block: 'center'}})")
    driver.save_screenshot(str(shots / "inspector-time-travel.png"))

    # one step back, the slot was not approved yet
    css(driver, "#state-panel .travel a").click()
    wait_for(driver, lambda d: css(d, "#state-panel").get_attribute("data-at") == str(at - 1), "the previous event")
    wait_for(driver, shown("#state-panel section.scope"), "the state one event earlier")
    assert "approved_slot" not in state_panel(driver)["session"]

    # the diff between the first event and the end
    last = len(ledger) - 1
    driver.get(site.url(f"/inspect/sessions/s-arc?at={last}"))
    wait_for(driver, shown("#compare input"), "the compare form")
    css(driver, "#compare input").send_keys("0")
    css(driver, "#compare button").click()
    wait_for(driver, lambda d: d.current_url.endswith(f"?at={last}&since=0"), "the diff's own URL")
    wait_for(driver, lambda d: css(d, "#state-panel").get_attribute("data-since") == "0", "the diff")
    assert css(driver, "#changes h3").text.lower() == f"diff from event #0 to #{last}"
    diff = {
        (r.get_attribute("data-scope"), r.get_attribute("data-key")) for r in css_all(driver, "#changes tr[data-key]")
    }
    before, after = session.state_at(0), session.state_at(last)
    assert diff == {
        (scope, key)
        for scope, old, new in [("session", before.session_state, after.session_state)]
        + [(s, before.scoped_states.get(s, {}), v) for s, v in after.scoped_states.items()]
        for key in old.keys() | new.keys()
        if old.get(key) != new.get(key)
    }

    # the audit of one key: every change, by which invocation and tool
    css(driver, "#changes a[href*='key=confirmation']").click()
    wait_for(driver, shown("#audit tbody tr"), "the audit table")
    (row,) = css_all(driver, "#audit tbody tr")
    change = next(
        i for i, e in enumerate(ledger) if e["type"] == "state_change" and e["changes"][0]["key"] == "confirmation"
    )
    assert row.get_attribute("data-index") == str(change)
    assert "book_slot" in row.find_element("css selector", ".tool-cell").text
    assert "mutation" in row.text and ledger[change]["invocation_id"] in row.text
    no_page_errors(driver)


@pytest.mark.backend("browser")
def test_a_fork_at_an_event_opens_the_new_session(browser: Any, site: Site) -> None:
    driver = browser
    assert site.call("POST", "/sessions", {"session_id": "s-fork", "scopes": {"user": "alex-doe"}})[0] == 201
    assert site.call("POST", "/sessions/s-fork/runs", {"message": ASK})[1]["status"] == "yielded_tool"
    ledger = site.ledger("s-fork")
    at = next(i for i, e in enumerate(ledger) if e["type"] == "tool_result")
    driver.get(site.url(f"/inspect/sessions/s-fork?at={at}"))
    wait_for(driver, shown("#fork input"), "the fork form")
    reason = css(driver, "#fork-reason")
    reason.clear()
    reason.send_keys("try another slot")
    css(driver, "#fork button").click()
    wait_for(driver, lambda d: "/inspect/sessions/s_" in d.current_url, "the fork's page")
    fork_id = driver.current_url.rsplit("/", 1)[1]
    copied = site.ledger(fork_id)
    # cut inside the running turn: the copy is paused there (a yield waiting for nothing), so it can move on
    assert [e["id"] for e in copied[:-2]] == [e["id"] for e in ledger[: at + 1]]
    assert copied[-2]["type"] == "invocation_yield" and copied[-2]["pending"] == []
    assert copied[-1]["type"] == "session_forked" and copied[-1]["reason"] == "try another slot"
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) == len(copied), "the fork's timeline")
    assert css_all(driver, "#timeline li.event")[-1].get_attribute("data-type") == "session_forked"
    assert site.ledger("s-fork") == ledger


# -- safety: data is text ----------------------------------------------------------------------------------


@pytest.mark.backend("browser")
def test_html_in_a_message_or_a_state_value_is_shown_as_text_and_never_runs(browser: Any, site: Site) -> None:
    driver = browser
    assert site.call("POST", "/sessions", {"session_id": "s-x", "scopes": {"user": "alex-doe"}})[0] == 201
    # a state value holding markup, committed as a runner elsewhere would
    change = {"key": "refusal", "old_value": None, "new_value": HOSTILE}
    event = {"type": "state_change", "scope": "session", "source": "direct", "changes": [change]}
    assert site.call("POST", "/sessions/s-x/commit", {"expected_version": 1, "events": [event]})[0] == 200

    driver.get(site.url("/inspect/sessions/s-x"))
    wait_for(driver, shown("#message"), "the message form")
    css(driver, "#message").send_keys(HOSTILE)
    css(driver, "#message-form button").click()
    wait_for(
        driver,
        lambda d: any(r.get_attribute("data-type") == "user" for r in css_all(d, "#timeline li.event")),
        "the message in the timeline",
    )
    ledger = site.ledger("s-x")
    (user,) = [i for i, e in enumerate(ledger) if e["type"] == "user"]
    assert ledger[user]["text"] == HOSTILE
    assert css(driver, f"#event-{user} .event-body").text == HOSTILE
    refusal = "#state-panel section.scope[data-scope='session'] tr[data-key='refusal'] td"
    (state_row,) = wait_for(driver, shown(refusal), "the state value")
    assert state_row.text == HOSTILE
    # nothing it holds became an element, and nothing ran
    assert css_all(driver, "main script, main img, main b") == []
    assert driver.execute_script("return window.__pwned === undefined")

    driver.get(
        site.url(f"/inspect/sessions/s-x?at={ledger.index(next(e for e in ledger if e['type'] == 'state_change'))}")
    )
    wait_for(driver, shown("#state-panel tr.changed"), "the change in time travel")
    assert css(driver, "#state-panel tr.changed td").text == HOSTILE
    assert css_all(driver, "main script, main img, main b") == []
    assert driver.execute_script("return window.__pwned === undefined")


# -- addresses, tenants, paging, errors ----------------------------------------------------------------------


@pytest.mark.backend("browser")
def test_every_view_has_its_own_url_and_the_page_acts_as_its_caller(browser: Any, site: Site) -> None:
    driver = browser
    with frozen_clock(1_796_000_000_000) as clock:
        for n in range(23):
            assert site.call("POST", "/sessions", {"session_id": f"s-{n:02}"})[0] == 201
            clock.advance(1000)
        # another principal's session is not the page's caller's: not listed, and its URL is a 404 as over curl
        assert site.call("POST", "/sessions", {"session_id": "theirs"}, principal="someone-else")[0] == 201
    driver.get(site.url("/inspect/sessions"))
    wait_for(driver, shown("#sessions tbody tr"), "the listing")
    newest_first = [f"s-{n:02}" for n in reversed(range(23))]
    assert [r.get_attribute("data-id") for r in css_all(driver, "#sessions tbody tr")] == newest_first[:20]
    css(driver, ".pager a").click()
    wait_for(driver, lambda d: "cursor=" in d.current_url, "the next page's URL")
    wait_for(driver, lambda d: len(css_all(d, "#sessions tbody tr")) == 3, "the next page")
    assert [r.get_attribute("data-id") for r in css_all(driver, "#sessions tbody tr")] == newest_first[20:]
    assert [a.text for a in css_all(driver, ".pager a")] == ["← first page"]
    driver.get(site.url("/inspect/sessions/theirs"))
    wait_for(driver, shown("main .error"), "the error")
    assert "404 SessionNotFound" in css(driver, "main .error").text

    # the status filter is part of the URL
    driver.get(site.url("/inspect/sessions?status=completed"))
    wait_for(driver, shown("main .empty"), "the empty filtered listing")
    assert css(driver, "#status-filter").get_attribute("value") == "completed"

    # an address the page does not know is its own 404; a path outside the page is the server's
    driver.get(site.url("/inspect/nowhere/at/all"))
    wait_for(driver, lambda d: css(d, "h1").text == "Not found", "the page's not found")
    assert asset("/nowhere") is None
    reply = site.api.handle("GET", "/nowhere", [], b"", "127.0.0.1")
    assert reply.status == 404


@pytest.mark.backend("browser")
def test_a_long_session_loads_page_by_page_and_a_deep_link_loads_up_to_its_event(browser: Any, site: Site) -> None:
    driver = browser
    assert site.call("POST", "/sessions", {"session_id": "s-long"})[0] == 201
    events = [{"type": "user", "text": f"message {n}"} for n in range(250)]
    assert site.call("POST", "/sessions/s-long/commit", {"expected_version": 1, "events": events})[0] == 200

    driver.get(site.url("/inspect/sessions/s-long"))
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) >= 100, "the first page")
    count = len(css_all(driver, "#timeline li.event"))
    assert count < 250  # not everything at once
    driver.execute_script("document.getElementById('load-more').scrollIntoView()")
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) > count, "the next page, loaded on scroll")

    driver.get(site.url("/inspect/sessions/s-long?at=230"))
    wait_for(driver, shown("#event-230.selected"), "the deep-linked event")
    assert css(driver, "#event-230 .event-body").text == "message 230"
    wait_for(driver, lambda d: css(d, "#state-panel").get_attribute("data-at") == "230", "its state")
    assert css_all(driver, "#event-249") == [] or css(driver, "#event-249 .event-body").text == "message 249"


@pytest.mark.backend("browser")
def test_an_answer_the_api_refuses_shows_the_apis_error_and_changes_nothing(browser: Any, site: Site) -> None:
    driver = browser
    assert site.call("POST", "/sessions", {"session_id": "s-late", "scopes": {"user": "alex-doe"}})[0] == 201
    call = site.call("POST", "/sessions/s-late/runs", {"message": ASK})[1]["yielded_tools"][0]
    driver.get(site.url("/inspect/sessions/s-late"))
    wait_for(driver, shown("#waiting form"), "the answer form")
    # someone else answers first (over curl, say): the page's answer is now for a call that no longer waits
    answers = {"answers": [{"call_id": call["call_id"], "input": {"approved": False, "note": "no"}}]}
    assert (
        site.call("POST", "/sessions/s-late/tools", answers)[0] == 200
    )  # held until the resumed turn ended (Prefer: wait)
    before = site.ledger("s-late")
    css(driver, "#waiting input[data-choice='true']").click()
    css(driver, "#waiting button[type=submit]").click()
    wait_for(driver, lambda d: css(d, "#waiting .form-error").text, "the API's refusal")
    message = css(driver, "#waiting .form-error").text
    assert message.startswith("409 UnknownCallId (answers.0.call_id)"), message  # a race lost: a conflict
    assert site.ledger("s-late") == before


# -- following a running turn ---------------------------------------------------------------------------------


@pytest.mark.backend("browser")
def test_a_running_turn_is_followed_live_until_it_ends(browser: Any, site: Site) -> None:
    """A turn that commits its steps as it goes (committed here through the store, as a runner would): the open
    page appends each step as it lands, in place, and shows the new status when the turn ends."""
    from dormant.events import AssistantEvent, InvocationEndEvent, InvocationStartEvent, ModelEndEvent

    driver = browser
    driver.get_log("browser")  # read (and so cleared): earlier tests' refusals are theirs
    sessions = site.served.for_tenant(PRINCIPAL).sessions
    session = sessions.create("s-live")
    invocation = "inv-live"
    model = {"provider": "scripted", "name": "slow"}

    def step(*events: Any) -> None:
        for event in events:
            session.append(event)
        sessions.commit(session)

    step(InvocationStartEvent(invocation_id=invocation, agent_name="booker"))
    driver.get(site.url("/inspect/sessions/s-live"))
    wait_for(driver, lambda d: css(d, "#timeline").get_attribute("data-follow") == "live", "the live feed")
    assert status_of(driver) == "running"
    assert [r.get_attribute("data-type") for r in css_all(driver, "#timeline li.event")] == ["invocation_start"]
    driver.execute_script("document.getElementById('timeline').dataset.mark = 'first'")  # gone if re-rendered

    step(ModelEndEvent(invocation_id=invocation, model=model, finish_reason="stop"))  # a model step
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) == 2, "the model step")
    step(AssistantEvent(invocation_id=invocation, text=HOSTILE))
    wait_for(driver, lambda d: len(css_all(d, "#timeline li.event")) == 3, "the answer")
    assert status_of(driver) == "running"
    step(InvocationEndEvent(invocation_id=invocation, status="completed", output_text="done"))
    wait_for(driver, lambda d: status_of(d) == "completed", "the status once the turn ended")

    ledger = site.ledger("s-live")
    rows = css_all(driver, "#timeline li.event")
    assert [r.get_attribute("data-type") for r in rows] == [e["type"] for e in ledger]
    assert [r.get_attribute("data-index") for r in rows] == [str(i) for i in range(len(ledger))]
    assert css(driver, "#timeline").get_attribute("data-mark") == "first"  # appended in place, not reloaded
    assert css(driver, "#event-2 .event-body").text == HOSTILE  # text, as everywhere
    assert css_all(driver, "main script, main img, main b") == []
    assert driver.execute_script("return window.__pwned === undefined")
    assert css(driver, "#timeline").get_attribute("data-follow") == ""  # the feed closed with the turn
    assert "completed" in css(driver, "#invocations").text
    no_page_errors(driver)


@pytest.mark.backend("browser")
def test_a_long_running_session_updates_its_status_live_and_its_pages_hold_every_event_once(
    browser: Any, site: Site
) -> None:
    """Followed while only its first page is shown: the status still changes when the turn ends, and the pages
    loaded later hold every event once, in order (a live event is never shown ahead of the ones before it)."""
    from dormant.events import InvocationEndEvent, InvocationStartEvent, UserEvent

    driver = browser
    driver.get_log("browser")
    sessions = site.served.for_tenant(PRINCIPAL).sessions
    session = sessions.create("s-long-live")
    session.append(InvocationStartEvent(invocation_id="inv-1", agent_name="booker"))
    for n in range(150):
        session.append(UserEvent(text=f"step {n}"))
    sessions.commit(session)
    driver.get(site.url("/inspect/sessions/s-long-live"))
    wait_for(driver, lambda d: css(d, "#timeline").get_attribute("data-follow") == "live", "the live feed")
    shown_before = len(css_all(driver, "#timeline li.event"))
    assert shown_before < 151 and status_of(driver) == "running"

    session.append(UserEvent(text="late step"))
    session.append(InvocationEndEvent(invocation_id="inv-1", status="completed"))
    sessions.commit(session)
    wait_for(driver, lambda d: status_of(d) == "completed", "the status once the turn ended")
    while css(driver, "#load-more").is_displayed():
        count = len(css_all(driver, "#timeline li.event"))
        driver.execute_script("document.getElementById('load-more').scrollIntoView()")
        wait_for(driver, lambda d, n=count: len(css_all(d, "#timeline li.event")) > n, "the next page")
    ledger = site.ledger("s-long-live")
    rows = css_all(driver, "#timeline li.event")
    assert [r.get_attribute("data-index") for r in rows] == [str(i) for i in range(len(ledger))]
    assert [r.get_attribute("data-type") for r in rows] == [e["type"] for e in ledger]
    no_page_errors(driver)


# -- who acts, and what they may answer ------------------------------------------------------------------------


@pytest.mark.backend("browser")
def test_the_page_shows_who_acts_and_offers_no_answer_the_api_would_refuse(browser: Any, tmp_path: Path) -> None:
    """Two pages over one store, as two people of tenant clinic: carol (no group) sees the approval waiting
    and no form for it, with the rule; bob (an approver) answers it on the page, recorded as bob."""
    from tests.support.people_app import build

    store = store_from_url(f"sqlite:///{tmp_path / 'people.db'}")
    people = build(store)
    served = Served(people.app, {"asker": people.agent})
    carol = LocalAPI(served, principal="carol", tenant="clinic", pages=default_pages())
    bob = LocalAPI(served, principal="bob", tenant="clinic", groups=["approvers"], pages=default_pages())
    headers = {"Content-Type": "application/json", "Prefer": "wait=25"}
    assert carol.call("POST", "/sessions", headers, b'{"session_id": "b-1"}', "alice", tenant="clinic").status == 201
    ran = carol.call("POST", "/sessions/b-1/runs", headers, b'{"message": "approve"}', "alice", tenant="clinic")
    assert ran.json()["status"] == "yielded_tool", ran.json()
    driver = browser
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, api in (("carol", carol), ("bob", bob)):
            server = LocalServer(api, "127.0.0.1", 0, log_requests=False)
            stack.enter_context(server.running())
            servers[name] = server
        driver.get(servers["carol"].url + "/inspect/sessions/b-1")
        wait_for(driver, shown("#waiting .refused"), "the refusal note")
        assert css(driver, "#who").text == "acting as carol · tenant clinic"
        assert "answerable by group:approvers" in css(driver, "#waiting .refused").text
        assert css_all(driver, "#waiting form") == []  # nothing offered that the API would refuse

        driver.get(servers["bob"].url + "/inspect/sessions/b-1")
        wait_for(driver, shown("#waiting form"), "the answer form")
        assert css(driver, "#who").text == "acting as bob · tenant clinic · groups approvers"
        css(driver, "#waiting input[data-choice='true']").click()
        css(driver, "#waiting button[type=submit]").click()
        wait_for(driver, lambda d: not css_all(d, "#waiting"), "the answered call to go")
    session = people.app.sessions.get("b-1")
    assert session is None  # the tenant's session is under its view, not the bare app's
    from dormant.serving.runtime import for_tenant

    answered = [e for e in for_tenant(people.app, "clinic").sessions.require("b-1").events if e.type == "tool_input"]
    assert [e.principal for e in answered] == ["bob"]
    store.close()
