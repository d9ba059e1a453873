"""Erasure and purge under concurrent writers, on SQLite, Postgres and MySQL: nothing is skipped.

``delete_user`` and ``purge`` run while tasks append to and touch the very sessions being
deleted, and while another connection holds one of them locked in an open transaction.
They wait for those writers (within the store's ``lock_timeout``) instead of leaving their
rows behind, and either finish or raise ``DeletionIncompleteError`` saying what is left.
What remains is counted afterwards through a connection of its own, not through the store.

In the figures, ``expected`` is the rows that must be gone (sessions, events and ``user:``
state rows) and ``found`` how many of them are gone; ``errors`` counts the writers'
operations refused with ``SessionNotFoundError`` once their session was erased.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    DeletionIncompleteError,
    Event,
    InvalidArgumentError,
    Manager,
    SessionNotFoundError,
    SQLStore,
    StoreUnavailableError,
)
from durable_sessions.model import utcnow
from durable_sessions.sql import statements as sql_statements
from reliability.figures import Figures
from support.sql import MYSQL, PG_DISTRIBUTED, SQL_BACKENDS, raw_mysql, raw_pg

pytestmark = pytest.mark.parametrize("backend", [*SQL_BACKENDS, PG_DISTRIBUTED, MYSQL])

ORG = "org"
WRITERS = 6
SESSIONS = 24
BATCH = 5  # several batches per run, each in a transaction of its own
HOLD = 0.5  # seconds the other connection keeps its session locked


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_statements, "BATCH", BATCH)


# -- counting through a connection of its own --------------------------------------------------


@dataclass
class Counts:
    """Rows of some sessions, and of one user's ``user:`` state, in the database."""

    sessions: int
    events: int
    user_state: int

    @property
    def total(self) -> int:
        return self.sessions + self.events + self.user_state


async def count_rows(url: str, session_ids: list[str], user_id: str | None) -> Counts:
    """Count with a new engine: no connection of the store under test is involved."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:

            async def one(sql: str, **params: object) -> int:
                return int((await conn.execute(text(sql), params)).scalar_one())

            ids = list(session_ids)
            sessions = events = 0
            for start in range(0, len(ids), 100):
                chunk = {f"i{n}": sid for n, sid in enumerate(ids[start : start + 100])}
                marks = ", ".join(f":{name}" for name in chunk)
                sessions += await one(
                    f"SELECT count(*) FROM ds_sessions WHERE org_id = :o AND id IN ({marks})",
                    o=ORG,
                    **chunk,
                )
                events += await one(
                    f"SELECT count(*) FROM ds_events WHERE org_id = :o AND session_id IN ({marks})",
                    o=ORG,
                    **chunk,
                )
            user_state = 0
            if user_id is not None:
                user_state = await one(
                    "SELECT count(*) FROM ds_user_state WHERE org_id = :o AND user_id = :u",
                    o=ORG,
                    u=user_id,
                )
            return Counts(sessions, events, user_state)
    finally:
        await engine.dispose()


async def user_session_ids(url: str, user_id: str) -> list[str]:
    """Every session id of a user in ORG, read through a connection of its own."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT id FROM ds_sessions WHERE org_id = :o AND user_id = :u"),
                {"o": ORG, "u": user_id},
            )
            return [row.id for row in rows]
    finally:
        await engine.dispose()


async def age(engine: AsyncEngine, session_ids: list[str], days: int) -> None:
    """Make sessions look as if they were last updated ``days`` ago."""
    stamp = as_stored(engine.dialect.name, utcnow() - timedelta(days=days))
    async with engine.begin() as conn:
        for sid in session_ids:
            await conn.execute(
                text("UPDATE ds_sessions SET updated_at = :t WHERE org_id = :o AND id = :i"),
                {"t": stamp, "o": ORG, "i": sid},
            )


def as_stored(dialect: str, moment: datetime) -> datetime:
    """A UTC time as a plain statement binds it: without its zone where the column has none
    (SQLite's text, MySQL's ``DATETIME``)."""
    return moment if dialect == "postgresql" else moment.replace(tzinfo=None)


# -- writers -----------------------------------------------------------------------------------


@dataclass
class Writers:
    """Tasks appending to and touching sessions until every one of them is gone."""

    store: SQLStore
    session_ids: list[str]
    ops: int = 0
    gone: int = 0
    appended: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, n: int) -> None:
        mine = list(self.session_ids)
        i = 0
        while mine and not self.stop.is_set():
            sid = mine[i % len(mine)]
            i += 1
            self.ops += 1
            try:
                if i % 2:
                    delta = {f"user:w{n}": i, "p": i, "app:a": n}
                    await self.store.append_event(ORG, sid, Event("w", state_delta=delta))
                    self.appended += 1
                else:
                    await self.store.touch(ORG, sid, messages=1, tokens=1)
            except SessionNotFoundError:
                self.gone += 1
                mine.remove(sid)
            if i >= 3:
                self.started.set()
            await asyncio.sleep(0)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(self.run(n)) for n in range(WRITERS)]
        try:
            await asyncio.wait_for(self.started.wait(), 30)
            yield
        finally:
            self.stop.set()
            await asyncio.gather(*tasks)


