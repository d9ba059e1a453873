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

Every run takes a lock first thing in its transaction, so processes that migrate the same
database at once serialise and all but the first find the schema already at head:
``pg_advisory_xact_lock`` on Postgres, ``BEGIN IMMEDIATE`` (the database write lock) on
SQLite. The whole upgrade is one transaction on both dialects.
"""

from __future__ import annotations

import asyncio
import logging
import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from alembic.util import CommandError
from sqlalchemy import URL, pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions.errors import InvalidArgumentError
from durable_sessions.sql.schema import VERSION_TABLE, metadata
from durable_sessions.sql.urls import async_url

URL_ENV = "DURABLE_SESSIONS_URL"
"""The environment variable the ``alembic`` command line reads the database URL from."""

PG_LOCK_KEY = 0x64736D6967726174
"""The Postgres advisory lock key of durable-sessions migrations (ASCII ``dsmigrat``)."""

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


def configure(dialect_name: str, **kwargs: Any) -> None:
    """Configure the migration context with the options every run shares."""
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        render_as_batch=dialect_name == "sqlite",
        # SQLite runs DDL transactionally too; one transaction lets BEGIN IMMEDIATE cover
        # the version check, every revision and the version stamp.
        transactional_ddl=True,
        **kwargs,
    )


def take_migration_lock(connection: Connection) -> None:
    """Serialise concurrent migrations; the lock ends with the migration transaction."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_LOCK_KEY})")
    elif dialect == "sqlite":
        driver_connection = connection.connection.driver_connection
        # pysqlite's default mode defers BEGIN to the first write; take the write lock
        # now instead. If the caller's connection already opened a transaction, it cannot
        # be upgraded, and the first write takes the lock.
        if not getattr(driver_connection, "in_transaction", False):
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def run_migrations_offline() -> None:
    """Emit the migration SQL as a script (``alembic upgrade --sql``)."""
    url = database_url()
    configure(
        url.get_backend_name(),
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        if url.get_backend_name() == "postgresql":
            context.execute(f"SELECT pg_advisory_xact_lock({PG_LOCK_KEY})")
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    """Run the migrations on a synchronous connection, in one locked transaction."""
    configure(connection.dialect.name, connection=connection)
    with context.begin_transaction():
        take_migration_lock(connection)
        context.run_migrations()


async def run_async_migrations() -> None:
    """Run the migrations on a new async engine built from the configured URL."""
    engine = create_async_engine(database_url(), poolclass=pool.NullPool)
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
