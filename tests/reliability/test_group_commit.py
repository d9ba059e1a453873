"""Writes that meet keep their own outcomes, on every store.

On SQLite the writes of one process that queue behind each other are committed together:
the next writer to get the lock takes the waiting writes (up to ``_GROUP_MAX``) and runs
them in one transaction, each inside a savepoint (``SQLiteRunner``). What a caller
sees must not change with that: a write that fails fails alone and leaves nothing, the
others commit; an acknowledged write is stored; a cancelled one is whole or absent; a
transaction that fails (its COMMIT, or SQLite rolling it back under one write) fails no
write silently and keeps nothing half-done. These tests hold every store to that, and on
SQLite check that the writes really met in one transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    Event,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SQLStore,
    StaleSessionError,
    Store,
    StoreError,
    StoreUnavailableError,
)
from durable_sessions.sql.dialects.sqlite import runner, writers

ORG = "org"


def new_session(session_id: str, **state: Any) -> Session:
    return Session(id=session_id, org_id=ORG, user_id="alice", app_name="app", state=state)


def event(event_id: str, **delta: Any) -> Event:
    return Event("agent", content={"id": event_id}, state_delta=delta, tokens=3, id=event_id)


@contextmanager
def group_sizes(
    monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Any], Any] = lambda db: db
) -> Iterator[list[int]]:
    """Record how many writes each SQLite write transaction carried; the worker thread
    sees the sqlite3 connection through ``wrap`` (an injected fault)."""
    sizes: list[int] = []
    original = runner._drive_group

    def counting(db: Any, jobs: list[Any], hop: Any) -> None:
        sizes.append(len(jobs))
        original(wrap(db), jobs, hop)

    with monkeypatch.context() as patch:
        patch.setattr(runner, "_drive_group", counting)
        yield sizes


async def stored_events(store: Store, session_id: str) -> list[str]:
    return [e.id for e in await store.list_events(ORG, session_id)]


async def test_writes_that_meet_keep_their_own_outcomes(
    store: Store, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """45 writes at once, failures among them (an id taken, a session missing, a stale
    save): each caller gets its own outcome, and the store holds exactly the writes that
    returned, whole. On SQLite they met in transactions of up to ``_GROUP_MAX`` writes."""
    for i in range(12):
        await store.create(new_session(f"base-{i}", k=0))
    await store.create(new_session("taken", mark="original"))
    stale = await store.get(ORG, "base-11")
    fresh = await store.get(ORG, "base-11")
    fresh.set("k", "winner")
    await store.update(fresh)
    stale.set("k", "loser")
    stale.set("user:from_stale", 1)
    stale.set("app:from_stale", 1)

    second = {"mark": "second", "user:from_taken": 1, "app:from_taken": 1}
    ops: list[tuple[str, Callable[[], Any]]] = []
    for i in range(11):
        ops.append(("ok", lambda i=i: store.append_event(ORG, f"base-{i}", event(f"e-{i}", k=i))))
        ops.append(("ok", lambda i=i: store.create(new_session(f"new-{i}", n=i))))
        if i == 2:
            ops.append(("exists", lambda: store.create(new_session("taken", **second))))
        if i == 5:
            ops.append(("missing", lambda: store.append_event(ORG, "nowhere", event("e-x"))))
        if i == 8:
            ops.append(("stale", lambda: store.update(stale)))
    for i in range(20):  # and more writes to one session, in order of arrival
        ops.append(("ok", lambda i=i: store.append_event(ORG, "base-0", event(f"more-{i}"))))

    with group_sizes(monkeypatch) as sizes:
        outcomes = await asyncio.gather(*(op() for _, op in ops), return_exceptions=True)

    expected = {
        "exists": SessionExistsError,
        "missing": SessionNotFoundError,
        "stale": StaleSessionError,
    }
    for (kind, _), outcome in zip(ops, outcomes, strict=True):
        if kind == "ok":
            assert not isinstance(outcome, BaseException), outcome
        else:
            assert isinstance(outcome, expected[kind]), (kind, outcome)

    on_base0 = await stored_events(store, "base-0")
    assert sorted(on_base0) == sorted(["e-0", *(f"more-{i}" for i in range(20))])
    if backend in ("memory", "sqlite"):  # one writer at a time: in order of arrival
        assert on_base0 == ["e-0", *(f"more-{i}" for i in range(20))]
    for i in range(1, 11):
        session = await store.get(ORG, f"base-{i}")
        assert await stored_events(store, f"base-{i}") == [f"e-{i}"]
        assert (session.message_count, session.token_total, session.state["k"]) == (1, 3, i)
        assert (await store.get(ORG, f"new-{i}")).state == {"n": i}
    base0 = await store.get(ORG, "base-0")
    assert (base0.message_count, base0.token_total) == (21, 63)
    assert [e.seq for e in await store.list_events(ORG, "base-0")] == list(range(1, 22))
    # Nothing of a failed write is left, its shared (user:, app:) keys included.
    assert (await store.get(ORG, "taken")).state == {"mark": "original"}
    assert (await store.get(ORG, "base-11")).state == {"k": "winner"}
    assert (await store.get(ORG, "new-0")).state == {"n": 0}
    with pytest.raises(SessionNotFoundError):
        await store.get(ORG, "nowhere")
    if backend == "sqlite":
        assert max(sizes) == writers.GROUP_MAX, sizes
        assert sum(sizes) == len(ops), sizes


async def test_cancelled_writes_among_others_are_whole_or_absent(
    store: Store, backend: str
) -> None:
    """30 appends at once, one in three cancelled after 0 to 6 turns of the event loop
    (queued, in flight, or done): every append not cancelled is stored, every cancelled
    one is whole or absent (its event and its counters together), and the store takes
    the next write of each session."""
    for turns in range(7):
        ids = [f"t{turns}-{i}" for i in range(30)]
        for sid in ids:
            await store.create(new_session(sid))
        tasks = [
            asyncio.create_task(store.append_event(ORG, sid, event(f"{sid}-e", k=1))) for sid in ids
        ]
        for _ in range(turns):
            await asyncio.sleep(0)
        for task in tasks[::3]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for n, (sid, result) in enumerate(zip(ids, results, strict=True)):
            session = await store.get(ORG, sid)
            events = await stored_events(store, sid)
            if n % 3 and not isinstance(result, asyncio.CancelledError):
                assert not isinstance(result, BaseException), result
                assert events == [f"{sid}-e"]
            assert events in ([], [f"{sid}-e"]), events
            whole = (session.message_count, session.token_total, session.state.get("k"))
            assert whole == ((1, 3, 1) if events else (0, 0, None)), (sid, whole)
            await store.append_event(ORG, sid, event(f"{sid}-next"))
            assert (await stored_events(store, sid))[-1] == f"{sid}-next"


async def _sqlite_store(url: str, **options: Any) -> SQLStore:
    store = SQLStore(create_async_engine(url), **options)
    await store.migrate()
    return store


async def queued_together(store: SQLStore, writes: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Start ``writes`` while this process's write lock is held, so that each queues before
    any runs and they are then taken as one group (whatever the pool does at checkout in
    this SQLAlchemy version); return their outcomes, errors included."""
    queue = writers.writers_of(store.engine)
    async with queue.lock:
        tasks = [asyncio.ensure_future(write) for write in writes]
        for _ in range(1000):
            if len(queue.pending) == len(tasks):
                break
            await asyncio.sleep(0)
        assert len(queue.pending) == len(tasks), "the writes did not all queue"
    return await asyncio.gather(*tasks, return_exceptions=True)


