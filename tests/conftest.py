"""Fixtures shared by every test: the stores under test and fresh databases.

The tree is grouped by what a test needs to run:

- ``unit/``: the package alone, no database (ids, titles, the public and private API).
- ``stores/``: every store, memory, a SQLite file and Postgres, through the ``store`` fixture
  (the shipped contract suite, state, limits, paging, search, the same errors everywhere).
- ``sql/``: a SQL database, SQLite and Postgres (statements and plans, migrations, export and
  import, tracing, the distributed mode, URLs, driver errors).
- ``command/``: the ``durable-sessions`` command and the README, run as a user runs them.
- ``adapters/``: an optional SDK installed (google-adk, openai-agents).
- ``reliability/``: processes, injected faults, cancellation and private Postgres clusters
  (``nox -s reliability``).
- ``support/``: the one copy of each helper (statements seen and their plans, snapshots,
  spawned workers, Citus's rules); not tests.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import InMemoryStore, SQLStore, Store
from durable_sessions.sql.dialects.citus import SETTING
from support.citus_rules import recording
from support.sql import MYSQL, PG_DISTRIBUTED, SQL_BACKENDS, raw_mysql, raw_pg

POSTGRES_ENV = "DURABLE_SESSIONS_TEST_POSTGRES_URL"
MYSQL_ENV = "DURABLE_SESSIONS_TEST_MYSQL_URL"
MYSQL_CI_URL = "mysql+asyncmy://root@127.0.0.1:3306"
"""The MariaDB server the tests use under ``CI=true`` when ``DURABLE_SESSIONS_TEST_MYSQL_URL``
is not set (``.ci/run`` starts it)."""


def postgres_base_url() -> str | None:
    """Return the test Postgres URL, or None when unset (a failure under CI=true)."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{POSTGRES_ENV} must be set when CI=true: Postgres tests may not skip")
        return None
    return url


async def _admin(url: str, sql: str) -> None:
    async with raw_pg(url) as conn:
        await conn.execute(sql)


def _run_admin(url: str, sql: str) -> None:
    # A thread of its own, so that this also works inside a running event loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _admin(url, sql)).result()


def create_pg_database(base_url: str, *, template: str | None = None) -> str:
    """Create a Postgres database next to ``base_url`` and return its URL: empty, or a copy
    of the database of the URL ``template`` (which nothing may be connected to)."""
    name = f"ds_test_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{make_url(template).database}"' if template else ""
    _run_admin(base_url, f'CREATE DATABASE "{name}"{copy}')
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(base_url: str, url: str) -> None:
    """Drop a database made by ``create_pg_database``."""
    name = make_url(url).database
    _run_admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def set_pg_database(base_url: str, url: str, setting: str, value: str) -> None:
    """Give the database of ``url`` a default for ``setting`` (``value`` is SQL: quote
    strings), which its new connections start with."""
    name = make_url(url).database
    _run_admin(base_url, f'ALTER DATABASE "{name}" SET {setting} = {value}')


def mysql_base_url() -> str | None:
    """Return the test MySQL server's URL (``MYSQL_CI_URL`` under CI=true when unset), or
    None when unset outside CI."""
    url = os.environ.get(MYSQL_ENV)
    if url:
        return url
    return MYSQL_CI_URL if os.environ.get("CI", "").lower() == "true" else None


async def _mysql_admin(url: str, sql: str) -> None:
    server = make_url(url).set(database=None).render_as_string(False)
    async with raw_mysql(server) as conn, conn.cursor() as cursor:
        await cursor.execute(sql)


def _run_mysql_admin(url: str, sql: str) -> None:
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _mysql_admin(url, sql)).result()


async def _copy_mysql_tables(base_url: str, source: str, target: str) -> None:
    """Copy every table of the database ``source`` (its definition as ``SHOW CREATE TABLE``
    gives it, foreign keys included, which ``CREATE TABLE ... LIKE`` drops, and its rows)
    into the empty database ``target``, on one connection without foreign key checks."""
    server = make_url(base_url).set(database=None).render_as_string(False)
    async with raw_mysql(server) as conn, conn.cursor() as cursor:
        await cursor.execute("SET SESSION FOREIGN_KEY_CHECKS = 0")
        await cursor.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_type = 'BASE TABLE'",
            (source,),
        )
        tables = [row[0] for row in await cursor.fetchall()]
        # A definition names its tables without a database (its foreign keys' too): used
        # in ``target``, each names the copy there.
        await cursor.execute(f"USE `{target}`")
        for table in tables:
            await cursor.execute(f"SHOW CREATE TABLE `{source}`.`{table}`")
            (_, definition) = await cursor.fetchone()
            await cursor.execute(definition)
            await cursor.execute(
                f"INSERT INTO `{target}`.`{table}` SELECT * FROM `{source}`.`{table}`"
            )


