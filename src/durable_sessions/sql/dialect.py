"""The few differences between SQLite and Postgres, chosen once per engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, bindparam, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from ..errors import InvalidArgumentError
from .schema import JSONValue, sessions

__all__ = ["SUPPORTED", "DialectOps", "dialect_ops", "install_sqlite_pragmas"]

SUPPORTED = {("sqlite", "aiosqlite"), ("postgresql", "asyncpg")}
"""The (dialect, driver) pairs SQLStore runs on."""


@dataclass(frozen=True)
class DialectOps:
    """What differs between the backends: how to upsert and how to merge private state."""

    name: str
    insert: Callable[[Table], Insert]
    begin_write: str | None
    merge_private: Callable[[], ColumnElement[Any]] | None

    def upsert(self, table: Table, key_columns: list[str], update_columns: list[str]) -> Insert:
        """Return ``INSERT ... ON CONFLICT (keys) DO UPDATE SET cols = excluded.cols``."""
        stmt = self.insert(table)
        return stmt.on_conflict_do_update(  # type: ignore[attr-defined,no-any-return]
            index_elements=key_columns,
            set_={col: stmt.excluded[col] for col in update_columns},  # type: ignore[attr-defined]
        )

    def insert_if_absent(self, table: Table) -> Insert:
        """Return ``INSERT ... ON CONFLICT DO NOTHING``."""
        return self.insert(table).on_conflict_do_nothing()  # type: ignore[attr-defined,no-any-return]


def _pg_merge_private() -> ColumnElement[Any]:
    # jsonb || jsonb replaces top-level keys and keeps JSON null as a value, in one statement.
    return sessions.c.state.op("||", return_type=JSONValue)(
        bindparam("v_private_delta", type_=JSONB)
    )


def dialect_ops(dialect_name: str, driver: str) -> DialectOps:
    """Return the operations for a (dialect, driver) pair, refusing unsupported ones."""
    if (dialect_name, driver) not in SUPPORTED:
        raise InvalidArgumentError(
            f"SQLStore runs on sqlite+aiosqlite and postgresql+asyncpg engines, "
            f"not {dialect_name}+{driver}"
        )
    if dialect_name == "postgresql":
        return DialectOps("postgresql", postgresql.insert, None, _pg_merge_private)
    # SQLite: take the write lock up front so concurrent writers queue on busy_timeout
    # instead of failing with "database is locked" when a read lock cannot be upgraded.
    return DialectOps("sqlite", sqlite.insert, "BEGIN IMMEDIATE", None)


_PRAGMAS_DONE = "durable_sessions_pragmas"


def install_sqlite_pragmas(engine: Engine, busy_timeout_ms: int) -> None:
    """Give every SQLite connection of ``engine`` WAL, a busy timeout and foreign keys.

    Runs at checkout once per DBAPI connection, so connections pooled before the store
    was made get the settings too.
    """

    def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get(_PRAGMAS_DONE):
            return
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()
        record.info[_PRAGMAS_DONE] = True

    event.listen(engine, "checkout", on_checkout)
