"""Returning connections to the pool: what the pool is configured to do on check-in runs,
whatever it is, and a default pool takes its connections back without a greenlet.

The runner checks a connection in directly when nothing in the check-in can reach the
driver, and through a greenlet otherwise (pool listeners, commit-on-return, an overflow
connection that the pool closes). A listener or reset that talks to the database outside a
greenlet would fail (SQLAlchemy's MissingGreenlet), and the pool would throw the connection
away: these tests see that as a new connection being opened.
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from greenlet import getcurrent
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from durable_sessions import Event, Session, SessionNotFoundError, SQLStore
from durable_sessions.sql import _private, runner
from support.sql import STORE_SQL_BACKENDS, run_through_dbapi

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)


@pytest.fixture
async def make_engine(backend: str, backend_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Engines on the backend's migrated database, each with a queue pool built with the
    options given, and the list of the connections its pool opens."""
    made: list[AsyncEngine] = []

    async def make(**options: Any) -> tuple[AsyncEngine, list[object]]:
        # A queue pool, as SQLAlchemy 2.1 picks for both (2.0 gives a SQLite file a NullPool,
        # which opens and closes a connection each time: nothing is returned to a pool).
        engine = create_async_engine(backend_url, **{"poolclass": AsyncAdaptedQueuePool, **options})
        made.append(engine)
        opened = count_connects(engine)
        if backend == "sqlite" and len(made) == 1:
            await SQLStore(engine).migrate()
        return engine, opened

    yield make
    for engine in made:
        await engine.dispose()


def count_connects(engine: AsyncEngine) -> list[object]:
    """Every new DBAPI connection the engine's pool opens."""
    opened: list[object] = []
    event.listen(engine.sync_engine.pool, "connect", lambda conn, rec: opened.append(conn))
    return opened


def select_one(dbapi_connection: Any) -> int:
    """A round trip on the driver from inside a pool event (awaits the driver)."""
    (value,) = run_through_dbapi(dbapi_connection, "SELECT 1")
    return int(value)


async def every_kind_of_operation(store: SQLStore) -> None:
    """A create, a write, reads and a delete: each checks a connection out and in."""
    sid = f"pool-{uuid.uuid4().hex}"
    await store.create(Session(org_id="o", id=sid, app_name="a", user_id="u", state={"k": 1}))
    await store.append_event("o", sid, Event(author="user", content={"text": "hi"}))
    got = await store.get("o", sid)
    assert got.message_count == 1
    assert [e.content for e in await store.list_events("o", sid)] == [{"text": "hi"}]
    await store.delete("o", sid)


@pytest.mark.parametrize("listener", ["reset", "checkin"])
async def test_pool_listeners_that_talk_to_the_database_run_on_every_return(
    make_engine: Callable[..., Any], listener: str
) -> None:
    engine, opened = await make_engine()
    answers: list[int] = []
    if listener == "reset":
        event.listen(
            engine.sync_engine.pool,
            "reset",
            lambda conn, rec, state: answers.append(select_one(conn)),
        )
    else:
        event.listen(
            engine.sync_engine.pool, "checkin", lambda conn, rec: answers.append(select_one(conn))
        )
    store = SQLStore(engine)
    await every_kind_of_operation(store)
    await every_kind_of_operation(store)
    assert len(answers) >= 10
    assert set(answers) == {1}
    assert len(opened) == 1  # and the connection was kept, never thrown away
    assert engine.sync_engine.pool.checkedout() == 0


async def test_a_pool_that_commits_on_return_keeps_its_connection(
    make_engine: Callable[..., Any],
) -> None:
    engine, opened = await make_engine(pool_reset_on_return="commit")
    store = SQLStore(engine)
    await every_kind_of_operation(store)
    await every_kind_of_operation(store)
    assert len(opened) == 1
    assert engine.sync_engine.pool.checkedout() == 0


async def test_overflow_connections_are_closed_on_return_and_the_pool_goes_on(
    make_engine: Callable[..., Any],
) -> None:
    engine, opened = await make_engine(pool_size=1, max_overflow=7)
    closed: list[object] = []
    event.listen(engine.sync_engine.pool, "close", lambda conn, rec: closed.append(conn))
    store = SQLStore(engine)
    sid = f"pool-{uuid.uuid4().hex}"
    await store.create(Session(org_id="o", id=sid, app_name="a", user_id="u"))
    gate = asyncio.Event()

    async def read_while_others_do() -> None:
        await gate.wait()
        for _ in range(5):
            assert (await store.get("o", sid)).id == sid

    readers = [asyncio.create_task(read_while_others_do()) for _ in range(8)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*readers)
    pool = engine.sync_engine.pool
    assert pool.checkedout() == 0
    assert pool.checkedin() <= 1  # every connection beyond the pool's size was closed
    assert len(closed) == len(opened) - pool.checkedin()
    await every_kind_of_operation(store)  # and the pool goes on serving


