"""Alembic environment of durable-sessions.

Two ways in:

* ``durable_sessions.sql.migrate`` (and ``await store.migrate()``) puts a synchronous
  ``Connection`` into ``config.attributes["connection"]`` from inside
  ``AsyncConnection.run_sync``; the migrations run on that connection.
* The ``alembic`` command line builds its own async engine from the URL in the environment
  variable ``DURABLE_SESSIONS_URL`` (falling back to ``sqlalchemy.url`` in the ini file).
  ``postgresql://`` and ``sqlite://`` URLs are mapped to asyncpg and aiosqlite by
  ``durable_sessions.sql.urls``, as the command line and ``SQLStore.from_url`` do; no second,
  synchronous driver is ever loaded. A missing or unusable URL is one ``FAILED:`` line.

Online: each revision commits on its own (``transaction_per_migration``), and the revisions
that touch data do it in short steps of their own (``online.py``: DDL under a lock timeout,
batched backfills, indexes built concurrently), so that the service keeps reading and
writing while a migration runs. Processes that migrate the same database at once serialise
on a lock held across all the revisions, apart from any transaction, and all but the first
find the schema already at head: a session-level advisory lock on Postgres (released when
the run ends, or when its connection dies), a named lock (``GET_LOCK``) on MySQL, an
exclusive ``flock`` of the file
``<database>.migrate-lock`` beside a SQLite database (removed at the end of the run; a killed
run leaves it, unlocked, to the next).

Options (``config.attributes``, set by ``durable_sessions.sql.migrate``; on the ``alembic``
command line ``-x lock_timeout=SECONDS`` or ``$DURABLE_SESSIONS_LOCK_TIMEOUT``):
``lock_timeout`` (seconds a statement waits for a lock before it is tried again),
``progress`` (called with each progress line; they also go to the
``durable_sessions.migrations`` log), and ``migration_report`` (a dict this run fills with
the revision found under the lock, ``"before"``, and the revisions it ran, ``"applied"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from logging.config import fileConfig
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import URL, event, pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions.errors import InvalidArgumentError, SchemaTooNewError
from durable_sessions.sql.migrate import DEFAULT_LOCK_TIMEOUT, check_known
from durable_sessions.sql.schema import VERSION_TABLE, metadata
from durable_sessions.sql.urls import async_url, missing_driver

URL_ENV = "DURABLE_SESSIONS_URL"
"""The environment variable the ``alembic`` command line reads the database URL from."""

PG_LOCK_KEY = 0x64736D6967726174
"""The Postgres advisory lock key of durable-sessions migrations (ASCII ``dsmigrat``)."""

PG_LOCK_POLL = 0.2
"""Seconds between two attempts at the advisory lock while another migration holds it."""

LOCK_TIMEOUT_ENV = "DURABLE_SESSIONS_LOCK_TIMEOUT"
"""The environment variable the ``alembic`` command line reads the lock timeout from."""


PROGRESS_AFTER = 2.0
"""A revision that took this many seconds or more reports its end to the caller."""

log = logging.getLogger("durable_sessions.migrations")

SQLITE_LOCK_SUFFIX = ".migrate-lock"
"""The file beside a SQLite database whose ``flock`` serialises migrations."""

config = context.config

if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
    # The alembic command prints an error as its one "FAILED: ..." line; do not log it twice.
    logging.getLogger("alembic.util.messaging").setLevel(logging.CRITICAL)

target_metadata = metadata


def database_url() -> URL:
    """Return the async URL of the database to migrate from the environment or the ini file.

    Raises:
        CommandError: No URL is set, or it is not one durable-sessions runs on; the
            ``alembic`` command prints it as one ``FAILED:`` line, without a traceback.
    """
    raw = os.environ.get(URL_ENV) or config.get_main_option("sqlalchemy.url")
    if not raw:
        raise CommandError(
            f"no database URL: set {URL_ENV}, for example "
            f"{URL_ENV}=sqlite:///sessions.db alembic upgrade head"
        )
    try:
        return async_url(raw)
    except InvalidArgumentError as exc:
        raise CommandError(f"{URL_ENV}: {exc}") from None


def lock_timeout() -> float:
    """The lock timeout in seconds: the caller's, ``-x lock_timeout=``, the environment's,
    or ``DEFAULT_LOCK_TIMEOUT``.

    Raises:
        CommandError: The value is not a positive number of seconds.
    """
    raw: Any = config.attributes.get("lock_timeout")
    if raw is None:
        raw = context.get_x_argument(as_dictionary=True).get("lock_timeout")
    if raw is None:
        raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_LOCK_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise CommandError(f"the lock timeout must be a positive number of seconds, not {raw!r}")
    return seconds


def progress(message: str) -> None:
    """Hand a progress line to the caller's callback, if it gave one."""
    callback: Callable[[str], None] | None = config.attributes.get("progress")
    if callback is not None:
        callback(message)


