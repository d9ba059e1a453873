"""What the library's errors say: the driver's own message, never a URL or password, and
"may not have completed" only when a write could have reached the server. A SQLite file
that does not exist is not created by a store (``migrate()`` creates it)."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    Manager,
    SchemaNotMigratedError,
    SQLStore,
    StoreError,
    StoreUnavailableError,
)
from durable_sessions.sql.translate import translate_error, translated
from support.sql import raw_pg

NOT_DONE = "may not have completed"


@pytest.mark.postgres
async def test_a_missing_postgres_database_names_the_driver_message(pg_base_url: str) -> None:
    name = f"ds_missing_{uuid.uuid4().hex[:8]}"
    url = make_url(pg_base_url).set(database=name, password="s3cret-pw")
    store = SQLStore(create_async_engine(url))
    try:
        for write in (lambda: store.get("org", "id"), lambda: Manager(store).create("org", "u")):
            with pytest.raises(StoreUnavailableError) as caught:
                await write()
            message = str(caught.value)
            assert f'InvalidCatalogNameError: database "{name}" does not exist' in message
            assert "could not connect to the database" in message
            assert message.endswith("nothing was written")
            assert NOT_DONE not in message
            assert "s3cret-pw" not in message
    finally:
        await store.engine.dispose()


async def test_a_refused_connection_is_could_not_connect_without_the_password() -> None:
    store = SQLStore.from_url("postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await Manager(store).create("org", "u")
    finally:
        await store.close()
    message = str(caught.value)
    assert message.startswith("create: could not connect to the database (ConnectionRefusedError")
    assert NOT_DONE not in message
    assert "s3cret-pw" not in message


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never answers."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_connection_attempt_that_times_out_wrote_nothing(silent_server: int) -> None:
    # A TimeoutError may also end an established connection; here the store knows it was
    # still connecting.
    store = SQLStore.from_url(
        f"postgresql://ada@127.0.0.1:{silent_server}/x", connect_args={"timeout": 0.3}
    )
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await Manager(store).create("org", "u")
    finally:
        await store.close()
    message = str(caught.value)
    assert "could not connect to the database (TimeoutError" in message
    assert NOT_DONE not in message


@pytest.mark.postgres
async def test_a_connection_killed_in_use_may_not_have_completed(
    fresh_pg_url: Callable[[], str],
) -> None:
    url = fresh_pg_url()
    engine = create_async_engine(url, pool_size=1)
    store = SQLStore(engine)
    try:
        await store.migrate()
        manager = Manager(store)
        await manager.create("org", "u")  # the pool now holds a live connection
        async with raw_pg(url) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        with pytest.raises(StoreUnavailableError) as caught:
            await manager.create("org", "u")
        assert str(caught.value).startswith("create: the connection to the database failed (")
        assert NOT_DONE in str(caught.value)
    finally:
        await engine.dispose()


def test_messages_never_carry_a_url_or_password() -> None:
    leaky = sqlite3.OperationalError(
        "cannot open postgresql://ada:s3cret@db/app with password=s3cret\nsecond line"
    )
    message = str(translate_error("get", leaky))
    assert "s3cret" not in message
    assert "second line" not in message
    assert "OperationalError: cannot open [...] with [...]" in message


@pytest.mark.sqlite
async def test_a_missing_table_names_the_driver_message(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()  # a file, without the schema
    store = SQLStore.from_url(f"sqlite:///{path}")
    try:
        with pytest.raises(SchemaNotMigratedError, match="no such table: ds_sessions"):
            await store.get("org", "id")
    finally:
        await store.close()


@pytest.mark.sqlite
async def test_a_store_does_not_create_a_missing_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    store = SQLStore.from_url(f"sqlite:///{path}")
    try:
        for operation in (lambda: store.get("org", "id"), lambda: Manager(store).create("o", "u")):
            with pytest.raises(SchemaNotMigratedError, match="there is no database file") as e:
                await operation()
            assert "migrate" in str(e.value)
            assert not path.exists()
        await store.migrate()  # migrating creates it
        assert path.exists()
        session = await Manager(store).create("org", "u")
        assert (await store.get("org", session.id)).user_id == "u"
    finally:
        await store.close()


@pytest.mark.sqlite
async def test_the_applications_own_use_of_the_engine_still_creates_files(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        SQLStore(engine)
        async with engine.connect() as conn:  # not a store operation: SQLite as usual
            await conn.execute(text("SELECT 1"))
        assert path.exists()
    finally:
        await engine.dispose()


def test_translated_passes_other_errors_through_and_wraps_unknown_driver_failures() -> None:
    with pytest.raises(KeyError), translated("get"):
        raise KeyError("x")
    failed = r"^get: the database failed \(IntegrityError: boom\)"
    with pytest.raises(StoreError, match=failed), translated("get"):
        raise sqlite3.IntegrityError("boom")
    with pytest.raises(StoreUnavailableError, match="nothing was written"), translated("get"):
        raise socket.gaierror(-2, "Name or service not known")
