"""Run the bundled Alembic migrations on a live async engine.

Alembic owns the schema of durable-sessions. The migration scripts ship inside the package
(``durable_sessions/migrations``), keep their own version table
(``durable_sessions_alembic_version``, apart from the host application's
``alembic_version``) and run on the caller's engine: no ini file, no second synchronous
driver. Concurrent upgrades of one database from several processes are safe; the migration
transaction starts with a Postgres advisory lock or SQLite's ``BEGIN IMMEDIATE``, so the
first process migrates and the others find the schema at head.

Example::

    from sqlalchemy.ext.asyncio import create_async_engine
    from durable_sessions import migrate

    engine = create_async_engine("postgresql+asyncpg://app@db/app")
    await migrate.upgrade(engine)
    assert await migrate.is_current(engine)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from .sql.dialect import pin_read_committed
from .sql.schema import VERSION_TABLE
from .sql.translate import translated

__all__ = ["current", "downgrade", "head", "is_current", "script_location", "upgrade"]

_T = TypeVar("_T")

_ALEMBIC_LOCK = threading.Lock()
"""Alembic's commands install process-wide proxies (``alembic.context``, ``alembic.op``),
so at most one command runs per process at a time, whatever the thread or event loop."""

_ALEMBIC_LOCK_POLL = 0.01
"""Seconds between attempts at ``_ALEMBIC_LOCK``; polling never blocks the event loop."""

_PACKAGED = Path(__file__).resolve().parent / "migrations"
_CHECKOUT = Path(__file__).resolve().parents[2] / "migrations"


def script_location() -> str:
    """Return the directory holding the Alembic environment and revisions.

    An installed wheel carries them as ``durable_sessions/migrations``; an editable or
    development install uses ``migrations/`` at the root of the checkout.

    Returns:
        The absolute path of the migrations directory.

    Raises:
        RuntimeError: Neither location holds the migration scripts (a broken install).
    """
    for candidate in (_PACKAGED, _CHECKOUT):
        if (candidate / "env.py").is_file():
            return str(candidate)
    raise RuntimeError(
        "durable-sessions cannot find its migration scripts: neither "
        f"{_PACKAGED} nor {_CHECKOUT} exists; reinstall the package"
    )


def _config(connection: Connection | None = None) -> Config:
    """Build the Alembic configuration in memory, optionally bound to a connection."""
    cfg = Config()
    # Config values go through configparser interpolation: escape any "%" in the path.
    cfg.set_main_option("script_location", script_location().replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


async def _run(engine: AsyncEngine, fn: Callable[[Connection], _T], *, write: bool) -> _T:
    """Run ``fn`` on a synchronous view of one of the engine's connections.

    Args:
        engine: The caller's async engine.
        fn: The work, given the synchronous ``Connection`` behind ``run_sync``.
        write: Commit when ``fn`` returns (migrations); otherwise roll back (reads).

    Returns:
        What ``fn`` returned.

    Raises:
        StoreUnavailableError: The database could not be reached or dropped the connection.
        StoreError: The database failed a statement of the migration.
    """
    # The one error map: a database that cannot be reached is StoreUnavailableError with
    # the driver's message. Migrations open SQLite files as SQLAlchemy does (creating a
    # missing one); the command checks for the file itself where it must not.
    with translated("migrate" if write else "read the schema revision", creates=True):
        async with engine.connect() as conn:
            # Each statement sees what other migrators committed while this one waited for
            # the advisory lock, whatever isolation level the engine defaults to.
            await pin_read_committed(conn)
            result = await conn.run_sync(fn)
            if write:
                await conn.commit()
            else:
                await conn.rollback()
            return result


async def _run_command(engine: AsyncEngine, fn: Callable[[Connection], None]) -> None:
    """Run an Alembic command on the engine, one command per process at a time.

    Other processes are kept out by the lock env.py takes in the database.
    """
    # A non-blocking attempt in a loop: cancellation while waiting never leaks the lock,
    # other tasks of this event loop keep running meanwhile, and the lock spans threads
    # and event loops, which an asyncio.Event or asyncio.Lock cannot.
    while not _ALEMBIC_LOCK.acquire(blocking=False):  # noqa: ASYNC110
        await asyncio.sleep(_ALEMBIC_LOCK_POLL)
    try:
        await _run(engine, fn, write=True)
    finally:
        _ALEMBIC_LOCK.release()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database to ``revision``, by default the newest.

    Safe to call from several processes at once, and a no-op at the target revision.

    Args:
        engine: An async engine on the database (``sqlite+aiosqlite`` or
            ``postgresql+asyncpg``).
        revision: The target revision id, or ``"head"``.

    Raises:
        StoreUnavailableError: The database could not be reached.
        alembic.util.CommandError: ``revision`` is unknown.
    """

    def run(connection: Connection) -> None:
        command.upgrade(_config(connection), revision)

    await _run_command(engine, run)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Downgrade the database to ``revision``.

    ``"base"`` drops every table of the library; the version table stays, empty.

    Args:
        engine: An async engine on the database.
        revision: The target revision id, ``"base"``, or a relative step such as ``"-1"``.

    Raises:
        StoreUnavailableError: The database could not be reached.
        alembic.util.CommandError: ``revision`` is unknown.
    """

    def run(connection: Connection) -> None:
        command.downgrade(_config(connection), revision)

    await _run_command(engine, run)


async def current(engine: AsyncEngine) -> str | None:
    """Return the revision the database is at.

    Args:
        engine: An async engine on the database.

    Returns:
        The revision id, or None when the database was never migrated or was downgraded
        to base.

    Raises:
        StoreUnavailableError: The database could not be reached.
    """

    def run(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

    return await _run(engine, run, write=False)


async def is_current(engine: AsyncEngine) -> bool:
    """Tell whether the database is at the newest revision this library ships.

    Args:
        engine: An async engine on the database.

    Returns:
        True only when the database is at head; False when it is unmigrated or behind.

    Raises:
        StoreUnavailableError: The database could not be reached.
    """
    return await current(engine) == head()


def head() -> str:
    """Return the newest revision id this library ships.

    Returns:
        The head revision id.

    Raises:
        RuntimeError: The migration scripts are missing or have no single head.
    """
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    if revision is None:
        raise RuntimeError(f"no migration revisions found in {script_location()}")
    return revision
