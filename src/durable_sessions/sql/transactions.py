"""Work through SQLAlchemy's own execution layer: watched engines, the bulk loaders' transactions.

A store's operations take this path when something listens to the engine's events
(tracing, statement counting), so that each listener gets what SQLAlchemy gives it; the
imports take it for a write transaction too large for one program (``write_transaction``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._tasks import to_the_end
from .dialects.postgresql.isolation import pin_read_committed
from .dialects.sqlite.writers import restore, write_lock
from .runner import (
    RESTART,
    Mode,
    Program,
    Query,
    Result,
    cancel_requests,
    deliver_swallowed_cancel,
    drive,
)
from .translate import translated

__all__ = ["TransactionConnection", "run_watched", "write_transaction"]

T = TypeVar("T")


async def run_watched(engine: AsyncEngine, program: Program[T], mode: Mode, operation: str) -> T:
    """Run ``program`` through SQLAlchemy's own execution layer, statement by statement.

    Taken when something listens to the engine's events: each listener then gets what
    SQLAlchemy gives it (a real cursor and execution context), and a listener's error
    fails the statement, so the transaction rolls back instead of committing. It costs
    SQLAlchemy's per-statement work (and, on SQLite, a thread hop per statement). A
    failure or cancellation rolls back, or terminates the connection when it cannot.
    """
    with translated(operation, writes=mode != "read"):
        async with _transaction(engine, mode != "read") as conn:
            return await _drive_watched(conn, program)


async def _drive_watched(conn: AsyncConnection, program: Program[T]) -> T:
    """Drive ``program`` through SQLAlchemy's execution layer (``exec_driver_sql``)."""

    def handles(exc: Exception) -> bool:
        # MySQL's programs handle some driver errors (a duplicate key, a deadlock to
        # retry), as its runner lets them.
        return (
            isinstance(exc, sa_exc.DBAPIError)
            and conn.dialect.name in ("mysql", "mariadb")
            and not conn.invalidated
        )

    return await drive(program, lambda query: _run_watched_query(conn, query), handles)


async def _run_watched_query(conn: AsyncConnection, query: Query) -> Result:
    stmt = query.stmt
    if stmt is RESTART:
        await conn.rollback()
        await conn.begin()
        return Result([], 0)
    if query.many:
        batch = [stmt.bind(p) for p in query.params]
        await _settled(conn, conn.exec_driver_sql(stmt.sql, batch))
        return Result([], len(batch))
    found = await _settled(conn, conn.exec_driver_sql(stmt.sql, stmt.bind(query.params)))
    if stmt.returns_rows:
        rows = [tuple(row) for row in found.fetchall()]
        return Result(stmt.decode(rows), len(rows))
    return Result([], found.rowcount)


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
    return to_the_end(aw) if conn.dialect.name == "sqlite" else aw


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
        async with write_lock(engine), _transaction(engine, True) as conn:
            yield TransactionConnection(conn)
    else:
        async with _transaction(engine, True) as conn:
            yield TransactionConnection(conn)


@asynccontextmanager
async def _transaction(engine: AsyncEngine, write: bool) -> AsyncIterator[AsyncConnection]:
    """A connection through SQLAlchemy's execution layer: in a write transaction (committed
    at the end) when ``write``; abandoned by ``_abandon_watched`` on any other exit."""
    task = asyncio.current_task()
    requests = cancel_requests(task)
    conn = engine.connect()
    await conn.start()
    if cancel_requests(task) > requests:
        await deliver_swallowed_cancel(lambda: to_the_end(conn.close()))
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
        await to_the_end(_abandon_watched(conn, exc))
        raise
    await to_the_end(conn.close())


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
            if await restore(raw.driver_connection):
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
