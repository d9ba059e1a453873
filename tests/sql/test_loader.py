"""The bulk loader under both imports (JSONL and ADK): clashes worded alike, statistics fresh."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.sql.loader import Loader, RowExistsError
from durable_sessions.sql.schema import sessions
from durable_sessions.sql.transactions import write_transaction
from durable_sessions.sql.transfer import ImportLineError, export_jsonl, import_jsonl
from support.sql import SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS)

TABLES = {"ds_sessions", "ds_events", "ds_user_state", "ds_app_state"}


async def jsonl_source(store: SQLStore) -> bytes:
    """An export of one session with an event and shared state in organisation 'src'."""
    manager = Manager(store, app_name="a")
    session = await manager.create("src", "u", id="s", state={"k": 1})
    delta = {"user:lang": "fr", "app:tier": "gold"}
    await manager.append_event(session, Event("user", {"text": "hi"}, state_delta=delta))
    out = io.BytesIO()
    await export_jsonl(store, out)
    return out.getvalue()


async def adk_source(tmp_path: Path) -> str:
    """An ADK database (SQLite) of one session with an event and shared state."""
    pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")
    from google.adk.events.event import Event as AdkEvent
    from google.adk.sessions import DatabaseSessionService
    from google.genai import types

    url = f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
    adk = DatabaseSessionService(db_url=url)
    try:
        state = {"k": 1, "user:lang": "fr", "app:tier": "gold"}
        session = await adk.create_session(app_name="a", user_id="u", session_id="s", state=state)
        content = types.Content(role="user", parts=[types.Part(text="hi")])
        await adk.append_event(session, AdkEvent(author="user", invocation_id="i", content=content))
    finally:
        await adk.close()
    return url


async def analysed_since(engine: AsyncEngine, since: datetime | None) -> set[str]:
    """The tables whose planner statistics were refreshed (by ANALYZE) since ``since``: on
    SQLite, those with rows in ``sqlite_stat1``."""
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = "SELECT relname FROM pg_stat_user_tables WHERE last_analyze >= :since"
            rows = await conn.execute(text(query), {"since": since})
        else:
            has = "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'"
            if not (await conn.exec_driver_sql(has)).scalar_one():
                return set()
            rows = await conn.exec_driver_sql("SELECT DISTINCT tbl FROM sqlite_stat1")
        return {row[0] for row in rows}


async def clock(engine: AsyncEngine) -> datetime | None:
    if engine.dialect.name != "postgresql":
        return None
    async with engine.connect() as conn:
        now: datetime = (await conn.exec_driver_sql("SELECT clock_timestamp()")).scalar_one()
        return now


@pytest.mark.parametrize("importer", ["jsonl", "adk"])
async def test_both_imports_leave_the_planner_statistics_fresh(
    engine: AsyncEngine, tmp_path: Path, importer: str
) -> None:
    store = SQLStore(engine)
    if importer == "jsonl":
        data = (await jsonl_source(store)).replace(b'"org_id":"src"', b'"org_id":"dst"')
    else:
        url = await adk_source(tmp_path)
    since = await clock(engine)
    assert not TABLES & await analysed_since(engine, since)
    if importer == "jsonl":
        counts = await import_jsonl(store, io.BytesIO(data))
    else:
        from durable_sessions.adk import import_adk

        counts = await import_adk(url, store, org_id="dst")
    assert (counts.sessions, counts.events, counts.user_state, counts.app_state) == (1, 1, 1, 1)
    analysed = await analysed_since(engine, since)
    assert analysed >= TABLES
    # Only the tables written: never a SQLite full-text index (see the paging guide).
    assert not {name for name in analysed if "_fts" in name}


@pytest.mark.parametrize("importer", ["jsonl", "adk"])
async def test_both_imports_word_a_clash_alike(
    engine: AsyncEngine, tmp_path: Path, importer: str
) -> None:
    store = SQLStore(engine)
    expected = (
        "session {id!r} of organisation 'src' already exists (in the database, or earlier in "
        "the input); nothing was imported"
    )
    if importer == "jsonl":
        data = await jsonl_source(store)
        with pytest.raises(ImportLineError) as caught:
            await import_jsonl(store, io.BytesIO(data))
        assert str(caught.value) == "line 2: " + expected.format(id="s")
    else:
        url = await adk_source(tmp_path)
        from durable_sessions.adk import AdkImportError, durable_session_id, import_adk

        await import_adk(url, store, org_id="src")
        with pytest.raises(AdkImportError) as caught:
            await import_adk(url, store, org_id="src")
        assert str(caught.value) == expected.format(id=durable_session_id("a", "u", "s"))
    assert isinstance(caught.value.__cause__, RowExistsError)
    assert caught.value.__cause__.table == "ds_sessions"


async def test_a_row_given_twice_is_refused_naming_where_it_came_first(
    engine: AsyncEngine,
) -> None:
    row = {
        "org_id": "o", "id": "s", "user_id": "u", "app_name": "a", "title": "", "state": {},
        "parent_id": None, "created_at": datetime(2025, 1, 2).astimezone(),
        "updated_at": datetime(2025, 1, 2).astimezone(), "message_count": 0, "token_total": 0,
        "event_seq": 0, "version": 1, "incarnation": "i",
    }  # fmt: skip
    async with write_transaction(engine) as conn:
        loader = Loader(conn, [sessions], where=lambda line: f"on line {line}")
        await loader.add(sessions, dict(row), tag=7)
        with pytest.raises(RowExistsError) as caught:
            await loader.add(sessions, dict(row), tag=9)
    assert str(caught.value) == "session 's' of organisation 'o' already exists on line 7"
    assert caught.value.tag == 9


async def test_a_batch_is_written_once_its_rows_or_bytes_are_full(engine: AsyncEngine) -> None:
    def row(n: int) -> dict[str, object]:
        return {
            "org_id": "o", "id": f"s{n}", "user_id": "u", "app_name": "a", "title": "",
            "state": {}, "parent_id": None, "created_at": datetime(2025, 1, 2).astimezone(),
            "updated_at": datetime(2025, 1, 2).astimezone(), "message_count": 0,
            "token_total": 0, "event_seq": 0, "version": 1, "incarnation": "i",
        }  # fmt: skip

    async with write_transaction(engine) as conn:
        loader = Loader(conn, [sessions], batch_rows=3, batch_bytes=100)
        written = []
        for n, size in enumerate([0, 0, 0, 60, 60, 0]):
            await loader.add(sessions, row(n), size=size)
            written.append(loader.counts["ds_sessions"])
        assert written == [0, 0, 3, 3, 5, 5]  # three rows; then 120 bytes
        assert await loader.finish(analyze=False) == {"ds_sessions": 6}
