"""The viewer's pages on every store: sessions, one session, its transcript, search, errors."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

import httpx
from markupsafe import escape
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Session, Store
from durable_sessions.sql.schema import sessions
from durable_sessions.web import create_app
from durable_sessions.web.app import EVENTS_PER_PAGE, SESSIONS_PER_PAGE, SHOWN_CHARS
from support.viewer import (
    EVENTS,
    ORG,
    PWN_IMG,
    PWN_SCRIPT,
    anchors,
    event_ids,
    rel,
    seed,
    session_links,
)


@pytest.fixture
async def client(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the viewer over the seeded store (any organisation reachable)."""
    await seed(store)
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://viewer") as c:
        yield c


async def test_home_offers_a_form_to_open_an_organisation(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    assert 'name="org"' in page.text
    assert '<input type="search" name="q"' in page.text
    opened = await client.get("/orgs", params={"org": ORG})
    assert opened.status_code == 303
    assert opened.headers["location"] == f"/orgs/{ORG}"
    searched = await client.get("/orgs", params={"org": ORG, "q": "tram"})
    assert searched.headers["location"] == f"/orgs/{ORG}/search?q=tram"


async def test_sessions_are_listed_newest_first_as_links_titled_or_by_id(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get(f"/orgs/{ORG}")
    assert page.status_code == 200
    links = session_links(page.text)
    # "chat" was written last, the fork before it; the fork has its parent's title.
    assert links[0][1] == "chat"
    assert [href for href, _ in links] == [
        f"/orgs/{ORG}/sessions/chat",
        f"/orgs/{ORG}/sessions/trip-fork",
        f"/orgs/{ORG}/sessions/trip",
    ]
    assert links[2][1] == "Trip to Lisbon <b>bold</b>"
    assert '<input type="search" name="q"' in page.text
    assert rel(page.text, "next") is None


async def test_the_list_filters_by_app_and_by_user(client: httpx.AsyncClient) -> None:
    by_app = await client.get(f"/orgs/{ORG}", params={"app": "helpdesk"})
    assert [h for h, _ in session_links(by_app.text)] == [f"/orgs/{ORG}/sessions/chat"]
    by_user = await client.get(f"/orgs/{ORG}", params={"user": "alice"})
    assert [h.rsplit("/", 1)[1] for h, _ in session_links(by_user.text)] == ["trip-fork", "trip"]
    neither = await client.get(f"/orgs/{ORG}", params={"user": "alice", "app": "helpdesk"})
    assert session_links(neither.text) == []
    assert "No sessions match these filters" in neither.text


async def test_the_list_pages_by_rel_next_through_every_session_once(
    store: Store, client: httpx.AsyncClient
) -> None:
    for i in range(SESSIONS_PER_PAGE + 7):
        await store.create(Session(id=f"bulk-{i:03d}", org_id=ORG, user_id="carol", app_name="b"))
    seen: list[str] = []
    url: str | None = f"/orgs/{ORG}?user=carol"
    pages = 0
    while url is not None:
        page = await client.get(url)
        assert page.status_code == 200
        seen += [href.rsplit("/", 1)[1] for href, _ in session_links(page.text)]
        url = rel(page.text, "next")
        if url is not None:
            assert parse_qs(urlsplit(url).query)["user"] == ["carol"]  # the filter is kept
            # A cursor belongs to its filter: with another user it is refused.
            other = await client.get(url.replace("user=carol", "user=dave"))
            assert other.status_code == 400
        pages += 1
    assert pages == 2
    assert seen == [f"bulk-{i:03d}" for i in reversed(range(SESSIONS_PER_PAGE + 7))]


async def test_the_session_page_shows_metadata_state_by_scope_and_the_parent(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get(f"/orgs/{ORG}/sessions/trip-fork")
    assert page.status_code == 200
    text = page.text
    assert "<h1>Trip to Lisbon &lt;b&gt;bold&lt;/b&gt;</h1>" in text
    parent = [a for a in anchors(text) if a.rel == "parent"]
    assert [a.href for a in parent] == [f"/orgs/{ORG}/sessions/trip"]
    for label in ("Owner", "Messages", "Tokens", "Created", "Updated"):
        assert f"<dt>{label}</dt>" in text
    assert "alice" in text
    assert "planner" in text
    scopes = dict(re.findall(r"<h3>(\w+).*?</h3>(.*?)</section>", text, flags=re.S))
    assert set(scopes) == {"Session", "User", "App"}
    assert "city" in scopes["Session"]
    assert "forked_from" in scopes["Session"]
    assert "&lt;i&gt;x&lt;/i&gt;" in scopes["Session"]
    assert "user:lang" in scopes["User"]
    assert "user:lang" not in scopes["Session"]
    assert "app:model" in scopes["App"]

    original = await client.get(f"/orgs/{ORG}/sessions/trip")
    assert [a for a in anchors(original.text) if a.rel == "parent"] == []
    assert f"<dt>Messages</dt><dd>{EVENTS}</dd>" in original.text
    assert f"<dt>Tokens</dt><dd>{3 * EVENTS}</dd>" in original.text


async def test_the_transcript_pages_oldest_first_by_rel_next(client: httpx.AsyncClient) -> None:
    url: str | None = f"/orgs/{ORG}/sessions/trip"
    seqs: list[int] = []
    pages = 0
    while url is not None:
        page = await client.get(url)
        assert page.status_code == 200
        shown = event_ids(page.text)
        assert len(shown) <= EVENTS_PER_PAGE
        seqs += shown
        url = rel(page.text, "next")
        pages += 1
    assert seqs == list(range(1, EVENTS + 1))
    assert pages == 3


async def test_each_event_shows_seq_author_time_text_and_its_json(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get(f"/orgs/{ORG}/sessions/trip", params={"after_seq": 2})
    first = page.text.split('id="event-3"', 1)[1].split("</li>", 1)[0]
    assert '<a class="seq" href="#event-3">#3</a>' in first
    assert '<span class="author">user</span>' in first
    assert "2025-03-14 09:26:56 UTC" in first
    assert '<div class="text">message 3 about the tram</div>' in first
    folded = first.split("<details>", 1)[1]
    assert "<summary>JSON</summary>" in folded
    for key in ("seq", "author", "timestamp", "tokens", "content", "state_delta"):
        assert f"&#34;{key}&#34;" in folded


async def test_untrusted_text_is_escaped_everywhere(client: httpx.AsyncClient) -> None:
    for url in (
        f"/orgs/{ORG}/sessions/trip",
        f"/orgs/{ORG}/search?q=hostile",
        f"/orgs/{ORG}",
        f"/orgs/{ORG}/search?q={PWN_SCRIPT}",
    ):
        page = await client.get(url)
        assert "<script" not in page.text, url
        assert "<img" not in page.text, url
        assert "<b>bold" not in page.text, url
    session = await client.get(f"/orgs/{ORG}/sessions/trip")
    assert str(escape(PWN_SCRIPT)) in session.text
    assert str(escape(PWN_IMG)) in session.text
    hits = await client.get(f"/orgs/{ORG}/search", params={"q": "hostile"})
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in hits.text


async def test_search_hits_link_to_the_session_at_the_event(client: httpx.AsyncClient) -> None:
    page = await client.get(f"/orgs/{ORG}/search", params={"q": "MESSAGE 77 tram"})
    assert page.status_code == 200
    links = [a for a in anchors(page.text) if a.attrs.get("class") == "hit-link"]
    assert [a.href for a in links] == [f"/orgs/{ORG}/sessions/trip?after_seq=76#event-77"]
    assert "message 77 about the tram" in page.text
    target = await client.get(links[0].href.split("#", 1)[0])
    assert event_ids(target.text)[0] == 77

    parcel = await client.get(f"/orgs/{ORG}/search", params={"q": "parcel", "user": "bob"})
    hrefs = [a.href for a in anchors(parcel.text) if a.attrs.get("class") == "hit-link"]
    assert hrefs == [f"/orgs/{ORG}/sessions/chat#event-1"]
    none = await client.get(f"/orgs/{ORG}/search", params={"q": "parcel", "user": "alice"})
    assert "No event holds every word" in none.text

    empty = await client.get(f"/orgs/{ORG}/search")
    assert empty.status_code == 200
    assert "hit-link" not in empty.text


async def test_an_unknown_session_is_a_404_page(client: httpx.AsyncClient) -> None:
    page = await client.get(f"/orgs/{ORG}/sessions/nope")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "Session not found" in page.text
    assert "Traceback" not in page.text
    other_org = await client.get("/orgs/elsewhere/sessions/trip")
    assert other_org.status_code == 404
    no_route = await client.get("/no/such/page")
    assert no_route.status_code == 404
    assert "Not found" in no_route.text


async def test_bad_parameters_are_a_400_page(client: httpx.AsyncClient) -> None:
    for url in (
        f"/orgs/{ORG}?cursor=not-a-cursor",
        f"/orgs/{ORG}/sessions/trip?after_seq=abc",
        f"/orgs/{ORG}/sessions/trip?after_seq=-1",
        f"/orgs/{ORG}/search?q=%21%21%21",
        "/orgs?org=",
    ):
        page = await client.get(url)
        assert page.status_code == 400, url
        assert page.headers["content-type"].startswith("text/html"), url
        assert "Bad request" in page.text, url
        assert "Traceback" not in page.text, url


async def test_a_session_with_no_events_says_so(store: Store, client: httpx.AsyncClient) -> None:
    await store.create(Session(id="quiet", org_id=ORG, user_id="dan"))
    page = await client.get(f"/orgs/{ORG}/sessions/quiet")
    assert page.status_code == 200
    assert "No events." in page.text
    assert rel(page.text, "next") is None
    past = await client.get(f"/orgs/{ORG}/sessions/trip", params={"after_seq": EVENTS})
    assert event_ids(past.text) == []
    assert f"No events after #{EVENTS}." in past.text


async def test_a_session_id_with_a_slash_has_its_own_page(
    store: Store, client: httpx.AsyncClient
) -> None:
    await store.create(Session(id="a/b?c#d", org_id=ORG, user_id="eve"))
    await store.append_event(ORG, "a/b?c#d", Event(author="user", content="slashed"))
    listing = await client.get(f"/orgs/{ORG}", params={"user": "eve"})
    ((href, text),) = session_links(listing.text)
    assert text == "a/b?c#d"
    assert href == f"/orgs/{ORG}/sessions/a%2Fb%3Fc%23d"
    page = await client.get(href)
    assert page.status_code == 200
    assert event_ids(page.text) == [1]


async def test_long_values_are_shown_cut(store: Store, engine_or_none: AsyncEngine | None) -> None:
    """A title, a state value, an event's text and JSON far longer than a screen: each is
    shown cut, with how much more there is, so the page stays small."""
    long = "w" * 600_000
    await store.create(Session(id="long", org_id=ORG, user_id="u", state={"big": long}))
    await store.append_event(ORG, "long", Event("user", content={"text": long}))
    # A title stored before titles had a limit (no MySQL database is older than the limit).
    old_title = engine_or_none is not None and engine_or_none.dialect.name not in (
        "mysql",
        "mariadb",
    )
    if engine_or_none is not None and old_title:
        async with engine_or_none.begin() as conn:
            await conn.execute(update(sessions).values(title="t" * 300_000))
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://viewer") as client:
        pages = [await client.get(f"/orgs/{ORG}"), await client.get(f"/orgs/{ORG}/sessions/long")]
    for page in pages:
        assert page.status_code == 200
        assert len(page.text) < 20 * SHOWN_CHARS
    listed, shown = (page.text for page in pages)
    if old_title:
        assert f"… ({300_000 - SHOWN_CHARS:,} more characters)" in listed
        assert f"… ({300_000 - SHOWN_CHARS:,} more characters)" in shown
    # the state value, the event's text and its JSON; the title in the heading and the
    # window's title
    titled = 2 if old_title else 0
    assert shown.count("more characters)") == 3 + titled
    assert "w" * SHOWN_CHARS in shown
