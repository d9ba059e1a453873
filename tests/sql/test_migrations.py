"""Alembic migrations: round trips, drift against the schema, concurrency and the CLI."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import String, delete, inspect, make_url, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    Event,
    InMemoryStore,
    Manager,
    Memory,
    SchemaNotMigratedError,
    SQLStore,
    StoreUnavailableError,
)
from durable_sessions.fulltext import search_vector
from durable_sessions.jsoncodec import to_json
from durable_sessions.memories import stored_terms
from durable_sessions.prepare import MAX_TITLE_BYTES, check_title
from durable_sessions.sql.migrate import (
    current,
    downgrade,
    head,
    is_current,
    script_location,
    upgrade,
)
from durable_sessions.sql.schema import (
    SEALED_TITLE_BYTES,
    VERSION_TABLE,
    keys,
    memories,
    metadata,
    sessions,
)
from support.revisions import load_revision, upgrade_released

REPO_ROOT = Path(__file__).resolve().parents[2]

TABLES = {
    "ds_sessions", "ds_user_state", "ds_app_state", "ds_events", "ds_memories", "ds_keys",
    "ds_memory_terms",
}  # fmt: skip
# Revision 0001's tables (ds_memories comes with revision 0010, ds_keys with 0011,
# ds_memory_terms with 0013).
TABLES_0001 = TABLES - {"ds_memories", "ds_keys", "ds_memory_terms"}
# Search (revision 0003), outside the SQLAlchemy metadata: SQLite's FTS5 table (with its
# shadow tables), its key table, view and triggers; Postgres's functions and GIN index.
SQLITE_SEARCH_TABLES = {
    "ds_events_fts", "ds_events_fts_data", "ds_events_fts_idx", "ds_events_fts_docsize",
    "ds_events_fts_config", "ds_events_fts_rowid",
}  # fmt: skip
SQLITE_SEARCH_TRIGGERS = {"ds_events_fts_insert", "ds_events_fts_delete", "ds_events_fts_update"}
# Memories' search (revision 0010): SQLite's FTS5 table, its shadow tables, key table, view
# and triggers; Postgres's generated vector and GIN index.
SQLITE_MEMORY_TABLES = {
    "ds_memories_fts", "ds_memories_fts_data", "ds_memories_fts_idx",
    "ds_memories_fts_docsize", "ds_memories_fts_config", "ds_memories_fts_rowid",
}  # fmt: skip
SQLITE_MEMORY_OBJECTS = SQLITE_MEMORY_TABLES | {
    "ds_memories_fts_insert", "ds_memories_fts_delete", "ds_memories_fts_update",
    "ds_memories_fts_text",
}  # fmt: skip
PG_MEMORY_INDEX = "ix_ds_memories_search"
PG_SEARCH_FUNCTIONS = {"ds_search_text", "ds_search_words", "ds_search_vector", "ds_search_query"}
PG_SEARCH_INDEX = "ix_ds_events_search"
MYSQL_SEARCH_TABLES = {"ds_event_words"}
INDEXES = {
    "ix_ds_sessions_user_org_updated",
    "ix_ds_sessions_org_updated",
    "ix_ds_user_state_org_user",
    "ix_ds_memories_org_user",
    "ix_ds_keys_org_kind_owner",
    "ix_ds_memory_terms_org_user",
}
# Revision 0001's; 0005 makes the user index lead with user_id, under a new name.
INDEXES_0001 = {
    "ix_ds_sessions_org_user_updated",
    "ix_ds_sessions_org_updated",
    "ix_ds_user_state_org_user",
}

DIALECTS = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    """Which database the migrations run on: a SQLite file, or a fresh Postgres or MySQL
    database."""
    return str(request.param)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, dialect: str) -> str:
    """The URL of an empty database of ``dialect``."""
    if dialect == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    fixture = "fresh_mysql_url" if dialect == "mysql" else "fresh_pg_url"
    make: Callable[[], str] = request.getfixturevalue(fixture)
    return make()


@pytest.fixture
async def db_engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """An async engine on the empty database, disposed after the test."""
    engine = create_async_engine(db_url)
    yield engine
    await engine.dispose()


async def table_names(engine: AsyncEngine) -> set[str]:
    """Return the names of every table in the database's default schema."""
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def index_names(engine: AsyncEngine) -> set[str]:
    """Return the names of every index in the database, on tables that exist or not."""
    if engine.dialect.name == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE type = 'index'"
    elif is_mysql(engine):
        sql = (
            "SELECT DISTINCT index_name FROM information_schema.statistics "
            "WHERE table_schema = DATABASE()"
        )
    else:
        sql = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    async with engine.connect() as conn:
        return set((await conn.execute(text(sql))).scalars())


def is_mysql(engine: AsyncEngine) -> bool:
    """Whether ``engine`` is on MySQL or MariaDB."""
    return engine.dialect.name in ("mysql", "mariadb")


