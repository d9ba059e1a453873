"""MySQL (MariaDB) only: its URLs, the server's settings a store checks, its errors, and
writers that meet on one session row."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    DeletionIncompleteError,
    Event,
    Manager,
    SessionExistsError,
    SQLStore,
    StaleSessionError,
    StoreError,
    StoreUnavailableError,
)
from support.sql import data_statements, raw_mysql, statements

pytestmark = pytest.mark.mysql


@pytest.fixture
async def mysql_engine(migrated_mysql_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the run's migrated MySQL database, emptied first."""
    engine = create_async_engine(migrated_mysql_url)
    async with engine.begin() as conn:
        for table in (
            "ds_sessions", "ds_user_state", "ds_app_state", "ds_memories", "ds_memory_terms",
            "ds_keys",
        ):  # fmt: skip
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    yield engine
    await engine.dispose()


@pytest.mark.parametrize("scheme", ["mysql", "mariadb", "mysql+asyncmy", "mariadb+asyncmy"])
async def test_every_url_form_migrates_and_runs(
    scheme: str, fresh_mysql_url: Callable[[], str]
) -> None:
    url = make_url(fresh_mysql_url()).set(drivername=scheme)
    store = SQLStore.from_url(url.render_as_string(hide_password=False))
    try:
        assert store.engine.dialect.driver == "asyncmy"
        await store.migrate()
        session = await Manager(store, app_name="app").create("org", "ada")
        await store.append_event("org", session.id, Event("user", content="hello"))
        assert [e.seq for e in await store.list_events("org", session.id)] == [1]
    finally:
        await store.close()


async def test_a_small_max_allowed_packet_is_one_typed_error_naming_the_setting(
    mysql_engine: AsyncEngine,
) -> None:
    # A value as large as the server's whole packet cannot fit in a statement.
    async with raw_mysql(str(mysql_engine.url)) as conn, conn.cursor() as cursor:
        await cursor.execute("SELECT @@max_allowed_packet")
        (packet,) = await cursor.fetchone()
    limit = packet  # a value of the whole packet cannot fit in a statement of it
    store = SQLStore(mysql_engine, max_value_bytes=limit)
    with pytest.raises(StoreError, match="max_allowed_packet") as caught:
        await Manager(store, app_name="app").create("org", "ada")
    assert "set max_allowed_packet" in str(caught.value)
    assert await Manager(SQLStore(mysql_engine), app_name="app").create("org", "ada")


@pytest.mark.parametrize("keyring", [False, True], ids=["plain", "keyring"])
async def test_a_stores_first_operation_asks_the_server_once(
    mysql_engine: AsyncEngine, keyring: bool, tmp_path: Path
) -> None:
    """The server's settings a store checks at its first operation (its packet size and,
    with a keyring, the title column's size) come in one read, before the operation's own
    statements and never again."""
    ring = None
    if keyring:
        from durable_sessions.crypto import LocalKeyring

        ring = LocalKeyring(tmp_path / "keys.json")
    created = await Manager(SQLStore(mysql_engine, keyring=ring), app_name="app").create("o", "u")
    store = SQLStore(mysql_engine, keyring=ring)
    with statements(mysql_engine) as seen:
        assert await store.get("o", created.id)
    settings = [s for s in data_statements(seen) if "@@max_allowed_packet" in s]
    assert len(settings) == 1
    assert ("information_schema" in settings[0]) is keyring
    assert "@@max_allowed_packet" in data_statements(seen)[0]
    with statements(mysql_engine) as again:
        assert await store.get("o", created.id)
    assert not [s for s in data_statements(again) if "@@" in s or "information_schema" in s]


async def test_concurrent_appends_get_gapless_seqs(mysql_engine: AsyncEngine) -> None:
    store = SQLStore(mysql_engine)
    session = await Manager(store, app_name="app").create("org", "ada")
    await asyncio.gather(
        *(
            store.append_event(
                "org", session.id, Event("user", content=f"m{i}", state_delta={"user:k": i})
            )
            for i in range(30)
        )
    )
    events = await store.list_events("org", session.id)
    assert [e.seq for e in events] == list(range(1, 31))
    assert sorted(e.content for e in events) == sorted(f"m{i}" for i in range(30))
    got = await store.get("org", session.id)
    assert got.message_count == 30
    assert got.version == 31


async def test_concurrent_saves_of_one_version_let_one_win(mysql_engine: AsyncEngine) -> None:
    store = SQLStore(mysql_engine)
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "ada")
    copies = [await store.get("org", session.id) for _ in range(8)]
    for index, copy in enumerate(copies):
        copy.state["who"] = index
    results = await asyncio.gather(*(manager.save(copy) for copy in copies), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, StaleSessionError) for r in results if isinstance(r, BaseException))
    assert (await store.get("org", session.id)).version == 2