def configure(dialect_name: str, **kwargs: Any) -> None:
    """Configure the migration context with the options every run shares."""
    report: dict[str, Any] = config.attributes.get("migration_report", {})
    report.setdefault("applied", [])

    last = [time.monotonic()]

    def applied(*, step: Any, **_: Any) -> None:
        report["applied"].append(step.up_revision_id)  # upgraded to, or downgraded from
        now = time.monotonic()
        done = "committed" if step.is_upgrade else "undone"
        line = f"revision {step.up_revision_id} {done} ({now - last[0]:.1f} s)"
        log.info(line)
        if now - last[0] >= PROGRESS_AFTER:  # a quick one says nothing on the command line
            progress(line)
        last[0] = now

    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        render_as_batch=dialect_name == "sqlite",
        # Each revision commits on its own, its version stamp with it; a revision's online
        # steps commit their own short transactions within it.
        transactional_ddl=True,
        transaction_per_migration=True,
        on_version_apply=applied,
        durable_sessions_online={
            "lock_timeout": lock_timeout(),
            "progress": config.attributes.get("progress"),
        },
        **kwargs,
    )


@contextlib.contextmanager
def _postgres_lock(connection: Connection) -> Iterator[None]:
    """Hold the migration advisory lock (session level) and the lock timeout."""
    # Wait for our turn by polling, in short transactions: a migrator blocked inside one
    # statement (pg_advisory_lock) would hold a snapshot, which the running migration's
    # CREATE INDEX CONCURRENTLY waits for: a deadlock.
    waited = False
    while True:
        got = connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({PG_LOCK_KEY})").scalar()
        connection.commit()
        if got:
            break
        if not waited:
            progress("another migration of this database is running; waiting for it to end")
            waited = True
        connection.exec_driver_sql(f"SELECT pg_sleep({PG_LOCK_POLL})")
        connection.commit()
    ms = max(1, round(lock_timeout() * 1000))
    connection.exec_driver_sql(f"SET lock_timeout = '{ms}ms'")
    connection.commit()
    try:
        yield
    finally:
        # The connection goes back to the caller's pool: its settings as they were.
        if connection.in_transaction():
            connection.rollback()
        connection.exec_driver_sql("RESET lock_timeout")
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({PG_LOCK_KEY})")
        connection.commit()


def _sqlite_file(connection: Connection) -> str | None:
    """The file of the main database, or None (in memory, or a temporary database)."""
    for row in connection.exec_driver_sql("PRAGMA database_list"):
        if row[1] == "main":
            return str(row[2]) or None
    return None


@contextlib.contextmanager
def _sqlite_lock(connection: Connection) -> Iterator[None]:
    """Hold an exclusive ``flock`` of the database's lock file; every transaction of the run
    takes the write lock at its start (``BEGIN IMMEDIATE``), as a writer of the store does."""

    def begin_immediate(conn: Connection) -> None:
        # Not inside Alembic's autocommit blocks: online.py runs its own transactions there.
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    path = _sqlite_file(connection)
    if connection.in_transaction():
        connection.commit()
    handle = None
    try:
        import fcntl
    except ImportError:  # no flock (Windows): concurrent migrators are not serialised
        fcntl = None  # type: ignore[assignment]
    if path is not None and fcntl is not None:
        handle = _flock(path + SQLITE_LOCK_SUFFIX, fcntl)
    event.listen(connection, "begin", begin_immediate)
    try:
        yield
    finally:
        event.remove(connection, "begin", begin_immediate)
        if handle is not None:
            # Removed while still held: a migrator waiting on this file then sees that the
            # path no longer names what it locked, and starts over on a new file.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(handle.name)
            handle.close()  # releases the flock


