"""What every runner shares: the query a program yields, its result, and the pooled connection.

An operation is written once, as a generator that yields queries and receives their results
(``Program``). A runner drives it on one driver (``dialects/sqlite/runner.py``: the whole
program in aiosqlite's worker thread in one hop; ``dialects/postgresql/runner.py``: one
asyncpg round trip per query); ``transactions.py`` holds the path through SQLAlchemy's own
execution layer. Driver errors become the library's errors in ``translate``, the one map.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from .._tasks import to_the_end
from ._private import (
    checkin_reset,
    checkin_without_io,
    checkout_without_io,
    engine_has_events,
    greenlet_spawn,
)
from .compiled import Compiled

__all__ = [
    "RESTART",
    "Mode",
    "Program",
    "Query",
    "Result",
    "Runner",
    "cancel_requests",
    "deliver_swallowed_cancel",
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

RESTART = Compiled(
    sql="", names=(), constants=(), binders=(), decoders=(), row=None, returns_rows=False
)
"""A program yields ``Query(RESTART)`` to have its transaction rolled back and begun anew
(MySQL's writes, after a deadlock or a lock wait timeout the runner threw into them)."""


async def drive(
    program: Program[T],
    execute: Callable[[Query], Awaitable[Result]],
    handles: Callable[[Exception], bool],
) -> T:
    """Run ``program`` to its end: each query it yields through ``execute``, its result sent
    back. A failure ``handles`` accepts is thrown into the program (which may retry, or
    raise its own error); any other propagates."""
    try:
        query = program.send(None)  # type: ignore[arg-type]
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    while True:
        try:
            result = await execute(query)
        except Exception as exc:
            if not handles(exc):
                raise
            try:
                query = program.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            continue
        try:
            query = program.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def cancel_requests(task: asyncio.Task[Any] | None) -> int:
    """The cancellations requested of ``task`` and not yet withdrawn (0 before Python 3.11)."""
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


async def deliver_swallowed_cancel(give_back: Callable[[], Awaitable[None]]) -> None:
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

    async def _checkout(self) -> Any:
        """Borrow a pooled connection: the pool's proxy.

        A cancellation while the pool connects is the pool's to clean up; once this has
        returned, nothing awaits before the caller's ``try`` takes the connection over.
        """
        pool = self.engine.sync_engine.pool
        # The pool's next idle connection, when it needs nothing of the driver: taken in
        # plain calls, with no await at which a cancellation could fall.
        fairy = checkout_without_io(pool)
        if fairy is not None:
            return fairy
        task = asyncio.current_task()
        requests = cancel_requests(task)
        # Straight from the pool (its checkout events, pre-ping and reset still apply),
        # without an engine Connection around it: one greenlet hop each way.
        fairy = await greenlet_spawn(self.engine.sync_engine.pool.connect)
        if cancel_requests(task) > requests:
            await deliver_swallowed_cancel(lambda: self._checkin(fairy))
        return fairy

    async def _checkin(self, fairy: Any) -> None:
        """Return a connection that the runner has seen outside any transaction."""
        if not fairy.is_valid:  # terminated (and returned) by _recover
            return
        # The pool's reset still runs (its reset events too), but its rollback is skipped:
        # the runner has checked there is nothing to roll back, and on SQLite that rollback
        # would cost a second thread hop per operation.
        if checkin_without_io(self.engine.sync_engine.pool, fairy):
            checkin_reset(fairy)  # nothing in it reaches the driver: no greenlet, no await
        else:
            # It may await the driver (a pool listener, a commit-on-return, an overflow
            # connection closed): carried to its end, so that a cancellation meanwhile
            # cannot leave the connection neither in the pool nor out of it.
            await to_the_end(greenlet_spawn(checkin_reset, fairy))

    async def _recover(
        self,
        fairy: Any,
        exc: BaseException | None,
        restore: Callable[[Any], Awaitable[bool]] | None,
    ) -> None:
        """After a failure: ``restore`` leaves the driver connection outside any transaction
        and says whether it could; then check the connection in. A connection that could not
        be restored (or with no ``restore``) is terminated instead; the pool replaces it.

        Awaited through ``to_the_end``: a further cancellation does not interrupt it.
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
