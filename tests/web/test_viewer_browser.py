"""The viewer in headless Chromium: navigate, page, search, and hostile text that never runs.

Debian's ``chromium`` (``/usr/bin/chromium``) driven by Playwright's Python package; its
own browser downloads are never used. Without either, the tests skip locally and fail
under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
pytest.importorskip("uvicorn")
if os.environ.get("CI", "").lower() != "true":
    pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright")

from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import SQLStore
from durable_sessions.web import create_app
from durable_sessions.web.serve import read_only_engine
from support.viewer import EVENTS, ORG, PWN_IMG, PWN_SCRIPT, live_server, seed

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "viewer.png"
UPDATE_SCREENSHOT = "DURABLE_SESSIONS_UPDATE_SCREENSHOT"
"""Set to 1 to write the screenshot the docs show (docs/images/viewer.png)."""
TOKEN = "browser-token"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium, for the module's tests."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: apt-get install chromium"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true: the browser tests may not skip)")
        pytest.skip(message)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def database(tmp_path: Path) -> str:
    """A migrated, seeded SQLite file."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'viewer.db'}"

    async def work() -> None:
        engine = create_async_engine(url)
        try:
            store = SQLStore(engine)
            await store.migrate()
            await seed(store)
        finally:
            await engine.dispose()

    # A thread of its own: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work()).result()
    return url


def _viewer(url: str, **options: Any) -> Callable[[], tuple[Any, Callable[[], Awaitable[None]]]]:
    def make() -> tuple[Any, Callable[[], Awaitable[None]]]:
        engine = read_only_engine(url)
        return create_app(SQLStore(engine), **options), engine.dispose

    return make


class _Console:
    """Everything a page logged, and every script error it raised."""

    def __init__(self, page: Page) -> None:
        self.messages: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda error: self.messages.append(f"pageerror: {error}"))

    def _message(self, message: ConsoleMessage) -> None:
        self.messages.append(f"{message.type}: {message.text}")

    def problems(self) -> list[str]:
        return [m for m in self.messages if not m.startswith(("log:", "info:", "debug:"))]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_navigate_page_search_and_nothing_hostile_runs(
    browser: Browser, database: str, tmp_path: Path
) -> None:
    with live_server(_viewer(database)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        console = _Console(page)

        page.goto(f"{base}/")
        page.fill("input[name=org]", ORG)
        page.click("header button")
        page.wait_for_url(f"{base}/orgs/{ORG}")
        titles = page.locator("a.session").all_inner_texts()
        assert titles == ["chat", "Trip to Lisbon <b>bold</b>", "Trip to Lisbon <b>bold</b>"]

        page.locator("a.session").nth(2).click()
        page.wait_for_url(f"{base}/orgs/{ORG}/sessions/trip")
        assert page.inner_text("h1") == "Trip to Lisbon <b>bold</b>"
        assert page.locator("main b").count() == 0
        seqs: list[int] = []
        while True:
            ids = page.locator("li.event").evaluate_all("items => items.map(i => i.id)")
            seqs += [int(i.removeprefix("event-")) for i in ids]
            following = page.locator("a[rel=next]")
            if following.count() == 0:
                break
            following.click()
            page.wait_for_url(re.compile(r"after_seq=\d+"))
        assert seqs == list(range(1, EVENTS + 1))

        page.fill("header input[type=search][name=q]", "hostile")
        page.press("header input[type=search][name=q]", "Enter")
        page.wait_for_url(f"{base}/orgs/{ORG}/search?q=hostile")
        hits = page.locator("a.hit-link")
        assert hits.count() == 1
        assert PWN_SCRIPT in page.inner_text("p.snippet")
        hits.first.click()
        page.wait_for_url(f"{base}/orgs/{ORG}/sessions/trip?after_seq=1#event-2")
        shown = page.inner_text("#event-2 .text")
        assert PWN_SCRIPT in shown
        assert PWN_IMG in shown
        assert page.locator("#event-2 script, #event-2 img").count() == 0
        assert page.evaluate("typeof window.__pwned") == "undefined"
        page.click("#event-2 summary")
        assert PWN_SCRIPT.replace('"', '\\"') in page.inner_text("#event-2 details pre")

        # The page's own stylesheet is applied (the policy allows it): the bar is styled.
        assert page.evaluate("getComputedStyle(document.querySelector('header')).display") == "flex"

        page.goto(f"{base}/orgs/{ORG}/sessions/trip-fork")
        assert page.get_attribute("a[rel=parent]", "href") == f"/orgs/{ORG}/sessions/trip"
        page.set_viewport_size({"width": 1280, "height": 1100})
        page.goto(f"{base}/orgs/{ORG}/sessions/trip")
        shot = page.screenshot()
        assert _png_size(shot) == (1280, 1100)
        (tmp_path / "viewer.png").write_bytes(shot)
        if os.environ.get(UPDATE_SCREENSHOT) == "1":
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            SCREENSHOT.write_bytes(shot)

        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert console.problems() == []
        page.close()


def test_the_token_once_in_the_url_opens_the_viewer(browser: Browser, database: str) -> None:
    with live_server(_viewer(database, org_id=ORG, token=TOKEN)) as base:
        context = browser.new_context()
        page = context.new_page()
        console = _Console(page)
        response = page.goto(f"{base}/orgs/{ORG}")
        assert response is not None
        assert response.status == 401
        page.goto(f"{base}/?token={TOKEN}")
        page.wait_for_url(f"{base}/orgs/{ORG}")
        assert page.locator("a.session").count() == 3
        cookies = context.cookies()
        assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
            ("durable_sessions_token", True, "Strict")
        ]
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
        page.locator("a.session").first.click()
        page.wait_for_url(f"{base}/orgs/{ORG}/sessions/chat")
        assert "where is my parcel" in page.inner_text("ol.events")
        other = browser.new_context().new_page()
        refused = other.goto(f"{base}/orgs/{ORG}")
        assert refused is not None
        assert refused.status == 401
        other.context.close()
        # The only console line is the browser's report of the first 401.
        assert all("401" in line for line in console.problems()), console.problems()
        context.close()
