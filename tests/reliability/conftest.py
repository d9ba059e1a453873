"""Fixtures of the reliability suite, and the figures table printed at the end of the run.

The fixtures of ``tests/conftest.py`` (``backend``, ``store``, ``engine``, ``backend_url``,
``sqlite_url``, ``fresh_pg_url``, ``migrated_pg_url``) apply here too; this file adds what
only the reliability scenarios need.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import InMemoryStore, SQLStore, Store
from reliability.figures import FIGURES_KEY, Figures, render
from reliability.helpers import reset_tables
from reliability.jobs import PROCESSES

_T = TypeVar("_T")


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest) -> Figures:
    """The figures table of this run; each scenario records its rows in it."""
    return Figures(request.config.stash.setdefault(FIGURES_KEY, []))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the figures table once, after the test results."""
    rows = config.stash.get(FIGURES_KEY, [])
    if not rows:
        return
    terminalreporter.write_sep("=", "reliability figures")
    for line in render(rows):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def process_pool() -> Iterator[ProcessPoolExecutor]:
    """Spawned worker processes shared by the multi-process scenarios of the run."""
    pool = ProcessPoolExecutor(PROCESSES, mp_context=multiprocessing.get_context("spawn"))
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def barrier_dir(tmp_path: Path) -> Callable[[str], str]:
    """A factory of fresh barrier directories (see ``helpers.wait_at_barrier``)."""

    def make(name: str) -> str:
        return str(tmp_path / "barriers" / name)

    return make


@pytest.fixture
def store_factory(request: pytest.FixtureRequest, backend: str) -> Callable[..., Store]:
    """Make stores of ``backend`` with chosen options, e.g. ``max_value_bytes``.

    SQL stores share the test's ``engine``, so they see the same (emptied) database.
    """
    if backend == "memory":
        return lambda **options: InMemoryStore(**options)
    engine = request.getfixturevalue("engine")
    return lambda **options: SQLStore(engine, **options)


def run_in_thread(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion in a thread of its own (safe inside a running loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _prepare(url: str, migrate: bool) -> None:
    engine = create_async_engine(url)
    try:
        if migrate:
            await SQLStore(engine).migrate()
        else:
            await reset_tables(engine)
    finally:
        await engine.dispose()


@pytest.fixture
def sync_url(request: pytest.FixtureRequest, backend: str) -> str | None:
    """For synchronous tests that own their loop: the URL of a migrated, empty database.

    None for the memory backend; a new SQLite file; the run's migrated Postgres database
    (the distributed one for postgres-distributed), emptied.
    """
    if backend == "memory":
        return None
    if backend == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        run_in_thread(_prepare(url, migrate=True))
        return url
    url = str(request.getfixturevalue("backend_url"))
    run_in_thread(_prepare(url, migrate=False))
    return url