# -- another connection holding a session locked -----------------------------------------------


@contextlib.asynccontextmanager
async def held(backend: str, url: str, session_id: str, hold: float) -> AsyncIterator[None]:
    """Another connection updates ``session_id`` in a transaction it keeps open ``hold`` s.

    On Postgres and MySQL it holds that row's lock; on SQLite, the database's write lock.
    The block runs once the lock is taken; the transaction commits ``hold`` seconds after that.
    """
    taken = asyncio.Event()
    sql = "UPDATE ds_sessions SET version = version WHERE org_id = {o} AND id = {i}"

    async def hold_pg() -> None:
        async with raw_pg(url) as conn, conn.transaction():
            await conn.execute(sql.format(o="$1", i="$2"), ORG, session_id)
            taken.set()
            await asyncio.sleep(hold)

    async def hold_mysql() -> None:
        async with raw_mysql(url) as conn, conn.cursor() as cursor:
            await conn.begin()
            await cursor.execute(sql.format(o="%s", i="%s"), (ORG, session_id))
            taken.set()
            await asyncio.sleep(hold)
            await conn.commit()

    def hold_sqlite(loop: asyncio.AbstractEventLoop) -> None:
        db = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(sql.format(o="?", i="?"), (ORG, session_id))
            loop.call_soon_threadsafe(taken.set)
            time.sleep(hold)
            db.execute("COMMIT")
        finally:
            db.close()

    if backend == "mysql":
        holder = asyncio.create_task(hold_mysql())
    elif backend != "sqlite":
        holder = asyncio.create_task(hold_pg())
    else:
        holder = asyncio.create_task(asyncio.to_thread(hold_sqlite, asyncio.get_running_loop()))
    await asyncio.wait_for(taken.wait(), 10)
    try:
        yield
    finally:
        await holder


# -- seeding -----------------------------------------------------------------------------------


async def seed_user(manager: Manager, user_id: str, count: int) -> list[str]:
    """Sessions of a user in two apps, each with two events and ``user:`` keys."""
    ids = []
    for n in range(count):
        apps = Manager(manager.store, app_name=f"app{n % 2}")
        session = await apps.create(ORG, user_id, state={f"user:k{n}": n, "p": n})
        await manager.store.append_event(ORG, session.id, Event("u", content="hi"))
        await manager.store.append_event(
            ORG, session.id, Event("a", content="yo", state_delta={"user:seen": n})
        )
        ids.append(session.id)
    return ids


@pytest.fixture
def url(backend_url: str, engine: AsyncEngine) -> str:
    """The database of the test's (migrated, emptied) engine."""
    return backend_url


# -- delete_user -------------------------------------------------------------------------------


async def test_delete_user_waits_for_concurrent_writers_and_leaves_nothing(
    engine: AsyncEngine, url: str, backend: str, figures: Figures
) -> None:
    """6 tasks append to and touch the user's sessions while delete_user runs, and another
    connection holds one of them locked; every session, event and user: row goes."""
    store = SQLStore(engine)
    manager = Manager(store)
    doomed = await seed_user(manager, "alice", SESSIONS)
    kept = await seed_user(manager, "bob", 3)
    before_bob = await count_rows(url, kept, "bob")
    writers = Writers(store, doomed)
    async with writers.running():
        at_start = await count_rows(url, doomed, "alice")
        async with held(backend, url, doomed[-1], HOLD):
            deleted = await store.delete_user(ORG, "alice")
    assert deleted == SESSIONS
    after = await count_rows(url, doomed, "alice")
    # Rows that must be gone: those at the start, and the events appended meanwhile.
    expected = at_start.total + writers.appended
    figures.record(
        "erasure: delete_user under writers",
        backend,
        operations=writers.ops + 1,
        expected=expected,
        found=expected - after.total,
        errors=writers.gone,
    )
    assert after == Counts(0, 0, 0)
    assert await user_session_ids(url, "alice") == []
    assert await count_rows(url, kept, "bob") == before_bob


async def test_delete_user_erases_forks_made_while_it_runs(
    engine: AsyncEngine, url: str, backend: str, figures: Figures
) -> None:
    """Sessions of the user forked while the erasure runs are erased too: it loops until a
    pass finds none of the user's sessions left."""
    store = SQLStore(engine)
    doomed = await seed_user(Manager(store), "alice", SESSIONS)
    forks: list[str] = []
    stop = asyncio.Event()
    started = asyncio.Event()
    ops = refused = 0

    async def forker() -> None:
        nonlocal ops, refused
        parents = list(doomed)
        i = 0
        while parents and not stop.is_set():
            parent = parents[i % len(parents)]
            i += 1
            ops += 1
            try:
                forks.append((await store.fork(ORG, parent, with_events=True)).id)
            except SessionNotFoundError:
                refused += 1
                parents.remove(parent)
            started.set()
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(forker()) for _ in range(3)]
    try:
        await asyncio.wait_for(started.wait(), 30)
        deleted = await store.delete_user(ORG, "alice")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    everything = doomed + forks
    after = await count_rows(url, everything, "alice")
    # A fork that commits after the last pass is a session created after the erasure:
    # none may be an original, and none may have lost its own transcript to the erasure.
    survivors = await user_session_ids(url, "alice")
    assert not set(survivors) & set(doomed)
    assert deleted + len(survivors) == len(everything)
    figures.record(
        "erasure: delete_user while forks are made",
        backend,
        operations=ops + 1,
        expected=len(everything),
        found=deleted + len(survivors),
        errors=refused,
    )
    assert after.sessions == len(survivors)
    assert after.user_state == 0 or survivors


