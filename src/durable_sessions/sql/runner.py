"""Run a store operation's statements on the pool's driver connection, in one hop.

An operation is written once, as a generator that yields queries and receives their results
(``Program``). A runner drives it: on SQLite the whole program runs in aiosqlite's worker
thread in one hop (one ``BEGIN IMMEDIATE`` ... ``COMMIT`` for writes); on Postgres each
query is one asyncpg round trip, and a multi-statement write runs in one transaction. This
driver errors become the library's errors in ``translate``, the one error map.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ._private import (
    RETURNED,
    aiosqlite_connection,
    aiosqlite_execute,
    checkin_reset,
    checkin_without_io,
    checkout_without_io,
    engine_has_events,
    greenlet_spawn,
    invalidate_pool,
)
from .compiled import Compiled
from .dialect import pin_read_committed
from .translate import is_disconnect, is_timeout, translated

__all__ = [
    "Mode",
    "Program",
    "Query",
    "Result",
    "Runner",
    "TransactionConnection",
    "make_runner",
    "write_transaction",
]

T = TypeVar("T")
Mode = Literal["read", "write", "atomic"]
"""``read``: no transaction. ``write``: one transaction. ``atomic``: a single statement,
atomic by itself (Postgres runs it without BEGIN/COMMIT; SQLite still locks up front)."""


@dataclass(frozen=True)
class Query:
    """One statement to run, with its parameters (a list of them with ``many``)."""

    stmt: Compiled
    params: Any = field(default_factory=dict)
    many: bool = False


@dataclass(frozen=True)
class Result:
    """What a query returned: decoded rows, and the affected row count for DML."""

    rows: list[Any]
    rowcount: int

    def first(self) -> Any:
        """Return the first row, or None."""
        return self.rows[0] if self.rows else None


Program = Generator[Query, Result, T]

# How long the cleanup after a failure may wait for the server (the acknowledgement of a
# cancelled statement, then ROLLBACK) before it terminates the connection instead.
_SETTLE_TIMEOUT = 10.0


async def _to_the_end(aw: Awaitable[T]) -> T:
    """Await ``aw`` in a task of its own, to its end, even if the caller is cancelled meanwhile.

    What decides a connection's fate (roll back, terminate, check in) must not be cut short
    by a second cancellation, nor the connection reach the pool while something still uses
    it: a cancellation that arrives meanwhile is raised once ``aw`` has finished.
    """
    task = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what propagates
        raise cancelled
    return task.result()


def _cancel_requests(task: asyncio.Task[Any] | None) -> int:
    """The cancellations requested of ``task`` and not yet withdrawn (0 before Python 3.11)."""
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


async def _deliver_swallowed_cancel(give_back: Callable[[], Awaitable[None]]) -> None:
    """After the pool handed a connection out to a task that was cancelled meanwhile (it
    has more cancellation requests than before the checkout), the pool may have swallowed
    the cancellation (SQLAlchemy 2.0's pool queue waits in ``asyncio.wait_for``, which does
    on Python 3.11 when its wait is over meanwhile): return the connection with
    ``give_back`` and raise it."""
    try:
        await asyncio.sleep(0)  # one still pending is delivered here
        raise asyncio.CancelledError
    except BaseException:
        await give_back()
        raise


class Runner:
    """Drives programs on one engine; subclasses know the driver.

    A borrowed connection goes back to the pool outside any transaction, or is terminated:
    after any exit other than a normal return (an error, a cancellation at any await), the
    runner asks the driver whether a transaction is open, rolls it back, and checks the
    connection in, in a step that a further cancellation cannot interrupt; when it cannot
    tell or cannot roll back, it terminates the connection. The caller's exception,
    ``CancelledError`` included, is re-raised unchanged.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        """Run ``program`` and return its value; raise the library's errors on failure."""
        raise NotImplementedError

    def _watched(self) -> bool:
        """Whether something listens to the engine's events (tracing, statement counting)."""
        return engine_has_events(self.engine.sync_engine)

    async def _run_watched(self, program: Program[T], mode: Mode, operation: str) -> T:
        """Run ``program`` through SQLAlchemy's own execution layer, statement by statement.

        Taken when something listens to the engine's events: each listener then gets what
        SQLAlchemy gives it (a real cursor and execution context), and a listener's error
        fails the statement, so the transaction rolls back instead of committing. It costs
        SQLAlchemy's per-statement work (and, on SQLite, a thread hop per statement). A
        failure or cancellation rolls back, or terminates the connection when it cannot.
        """
        with translated(operation, writes=mode != "read"):
            async with _transaction(self.engine, mode != "read") as conn:
                return await _drive_watched(conn, program)

    async def _checkout(self) -> Any:
        """Borrow a pooled connection: the pool's proxy.

        A cancellation while the pool connects is the pool's to clean up; once this has
        returned, nothing awaits before the caller's ``try`` takes the connection over.
        """
        pool = self.engine.sync_engine.pool
        # An idle connection that needs nothing of the driver (the warm one, see there):
        # taken in plain calls, with no await at which a cancellation could fall. When
        # None, the warm one is still next in the queue for the greenlet's checkout.
        fairy = checkout_without_io(pool)
        if fairy is not None:
            return fairy
        task = asyncio.current_task()
        requests = _cancel_requests(task)
        # Straight from the pool (its checkout events, pre-ping and reset still apply),
        # without an engine Connection around it: one greenlet hop each way.
        fairy = await greenlet_spawn(self.engine.sync_engine.pool.connect)
        if _cancel_requests(task) > requests:
            await _deliver_swallowed_cancel(lambda: self._checkin(fairy))
        return fairy

    async def _checkin(self, fairy: Any) -> None:
        """Return a connection that the runner has seen outside any transaction."""
        if not fairy.is_valid:  # terminated (and returned) by _recover
            return
        fairy.info[RETURNED] = time.monotonic()  # see checkout_without_io
        # The pool's reset still runs (its reset events too), but its rollback is skipped:
        # the runner has checked there is nothing to roll back, and on SQLite that rollback
        # would cost a second thread hop per operation.
        if checkin_without_io(self.engine.sync_engine.pool, fairy):
            checkin_reset(fairy)  # nothing in it reaches the driver: no greenlet, no await
        else:
            # It may await the driver (a pool listener, a commit-on-return, an overflow
            # connection closed): carried to its end, so that a cancellation meanwhile
            # cannot leave the connection neither in the pool nor out of it.
            await _to_the_end(greenlet_spawn(checkin_reset, fairy))

    async def _recover(
        self,
        fairy: Any,
        exc: BaseException | None,
        restore: Callable[[Any], Awaitable[bool]] | None,
    ) -> None:
        """After a failure: ``restore`` leaves the driver connection outside any transaction
        and says whether it could; then check the connection in. A connection that could not
        be restored (or with no ``restore``) is terminated instead; the pool replaces it.

        Awaited through ``_to_the_end``: a further cancellation does not interrupt it.
        """
        clean = False
        try:
            if restore is not None:
                clean = await restore(fairy.driver_connection)
        except Exception:
            clean = False  # whatever failed, the connection is terminated below
        except BaseException:  # this cleanup itself cancelled (the loop closing): no awaits
            if fairy.is_valid:
                fairy.invalidate(exc)  # outside a greenlet: the driver's synchronous abort
            raise
        if not clean and fairy.is_valid:
            await greenlet_spawn(fairy.invalidate, exc)  # the dialect's terminate
        await self._checkin(fairy)