async def test_a_queue_pool_takes_connections_back_without_a_greenlet(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, opened = await make_engine()
    spawned = record_spawns(monkeypatch)
    store = SQLStore(engine)
    await every_kind_of_operation(store)
    assert "checkin_reset" not in spawned
    assert engine.sync_engine.pool.checkedout() == 0
    assert len(opened) == 1


async def test_checkouts_run_in_one_kept_greenlet_with_the_callers_context(
    make_engine: Callable[..., Any],
) -> None:
    """The pool's checkout runs in a greenlet kept from the last operation (not a new one
    each time), and a checkout listener (tracing, say) sees the calling task's context."""
    engine, _ = await make_engine()
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen: list[tuple[Any, str]] = []

    def on_checkout(*_: Any) -> None:
        seen.append((getcurrent(), request_id.get("unset")))

    event.listen(engine.sync_engine.pool, "checkout", on_checkout)
    store = SQLStore(engine)

    async def operation(name: str) -> None:
        request_id.set(name)
        await store.create(Session(id=name, org_id="o", user_id="u"))
        await store.get("o", name)

    await operation("warm")  # on Postgres the first operation also asks for the mode
    seen.clear()
    for name in ("first", "second", "third"):
        await asyncio.create_task(operation(name))
    assert [context for _, context in seen] == ["first"] * 2 + ["second"] * 2 + ["third"] * 2
    greenlets = {id(g) for g, _ in seen}
    assert len(greenlets) == 1  # one greenlet served all six checkouts
    assert seen[0][0] is not getcurrent()


@pytest.mark.parametrize("listener", ["checkout", "reset", "checkin"])
async def test_a_transaction_a_pool_listener_leaves_open_loses_no_write(
    make_engine: Callable[..., Any], listener: str
) -> None:
    """A listener that writes through the DBAPI connection leaves a transaction open on the
    pooled connection (the driver begins one and nothing ends it). Every operation's write
    still commits, and so does the listener's own work, as SQLAlchemy's own connections
    would commit it with their first transaction."""
    engine, _ = await make_engine()
    table = f"listener_log_{uuid.uuid4().hex[:8]}"
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"CREATE TABLE {table} (n INTEGER)")
    written: list[int] = []

    def log(dbapi_connection: Any, *_: Any) -> None:
        run_through_dbapi(dbapi_connection, f"INSERT INTO {table} (n) VALUES (1)")
        written.append(1)

    event.listen(engine.sync_engine.pool, listener, log)
    store = SQLStore(engine)
    sids = [f"pool-{uuid.uuid4().hex}" for _ in range(3)]
    for sid in sids:
        await store.create(Session(org_id="o", id=sid, app_name="a", user_id="u"))
        await store.append_event("o", sid, Event(author="user", content={"text": sid}))
    await store.delete("o", sids[0])
    await store.get("o", sids[1])  # a read last: its connection goes back with the listener's
    event.remove(engine.sync_engine.pool, listener, log)
    await store.get("o", sids[1])  # and the next use commits it

    observer, _ = await make_engine()
    seen = SQLStore(observer)
    for sid in sids[1:]:
        got = await seen.get("o", sid)
        assert got.message_count == 1
        assert [e.content for e in await seen.list_events("o", sid)] == [{"text": sid}]
    with pytest.raises(SessionNotFoundError):
        await seen.get("o", sids[0])
    async with observer.connect() as conn:
        committed = (await conn.exec_driver_sql(f"SELECT count(*) FROM {table}")).scalar_one()
    assert written
    assert committed == len(written)
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"DROP TABLE {table}")


def record_spawns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of what the runner runs in a greenlet from now on."""
    spawned: list[str] = []
    real_spawn = runner.greenlet_spawn

    def recording_spawn(fn: Callable[..., Any], *args: Any) -> Any:
        spawned.append(getattr(fn, "__name__", repr(fn)))
        return real_spawn(fn, *args)

    monkeypatch.setattr(runner, "greenlet_spawn", recording_spawn)
    return spawned


async def test_an_idle_pooled_connection_is_lent_without_a_greenlet(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once open (and, on SQLite, its pragmas set), a connection goes out of the pool in a
    plain call: the pool's own checkout, with nothing of the driver to await."""
    engine, opened = await make_engine()
    store = SQLStore(engine)
    await every_kind_of_operation(store)  # opens the connection, sets its pragmas
    spawned = record_spawns(monkeypatch)
    await every_kind_of_operation(store)
    assert "connect" not in spawned
    assert len(opened) == 1
    assert engine.sync_engine.pool.checkedout() == 0