def head_tables(engine: AsyncEngine) -> set[str]:
    """The tables of a database at head: the schema's, and on SQLite and MySQL the search
    tables."""
    if engine.dialect.name == "sqlite":
        return TABLES | SQLITE_SEARCH_TABLES | SQLITE_MEMORY_TABLES
    return TABLES | (MYSQL_SEARCH_TABLES if is_mysql(engine) else set())


def is_search_object(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
    """Whether Alembic's comparison meets one of search's objects, which live outside the
    metadata (their presence is tested apart): an ``include_object`` that leaves them out."""
    return bool(name) and (
        str(name).startswith(("ds_events_fts", "ds_memories_fts"))
        or name
        in (PG_SEARCH_INDEX, PG_MEMORY_INDEX, "search_vector", "search_terms", *MYSQL_SEARCH_TABLES)
    )


async def search_objects(engine: AsyncEngine) -> set[str]:
    """The names of search's objects in the database (tables, triggers, view; functions)."""
    if engine.dialect.name == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE name LIKE 'ds\\_events\\_fts%' ESCAPE '\\'"
    elif is_mysql(engine):
        sql = (
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name = 'ds_event_words'"
        )
    else:
        sql = (
            "SELECT proname FROM pg_proc WHERE proname LIKE 'ds\\_search\\_%' "
            "UNION ALL SELECT indexname FROM pg_indexes WHERE indexname = 'ix_ds_events_search'"
        )
    async with engine.connect() as conn:
        return set((await conn.execute(text(sql))).scalars())


async def version_rows(engine: AsyncEngine) -> list[str]:
    """Return the rows of the version table."""
    async with engine.connect() as conn:
        result = await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        return list(result.scalars())


def test_script_location_and_head() -> None:
    location = Path(script_location())
    assert (location / "env.py").is_file()
    assert (location / "script.py.mako").is_file()
    assert (location / "versions" / "0001_initial.py").is_file()
    assert head() == "0014"


def test_revisions_are_frozen_snapshots() -> None:
    revisions = sorted((Path(script_location()) / "versions").glob("*.py"))
    assert revisions
    for revision in revisions:
        tree = ast.parse(revision.read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {m for m in imported if m.startswith("durable_sessions")}, revision.name
        calls = {
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        assert "create_all" not in calls, f"{revision.name} calls create_all"
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert {"upgrade", "downgrade"} <= functions, revision.name


async def test_upgrade_downgrade_upgrade(db_engine: AsyncEngine) -> None:
    assert await current(db_engine) is None
    assert await is_current(db_engine) is False

    await upgrade(db_engine)
    assert await current(db_engine) == head()
    assert await is_current(db_engine) is True
    assert await table_names(db_engine) == {*head_tables(db_engine), VERSION_TABLE}
    assert await index_names(db_engine) >= INDEXES
    assert await version_rows(db_engine) == [head()]

    await upgrade(db_engine)  # at head already: a no-op
    assert await version_rows(db_engine) == [head()]

    await downgrade(db_engine, "base")
    assert await current(db_engine) is None
    assert await is_current(db_engine) is False
    assert await table_names(db_engine) == {VERSION_TABLE}
    assert not (INDEXES | INDEXES_0001) & await index_names(db_engine)
    assert await version_rows(db_engine) == []
    assert await search_objects(db_engine) == set()

    await upgrade(db_engine, "0001")
    assert await is_current(db_engine) is False  # behind head: the store must not run yet
    assert await table_names(db_engine) == {*TABLES_0001, VERSION_TABLE}
    assert await index_names(db_engine) >= INDEXES_0001
    await upgrade(db_engine)
    assert await is_current(db_engine) is True
    assert not (INDEXES_0001 - INDEXES) & await index_names(db_engine)


async def test_the_store_migrates_with_a_lock_timeout_and_progress(db_engine: AsyncEngine) -> None:
    """``SQLStore.migrate`` takes the deploy's lock timeout and progress callback; a bad
    timeout is refused before anything runs."""
    store = SQLStore(db_engine)
    with pytest.raises(ValueError, match="lock_timeout"):
        await store.migrate(lock_timeout=0)
    assert await current(db_engine) is None
    lines: list[str] = []
    await store.migrate("0001", lock_timeout=0.5, progress=lines.append)
    assert await current(db_engine) == "0001"
    await store.migrate(lock_timeout=0.5, progress=lines.append)
    assert await is_current(db_engine) is True
    assert lines == []  # quick steps go to the log only; long backfills report here


async def test_own_version_table(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)
    names = await table_names(db_engine)
    assert VERSION_TABLE == "durable_sessions_alembic_version"
    assert VERSION_TABLE in names
    assert "alembic_version" not in names


async def test_migrated_schema_matches_metadata(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)

    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": VERSION_TABLE,
                "compare_type": True,
                "include_object": lambda *found: not is_search_object(*found),
            },
        )
        return list(compare_metadata(context, metadata))

    async with db_engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_constraint_names_and_cascade(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)

    def reflect(conn: Connection) -> dict[str, Any]:
        inspector = inspect(conn)
        return {
            "pks": {t: inspector.get_pk_constraint(t) for t in TABLES},
            "fks": inspector.get_foreign_keys("ds_events"),
            "columns": {c["name"]: c for c in inspector.get_columns("ds_sessions")},
        }

    async with db_engine.connect() as conn:
        found = await conn.run_sync(reflect)
    for table, pk in found["pks"].items():
        # MySQL names every primary key PRIMARY (reflected as no name).
        assert pk["name"] == (None if is_mysql(db_engine) else f"pk_{table}")
    assert found["pks"]["ds_events"]["constrained_columns"] == ["org_id", "session_id", "seq"]
    [fk] = found["fks"]
    assert fk["name"] == "fk_ds_events_org_id_session_id_ds_sessions"
    assert fk["constrained_columns"] == ["org_id", "session_id"]
    assert fk["referred_table"] == "ds_sessions"
    assert fk["referred_columns"] == ["org_id", "id"]
    assert fk["options"].get("ondelete") == "CASCADE"
    columns = found["columns"]
    assert columns["parent_id"]["nullable"] is True
    assert columns["title"]["nullable"] is False
    if db_engine.dialect.name == "postgresql":
        assert type(columns["state"]["type"]).__name__ == "JSONB"
        assert columns["created_at"]["type"].timezone is True


async def test_concurrent_upgrades_from_two_engines(db_url: str) -> None:
    engines = [create_async_engine(db_url), create_async_engine(db_url)]
    try:
        await asyncio.gather(*(upgrade(engine) for engine in engines))
        for engine in engines:
            assert await is_current(engine) is True
        assert await version_rows(engines[0]) == [head()]
        assert await table_names(engines[0]) == {*head_tables(engines[0]), VERSION_TABLE}
    finally:
        for engine in engines:
            await engine.dispose()


MIGRATE_SCRIPT = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions.sql.migrate import upgrade

async def main(url):
    engine = create_async_engine(url)
    try:
        print("ready", flush=True)  # imports done: start together, when told to
        sys.stdin.readline()
        await upgrade(engine)
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
async def test_concurrent_upgrades_from_three_processes(db_url: str) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            MIGRATE_SCRIPT,
            db_url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    for proc in procs:  # every one has imported what it needs
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    outputs = await asyncio.gather(*(proc.communicate() for proc in procs))
    for proc, (_, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stderr.decode()

    engine = create_async_engine(db_url)
    try:
        assert await is_current(engine) is True
        assert await version_rows(engine) == [head()]
        assert await table_names(engine) == {*head_tables(engine), VERSION_TABLE}
    finally:
        await engine.dispose()


async def run_alembic(url: str, *args: str) -> None:
    """Run the ``alembic`` command line from the repository root on ``url``."""
    env = {**os.environ, "DURABLE_SESSIONS_URL": url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "alembic",
        *args,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, (stdout + stderr).decode()


@pytest.mark.slow
async def test_alembic_command_line(dialect: str, db_url: str) -> None:
    if dialect in ("postgres", "mysql"):
        # A plain URL is mapped to asyncpg (asyncmy) by env.py.
        cli_url = make_url(db_url).set(drivername=make_url(db_url).get_backend_name())
        url = cli_url.render_as_string(hide_password=False)
    else:
        url = db_url
    engine = create_async_engine(db_url)
    try:
        await run_alembic(url, "upgrade", "head")
        assert await is_current(engine) is True
        assert await table_names(engine) == {*head_tables(engine), VERSION_TABLE}

        await run_alembic(url, "downgrade", "base")
        assert await current(engine) is None
        assert await table_names(engine) == {VERSION_TABLE}
    finally:
        await engine.dispose()


def join_aiosqlite_workers(before: set[threading.Thread]) -> None:
    """Wait for the worker threads of failed aiosqlite connections to finish.

    When ``aiosqlite.connect`` fails it stops its worker thread without awaiting it; if the
    test's event loop closes first, the thread raises "Event loop is closed"
    (omnilib/aiosqlite#241), which pytest turns into an error.
    """
    for thread in set(threading.enumerate()) - before:
        if "_connection_worker_thread" in thread.name:
            thread.join(timeout=10)


@pytest.mark.sqlite
async def test_unreachable_sqlite_raises_store_unavailable(tmp_path: Path) -> None:
    threads = set(threading.enumerate())
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'x.db'}")
    try:
        with pytest.raises(StoreUnavailableError) as info:
            await upgrade(engine)
        assert "missing" not in str(info.value)
        with pytest.raises(StoreUnavailableError):
            await current(engine)
    finally:
        await engine.dispose()
        join_aiosqlite_workers(threads)


@pytest.mark.postgres
async def test_unreachable_postgres_raises_store_unavailable() -> None:
    # Port 1 refuses connections; the password must not leak into the message.
    engine = create_async_engine("postgresql+asyncpg://ds:s3cret-pw@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(StoreUnavailableError) as info:
            await upgrade(engine)
        message = str(info.value)
        assert "s3cret-pw" not in message
        assert "could not connect to the database" in message  # the driver's reason follows
        assert "nothing was written" in message
        with pytest.raises(StoreUnavailableError):
            await is_current(engine)
    finally:
        await engine.dispose()


# Not MySQL: its words table is written by the store, which has no schema before 0003 to
# run on there, and 0003 fills no words of events stored earlier.
@pytest.mark.parametrize("dialect", DIALECTS[:2])
async def test_search_index_is_built_over_stored_events_and_dropped_by_downgrade(
    db_engine: AsyncEngine,
) -> None:
    await upgrade(db_engine, "0002")
    store = SQLStore(db_engine)
    old = await Manager(store, app_name="app").create("org", "alice", id="old")
    await store.append_event("org", old.id, Event("user", content={"text": "stored before"}))

    await upgrade(db_engine)  # 0003 indexes the events already stored
    found = await search_objects(db_engine)
    if db_engine.dialect.name == "sqlite":
        assert found == SQLITE_SEARCH_TABLES | SQLITE_SEARCH_TRIGGERS | {"ds_events_fts_text"}
    else:
        assert found == PG_SEARCH_FUNCTIONS | {PG_SEARCH_INDEX}
    assert [h.session_id for h in await store.search("org", "stored")] == ["old"]
    await store.append_event("org", old.id, Event("user", content="stored after"))
    assert len(await store.search("org", "stored")) == 2

    await downgrade(db_engine, "0002")
    assert await search_objects(db_engine) == set()
    assert len(await store.list_events("org", old.id)) == 2  # the events stay
    await store.append_event("org", old.id, Event("user", content="stored meanwhile"))

    await upgrade(db_engine)
    assert [h.event.seq for h in await store.search("org", "stored")] == [3, 2, 1]
    if db_engine.dialect.name == "sqlite":
        async with db_engine.begin() as conn:  # the FTS5 index agrees with its content
            await conn.exec_driver_sql(
                "INSERT INTO ds_events_fts (ds_events_fts) VALUES ('integrity-check')"
            )


async def memory_objects(engine: AsyncEngine) -> set[str]:
    """The names of the memories' search objects (tables, triggers, view; index, column)."""
    if engine.dialect.name == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE name LIKE 'ds\\_memories\\_fts%' ESCAPE '\\'"
    elif is_mysql(engine):  # no index of the terms there: nothing beside the table
        return set()
    else:
        sql = (
            "SELECT indexname FROM pg_indexes WHERE indexname = 'ix_ds_memories_search' "
            "UNION ALL SELECT attname FROM pg_attribute WHERE attrelid = "
            "to_regclass('ds_memories') AND attname = 'search_vector' AND NOT attisdropped"
        )
    async with engine.connect() as conn:
        return set((await conn.execute(text(sql))).scalars())


async def test_memories_table_and_index_come_and_go_with_revision_0010(
    db_engine: AsyncEngine,
) -> None:
    await upgrade(db_engine)
    found = await memory_objects(db_engine)
    if db_engine.dialect.name == "sqlite":
        assert found == SQLITE_MEMORY_OBJECTS
    elif is_mysql(db_engine):
        assert found == set()
    else:
        assert found == {PG_MEMORY_INDEX, "search_vector"}
    store = SQLStore(db_engine)
    await store.add_memories("org", "app", "alice", [Memory("kept in memory", id="m")])
    assert [m.id for m in await store.search_memories("org", "app", "alice", "kept")] == ["m"]

    await downgrade(db_engine, "0009")
    assert not {"ds_memories", "ds_memory_terms"} & await table_names(db_engine)
    assert await memory_objects(db_engine) == set()

    await upgrade(db_engine)
    assert await store.search_memories("org", "app", "alice", "kept") == []
    await store.add_memories("org", "app", "alice", [Memory("kept again", id="m")])
    assert [m.text for m in await store.search_memories("org", "app", "alice", "kept")] == [
        "kept again"
    ]
    if db_engine.dialect.name == "sqlite":
        async with db_engine.begin() as conn:  # the FTS5 index agrees with its content
            await conn.exec_driver_sql(
                "INSERT INTO ds_memories_fts (ds_memories_fts) VALUES ('integrity-check')"
            )


async def test_revision_0013_counts_the_memories_already_stored(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine, "0012")
    texts = ["the hotel in Porto", "the flight to Porto", "a hotel", "the end"]
    stamp = datetime(2024, 1, 1, tzinfo=timezone.utc)
    async with db_engine.begin() as conn:
        for user in ("ada", "bob"):
            for n, body in enumerate(texts):
                await conn.execute(
                    memories.insert().values(
                        org_id="org", app_name="app", user_id=user, id=f"m{n}",
                        timestamp=stamp + timedelta(minutes=n), text=body, content=None,
                        metadata={}, session_id=None, seq=None,
                        terms=stored_terms("org", "app", user, body),
                    )
                )  # fmt: skip
    await upgrade(db_engine)
    store, reference = SQLStore(db_engine), InMemoryStore()
    same = [
        Memory(t, id=f"m{n}", timestamp=stamp + timedelta(minutes=n)) for n, t in enumerate(texts)
    ]
    await reference.add_memories("org", "app", "ada", same)
    for query in ("hotel porto", "the", "flight end"):
        found = await store.search_memories("org", "app", "ada", query)
        expected = await reference.search_memories("org", "app", "ada", query)
        assert [m.id for m in found] == [m.id for m in expected], query


WORST_TITLE = "\x01" * MAX_TITLE_BYTES
"""The title whose JSON text is longest: every byte a control character, escaped as
``\\u0001``."""


def longest_sealed_title() -> str:
    """``WORST_TITLE`` sealed by the real code, under a key id as wide as ``ds_keys`` holds."""
    from durable_sessions.sealing import USER, DataKey, Envelope

    key_id = keys.c.key_id.type
    assert isinstance(key_id, String)
    assert key_id.length is not None
    key = DataKey("k" * key_id.length, USER, "u", bytes(range(32)))
    return Envelope.seal_title(key, "org", "s", WORST_TITLE)


def test_a_sealed_title_fits_the_title_column_on_mysql() -> None:
    """The derivation of ``SEALED_TITLE_BYTES`` (schema and revision 0014 alike), checked
    with the sealing code: the longest title's JSON, sealed under the widest key id."""
    assert check_title(WORST_TITLE) == WORST_TITLE
    assert len(to_json(WORST_TITLE).encode()) == 6146
    sealed = longest_sealed_title()
    assert sealed.isascii()
    assert len(sealed) == 70 + 8232  # "dse1:" + 64-byte key id + ":", then base64
    assert len(sealed) <= SEALED_TITLE_BYTES < len(sealed) + 256
    revision = load_revision("0014_sealed_titles.py")
    assert revision.SEALED_TITLE_BYTES == SEALED_TITLE_BYTES
    assert revision.TITLE_BYTES == MAX_TITLE_BYTES


async def title_column(engine: AsyncEngine) -> tuple[str, bool, Any]:
    """``ds_sessions.title``'s type as the database spells it, whether it is nullable, and
    its default."""

    def reflect(conn: Connection) -> tuple[str, bool, Any]:
        [column] = [c for c in inspect(conn).get_columns("ds_sessions") if c["name"] == "title"]
        return str(column["type"].compile(conn.dialect)), column["nullable"], column["default"]

    async with engine.connect() as conn:
        return await conn.run_sync(reflect)


async def insert_titled(engine: AsyncEngine, titles: dict[str, str]) -> None:
    """Insert a session per (id, title), raw: a store checks titles against 1,024 bytes."""
    stamp = datetime(2024, 1, 1, tzinfo=timezone.utc)
    async with engine.begin() as conn:
        for session_id, title in titles.items():
            await conn.execute(
                sessions.insert().values(
                    org_id="org", id=session_id, user_id="u", app_name="app", title=title,
                    state={}, parent_id=None, created_at=stamp, updated_at=stamp,
                    message_count=0, token_total=0, event_seq=0, version=1, incarnation="",
                )
            )  # fmt: skip


async def stored_titles(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(sessions.c.id, sessions.c.title))
        return {session_id: title for session_id, title in rows}


async def test_revision_0014_widens_the_title_column_for_sealed_titles_on_mysql(
    db_engine: AsyncEngine,
) -> None:
    """On MySQL 0014 widens ``ds_sessions.title`` from ``VARBINARY(1024)`` to
    ``VARBINARY(8448)`` (still NOT NULL, no default), so a sealed title fits; its downgrade
    refuses while a title longer than 1,024 bytes is stored, changing nothing, and narrows
    the column once none is. Elsewhere titles are unbounded text, which 0014 leaves alone."""
    await upgrade(db_engine, "0013")
    on_mysql = is_mysql(db_engine)
    sealed = longest_sealed_title()
    widest = "t" * SEALED_TITLE_BYTES
    clear = {"short": "a title", "longest": "\u00e9" * (MAX_TITLE_BYTES // 2)}
    await insert_titled(db_engine, clear)
    before = await title_column(db_engine)
    if on_mysql:
        assert before == ("VARBINARY(1024)", False, None)
        for title in (sealed, widest):
            with pytest.raises(DBAPIError, match="Data too long"):
                await insert_titled(db_engine, {"sealed": title})
    else:
        assert before[:2] == ("TEXT", False)

    await upgrade(db_engine, "0014")
    after = await title_column(db_engine)
    assert after == (("VARBINARY(8448)", False, None) if on_mysql else before)
    await insert_titled(db_engine, {"sealed": sealed, "widest": widest})
    assert await stored_titles(db_engine) == {**clear, "sealed": sealed, "widest": widest}

    if on_mysql:
        with pytest.raises(
            CommandError, match=r"2 session title.*sealed titles.*needs revision 0014"
        ):
            await downgrade(db_engine, "0013")
        assert await current(db_engine) == "0014"
        assert await title_column(db_engine) == after
        assert await stored_titles(db_engine) == {**clear, "sealed": sealed, "widest": widest}
        async with db_engine.begin() as conn:
            await conn.execute(delete(sessions).where(sessions.c.id.in_(["sealed", "widest"])))

    await downgrade(db_engine, "0013")  # no sealed title left (or unbounded text): through
    assert await current(db_engine) == "0013"
    assert await title_column(db_engine) == before
    titles = await stored_titles(db_engine)
    assert titles == (clear if on_mysql else {**clear, "sealed": sealed, "widest": widest})

    await upgrade(db_engine)
    assert await title_column(db_engine) == after
    assert await stored_titles(db_engine) == titles


async def test_a_keyring_store_needs_revision_0014_on_mysql(
    db_engine: AsyncEngine, tmp_path: Path
) -> None:
    """On MySQL a store with a keyring refuses a schema before 0014 (its title column cannot
    hold a sealed title) with ``SchemaNotMigratedError``, writing nothing; migrated, the
    same store keeps the longest title. On SQLite and Postgres 0013 holds it already."""
    from durable_sessions.crypto import LocalKeyring

    await upgrade(db_engine, "0013")
    store = SQLStore(db_engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    manager = Manager(store, app_name="app")
    if is_mysql(db_engine):
        with pytest.raises(SchemaNotMigratedError, match="revision 0014"):
            await manager.create("org", "u", id="s", title=WORST_TITLE)
        assert await stored_titles(db_engine) == {}
        await store.migrate()
    await manager.create("org", "u", id="s", title=WORST_TITLE)
    assert (await manager.resume("org", "s")).title == WORST_TITLE
    assert (await stored_titles(db_engine))["s"].startswith("dse1:")


# Contents of every JSON shape, some whose text jsonb rewrites (key order, spacing of
# numbers): what a reader gets must not change across revision 0007, either way.
CONTENTS: list[Any] = [
    {"zebra": 1, "apple": {"z": [1, 2.5, -0.0], "a": None}, "m": 'héllo "quoted" \\ \t'},
    {"text": "stored before the json column", "n": 1.0, "big": 12345678901234567890},
    ["a list", {"b": True, "a": False}, 1e-7],
    "just a string with an emoji \U0001f600",
    12.5,
    None,
]


async def column_types(engine: AsyncEngine) -> dict[str, str]:
    """The SQL type of each ds_events column, as Postgres names it."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'ds_events' AND table_schema = current_schema()"
            )
        )
        return {name: kind for name, kind in rows}


async def test_event_contents_read_the_same_across_revision_0007_both_ways(
    db_engine: AsyncEngine,
) -> None:
    await upgrade(db_engine, "0006")
    store = SQLStore(db_engine)
    session = await Manager(store).create("org", "u", id="s")
    for content in CONTENTS[:3]:
        await store.append_event("org", session.id, Event("user", content=content))
    await store.append_events("org", session.id, [Event("user", content=c) for c in CONTENTS[3:]])

    async def seen() -> Any:
        events = await store.list_events("org", session.id)
        hits = await store.search("org", "stored")
        return (
            [e.content for e in events],
            await store.list_event_contents("org", session.id),
            [e.content for e in (await store.get_with_events("org", session.id)).events],
            [(h.session_id, h.event.seq) for h in hits],
        )

    before = await seen()
    assert before[0] == before[1] == before[2] == CONTENTS
    assert before[3] == [("s", 2)]
    pg = db_engine.dialect.name == "postgresql"
    if pg:
        assert (await column_types(db_engine))["content"] == "jsonb"

    await upgrade(db_engine)
    if pg:
        assert (await column_types(db_engine))["content"] == "json"
    assert await seen() == before
    # Written after: a single append and a batch, both read back and searched as before.
    await store.append_event("org", session.id, Event("user", content={"text": "stored after"}))
    await store.append_events("org", session.id, [Event("user", content={"t": "stored twice"})])
    after = await seen()
    assert after[0] == [*CONTENTS, {"text": "stored after"}, {"t": "stored twice"}]
    assert after[3] == [("s", 8), ("s", 7), ("s", 2)]  # as many words each: newest first

    await downgrade(db_engine, "0006")
    if pg:
        assert (await column_types(db_engine))["content"] == "jsonb"
        assert (await column_types(db_engine))["search_vector"] == "tsvector"
    assert await seen() == after
    await upgrade(db_engine)
    assert await seen() == after


@pytest.mark.postgres
async def test_the_collation_revision_leaves_a_citus_distribution_column_alone(
    fresh_pg_url: Callable[[], str],
) -> None:
    """Revision 0004 gives every id and key column the C collation on Postgres, except a
    column Citus already distributes a table by (which no ALTER TABLE may change): here
    Citus's catalog is imitated, with ds_sessions and ds_events distributed by org_id."""
    engine = create_async_engine(fresh_pg_url())
    query = (
        "SELECT table_name, column_name, collation_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name LIKE 'ds\\_%' "
        "AND data_type IN ('character varying', 'text') "
        "AND column_name NOT IN ('incarnation', 'title')"
    )

    async def collations() -> dict[tuple[str, str], str | None]:
        async with engine.connect() as conn:
            return {(t, c): coll for t, c, coll in await conn.exec_driver_sql(query)}

    try:
        await upgrade(engine, "0003")
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "CREATE TABLE pg_dist_partition (logicalrelid regclass, partkey text)"
            )
            await conn.exec_driver_sql(
                "CREATE FUNCTION column_to_column_name(regclass, text) RETURNS text "
                "LANGUAGE sql AS 'SELECT $2'"
            )
            await conn.exec_driver_sql(
                "INSERT INTO pg_dist_partition VALUES ('ds_sessions', 'org_id'), "
                "('ds_events', 'org_id'), ('ds_app_state', NULL)"
            )
        before = await collations()
        assert set(before.values()) == {None}
        await upgrade(engine)
        fixed = {("ds_sessions", "org_id"), ("ds_events", "org_id")}
        after = await collations()
        # Revision 0010's table is new: its id columns take the C collation from the start.
        memories = {c: v for (t, c), v in after.items() if t == "ds_memories"}
        assert memories == {c: "C" for c in memories} | {"text": None, "terms": None}
        # Revision 0011's table likewise: its id columns C, the key material text.
        keys = {c: v for (t, c), v in after.items() if t == "ds_keys"}
        assert keys == {c: "C" for c in keys} | {"master_id": None, "wrapped": None}
        # Revision 0013's table likewise: its id columns C, the term text.
        terms = {c: v for (t, c), v in after.items() if t == "ds_memory_terms"}
        assert terms == {c: "C" for c in terms} | {"term": None}
        new = ("ds_memories", "ds_keys", "ds_memory_terms")
        after = {k: v for k, v in after.items() if k[0] not in new}
        assert after.keys() == before.keys()
        assert {k for k, v in after.items() if v is None} == fixed
        assert {v for k, v in after.items() if k not in fixed} == {"C"}
        await downgrade(engine, "0003")
        assert await collations() == before
    finally:
        await engine.dispose()


async def _vectors(engine: AsyncEngine) -> dict[tuple[str, int], tuple[str | None, bool]]:
    """Each event's stored search vector, and whether it is the one Postgres computes."""
    async with engine.connect() as conn:
        rows = await conn.exec_driver_sql(
            "SELECT session_id, seq, search_vector::text, "
            "search_vector IS NOT DISTINCT FROM ds_search_vector(content::jsonb) FROM ds_events"
        )
        return {(s, seq): (vector, same) for s, seq, vector, same in rows}


async def _generated(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        found = await conn.exec_driver_sql(
            "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = 'ds_events'::regclass "
            "AND attname = 'search_vector' AND NOT attisdropped"
        )
        return str(found.scalar_one())


@pytest.mark.postgres
async def test_revision_0008_keeps_the_vectors_and_the_writes_send_them(
    fresh_pg_url: Callable[[], str],
) -> None:
    """0008 makes the search vector of a database at 0007 as released (a generated column)
    a plain column (no vector is recomputed); the store's writes then send each event's
    vector (checked with the trigger off), the trigger fills one for a writer that sends
    none (a store that looked at 0007, raw SQL); a downgrade keeps the plain column and its
    trigger (0007's online form), and the store writes and searches on."""
    engine = create_async_engine(fresh_pg_url())
    try:
        await upgrade_released(engine, "0007")
        older = SQLStore(engine)  # looks at 0007: a generated column, it sends nothing
        await Manager(older).create("org", "u", id="s")
        await older.append_event("org", "s", Event("user", content={"text": "Stored BEFORE"}))
        before = await _vectors(engine)
        assert await _generated(engine) == "s"

        await upgrade(engine)
        assert await _generated(engine) == ""
        assert await _vectors(engine) == before  # kept, not computed again

        store = SQLStore(engine)
        async with engine.begin() as conn:  # prove the store sends them: no trigger
            await conn.exec_driver_sql("ALTER TABLE ds_events DISABLE TRIGGER USER")
        await store.append_event("org", "s", Event("user", content={"text": "sent ALONE"}))
        await store.append_events(
            "org", "s", [Event("user", content="sent in a batch"), Event("a", content=["x y"])]
        )
        await store.fork("org", "s", new_session_id="f", with_events=True)
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE ds_events ENABLE TRIGGER USER")
        await older.append_event("org", "s", Event("user", content={"t": "older writer"}))
        async with engine.begin() as conn:  # a raw insert, as a release before 0008 makes
            await conn.exec_driver_sql(
                "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                "content, state_delta, tokens, timestamp) VALUES ('org', 'f', 99, 'raw', 'u', "
                "'', '{\"text\": \"raw insert\"}', '{}', 0, now())"
            )
        vectors = await _vectors(engine)
        assert len(vectors) == 10
        assert all(vector is not None and same for vector, same in vectors.values()), vectors
        assert [h.event.seq for h in await store.search("org", "sent", session_id="s")] == [3, 2]
        assert [h.session_id for h in await store.search("org", "raw")] == ["f"]
        assert len(await store.search("org", "stored")) == 2  # the parent's and the fork's

        await downgrade(engine, "0007")
        assert await _generated(engine) == ""
        assert await _vectors(engine) == vectors
        await store.append_event("org", "s", Event("user", content={"text": "after DOWN"}))
        await store.append_events("org", "s", [Event("user", content="down batch")])
        assert store.distributed is False
        assert [h.event.seq for h in await store.search("org", "down")] == [7, 6]
        assert all(same for _, same in (await _vectors(engine)).values())

        await upgrade(engine)
        await store.append_event("org", "s", Event("user", content={"text": "up again"}))
        assert all(same for _, same in (await _vectors(engine)).values())
        assert len(await store.search("org", "again")) == 1
    finally:
        await engine.dispose()


# Its text passes 200,000 characters: read in stored order, "tail" is cut; in jsonb's order
# (shorter keys first) it comes first.
LONG_CONTENT = {"bb": "y " * 100_000, "a": "tail"}
SHORT_CONTENT = {"text": "tail short", "b": "x"}


async def _raw_insert(engine: AsyncEngine, seq: int, content: Any) -> None:
    """An insert that sends no vector (an import, an older writer): the trigger fills it."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                "content, state_delta, tokens, timestamp) VALUES ('org', 's', :seq, :id, 'u', "
                "'', CAST(:content AS json), '{}', 0, "
                "now() + make_interval(secs => CAST(:secs AS double precision)))"
            ),
            {"seq": seq, "secs": seq, "id": f"raw{seq}", "content": json.dumps(content)},
        )


async def _stored_vectors(engine: AsyncEngine) -> dict[tuple[str, int], tuple[str, bool]]:
    """Each event's stored vector, and whether it is ``fulltext.search_vector`` of its
    content (its strings in stored order)."""
    async with engine.connect() as conn:
        rows = (
            await conn.exec_driver_sql(
                "SELECT session_id, seq, content::text, search_vector::text FROM ds_events"
            )
        ).all()
        out = {}
        for session_id, seq, content, vector in rows:
            same = await conn.execute(
                text("SELECT CAST(:v AS tsvector) = CAST(:w AS tsvector)"),
                {"v": vector, "w": search_vector(json.loads(content))},
            )
            out[(session_id, seq)] = (vector, bool(same.scalar()))
        return out


async def _search_functions_of_json(engine: AsyncEngine) -> list[str | None]:
    async with engine.connect() as conn:
        found = await conn.exec_driver_sql(
            "SELECT to_regprocedure('ds_search_text(json)')::text, "
            "to_regprocedure('ds_search_vector(json)')::text"
        )
        return list(found.one())


@pytest.mark.postgres
async def test_revision_0009_reads_contents_in_stored_order_both_ways(
    fresh_pg_url: Callable[[], str],
) -> None:
    """0009 makes Postgres read a content's strings in stored order: the trigger's vectors
    and the vectors stored before of the events whose text may pass 200,000 characters
    (computed again), and a search's count of an event's words; the downgrade puts back
    0008's trigger (jsonb's order), keeps the vectors, and a store searches on as before."""
    engine = create_async_engine(fresh_pg_url())
    try:
        await upgrade(engine, "0008")
        store = SQLStore(engine)
        await Manager(store).create("org", "u", id="s")
        await _raw_insert(engine, 1, LONG_CONTENT)
        await _raw_insert(engine, 2, SHORT_CONTENT)
        before = await _stored_vectors(engine)
        assert "'tail'" in before[("s", 1)][0]  # cut in jsonb's order
        assert not before[("s", 1)][1]
        assert not before[("s", 2)][1]  # its positions in jsonb's order
        assert await _search_functions_of_json(engine) == [None, None]

        await upgrade(engine, "0009")
        assert await _generated(engine) == ""
        assert await _search_functions_of_json(engine) == [
            "ds_search_text(json)",
            "ds_search_vector(json)",
        ]
        after = await _stored_vectors(engine)
        assert "'tail'" not in after[("s", 1)][0]
        assert after[("s", 1)][1]  # computed again, in stored order
        # Short: not computed again (its text is not cut; only its positions differ).
        assert after[("s", 2)] == before[("s", 2)]
        assert [h.event.seq for h in await store.search("org", "tail")] == [2]

        await downgrade(engine, "0008")
        assert await _search_functions_of_json(engine) == [None, None]
        assert await _stored_vectors(engine) == after  # kept
        assert [h.event.seq for h in await store.search("org", "tail")] == [2]  # jsonb cast
        await _raw_insert(engine, 3, LONG_CONTENT)  # 0008's trigger again: jsonb's order
        assert not (await _stored_vectors(engine))[("s", 3)][1]

        await upgrade(engine)
        await _raw_insert(engine, 4, LONG_CONTENT)  # the trigger: stored order
        await Manager(store).create("org", "u", id="t")
        await store.append_event("org", "t", Event("u", content=LONG_CONTENT))  # sent
        final = await _stored_vectors(engine)
        assert final[("s", 3)][1]
        assert final[("s", 4)][1]
        assert final[("t", 1)][1]
        assert final[("s", 2)] == before[("s", 2)]
        assert [h.event.seq for h in await store.search("org", "tail")] == [2]
    finally:
        await engine.dispose()
