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
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import InMemoryStore, SQLStore, Store
from durable_sessions.sql.citus import SETTING
from support.citus_rules import recording
from support.sql import PG_DISTRIBUTED, SQL_BACKENDS, raw_pg

POSTGRES_ENV = "DURABLE_SESSIONS_TEST_POSTGRES_URL"


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


def create_pg_database(base_url: str) -> str:
    """Create an empty Postgres database next to ``base_url`` and return its URL."""
    name = f"ds_test_{uuid.uuid4().hex[:12]}"
    _run_admin(base_url, f'CREATE DATABASE "{name}"')
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


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    """The Postgres server under test (skips locally when unset, fails under CI)."""
    url = postgres_base_url()
    if url is None:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    return url


@pytest.fixture
def fresh_pg_url(pg_base_url: str) -> Iterator[Callable[[], str]]:
    """A factory of empty Postgres databases, dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(create_pg_database(pg_base_url))
        return made[-1]

    yield make
    for url in made:
        drop_pg_database(pg_base_url, url)


def _migrated_pg_database(pg_base_url: str, *, distributed: bool = False) -> str:
    url = create_pg_database(pg_base_url)
    if distributed:
        set_pg_database(pg_base_url, url, SETTING, "on")

    async def migrate() -> None:
        engine = create_async_engine(url)
        try:
            await SQLStore(engine).migrate()
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(1) as pool:  # its own loop, even if a test's loop is running
        pool.submit(asyncio.run, migrate()).result()
    return url


@pytest.fixture(scope="session")
def migrated_pg_url(pg_base_url: str) -> Iterator[str]:
    """One migrated Postgres database for the whole run; tests truncate it before use."""
    url = _migrated_pg_database(pg_base_url)
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
        await conn.exec_driver_sql("TRUNCATE ds_events, ds_sessions, ds_user_state, ds_app_state")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The URL of a new SQLite file."""
    return f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"


BACKENDS = [pytest.param("memory", marks=pytest.mark.memory), *SQL_BACKENDS, PG_DISTRIBUTED]


@pytest.fixture
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database URL of a SQL backend (parametrise ``backend`` with SQL_BACKENDS)."""
    backend = request.getfixturevalue("backend")
    if backend == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    if backend == "postgres-distributed":
        return str(request.getfixturevalue("migrated_pg_distributed_url"))
    return str(request.getfixturevalue("migrated_pg_url"))


@pytest.fixture
async def engine(backend: str, backend_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a migrated, empty database of ``backend``."""
    eng = create_async_engine(backend_url)
    if backend == "sqlite":
        await SQLStore(eng).migrate()
    else:
        await _truncate(eng)
    yield eng
    await eng.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test runs against: memory, sqlite, postgres or postgres-distributed."""
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
