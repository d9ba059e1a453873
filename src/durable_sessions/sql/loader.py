"""Bulk-load rows into the schema's tables, and read a table by keyset pages: the imports' core.

A ``Loader`` inserts the rows it is given into any tables of the schema, in batches of at
most ``batch_rows`` rows and about ``batch_bytes`` bytes (its memory is one batch, whatever
is loaded), inside the caller's transaction. A row whose primary key is already stored, or
was given earlier, raises ``RowExistsError``: the caller rolls back, and nothing was loaded.
``finish`` inserts what is left and refreshes the planner's statistics of the tables it
loaded into, so the first queries after a large load are planned for the data it holds.

``Keyset`` reads a query's rows in pages ordered by a key, each page starting after the
previous page's last key: flat memory, and each page read straight from the key's index.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    LargeBinary,
    Select,
    String,
    Table,
    Text,
    bindparam,
    cast,
    func,
    tuple_,
)
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import InvalidArgumentError
from .dialect import dialect_ops
from .dialects.mysql.load import insert_new
from .schema import app_state, events, keys, memories, sessions, user_state
from .transactions import TransactionConnection

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "Keyset", "Loader", "RowExistsError", "text_size"]

BATCH_ROWS = 1000
"""Rows inserted per batch, at most (every table's pending rows together)."""
BATCH_BYTES = 8 << 20
"""About how many bytes of rows a batch holds, at most (a larger row alone)."""
_ANALYZE_FROM = 1000
"""Rows of a table other tables refer to, loaded when Postgres first refreshes its
statistics during a load (then again each time the table has grown fourfold)."""


class RowExistsError(InvalidArgumentError):
    """Raised by ``Loader`` when a row's primary key is already stored or was loaded earlier.

    ``table`` is the table's name, ``row`` the row refused, ``tag`` what the caller gave
    with it (an input's line number, say).
    """

    def __init__(self, message: str, table: str, row: Mapping[str, Any], tag: Any) -> None:
        super().__init__(message)
        self.table = table
        self.row = row
        self.tag = tag


def _owned(row: Mapping[str, Any]) -> str:
    owner = f" of user {row['user_id']!r}" if "user_id" in row else ""
    return f"{owner} of app {row['app_name']!r}"


_NAMES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    sessions.name: lambda row: f"session {row['id']!r}",
    events.name: lambda row: f"event {row['seq']} of session {row['session_id']!r}",
    user_state.name: lambda row: f"user: state key {row['key']!r}{_owned(row)}",
    app_state.name: lambda row: f"app: state key {row['key']!r}{_owned(row)}",
    memories.name: lambda row: f"memory {row['id']!r}{_owned(row)}",
    keys.name: lambda row: f"data key {row['key_id']!r}",
}
"""How a row of a table is named in a clash (other tables: by their primary key)."""


def name_row(table: Table, row: Mapping[str, Any]) -> str:
    """A row named for an operator: ``session 's1' of organisation 'acme'``."""
    named = _NAMES.get(table.name)
    if named is not None:
        what = named(row)
    else:
        key = ", ".join(
            f"{col.name}={row[col.name]!r}" for col in table.primary_key if col.name != "org_id"
        )
        what = f"{table.name} row ({key})"
    return f"{what} of organisation {row['org_id']!r}" if "org_id" in row else what


def _referred(tables: Sequence[Table]) -> set[Table]:
    """The tables that another of ``tables`` refers to by a foreign key."""
    return {
        fk.column.table
        for table in tables
        for fk in table.foreign_keys
        if fk.column.table is not table and fk.column.table in tables
    }