class _FailingCommit:
    """A sqlite3 connection whose COMMIT fails (as on an I/O error): the transaction is
    left open, for the runner to roll back."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def commit(self) -> None:
        raise sqlite3.OperationalError("disk I/O error")


async def test_sqlite_a_failed_commit_fails_every_write_of_its_group(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a group's COMMIT fails, each of its writes raises StoreError and none is
    stored, not even in part; the connection commits the next writes."""
    store = await _sqlite_store(sqlite_url)
    try:
        ids = [f"s{i}" for i in range(8)]
        for sid in ids:
            await store.create(new_session(sid))
        with group_sizes(monkeypatch, _FailingCommit) as sizes:
            writes = [store.append_event(ORG, sid, event(f"{sid}-e", k=1)) for sid in ids]
            results = await queued_together(store, writes)
        assert sizes == [8], sizes
        for result in results:
            assert isinstance(result, StoreError), result
            assert "disk I/O error" in str(result)
        for sid in ids:
            session = await store.get(ORG, sid)
            assert await stored_events(store, sid) == []
            assert (session.message_count, session.token_total, session.state) == (0, 0, {})
        results = await asyncio.gather(
            *(store.append_event(ORG, sid, event(f"{sid}-again")) for sid in ids)
        )
        assert [e.seq for e in results] == [1] * 8
    finally:
        await store.engine.dispose()