def _flock(lock_path: str, fcntl: Any) -> Any:
    """Open and exclusively ``flock`` the file ``lock_path``, waiting for another migrator;
    return the open file once the lock is held on the file the path names."""
    waited = False
    while True:
        handle = open(lock_path, "a")  # noqa: SIM115 (held until the run ends)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not waited:
                progress("another migration of this database is running; waiting for it to end")
                waited = True
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            named = os.stat(lock_path)
        except FileNotFoundError:
            named = None
        held = os.fstat(handle.fileno())
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return handle
        handle.close()  # the previous holder removed it: lock the path's new file


MYSQL_LOCK_NAME = "durable_sessions_migrate"
"""The MySQL named lock (``GET_LOCK``) of durable-sessions migrations."""


@contextlib.contextmanager
def _mysql_lock(connection: Connection) -> Iterator[None]:
    """Hold the migration's named lock (a session's: released when the run ends, or when
    its connection dies) and bound each statement's wait for a table's metadata lock."""
    name = f"{MYSQL_LOCK_NAME}:" + str(connection.exec_driver_sql("SELECT DATABASE()").scalar())
    got = connection.exec_driver_sql("SELECT GET_LOCK(%s, 0)", (name,)).scalar()
    if not got:
        progress("another migration of this database is running; waiting for it to end")
        while not connection.exec_driver_sql("SELECT GET_LOCK(%s, 60)", (name,)).scalar():
            pass
    before = connection.exec_driver_sql(
        "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout"
    ).one()
    seconds = max(1, round(lock_timeout()))
    # A table's metadata lock (DDL) and a row's lock (a backfill's batch) alike.
    connection.exec_driver_sql(
        f"SET SESSION lock_wait_timeout = {seconds}, innodb_lock_wait_timeout = {seconds}"
    )
    connection.commit()
    try:
        yield
    finally:
        if connection.in_transaction():
            connection.rollback()
        connection.exec_driver_sql(
            f"SET SESSION lock_wait_timeout = {int(before[0])}, "
            f"innodb_lock_wait_timeout = {int(before[1])}"
        )
        connection.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (name,))
        connection.commit()


def take_migration_lock(connection: Connection) -> contextlib.AbstractContextManager[None]:
    """Serialise concurrent migrations of the database across every revision of the run."""
    if connection.dialect.name == "postgresql":
        return _postgres_lock(connection)
    if connection.dialect.name in ("mysql", "mariadb"):
        return _mysql_lock(connection)
    if connection.dialect.name == "sqlite":
        return _sqlite_lock(connection)
    return contextlib.nullcontext()


def run_migrations_offline() -> None:
    """Emit the migration SQL as a script (``alembic upgrade --sql``)."""
    url = database_url()
    configure(
        url.get_backend_name(),
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    postgres = url.get_backend_name() == "postgresql"
    if postgres:
        context.execute(f"SELECT pg_advisory_lock({PG_LOCK_KEY})")
    with context.begin_transaction():
        context.run_migrations()
    if postgres:
        context.execute(f"SELECT pg_advisory_unlock({PG_LOCK_KEY})")


def do_run_migrations(connection: Connection) -> None:
    """Run the migrations on a synchronous connection: each revision its own transaction,
    all under the migration lock."""
    if connection.in_transaction():
        connection.commit()  # Alembic would run everything inside an open transaction
    with take_migration_lock(connection):
        report: dict[str, Any] = config.attributes.get("migration_report", {})
        found = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        report["before"] = found.get_current_revision()
        connection.commit()
        try:
            check_known(report["before"])
        except SchemaTooNewError as exc:
            if config.attributes.get("connection") is None:  # the alembic command: one line
                raise CommandError(str(exc)) from None
            raise
        configure(connection.dialect.name, connection=connection)
        with context.begin_transaction():
            context.run_migrations()


async def run_async_migrations() -> None:
    """Run the migrations on a new async engine built from the configured URL."""
    url = database_url()
    try:
        engine = create_async_engine(url, poolclass=pool.NullPool)
    except ModuleNotFoundError:  # one FAILED: line naming the extra, not a traceback
        raise CommandError(missing_driver(url)) from None
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    """Run on the caller's connection when given one, else on a new async engine."""
    connection = config.attributes.get("connection")
    if connection is None:
        asyncio.run(run_async_migrations())
    elif isinstance(connection, Connection):
        do_run_migrations(connection)
    else:
        raise TypeError(
            'config.attributes["connection"] must be a synchronous sqlalchemy Connection '
            "(use AsyncConnection.run_sync), not " + type(connection).__name__
        )


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