class Loader:
    """Inserts rows into tables of the schema in batches, on a connection in a transaction.

    A batch is inserted table by table in the order the tables are given (a session before
    its events), so each table's foreign keys are checked against rows already inserted.
    """

    def __init__(
        self,
        conn: TransactionConnection,
        tables: Sequence[Table],
        *,
        batch_rows: int = BATCH_ROWS,
        batch_bytes: int = BATCH_BYTES,
        where: Callable[[Any], str] | None = None,
    ) -> None:
        """Load into ``tables`` on ``conn``.

        Args:
            conn: A connection inside the transaction the rows are inserted in.
            tables: The tables rows may be added to, each after those it refers to: a
                batch is inserted table by table in this order.
            batch_rows: Rows inserted per batch, at most.
            batch_bytes: About how many bytes a batch holds, at most (see ``add``).
            where: Names a row's tag in a clash (``lambda line: f"on line {line}"``).
        """
        self.tables = list(tables)
        self.conn = conn
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.where = where
        self.counts: dict[str, int] = {table.name: 0 for table in self.tables}
        """Rows inserted so far, by table name (see ``counted``)."""
        self.ops = dialect_ops(conn.dialect.name, conn.dialect.driver)
        self._inserts = {
            table: self.ops.insert_if_absent(table).returning(*table.primary_key.columns)
            for table in self.tables
            if not self.ops.is_mysql  # MySQL: insert_new (no RETURNING of what it left)
        }
        self._pending: dict[Table, list[tuple[Any, dict[str, Any]]]] = {t: [] for t in self.tables}
        self._tags: dict[tuple[Any, ...], Any] = {}  # (table, *key) of each pending row: its tag
        self._rows = 0
        self._bytes = 0
        self._referred = _referred(self.tables)
        self._analyze_at = dict.fromkeys(self._referred, _ANALYZE_FROM)

    async def add(
        self, table: Table, row: dict[str, Any], *, size: int = 0, tag: Any = None
    ) -> None:
        """Add a row to insert; the batch is inserted once it is full.

        Args:
            table: One of the loader's tables.
            row: A value for each of its columns (those with a default may be left out).
            size: About how many bytes the row holds (its large values), for the batch's
                byte budget.
            tag: What a clash names the row by (see ``RowExistsError.tag``).

        Raises:
            RowExistsError: The row's primary key is already stored or was added before.
        """
        key = (table, *(row[col.name] for col in table.primary_key.columns))
        if key in self._tags:
            earlier = self._tags[key]
            shown = self.where(earlier) if self.where and earlier is not None else None
            raise self._clash(table, row, tag, shown or "(earlier in the input)")
        self._tags[key] = tag
        self._pending[table].append((tag, row))
        self._rows += 1
        self._bytes += size
        if self._rows >= self.batch_rows or self._bytes >= self.batch_bytes:
            await self.flush()

    @staticmethod
    def _clash(table: Table, row: Mapping[str, Any], tag: Any, where: str) -> RowExistsError:
        message = f"{name_row(table, row)} already exists {where}"
        return RowExistsError(message, table.name, row, tag)

    async def flush(self) -> None:
        """Insert every pending row, table by table in the loader's order.

        Raises:
            RowExistsError: A row's primary key is already stored (the first such row).
        """
        for table in self.tables:
            rows = self._pending[table]
            if not rows:
                continue
            pk = [col.name for col in table.primary_key.columns]
            if self.ops.is_mysql:
                clash = await insert_new(self.conn, table, [row for _, row in rows])
                if clash is not None:
                    tag = next(t for t, r in rows if r is clash)
                    raise self._clash(
                        table, clash, tag, "(in the database, or earlier in the input)"
                    )
                self.counts[table.name] += len(rows)
                rows.clear()
                continue
            # One statement inserts and checks: a row that clashes returns no key.
            result = await self.conn.execute(self._inserts[table], [row for _, row in rows])
            inserted = {tuple(found) for found in result}
            if len(inserted) < len(rows):
                tag, row = next(
                    (t, r) for t, r in rows if tuple(r[name] for name in pk) not in inserted
                )
                raise self._clash(table, row, tag, "(in the database, or earlier in the input)")
            self.counts[table.name] += len(rows)
            rows.clear()
            if self.ops.is_postgres and table in self._referred:
                await self._analyze_growing(table)
        self._tags.clear()
        self._rows = self._bytes = 0

    async def _analyze_growing(self, table: Table) -> None:
        # Postgres plans the foreign-key checks of the tables that refer to this one from
        # its statistics: refreshed as it grows, they stay index lookups, not scans.
        if self.counts[table.name] >= self._analyze_at[table]:
            await self.conn.exec_driver_sql(f"ANALYZE {table.name}")
            self._analyze_at[table] = self.counts[table.name] * 4

    async def finish(self, *, analyze: bool = True) -> dict[str, int]:
        """Insert what is pending, then refresh the statistics of each table loaded into.

        ``ANALYZE`` of those tables only, on Postgres and SQLite alike (on SQLite not the
        whole database, whose full-text index is analysed apart: see the paging guide).

        Returns:
            Rows inserted, by table name.

        Raises:
            RowExistsError: A row's primary key is already stored.
        """
        await self.flush()
        loaded = [table.name for table in self.tables if self.counts[table.name]]
        # Not on MySQL: ANALYZE TABLE would commit the load (InnoDB refreshes its statistics).
        if analyze and loaded and not self.ops.is_mysql:
            if self.ops.is_postgres:
                await self.conn.exec_driver_sql(f"ANALYZE {', '.join(loaded)}")
            else:
                for name in loaded:
                    await self.conn.exec_driver_sql(f"ANALYZE {name}")
        return self.counts

    def counted(self) -> dict[str, int]:
        """Rows inserted so far, by table name without its ``ds_`` prefix (``sessions``):
        the fields of the imports' counts."""
        return {name.removeprefix("ds_"): count for name, count in self.counts.items()}


