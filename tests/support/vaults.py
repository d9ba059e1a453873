"""Encrypted stores under test, and what an attacker with a copy of their data sees.

A *vault* is a store with a keyring plus the three things the encryption tests need of its
backend: every stored byte (``raw``), a copy of the data as it is now (``snapshot``), and a
store over such a copy with some keyring (``reopen``), as a stolen backup opened later; and a
store over the same data (``another``), as another process of the same service.
"""

from __future__ import annotations

import copy
import json
import pickle
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import InMemoryStore, SQLStore
from durable_sessions.crypto import Keyring, LocalKeyring

__all__ = [
    "MemoryVault",
    "MySQLVault",
    "PostgresVault",
    "SQLiteVault",
    "mysql_bytes",
    "open_vault",
]


@dataclass
class _MemoryCopy:
    parts: tuple[Any, ...]


class MemoryVault:
    """The in-memory store: its dicts are its database."""

    def __init__(self, keyring: Keyring) -> None:
        self.store = InMemoryStore(keyring=keyring)

    @staticmethod
    def _parts(store: InMemoryStore) -> tuple[Any, ...]:
        assert store._env is not None
        return (store._sessions, store._user, store._app, store._memories, store._env.sealer.table)

    async def raw(self) -> bytes:
        """Every byte the store keeps."""
        return pickle.dumps(self._parts(self.store))

    async def snapshot(self) -> _MemoryCopy:
        """A copy of the data as it is now (a backup)."""
        return _MemoryCopy(copy.deepcopy(self._parts(self.store)))

    async def reopen(self, snapshot: Any, keyring: Keyring) -> InMemoryStore:
        """A store over a copy of the data, with ``keyring``."""
        store = InMemoryStore(keyring=keyring)
        assert store._env is not None
        parts = copy.deepcopy(snapshot.parts)
        store._sessions, store._user, store._app, store._memories, store._env.sealer.table = parts
        return store

    async def another(self, keyring: Keyring) -> InMemoryStore:
        """A store over the same data, with ``keyring``: another process at work on it."""
        store = InMemoryStore(keyring=keyring)
        assert store._env is not None
        parts = self._parts(self.store)
        store._sessions, store._user, store._app, store._memories, store._env.sealer.table = parts
        return store

    async def move_private_value(self, org: str, source: str, target: str, key: str) -> None:
        """Copy session ``source``'s stored value of ``key`` over ``target``'s."""
        sessions = self.store._sessions
        sessions[(org, target)].private[key] = sessions[(org, source)].private[key]

    async def move_content(self, org: str, source: str, target: str) -> None:
        """Copy the first event's stored content of ``source`` over ``target``'s first."""
        sessions = self.store._sessions
        sessions[(org, target)].events[0].content = sessions[(org, source)].events[0].content

    async def close(self) -> None:
        """Release what the vault holds."""


class SQLiteVault:
    """A SQLite file: its bytes (and its write-ahead log's) are the database."""

    def __init__(self, path: Path, keyring: Keyring) -> None:
        self.path = path
        self.engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        self.store = SQLStore(self.engine, keyring=keyring)
        self._engines: list[AsyncEngine] = [self.engine]

    async def raw(self) -> bytes:
        """The bytes of the database file and its write-ahead log."""
        wal = self.path.with_name(self.path.name + "-wal")
        return self.path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")

    async def snapshot(self) -> Path:
        """A copy of the database file (its log checkpointed into it first)."""
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        copy_path = self.path.with_name(f"copy-{uuid.uuid4().hex[:8]}.db")
        shutil.copyfile(self.path, copy_path)
        return copy_path

    async def reopen(self, snapshot: Path, keyring: Keyring) -> SQLStore:
        """A store over a copy of the file, with ``keyring``."""
        engine = create_async_engine(f"sqlite+aiosqlite:///{snapshot}")
        self._engines.append(engine)
        return SQLStore(engine, keyring=keyring)

    async def another(self, keyring: Keyring) -> SQLStore:
        """A store over the same database, with ``keyring``: another process at work on it."""
        engine = create_async_engine(self.engine.url)
        self._engines.append(engine)
        return SQLStore(engine, keyring=keyring)

    async def _copy(self, sql: str, **params: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(text(sql), params)

    async def move_private_value(self, org: str, source: str, target: str, key: str) -> None:
        """Copy session ``source``'s stored value of ``key`` over ``target``'s."""
        path = "$." + json.dumps(key)
        await self._copy(
            "UPDATE ds_sessions SET state = json_set(state, :path, "
            "(SELECT json_extract(state, :path) FROM ds_sessions WHERE org_id = :org "
            "AND id = :source)) WHERE org_id = :org AND id = :target",
            path=path, org=org, source=source, target=target,
        )  # fmt: skip

    async def move_content(self, org: str, source: str, target: str) -> None:
        """Copy the first event's stored content of ``source`` over ``target``'s first."""
        await self._copy(
            "UPDATE ds_events SET content = (SELECT content FROM ds_events WHERE org_id = :org "
            "AND session_id = :source AND seq = 1) WHERE org_id = :org AND session_id = :target "
            "AND seq = 1",
            org=org, source=source, target=target,
        )  # fmt: skip

    async def close(self) -> None:
        """Dispose the engines."""
        for engine in self._engines:
            await engine.dispose()


class PostgresVault(SQLiteVault):
    """A Postgres database: its rows, as text, are what a dump or a replica holds."""

    TABLES = (
        "ds_sessions", "ds_events", "ds_user_state", "ds_app_state", "ds_keys", "ds_memories",
        "ds_memory_terms", "durable_sessions_alembic_version",
    )  # fmt: skip

    def __init__(self, url: str, keyring: Keyring, copy_database: Any) -> None:
        self.url = url
        self.engine = create_async_engine(url)
        self.store = SQLStore(self.engine, keyring=keyring)
        self._engines = [self.engine]
        self._copy_database = copy_database

    async def raw(self) -> bytes:
        """Every row of every table (with the search vectors), as text."""
        out = []
        async with self.engine.connect() as conn:
            for table in self.TABLES:
                rows = await conn.exec_driver_sql(f"SELECT t::text FROM {table} AS t")
                out += [row[0] for row in rows]
        return "\n".join(out).encode()

    async def snapshot(self) -> Any:
        """A copy of the database (``CREATE DATABASE ... TEMPLATE``)."""
        await self.engine.dispose()  # a template database may have no connection
        return self._copy_database(self.url)

    async def reopen(self, snapshot: Any, keyring: Keyring) -> SQLStore:
        """A store over a copy of the database, with ``keyring``."""
        engine = create_async_engine(snapshot)
        self._engines.append(engine)
        return SQLStore(engine, keyring=keyring)

    async def move_private_value(self, org: str, source: str, target: str, key: str) -> None:
        """Copy session ``source``'s stored value of ``key`` over ``target``'s."""
        await self._copy(
            "UPDATE ds_sessions SET state = jsonb_set(state, ARRAY[CAST(:key AS text)], "
            "(SELECT state -> CAST(:key AS text) FROM ds_sessions WHERE org_id = :org "
            "AND id = :source)) WHERE org_id = :org AND id = :target",
            key=key, org=org, source=source, target=target,
        )  # fmt: skip


async def mysql_bytes(engine: AsyncEngine) -> bytes:
    """Every stored value of every table of a MySQL database (the search words, the memory
    terms and the migration version too): bytes as they are, text as UTF-8, one line a
    row."""
    out = []
    async with engine.connect() as conn:
        tables = await conn.exec_driver_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() "
            "AND table_type = 'BASE TABLE' ORDER BY table_name"
        )
        for (table,) in tables.all():
            for row in await conn.exec_driver_sql(f"SELECT * FROM `{table}`"):
                out.append(b"\t".join(_stored(value) for value in row))
    return b"\n".join(out)


