"""Postgres: the store's guarantees do not depend on the database's default isolation level.

A database (or role) with ``default_transaction_isolation`` set to REPEATABLE READ or
SERIALIZABLE, or an engine made with ``isolation_level="SERIALIZABLE"``, must not turn
concurrent appends to one session into serialization errors: every append lands, and two
saves from one version still end with one winner and one ``StaleSessionError``. The store
runs its own transactions at READ COMMITTED, on each of its paths: the fast runner, the
distributed (stepwise) mode, and SQLAlchemy's execution layer (taken when something listens
to the engine's events).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from conftest import set_pg_database
from durable_sessions import Event, Manager, SQLStore, StaleSessionError
from durable_sessions.sql.dialects.postgresql.runner import PG_READ_COMMITTED
from reliability.test_cancellation import WRITES, Checker, Sweep, attempt, pooled
from support.sql import raw_pg, statements

pytestmark = pytest.mark.postgres

TASKS = 12
APPENDS = 8

# Where the stricter level comes from: the database's default, or the engine's own setting.
LEVELS = [
    pytest.param(("database", "repeatable read"), id="database-repeatable-read"),
    pytest.param(("database", "serializable"), id="database-serializable"),
    pytest.param(("engine", "SERIALIZABLE"), id="engine-serializable"),
]
PATHS = ["fast", "distributed", "watched"]
ONE: dict[str, Any] = {"pool_size": 1, "max_overflow": 0}


@pytest.fixture
async def strict_engine(
    request: pytest.FixtureRequest, fresh_migrated_pg_url: Callable[[], str], pg_base_url: str
) -> AsyncIterator[AsyncEngine]:
    """A migrated database whose default isolation (or whose engine's) is not READ COMMITTED."""
    where, level = request.param
    url = fresh_migrated_pg_url()
    if where == "database":
        set_pg_database(pg_base_url, url, "default_transaction_isolation", f"'{level}'")
        engine = create_async_engine(url, pool_size=TASKS)
    else:
        engine = create_async_engine(url, pool_size=TASKS, isolation_level=level)
    yield engine
    await engine.dispose()


def _store(engine: AsyncEngine, path: str, stack: ExitStack) -> SQLStore:
    if path == "watched":
        stack.enter_context(statements(engine))  # a listener: SQLAlchemy's execution layer
    return SQLStore(engine, distributed=path == "distributed")


@pytest.fixture
def path_store(strict_engine: AsyncEngine, request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    with ExitStack() as stack:
        yield _store(strict_engine, request.param, stack)


@pytest.mark.parametrize("strict_engine", LEVELS, indirect=True)
@pytest.mark.parametrize("path_store", PATHS, indirect=True)
async def test_concurrent_appends_to_one_session_all_land(path_store: SQLStore) -> None:
    """12 tasks append 8 events each to one session, each with a private, user: and app:
    key, reloading and retrying when another task's append made their copy stale: all 96
    events are stored, in distinct sequence numbers, with every key's last value."""
    manager = Manager(path_store, app_name="app")
    session = await manager.create("org", "alice")

    async def appender(task: int) -> None:
        for i in range(APPENDS):
            delta = {f"t{task}": i, f"user:t{task}": i, f"app:t{task}": i}
            while True:
                current = await manager.get("org", session.id)
                event = Event(author="user", content={"text": f"{task}-{i}"}, state_delta=delta)
                try:
                    await manager.append_event(current, event)
                    break
                except StaleSessionError:
                    continue

    await asyncio.gather(*(appender(t) for t in range(TASKS)))
    events = await manager.list_events("org", session.id)
    assert sorted(e.content["text"] for e in events) == sorted(  # type: ignore[index]
        f"{t}-{i}" for t in range(TASKS) for i in range(APPENDS)
    )
    assert sorted(e.seq for e in events) == list(range(1, TASKS * APPENDS + 1))
    stored = await manager.get("org", session.id)
    for task in range(TASKS):
        for key in (f"t{task}", f"user:t{task}", f"app:t{task}"):
            assert stored.state[key] == APPENDS - 1


@pytest.mark.parametrize("strict_engine", LEVELS, indirect=True)
@pytest.mark.parametrize("path_store", PATHS, indirect=True)
async def test_saves_from_one_version_have_one_winner_and_stale_losers(
    path_store: SQLStore,
) -> None:
    """8 tasks save the same version of a session: one wins, the 7 others get
    StaleSessionError (no serialization error), and the winner's value is what is stored."""
    manager = Manager(path_store, app_name="app")
    session = await manager.create("org", "alice", state={"k": -1})
    copies = [await manager.get("org", session.id) for _ in range(8)]
    for n, copy in enumerate(copies):
        copy.set("k", n)
        copy.set("user:k", n)

    outcomes = await asyncio.gather(*(manager.save(c) for c in copies), return_exceptions=True)
    winners = [n for n, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1
    assert len(losers) == 7
    assert all(isinstance(o, StaleSessionError) for o in losers), losers
    stored = await manager.get("org", session.id)
    assert stored.state["k"] == stored.state["user:k"] == winners[0]
    assert stored.version == 2


async def _known_level(engine: AsyncEngine) -> bool | None:
    """What the store found out about the engine's one pooled connection."""
    async with engine.connect() as conn:
        known: bool | None = conn.info.get(PG_READ_COMMITTED)
        return known


async def test_only_a_stricter_database_default_costs_a_transaction(
    fresh_pg_url: Callable[[], str], pg_base_url: str
) -> None:
    """The explicit READ COMMITTED transaction is only for connections that need it: at
    Postgres's default (whatever isolation the engine sets for SQLAlchemy's own
    transactions) a single-statement write is sent alone; under a stricter database
    default every operation is wrapped."""
    default_url, strict_url, uncommitted_url = fresh_pg_url(), fresh_pg_url(), fresh_pg_url()
    for url, level in ((strict_url, "serializable"), (uncommitted_url, "read uncommitted")):
        set_pg_database(pg_base_url, url, "default_transaction_isolation", f"'{level}'")
    engines = {
        "default": create_async_engine(default_url, **ONE),
        "engine-serializable": create_async_engine(
            default_url, isolation_level="SERIALIZABLE", **ONE
        ),
        "strict": create_async_engine(strict_url, **ONE),
        # Postgres runs READ UNCOMMITTED as READ COMMITTED: no wrapping needed there.
        "read-uncommitted": create_async_engine(uncommitted_url, **ONE),
    }
    try:
        for engine in engines.values():
            store = SQLStore(engine)
            await store.migrate()
            session = await Manager(store).create("org", "alice")
            assert (await store.get("org", session.id)).id == session.id
        assert await _known_level(engines["default"]) is True
        assert await _known_level(engines["engine-serializable"]) is True
        assert await _known_level(engines["strict"]) is False
        assert await _known_level(engines["read-uncommitted"]) is True
        # SQLAlchemy cannot set READ UNCOMMITTED back on a connection: its execution layer
        # and migrate() leave such a connection's level alone, and work.
        uncommitted = engines["read-uncommitted"]
        with statements(uncommitted):
            store = SQLStore(uncommitted)
            await store.migrate()
            session = await Manager(store).create("org", "bob")
            assert (await store.get("org", session.id)).id == session.id
    finally:
        for engine in engines.values():
            await engine.dispose()


@pytest.mark.parametrize("path", PATHS)
async def test_the_engine_keeps_its_own_isolation_level(
    fresh_pg_url: Callable[[], str], path: str
) -> None:
    """The store's READ COMMITTED is its own: after its operations on a connection, the
    application's transactions on that engine still run at the engine's level."""
    engine = create_async_engine(fresh_pg_url(), isolation_level="SERIALIZABLE", **ONE)
    try:
        with ExitStack() as stack:
            store = _store(engine, path, stack)
            await store.migrate()
            manager = Manager(store)
            session = await manager.create("org", "alice")
            await manager.append_event(session, Event(author="user", state_delta={"k": 1}))
            assert (await manager.get("org", session.id)).state == {"k": 1}
        async with engine.connect() as conn:
            level = (await conn.exec_driver_sql("SHOW transaction_isolation")).scalar()
        assert level == "serializable"
    finally:
        await engine.dispose()


@pytest.mark.parametrize("write", list(WRITES))
async def test_cancel_at_every_await_under_a_stricter_default(
    fresh_pg_url: Callable[[], str], pg_base_url: str, write: str
) -> None:
    """On a database whose default is SERIALIZABLE, where single statements get an explicit
    READ COMMITTED transaction (and a fresh connection asks for the default first), each
    write cancelled at its 1st, 2nd, 3rd... suspension is whole or absent, and leaves no
    transaction open (the sweep of ``tests/reliability/test_cancellation.py``)."""
    url = fresh_pg_url()
    set_pg_database(pg_base_url, url, "default_transaction_isolation", "'serializable'")
    independent = create_async_engine(url, poolclass=NullPool)
    store_engine = pooled(url, 1)
    try:
        await SQLStore(independent).migrate()
        async with raw_pg(url) as admin:
            sweep = Sweep(
                "postgres",
                url,
                store_engine,
                independent,
                Checker("postgres", url, independent, admin),
            )
            await sweep.sweep(write, lambda op, n: attempt(op, {n}), "cancelled at suspension")
            assert sweep.cancelled >= 1
    finally:
        await store_engine.dispose()
        await independent.dispose()
