"""The viewer's rules, through Starlette's test client: headers, read-only, token, one org."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from durable_sessions import (
    Event,
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    Session,
    SQLStore,
)
from durable_sessions.web import create_app
from support.viewer import ORG, anchors, seed

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
TOKEN = "s3cr3t-t0ken"
RIVAL = "rival"
RIVAL_WORDS = ("crossing", "Rival plan", "zed")
PATHS = [
    "/",
    "/orgs",
    f"/orgs/{ORG}",
    f"/orgs/{ORG}/sessions/trip",
    f"/orgs/{ORG}/search?q=tram",
    "/static/viewer.css",
    "/favicon.ico",
    "/no/such/page",
]
WRITES = ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


async def _seed_two_orgs(store: InMemoryStore) -> None:
    await seed(store)
    await store.create(Session(id="rival-only", org_id=RIVAL, user_id="zed", title="Rival plan"))
    await store.create(Session(id="trip", org_id=RIVAL, user_id="zed", title="Rival plan"))
    for sid in ("rival-only", "trip"):
        await store.append_event(RIVAL, sid, Event(author="user", content="zebra crossing"))


def _client(store: InMemoryStore, **options: Any) -> Iterator[TestClient]:
    with TestClient(create_app(store, **options), follow_redirects=False) as client:
        client.portal.call(_seed_two_orgs, store)
        yield client


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore()


@pytest.fixture
def client(store: InMemoryStore) -> Iterator[TestClient]:
    yield from _client(store)


@pytest.fixture
def pinned(store: InMemoryStore) -> Iterator[TestClient]:
    yield from _client(store, org_id=ORG)


@pytest.fixture
def guarded(store: InMemoryStore) -> Iterator[TestClient]:
    yield from _client(store, token=TOKEN)


def _assert_secure_headers(response: Any) -> None:
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


@pytest.mark.parametrize("path", PATHS)
def test_every_response_carries_the_security_headers(client: TestClient, path: str) -> None:
    _assert_secure_headers(client.get(path))
    _assert_secure_headers(client.post(path))


def test_pages_have_no_inline_script_or_style(client: TestClient) -> None:
    for path in PATHS[:5]:
        text = client.get(path, follow_redirects=True).text
        assert "<script" not in text
        assert "style=" not in text
        assert "<style" not in text
        assert 'rel="stylesheet" href="/static/viewer.css"' in text


@pytest.mark.parametrize("method", WRITES)
@pytest.mark.parametrize("path", PATHS)
def test_every_method_but_get_and_head_is_405(
    client: TestClient, store: InMemoryStore, method: str, path: str
) -> None:
    before = client.portal.call(store.list, Filter(org_id=ORG))
    response = client.request(method, path, data={"title": "changed"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    assert client.portal.call(store.list, Filter(org_id=ORG)) == before


def test_head_answers_like_get_without_a_body(client: TestClient) -> None:
    for path in (
        f"/orgs/{ORG}",
        f"/orgs/{ORG}/sessions/trip",
        "/static/viewer.css",
        "/favicon.ico",
    ):
        response = client.head(path)
        assert response.status_code == 200
        assert response.content == b""
        _assert_secure_headers(response)


def test_without_the_token_every_request_is_401(guarded: TestClient) -> None:
    for path in PATHS:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = guarded.get(path, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert "Lisbon" not in response.text
            _assert_secure_headers(response)
        assert (
            guarded.get(path, headers={"Cookie": f"durable_sessions_token={TOKEN}"}).status_code
            == 401
        )
        assert guarded.post(path).status_code == 401
    assert guarded.get(f"/orgs/{ORG}?token=wrong").status_code == 401


def test_the_bearer_token_opens_every_page(guarded: TestClient) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    page = guarded.get(f"/orgs/{ORG}/sessions/trip", headers=bearer)
    assert page.status_code == 200
    assert "Trip to Lisbon" in page.text
    assert guarded.get("/static/viewer.css", headers=bearer).status_code == 200
    assert guarded.post(f"/orgs/{ORG}", headers=bearer).status_code == 405


def test_the_token_in_the_url_sets_a_strict_cookie_and_is_dropped(guarded: TestClient) -> None:
    response = guarded.get(f"/orgs/{ORG}/search?q=tram&token={TOKEN}&user=alice")
    assert response.status_code == 303
    assert response.headers["location"] == f"/orgs/{ORG}/search?q=tram&user=alice"
    cookie = response.headers["set-cookie"]
    name, _, value = cookie.split(";", 1)[0].partition("=")
    assert name == "durable_sessions_token"
    assert TOKEN not in cookie  # the cookie holds a digest, not the token
    attributes = {part.strip() for part in cookie.split(";")[1:]}
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= attributes
    _assert_secure_headers(response)

    followed = guarded.get(response.headers["location"])
    assert followed.status_code == 200
    assert 'class="hit-link"' in followed.text
    guarded.cookies.clear()
    assert guarded.get(f"/orgs/{ORG}").status_code == 401
    altered = value[:-1] + ("0" if value[-1] != "0" else "1")
    assert guarded.get(f"/orgs/{ORG}", headers={"Cookie": f"{name}={altered}"}).status_code == 401
    assert guarded.get(f"/orgs/{ORG}", headers={"Cookie": f"{name}={value}"}).status_code == 200


def test_a_pinned_viewer_reaches_no_other_organisation_by_any_url(pinned: TestClient) -> None:
    home = pinned.get("/")
    assert home.status_code == 303
    assert home.headers["location"] == f"/orgs/{ORG}"
    attempts = [
        f"/orgs/{RIVAL}",
        f"/orgs/{RIVAL}/sessions/rival-only",
        f"/orgs/{RIVAL}/sessions/trip",
        f"/orgs/{RIVAL}/search?q=zebra",
        "/orgs/%72ival/sessions/trip",
        f"/orgs/{RIVAL}/?app=",
        f"/orgs?org={RIVAL}",
        f"/orgs?org={RIVAL}&q=zebra",
        f"/orgs/{ORG}/sessions/rival-only",
        f"/orgs/{ORG}/sessions/../../{RIVAL}/sessions/trip",
        f"/orgs/{ORG}/search?q=zebra",
        f"/orgs/{ORG}/search?q=zebra&org={RIVAL}",
        f"/orgs/{ORG}?org={RIVAL}",
    ]
    for path in attempts:
        response = pinned.get(path, follow_redirects=True)
        assert response.status_code in (200, 404), path
        for word in RIVAL_WORDS:
            assert word not in response.text, (path, word)
    assert pinned.get(f"/orgs/{RIVAL}").status_code == 404
    assert pinned.get(f"/orgs?org={RIVAL}").status_code == 404
    own = pinned.get(f"/orgs/{ORG}/sessions/trip")
    assert "Trip to Lisbon" in own.text
    assert pinned.get("/orgs").headers["location"] == f"/orgs/{ORG}"


def test_an_open_viewer_shows_any_organisation_it_is_asked_for(client: TestClient) -> None:
    page = client.get(f"/orgs/{RIVAL}/sessions/rival-only")
    assert page.status_code == 200
    assert "Rival plan" in page.text
    hits = client.get(f"/orgs/{ORG}/search?q=zebra")
    assert "rival-only" not in hits.text  # search stays in the organisation of the URL


def test_the_viewer_mounts_under_a_prefix(store: InMemoryStore) -> None:
    outer = Starlette(routes=[Mount("/viewer", app=create_app(store, token=TOKEN))])
    with TestClient(outer, follow_redirects=False) as client:
        client.portal.call(_seed_two_orgs, store)
        entered = client.get(f"/viewer/orgs/{ORG}?token={TOKEN}")
        assert entered.headers["location"] == f"/viewer/orgs/{ORG}"
        assert "Path=/viewer;" in entered.headers["set-cookie"]
        page = client.get(f"/viewer/orgs/{ORG}")
        assert page.status_code == 200
        hrefs = [a.href for a in anchors(page.text)]
        assert hrefs
        assert all(h.startswith("/viewer/") for h in hrefs), hrefs
        assert 'href="/viewer/static/viewer.css"' in page.text
        assert client.get("/viewer/static/viewer.css").status_code == 200
        opened = client.get(f"/viewer/orgs?org={ORG}")
        assert opened.headers["location"] == f"/viewer/orgs/{ORG}"


def test_arguments_are_checked() -> None:
    store = InMemoryStore()
    with pytest.raises(InvalidArgumentError):
        create_app(store, org_id="")
    with pytest.raises(InvalidArgumentError):
        create_app(store, token="")


class _FailingStore(InMemoryStore):
    """A store whose listing fails in a way no handler expects."""

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Any:
        raise RuntimeError("internal detail that must stay in the log")


def test_an_unexpected_failure_is_a_plain_500_without_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with TestClient(create_app(_FailingStore())) as client:
        response = client.get(f"/orgs/{ORG}")
    assert response.status_code == 500
    assert "internal detail" not in response.text
    assert "Traceback" not in response.text
    _assert_secure_headers(response)
    assert any("internal detail" in (r.exc_text or "") for r in caplog.records)


def test_an_unreachable_database_is_a_503_page_without_its_password() -> None:
    engine = create_async_engine("postgresql+asyncpg://viewer:pa55word@127.0.0.1:1/nowhere")
    with TestClient(create_app(SQLStore(engine))) as client:
        response = client.get(f"/orgs/{ORG}")
        client.portal.call(engine.dispose)
    assert response.status_code == 503
    assert "Database unavailable" in response.text
    assert "pa55word" not in response.text