def _stored(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode()


class MySQLVault(PostgresVault):
    """A MySQL (MariaDB) database: its rows, every value as stored, are what a dump holds."""

    async def raw(self) -> bytes:
        """Every row of every table (with the words of the search and of memories)."""
        return await mysql_bytes(self.engine)

    async def snapshot(self) -> Any:
        """A copy of the database (each table's definition and rows, into a new one)."""
        return self._copy_database(self.url)

    async def move_private_value(self, org: str, source: str, target: str, key: str) -> None:
        """Copy session ``source``'s stored value of ``key`` over ``target``'s."""
        # A join, not a subquery: MySQL reads no table an UPDATE writes in a subquery.
        await self._copy(
            "UPDATE ds_sessions AS t JOIN ds_sessions AS s ON s.org_id = t.org_id "
            "AND s.id = :source SET t.state = JSON_SET(t.state, :path, "
            "JSON_EXTRACT(s.state, :path)) WHERE t.org_id = :org AND t.id = :target",
            path="$." + json.dumps(key), org=org, source=source, target=target,
        )  # fmt: skip

    async def move_content(self, org: str, source: str, target: str) -> None:
        """Copy the first event's stored content of ``source`` over ``target``'s first."""
        await self._copy(
            "UPDATE ds_events AS t JOIN ds_events AS s ON s.org_id = t.org_id "
            "AND s.session_id = :source AND s.seq = 1 SET t.content = s.content "
            "WHERE t.org_id = :org AND t.session_id = :target AND t.seq = 1",
            org=org, source=source, target=target,
        )  # fmt: skip


async def open_vault(request: Any, tmp_path: Path) -> AsyncIterator[Any]:
    """The vault of ``request.param`` (``"memory"``, ``"sqlite"``, ``"postgres"`` or
    ``"mysql"``) for a pytest fixture to yield, with its keyring at ``tmp_path /
    'keys.json'``; closed, and its copies dropped, after."""
    keyring = LocalKeyring(tmp_path / "keys.json")
    made: Any
    copies: list[str] = []
    dropper: Any = None
    if request.param == "memory":
        made = MemoryVault(keyring)
    elif request.param == "sqlite":
        url = request.getfixturevalue("migrated_sqlite_url")
        made = SQLiteVault(Path(url.removeprefix("sqlite+aiosqlite:///")), keyring)
    else:  # a server's database: a copy of the migrated template, and copies of it
        from conftest import create_mysql_database, create_pg_database

        mysql = request.param == "mysql"
        server = request.getfixturevalue("mysql_url" if mysql else "pg_base_url")
        dropper = request.getfixturevalue("_mysql_dropper" if mysql else "_pg_dropper")
        create = create_mysql_database if mysql else create_pg_database

        def copy_database(url: str) -> str:
            copies.append(create(server, template=url))
            return copies[-1]

        fresh = request.getfixturevalue(f"fresh_migrated_{'mysql' if mysql else 'pg'}_url")
        made = (MySQLVault if mysql else PostgresVault)(fresh(), keyring, copy_database)
    yield made
    await made.close()
    for url in copies:
        dropper.drop(url)
