"""Run the bundled Alembic migrations on a live async engine.

Alembic owns the schema of durable-sessions. The migration scripts ship inside the package
(``durable_sessions/migrations``), keep their own version table
(``durable_sessions_alembic_version``, apart from the host application's
``alembic_version``) and run on the caller's engine: no ini file, no second synchronous
driver. Concurrent upgrades of one database from several processes are safe: a lock held
across the run (a Postgres advisory lock; a ``flock`` beside a SQLite file) lets the first
process migrate, and the others find the schema at head.

Migrations run online: each revision commits on its own, DDL waits at most ``lock_timeout``
seconds for a lock (and is tried again), and the revisions that fill data do it in batches
of short transactions, reporting progress (``docs/guides/migrations.md``).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import SchemaTooNewError
from .dialects.postgresql.isolation import pin_read_committed, reads_uncommitted_by_default
from .schema import VERSION_TABLE
from .translate import translated

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "MigrationReport",
    "check_known",
    "current",
    "downgrade",
    "head",
    "is_current",
    "script_location",
    "upgrade",
]

_T = TypeVar("_T")

_ALEMBIC_LOCK = threading.Lock()
"""Alembic's commands install process-wide proxies (``alembic.context``, ``alembic.op``),
so at most one command runs per process at a time, whatever the thread or event loop."""

_ALEMBIC_LOCK_POLL = 0.01
"""Seconds between attempts at ``_ALEMBIC_LOCK``; polling never blocks the event loop."""

_PACKAGED = Path(__file__).resolve().parents[1] / "migrations"
_CHECKOUT = Path(__file__).resolve().parents[3] / "migrations"


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


def _config(connection: Connection | None = None, **attributes: Any) -> Config:
    """Build the Alembic configuration in memory, optionally bound to a connection, with
    ``attributes`` for env.py (``lock_timeout``, ``progress``, ``migration_report``)."""
    cfg = Config()
    # Config values go through configparser interpolation: escape any "%" in the path.
    cfg.set_main_option("script_location", script_location().replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    cfg.attributes.update({k: v for k, v in attributes.items() if v is not None})
    return cfg


# -- what a migration did --------------------------------------------------------------------

DEFAULT_LOCK_TIMEOUT = 1.0
"""Seconds a migration statement waits for a table's lock before it gives up and tries
again (so a migration never queues long behind a transaction, nor anyone long behind it)."""


@dataclass(frozen=True)
class MigrationReport:
    """What one ``upgrade`` or ``downgrade`` call did."""

    before: str | None
    """The revision the database was at when this call got the migration lock (after any
    other process's migration that held it)."""
    after: str | None
    """The revision the database is at now."""
    applied: tuple[str, ...]
    """The revisions this call ran, in order (upgraded to, or downgraded from); empty when
    another process had done the work, or there was none."""

    @property
    def changed(self) -> bool:
        """Whether this call ran any revision."""
        return bool(self.applied)


def _check_lock_timeout(seconds: float | None) -> None:
    if seconds is not None and not 0 < seconds < float("inf"):
        raise ValueError(f"lock_timeout must be a positive number of seconds, not {seconds!r}")


async def _migrate(
    engine: AsyncEngine,
    command_fn: Callable[[Config, str], None],
    revision: str,
    lock_timeout: float | None,
    progress: Callable[[str], None] | None,
) -> MigrationReport:
    _check_lock_timeout(lock_timeout)
    report: dict[str, Any] = {}

    def run(connection: Connection) -> str | None:
        check_known(_revision_of(connection))
        attributes = {"lock_timeout": lock_timeout, "progress": progress}
        command_fn(_config(connection, migration_report=report, **attributes), revision)
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

    after = await _run_command(engine, run)
    return MigrationReport(report.get("before"), after, tuple(report.get("applied", ())))


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
            # Revisions switch the connection to autocommit and back; a connection whose
            # default SQLAlchemy cannot restore (READ UNCOMMITTED) runs at READ COMMITTED,
            # the level Postgres gives READ UNCOMMITTED, and is closed, not returned to the
            # pool, when the migration ends.
            discard = reads_uncommitted_by_default(conn)
            if discard:
                await conn.execution_options(isolation_level="READ COMMITTED")
            try:
                result = await conn.run_sync(fn)
                if write:
                    await conn.commit()
                else:
                    await conn.rollback()
            finally:
                if discard:
                    await conn.invalidate()
            return result


async def _run_command(engine: AsyncEngine, fn: Callable[[Connection], _T]) -> _T:
    """Run an Alembic command on the engine, one command per process at a time.

    Other processes are kept out by the lock env.py takes in the database.
    """
    # A non-blocking attempt in a loop: cancellation while waiting never leaks the lock,
    # other tasks of this event loop keep running meanwhile, and the lock spans threads
    # and event loops, which an asyncio.Event or asyncio.Lock cannot.
    while not _ALEMBIC_LOCK.acquire(blocking=False):  # noqa: ASYNC110
        await asyncio.sleep(_ALEMBIC_LOCK_POLL)
    try:
        return await _run(engine, fn, write=True)
    finally:
        _ALEMBIC_LOCK.release()


async def upgrade(
    engine: AsyncEngine,
    revision: str = "head",
    *,
    lock_timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Upgrade the database to ``revision``, by default the newest, online.

    Safe to call from several processes at once, and a no-op at the target revision. The
    service may keep reading and writing meanwhile; a call killed midway leaves every
    revision it finished committed, and the next call resumes.

    Args:
        engine: An async engine on the database (``sqlite+aiosqlite`` or
            ``postgresql+asyncpg``).
        revision: The target revision id, or ``"head"``.
        lock_timeout: Seconds a statement waits for a lock before it is tried again
            (default ``DEFAULT_LOCK_TIMEOUT``).
        progress: Called with each progress line (long backfills report every few
            seconds); the lines also go to the ``durable_sessions.migrations`` log.

    Returns:
        What this call did: the revision it found, the one it left, those it ran.

    Raises:
        StoreUnavailableError: The database could not be reached.
        SchemaTooNewError: A newer durable-sessions migrated the database.
        alembic.util.CommandError: ``revision`` is unknown.
        ValueError: ``lock_timeout`` is not a positive number.
    """
    return await _migrate(engine, command.upgrade, revision, lock_timeout, progress)


async def downgrade(
    engine: AsyncEngine,
    revision: str,
    *,
    lock_timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Downgrade the database to ``revision``.

    ``"base"`` drops every table of the library; the version table stays, empty.
    Downgrades keep the data they promise but are not all online: some rewrite a table.

    Args:
        engine: An async engine on the database.
        revision: The target revision id, ``"base"``, or a relative step such as ``"-1"``.
        lock_timeout: As for ``upgrade``.
        progress: As for ``upgrade``.

    Returns:
        What this call did.

    Raises:
        StoreUnavailableError: The database could not be reached.
        SchemaTooNewError: A newer durable-sessions migrated the database.
        alembic.util.CommandError: ``revision`` is unknown.
        ValueError: ``lock_timeout`` is not a positive number.
    """
    return await _migrate(engine, command.downgrade, revision, lock_timeout, progress)


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

    return await _run(engine, _revision_of, write=False)


def _revision_of(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def check_known(revision: str | None) -> None:
    """Raise unless ``revision`` is None or one of the revisions this library ships.

    Raises:
        SchemaTooNewError: ``revision`` is not one of them: a newer durable-sessions
            migrated the database.
    """
    if revision is None:
        return
    try:
        found = ScriptDirectory.from_config(_config()).get_revision(revision)
    except CommandError:
        found = None
    if found is None:
        raise SchemaTooNewError(revision, head())


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