def create_mysql_database(base_url: str, *, template: str | None = None) -> str:
    """Create a database on the MySQL server of ``base_url`` and return its URL: empty, or
    a copy of every table (and row) of the database of the URL ``template`` (MySQL has no
    ``CREATE DATABASE ... TEMPLATE``)."""
    name = f"ds_test_{uuid.uuid4().hex[:12]}"
    _run_mysql_admin(base_url, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    if template is not None:
        source = make_url(template).database
        assert source is not None
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _copy_mysql_tables(base_url, source, name)).result()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def drop_mysql_database(base_url: str, url: str) -> None:
    """Drop a database made by ``create_mysql_database``."""
    _run_mysql_admin(base_url, f"DROP DATABASE IF EXISTS `{make_url(url).database}`")


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """The MySQL (MariaDB) server under test (skips locally when unset; under CI=true it
    defaults to the local MariaDB, and a server that is down fails the tests)."""
    url = mysql_base_url()
    if url is None:
        pytest.skip(f"{MYSQL_ENV} is not set")
    return url


@pytest.fixture(scope="session")
def _mysql_dropper(mysql_url: str) -> Iterator[_Dropper]:
    dropper = _Dropper(mysql_url, drop_mysql_database)
    yield dropper
    dropper.finish()


@pytest.fixture
def fresh_mysql_url(mysql_url: str, _mysql_dropper: _Dropper) -> Iterator[Callable[[], str]]:
    """A factory of empty MySQL databases, dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(create_mysql_database(mysql_url))
        return made[-1]

    yield make
    for url in made:
        _mysql_dropper.drop(url)


@pytest.fixture(scope="session")
def mysql_template_url(mysql_url: str) -> Iterator[str]:
    """A MySQL database migrated once per run, which no test writes to: each migrated
    database a test asks for is a copy of its tables (``create_mysql_database``)."""
    url = create_mysql_database(mysql_url)
    _migrate(url)
    yield url
    drop_mysql_database(mysql_url, url)


@pytest.fixture
def fresh_migrated_mysql_url(
    mysql_url: str, mysql_template_url: str, _mysql_dropper: _Dropper
) -> Iterator[Callable[[], str]]:
    """A factory of new migrated MySQL databases (copies of the template), dropped after
    the test: for a test that needs a database of its own, or several."""
    made: list[str] = []

    def make() -> str:
        made.append(create_mysql_database(mysql_url, template=mysql_template_url))
        return made[-1]

    yield make
    for url in made:
        _mysql_dropper.drop(url)


@pytest.fixture(scope="session")
def migrated_mysql_url(mysql_url: str) -> Iterator[str]:
    """One migrated MySQL database for the whole run (MySQL has no template databases);
    tests empty its tables before use."""
    url = create_mysql_database(mysql_url)
    _migrate(url)
    yield url
    drop_mysql_database(mysql_url, url)


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    """The Postgres server under test (skips locally when unset, fails under CI)."""
    url = postgres_base_url()
    if url is None:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    return url


class _Dropper:
    """Drops databases on a thread of its own, one at a time: a DROP DATABASE waits for a
    checkpoint (a second or more on a busy disk), which the next test need not wait for."""

    def __init__(self, base_url: str, drop: Callable[[str, str], None] = drop_pg_database) -> None:
        self.base_url = base_url
        self._drop = drop
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="drop-database")
        self.pending: list[Future[None]] = []

    def drop(self, url: str) -> None:
        """Drop the database of ``url`` (made by ``create_pg_database``) soon."""
        self.pending.append(self.pool.submit(self._drop, self.base_url, url))

    def finish(self) -> None:
        """Wait for every drop; raise the first that failed."""
        try:
            for done in self.pending:
                done.result()
        finally:
            self.pool.shutdown()


@pytest.fixture(scope="session")
def _pg_dropper(pg_base_url: str) -> Iterator[_Dropper]:
    dropper = _Dropper(pg_base_url)
    yield dropper
    dropper.finish()


@pytest.fixture
def fresh_pg_url(pg_base_url: str, _pg_dropper: _Dropper) -> Iterator[Callable[[], str]]:
    """A factory of empty Postgres databases, dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(create_pg_database(pg_base_url))
        return made[-1]

    yield make
    for url in made:
        _pg_dropper.drop(url)


def _migrate(url: str, *, checkpoint: bool = False) -> None:
    """Migrate the database of ``url`` to head on a loop of its own (a test's may be
    running); ``checkpoint`` (SQLite) leaves the whole database in its main file."""

    async def migrate() -> None:
        engine = create_async_engine(url)
        try:
            await SQLStore(engine).migrate()
            if checkpoint:
                async with engine.connect() as conn:
                    await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, migrate()).result()


def _migrated_pg_database(pg_base_url: str, *, distributed: bool = False) -> str:
    url = create_pg_database(pg_base_url)
    if distributed:
        set_pg_database(pg_base_url, url, SETTING, "on")
    _migrate(url)
    return url