class _Writers:
    """This process's writers to one SQLite engine, in one event loop: the lock that queues
    them (first come, first served) and the writes waiting to be taken into a transaction."""

    __slots__ = ("lock", "pending")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.pending: deque[_Job] = deque()

    def take(self) -> list[_Job]:
        """The waiting writes, oldest first, at most ``_GROUP_MAX`` of them."""
        batch: list[_Job] = []
        while self.pending and len(batch) < _GROUP_MAX:
            job = self.pending.popleft()
            job.taken = True
            batch.append(job)
        return batch

    def put_back(self, jobs: list[_Job]) -> None:
        """Return writes the worker thread never started, at the front, in their order."""
        for job in reversed(jobs):
            job.taken = False
            self.pending.appendleft(job)


_GROUP_MAX = 32
"""The most writes committed together: a bound on how long one transaction holds SQLite's
write lock, which writers in other processes wait for."""

_WRITERS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, _Writers]] = (
    weakref.WeakKeyDictionary()
)


def _writers(engine: AsyncEngine) -> _Writers:
    """This process's writers to one SQLite engine, per event loop."""
    per_loop = _WRITERS.get(engine.sync_engine)
    if per_loop is None:
        per_loop = _WRITERS[engine.sync_engine] = weakref.WeakKeyDictionary()
    loop = asyncio.get_running_loop()
    writers = per_loop.get(loop)
    if writers is None:
        writers = per_loop[loop] = _Writers()
    return writers


