"""Postgres transactions at READ COMMITTED, whatever the database's default."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["pin_read_committed", "reads_uncommitted_by_default"]


async def pin_read_committed(conn: AsyncConnection) -> None:
    """Run the transactions of ``conn`` (a Postgres connection through SQLAlchemy) at READ
    COMMITTED, whatever the engine's or the database's default; the pool restores the
    engine's level at check-in.

    Left alone where the default is READ UNCOMMITTED, which Postgres runs as READ COMMITTED
    and which SQLAlchemy could not set back at check-in (its asyncpg dialect refuses the
    name). The same on MySQL (where InnoDB's default is REPEATABLE READ). Nothing to do on
    SQLite.
    """
    if conn.dialect.name not in ("postgresql", "mysql", "mariadb"):
        return
    if reads_uncommitted_by_default(conn):
        return
    await conn.execution_options(isolation_level="READ COMMITTED")


def reads_uncommitted_by_default(conn: AsyncConnection) -> bool:
    """Whether ``conn`` is a Postgres connection whose default level is READ UNCOMMITTED:
    Postgres runs it as READ COMMITTED, but SQLAlchemy cannot set that name back on a
    connection whose level was changed, so such a connection's level is left alone."""
    return (
        conn.dialect.name == "postgresql"
        and getattr(conn.dialect, "default_isolation_level", None) == "READ UNCOMMITTED"
    )