@pytest.mark.parametrize("case", ["pre_ping", "recycle", "listener", "invalidated", "pool"])
async def test_a_checkout_that_may_reach_the_driver_goes_through_a_greenlet(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Whatever may make the pool talk to the driver on checkout (a pre-ping, a recycle
    age, a checkout listener of the user's, a connection invalidated alone or with the
    whole pool) sends the checkout through a greenlet, where it works as SQLAlchemy
    means it to: every operation succeeds and a dropped connection is replaced."""
    options = {"pre_ping": {"pool_pre_ping": True}, "recycle": {"pool_recycle": 3600}}
    engine, opened = await make_engine(**options.get(case, {}))
    pings: list[int] = []
    if case == "listener":
        event.listen(
            engine.sync_engine.pool, "checkout", lambda conn, *_: pings.append(select_one(conn))
        )
    store = SQLStore(engine)
    await every_kind_of_operation(store)
    if case in ("invalidated", "pool"):
        async with engine.connect() as conn:
            if case == "invalidated":
                await conn.invalidate()
            else:
                _private.invalidate_pool(engine.sync_engine.pool, conn.sync_connection, Exception())
    spawned = record_spawns(monkeypatch)
    await every_kind_of_operation(store)
    assert "connect" in spawned
    if case == "listener":
        assert set(pings) == {1}
    if case in ("invalidated", "pool"):
        assert len(opened) == 2  # the dropped connection was replaced, in a greenlet
    assert engine.sync_engine.pool.checkedout() == 0


async def burst(store: SQLStore, sid: str, tasks: int) -> None:
    """``tasks`` reads at once: each holds a connection of its own over its await."""
    await asyncio.gather(*(store.get("o", sid) for _ in range(tasks)))


def record_checkins(engine: AsyncEngine) -> list[int]:
    """The connections returned to the engine's pool from now on, in order (by identity)."""
    returned: list[int] = []
    event.listen(engine.sync_engine.pool, "checkin", lambda conn, rec: returned.append(id(conn)))
    return returned


async def reads_after_a_burst(make_engine: Callable[..., Any], **options: Any) -> list[int]:
    """After a burst of 4 reads has opened 4 connections, 12 reads one after another: every
    connection returned, the burst's 4 first, in the order the pool got them back."""
    engine, opened = await make_engine(pool_size=4, **options)
    store = SQLStore(engine)
    sid = f"pool-{uuid.uuid4().hex}"
    await store.create(Session(org_id="o", id=sid, app_name="a", user_id="u"))
    if len(opened) > 1:  # start from an empty pool: only the burst's connections in it
        await engine.dispose()
    returned = record_checkins(engine)
    await burst(store, sid, 4)
    assert len(set(returned)) == 4
    for _ in range(12):
        await store.get("o", sid)
    assert engine.sync_engine.pool.checkedin() == 4
    return returned


@pytest.mark.parametrize("options", [{}, {"pool_pre_ping": True}], ids=["plain", "pre_ping"])
async def test_a_fifo_pool_lends_its_connections_in_its_own_order(
    make_engine: Callable[..., Any], options: dict[str, Any]
) -> None:
    """SQLAlchemy's default pool (FIFO) lends the connection idle longest: the store keeps
    to that order (it never reorders the pool's queue), whether it takes a connection in
    plain calls or, with a pre-ping, through the pool's checkout in a greenlet. One task
    reading after a burst thus goes round every connection the burst left."""
    returned = await reads_after_a_burst(make_engine, **options)
    first = returned[:4]
    assert returned[4:] == first * 3


@pytest.mark.parametrize("options", [{}, {"pool_pre_ping": True}], ids=["plain", "pre_ping"])
async def test_with_pool_use_lifo_one_task_keeps_to_one_connection(
    make_engine: Callable[..., Any], options: dict[str, Any]
) -> None:
    """A LIFO pool (``pool_use_lifo=True``, the documented way to keep one warm connection)
    lends the connection returned last: one task reading after a burst keeps to the one it
    returned, and the others stay open and idle in the pool."""
    returned = await reads_after_a_burst(make_engine, pool_use_lifo=True, **options)
    assert set(returned[4:]) == {returned[3]}
