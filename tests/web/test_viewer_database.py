"""The viewer on SQL databases: a few statements per page, and connections that cannot write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

import httpx
from sqlalchemy import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    Event,
    InvalidArgumentError,
    SchemaNotMigratedError,
    Session,
    SQLStore,
    StoreError,
)
from durable_sessions.web import create_app
from durable_sessions.web.serve import read_only_engine
from support.sql import STORE_SQL_BACKENDS, statements
from support.viewer import ORG, rel, seed

MAX_STATEMENTS = 5
"""The most statements (BEGIN and COMMIT included) one page may send."""
PAGES = [
    f"/orgs/{ORG}",
    f"/orgs/{ORG}?user=alice&app=planner",
    f"/orgs/{ORG}/sessions/trip",
    f"/orgs/{ORG}/sessions/trip?after_seq=50",
    f"/orgs/{ORG}/sessions/trip-fork",
    f"/orgs/{ORG}/search?q=tram",
    f"/orgs/{ORG}/search?q=tram&user=alice",
]


def _client(store: SQLStore) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(store))
    return httpx.AsyncClient(transport=transport, base_url="http://viewer")


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_each_page_is_a_few_statements(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    await seed(store)
    async with _client(store) as client:
        await client.get(f"/orgs/{ORG}")  # the store's first use looks at the schema once
        first = await client.get(f"/orgs/{ORG}")
        next_page = rel(first.text, "next")
        assert next_page is None
        for url in PAGES:
            with statements(engine) as seen:
                page = await client.get(url)
            assert page.status_code == 200, url
            assert 1 <= len(seen) <= MAX_STATEMENTS, (url, [s for s, _ in seen])


async def _migrated_and_seeded(url: str) -> None:
    engine = create_async_engine(url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        await seed(store)
    finally:
        await engine.dispose()


@pytest.fixture(params=STORE_SQL_BACKENDS)
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each dialect, seeded, that no other test uses."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'viewer.db'}"
    else:
        make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
        url = make()
    await _migrated_and_seeded(url)
    return url


async def test_the_read_only_engine_shows_every_page(database_url: str) -> None:
    engine = read_only_engine(database_url)
    try:
        async with _client(SQLStore(engine)) as client:
            for url in PAGES:
                page = await client.get(url)
                assert page.status_code == 200, url
                assert "Trip to Lisbon" in page.text or "hit-link" in page.text, url
    finally:
        await engine.dispose()


async def test_the_read_only_engine_cannot_write(database_url: str) -> None:
    engine = read_only_engine(database_url)
    try:
        store = SQLStore(engine)
        with pytest.raises(StoreError):
            await store.create(Session(id="new", org_id=ORG, user_id="mallory"))
        with pytest.raises(StoreError):
            await store.append_event(ORG, "trip", Event(author="mallory", content="x"))
        with pytest.raises(StoreError):
            await store.delete(ORG, "chat")
        assert (await store.get(ORG, "chat")).message_count == 1
        async with engine.connect() as conn:
            with pytest.raises(Exception, match=r"(?i)read.?only"):
                await conn.exec_driver_sql("DELETE FROM ds_events")
    finally:
        await engine.dispose()
    # A writable engine still finds everything in place.
    writable = create_async_engine(database_url)
    try:
        assert len(await SQLStore(writable).list_events(ORG, "trip")) == 120
    finally:
        await writable.dispose()


@pytest.mark.sqlite
async def test_a_sqlite_path_with_odd_characters_opens_read_only(tmp_path: Path) -> None:
    folder = tmp_path / "a dir with spaces?#%"
    folder.mkdir()
    url = f"sqlite:///{folder / 'odd name.db'}"
    await _migrated_and_seeded(str(make_url(url).set(drivername="sqlite+aiosqlite")))
    engine = read_only_engine(url)
    try:
        assert (await SQLStore(engine).get(ORG, "trip")).title.startswith("Trip")
    finally:
        await engine.dispose()


@pytest.mark.sqlite
async def test_a_mysql_viewer_cannot_write() -> None:
    url = os.environ.get("DURABLE_SESSIONS_TEST_MYSQL_URL")
    if not url:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DURABLE_SESSIONS_TEST_MYSQL_URL must be set when CI=true")
        pytest.skip("DURABLE_SESSIONS_TEST_MYSQL_URL is not set")
    engine = read_only_engine(make_url(url).set(database="test"))
    try:
        async with engine.connect() as conn:
            with pytest.raises(DBAPIError, match="READ ONLY"):
                await conn.exec_driver_sql("CREATE TABLE ds_viewer_probe (x INT)")
    finally:
        await engine.dispose()


def test_a_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(SchemaNotMigratedError, match="no database file"):
        read_only_engine(f"sqlite:///{missing}")
    assert not missing.exists()
    for url in ("sqlite://", "sqlite:///:memory:", "oracle://u@h/db", "not a url"):
        with pytest.raises(InvalidArgumentError):
            read_only_engine(url)


@pytest.mark.sqlite
async def test_the_viewer_sees_writes_made_meanwhile(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'live.db'}"
    await _migrated_and_seeded(url)
    reader = read_only_engine(url)
    writer = create_async_engine(url)
    try:
        async with _client(SQLStore(reader)) as client:
            before = await client.get(f"/orgs/{ORG}/sessions/chat")
            assert "is it late" not in before.text
            await SQLStore(writer).append_event(
                ORG, "chat", Event(author="user", content="is it late?")
            )
            after = await client.get(f"/orgs/{ORG}/sessions/chat")
            assert "is it late?" in after.text
    finally:
        await asyncio.gather(reader.dispose(), writer.dispose())
