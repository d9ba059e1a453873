"""The settings every SQLite connection of a store gets: WAL, a busy timeout, foreign keys,
secure delete."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.util import await_only

__all__ = ["install_sqlite_pragmas"]


_PRAGMAS_DONE = "durable_sessions_pragmas"
_SQLITE_BUSY = 5


def _is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's SQLITE_BUSY ("database is locked")."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return bool(code & 0xFF == _SQLITE_BUSY)
    return "database is locked" in str(exc)


def _switch_to_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Set WAL, waiting up to the busy timeout for another connection's lock.

    Leaving the rollback journal needs an exclusive lock, and SQLite answers SQLITE_BUSY
    at once, without calling its busy handler, while another connection writes: several
    processes opening one fresh database at the same time would otherwise fail at random.
    The wait yields to the event loop (checkout runs inside SQLAlchemy's greenlet).
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    delay = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except Exception as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
        await_only(asyncio.sleep(delay))
        delay = min(delay * 2, 0.05)


def install_sqlite_pragmas(engine: Engine, busy_timeout_ms: int) -> None:
    """Give every SQLite connection of ``engine`` WAL, a busy timeout, foreign keys and
    ``secure_delete``.

    Runs at checkout once per DBAPI connection, so connections pooled before the store
    was made get the settings too. A writer holding the fresh database's lock delays the
    switch to WAL by at most the busy timeout, as it would any other statement.

    ``secure_delete`` overwrites with zeros what a delete or an update frees (a row's old
    bytes in its page, a page put on the free list) at the time it is freed: the erasures
    (``delete_user``, ``purge``) leave no old copy of what they removed in the file, nor of
    the earlier versions of a row (a session row is rewritten on every append).
    """

    def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get(_PRAGMAS_DONE):
            return
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            _switch_to_wal(cursor, busy_timeout_ms)
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA secure_delete = ON")
        finally:
            cursor.close()
        record.info[_PRAGMAS_DONE] = True

    # Done once per connection: the runner may check a connection out without a greenlet
    # once its record says so (``_private.checkout_without_io``).
    on_checkout.done_key = _PRAGMAS_DONE  # type: ignore[attr-defined]
    event.listen(engine, "checkout", on_checkout)