def _write_lock(engine: AsyncEngine) -> asyncio.Lock:
    """The lock that queues this process's writers to one SQLite engine, per event loop."""
    return _writers(engine).lock


class _Hop:
    """One trip to aiosqlite's worker thread, as both sides see it."""

    __slots__ = ("clean", "done")

    def __init__(self) -> None:
        self.done = False  # set by the thread: it has finished with the connection
        self.clean = False  # set by the thread: and left it outside any transaction


class _Job:
    """One write program, from its caller to the worker thread and back.

    The event loop sets ``taken`` (it is in a group) and ``abandoned`` (its caller is gone:
    commit nothing of it); the thread sets ``started`` and then the outcome, ``value`` (a
    one-item box) or ``error``.
    """

    __slots__ = ("abandoned", "error", "program", "started", "taken", "value")

    def __init__(self, program: Program[Any]) -> None:
        self.program = program
        self.taken = False
        self.abandoned = False
        self.started = False
        self.value: list[Any] = []
        self.error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Whether the thread has given this write its outcome."""
        return bool(self.value) or self.error is not None

    def outcome(self) -> Any:
        """The program's value, or its error raised."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.value.pop()


class _Abandoned(Exception):
    """The caller stopped waiting (cancelled) before the program committed."""


class SQLiteRunner(Runner):
    """Runs a whole program in aiosqlite's worker thread: one thread hop per operation.

    SQLite admits one writer at a time. Writers of this process queue on an asyncio lock
    (first come, first served, holding no connection while they wait) rather than in
    SQLite's busy handler, whose sleeps would stretch their latency; writers in other
    processes still wait on the busy timeout.

    Writes that arrive while another is in flight are committed together (group commit):
    the next writer to get the lock takes every write waiting then (up to ``_GROUP_MAX``),
    and the worker thread runs them in their order, each inside a savepoint, in one
    ``BEGIN IMMEDIATE`` ... ``COMMIT``: one hop, one checkout and one commit (the fsync)
    for the group. A write that fails is rolled back to its savepoint alone; the others
    still commit. Each caller gets its own outcome only once the group has committed; if
    the COMMIT fails, every write of the group fails with it and none is kept.

    A cancelled caller does not stop the worker thread: the connection (and the lock) are
    held until the thread has finished with it. The thread checks between statements and
    before it releases a write's savepoint (or, for a write alone, before COMMIT) whether
    the write's caller is gone, and then rolls that write back instead.
    """

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        if mode == "read":
            return await self._run_read(program, operation)
        writers = _writers(self.engine)
        if self._watched():
            async with writers.lock:
                return await self._run_watched(program, mode, operation)
        job = _Job(program)
        writers.pending.append(job)
        with translated(operation):
            try:
                async with writers.lock:
                    while not job.taken:  # no one has taken it into their group: lead one
                        await self._run_group(writers, job)
            except BaseException:
                if not job.taken:
                    writers.pending.remove(job)
                elif not job.finished:
                    job.abandoned = True
                raise
            value: T = job.outcome()
            return value

    async def _run_read(self, program: Program[T], operation: str) -> T:
        if self._watched():
            return await self._run_watched(program, "read", operation)
        with translated(operation, writes=False):
            job = _Job(program)
            await self._run_hop(_drive_read, [job], job)
            value: T = job.outcome()
            return value

    async def _run_group(self, writers: _Writers, leader: _Job) -> None:
        """Commit the waiting writes (``leader``'s among them) in one transaction."""
        await self._run_hop(_drive_group, writers, leader)

    async def _run_hop(self, drive: Callable[..., None], jobs: Any, own: _Job) -> None:
        """Run ``drive`` on a pooled connection in the worker thread, for ``jobs`` (a list,
        or the ``_Writers`` whose waiting writes are taken once the connection is out).

        The group's writes the thread never started (the transaction was lost under an
        earlier one, or the group never reached the thread) go back to the queue, for their
        callers to commit in a group of their own. On any failure ``own`` (the caller's
        job) is abandoned, the connection is restored or terminated, and the exception
        raised once the thread has finished; writes it left without an outcome get it.
        """
        fairy = await self._checkout()
        driver: Any = fairy.driver_connection
        batch: list[_Job] = jobs.take() if isinstance(jobs, _Writers) else jobs
        hop = _Hop()
        try:
            await aiosqlite_execute(driver, drive, aiosqlite_connection(driver), batch, hop)
        except BaseException as exc:
            own.abandoned = True
            if hop.done and hop.clean:  # the thread finished, outside any transaction
                await self._checkin(fairy)
            elif hop.done or isinstance(exc, Exception):
                # It left a transaction it could not end, or the group never reached the
                # thread (a closed connection): terminate the connection.
                await _to_the_end(self._recover(fairy, exc, None))
            else:  # cancelled while the thread may still run the group: wait for it
                await _to_the_end(self._recover(fairy, exc, _sqlite_restore))
            self._requeue(jobs, batch)
            for job in batch:
                if job.started and not job.finished:
                    job.error = exc if isinstance(exc, Exception) else _Abandoned()
            raise
        if not hop.clean:  # pragma: no cover - the thread always ends its transaction
            await _to_the_end(self._recover(fairy, None, _sqlite_restore))
        else:
            await self._checkin(fairy)
        self._requeue(jobs, batch)

    @staticmethod
    def _requeue(jobs: Any, batch: list[_Job]) -> None:
        if isinstance(jobs, _Writers):
            jobs.put_back([j for j in batch if not (j.started or j.finished or j.abandoned)])


