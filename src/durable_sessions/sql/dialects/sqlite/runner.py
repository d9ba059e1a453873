"""The SQLite runner: a whole program in aiosqlite's worker thread, writes committed in groups."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ...._tasks import to_the_end
from ..._private import aiosqlite_connection, aiosqlite_execute
from ...runner import Mode, Program, Result, Runner
from ...transactions import run_watched
from ...translate import translated
from .writers import Hop, Job, Writers, end_transaction, restore, writers_of

__all__ = ["SQLiteRunner"]

T = TypeVar("T")


class _Abandoned(Exception):
    """The caller stopped waiting (cancelled) before the program committed."""


class SQLiteRunner(Runner):
    """Runs a whole program in aiosqlite's worker thread: one thread hop per operation.

    SQLite admits one writer at a time. Writers of this process queue on an asyncio lock
    (first come, first served, holding no connection while they wait) rather than in
    SQLite's busy handler, whose sleeps would stretch their latency; writers in other
    processes still wait on the busy timeout.

    Writes that arrive while another is in flight are committed together (group commit):
    the next writer to get the lock takes every write waiting then (up to ``GROUP_MAX``),
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
        writers = writers_of(self.engine)
        if self._watched():
            async with writers.lock:
                return await run_watched(self.engine, program, mode, operation)
        job = Job(program)
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
            return await run_watched(self.engine, program, "read", operation)
        with translated(operation, writes=False):
            job = Job(program)
            await self._run_hop(_drive_read, [job], job)
            value: T = job.outcome()
            return value

    async def _run_group(self, writers: Writers, leader: Job) -> None:
        """Commit the waiting writes (``leader``'s among them) in one transaction."""
        await self._run_hop(_drive_group, writers, leader)

    async def _run_hop(self, drive: Callable[..., None], jobs: Any, own: Job) -> None:
        """Run ``drive`` on a pooled connection in the worker thread, for ``jobs`` (a list,
        or the ``Writers`` whose waiting writes are taken once the connection is out).

        The group's writes the thread never started (the transaction was lost under an
        earlier one, or the group never reached the thread) go back to the queue, for their
        callers to commit in a group of their own. On any failure ``own`` (the caller's
        job) is abandoned, the connection is restored or terminated, and the exception
        raised once the thread has finished; writes it left without an outcome get it.
        """
        fairy = await self._checkout()
        driver: Any = fairy.driver_connection
        batch: list[Job] = jobs.take() if isinstance(jobs, Writers) else jobs
        hop = Hop()
        try:
            await aiosqlite_execute(driver, drive, aiosqlite_connection(driver), batch, hop)
        except BaseException as exc:
            own.abandoned = True
            if hop.done and hop.clean:  # the thread finished, outside any transaction
                await self._checkin(fairy)
            elif hop.done or isinstance(exc, Exception):
                # It left a transaction it could not end, or the group never reached the
                # thread (a closed connection): terminate the connection.
                await to_the_end(self._recover(fairy, exc, None))
            else:  # cancelled while the thread may still run the group: wait for it
                await to_the_end(self._recover(fairy, exc, restore))
            self._requeue(jobs, batch)
            for job in batch:
                if job.started and not job.finished:
                    job.error = exc if isinstance(exc, Exception) else _Abandoned()
            raise
        if not hop.clean:  # pragma: no cover - the thread always ends its transaction
            await to_the_end(self._recover(fairy, None, restore))
        else:
            await self._checkin(fairy)
        self._requeue(jobs, batch)

    @staticmethod
    def _requeue(jobs: Any, batch: list[Job]) -> None:
        if isinstance(jobs, Writers):
            jobs.put_back([j for j in batch if not (j.started or j.finished or j.abandoned)])


def _drive_program(db: sqlite3.Connection, job: Job) -> Any:
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


def _drive_read(db: sqlite3.Connection, jobs: list[Job], hop: Hop) -> None:
    """Run a read program outside any transaction (in the worker thread)."""
    (job,) = jobs
    try:
        _commit_left_open(db)
        job.value.append(_drive_program(db, job))
    except Exception as exc:
        job.error = exc
    finally:
        _left(db, hop)


def _drive_group(db: sqlite3.Connection, jobs: list[Job], hop: Hop) -> None:
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
    done: list[tuple[Job, Any]] = []
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


def _left(db: sqlite3.Connection, hop: Hop) -> None:
    """Whatever happened (an error, a failed COMMIT, an abandoned program), the connection
    leaves the thread outside any transaction, or says it could not."""
    try:
        hop.clean = end_transaction(db)
    except sqlite3.Error:
        hop.clean = False
    hop.done = True
