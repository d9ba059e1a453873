"""The package's Alembic revisions, loaded as modules by path (their frozen tables and SQL),
and the revisions as released before they ran online, to make databases as they exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions.sql.migrate import script_location

VERSIONS = Path(script_location()) / "versions"

RELEASED = Path(__file__).with_name("released_migrations")
"""Byte-for-byte copies of ``migrations/`` (env.py and revisions 0001..0009) as released
before the revisions were reshaped to run online: one transaction for the whole upgrade, a
generated ``search_vector`` from 0003 to 0007, ``jsonb`` contents until 0007. Databases
made with them are the databases users have; the current revisions must upgrade them."""


def load_revision(filename: str) -> ModuleType:
    """The module of the revision file ``filename`` (e.g. ``"0003_search.py"``)."""
    spec = importlib.util.spec_from_file_location(
        f"revision_{Path(filename).stem}", VERSIONS / filename
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_online() -> ModuleType:
    """The revisions' online steps (``migrations/online.py``), loaded by path as they load it."""
    spec = importlib.util.spec_from_file_location(
        "durable_sessions_online_steps", Path(script_location()) / "online.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def upgrade_released(engine: AsyncEngine, revision: str) -> None:
    """Upgrade ``engine``'s database to ``revision`` with the released revisions."""

    def run(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(RELEASED).replace("%", "%%"))
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    async with engine.connect() as conn:
        await conn.run_sync(run)
        await conn.commit()
