"""Helpers for the SQL-store tests: statements seen, their plans, table snapshots."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from sqlalchemy import event, make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions.sql.schema import metadata

SQL_BACKENDS = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
MYSQL = pytest.param("mysql", marks=pytest.mark.mysql)
"""MariaDB (or MySQL) through asyncmy: a database of the server named by
``DURABLE_SESSIONS_TEST_MYSQL_URL``."""
STORE_SQL_BACKENDS = [*SQL_BACKENDS, MYSQL]
"""The SQL backends of the store tests (``tests/stores/``), MySQL among them."""
PG_DISTRIBUTED = pytest.param("postgres-distributed", marks=pytest.mark.postgres_distributed)
"""Postgres in distributed mode (Citus's shape: stepwise writes), forced on plain Postgres:
its database has ``durable_sessions.distributed = on``, so every store on it runs so."""


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[tuple[str, Any]]]:
    """Record every statement the engine sends to the database inside the block."""
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: Any) -> None:
        seen.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", before)


def data_statements(seen: list[tuple[str, Any]]) -> list[str]:
    """The statements that read or write data (not BEGIN/COMMIT/PRAGMA)."""
    skip = ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA")
    return [s for s, _ in seen if not s.lstrip().upper().startswith(skip)]


def the_data_statement(seen: list[tuple[str, Any]]) -> tuple[str, Any]:
    """The one statement that read or wrote data, with its parameters (fails if not one)."""
    (sql,) = data_statements(seen)
    return sql, next(p for s, p in seen if s == sql)


async def pg_plan(
    engine: AsyncEngine,
    sql: str,
    params: Any = None,
    *,
    analyze: bool = False,
    settings: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Postgres's plan of one statement (``EXPLAIN (FORMAT JSON)``), every node, outermost first.

    ``settings`` are run first on the same connection (``"SET enable_seqscan = off"``).
    """
    option = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    async with engine.connect() as conn:
        for setting in settings:
            await conn.exec_driver_sql(setting)
        raw = (await conn.exec_driver_sql(f"EXPLAIN ({option}) {sql}", params)).scalar()
    nodes, todo = [], [(json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]]
    while todo:
        node = todo.pop(0)
        nodes.append(node)
        todo[:0] = node.get("Plans", [])
    return nodes


def index_scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The index scans of a plan (``pg_plan``), outermost first."""
    return [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]


async def sqlite_plan(engine: AsyncEngine, sql: str, params: Any = None) -> str:
    """SQLite's ``EXPLAIN QUERY PLAN`` of one statement: each step's detail, joined by " | "."""
    async with engine.connect() as conn:
        rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)).all()
    return " | ".join(str(row[-1]) for row in rows)


async def mysql_plan(engine: AsyncEngine, sql: str, params: Any = None) -> list[dict[str, Any]]:
    """MySQL's ``EXPLAIN`` of one statement: a dict per table read (``table``, ``type``,
    ``key``, ``Extra``, ...), in the order of the plan."""
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(f"EXPLAIN {sql}", params)
        return [dict(row._mapping) for row in result]


async def snapshot(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary-key order: equal snapshots mean nothing changed."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    async with engine.connect() as conn:
        for table in metadata.sorted_tables:
            rows = await conn.execute(select(table).order_by(*table.primary_key.columns))
            out[table.name] = [tuple(row) for row in rows]
    return out


@asynccontextmanager
async def raw_pg(url: str) -> AsyncIterator[Any]:
    """A plain asyncpg connection to the database named by a SQLAlchemy URL."""
    import asyncpg  # type: ignore[import-untyped]

    u = make_url(url)
    conn = await asyncpg.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password,
        database=u.database or "postgres",
    )
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def raw_mysql(url: str) -> AsyncIterator[Any]:
    """A plain asyncmy connection (autocommit) to the server named by a SQLAlchemy URL."""
    import asyncmy  # type: ignore[import-untyped]

    u = make_url(url)
    conn = await asyncmy.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=u.database,
        autocommit=True,
    )
    try:
        yield conn
    finally:
        conn.close()


def run_through_dbapi(dbapi_connection: Any, *sql: str) -> Any:
    """Run statements on a DBAPI connection as a pool listener gets it (SQLAlchemy's adapted
    driver connection: inside a pool event it awaits the driver through the greenlet), and
    return the first row of the last one, if any. Nothing ends the transaction the driver
    may begin for them (asyncpg's adapter for any statement, ``sqlite3`` before a change)."""
    cursor = dbapi_connection.cursor()
    try:
        for statement in sql:
            cursor.execute(statement)
        return cursor.fetchone() if cursor.description else None
    finally:
        cursor.close()