async def _sqlite_restore(driver: Any) -> bool:
    # The worker thread runs its queue in order: this runs once the program in flight has
    # finished with the connection.
    return bool(await aiosqlite_execute(driver, _end_transaction, aiosqlite_connection(driver)))


def _end_transaction(db: sqlite3.Connection) -> bool:
    """Roll back an open transaction; return whether the connection is outside one."""
    if db.in_transaction:
        db.rollback()
    return not db.in_transaction


def _drive_program(db: sqlite3.Connection, job: _Job) -> Any:
    """Run one program's statements and return its value (in the worker thread)."""
    program = job.program
    job.started = True
    try:
        query = program.send(None)  # type: ignore[arg-type]
        while True:
            if job.abandoned:
                raise _Abandoned
            stmt = query.stmt
            if query.many:
                params: Any = [stmt.bind(p) for p in query.params]
                cursor = db.executemany(stmt.sql, params)
                result = Result([], cursor.rowcount)
            else:
                params = stmt.bind(query.params)
                cursor = db.execute(stmt.sql, params)
                rows = cursor.fetchall() if stmt.returns_rows else []
                result = Result(stmt.decode(rows), cursor.rowcount)
            query = program.send(result)
    except StopIteration as stop:
        if job.abandoned:
            raise _Abandoned from None
        return stop.value


