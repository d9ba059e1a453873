"""Helpers for the web viewer's tests: seeded stores, links read from pages, a live server."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any

from durable_sessions import Event, Session, Store

ORG = "acme"
PWN_SCRIPT = "<script>window.__pwned=1</script>"
PWN_IMG = '<img src=x onerror="window.__pwned=1">'
EVENTS = 120
"""Events of the seeded session "trip": three transcript pages of 50, 50 and 20."""
START = datetime(2025, 3, 14, 9, 26, 53, tzinfo=timezone.utc)


class Anchor:
    """One ``<a>`` of a page: its attributes and its text."""

    def __init__(self, attrs: dict[str, str | None]) -> None:
        self.attrs = attrs
        self.text = ""

    @property
    def href(self) -> str:
        return self.attrs.get("href") or ""

    @property
    def rel(self) -> str:
        return self.attrs.get("rel") or ""


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[Anchor] = []
        self._open: Anchor | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open = Anchor(dict(attrs))
            self.found.append(self._open)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.text += data


def anchors(html: str) -> list[Anchor]:
    """Every ``<a>`` of a page, in order, with its text unescaped."""
    parser = _Anchors()
    parser.feed(html)
    return parser.found


def rel(html: str, name: str) -> str | None:
    """The href of the page's one ``<a rel=NAME>``, or None when there is none."""
    found = [a.href for a in anchors(html) if a.rel == name]
    assert len(found) <= 1, found
    return found[0] if found else None


def session_links(html: str) -> list[tuple[str, str]]:
    """The (href, text) of each session a list page shows, in order."""
    return [(a.href, a.text) for a in anchors(html) if a.attrs.get("class") == "session"]


def event_ids(html: str) -> list[int]:
    """The seqs of the events a session page shows, in order (their ``id="event-N"``)."""
    import re

    return [int(n) for n in re.findall(r'<li class="event" id="event-(\d+)">', html)]


async def seed(store: Store, org: str = ORG) -> None:
    """Sessions of ``org``: "trip" (120 events, state in every scope, one event holding
    script and markup), its fork "trip-fork", and "chat" of another user and app."""
    await store.create(
        Session(
            id="trip",
            org_id=org,
            user_id="alice",
            app_name="planner",
            title="Trip to Lisbon <b>bold</b>",
            state={"city": "Lisbon", "user:lang": "pt", "app:model": "m-1", "note": "<i>x</i>"},
        )
    )
    events = [
        Event(
            author="user" if i % 2 else "planner",
            content={"parts": [{"text": f"message {i} about the tram"}]},
            tokens=3,
            timestamp=START + timedelta(seconds=i),
        )
        for i in range(1, EVENTS + 1)
    ]
    events[1] = Event(
        author="planner",
        content={"parts": [{"text": f"hostile {PWN_SCRIPT} and {PWN_IMG} markup"}]},
        tokens=3,
        timestamp=START + timedelta(seconds=2),
    )
    await store.append_events(org, "trip", events)
    await store.fork(org, "trip", new_session_id="trip-fork")
    await store.create(Session(id="chat", org_id=org, user_id="bob", app_name="helpdesk"))
    await store.append_event(
        org, "chat", Event(author="user", content="where is my parcel", timestamp=START)
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, *, deadline: float = 30.0, alive: Any = None) -> None:
    """Poll until something accepts connections on ``port``; fail after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if alive is not None and not alive():
            raise AssertionError("the server stopped before it listened")
        if time.monotonic() > end:
            raise AssertionError(f"nothing listened on port {port} within {deadline} s")
        time.sleep(0.05)


@contextmanager
def live_server(make_app: Callable[[], tuple[Any, Callable[[], Awaitable[None]]]]) -> Iterator[str]:
    """Serve an application with uvicorn on a free port; yield its base URL; stop it after.

    ``make_app()`` runs in the server's own thread and event loop and returns the
    application and a coroutine function that closes what it opened (run in that loop).
    """
    import uvicorn

    port = free_port()
    holder: dict[str, Any] = {}

    async def run() -> None:
        app, close = make_app()
        try:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"
            )
            holder["server"] = server = uvicorn.Server(config)
            await server.serve()
        finally:
            await close()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    try:
        wait_for_port(port, alive=thread.is_alive)
        yield f"http://127.0.0.1:{port}"
    finally:
        if "server" in holder:
            holder["server"].should_exit = True
        thread.join(timeout=30)
