"""Run a store operation's statements on the pool's driver connection, in one hop.

An operation is written once, as a generator that yields queries and receives their results
(``Program``). A runner drives it: on SQLite the whole program runs in aiosqlite's worker
thread in one hop (one ``BEGIN IMMEDIATE`` ... ``COMMIT`` for writes); on Postgres each
query is one asyncpg round trip, and a multi-statement write runs in one transaction. This
is also the one place where driver errors become the library's errors.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
import weakref
from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from ..errors import SchemaNotMigratedError, SessionError, StoreError, StoreUnavailableError
from .attempts import CURRENT, MIGRATE_HINT, Attempt
from .compiled import Compiled

__all__ = ["Mode", "Program", "Query", "Result", "Runner", "make_runner", "translated"]

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

_MISSING_SCHEMA = ("no such table", "no such column", "does not exist")
# Connection exceptions, authorisation, missing catalog (database), resources, shutdowns.
_UNAVAILABLE_SQLSTATES = ("08", "28", "3D", "53", "57P")
# Raised only by a connection attempt: authorisation, no such database, too many
# connections, the server starting up.
_CONNECT_SQLSTATES = ("28", "3D", "53300", "57P03")
_HINT = MIGRATE_HINT
# What must never reach a message: a URL or DSN (it may carry a password), password=...
_SECRETS = re.compile(r"[a-z][a-z0-9+.-]*://\S*|\bpassword\s*[=:]\s*\S*", re.IGNORECASE)
_BACKGROUND = re.compile(r"\s*\(Background on this error at:[^)]*\)")


@contextmanager
def translated(operation: str, *, writes: bool = True) -> Iterator[None]:
    """Turn driver and SQLAlchemy errors into the library's error tree.

    The error names the driver's own message (never a URL or password). It says the
    operation may not have completed only when ``writes`` and a connection was made, for
    then a write may have reached the server; a failed connection attempt wrote nothing.
    A SQLite file that does not exist is not created (``SchemaNotMigratedError``).
    """
    attempt = Attempt(operation)
    token = CURRENT.set(attempt)
    try:
        yield
    except SessionError:
        raise
    except (
        sa_exc.DBAPIError,
        sqlite3.Error,
        OSError,
        TimeoutError,
        sa_exc.DisconnectionError,
        sa_exc.TimeoutError,
    ) as exc:
        raise _translate(operation, exc, writes=writes, connecting=attempt.connecting) from exc
    except Exception as exc:
        # asyncpg's own errors, and SQLAlchemy's adapters of them (raised by the pool).
        if type(exc).__module__.startswith(("asyncpg", "sqlalchemy.dialects")):
            raise _translate(operation, exc, writes=writes, connecting=attempt.connecting) from exc
        raise
    finally:
        try:
            CURRENT.reset(token)
        except ValueError:  # left in another context (an async generator moved on)
            CURRENT.set(None)


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception behind SQLAlchemy's wrappers and adapters."""
    found = getattr(exc, "orig", None) or exc
    while type(found).__module__.startswith("sqlalchemy") and found.__cause__ is not None:
        found = found.__cause__
    return found


def _described(exc: BaseException) -> str:
    """``Name: the driver's message``: its first line, without a URL or password."""
    text = _BACKGROUND.sub("", str(exc)).strip()
    line = " ".join(text.splitlines()[0].split()) if text else ""
    line = _SECRETS.sub("[...]", line)
    if len(line) > 300:
        line = line[:297] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _translate(
    operation: str, exc: BaseException, *, writes: bool = True, connecting: bool = False
) -> SessionError:
    orig = _driver_error(exc)
    cause = _described(orig)
    text = str(orig).lower()
    sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    if sqlstate in ("42P01", "42703") or (
        type(orig).__name__ in ("OperationalError", "ProgrammingError")
        and any(marker in text for marker in _MISSING_SCHEMA)
        and not sqlstate.startswith(_CONNECT_SQLSTATES)  # 3D000: the database does not exist
    ):
        return SchemaNotMigratedError(
            f"{operation}: the database schema is missing or out of date ({cause}); {_HINT}"
        )
    if isinstance(exc, sa_exc.TimeoutError):  # the pool had no connection free in time
        return StoreUnavailableError(
            f"{operation}: no pooled connection became free in time ({cause}); nothing was written"
        )
    never_connected = (
        connecting
        or sqlstate.startswith(_CONNECT_SQLSTATES)
        or isinstance(orig, (ConnectionRefusedError, socket.gaierror))
        or (isinstance(orig, sqlite3.Error) and "unable to open database file" in text)
    )
    if never_connected:
        return StoreUnavailableError(
            f"{operation}: could not connect to the database ({cause}); nothing was written"
        )
    if (
        _is_disconnect(orig)
        or getattr(exc, "connection_invalidated", False)
        or sqlstate.startswith(_UNAVAILABLE_SQLSTATES)
    ):
        if not writes:
            return StoreUnavailableError(
                f"{operation}: the connection to the database failed ({cause})"
            )
        return StoreUnavailableError(
            f"{operation}: the connection to the database failed ({cause}); the operation may "
            "not have completed: read back before retrying"
        )
    if "database is locked" in text or "database is busy" in text:
        return StoreUnavailableError(
            f"{operation}: the database stayed locked past the busy timeout ({cause}); "
            "nothing was written"
        )
    return StoreError(f"{operation}: the database failed ({cause}); nothing was written")


def _is_disconnect(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)):
        return True
    module = type(exc).__module__
    if module.startswith("asyncpg"):
        import asyncpg  # type: ignore[import-untyped]

        return isinstance(
            exc,
            (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CannotConnectNowError,
            ),
        )
    return False