@pytest.fixture(scope="session")
def pg_template_url(pg_base_url: str) -> Iterator[str]:
    """A Postgres database migrated once per run, which nothing connects to: each migrated
    database a test asks for is a copy of it (``CREATE DATABASE ... TEMPLATE``)."""
    url = _migrated_pg_database(pg_base_url)
    yield url
    drop_pg_database(pg_base_url, url)


@pytest.fixture
def fresh_migrated_pg_url(
    pg_base_url: str, pg_template_url: str, _pg_dropper: _Dropper
) -> Iterator[Callable[[], str]]:
    """A factory of new migrated Postgres databases (copies of the template), dropped after
    the test: for a test that changes a database in ways a truncation does not undo."""
    made: list[str] = []

    def make() -> str:
        made.append(create_pg_database(pg_base_url, template=pg_template_url))
        return made[-1]

    yield make
    for url in made:
        _pg_dropper.drop(url)


@pytest.fixture(scope="session")
def migrated_pg_url(pg_base_url: str, pg_template_url: str) -> Iterator[str]:
    """One migrated Postgres database for the whole run; tests truncate it before use."""
    url = create_pg_database(pg_base_url, template=pg_template_url)
    yield url
    drop_pg_database(pg_base_url, url)


@pytest.fixture(scope="session")
def migrated_pg_distributed_url(pg_base_url: str) -> Iterator[str]:
    """Like ``migrated_pg_url``, for distributed mode: every store on it runs in that mode
    (the database's ``durable_sessions.distributed`` is on)."""
    url = _migrated_pg_database(pg_base_url, distributed=True)
    yield url
    drop_pg_database(pg_base_url, url)


async def _truncate(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        if engine.dialect.name in ("mysql", "mariadb"):
            # Events and their words go with their sessions (foreign keys ON DELETE CASCADE);
            # a DELETE of a few rows is quicker than TRUNCATE, which is DDL on MySQL.
            for table in (
                "ds_sessions", "ds_user_state", "ds_app_state", "ds_memories", "ds_memory_terms",
                "ds_keys",
            ):  # fmt: skip
                await conn.exec_driver_sql(f"DELETE FROM {table}")
            return
        await conn.exec_driver_sql(
            "TRUNCATE ds_events, ds_sessions, ds_user_state, ds_app_state, ds_memories, "
            "ds_memory_terms, ds_keys"
        )


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The URL of a new SQLite file, not migrated (not even created yet)."""
    return f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per run (per pytest worker), its WAL checkpointed into
    it: the file alone is the whole database, and copying it gives a migrated database."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    _migrate(f"sqlite+aiosqlite:///{path}", checkpoint=True)
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "the template's WAL was not emptied"
    return path


@pytest.fixture
def migrated_sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """The URL of a new migrated, empty SQLite file (a copy of the template)."""
    path = tmp_path / "sessions.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


BACKENDS = [
    pytest.param("memory", marks=pytest.mark.memory),
    *SQL_BACKENDS,
    PG_DISTRIBUTED,
    MYSQL,
]


@pytest.fixture
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of a migrated, empty database of a SQL backend (parametrise ``backend`` with
    SQL_BACKENDS); on Postgres, the ``engine`` fixture empties it."""
    backend = request.getfixturevalue("backend")
    if backend == "sqlite":
        return str(request.getfixturevalue("migrated_sqlite_url"))
    if backend == "postgres-distributed":
        return str(request.getfixturevalue("migrated_pg_distributed_url"))
    if backend == "mysql":
        return str(request.getfixturevalue("migrated_mysql_url"))
    return str(request.getfixturevalue("migrated_pg_url"))


@pytest.fixture
async def engine(backend: str, backend_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a migrated, empty database of ``backend``."""
    eng = create_async_engine(backend_url)
    if backend != "sqlite":  # a SQLite file is a new copy of the template already
        await _truncate(eng)
    yield eng
    await eng.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test runs against: memory, sqlite, postgres, postgres-distributed or
    mysql."""
    return str(request.param)


@pytest.fixture
def store(request: pytest.FixtureRequest, backend: str) -> Store:
    """An empty store of every kind: the contract suite runs unchanged against each."""
    if backend == "memory":
        return InMemoryStore()
    eng: AsyncEngine = request.getfixturevalue("engine")
    if backend == "postgres-distributed":
        # Asked for explicitly (the database's setting agrees); every statement the store
        # compiles is checked against Citus's router rules as it is compiled.
        request.getfixturevalue("_router_rules")
        return SQLStore(eng, distributed=True)
    return SQLStore(eng)


@pytest.fixture
def _router_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Check every statement a distributed store compiles in the test (``citus_rules``)."""
    with recording(monkeypatch) as seen:
        yield seen


@pytest.fixture
def engine_or_none(request: pytest.FixtureRequest, backend: str) -> AsyncEngine | None:
    """The test's engine on SQL backends, None for memory."""
    if backend == "memory":
        return None
    engine: AsyncEngine = request.getfixturevalue("engine")
    return engine
