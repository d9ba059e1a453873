"""What differs by dialect, one package each (as SQLAlchemy groups its dialects)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from ..runner import Runner
from .mysql.runner import MySQLRunner
from .postgresql.runner import PostgresRunner
from .sqlite.runner import SQLiteRunner

__all__ = ["make_runner"]


def make_runner(engine: AsyncEngine) -> Runner:
    """Return the runner for the engine's driver (aiosqlite, asyncpg or asyncmy)."""
    if engine.dialect.name == "sqlite":
        return SQLiteRunner(engine)
    if engine.dialect.name in ("mysql", "mariadb"):
        return MySQLRunner(engine)
    return PostgresRunner(engine)
