"""Cancellation at every await point: nothing half-written, nothing left open, nothing lost.

A write cancelled anywhere (while the pool hands out a connection, during BEGIN, any
statement, COMMIT, ROLLBACK or the check-in, or in aiosqlite's worker-thread hop) raises
``CancelledError`` to its caller; afterwards an independent connection sees the whole write
or none of it, no connection is left inside a transaction (Postgres: no backend ``idle in
transaction``; MySQL: no InnoDB transaction of the database's connections; SQLite: the
write lock is free), and the pooled connection commits the next write.

The cancellation points are not found by timing: each operation runs under a wrapper that
counts its task's suspensions (every ``await`` that yields to the event loop) and cancels
the task at the Nth, for N = 1, 2, 3, ... until the operation completes; a second sweep
makes the Nth call to the driver itself raise ``CancelledError``. Both sweeps run again over
an encrypted store (a keyring) for the writes that seal, whose extra suspensions (the
session's owner read, data keys fetched, made and unwrapped, the sealed fork, a user's keys
destroyed) must be as safe; after each attempt the stored data must still open. A storm of
tasks with random timeouts on a small pool then checks the same on every dialect under
contention.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import itertools
import logging
import os
import random
import re
import sqlite3
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import aiosqlite
import asyncmy.connection  # type: ignore[import-untyped]
import asyncpg  # type: ignore[import-untyped]
import pytest
import sqlalchemy
from sqlalchemy import insert, make_url, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, NullPool

import durable_sessions.crypto
import durable_sessions.sealing
from durable_sessions import (
    DecryptionError,
    Event,
    Session,
    SessionNotFoundError,
    SQLStore,
    StaleSessionError,
)
from durable_sessions.crypto import LocalKeyring
from durable_sessions.sealing import EVENT_PREFIX, PREFIX
from durable_sessions.sql.schema import keys, metadata, sessions
from reliability.figures import Figures
from reliability.helpers import reset_tables
from support.sql import MYSQL, SQL_BACKENDS, raw_mysql, raw_pg, run_through_dbapi

pytestmark = pytest.mark.parametrize("backend", [*SQL_BACKENDS, MYSQL])

ORG = "org"
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
LONG_AGO = datetime(2020, 1, 1, tzinfo=timezone.utc)
# Columns that differ between two runs of the same write: clocks and per-create random ids.
VOLATILE = {"created_at", "updated_at", "incarnation"}
MAX_POINTS = 400  # no write of these has this many suspensions: a sweep that gets there hangs
STEP_TIMEOUT = 30.0
MYSQL_SETTLE = 30.0
"""How long MariaDB may take to end the transaction of a connection the client closed."""


# -- cancelling at the Nth suspension, or at the Nth driver call ------------------------------


class Suspensions:
    """Run a coroutine, counting the times it suspends; cancel its task at chosen ones.

    The cancellation is the event loop's own: ``Task.cancel()`` is called while the task is
    about to suspend, so the future it awaits is cancelled and ``CancelledError`` is raised
    at that very ``await``, exactly as a timeout or ``task.cancel()`` from elsewhere would.
    """

    def __init__(self, cancel_at: Collection[int]) -> None:
        self.cancel_at = set(cancel_at)
        self.count = 0

    @types.coroutine
    def drive(self, coro: Awaitable[Any]) -> Generator[Any, Any, Any]:
        inner = coro.__await__()
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                yielded = inner.throw(throw) if throw is not None else inner.send(send)
            except StopIteration as stop:
                return stop.value
            self.count += 1
            if self.count in self.cancel_at:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
            try:
                send, throw = (yield yielded), None
            except BaseException as exc:  # delivered by the task: pass it on
                send, throw = None, exc


@dataclass
class DriverFault:
    """Make the Nth call (made by one task) to the driver's query methods raise
    ``CancelledError`` before it reaches the driver."""

    raise_at: int
    task: asyncio.Task[Any] | None = None
    calls: int = 0

    def install(self, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
        if backend == "postgres":
            cls: Any = asyncpg.connection.Connection
            names = ("execute", "fetch", "executemany")
        elif backend == "mysql":  # every statement, BEGIN, COMMIT and ROLLBACK
            cls = asyncmy.connection.Connection
            names = ("query", "begin", "commit", "rollback")
        else:
            cls = aiosqlite.Connection
            names = ("_execute",)
        for name in names:
            monkeypatch.setattr(cls, name, self._wrap(getattr(cls, name)))

    def _wrap(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if self.task is not None and asyncio.current_task() is self.task:
                self.calls += 1
                if self.calls == self.raise_at:
                    raise asyncio.CancelledError
            return await method(conn, *args, **kwargs)

        return wrapper


@dataclass
class Outcome:
    """How one attempt ended: cancelled (as the caller saw it), or completed."""

    cancelled: bool
    points: int  # suspensions (or driver calls) the operation went through
    error: BaseException | None = None


async def attempt(op: Callable[[], Awaitable[Any]], cancel_at: Collection[int]) -> Outcome:
    """Run ``op`` in a task of its own, cancelled at the given suspensions."""
    counter = Suspensions(cancel_at)

    async def main() -> Any:
        return await counter.drive(op())

    task = asyncio.create_task(main())
    done, _ = await asyncio.wait({task}, timeout=STEP_TIMEOUT)
    assert done, f"the operation hung after a cancellation at {sorted(cancel_at)}"
    if task.cancelled():
        return Outcome(True, counter.count)
    return Outcome(False, counter.count, task.exception())


async def attempt_driver_fault(
    op: Callable[[], Awaitable[Any]], n: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> Outcome:
    """Run ``op`` in a task of its own whose Nth driver call raises ``CancelledError``."""
    fault = DriverFault(n)
    with monkeypatch.context() as patch:
        fault.install(patch, backend)

        async def main() -> Any:
            return await op()

        task = asyncio.create_task(main())
        fault.task = task
        done, _ = await asyncio.wait({task}, timeout=STEP_TIMEOUT)
    assert done, f"the operation hung after its driver call {n} raised CancelledError"
    if task.cancelled():
        return Outcome(True, fault.calls)
    return Outcome(False, fault.calls, task.exception())


# -- what an independent connection sees ------------------------------------------------------

Snapshot = dict[str, list[tuple[Any, ...]]]


SEARCH_INDEX = "search index"
BLIND_INDEX = {
    "sqlite": "SELECT org_id, session_id, seq, search_terms FROM ds_events "
    "ORDER BY org_id, session_id, seq",
    "postgres": "SELECT org_id, session_id, seq, search_vector::text FROM ds_events "
    "ORDER BY org_id, session_id, seq",
    "mysql": "SELECT org_id, word, session_id, seq, n FROM ds_event_words "
    "ORDER BY org_id, word, session_id, seq",
}
"""What each dialect's search index holds of the events, outside the tables' metadata: an
encrypted store writes it (the blind index) itself, the sealed fork too."""


async def observe(
    independent: AsyncEngine, *, skip: Collection[str] = (), index: str | None = None
) -> Snapshot:
    """Every row of every table (volatile columns left out; sessions in ``skip`` too), and
    with ``index`` (a ``BLIND_INDEX`` query) the search index's rows."""
    out: Snapshot = {}
    async with independent.connect() as conn:
        if index is not None:
            out[SEARCH_INDEX] = [tuple(row) for row in await conn.exec_driver_sql(index)]
        for table in metadata.sorted_tables:
            keep = [c for c in table.columns if c.name not in VOLATILE]
            rows = await conn.execute(select(*keep).order_by(*table.primary_key.columns))
            found = []
            for row in rows:
                values = row._mapping
                if table.name == "ds_sessions" and values["id"] in skip:
                    continue
                found.append(tuple(values.values()))
            out[table.name] = found
    return out


