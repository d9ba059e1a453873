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

import sqlite3
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import sqlalchemy
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, QueuePool, SingletonThreadPool, StaticPool
from sqlalchemy.pool.base import _ConnectionFairy, reset_none, reset_rollback
from sqlalchemy.sql.dml import UpdateBase

__all__ = [
    "TESTED",
    "aiosqlite_connection",
    "aiosqlite_execute",
    "check",
    "checkin_reset",
    "checkin_without_io",
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
    """``sqlalchemy.util.greenlet_spawn``: run sync SQLAlchemy code that awaits the driver."""
    spawn: Callable[..., Awaitable[Any]] = sqlalchemy.util.greenlet_spawn
    return spawn(fn, *args)


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