def text_size(column: ColumnElement[Any], dialect: str) -> ColumnElement[int]:
    """The size of a column's value as UTF-8 text, in bytes (0 for NULL): a batch's budget
    read before the value itself. JSON is measured as its text."""
    if dialect == "postgresql":
        text = column if isinstance(column.type, String) else cast(column, Text)
        size = func.octet_length(text)
    else:  # SQLite keeps JSON as text: its length in bytes, as a BLOB
        size = func.length(cast(column, LargeBinary))
    return func.coalesce(size, 0)


@dataclass(frozen=True)
class Keyset:
    """The queries that read a select's rows in keyset pages, ordered by ``key``.

    ``following`` reads the page after the bound parameters ``after_<column name>``.
    """

    first: Select[Any]
    following: Select[Any]
    key: tuple[str, ...]
    limit: int

    @classmethod
    def over(
        cls,
        query: Select[Any],
        key: Sequence[Column[Any]],
        *,
        limit: int,
        collation: str | None = None,
    ) -> Keyset:
        """Page ``query`` by ``key``, ``limit`` rows a page; string columns are compared and
        ordered in ``collation`` when given (that of the key's index)."""
        keys: list[ColumnElement[Any]] = [
            col.collate(collation) if collation and isinstance(col.type, String) else col
            for col in key
        ]
        first = query.order_by(*keys).limit(limit)
        bound = tuple_(*[bindparam(f"after_{col.name}", type_=col.type) for col in key])
        return cls(first, first.where(tuple_(*keys) > bound), tuple(c.name for c in key), limit)

    async def pages(
        self,
        conn: AsyncConnection,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> AsyncIterator[Sequence[Row[Any]]]:
        """Yield the rows a page at a time; each query runs inside ``guard()``."""
        params: dict[str, Any] | None = None
        while True:
            with guard():
                query = self.first if params is None else self.following
                rows = (await conn.execute(query, params or {})).all()
            if rows:
                yield rows
            if len(rows) < self.limit:
                return
            last = rows[-1]._mapping
            params = {f"after_{name}": last[name] for name in self.key}
