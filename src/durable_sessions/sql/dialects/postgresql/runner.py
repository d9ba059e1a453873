"""The Postgres runner: one asyncpg round trip a query, multi-statement writes in a transaction."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ...._tasks import to_the_end
from ..._private import greenlet_spawn, invalidate_pool
from ...runner import Mode, Program, Result, Runner
from ...transactions import run_watched
from ...translate import is_disconnect, is_timeout, translated

__all__ = ["PG_READ_COMMITTED", "PostgresRunner"]

T = TypeVar("T")

_SETTLE_TIMEOUT = 10.0
"""How long the cleanup after a failure may wait for the server (the acknowledgement of a
cancelled statement, then ROLLBACK) before it terminates the connection instead."""


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
            return await run_watched(self.engine, program, mode, operation)
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
            await to_the_end(self._recover(fairy, exc, restore))
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