def _commit_left_open(db: sqlite3.Connection) -> None:
    """Commit a transaction the connection came out of the pool with (in the worker thread).

    The runner leaves none, but a pool listener that writes through the DBAPI connection
    does (``sqlite3`` begins one before a data change, and nothing ends it). It is committed,
    as SQLAlchemy's own ``Connection`` would commit it with its first transaction, so the
    listener's work is kept and the operation starts outside any transaction."""
    if db.in_transaction:
        db.commit()


def _drive_read(db: sqlite3.Connection, jobs: list[_Job], hop: _Hop) -> None:
    """Run a read program outside any transaction (in the worker thread)."""
    (job,) = jobs
    try:
        _commit_left_open(db)
        job.value.append(_drive_program(db, job))
    except Exception as exc:
        job.error = exc
    finally:
        _left(db, hop)


def _drive_group(db: sqlite3.Connection, jobs: list[_Job], hop: _Hop) -> None:
    """Run write programs in one transaction and set each one's outcome (in the worker
    thread). A program alone runs in the transaction itself; in a group each runs inside a
    savepoint, so that one failing is rolled back alone. Values are given out only once
    COMMIT has returned. When the transaction cannot begin (another process held the
    write lock past the busy timeout), every write gets that error. When it is lost under a
    write (SQLite rolls the whole transaction back on some errors, e.g. a full disk), the
    writes run in it get that error, and those not started yet are left without an
    outcome, for the event loop to queue again.
    """
    alone = len(jobs) == 1
    done: list[tuple[_Job, Any]] = []
    began = False
    try:
        _commit_left_open(db)
        # Take the write lock up front: writers in other processes queue on busy_timeout
        # instead of failing with "database is locked" when a read lock cannot be upgraded.
        db.execute("BEGIN IMMEDIATE")
        began = True
        for job in jobs:
            if job.abandoned:
                continue
            if not alone:
                db.execute("SAVEPOINT ds_write")
            try:
                value = _drive_program(db, job)
            except Exception as exc:
                if alone or not db.in_transaction:
                    raise
                db.execute("ROLLBACK TO ds_write")
                db.execute("RELEASE ds_write")
                job.error = exc
                continue
            if not alone:
                db.execute("RELEASE ds_write")
            done.append((job, value))
        db.commit()
        for job, value in done:  # before the event loop can see hop.done
            job.value.append(value)
    except Exception as exc:
        # Nothing of the transaction is kept: every write run in it fails with this error,
        # and every write of the group when the transaction could not begin.
        for job in jobs:
            if (job.started or not began) and not job.finished:
                job.error = exc
    finally:
        _left(db, hop)


def _left(db: sqlite3.Connection, hop: _Hop) -> None:
    """Whatever happened (an error, a failed COMMIT, an abandoned program), the connection
    leaves the thread outside any transaction, or says it could not."""
    try:
        hop.clean = _end_transaction(db)
    except sqlite3.Error:
        hop.clean = False
    hop.done = True