def innodb_active_threads(status: str) -> set[int]:
    """The connection (thread) ids of the transactions ``SHOW ENGINE INNODB STATUS`` lists
    as active: a block per transaction, ``---TRANSACTION <id>, ACTIVE <n> sec`` (or ``not
    started``), naming its ``MariaDB thread id`` (``MySQL thread id`` on MySQL)."""
    found = set()
    for block in status.split("---TRANSACTION ")[1:]:
        head, _, rest = block.partition("\n")
        if ", ACTIVE" not in head:
            continue
        thread = re.search(r"(?:MariaDB|MySQL) thread id (\d+)", rest)
        assert thread is not None, f"an active transaction names no thread: {block[:300]!r}"
        found.add(int(thread.group(1)))
    return found


class Checker:
    """The checks after each attempt, on one backend."""

    def __init__(self, backend: str, url: str, independent: AsyncEngine, admin: Any) -> None:
        self.backend = backend
        self.url = url
        self.independent = independent
        self.admin = admin

    async def nothing_left_open(self, settle: float = MYSQL_SETTLE) -> None:
        """No connection of the database is left inside a transaction (on MySQL, after
        ``settle`` seconds)."""
        if self.backend == "postgres":
            stuck = await self.admin.fetch(
                "SELECT pid, state, query FROM pg_stat_activity WHERE datname = $1 "
                "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
                make_url(self.url).database,
            )
            assert not stuck, f"backends left inside a transaction: {stuck}"
            return
        if self.backend == "mysql":
            # A connection the runner terminated is closed by the client at once; the server
            # ends its transaction once its thread reads the closed socket: a moment later,
            # or seconds on a machine whose cores are all busy. A connection still idle
            # inside a transaction after MYSQL_SETTLE is one left open.
            deadline = time.monotonic() + settle
            while stuck := await self._mysql_idle_in_transaction():
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"connections left inside a transaction after {settle} s: {stuck}"
                    )
                await asyncio.sleep(0.01)
            return
        # An open write transaction would hold SQLite's write lock: take it, without waiting.
        db = sqlite3.connect(str(make_url(self.url).database), timeout=0)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.rollback()
        finally:
            db.close()

    async def _mysql_idle_in_transaction(self) -> list[int]:
        """The ids of the database's connections idle (between statements) inside a
        transaction, as Postgres's "idle in transaction".

        Read from ``SHOW ENGINE INNODB STATUS``, which lists the transactions as they are:
        ``information_schema.INNODB_TRX`` is a cache that InnoDB refreshes only when it has
        not been read for 100 ms, so polled more often (here, and by a second test worker
        on the same server) it keeps showing a transaction long after it ended.
        """
        async with self.admin.cursor() as cursor:
            await cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST "
                "WHERE DB = %s AND COMMAND = 'Sleep' AND ID <> CONNECTION_ID()",
                (make_url(self.url).database,),
            )
            sleeping = {int(row[0]) for row in await cursor.fetchall()}
            if not sleeping:
                return []
            await cursor.execute("SHOW ENGINE INNODB STATUS")
            status = (await cursor.fetchone())[2]
        return sorted(sleeping & innodb_active_threads(status))

    async def pool_commits(self, store: SQLStore, probe: str) -> None:
        """The store's pooled connection commits the next write, seen by another connection."""
        before = await self._probe_count(probe)
        await asyncio.wait_for(store.touch(ORG, probe, messages=1), STEP_TIMEOUT)
        assert await self._probe_count(probe) == before + 1, "an acknowledged write was lost"

    async def _probe_count(self, probe: str) -> int:
        async with self.independent.connect() as conn:
            found = await conn.execute(
                select(sessions.c.message_count).where(
                    sessions.c.org_id == ORG, sessions.c.id == probe
                )
            )
            return int(found.scalar_one())


# -- the write paths ----------------------------------------------------------------------------


def new_session(session_id: str, user: str = "alice", **state: Any) -> Session:
    return Session(id=session_id, org_id=ORG, user_id=user, app_name="app", state=dict(state))


def event(event_id: str, n: int, *, words: bool = False, **delta: Any) -> Event:
    content: dict[str, Any] = {"n": n}
    if words:  # text for the search index (encrypted: the blind index, keyed hashes of it)
        content["text"] = f"note {event_id} number {n}"
    return Event(
        "agent",
        content=content,
        state_delta=dict(delta),
        tokens=n,
        id=event_id,
        timestamp=T0 + timedelta(seconds=n),
    )


