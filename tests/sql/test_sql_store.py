"""SQLStore specifics: dialect choice, compiled SQL, statement counts, errors, SQLite setup."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    SchemaNotMigratedError,
    SQLStore,
    StoreError,
    StoreUnavailableError,
)
from durable_sessions.sql.dialect import dialect_ops
from durable_sessions.sql.schema import app_state, user_state
from support.sql import STORE_SQL_BACKENDS, data_statements, snapshot, statements


def test_refuses_a_sync_engine() -> None:
    with pytest.raises(InvalidArgumentError, match="AsyncEngine"):
        SQLStore(create_engine("sqlite://"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("dialect", "driver"), [("mysql", "aiomysql"), ("postgresql", "psycopg")])
def test_refuses_unsupported_drivers(dialect: str, driver: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"not {dialect}\\+{driver}"):
        dialect_ops(dialect, driver)


@pytest.mark.parametrize(
    ("name", "driver", "compiled_dialect"),
    [("postgresql", "asyncpg", postgresql.dialect()), ("sqlite", "aiosqlite", sqlite.dialect())],
)
def test_upsert_compiles_to_on_conflict_for_each_dialect(
    name: str, driver: str, compiled_dialect: Any
) -> None:
    ops = dialect_ops(name, driver)
    sql = str(
        ops.upsert(
            user_state, ["org_id", "app_name", "user_id", "key"], ["value", "updated_at"]
        ).compile(dialect=compiled_dialect)
    ).replace('"', "")  # SQLite quotes the column named key
    assert "ON CONFLICT (org_id, app_name, user_id, key) DO UPDATE SET" in sql
    assert "value = excluded.value" in sql
    assert "updated_at = excluded.updated_at" in sql
    app_sql = str(
        ops.upsert(app_state, ["org_id", "app_name", "key"], ["value"]).compile(
            dialect=compiled_dialect
        )
    ).replace('"', "")
    assert "ON CONFLICT (org_id, app_name, key) DO UPDATE SET value = excluded.value" in app_sql
    nothing = str(ops.insert_if_absent(user_state).compile(dialect=compiled_dialect))
    assert "ON CONFLICT DO NOTHING" in nothing


def test_postgres_merges_private_state_in_sql() -> None:
    pg = dialect_ops("postgresql", "asyncpg")
    assert pg.merge_private is not None
    assert "ds_sessions.state || " in str(pg.merge_private().compile(dialect=postgresql.dialect()))
    assert dialect_ops("sqlite", "aiosqlite").merge_private is None


pytestmark_sql = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)


@pytestmark_sql
async def test_statement_counts_do_not_grow_with_keys_or_sessions(
    backend: str, engine: AsyncEngine
) -> None:
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    many = {f"k{i}": i for i in range(50)}
    many.update({f"user:u{i}": i for i in range(50)})
    many.update({f"app:a{i}": i for i in range(50)})
    session = await manager.create("org", "alice", state=many)
    for _ in range(30):
        await manager.create("org", "alice")
    await manager.get("org", session.id)  # warm the connection (SQLite pragmas run once)

    with statements(engine) as seen:
        loaded = await manager.get("org", session.id)
    assert len(data_statements(seen)) <= 2
    assert len(loaded.state) == 150

    with statements(engine) as seen:
        listed = await manager.list(Filter("org", user_id="alice"))
    assert len(data_statements(seen)) == 1
    assert len(listed) == 31

    for i in range(50):
        loaded.set(f"user:u{i}", -i)
        loaded.set(f"app:a{i}", -i)
        loaded.set(f"k{i}", -i)
    with statements(engine) as seen:
        await manager.save(loaded)
    # Whatever the key count: on SQLite the session row's UPDATE and one upsert per shared
    # table; on MySQL the session row's lock before them; on Postgres all of it in one
    # statement.
    assert len(data_statements(seen)) == {"postgres": 1, "mysql": 4}.get(backend, 3)
    begins = [s for s, _ in seen if s.upper().startswith("BEGIN")]
    assert len(begins) <= 1

    with statements(engine) as seen:
        await store.list_events("org", session.id, limit=20)
    # An empty transcript costs a second statement to tell "no events" from "no session".
    assert len(data_statements(seen)) <= 2
    await store.append_event("org", session.id, Event("user", content="hi"))
    with statements(engine) as seen:
        events = await store.list_events("org", session.id, limit=20)
    assert len(data_statements(seen)) == 1
    assert [e.content for e in events] == ["hi"]


@pytestmark_sql
async def test_refused_input_leaves_every_table_unchanged(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "alice", state={"k": 1, "user:u": 1, "app:a": 1})
    await manager.append_event(session, Event("user", content="hello"))
    before = await snapshot(engine)

    bad_states: list[dict[str, Any]] = [
        {"k": math.nan},
        {"user:u": math.inf},
        {"app:a": "nul\x00"},
        {"nul\x00key": 1},
        {"k": {1: "non-string key"}},
        {"k": object()},
        {"user:": 1},
        {"": 1},
        {"k": "\ud800"},
    ]
    for bad in bad_states:
        with pytest.raises(InvalidStateError):
            await manager.create("org", "bob", state=bad)
        stale = await manager.get("org", session.id)
        stale.state.update(bad)
        with pytest.raises(InvalidStateError):
            await manager.save(stale)
        with pytest.raises(InvalidStateError):
            await store.append_event("org", session.id, Event("user", state_delta=bad))
    for content in (math.nan, {"x": "\x00"}, {2: 3}, b"bytes"):
        with pytest.raises(InvalidStateError):
            await store.append_event("org", session.id, Event("user", content=content))
    with pytest.raises(InvalidArgumentError):
        await store.append_event(
            "org",
            session.id,
            Event("user", timestamp=datetime(2024, 1, 1)),  # naive
        )
    for org in ("", None):
        with pytest.raises(InvalidArgumentError):
            await manager.create(org, "bob")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await manager.get(org, session.id)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Filter(org_id="")

    assert await snapshot(engine) == before


@pytestmark_sql
async def test_unmigrated_database_says_to_migrate(backend: str, request: Any) -> None:
    if backend == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
    else:
        url = request.getfixturevalue("fresh_pg_url")()
    engine = create_async_engine(url)
    try:
        store = SQLStore(engine)
        with pytest.raises(SchemaNotMigratedError, match="migrate"):
            await store.get("org", "missing")
        with pytest.raises(SchemaNotMigratedError, match="migrate"):
            await Manager(store).create("org", "alice")
    finally:
        await engine.dispose()


async def test_unreachable_postgres_is_a_typed_error_without_the_password() -> None:
    engine = create_async_engine("postgresql+asyncpg://someone:s3cret-pw@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await SQLStore(engine).get("org", "id")
        assert "s3cret-pw" not in str(caught.value)
    finally:
        await engine.dispose()


@pytest.mark.sqlite
async def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(sqlite_url: str) -> None:
    engine = create_async_engine(sqlite_url)
    try:
        async with engine.connect() as conn:  # a connection pooled before the store exists
            await conn.execute(text("SELECT 1"))
        store = SQLStore(engine, busy_timeout=12.5)
        await store.migrate()
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar() == 12500
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
    finally:
        await engine.dispose()


def _fresh_database_with_a_writer(path: Path) -> sqlite3.Connection:
    """A rollback-journal database another connection is writing to (RESERVED lock held).

    SQLite answers a switch to WAL with SQLITE_BUSY at once in this state, without
    waiting for its busy timeout: what several processes opening one fresh file meet.
    """
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE other (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO other VALUES (1)")
    return holder


@pytest.mark.sqlite
async def test_a_writer_on_a_fresh_database_delays_the_switch_to_wal(tmp_path: Path) -> None:
    """The store waits for the writer's lock, as for any statement, then gets WAL."""
    path = tmp_path / "fresh.db"
    holder = _fresh_database_with_a_writer(path)
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        store = SQLStore(engine, busy_timeout=30)
        asyncio.get_running_loop().call_later(0.3, holder.execute, "COMMIT")
        await store.migrate()
        session = await Manager(store).create("org", "alice", state={"k": 1})
        assert (await store.get("org", session.id)).state == {"k": 1}
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("SELECT x FROM other")).scalar() == 1
    finally:
        holder.close()
        await engine.dispose()


