"""The MySQL runner: one asyncmy round trip a query, writes in a READ COMMITTED transaction."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ...._tasks import to_the_end
from ..._private import invalidate_pool
from ...runner import RESTART, Mode, Program, Query, Result, Runner, drive
from ...transactions import run_watched
from ...translate import is_disconnect, translated

__all__ = ["RESTART", "MySQLRunner"]

T = TypeVar("T")

_SETTLE_TIMEOUT = 10.0
"""How long the cleanup after a failure may wait for the server's ROLLBACK before it
terminates the connection instead."""

_ISOLATION = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
"""Every write transaction of the store runs at READ COMMITTED, whatever the server's
default (InnoDB's is REPEATABLE READ): writes lock the session row first and read what
committed before them, where REPEATABLE READ would read an older snapshot."""


class MySQLRunner(Runner):
    """Runs each query as one asyncmy round trip.

    Writes (and the single-statement ``atomic`` ones) run in one transaction at READ
    COMMITTED, which their first statement begins (``SET TRANSACTION`` names the level of
    the next transaction; the COMMIT or ROLLBACK that ends it restores the session's).
    Reads run in the implicit transaction the driver's connection opens (autocommit off,
    as SQLAlchemy leaves it), one consistent snapshot for the program's statements, ended
    by a ROLLBACK. A driver error a statement raises is thrown into the program, which may
    handle it (a duplicate key, a deadlock to retry) or let it go. After any other exit
    the transaction is rolled back, or the connection terminated when that cannot be done
    (a cancellation while a statement may be in flight). A lost connection retires every
    pooled connection made before it, as SQLAlchemy does for the statements it runs
    itself: a restarted server dropped them all.
    """

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        if self._watched():
            return await run_watched(self.engine, program, mode, operation)
        with translated(operation, writes=mode != "read"):
            fairy = await self._checkout()
            driver: Any = fairy.driver_connection
            try:
                if driver.get_transaction_status():  # left open by a pool listener
                    await driver.commit()
                if mode == "read":
                    result = await self._drive(driver, program)
                    if driver.get_transaction_status():
                        await driver.rollback()
                else:
                    await _begin(driver)
                    result = await self._drive(driver, program)
                    await driver.commit()
            except BaseException as exc:
                await self._after_failure(fairy, exc)
                raise
            await self._checkin(fairy)
            return result

    async def _after_failure(self, fairy: Any, exc: BaseException) -> None:
        if isinstance(exc, Exception) and is_disconnect(exc):
            invalidate_pool(self.engine.sync_engine.pool, fairy, exc)  # this one included
            await self._checkin(fairy)
        elif isinstance(exc, Exception):
            await to_the_end(self._recover(fairy, exc, _rollback))
        else:  # a cancellation: a statement may be in flight
            await to_the_end(self._recover(fairy, exc, None))

    @staticmethod
    async def _drive(driver: Any, program: Program[T]) -> T:
        async def execute(query: Query) -> Result:
            if query.stmt is RESTART:
                await driver.rollback()
                await _begin(driver)
                return Result([], 0)
            return await _execute(driver, query)

        # A driver error the program may handle (a duplicate key, a deadlock to retry) is
        # thrown into it; a broken connection is not.
        return await drive(program, execute, lambda exc: not is_disconnect(exc))


async def _begin(driver: Any) -> None:
    """Have the connection's next transaction run at READ COMMITTED: its first statement
    begins it (autocommit is off), so no ``BEGIN`` costs a round trip of its own."""
    async with driver.cursor() as cursor:
        await cursor.execute(_ISOLATION)


async def _execute(driver: Any, query: Query) -> Result:
    stmt = query.stmt
    async with driver.cursor() as cursor:
        if query.many:
            params: Any = [stmt.bind(p) for p in query.params]
            if params:
                await cursor.executemany(stmt.sql, params)
            return Result([], len(params))
        await cursor.execute(stmt.sql, stmt.bind(query.params))
        if stmt.returns_rows:
            rows = await cursor.fetchall()
            return Result(stmt.decode(rows), len(rows))
        return Result([], cursor.rowcount)


async def _rollback(driver: Any) -> bool:
    """End the transaction that is open, if any; say whether the connection is clean."""
    await asyncio.wait_for(driver.rollback(), _SETTLE_TIMEOUT)
    return not driver.get_transaction_status()
