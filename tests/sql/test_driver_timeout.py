"""Postgres: asyncpg's ``command_timeout`` on a healthy server.

A statement that outlasts the driver's timeout (here, waiting for a row lock another
connection holds) says the server was slow, not that the connection is broken. The store
cancels the statement and waits for the server to acknowledge it, so that the write is not
left running unseen (it would otherwise go through once the lock is released, after the
caller was told it failed), raises ``StoreUnavailableError`` saying so, and keeps the rest of
its pool: a timeout is not a server restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Manager, SQLStore, StoreUnavailableError
from support.sql import raw_pg, statements

pytestmark = pytest.mark.postgres

POOL = 4
TIMEOUT = 0.3
SLOW = "did not answer within the driver's timeout (TimeoutError"
READ_BACK = "may have completed first: read back before retrying"


@pytest.fixture
async def timed_engine(
    fresh_migrated_pg_url: Callable[[], str],
) -> AsyncIterator[tuple[AsyncEngine, str]]:
    url = fresh_migrated_pg_url()
    engine = create_async_engine(
        url, pool_size=POOL, max_overflow=0, connect_args={"command_timeout": TIMEOUT}
    )
    yield engine, url
    await engine.dispose()


async def _backends(engine: AsyncEngine) -> set[int]:
    """The server process of each of the pool's connections (all checked out at once)."""

    held: list[int] = []
    everyone = asyncio.Event()

    async def one() -> int:
        async with engine.connect() as conn:
            pid = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar()
            held.append(int(pid))
            if len(held) == POOL:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 60)  # all checked out at once
            return int(pid)

    return set(await asyncio.gather(*(one() for _ in range(POOL))))


async def _nothing_running(url: str) -> None:
    """Wait until no other backend of the database is running a statement: a write that
    was left running (not cancelled) has then gone through or failed."""
    async with raw_pg(url) as admin:
        for _ in range(600):
            running = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state = 'active'"
            )
            if not running:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("a statement of the store kept running for 30 s")


async def _nothing_left_open(url: str) -> None:
    """No backend of the database is left inside a transaction (the timed-out one included)."""
    async with raw_pg(url) as admin:
        stuck = await admin.fetch(
            "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
        )
    assert not stuck, f"backends left inside a transaction: {stuck}"


@pytest.mark.parametrize("path", ["fast", "distributed", "watched"])
async def test_a_write_past_the_drivers_timeout_is_cancelled_and_the_pool_kept(
    timed_engine: tuple[AsyncEngine, str], path: str
) -> None:
    engine, url = timed_engine
    with ExitStack() as stack:
        if path == "watched":
            stack.enter_context(statements(engine))  # SQLAlchemy's execution layer
        manager = Manager(SQLStore(engine, distributed=path == "distributed"))
        session = await manager.create("org", "alice", state={"k": 0})
        before = await _backends(engine)

        async with raw_pg(url) as holder:
            lock = holder.transaction()
            await lock.start()
            await holder.execute(
                "SELECT 1 FROM ds_sessions WHERE org_id = 'org' AND id = $1 FOR UPDATE",
                session.id,
            )
            with pytest.raises(StoreUnavailableError) as appending:
                await manager.append_event(
                    session, Event(author="user", content={"text": "late"}, state_delta={"k": 1})
                )
            copy = await manager.get("org", session.id)
            copy.set("k", 2)
            with pytest.raises(StoreUnavailableError) as saving:
                await manager.save(copy)
            await lock.rollback()  # the lock goes: a write still running would now land

        await _nothing_running(url)
        stored = await manager.get("org", session.id)
        assert (stored.state, stored.version) == ({"k": 0}, 1)
        assert await manager.list_events("org", session.id) == []

        await _nothing_left_open(url)
        kept = before & await _backends(engine)
        # SQLAlchemy's execution layer replaces each connection that timed out (two).
        assert len(kept) == (POOL - 2 if path == "watched" else POOL)
        await manager.append_event(stored, Event(author="user", state_delta={"k": 3}))
        assert (await manager.get("org", session.id)).state == {"k": 3}
        for caught in (appending, saving):
            assert SLOW in str(caught.value)
            assert READ_BACK in str(caught.value)


async def test_a_read_past_the_drivers_timeout_says_so_without_a_read_back(
    timed_engine: tuple[AsyncEngine, str],
) -> None:
    engine, url = timed_engine
    manager = Manager(SQLStore(engine))
    session = await manager.create("org", "alice")
    async with raw_pg(url) as holder:
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE ds_sessions IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailableError) as caught:
            await manager.get("org", session.id)
        await lock.rollback()
    await _nothing_left_open(url)
    assert str(caught.value).startswith(f"get: the database {SLOW}")
    assert "read back" not in str(caught.value)
    assert (await manager.get("org", session.id)).id == session.id