@pytest.mark.sqlite
async def test_a_writer_that_outlasts_the_busy_timeout_is_a_typed_error(tmp_path: Path) -> None:
    """The switch to WAL gives up after the busy timeout, not before, with a StoreError,
    and the writer's transaction is untouched."""
    path = tmp_path / "fresh.db"
    holder = _fresh_database_with_a_writer(path)
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        store = SQLStore(engine, busy_timeout=0.4)
        started = time.monotonic()
        with pytest.raises(StoreError, match="locked"):
            await store.migrate()
        assert time.monotonic() - started >= 0.4
        holder.execute("COMMIT")
        assert holder.execute("SELECT x FROM other").fetchall() == [(1,)]
    finally:
        holder.close()
        await engine.dispose()


async def test_from_url_owns_and_disposes_its_engine(sqlite_url: str) -> None:
    store = SQLStore.from_url(sqlite_url)
    await store.migrate()
    session = await Manager(store).create("org", "alice", state={"k": 1})
    await store.close()
    again = SQLStore.from_url(sqlite_url)
    try:
        assert (await again.get("org", session.id)).state == {"k": 1}
    finally:
        await again.close()


async def test_a_shared_engine_is_not_disposed_by_the_store(sqlite_url: str) -> None:
    engine = create_async_engine(sqlite_url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        await store.close()
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()


@pytestmark_sql
async def test_nothing_keeps_a_transcript_read_once_returned(engine: AsyncEngine) -> None:
    """A read's value is the caller's alone: aiosqlite's worker thread (and the future it
    set) keep only an emptied box, and the asyncpg records the rows came in are let go
    (their future lives until the event loop's next turn)."""
    import asyncio
    import gc

    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    await store.append_events(
        "org", session.id, [Event("user", content={"n": n}) for n in range(300)]
    )
    for _ in range(2):
        contents = await store.list_event_contents("org", session.id)
        assert contents == [{"n": n} for n in range(300)]
        holders = [r for r in gc.get_referrers(contents) if isinstance(r, asyncio.Future)]
        assert holders == []
        records = [o for o in gc.get_objects() if type(o).__name__ == "Record"]
        assert len(records) < 300
        del contents