class _FailsOn:
    """A sqlite3 connection on which the statement carrying ``marker`` fails: alone (as a
    constraint does), or rolling the whole transaction back first (as SQLite does on a
    full disk) when ``loses_transaction``."""

    def __init__(self, db: sqlite3.Connection, marker: str, *, loses_transaction: bool) -> None:
        self._db = db
        self._marker = marker
        self._loses = loses_transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def execute(self, sql: str, params: Any = ()) -> Any:
        if isinstance(params, (tuple, list)) and self._marker in params:
            if self._loses:
                self._db.rollback()
                raise sqlite3.OperationalError("database or disk is full")
            raise sqlite3.IntegrityError("CHECK constraint failed: injected")
        return self._db.execute(sql, params)


async def test_sqlite_a_write_failing_midway_is_rolled_back_alone(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a group, one append fails at its event's INSERT, after its statement that moved
    the session's counters and state: that write raises and leaves nothing (no counter, no
    state, no event); the writes before and after it in the same transaction commit."""
    store = await _sqlite_store(sqlite_url)
    try:
        ids = [f"s{i}" for i in range(6)]
        for sid in ids:
            await store.create(new_session(sid))
        with group_sizes(
            monkeypatch, lambda db: _FailsOn(db, "s3-e", loses_transaction=False)
        ) as sizes:
            writes = [
                store.append_event(ORG, sid, event(f"{sid}-e", k=1, **{"user:u": sid}))
                for sid in ids
            ]
            results = await queued_together(store, writes)
        assert sizes == [6], sizes
        assert isinstance(results[3], StoreError), results[3]
        for n, sid in enumerate(ids):
            session = await store.get(ORG, sid)
            if n == 3:
                assert await stored_events(store, sid) == []
                assert (session.message_count, session.token_total) == (0, 0)
                assert "k" not in session.state
            else:
                assert results[n].seq == 1  # type: ignore[union-attr]
                assert await stored_events(store, sid) == [f"{sid}-e"]
                assert (session.message_count, session.token_total) == (1, 3)
                assert session.state["k"] == 1
        # The user: key is the last write's of the group, s5's: s3's never landed.
        assert (await store.get(ORG, "s0")).state["user:u"] == "s5"
    finally:
        await store.engine.dispose()


async def test_sqlite_a_transaction_lost_under_one_write(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite rolls a group's transaction back under its fifth write: that write and the
    four before it (run in the lost transaction) raise StoreError and are absent; the
    four after it were not run yet, and are run and stored in a transaction of their own."""
    store = await _sqlite_store(sqlite_url)
    try:
        ids = [f"s{i}" for i in range(9)]
        for sid in ids:
            await store.create(new_session(sid))
        with group_sizes(
            monkeypatch, lambda db: _FailsOn(db, "s4-e", loses_transaction=True)
        ) as sizes:
            writes = [store.append_event(ORG, sid, event(f"{sid}-e", k=1)) for sid in ids]
            results = await queued_together(store, writes)
        assert sizes == [9, 4], sizes  # s5-s8 were not run in the lost transaction
        for result in results[:5]:
            assert isinstance(result, StoreError), result
            assert "disk is full" in str(result)
        assert [e.seq for e in results[5:]] == [1, 1, 1, 1]
        for n, sid in enumerate(ids):
            session = await store.get(ORG, sid)
            stored = await stored_events(store, sid)
            assert stored == ([] if n <= 4 else [f"{sid}-e"]), (sid, stored)
            assert session.message_count == len(stored)
    finally:
        await store.engine.dispose()


async def test_sqlite_a_group_that_cannot_begin_fails_each_write_once(
    sqlite_url: str,
) -> None:
    """Another process holds SQLite's write lock past the busy timeout: every write of
    the queue raises StoreUnavailableError (none waits forever or is retried without end)
    and none is stored; once the lock is free the same writes go through."""
    store = await _sqlite_store(sqlite_url, busy_timeout=0.2)
    try:
        ids = [f"s{i}" for i in range(5)]
        for sid in ids:
            await store.create(new_session(sid))
        path = sqlite_url.split("///", 1)[1]
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(store.append_event(ORG, sid, event(f"{sid}-e")) for sid in ids),
                    return_exceptions=True,
                ),
                30,
            )
        finally:
            other.rollback()
            other.close()
        for result in results:
            assert isinstance(result, StoreUnavailableError), result
        for sid in ids:
            assert await stored_events(store, sid) == []
        results = await asyncio.gather(
            *(store.append_event(ORG, sid, event(f"{sid}-e")) for sid in ids)
        )
        assert [e.seq for e in results] == [1] * 5
    finally:
        await store.engine.dispose()
