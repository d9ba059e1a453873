"""The private APIs of SQLAlchemy and aiosqlite that durable-sessions relies on, checked once.

The hot paths skip layers of SQLAlchemy and aiosqlite (see ``runner.py``), which means
using a few names those projects do not promise to keep. Importing this module checks that
every one of them exists in the installed versions, and raises ``ImportError`` naming what
is missing and the versions checked, instead of failing later with an ``AttributeError`` in
the middle of an operation, or worse, a wrong result. The accessors below are the one place
that reaches for them.

The versions tested are the ranges in ``pyproject.toml`` (``nox -s lowest newest`` runs the
whole suite on both ends).
"""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import sqlalchemy
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, QueuePool, SingletonThreadPool, StaticPool
from sqlalchemy.pool.base import _ConnectionFairy, reset_none, reset_rollback
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.util.queue import AsyncAdaptedQueue

__all__ = [
    "RETURNED",
    "TESTED",
    "aiosqlite_connection",
    "aiosqlite_execute",
    "check",
    "checkin_reset",
    "checkin_without_io",
    "checkout_without_io",
    "engine_has_events",
    "greenlet_spawn",
    "invalidate_pool",
    "returning_columns",
]

TESTED = "SQLAlchemy 2.0.30 to 2.1.x, aiosqlite 0.20 to 0.22"
"""The versions whose private APIs the suite runs on (the bounds in pyproject.toml)."""


def _installed(distribution: str) -> str:
    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:  # pragma: no cover - vendored or renamed
        return f"{distribution} (version unknown)"


def _aiosqlite() -> Any:
    try:
        import aiosqlite
    except ImportError:
        return None  # the 'sqlite' extra is not installed: no SQLite engine can run
    return aiosqlite


def check() -> None:
    """Check that every private API used exists in the installed versions.

    Raises:
        ImportError: Something is missing; the message names it, the installed versions
            and the tested range.
    """
    missing: list[str] = []
    checked = [_installed("SQLAlchemy")]
    from sqlalchemy import util

    if not callable(getattr(util, "greenlet_spawn", None)):
        missing.append("sqlalchemy.util.greenlet_spawn")
    if not callable(getattr(Pool, "_invalidate", None)):
        missing.append("sqlalchemy.pool.Pool._invalidate")
    if not callable(getattr(_ConnectionFairy, "_close_special", None)):
        missing.append("sqlalchemy.pool.base._ConnectionFairy._close_special")
    if not hasattr(Engine, "_has_events"):
        missing.append("sqlalchemy.engine.Engine._has_events")
    if not hasattr(UpdateBase, "_returning"):
        missing.append("sqlalchemy.sql.dml.UpdateBase._returning (statement._returning)")
    aiosqlite = _aiosqlite()
    if aiosqlite is not None:
        checked.append(_installed("aiosqlite"))
        connection = getattr(aiosqlite, "Connection", None)
        if not callable(getattr(connection, "_execute", None)):
            missing.append("aiosqlite.Connection._execute")
        if not hasattr(connection, "_conn"):
            missing.append("aiosqlite.Connection._conn")
    if missing:
        raise ImportError(
            "durable-sessions relies on private APIs that the installed "
            f"{' and '.join(checked)} do not have: {', '.join(missing)}. It is tested with "
            f"{TESTED}; install versions in that range (pip install 'durable-sessions[sqlite]' "
            "picks them)."
        )


check()