_PG_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""Every transaction of the store runs at READ COMMITTED, whatever the database's default:
its writes re-check their guards on the row version they find (a loser gets
StaleSessionError), where REPEATABLE READ or SERIALIZABLE would fail concurrent appends to one
session with serialization errors."""


PG_READ_COMMITTED = "durable_sessions_read_committed"
"""Key of the pool record's ``info``: whether that connection's transactions start at READ
COMMITTED (cleared with the rest of ``info`` when the pool reconnects)."""


async def _pg_default_is_read_committed(fairy: Any) -> bool:
    """Whether the connection's implicit transactions run at READ COMMITTED, as Postgres's
    do unless ``default_transaction_isolation`` is set (for the server, the database, the
    role or the connection). Asked once per connection."""
    known: bool | None = fairy.info.get(PG_READ_COMMITTED)
    if known is None:
        level = await fairy.driver_connection.fetchval("SHOW default_transaction_isolation")
        # Postgres runs READ UNCOMMITTED as READ COMMITTED.
        known = fairy.info[PG_READ_COMMITTED] = level in ("read committed", "read uncommitted")
    return known


class PostgresRunner(Runner):
    """Runs each query as one asyncpg round trip; multi-statement writes in a transaction.

    BEGIN and COMMIT are sent as statements of their own rather than through
    ``driver.transaction()``, whose BEGIN a cancellation can interrupt before there is a
    transaction to exit: after a failure the driver says whether one is open.

    Transactions are READ COMMITTED (``_PG_BEGIN``). On a database whose default isolation
    is another level, a single statement would run at that level in its implicit
    transaction: there every operation gets an explicit READ COMMITTED transaction (a BEGIN
    and a COMMIT round trip more), and on the default Postgres setup none does. Which is
    the case is asked once per connection (``PG_READ_COMMITTED``).
    """

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        if self._watched():
            return await self._run_watched(program, mode, operation)
        with translated(operation, writes=mode != "read"):
            fairy = await self._checkout()
            driver: Any = fairy.driver_connection
            # Open already only when a pool listener left it: a failure from here rolls it back.
            began = driver.is_in_transaction()
            try:
                if began:
                    await _pg_commit_left_open(fairy)
                    began = False
                if mode == "write" or not (
                    # known for this connection (the common case): no coroutine to await
                    fairy.info.get(PG_READ_COMMITTED) or await _pg_default_is_read_committed(fairy)
                ):
                    began = True
                    await driver.execute(_PG_BEGIN)
                    result = await self._drive(driver, program)
                    await driver.execute("COMMIT")
                else:
                    result = await self._drive(driver, program)
            except BaseException as exc:
                await self._after_failure(fairy, exc, began)
                raise
            if driver.is_in_transaction():  # pragma: no cover - COMMIT returned: it ended
                await self._after_failure(fairy, None, True)
            else:
                await self._checkin(fairy)
            return result

    async def _after_failure(self, fairy: Any, exc: BaseException | None, began: bool) -> None:
        driver: Any = fairy.driver_connection
        if exc is not None and is_disconnect(exc):
            self._invalidate_pool(fairy, exc)
            await self._checkin(fairy)
        elif (
            began
            or not isinstance(exc, Exception)  # a cancellation: a statement may be in flight
            or is_timeout(exc)  # the driver's timeout: its cancellation of one is in flight
            or driver.is_in_transaction()
            or driver.is_closed()
        ):
            restore = _pg_rollback if began else _pg_settle
            await _to_the_end(self._recover(fairy, exc, restore))
        else:  # an error, after the statement ended, outside any transaction: nothing to undo
            await self._checkin(fairy)

    def _invalidate_pool(self, raw: Any, exc: BaseException) -> None:
        """After a disconnect, retire every pooled connection made before it, as SQLAlchemy
        does for statements it runs itself (a restarted server dropped them all)."""
        invalidate_pool(self.engine.sync_engine.pool, raw, exc)

    @staticmethod
    async def _drive(driver: Any, program: Program[T]) -> T:
        try:
            query = program.send(None)  # type: ignore[arg-type]
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        while True:
            stmt = query.stmt
            if query.many:
                params: Any = [stmt.bind(p) for p in query.params]
                await driver.executemany(stmt.sql, params)
                result = Result([], len(params))
            elif stmt.returns_rows:
                params = stmt.bind(query.params)
                records = await driver.fetch(stmt.sql, *params)
                rows = stmt.decode(records)
                # The records go once decoded: the driver's future holds this same list until
                # the event loop's next turn, and the program may go on for long (a decode).
                records.clear()
                result = Result(rows, len(rows))
            else:
                params = stmt.bind(query.params)
                status = await driver.execute(stmt.sql, *params)
                tail = status.rsplit(" ", 1)[-1]
                result = Result([], int(tail) if tail.isdigit() else -1)
            try:
                query = program.send(result)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


async def _pg_commit_left_open(fairy: Any) -> None:
    """Commit the transaction that a pooled connection came out of the pool with.

    The runner leaves no transaction open, but a pool listener (``checkout``, ``reset``,
    ``checkin``) that runs a statement through the DBAPI connection does: SQLAlchemy's
    asyncpg adapter begins a transaction for it, and nothing ends it. SQLAlchemy's own
    ``Connection`` would carry on inside it and commit it with its first transaction; here it
    is committed first (through the adapter, whose bookkeeping then agrees), so the listener's
    work and settings are kept, and the operation runs outside any transaction as on any
    other connection: without this, a single-statement write would run inside it and be
    rolled back on return, lost.
    """
    await greenlet_spawn(fairy.dbapi_connection.commit)
    driver = fairy.driver_connection
    if driver.is_in_transaction():  # begun on the driver itself, not through the adapter
        await driver.execute("COMMIT")


async def _pg_settle(driver: Any) -> bool:
    """No transaction was begun: wait until the server has acknowledged the cancellation
    of a statement in flight, if any, so that the connection goes back to the pool idle.

    (The next user would wait for it too, but asyncpg 0.31 and earlier share that wait between
    users: cancelling one of them then raises CancelledError in the next, uncancelled one.)
    """
    if driver.is_closed():
        return False
    await asyncio.wait_for(driver.execute("SELECT 1"), _SETTLE_TIMEOUT)
    if driver.is_in_transaction():  # pragma: no cover - nothing here begins one
        return await _pg_rollback(driver)
    return not driver.is_closed()


async def _pg_rollback(driver: Any) -> bool:
    """End the transaction that is open, or that a BEGIN in flight may have opened (after
    the server has acknowledged the cancellation of a statement in flight, if any)."""
    if driver.is_closed():
        return False
    await asyncio.wait_for(driver.execute("ROLLBACK"), _SETTLE_TIMEOUT)
    return not driver.is_closed() and not driver.is_in_transaction()


async def _drive_watched(conn: AsyncConnection, program: Program[T]) -> T:
    """Drive ``program`` through SQLAlchemy's execution layer (``exec_driver_sql``)."""
    try:
        query = program.send(None)  # type: ignore[arg-type]
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    while True:
        stmt = query.stmt
        if query.many:
            batch = [stmt.bind(p) for p in query.params]
            await _settled(conn, conn.exec_driver_sql(stmt.sql, batch))
            result = Result([], len(batch))
        else:
            found = await _settled(conn, conn.exec_driver_sql(stmt.sql, stmt.bind(query.params)))
            if stmt.returns_rows:
                rows = [tuple(row) for row in found.fetchall()]
                result = Result(stmt.decode(rows), len(rows))
            else:
                result = Result([], found.rowcount)
        try:
            query = program.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