@pytest.mark.parametrize("operation", ["delete_user", "purge"])
async def test_erasure_gives_up_with_a_typed_error_saying_what_is_left(
    engine: AsyncEngine, url: str, backend: str, operation: str, figures: Figures
) -> None:
    """A writer holding a session longer than the store waits: a typed error, not a skip
    (and not the database's own, longer, lock wait); what was deleted stays deleted, and
    running it again finishes the erasure."""
    doomed = await seed_user(Manager(SQLStore(engine)), "alice", SESSIONS)
    await age(engine, doomed, days=3)  # every one of them doomed by the purge too
    if backend != "sqlite":
        error: type[Exception] = DeletionIncompleteError
    else:  # the whole database is locked: SQLite's busy timeout is the bound
        error = StoreUnavailableError

    async def erase(store: SQLStore) -> int:
        if operation == "purge":
            return await store.purge(ORG, older_than=timedelta(days=1))
        return await store.delete_user(ORG, "alice")

    impatient = create_async_engine(url)  # new connections, so busy_timeout applies
    try:
        store = SQLStore(impatient, lock_timeout=0.3, busy_timeout=0.3)
        async with held(backend, url, doomed[-1], 2.0):
            with pytest.raises(error) as caught:
                await erase(store)
    finally:
        await impatient.dispose()
    user = "alice" if operation == "delete_user" else None  # purge leaves user: state
    left = await count_rows(url, doomed, user)
    if isinstance(caught.value, DeletionIncompleteError):
        assert caught.value.remaining == left.sessions >= 1
        assert caught.value.deleted == SESSIONS - left.sessions
        assert f"{left.sessions} matching sessions are left" in str(caught.value)
    assert left.sessions >= 1
    again = await erase(SQLStore(engine))
    assert again == left.sessions
    after = await count_rows(url, doomed, user)
    figures.record(
        f"{operation}: held past lock_timeout, typed error",
        backend,
        operations=2,
        expected=left.total,
        found=left.total - after.total,
        errors=1,
    )
    assert after == Counts(0, 0, 0)


# -- purge -------------------------------------------------------------------------------------


async def test_purge_waits_for_concurrent_writers_and_leaves_nothing_old(
    engine: AsyncEngine, url: str, backend: str, figures: Figures
) -> None:
    """Writers touch and append to old and new sessions while purge runs, and another
    connection holds an old one locked without touching its age: no session last updated
    before the cutoff survives, and no event of a purged session."""
    store = SQLStore(engine)
    manager = Manager(store)
    old = await seed_user(manager, "alice", SESSIONS)
    fresh = await seed_user(manager, "bob", 4)
    await age(engine, old, days=3)
    held_id = old[-1]
    # Writers on half the old sessions (each write makes its session new again) and on
    # the fresh ones; the held one and the rest are left alone, so they must go.
    writers = Writers(store, old[: SESSIONS // 2] + fresh)
    async with writers.running(), held(backend, url, held_id, HOLD):
        cutoff = utcnow() - timedelta(days=1)
        purged = await store.purge(ORG, older_than=timedelta(days=1))
    engine_check = create_async_engine(url)
    try:
        async with engine_check.connect() as conn:
            stale = (
                await conn.execute(
                    text("SELECT id FROM ds_sessions WHERE org_id = :o AND updated_at < :t"),
                    {"o": ORG, "t": as_stored(engine.dialect.name, cutoff)},
                )
            ).all()
            orphans = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM ds_events e WHERE NOT EXISTS (SELECT 1 FROM "
                        "ds_sessions s WHERE s.org_id = e.org_id AND s.id = e.session_id)"
                    )
                )
            ).scalar_one()
    finally:
        await engine_check.dispose()
    untouched = old[SESSIONS // 2 :]
    left = await count_rows(url, untouched, None)
    expected_gone = len(untouched) * 3  # each untouched old session: itself and 2 events
    figures.record(
        "retention: purge under writers",
        backend,
        operations=writers.ops + 1,
        expected=expected_gone,
        found=expected_gone - left.total,
        errors=writers.gone,
    )
    assert stale == []
    assert orphans == 0
    assert left == Counts(0, 0, 0)
    assert purged >= len(untouched)
    assert (await count_rows(url, fresh, None)).sessions == len(fresh)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "30"])
async def test_lock_timeout_must_be_a_positive_number_of_seconds(
    engine: AsyncEngine, backend: str, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError, match="lock_timeout must be a positive number"):
        SQLStore(engine, lock_timeout=bad)  # type: ignore[arg-type]
