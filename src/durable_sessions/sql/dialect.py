"""The few differences between SQLite and Postgres, chosen once per engine."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, String, Table, any_, bindparam, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_only

from ..errors import InvalidArgumentError
from .schema import JSONValue, sessions

__all__ = [
    "SUPPORTED",
    "DialectOps",
    "dialect_ops",
    "install_sqlite_pragmas",
    "pin_read_committed",
]

SUPPORTED = {("sqlite", "aiosqlite"), ("postgresql", "asyncpg")}
"""The (dialect, driver) pairs SQLStore runs on."""


@dataclass(frozen=True)
class DialectOps:
    """What differs between the backends, as Core constructs."""

    name: str
    insert: Callable[[Table], Insert]
    merge_private: Callable[[], ColumnElement[Any]] | None

    @property
    def is_postgres(self) -> bool:
        """Whether this is Postgres (data-modifying CTEs, jsonb operators, arrays)."""
        return self.name == "postgresql"

    def upsert(self, table: Table, key_columns: list[str], update_columns: list[str]) -> Insert:
        """Return ``INSERT ... ON CONFLICT (keys) DO UPDATE SET cols = excluded.cols``."""
        return self.on_conflict_update(self.insert(table), key_columns, update_columns)

    @staticmethod
    def on_conflict_update(
        stmt: Insert, key_columns: list[str], update_columns: list[str]
    ) -> Insert:
        """Add ``ON CONFLICT (keys) DO UPDATE SET cols = excluded.cols`` to an insert."""
        return stmt.on_conflict_do_update(  # type: ignore[attr-defined,no-any-return]
            index_elements=key_columns,
            set_={col: stmt.excluded[col] for col in update_columns},  # type: ignore[attr-defined]
        )

    def insert_if_absent(self, table: Table) -> Insert:
        """Return ``INSERT ... ON CONFLICT DO NOTHING``."""
        return self.insert(table).on_conflict_do_nothing()  # type: ignore[attr-defined,no-any-return]

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column`` is one of the strings bound as a list to ``name`` (one statement
        whatever the list's length: an array on Postgres, a JSON array on SQLite)."""
        if self.is_postgres:
            return column == any_(bindparam(name, type_=ARRAY(String)))
        values = func.json_each(bindparam(name, type_=JSON)).table_valued("value")
        return column.in_(select(values.c.value))

    def object_agg(self, key: ColumnElement[Any], value: ColumnElement[Any]) -> ColumnElement[Any]:
        """Aggregate (key, JSON value) rows into one JSON object (NULL when there are none)."""
        if self.is_postgres:
            return func.jsonb_object_agg(key, value, type_=JSONValue)
        # Values are stored as JSON text: json() keeps them JSON instead of quoting them.
        return func.json_group_object(key, func.json(value), type_=JSONValue)


def _pg_merge_private() -> ColumnElement[Any]:
    # jsonb || jsonb replaces top-level keys and keeps JSON null as a value, in one statement.
    return sessions.c.state.op("||", return_type=JSONValue)(
        bindparam("v_private_delta", type_=JSONValue)
    )


def dialect_ops(dialect_name: str, driver: str) -> DialectOps:
    """Return the operations for a (dialect, driver) pair, refusing unsupported ones."""
    if (dialect_name, driver) not in SUPPORTED:
        raise InvalidArgumentError(
            f"SQLStore runs on sqlite+aiosqlite and postgresql+asyncpg engines, "
            f"not {dialect_name}+{driver}"
        )
    if dialect_name == "postgresql":
        return DialectOps("postgresql", postgresql.insert, _pg_merge_private)
    # SQLite merges private state in Python, inside the write transaction.
    return DialectOps("sqlite", sqlite.insert, None)


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
    """Give every SQLite connection of ``engine`` WAL, a busy timeout and foreign keys.

    Runs at checkout once per DBAPI connection, so connections pooled before the store
    was made get the settings too. A writer holding the fresh database's lock delays the
    switch to WAL by at most the busy timeout, as it would any other statement.
    """

    def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get(_PRAGMAS_DONE):
            return
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            _switch_to_wal(cursor, busy_timeout_ms)
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()
        record.info[_PRAGMAS_DONE] = True

    # Done once per connection: the runner may check a connection out without a greenlet
    # once its record says so (``_private.checkout_without_io``).
    on_checkout.done_key = _PRAGMAS_DONE  # type: ignore[attr-defined]
    event.listen(engine, "checkout", on_checkout)


async def pin_read_committed(conn: AsyncConnection) -> None:
    """Run the transactions of ``conn`` (a Postgres connection through SQLAlchemy) at READ
    COMMITTED, whatever the engine's or the database's default; the pool restores the
    engine's level at check-in.

    Left alone where the default is READ UNCOMMITTED, which Postgres runs as READ COMMITTED
    and which SQLAlchemy could not set back at check-in (its asyncpg dialect refuses the
    name). Nothing to do on SQLite.
    """
    if conn.dialect.name != "postgresql":
        return
    if getattr(conn.dialect, "default_isolation_level", None) == "READ UNCOMMITTED":
        return
    await conn.execution_options(isolation_level="READ COMMITTED")