class TransactionConnection:
    """The connection of a ``write_transaction``: what the imports need of ``AsyncConnection``.

    On SQLite each statement runs to its end even if the caller is cancelled meanwhile; the
    cancellation is raised once it has finished, and the transaction then rolls back. A
    statement abandoned in flight would make SQLAlchemy terminate the connection, which for
    aiosqlite can stop its worker thread with the sqlite3 connection, its transaction and
    SQLite's write lock still open. (SQLite statements do not wait on other writers here:
    the transaction holds the write lock from its start.) On Postgres a cancellation
    interrupts the statement and the connection is terminated, as SQLAlchemy does.
    """

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.dialect = conn.dialect

    async def execute(self, statement: Any, parameters: Any = None) -> CursorResult[Any]:
        """``AsyncConnection.execute``."""
        return await _settled(self.conn, self.conn.execute(statement, parameters))

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> CursorResult[Any]:
        """``AsyncConnection.exec_driver_sql``."""
        return await _settled(self.conn, self.conn.exec_driver_sql(statement, parameters))


def _settled(conn: AsyncConnection, aw: Awaitable[T]) -> Awaitable[T]:
    """``aw`` run to its end despite a cancellation on SQLite (see ``TransactionConnection``)."""
    return _to_the_end(aw) if conn.dialect.name == "sqlite" else aw


@asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[TransactionConnection]:
    """A connection of ``engine`` inside one write transaction, for work too large for one
    program (the imports); committed when the block ends normally.

    On SQLite the transaction starts with ``BEGIN IMMEDIATE``, once this process's other
    writers to the engine have finished (the store's writers queue on the same lock). On
    any other exit (an error, or a cancellation at any await, the commit's included) the
    transaction is rolled back and the connection checked in, or terminated when that
    cannot be done, in a step that a further cancellation cannot interrupt; the exception
    is re-raised unchanged.
    """
    if engine.dialect.name == "sqlite":
        async with _write_lock(engine), _transaction(engine, True) as conn:
            yield TransactionConnection(conn)
    else:
        async with _transaction(engine, True) as conn:
            yield TransactionConnection(conn)


@asynccontextmanager
async def _transaction(engine: AsyncEngine, write: bool) -> AsyncIterator[AsyncConnection]:
    """A connection through SQLAlchemy's execution layer: in a write transaction (committed
    at the end) when ``write``; abandoned by ``_abandon_watched`` on any other exit."""
    task = asyncio.current_task()
    requests = _cancel_requests(task)
    conn = engine.connect()
    await conn.start()
    if _cancel_requests(task) > requests:
        await _deliver_swallowed_cancel(lambda: _to_the_end(conn.close()))
    try:
        await pin_read_committed(conn)  # as the fast path's transactions (_PG_BEGIN)
        if write:
            await conn.begin()
            if engine.dialect.name == "sqlite":
                await _settled(conn, conn.exec_driver_sql("BEGIN IMMEDIATE"))
        yield conn
        if write:
            await _settled(conn, conn.commit())
    except BaseException as exc:
        await _to_the_end(_abandon_watched(conn, exc))
        raise
    await _to_the_end(conn.close())


async def _abandon_watched(conn: AsyncConnection, exc: BaseException) -> None:
    """After a failure through SQLAlchemy's execution layer: leave the connection outside
    any transaction and close it, or terminate it.

    On SQLite a statement cancelled on the event loop still runs to its end in aiosqlite's
    worker thread, which runs its queue in order: a rollback queued behind it ends the
    transaction (and frees SQLite's write lock) whatever the failure was. (Terminating
    there would not: SQLAlchemy's terminate of an aiosqlite connection can leave the
    sqlite3 connection, and its lock, open.) On Postgres an error is rolled back; after a
    cancellation a statement may still be in flight, so the connection is terminated.
    """
    if conn.dialect.name == "sqlite" and not conn.invalidated:
        try:
            raw = await conn.get_raw_connection()
            if await _sqlite_restore(raw.driver_connection):
                await conn.rollback()  # SQLAlchemy's side: nothing is left to roll back
                await conn.close()
                return
        except Exception:
            pass  # terminated below
    try:
        if isinstance(exc, Exception) and not conn.invalidated:
            await conn.rollback()
            await conn.close()
            return
    except Exception:
        pass
    try:
        if not conn.invalidated:
            await conn.invalidate(exc if isinstance(exc, Exception) else None)
    finally:
        await conn.close()


def make_runner(engine: AsyncEngine) -> Runner:
    """Return the runner for the engine's driver (aiosqlite or asyncpg)."""
    if engine.dialect.name == "sqlite":
        return SQLiteRunner(engine)
    return PostgresRunner(engine)
