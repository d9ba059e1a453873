"""The few differences between the dialects in the shared statements, chosen once per engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    JSON,
    String,
    Table,
    Text,
    any_,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from ..errors import InvalidArgumentError
from .schema import MYSQL_NAMES, JSONValue, sessions

__all__ = [
    "MYSQL_NAMES",
    "SUPPORTED",
    "DialectOps",
    "dialect_ops",
]

SUPPORTED = {
    ("sqlite", "aiosqlite"),
    ("postgresql", "asyncpg"),
    ("mysql", "asyncmy"),
    ("mariadb", "asyncmy"),
}
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

    @property
    def is_mysql(self) -> bool:
        """Whether this is MySQL or MariaDB (SQLAlchemy names MariaDB's dialect apart)."""
        return self.name in MYSQL_NAMES

    def upsert(self, table: Table, key_columns: list[str], update_columns: list[str]) -> Insert:
        """Return ``INSERT ... ON CONFLICT (keys) DO UPDATE SET cols = excluded.cols``."""
        return self.on_conflict_update(self.insert(table), key_columns, update_columns)

    def on_conflict_update(
        self, stmt: Insert, key_columns: list[str], update_columns: list[str]
    ) -> Insert:
        """Add ``ON CONFLICT (keys) DO UPDATE SET cols = excluded.cols`` to an insert (on
        MySQL ``ON DUPLICATE KEY UPDATE``, whose key is the primary key)."""
        if self.is_mysql:
            return stmt.on_duplicate_key_update(  # type: ignore[attr-defined,no-any-return]
                {col: stmt.inserted[col] for col in update_columns}  # type: ignore[attr-defined]
            )
        return stmt.on_conflict_do_update(  # type: ignore[attr-defined,no-any-return]
            index_elements=key_columns,
            set_={col: stmt.excluded[col] for col in update_columns},  # type: ignore[attr-defined]
        )

    def insert_if_absent(self, table: Table) -> Insert:
        """Return ``INSERT ... ON CONFLICT DO NOTHING`` (on MySQL ``ON DUPLICATE KEY UPDATE``
        of a key column to itself: the stored row stays as it was, and no other error is
        turned into a warning as ``INSERT IGNORE`` would)."""
        stmt = self.insert(table)
        if self.is_mysql:
            first = next(iter(table.primary_key.columns)).name
            return stmt.on_duplicate_key_update({first: table.c[first]})  # type: ignore[attr-defined,no-any-return]
        return stmt.on_conflict_do_nothing()  # type: ignore[attr-defined,no-any-return]

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column`` is one of the strings bound as a list to ``name`` (one statement
        whatever the list's length: an array on Postgres, a JSON array on SQLite)."""
        if self.is_postgres:
            return column == any_(bindparam(name, type_=ARRAY(String)))
        if self.is_mysql:  # compared as bytes, as the binary id and key columns are
            rows = text(
                f"JSON_TABLE(:{name}, '$[*]' COLUMNS (value LONGBLOB PATH '$')) AS {name}_rows"
            ).bindparams(bindparam(name, type_=JSONValue))
            return column.in_(select(literal_column(f"{name}_rows.value")).select_from(rows))
        values = func.json_each(bindparam(name, type_=JSON)).table_valued("value")
        return column.in_(select(values.c.value))

    def object_agg(self, key: ColumnElement[Any], value: ColumnElement[Any]) -> ColumnElement[Any]:
        """Aggregate (key, JSON value) rows into one JSON object (NULL when there are none)."""
        if self.is_postgres:
            return func.jsonb_object_agg(key, value, type_=JSONValue)
        if self.is_mysql:
            # Values are stored as JSON text: joined as they are, keys quoted as JSON.
            name = func.json_quote(cast(key, mysql.CHAR(charset="utf8mb4")))
            joined = func.group_concat(func.concat(name, literal(":", Text), value))
            return func.concat(literal("{", Text), joined, literal("}", Text), type_=JSONValue)
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
            "SQLStore runs on sqlite+aiosqlite, postgresql+asyncpg, mysql+asyncmy and "
            "mariadb+asyncmy engines, "
            f"not {dialect_name}+{driver}"
        )
    if dialect_name == "postgresql":
        return DialectOps("postgresql", postgresql.insert, _pg_merge_private)
    if dialect_name in MYSQL_NAMES:
        # MySQL merges private state in Python, under the session row's lock.
        return DialectOps(dialect_name, mysql.insert, None)
    # SQLite merges private state in Python, inside the write transaction.
    return DialectOps("sqlite", sqlite.insert, None)