async def seed(store: SQLStore, engine: AsyncEngine) -> None:
    """alice: s1 (2 events), s2 (1 event), both not updated for years; bob: s3, recent.
    Encrypted, the events have words (a blind index)."""
    words = store.keyring is not None
    await store.create(new_session("s1", k=1, **{"user:u": 1, "app:a": 1}))
    await store.append_event(ORG, "s1", event("e1", 1, words=words, k=2))
    await store.append_event(ORG, "s1", event("e2", 2, words=words, **{"user:u": 2}))
    await store.create(new_session("s2", k=1))
    await store.append_event(ORG, "s2", event("e3", 3, words=words))
    await store.create(new_session("s3", user="bob"))
    await store.create(new_session("probe", user="bob"))
    async with engine.begin() as conn:
        await conn.execute(
            update(sessions).where(sessions.c.id.in_(["s1", "s2"])).values(updated_at=LONG_AGO)
        )


Op = Callable[[SQLStore], Awaitable[Callable[[], Awaitable[Any]]]]
"""Prepares a write on a store (uncancelled, e.g. the read before a save) and returns it."""


async def _create(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.create(new_session("new", k=5, **{"user:n": 5, "app:n": 5}))


async def _create_new_owner(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    # Encrypted: a user and an app with no data key yet, so the create makes both (each
    # wrapped by the keyring and stored in ds_keys, in a transaction of its own) first.
    made = Session(
        id="new", org_id=ORG, user_id="carol", app_name="other",
        state={"k": 5, "user:n": 5, "app:n": 5},
    )  # fmt: skip
    return lambda: store.create(made)


async def _save(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    # Encrypted: read through another store, so that the save's own (the one swept) reads
    # the session's owner and fetches and unwraps its data keys itself.
    reader = store if store.keyring is None else SQLStore(store.engine, keyring=store.keyring)
    session = await reader.get(ORG, "s1")
    session.title = "saved"
    session.set("k", 9)
    session.set("user:u", 9)
    session.set("app:a", 9)
    return lambda: store.update(session)


async def _append(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    words = store.keyring is not None
    return lambda: store.append_event(
        ORG, "s1", event("e-new", 7, words=words, k=7, **{"user:u": 7, "app:x": 7})
    )


async def _append_private(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    # No shared key: on Postgres a statement of its own shape (no shared-state CTEs).
    return lambda: store.append_event(ORG, "s1", event("e-private", 7, k=7))


async def _append_events_private(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    batch = [event("p1", 8, k=8), event("p2", 9)]
    return lambda: store.append_events(ORG, "s1", batch)


async def _touch(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.touch(ORG, "s1", messages=3, tokens=4, title="touched")


async def _fork(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.fork(ORG, "s1", new_session_id="child", with_events=True)


async def _delete(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.delete(ORG, "s1")


async def _purge(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.purge(ORG, older_than=timedelta(days=30))


async def _delete_user(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.delete_user(ORG, "alice")


async def _append_events(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    words = store.keyring is not None
    batch = [
        event("b1", 8, words=words, k=8),
        event("b2", 9, words=words, **{"user:u": 9, "app:b": 9}),
    ]
    return lambda: store.append_events(ORG, "s1", batch)


async def _truncate(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.truncate_events(ORG, "s1", after_seq=1)


async def _truncate_in_steps(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    # Postgres's truncation for removed events past 1 GB (truncate_events' fallback: the
    # session row locked, DELETE ... RETURNING, the counters, in one transaction), run
    # directly: reaching it through truncate_events takes a transcript of over 1 GB.
    # SQLite's truncation is these steps already.
    async def run() -> Any:
        await store._ready("truncate_events")
        params = {
            "k_org": ORG, "k_id": "s1", "k_after_seq": 1, "v_now": datetime.now(timezone.utc),
            "v_expected": None, "v_incarnation": None,
        }  # fmt: skip
        job = store._programs.truncate_rows(params)
        if job is None:
            return await store.truncate_events(ORG, "s1", after_seq=1)
        return await store._run(job, "truncate_events")

    return run


async def _pop(store: SQLStore) -> Callable[[], Awaitable[Any]]:
    return lambda: store.pop_event(ORG, "s1")


WRITES: dict[str, Op] = {
    "create": _create,
    "save": _save,
    "append_event": _append,
    "append_events": _append_events,
    "append_private": _append_private,
    "append_events_private": _append_events_private,
    "truncate_events": _truncate,
    "truncate_events_in_steps": _truncate_in_steps,
    "pop_event": _pop,
    "touch": _touch,
    "fork": _fork,
    "delete": _delete,
    "purge": _purge,
    "delete_user": _delete_user,
    "create_new_owner": _create_new_owner,
}
PLAIN_WRITES = [name for name in WRITES if name != "create_new_owner"]
"""The writes swept over a plain store (a new owner is nothing new without a keyring)."""
ENCRYPTED_WRITES = [
    "create", "save", "append_event", "append_events", "touch", "fork", "truncate_events",
    "delete_user", "create_new_owner",
]  # fmt: skip
"""The writes swept over an encrypted store: each seals (touch: the title; fork: the child's
state, title and events, opened and sealed again), destroys keys (delete_user) or makes them
(create_new_owner)."""
# delete_user deletes sessions (in batches, each a transaction), then the user's state,
# then the user's long-term memories: each step's tables may be seen done before the next.
BETWEEN = {
    "delete_user": [
        ("ds_sessions", "ds_events"),
        ("ds_sessions", "ds_events", "ds_user_state", "ds_app_state"),
    ]
}
# Encrypted: a write whose owner has no data key makes it first, and stores it (wrapped) in a
# transaction of its own: ds_keys may hold any of the new keys without the write.
MAKES_KEYS = {"create_new_owner"}


class SeededSecrets:
    """``secrets`` for the library's sealing and keyring modules in an encrypted sweep: the
    same bytes again after each ``restart``, so that a data key a write makes (its id, its
    material, its wrapping, its scope's secret in the keyring) is the same in the expected
    run and in every attempt."""

    def __init__(self) -> None:
        self._random = random.Random()
        self.restart()

    def restart(self) -> None:
        self._random.seed(20240611)

    def token_bytes(self, nbytes: int = 32) -> bytes:
        return self._random.randbytes(nbytes)

    def token_hex(self, nbytes: int = 32) -> str:
        return self.token_bytes(nbytes).hex()


@dataclass
class Keys:
    """An encrypted sweep's keys: the keyring file, and the data keys of the first seed.

    Data keys are random, made when a scope's first value is sealed: two seeds would seal
    with different keys. So the first seed's data keys (its rows of ``ds_keys``) and the
    keyring file (the secrets of their scopes) are kept, and put back before every later
    seed, which then seals with them; sealing being deterministic (the nonce is a MAC of
    the row's associated data and the plaintext), every seed stores the same bytes.
    """

    path: Path
    monkeypatch: pytest.MonkeyPatch
    secrets: SeededSecrets = field(default_factory=SeededSecrets)
    rows: list[dict[str, Any]] | None = None  # ds_keys after the first seed
    keyring: bytes = b""  # the keyring file after it

    async def stored(self, engine: AsyncEngine) -> list[dict[str, Any]]:
        async with engine.connect() as conn:
            found = await conn.execute(select(keys).order_by(keys.c.org_id, keys.c.key_id))
            return [dict(row._mapping) for row in found]

    async def keep(self, engine: AsyncEngine) -> None:
        """Keep the first seed's data keys and keyring; from now on a data key made (by a
        write under test) is made of the seeded bytes."""
        self.rows = await self.stored(engine)
        self.keyring = self.path.read_bytes()
        assert self.rows, "the seed made no data key"
        self.monkeypatch.setattr(durable_sessions.sealing, "secrets", self.secrets)
        self.monkeypatch.setattr(durable_sessions.crypto, "secrets", self.secrets)

    async def restore(self, engine: AsyncEngine) -> None:
        """Put the kept data keys back (the tables emptied) and the keyring file as it was
        (delete_user forgot a scope, a new owner's key added one)."""
        assert self.rows is not None
        async with engine.begin() as conn:
            await conn.execute(insert(keys), self.rows)
        temp = self.path.with_name(f".{self.path.name}.restored")
        temp.write_bytes(self.keyring)
        os.chmod(temp, 0o600)
        os.replace(temp, self.path)

    async def unchanged(self, engine: AsyncEngine) -> None:
        """The seed sealed with the kept keys: it made no data key and no keyring secret."""
        assert await self.stored(engine) == self.rows, "the seed made a data key"
        assert self.path.read_bytes() == self.keyring, "the seed changed the keyring"


@dataclass
class Sweep:
    """One backend's sweep: engines, the checker, and what it counted."""

    backend: str
    url: str
    engine: AsyncEngine  # the store's, with ONE pooled connection: each attempt reuses it
    independent: AsyncEngine
    checker: Checker
    # Encrypted: the seeds' and the reads' after each attempt (with one pooled connection, of
    # its own: an encrypted seed on a new connection per statement would double the time).
    # Unused by a plain sweep, which may leave it out.
    helper: AsyncEngine | None = None
    cancelled: int = 0
    keys: Keys | None = None  # encrypted: every store has a keyring over one keyring file

    def encrypt(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the sweep's stores (the seed's, ``expected``'s, each attempt's, the
        checks') encrypted, with the keyring file ``path``."""
        self.keys = Keys(path, monkeypatch)

    def store(self, engine: AsyncEngine | None = None) -> SQLStore:
        """A new store on ``engine`` (the store engine by default): encrypted with a new
        keyring over the sweep's keyring file, when the sweep is (no key cached)."""
        engine = self.engine if engine is None else engine
        if self.keys is None:
            return SQLStore(engine)
        return SQLStore(engine, keyring=LocalKeyring(self.keys.path))

    async def fresh(self) -> None:
        await reset_tables(self.independent)
        if self.keys is None:
            await seed(self.store(self.independent), self.independent)
            return
        helper = self.helper
        assert helper is not None, "an encrypted sweep seeds through its helper engine"
        if self.keys.rows is None:  # the first seed makes the keyring and the data keys
            await seed(self.store(helper), helper)
            await self.keys.keep(helper)
        else:
            await self.keys.restore(helper)
            await seed(self.store(helper), helper)
            await self.keys.unchanged(helper)
        self.keys.secrets.restart()

    async def observe(self) -> Snapshot:
        """What an independent connection sees (the probe left out); encrypted, the blind
        search index too."""
        index = None if self.keys is None else BLIND_INDEX[self.backend]
        return await observe(self.independent, skip={"probe"}, index=index)

    async def expected(self, name: str) -> list[Snapshot]:
        """The states an independent connection may see: before, after, and in between."""
        await self.fresh()
        before = await self.observe()
        if self.keys is not None:
            await self.fresh()  # over the kept keys: the same bytes, or no sweep can compare
            again = await self.observe()
            assert again == before, "two seeds over the same data keys store different bytes"
            for table in ("ds_sessions", "ds_events", "ds_user_state", "ds_app_state"):
                prefix = EVENT_PREFIX if table == "ds_events" else PREFIX
                assert prefix in repr(before[table]), f"nothing sealed in {table}"
            assert any(row[-1] for row in before[SEARCH_INDEX]), "no word in the blind index"
        store = self.store()
        op = await WRITES[name](store)
        await op()
        after = await self.observe()
        allowed = [before, after]
        for done in BETWEEN.get(name, []):
            if "ds_events" in done and SEARCH_INDEX in after:  # it goes with the events
                done = (*done, SEARCH_INDEX)
            allowed.append({**before, **{t: after[t] for t in done}})
        if self.keys is not None:
            # Only delete_user (destroying the user's) and a new owner's write change keys.
            changed = after["ds_keys"] != before["ds_keys"]
            assert changed == (name in MAKES_KEYS or name == "delete_user"), name
            if name in MAKES_KEYS:
                allowed += keys_made_first(before, after)
        assert before != after, f"{name} wrote nothing to compare"
        return allowed

    async def check(self, name: str, allowed: list[Snapshot], how: str) -> None:
        await self.checker.nothing_left_open()
        seen = await self.observe()
        assert seen in allowed, f"{name}, {how}: a partial write is visible"
        if self.keys is not None:
            await self.still_opens(f"{name}, {how}")
        await self.checker.pool_commits(self.store(), "probe")
        await self.checker.nothing_left_open()
        assert await self.observe() == seen

    async def still_opens(self, how: str) -> None:
        """A new encrypted store reads every session with its events: no stored value names
        a data key that is missing, or that the keyring no longer unwraps."""
        helper = self.helper
        assert helper is not None, "an encrypted sweep reads through its helper engine"
        reader = self.store(helper)
        async with helper.connect() as conn:
            found = await conn.execute(
                select(sessions.c.id).where(sessions.c.org_id == ORG).order_by(sessions.c.id)
            )
            ids = list(found.scalars())
        for session_id in ids:
            try:
                await reader.get_with_events(ORG, session_id)
            except DecryptionError as exc:
                raise AssertionError(f"{how}: session {session_id!r} no longer opens") from exc

    async def sweep(
        self,
        name: str,
        run: Callable[[Callable[[], Awaitable[Any]], int], Awaitable[Outcome]],
        how: str,
    ) -> None:
        """Cancel ``name`` at point 1, 2, 3, ... until it completes; check after each."""
        allowed = await self.expected(name)
        for n in range(1, MAX_POINTS):
            await self.fresh()
            op = await WRITES[name](self.store())
            outcome = await run(op, n)
            if outcome.error is not None:
                raise AssertionError(f"{name}, {how} {n}: raised {outcome.error!r}")
            await self.check(name, allowed, f"{how} {n}")
            if not outcome.cancelled:
                assert outcome.points < n, (
                    f"{name}, {how} {n}: cancelled, yet the caller got no CancelledError"
                )
                return
            self.cancelled += 1
        raise AssertionError(f"{name}: still cancelled after {MAX_POINTS} points")


def keys_made_first(before: Snapshot, after: Snapshot) -> list[Snapshot]:
    """The states of a write that makes data keys (each stored in a transaction of its own)
    cancelled after some of them: the tables as before, ``ds_keys`` with some new keys."""
    new = [row for row in after["ds_keys"] if row not in before["ds_keys"]]
    assert new, "the write made no data key"
    states = []
    for size in range(1, len(new) + 1):
        for made in itertools.combinations(new, size):
            kept = [row for row in after["ds_keys"] if row in before["ds_keys"] or row in made]
            states.append({**before, "ds_keys": kept})
    return states


@contextlib.asynccontextmanager
async def admin_connection(backend: str, url: str) -> AsyncIterator[Any]:
    """A plain connection that looks at the server's transactions (None on SQLite)."""
    if backend == "postgres":
        async with raw_pg(url) as admin:
            yield admin
    elif backend == "mysql":
        async with raw_mysql(url) as admin:
            yield admin
    else:
        yield None


def pooled(url: str, size: int) -> AsyncEngine:
    """An engine whose pool holds ``size`` connections and makes no more (on SQLite too,
    whose default pool is NullPool in older SQLAlchemy versions)."""
    return create_async_engine(url, poolclass=AsyncAdaptedQueuePool, pool_size=size, max_overflow=0)


@pytest.fixture
async def sweeper(
    engine: AsyncEngine, backend: str, backend_url: str
) -> Any:  # an async generator of Sweep
    """A store engine with one pooled connection, an independent engine, and the checker."""
    store_engine = pooled(backend_url, 1)
    independent = create_async_engine(backend_url, poolclass=NullPool)
    helper = pooled(backend_url, 1)  # connects only when used (encrypted)
    try:
        async with admin_connection(backend, backend_url) as admin:
            checker = Checker(backend, backend_url, independent, admin)
            yield Sweep(backend, backend_url, store_engine, independent, checker, helper)
    finally:
        await store_engine.dispose()
        await independent.dispose()
        await helper.dispose()


async def _mysql_idle(admin: Any, connection_id: int) -> None:
    """Wait until MySQL lists the connection as idle between statements (``Sleep``): it
    answers a statement a moment before it says so."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while True:
        async with admin.cursor() as cursor:
            await cursor.execute(
                "SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = %s",
                (connection_id,),
            )
            found = await cursor.fetchone()
        if found is not None and found[0] == "Sleep":
            return
        assert time.monotonic() < deadline, f"connection {connection_id} never idle: {found}"
        await asyncio.sleep(0.01)


async def test_the_check_finds_a_transaction_left_open_and_not_once_it_has_ended(
    backend: str, backend_url: str, engine: AsyncEngine
) -> None:
    """The check every attempt ends with finds a connection idle inside a transaction, and
    finds none the moment that transaction has ended (it reads no cached view of the
    server's transactions)."""
    independent = create_async_engine(backend_url, poolclass=NullPool)
    try:
        async with admin_connection(backend, backend_url) as admin:
            checker = Checker(backend, backend_url, independent, admin)
            await checker.nothing_left_open(settle=0)
            async with independent.connect() as conn:
                await conn.begin()
                await conn.execute(update(sessions).values(title="left open"))
                if backend == "mysql":  # the server marks the connection idle a moment later
                    own = (await conn.execute(text("SELECT CONNECTION_ID()"))).scalar_one()
                    await _mysql_idle(admin, int(own))
                # SQLite's check cannot take the write lock the open transaction holds.
                with pytest.raises((AssertionError, sqlite3.OperationalError)):
                    await checker.nothing_left_open(settle=0)
                await conn.commit()
            await checker.nothing_left_open(settle=0)
    finally:
        await independent.dispose()


# -- (a) every cancellation point of every write ------------------------------------------------


SWEPT = [
    *(pytest.param(name, False, id=name) for name in PLAIN_WRITES),
    *(pytest.param(name, True, id=f"{name}-encrypted") for name in ENCRYPTED_WRITES),
]
"""Every write over a plain store, and the writes that seal over an encrypted one."""


@pytest.mark.parametrize(("write", "encrypted"), SWEPT)
async def test_cancel_at_every_await_of_every_write(
    sweeper: Sweep, write: str, encrypted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel each write at its 1st, 2nd, 3rd... suspension until it completes (encrypted:
    the stored data still opens after each)."""
    if encrypted:
        sweeper.encrypt(tmp_path / "keyring.json", monkeypatch)
    await sweeper.sweep(write, lambda op, n: attempt(op, {n}), "cancelled at suspension")
    assert sweeper.cancelled >= 1


@pytest.mark.parametrize(("write", "encrypted"), SWEPT)
async def test_driver_call_raises_cancelled_at_every_call(
    sweeper: Sweep, write: str, encrypted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write's 1st, 2nd, 3rd... call to the driver raises CancelledError itself
    (encrypted: the stored data still opens after each)."""
    if encrypted:
        sweeper.encrypt(tmp_path / "keyring.json", monkeypatch)
    backend = sweeper.backend

    async def run(op: Callable[[], Awaitable[Any]], n: int) -> Outcome:
        return await attempt_driver_fault(op, n, backend, monkeypatch)

    await sweeper.sweep(write, run, "driver call")
    assert sweeper.cancelled >= 1


@pytest.mark.skipif(
    tuple(int(p) for p in sqlalchemy.__version__.split(".")[:2]) < (2, 1),
    reason="SQLAlchemy 2.0 strands a new connection whose connect events are cancelled "
    "(sqlalchemy/sqlalchemy#13548): the leaked sockets fail later tests",
)
@pytest.mark.parametrize("write", ["create", "purge"])
async def test_cancel_while_the_pool_connects(sweeper: Sweep, write: str) -> None:
    """With the pool emptied before each attempt, the first points fall in the checkout."""
    allowed = await sweeper.expected(write)
    for n in range(1, MAX_POINTS):
        await sweeper.fresh()
        op = await WRITES[write](SQLStore(sweeper.engine))
        await sweeper.engine.dispose()
        outcome = await attempt(op, {n})
        assert outcome.error is None, repr(outcome.error)
        await sweeper.check(write, allowed, f"connecting, cancelled at suspension {n}")
        if not outcome.cancelled:
            assert outcome.points < n
            return
    raise AssertionError("never completed")


# -- a pool listener that talks to the database -------------------------------------------------


class TransactionLeftOpen:
    """A ``reset`` listener that runs statements through the DBAPI connection and leaves the
    transaction the driver began for them open (SQLAlchemy's asyncpg adapter begins one for
    any statement; MySQL's connection, autocommit off, for a read of a table; ``sqlite3``
    before a data change, here to a temporary table)."""

    def __init__(self, engine: AsyncEngine, backend: str) -> None:
        self.pool = engine.sync_engine.pool
        self.sql = {
            "postgres": ["SELECT 1"],
            "mysql": ["SELECT count(*) FROM ds_sessions"],
        }.get(
            backend,
            [
                "CREATE TEMP TABLE IF NOT EXISTS scratch (n INTEGER)",
                "INSERT INTO scratch VALUES (1)",
            ],
        )

    def talk(self, dbapi_connection: Any, record: Any, state: Any) -> None:
        run_through_dbapi(dbapi_connection, *self.sql)

    def on(self) -> None:
        sqlalchemy.event.listen(self.pool, "reset", self.talk)

    def off(self) -> None:
        sqlalchemy.event.remove(self.pool, "reset", self.talk)


async def test_cancel_at_every_await_with_a_pool_listener_that_talks_to_the_database(
    backend: str, backend_url: str, engine: AsyncEngine
) -> None:
    """With one pooled connection that comes out of the pool inside the transaction a
    listener left open, and whose return runs that listener again (a round trip): a create
    cancelled at each suspension in turn (the check-out, the commit of what the listener
    left, the statement, the check-in and its listener) is whole or absent; then, the
    listener removed, the next write on the same connection is committed and no connection
    of the database is left inside a transaction (pg_stat_activity on Postgres, InnoDB's
    transactions on MySQL, SQLite's write lock free): no connection stranded, no write
    swallowed."""
    store_engine = pooled(backend_url, 1)
    independent = create_async_engine(backend_url, poolclass=NullPool)
    listener = TransactionLeftOpen(store_engine, backend)
    store = SQLStore(store_engine)

    async def present(session_id: str) -> bool:
        try:
            await SQLStore(independent).get("o", session_id)
        except SessionNotFoundError:
            return False
        return True

    async def sweep(checker: Checker) -> None:
        for n in range(1, MAX_POINTS):
            sid, primer, probe = f"listened-{n}", f"primer-{n}", f"probe-{n}"
            listener.on()
            # Its return leaves the listener's transaction open: the attempt starts in it.
            await store.create(Session(org_id="o", id=primer, user_id="u"))
            outcome = await attempt(
                lambda sid=sid: store.create(Session(org_id="o", id=sid, user_id="u")), {n}
            )
            assert outcome.error is None, repr(outcome.error)
            listener.off()
            follow = store.create(Session(org_id="o", id=probe, user_id="u"))
            await asyncio.wait_for(follow, STEP_TIMEOUT)
            await checker.nothing_left_open()
            assert await present(primer)
            assert await present(probe), f"cancelled at {n}: the next write was lost"
            assert store_engine.sync_engine.pool.checkedout() == 0
            if not outcome.cancelled:
                assert await present(sid)
                assert outcome.points < n
                return
        raise AssertionError("never completed")

    try:
        async with admin_connection(backend, backend_url) as admin:
            await sweep(Checker(backend, backend_url, independent, admin))
    finally:
        await store_engine.dispose()
        await independent.dispose()


# -- the ADK import: one transaction of the target, a source read meanwhile ----------------------


@pytest.fixture(scope="module")
def adk_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small database written by google-adk's own DatabaseSessionService: sessions with
    events, state in every scope, two users and two apps (made once)."""
    pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")
    from google.adk.events.event import Event as AdkEvent
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions import DatabaseSessionService
    from google.genai import types

    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('adk-source') / 'adk.db'}"

    async def build() -> None:
        service = DatabaseSessionService(url)
        main = await service.create_session(
            app_name="trips",
            user_id="alice",
            session_id="main",
            state={"topic": "paris", "user:lang": "fr", "app:tier": "gold"},
        )
        for n in range(3):
            await service.append_event(
                main,
                AdkEvent(
                    invocation_id=f"inv-{n}",
                    author="user",
                    content=types.Content(role="user", parts=[types.Part(text=f"hello {n}")]),
                    actions=EventActions(state_delta={"k": n, "user:seen": n}),
                ),
            )
        await service.create_session(app_name="other", user_id="bob", state={"n": 1})
        await service.close()

    with ThreadPoolExecutor(1) as pool:  # its own event loop, off any test's
        pool.submit(asyncio.run, build()).result()
    return url


def _importing(source: str) -> Op:
    async def prepare(store: SQLStore) -> Callable[[], Awaitable[Any]]:
        from durable_sessions.adk import import_adk

        return lambda: import_adk(source, store, org_id=ORG)

    return prepare


async def test_cancel_at_every_await_of_an_adk_import(
    sweeper: Sweep, adk_source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """import_adk cancelled at each of its suspensions (reading the source or writing the
    target): the target holds all of it or none, no connection stays in a transaction,
    and the pooled connection commits the next write."""
    monkeypatch.setitem(WRITES, "import_adk", _importing(adk_source))
    await sweeper.sweep("import_adk", lambda op, n: attempt(op, {n}), "cancelled at suspension")
    assert sweeper.cancelled >= 1


async def test_driver_call_raises_cancelled_at_every_call_of_an_adk_import(
    sweeper: Sweep, adk_source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """import_adk's 1st, 2nd, 3rd... driver call raises CancelledError: the target's on
    Postgres, the source's on both (on SQLite the import runs each target statement to its
    end in a task of its own, so that a cancellation never leaves one in flight)."""
    monkeypatch.setitem(WRITES, "import_adk", _importing(adk_source))
    backend = sweeper.backend

    async def run(op: Callable[[], Awaitable[Any]], n: int) -> Outcome:
        return await attempt_driver_fault(op, n, backend, monkeypatch)

    await sweeper.sweep("import_adk", run, "driver call")
    assert sweeper.cancelled >= 1


@pytest.fixture(scope="module")
def jsonl_export(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """An export (``export_jsonl``) of another database: sessions of another organisation,
    with events and shared state."""
    from durable_sessions.sql.transfer import export_jsonl

    path = tmp_path_factory.mktemp("jsonl-source") / "source.db"

    async def build() -> bytes:
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        try:
            store = SQLStore(engine)
            await store.migrate()
            for n in range(3):
                made = Session(
                    id=f"x{n}", org_id="elsewhere", user_id="carol", app_name="app",
                    state={"k": n, "user:u": n, "app:a": n},
                )  # fmt: skip
                await store.create(made)
                for i in range(2):
                    await store.append_event("elsewhere", made.id, event(f"x{n}-{i}", i, k=i))
            out = io.BytesIO()
            await export_jsonl(store, out)
            return out.getvalue()
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, build()).result()


def _importing_jsonl(data: bytes) -> Op:
    async def prepare(store: SQLStore) -> Callable[[], Awaitable[Any]]:
        from durable_sessions.sql.transfer import import_jsonl

        return lambda: import_jsonl(store, io.BytesIO(data))

    return prepare


async def test_cancel_at_every_await_of_a_jsonl_import(
    sweeper: Sweep, jsonl_export: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """import_jsonl cancelled at each of its suspensions: all of the export or none of it,
    nothing left in a transaction, the pooled connection fine."""
    monkeypatch.setitem(WRITES, "import_jsonl", _importing_jsonl(jsonl_export))
    await sweeper.sweep("import_jsonl", lambda op, n: attempt(op, {n}), "cancelled at suspension")
    assert sweeper.cancelled >= 1


# -- double cancellation ---------------------------------------------------------------------


@pytest.mark.parametrize("write", ["append_event", "purge", "delete_user"])
async def test_double_cancellation_logs_nothing(
    sweeper: Sweep, write: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled twice in quick succession (at two consecutive suspensions, the second
    landing in the cleanup after the first): no 'Exception during reset', no 'Task was
    destroyed but it is pending', no error logged at all, and the same checks pass."""
    allowed = await sweeper.expected(write)
    caplog.set_level(logging.WARNING)
    for n in range(1, MAX_POINTS):
        await sweeper.fresh()
        op = await WRITES[write](SQLStore(sweeper.engine))
        outcome = await attempt(op, {n, n + 1})
        assert outcome.error is None, repr(outcome.error)
        await sweeper.check(write, allowed, f"cancelled at suspensions {n} and {n + 1}")
        gc.collect()  # a task destroyed while pending is reported when it is collected
        if not outcome.cancelled:
            break
    else:
        raise AssertionError("never completed")
    await asyncio.sleep(0.05)
    gc.collect()
    bad = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
        or "Exception during reset" in r.getMessage()
        or "Task was destroyed" in r.getMessage()
    ]
    assert not bad, bad


# -- (b) a storm of timeouts on a small pool -------------------------------------------------


@dataclass
class Tally:
    """What the storm's tasks were told."""

    ops: int = 0
    timed_out: int = 0
    stale: int = 0
    appended: dict[str, set[str]] = field(default_factory=dict)  # session -> acked event ids
    append_timeouts: dict[str, int] = field(default_factory=dict)
    touched: dict[str, int] = field(default_factory=dict)
    touch_timeouts: dict[str, int] = field(default_factory=dict)
    saved: dict[str, set[str]] = field(default_factory=dict)  # session -> acked private keys
    created: set[str] = field(default_factory=set)
    forked: set[str] = field(default_factory=set)
    purges: int = 0


STORM_TASKS = 60
STORM_ROUNDS = 20
THINK = 0.1  # seconds, at most, between two operations of a task
TARGETS = [f"t{i}" for i in range(6)]  # appended to and touched
SAVED = [f"v{i}" for i in range(6)]  # saved (their versions are theirs alone)
OLD = [f"old{i}" for i in range(20)]  # not updated for years: purged


async def test_storm_of_timeouts_on_a_small_pool(
    engine: AsyncEngine, backend: str, backend_url: str, figures: Figures
) -> None:
    """60 tasks on a pool of 4 (no overflow), every operation under a random 0-5 ms timeout:
    purge, append_event, touch, save, create and fork mixed. Every acknowledged write is
    stored, every counter lies within [acknowledged, acknowledged + timed out], every
    transcript is gapless, and no connection is left inside a transaction."""
    setup = SQLStore(engine)
    for sid in [*TARGETS, *SAVED, *OLD]:
        await setup.create(new_session(sid))
    for sid in OLD:
        await setup.append_event(ORG, sid, event(f"{sid}-e", 1))
    async with engine.begin() as conn:
        await conn.execute(
            update(sessions).where(sessions.c.id.in_(OLD)).values(updated_at=LONG_AGO)
        )

    small = pooled(backend_url, 4)
    store = SQLStore(small)
    # Open the pool's 4 connections first (cancelled connects are another test's subject).
    await asyncio.gather(*(store.get(ORG, sid) for sid in TARGETS[:4]))
    tally = Tally()
    rng = random.Random(20240611)

    async def one(task: int, rnd: int) -> None:
        kind = rng.choice(["append", "append", "touch", "save", "create", "fork", "purge"])
        target = rng.choice(TARGETS)
        timeout = rng.uniform(0, 0.005)
        tag = f"{task}-{rnd}"
        if kind == "append":
            op: Awaitable[Any] = store.append_event(
                ORG, target, Event("agent", tag, tokens=1, id=f"ev-{tag}")
            )
        elif kind == "touch":
            op = store.touch(ORG, target, messages=1)
        elif kind == "save":
            target = rng.choice(SAVED)
            try:
                session = await asyncio.wait_for(store.get(ORG, target), STEP_TIMEOUT)
            except asyncio.TimeoutError:  # pragma: no cover - a read stuck for 30 s
                raise AssertionError("a read hung") from None
            session.set(f"key-{tag}", tag)
            op = store.update(session)
        elif kind == "create":
            op = store.create(new_session(f"new-{tag}", k=tag))
        elif kind == "fork":
            op = store.fork(ORG, target, new_session_id=f"fork-{tag}", with_events=True)
        else:
            op = store.purge(ORG, older_than=timedelta(days=30))
        tally.ops += 1
        try:
            await asyncio.wait_for(op, timeout)
        except asyncio.TimeoutError:
            tally.timed_out += 1
            if kind == "append":
                tally.append_timeouts[target] = tally.append_timeouts.get(target, 0) + 1
            elif kind == "touch":
                tally.touch_timeouts[target] = tally.touch_timeouts.get(target, 0) + 1
            return
        except StaleSessionError:
            tally.stale += 1
            return
        if kind == "append":
            tally.appended.setdefault(target, set()).add(f"ev-{tag}")
        elif kind == "touch":
            tally.touched[target] = tally.touched.get(target, 0) + 1
        elif kind == "save":
            tally.saved.setdefault(target, set()).add(f"key-{tag}")
        elif kind == "create":
            tally.created.add(f"new-{tag}")
        elif kind == "fork":
            tally.forked.add(f"fork-{tag}")
        else:
            tally.purges += 1

    async def worker(task: int) -> None:
        for rnd in range(STORM_ROUNDS):
            # A pause between operations keeps the pool's queue short enough that many
            # operations reach the database before their timeout, and are cut off there.
            await asyncio.sleep(rng.uniform(0, THINK))
            await one(task, rnd)

    try:
        await asyncio.wait_for(asyncio.gather(*(worker(t) for t in range(STORM_TASKS))), 300)

        # The pool is whole: every connection can be checked out at once and commits.
        async def probe(i: int) -> None:
            await asyncio.wait_for(store.create(new_session(f"after-{i}")), STEP_TIMEOUT)

        await asyncio.gather(*(probe(i) for i in range(8)))
    finally:
        await small.dispose()

    independent = create_async_engine(backend_url, poolclass=NullPool)
    try:
        async with admin_connection(backend, backend_url) as admin:
            await Checker(backend, backend_url, independent, admin).nothing_left_open()
        acknowledged, found, problems = await _verify_storm(SQLStore(independent), tally)
    finally:
        await independent.dispose()
    figures.record(
        f"cancellation storm: {STORM_TASKS} tasks, pool of 4, 0-5 ms timeouts",
        backend,
        operations=tally.ops,
        expected=acknowledged,
        found=found,
        errors=tally.stale,
        cancelled=tally.timed_out,
    )
    assert not problems, problems
    assert tally.ops == acknowledged + tally.timed_out + tally.stale
    assert tally.timed_out > 0
    assert acknowledged > 0


async def _verify_storm(reader: SQLStore, tally: Tally) -> tuple[int, int, list[str]]:
    """Read the storm's results back through an independent engine: the acknowledged
    writes, how many of them are stored, and what else is wrong."""
    acknowledged = found = 0
    problems: list[str] = []

    async def exists(sid: str) -> bool:
        try:
            await reader.get(ORG, sid)
        except SessionNotFoundError:
            return False
        return True

    for sid in TARGETS:
        stored = await reader.get(ORG, sid)
        events = await reader.list_events(ORG, sid)
        acked = tally.appended.get(sid, set())
        acknowledged += len(acked)
        found += len(acked & {e.id for e in events})
        if [e.seq for e in events] != list(range(1, len(events) + 1)):
            problems.append(f"{sid}: event seqs are not 1..{len(events)}")
        # Appends and touches count a message each; only appends count tokens (1 each).
        if stored.token_total != len(events):
            problems.append(f"{sid}: token_total {stored.token_total}, {len(events)} events")
        if not len(acked) <= len(events) <= len(acked) + tally.append_timeouts.get(sid, 0):
            problems.append(f"{sid}: {len(events)} events, {len(acked)} acknowledged")
        touches = stored.message_count - len(events)
        touched = tally.touched.get(sid, 0)
        acknowledged += touched
        found += min(touches, touched)
        if not touched <= touches <= touched + tally.touch_timeouts.get(sid, 0):
            problems.append(f"{sid}: {touches} touches counted, {touched} acknowledged")
    for sid in SAVED:
        stored = await reader.get(ORG, sid)
        acked = tally.saved.get(sid, set())
        acknowledged += len(acked)
        found += sum(1 for key in acked if key in stored.state)
    for sid in sorted(tally.created):
        acknowledged += 1
        found += await exists(sid)
    for sid in sorted(tally.forked):
        acknowledged += 1
        if await exists(sid):
            found += 1
            events = await reader.list_events(ORG, sid)
            if [e.seq for e in events] != list(range(1, len(events) + 1)):
                problems.append(f"{sid}: the fork's event seqs are not 1..{len(events)}")
    left = [sid for sid in OLD if await exists(sid)]
    for sid in left:  # a purged session goes with its events, or stays with them
        if len(await reader.list_events(ORG, sid)) != 1:
            problems.append(f"{sid}: kept without its event")
    acknowledged += tally.purges  # each acknowledged purge left no old session behind
    found += tally.purges if not left else 0
    return acknowledged, found, problems