def greenlet_spawn(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run sync SQLAlchemy code that awaits the driver: ``sqlalchemy.util.greenlet_spawn``'s
    contract, in a greenlet kept from an earlier call of this thread where there is one.

    SQLAlchemy makes a new greenlet for every call, and its first switch costs more than
    the pool checkout it runs (on Postgres, a checkout and check-in took 14.5 µs that way
    and 6.1 µs here in a hot loop; a 2-item ``append_events`` went from 331 to 292 µs of
    client CPU). Here a finished call's greenlet waits for the next one instead
    (``_ReusedGreenlet``); everything else is as SQLAlchemy does it: ``fn`` runs in the
    caller's context (its context variables), each driver await inside it is awaited by
    the caller, a cancellation or error of that await is thrown in at the same point, and
    what ``fn`` returns or raises is the call's. Where SQLAlchemy's own ``await_`` would not
    accept such a greenlet (``_REUSABLE`` is False: checked once, at import), each call
    goes to ``sqlalchemy.util.greenlet_spawn``.
    """
    if _REUSABLE:
        return _spawn_reused(fn, args)
    spawn: Callable[..., Awaitable[Any]] = sqlalchemy.util.greenlet_spawn
    return spawn(fn, *args)


def _greenlet_module() -> Any:
    """The ``greenlet`` package (untyped), or None where it is not installed."""
    try:
        return importlib.import_module("greenlet")
    except ImportError:  # pragma: no cover - SQLAlchemy's asyncio extra installs it
        return None


_greenlets: Any = _greenlet_module()


def _await_provider() -> type | None:
    """SQLAlchemy's greenlet class, whose instances its ``await_`` switches out of: made
    lazily by ``sqlalchemy.util.concurrency._concurrency_shim`` on 2.1,
    ``sqlalchemy.util._concurrency_py3k._AsyncIoGreenlet`` on 2.0. None if not found."""
    try:
        from sqlalchemy.util import concurrency

        shim = getattr(concurrency, "_concurrency_shim", None)
        if shim is not None:
            found = shim._AsyncIoGreenlet
        else:  # SQLAlchemy 2.0
            from sqlalchemy.util import _concurrency_py3k  # type: ignore[attr-defined]

            found = _concurrency_py3k._AsyncIoGreenlet
    except Exception:  # a module or name gone, greenlet missing: SQLAlchemy's way then
        return None
    if _greenlets is None or not isinstance(found, type):
        return None
    return found if issubclass(found, _greenlets.greenlet) else None


class _Finished:
    """What a reused greenlet's call ended with: its value, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


_IDLE_MAX = 64
"""Greenlets kept waiting for a call, per thread: as many as calls that awaited at once."""

_idle = threading.local()


def _idle_greenlets() -> list[Any]:
    kept: list[Any] | None = getattr(_idle, "greenlets", None)
    if kept is None:
        kept = _idle.greenlets = []
    return kept


_Provider: Any = _await_provider()

if _Provider is not None:

    class _ReusedGreenlet(_Provider):  # type: ignore[misc]
        """A greenlet that SQLAlchemy's ``await_`` switches out of, running one call after
        another: after each, it hands back a ``_Finished`` and waits for the next."""

        def __init__(self) -> None:
            _Provider.__init__(self, self._serve, _greenlets.getcurrent())
            self.call: tuple[Callable[..., Any], tuple[Any, ...]] | None = None

        def _serve(self) -> None:
            while True:
                assert self.call is not None
                fn, args = self.call
                self.call = None
                try:
                    finished = _Finished(fn(*args), None)
                except _greenlets.GreenletExit:  # this greenlet is being destroyed
                    raise
                except BaseException as exc:  # fn's, whatever it is, is the caller's
                    finished = _Finished(None, exc)
                del fn, args
                self.parent.switch(finished)

    def _take(kept: list[Any]) -> Any:
        """An idle greenlet of ``kept`` (this thread's), or a new one, ready to run in the
        caller's greenlet and context (SQLAlchemy 2.1 switches back to ``parent``, 2.0 to
        ``driver``)."""
        worker = kept.pop() if kept else _ReusedGreenlet()
        here = _greenlets.getcurrent()
        worker.parent = here
        worker.driver = here
        worker.gr_context = here.gr_context
        return worker

    def _accepted() -> bool:
        """Whether SQLAlchemy's ``await_`` switches out of a reused greenlet, and back in,
        as it does out of its own: checked by driving one probe call by hand."""
        await_ = getattr(sqlalchemy.util, "await_", None) or sqlalchemy.util.await_only
        probe = asyncio.sleep(0)
        try:
            worker = _take(_idle_greenlets())
            worker.call = (await_, (probe,))
            asked = worker.switch()
            if asked is not probe:
                return False
            finished = worker.switch("answer")
        except Exception:
            return False
        finally:
            probe.close()
        if not isinstance(finished, _Finished) or finished.value != "answer":
            return False
        worker.gr_context = None
        _idle_greenlets().append(worker)
        return True

    _REUSABLE = _accepted()
else:  # pragma: no cover - every SQLAlchemy in the tested range has the class
    _REUSABLE = False


async def _spawn_reused(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``greenlet_spawn``'s loop, in a reused greenlet (see ``greenlet_spawn``)."""
    kept = _idle_greenlets()
    worker = _take(kept)
    worker.call = (fn, args)
    result = worker.switch()
    while not isinstance(result, _Finished):
        try:
            value = await result  # a driver await of fn's: awaited here
        except BaseException:
            result = worker.throw(*sys.exc_info())
        else:
            result = worker.switch(value)
    # Idle, the greenlet keeps nothing of this call: not its result (the worker's frame
    # holds the emptied ``_Finished``), not the caller's context.
    worker.gr_context = None
    if len(kept) < _IDLE_MAX:
        kept.append(worker)
    value, error = result.value, result.error
    result.value = result.error = None
    if error is not None:
        raise error
    return value


def checkin_reset(fairy: Any) -> None:
    """Check ``fairy`` in, telling the pool its transaction is already reset
    (``_ConnectionFairy._close_special(transaction_reset=True)``): the pool's reset events
    still fire, but the rollback is skipped."""
    fairy._close_special(True)


_NO_IO_RESETS = (reset_rollback, reset_none)
"""Reset-on-return styles that do nothing on a connection whose transaction is reset."""


def checkin_without_io(pool: Pool, fairy: Any) -> bool:
    """Whether ``checkin_reset(fairy)`` cannot reach the driver, so that it may run outside
    a greenlet: no pool ``reset`` or ``checkin`` listener, a reset-on-return of rollback
    (skipped: the transaction is already reset) or none, no finalizer left on the connection
    record (``_ConnectionRecord.finalize_callback``), and a pool that will not close the
    connection on return (``_may_close_on_return``). Fail-closed: whatever it cannot read
    (a private name gone in another SQLAlchemy version) answers False, and the caller
    checks in through a greenlet, as always correct."""
    dispatch = pool.dispatch
    if dispatch.reset or dispatch.checkin:
        return False
    if getattr(pool, "_reset_on_return", None) not in _NO_IO_RESETS:
        return False
    record = getattr(fairy, "_connection_record", None)
    if record is None or getattr(record, "finalize_callback", True):
        return False
    return not _may_close_on_return(pool)


RETURNED = "durable_sessions_returned"
"""Key of a pool record's ``info``: when the runner last checked that connection in
(``time.monotonic()``; cleared with the rest of ``info`` when the pool reconnects)."""

REVISIT_AFTER = 30.0
"""Seconds after which an idle connection of a FIFO pool is lent again before the warm one
(``checkout_without_io``)."""


def checkout_without_io(pool: Pool) -> Any | None:
    """Check a connection out of ``pool`` in plain calls, when nothing in that checkout can
    reach the driver; return it, or None when the caller must check out through a greenlet
    (always correct). Fail-closed: whatever it cannot read (a private name gone in another
    SQLAlchemy version) answers None.

    It lends an idle connection of a queue pool with no pre-ping, taken without waiting
    (the overflow is not used up), that is open and needs no reconnect (no recycle age, no
    pool-wide or soft invalidation since it opened), with no ``checkout`` listener but those
    that run once per connection and have run on that one (a ``done_key`` attribute naming
    the key they set in the connection record's ``info``).

    Which idle connection: the one checked in last (the warm one), as ``pool_use_lifo``
    would. A FIFO pool (SQLAlchemy's default) lends its idle connections in turn, so that
    after a burst of concurrent operations one task cycles through them all, each one's
    driver state and server backend (or aiosqlite thread and page cache) cold by its turn:
    a Postgres fork-equivalent of the ADK adapter, one task, took 0.78 ms on one warm
    connection and 1.11 ms cycling through 16. In a FIFO pool the oldest idle connection
    still gets its turn once it has sat unused by the runner for ``REVISIT_AFTER`` seconds
    (or was never checked in by it): each connection keeps being used, as in the pool's own
    order, rather than left to a server's or a proxy's idle timeout. The warm one is put
    where the queue takes from even when this answers None, so that the greenlet's
    ``pool.connect()`` (no await comes between) takes it too, and checks it as the pool
    checks any (a pre-ping, a recycle, its listeners)."""
    try:
        if not isinstance(pool, QueuePool):
            return None
        waiting = pool._pool
        if not isinstance(waiting, AsyncAdaptedQueue):
            return None
        idle = waiting._queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque
        if not idle:
            return None
        record = _warm_next(waiting.use_lifo, idle)
        if pool._pre_ping or pool._recycle > -1 or pool._invalidate_time:
            return None
        if -1 < pool._max_overflow <= pool._overflow:  # QueuePool._do_get would wait
            return None
        for listener in pool.dispatch.checkout:
            done_key = getattr(listener, "done_key", None)
            if done_key is None or not record.info.get(done_key):
                return None
        if record.dbapi_connection is None or record._soft_invalidate_time > record.starttime:
            return None
    except AttributeError:
        return None
    return pool.connect()


def _warm_next(lifo: bool, idle: Any) -> Any:
    """Put the warm idle connection where the queue takes from (a LIFO queue's list has it
    there already; a FIFO queue's deque, unless its oldest is due a turn); return the record
    the queue takes next."""
    if lifo:
        return idle[-1]
    if len(idle) > 1 and not _due(idle[0]):
        idle.appendleft(idle.pop())
    return idle[0]


def _due(record: Any) -> bool:
    """Whether an idle connection has not been checked in by the runner for
    ``REVISIT_AFTER`` seconds (or ever)."""
    returned = record.info.get(RETURNED)
    return returned is None or time.monotonic() - returned >= REVISIT_AFTER


def _may_close_on_return(pool: Pool) -> bool:
    """Whether checking a connection in to ``pool`` may close one, which awaits the driver.

    A queue pool closes a returned connection only when its queue is already full (an
    overflow connection); other pools (null, static) may close on any return.
    """
    if isinstance(pool, (StaticPool, SingletonThreadPool)):
        return False
    if isinstance(pool, QueuePool):
        size = pool.size()
        return size > 0 and pool.checkedin() >= size
    return True


def engine_has_events(engine: Engine) -> bool:
    """Whether anything listens to the engine's events (``Engine._has_events``)."""
    return bool(engine._has_events)


def invalidate_pool(pool: Pool, connection: Any, exc: BaseException) -> None:
    """Retire every pooled connection made before ``connection`` (``Pool._invalidate``)."""
    pool._invalidate(connection, exc)


def returning_columns(statement: Any) -> tuple[Any, ...]:
    """The RETURNING columns of an INSERT, UPDATE or DELETE (``statement._returning``)."""
    return tuple(getattr(statement, "_returning", ()) or ())


def aiosqlite_connection(connection: Any) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` inside an ``aiosqlite.Connection`` (``_conn``)."""
    conn: sqlite3.Connection = connection._conn
    return conn


def aiosqlite_execute(connection: Any, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run ``fn(*args)`` in the connection's worker thread (``Connection._execute``)."""
    execute: Callable[..., Awaitable[Any]] = connection._execute
    return execute(fn, *args)
