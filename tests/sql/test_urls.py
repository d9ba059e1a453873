"""One URL helper for the command, ``alembic`` and ``SQLStore.from_url``: the same URLs work."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import make_url, text

from durable_sessions import InvalidArgumentError, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.sql.urls import async_url, sqlite_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///a.db", "sqlite+aiosqlite:///a.db"),
        ("sqlite+aiosqlite:///a.db", "sqlite+aiosqlite:///a.db"),
        ("sqlite://", "sqlite+aiosqlite://"),
        ("postgresql://u@h:5432/d", "postgresql+asyncpg://u@h:5432/d"),
        ("postgres://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
    ],
)
def test_plain_urls_get_their_async_driver(given: str, expected: str) -> None:
    assert async_url(given).render_as_string(hide_password=False) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("::not a url s3cret", "the database URL is not valid"),
        ("mssql://ada:s3cret@db/x", "unsupported database URL scheme 'mssql'"),
        ("postgresql+psycopg://ada:s3cret@db/x", "unsupported database URL scheme"),
    ],
)
def test_bad_urls_are_refused_without_the_password(given: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        async_url(given)
    assert "s3cret" not in str(caught.value)
    with pytest.raises(InvalidArgumentError, match=message):
        SQLStore.from_url(given)


def test_sqlite_file() -> None:
    assert sqlite_file(async_url("sqlite:///x/a.db")) == Path("x/a.db")
    assert sqlite_file(async_url("sqlite://")) is None
    assert sqlite_file(async_url("sqlite:///:memory:")) is None
    assert sqlite_file(async_url("postgresql://u@h/d")) is None


@pytest.mark.sqlite
async def test_from_url_takes_the_plain_sqlite_url_the_command_takes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    store = SQLStore.from_url(url)
    try:
        await store.migrate()
        assert store.engine.dialect.driver == "aiosqlite"
        session = await Manager(store).create("acme", "ada")
        assert (await store.get("acme", session.id)).user_id == "ada"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_from_url_takes_a_plain_postgres_url(fresh_pg_url: Callable[[], str]) -> None:
    url = make_url(fresh_pg_url()).set(drivername="postgresql")
    store = SQLStore.from_url(url.render_as_string(hide_password=False))
    try:
        assert store.engine.dialect.driver == "asyncpg"
        await store.migrate()
        assert (await Manager(store).create("acme", "ada")).user_id == "ada"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_from_url_passes_engine_options_such_as_the_pool_order(
    fresh_pg_url: Callable[[], str],
) -> None:
    # pool_use_lifo=True (the performance page's advice): the connection returned last is
    # lent first. The pool's own order would lend the one returned first.
    store = SQLStore.from_url(fresh_pg_url(), pool_use_lifo=True)
    pid = text("SELECT pg_backend_pid()")
    try:
        async with store.engine.connect() as first:
            async with store.engine.connect() as second:
                returned_first = await second.scalar(pid)
            returned_last = await first.scalar(pid)
        assert returned_first != returned_last
        async with store.engine.connect() as again:
            assert await again.scalar(pid) == returned_last
    finally:
        await store.close()


def _alembic(tmp_path: Path, url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    if url is not None:
        env["DURABLE_SESSIONS_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "upgrade", "head"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_alembic_without_a_url_is_one_line_saying_what_to_set(tmp_path: Path) -> None:
    done = _alembic(tmp_path, None)
    assert done.returncode != 0
    output = (done.stdout + done.stderr).strip().splitlines()
    assert output == [
        "FAILED: no database URL: set DURABLE_SESSIONS_URL, for example "
        "DURABLE_SESSIONS_URL=sqlite:///sessions.db alembic upgrade head"
    ]


def test_alembic_with_a_bad_url_is_one_line_without_the_password(tmp_path: Path) -> None:
    done = _alembic(tmp_path, "mssql://ada:s3cret@db/x")
    assert done.returncode != 0
    output = (done.stdout + done.stderr).strip().splitlines()
    assert len(output) == 1, output
    assert "unsupported database URL scheme 'mssql'" in output[0]
    assert "s3cret" not in output[0]


@pytest.mark.sqlite
def test_alembic_takes_a_plain_sqlite_url(tmp_path: Path) -> None:
    done = _alembic(tmp_path, "sqlite:///plain.db")
    assert done.returncode == 0, done.stderr
    assert main(["--url", f"sqlite:///{tmp_path / 'plain.db'}", "check"]) == 0