@pytest.mark.parametrize("watched", [False, True])
async def test_a_write_that_keeps_waiting_for_a_lock_fails_typed_and_writes_nothing(
    migrated_mysql_url: str, mysql_engine: AsyncEngine, watched: bool
) -> None:
    store = SQLStore(mysql_engine)
    session = await Manager(store, app_name="app").create("org", "ada")
    # The writer's lock waits end after a second (1205), and each is tried again.
    waiting = create_async_engine(
        migrated_mysql_url, connect_args={"init_command": "SET innodb_lock_wait_timeout = 1"}
    )
    try:
        async with raw_mysql(migrated_mysql_url) as holder, holder.cursor() as cursor:
            await cursor.execute("START TRANSACTION")
            await cursor.execute(
                "SELECT version FROM ds_sessions WHERE org_id = 'org' AND id = %s FOR UPDATE",
                (session.id,),
            )
            # Watched (a listener on the engine): through SQLAlchemy's execution layer.
            watching = statements(waiting) if watched else contextlib.nullcontext()
            with watching, pytest.raises(StoreError, match="Lock wait timeout"):
                await SQLStore(waiting).append_event("org", session.id, Event("user", "x"))
            await cursor.execute("ROLLBACK")
    finally:
        await waiting.dispose()
    assert await store.list_events("org", session.id) == []
    assert (await store.get("org", session.id)).version == 1


@pytest.mark.parametrize("watched", [False, True])
async def test_an_erasure_bounds_its_lock_waits_and_puts_the_connections_own_back(
    migrated_mysql_url: str, mysql_engine: AsyncEngine, watched: bool
) -> None:
    # The connection's own lock wait (an hour) is far longer than the store's lock_timeout:
    # the erasure gives up within the store's (a hung one fails after 30 s), then the
    # connection has its own again.
    await Manager(SQLStore(mysql_engine), app_name="app").create("org", "ada", id="held")
    engine = create_async_engine(
        migrated_mysql_url,
        pool_size=1,
        max_overflow=0,
        connect_args={"init_command": "SET innodb_lock_wait_timeout = 3600"},
    )
    try:
        store = SQLStore(engine, lock_timeout=0.2)
        async with raw_mysql(migrated_mysql_url) as holder, holder.cursor() as cursor:
            await holder.begin()
            await cursor.execute(
                "SELECT 1 FROM ds_sessions WHERE org_id = 'org' AND id = 'held' FOR UPDATE"
            )
            watching = statements(engine) if watched else contextlib.nullcontext()
            with watching, pytest.raises(DeletionIncompleteError, match="1 matching session"):
                await asyncio.wait_for(store.delete_user("org", "ada"), 30)
            await holder.rollback()
        async with engine.connect() as conn:  # the pool's one connection
            own = await conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout")
            assert own.scalar_one() == 3600
        assert await store.delete_user("org", "ada") == 1
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"password": "wrong"}, "Access denied"),
        ({"database": "ds_no_such_database"}, "Unknown database"),
        ({"port": 1}, "could not connect"),
    ],
)
async def test_connection_errors_are_one_typed_line(
    change: dict[str, object], expected: str, migrated_mysql_url: str
) -> None:
    url = make_url(migrated_mysql_url).set(**change)  # type: ignore[arg-type]
    store = SQLStore.from_url(url.render_as_string(hide_password=False))
    try:
        with pytest.raises(StoreUnavailableError, match=expected) as caught:
            await store.get("org", "s")
    finally:
        await store.close()
    assert "\n" not in str(caught.value)
    assert "wrong" not in str(caught.value)


async def test_a_watched_engine_raises_the_same_errors(mysql_engine: AsyncEngine) -> None:
    store = SQLStore(mysql_engine)
    with statements(mysql_engine) as seen:  # through SQLAlchemy's execution layer
        await Manager(store, app_name="app").create("org", "ada", id="s")
        with pytest.raises(SessionExistsError):
            await Manager(store, app_name="app").create("org", "bob", id="s")
        first, second = await store.get("org", "s"), await store.get("org", "s")
        first.state["k"] = second.state["k"] = 1
        await Manager(store, app_name="app").save(first)
        with pytest.raises(StaleSessionError):
            await Manager(store, app_name="app").save(second)
    assert seen
    assert (await store.get("org", "s")).user_id == "ada"