class Runner:
    """Drives programs on one engine; subclasses know the driver."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        """Run ``program`` and return its value; raise the library's errors on failure."""
        raise NotImplementedError

    def _emit(self, conn: AsyncConnection, log: list[tuple[str, Any, bool]]) -> None:
        # Tools that watch SQLAlchemy's cursor events (tracing, statement counting) still
        # see every statement, although it bypassed SQLAlchemy's execution layer.
        dispatch = self.engine.sync_engine.dispatch
        sync_conn = conn.sync_connection
        for sql, params, many in log:
            dispatch.before_cursor_execute(sync_conn, None, sql, params, None, many)
            dispatch.after_cursor_execute(sync_conn, None, sql, params, None, many)

    def _watched(self) -> bool:
        return bool(self.engine.sync_engine._has_events)

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[tuple[Any, list[tuple[str, Any, bool]] | None]]:
        """Borrow a pooled connection: yield the pool's proxy and, when something listens
        to the engine's cursor events, a log of the statements to tell it about."""
        if self._watched():
            async with self.engine.connect() as conn:
                raw = await conn.get_raw_connection()
                log: list[tuple[str, Any, bool]] = []
                try:
                    yield raw, log
                finally:
                    self._emit(conn, log)
            return
        # Straight from the pool (its checkout events, pre-ping and reset still apply),
        # without an engine Connection around it: one greenlet hop each way.
        fairy = await greenlet_spawn(self.engine.sync_engine.pool.connect)
        try:
            yield fairy, None
        finally:
            await greenlet_spawn(fairy.close)


_WRITE_LOCKS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _write_lock(engine: AsyncEngine) -> asyncio.Lock:
    """The lock that queues this process's writers to one SQLite engine, per event loop."""
    per_loop = _WRITE_LOCKS.setdefault(engine.sync_engine, weakref.WeakKeyDictionary())
    loop = asyncio.get_running_loop()
    lock = per_loop.get(loop)
    if lock is None:
        lock = per_loop[loop] = asyncio.Lock()
    return lock


class SQLiteRunner(Runner):
    """Runs a whole program in aiosqlite's worker thread: one thread hop per operation.

    SQLite admits one writer at a time. Writers of this process queue on an asyncio lock
    (first come, first served, holding no connection while they wait) rather than in
    SQLite's busy handler, whose sleeps would stretch their latency; writers in other
    processes still wait on the busy timeout.
    """

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        if mode == "read":
            return await self._run(program, mode, operation)
        async with _write_lock(self.engine):
            return await self._run(program, mode, operation)

    async def _run(self, program: Program[T], mode: Mode, operation: str) -> T:
        with translated(operation):
            async with self._borrow() as (raw, log):
                driver: Any = raw.driver_connection
                result: T = await driver._execute(
                    _drive_sqlite, driver._conn, program, mode != "read", log
                )
                return result


def _drive_sqlite(
    db: sqlite3.Connection, program: Program[T], write: bool, log: list[Any] | None
) -> T:
    if write:
        # Take the write lock up front: writers in other processes queue on busy_timeout
        # instead of failing with "database is locked" when a read lock cannot be upgraded.
        db.execute("BEGIN IMMEDIATE")
    try:
        query = program.send(None)  # type: ignore[arg-type]
        while True:
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
            if log is not None:
                log.append((stmt.sql, params, query.many))
            query = program.send(result)
    except StopIteration as stop:
        if write:
            db.commit()
        return stop.value  # type: ignore[no-any-return]
    except BaseException:
        if write and db.in_transaction:
            db.rollback()
        raise


class PostgresRunner(Runner):
    """Runs each query as one asyncpg round trip; multi-statement writes in a transaction."""

    async def run(self, program: Program[T], mode: Mode, operation: str) -> T:
        with translated(operation):
            async with self._borrow() as (raw, log):
                driver: Any = raw.driver_connection
                try:
                    if mode == "write":
                        async with driver.transaction():
                            return await self._drive(driver, program, log)
                    return await self._drive(driver, program, log)
                except BaseException as exc:
                    if _is_disconnect(exc):
                        self._invalidate_pool(raw, exc)
                    raise

    def _invalidate_pool(self, raw: Any, exc: BaseException) -> None:
        """After a disconnect, retire every pooled connection made before it, as SQLAlchemy
        does for statements it runs itself (a restarted server dropped them all)."""
        pool = self.engine.sync_engine.pool
        invalidate = getattr(pool, "_invalidate", None)
        if invalidate is not None:
            invalidate(raw, exc)
        else:  # pragma: no cover - a future SQLAlchemy without it: retire this one only
            raw.invalidate(exc)

    @staticmethod
    async def _drive(driver: Any, program: Program[T], log: list[Any] | None) -> T:
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
                rows = await driver.fetch(stmt.sql, *params)
                result = Result(stmt.decode(rows), len(rows))
            else:
                params = stmt.bind(query.params)
                status = await driver.execute(stmt.sql, *params)
                tail = status.rsplit(" ", 1)[-1]
                result = Result([], int(tail) if tail.isdigit() else -1)
            if log is not None:
                log.append((stmt.sql, params, query.many))
            try:
                query = program.send(result)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


def make_runner(engine: AsyncEngine) -> Runner:
    """Return the runner for the engine's driver (aiosqlite or asyncpg)."""
    if engine.dialect.name == "sqlite":
        return SQLiteRunner(engine)
    return PostgresRunner(engine)
