"""A store listens to its own engine only: nothing registered at import, nothing on engines
no store was given.

The store marks its operations' connection attempts (``sql/attempts.py``): a SQLite file
that does not exist is refused instead of created, and a failed attempt is told from a
connection that failed in use. Those listeners go on the engine a ``SQLStore`` is given,
once however many stores share it; SQLAlchemy's ``Engine`` and ``Pool`` classes, and the
application's other engines, are left as they were.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import Pool

from durable_sessions import Manager, SchemaNotMigratedError, SQLStore
from durable_sessions.sql import attempts
from durable_sessions.sql.translate import translated

pytestmark = pytest.mark.sqlite


def listens(engine: Engine) -> list[bool]:
    """Whether each of the store's listeners is registered on ``engine`` (its dialect's
    events and its pool's)."""
    return [
        attempts._on_do_connect in list(engine.dialect.dispatch.do_connect),
        attempts._on_connect in list(engine.pool.dispatch.connect),
    ]


def on_classes() -> list[bool]:
    """Whether each of the store's listeners is registered on SQLAlchemy's classes."""
    return [
        event.contains(Engine, "do_connect", attempts._on_do_connect),
        event.contains(Pool, "connect", attempts._on_connect),
    ]


def test_importing_the_package_registers_nothing_on_sqlalchemys_classes() -> None:
    """In a fresh process: import every public module, make an engine of the application's
    own, and SQLAlchemy's classes carry no listener of ours."""
    modules = ["durable_sessions", "durable_sessions.sql"]
    # The adapters, where their frameworks are installed (the lowest-versions run installs
    # google-adk in its second step).
    for module, needs in (("adk", "google.adk"), ("openai_agents", "agents")):
        try:
            installed = importlib.util.find_spec(needs) is not None
        except ModuleNotFoundError:  # google.adk's parent package is missing too
            installed = False
        if installed:
            modules.append(f"durable_sessions.{module}")
    code = (
        f"import {', '.join(modules)}\n"
        "from sqlalchemy import create_engine, event\n"
        "from sqlalchemy.engine import Engine\n"
        "from sqlalchemy.pool import Pool\n"
        "from durable_sessions.sql import attempts\n"
        "engine = create_engine('sqlite://')\n"
        "print(event.contains(Engine, 'do_connect', attempts._on_do_connect),\n"
        "      event.contains(Pool, 'connect', attempts._on_connect),\n"
        "      event.contains(engine, 'do_connect', attempts._on_do_connect),\n"
        "      event.contains(engine.pool, 'connect', attempts._on_connect))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"] * 4


async def test_a_store_listens_to_its_engine_once_and_to_no_other(tmp_path: Path) -> None:
    ours = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
    theirs = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    try:
        SQLStore(ours)
        SQLStore(ours)  # a second store on the same engine adds nothing
        assert listens(ours.sync_engine) == [True, True]
        assert len(ours.sync_engine.dialect.dispatch.do_connect) == 1
        assert list(ours.sync_engine.pool.dispatch.connect).count(attempts._on_connect) == 1
        assert listens(theirs.sync_engine) == [False, False]
        assert on_classes() == [False, False]
    finally:
        await ours.dispose()
        await theirs.dispose()


async def test_an_engine_no_store_uses_creates_a_missing_sqlite_file_as_usual(
    tmp_path: Path,
) -> None:
    """The application's own engine opens SQLite as SQLAlchemy does (creating a missing
    file), even while a store operation is under way in the same context (as in a listener
    of the store's engine that logs elsewhere); the store's own engine refuses the file it
    would otherwise create."""
    store_path, app_path = tmp_path / "store.db", tmp_path / "app.db"
    store = SQLStore.from_url(f"sqlite:///{store_path}")
    theirs = create_async_engine(f"sqlite+aiosqlite:///{app_path}")
    try:
        with translated("get"):  # the marker every store operation sets
            async with theirs.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        assert app_path.exists()
        with pytest.raises(SchemaNotMigratedError, match="there is no database file"):
            await store.get("org", "id")
        assert not store_path.exists()
    finally:
        await store.close()
        await theirs.dispose()


async def test_the_listeners_outlive_a_dispose_of_the_engine(tmp_path: Path) -> None:
    """``engine.dispose()`` replaces the pool; the store's engine still refuses a missing
    file, and migrating still creates it."""
    path = tmp_path / "missing.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    store = SQLStore(engine)
    connects = list(engine.sync_engine.pool.dispatch.connect)
    try:
        await engine.dispose()
        assert listens(engine.sync_engine) == [True, True]
        SQLStore(engine)  # a store made after the dispose adds nothing
        assert len(engine.sync_engine.pool.dispatch.connect) == len(connects)
        with pytest.raises(SchemaNotMigratedError, match="there is no database file"):
            await Manager(store).create("o", "u")
        assert not path.exists()
        await store.migrate()
        assert (await Manager(store).create("o", "u")).user_id == "u"
    finally:
        await engine.dispose()
