"""`durable-sessions keys rotate` and `keys reencrypt`, and --keyring on every command, on a
SQLite file and on a MySQL database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.crypto import LocalKeyring
from support.sql import MYSQL
from support.vaults import mysql_bytes

ROWS = (
    "ds_sessions", "ds_events", "ds_event_words", "ds_user_state", "ds_app_state", "ds_memories",
    "ds_memory_terms", "ds_keys",
)  # fmt: skip
"""The tables of a MySQL database that a restore writes rows to."""

T = TypeVar("T")


class Databases:
    """The databases of one test on one backend: each new one by name, and what it stores."""

    def __init__(self, tmp_path: Path, make: Callable[[], str] | None = None) -> None:
        self.tmp_path = tmp_path
        self._make = make  # a migrated, empty MySQL database; None on SQLite
        self._urls: dict[str, str] = {}

    def url(self, name: str) -> str:
        """The URL of the database ``name``: a SQLite file not created yet, or a migrated
        MySQL database (copied from the run's template: nothing migrates it per test)."""
        if name not in self._urls:
            made = self._make() if self._make else f"sqlite:///{self.tmp_path / name}.sqlite"
            self._urls[name] = made
        return self._urls[name]

    def stored(self, name: str) -> bytes:
        """Every byte the database ``name`` stores (a SQLite file; a MySQL database's rows)."""
        if self._make is None:
            return (self.tmp_path / f"{name}.sqlite").read_bytes()
        return asyncio.run(_on_mysql(self.url(name), mysql_bytes))

    def holds_nothing(self, name: str) -> bool:
        """Whether a failed restore left nothing in ``name``: no SQLite file; no row in the
        (migrated) MySQL database."""
        if self._make is None:
            return not (self.tmp_path / f"{name}.sqlite").exists()
        return asyncio.run(_on_mysql(self.url(name), _rows)) == 0


async def _on_mysql(url: str, read: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    engine = create_async_engine(url)
    try:
        return await read(engine)
    finally:
        await engine.dispose()


async def _rows(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        counts = [await conn.exec_driver_sql(f"SELECT count(*) FROM {t}") for t in ROWS]
        return sum(int(count.scalar_one()) for count in counts)


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.sqlite), MYSQL])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Databases:
    """New databases of the backend the commands run on."""
    if request.param == "mysql":
        return Databases(tmp_path, request.getfixturevalue("fresh_migrated_mysql_url"))
    return Databases(tmp_path)


def _fill(url: str, keyring: Path | None) -> str:
    async def fill() -> str:
        store = SQLStore.from_url(url, keyring=LocalKeyring(keyring) if keyring else None)
        await store.migrate()
        session = await Manager(store, app_name="app").create("default", "alice")
        await store.append_event("default", session.id, Event("user", content="hello quokka"))
        await store.close()
        return session.id

    return asyncio.run(fill())


def test_keys_rotate_rewraps_and_removes_the_old_master_key(
    databases: Databases, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, keys = databases.url("db"), tmp_path / "keys.json"
    _fill(url, keys)
    old = LocalKeyring(keys).current_master()
    assert main(["keys", "rotate", "--url", url, "--keyring", str(keys), "--remove-old"]) == 0
    out = capsys.readouterr().out
    assert "Re-wrapped 2 data keys" in out  # alice's and the organisation index's
    assert old not in json.loads(keys.read_text())["masters"]
    assert main(["search", "quokka", "--url", url, "--keyring", str(keys)]) == 0
    assert "hello quokka" in capsys.readouterr().out


def test_keys_reencrypt_seals_a_plaintext_database(
    databases: Databases, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, keys = databases.url("db"), tmp_path / "keys.json"
    _fill(url, None)
    assert b"quokka" in databases.stored("db")
    assert main(["keys", "reencrypt", "--url", url, "--keyring", str(keys)]) == 0
    assert "Re-encrypted 1 rows" in capsys.readouterr().out  # the event (the rest is empty)
    assert b"quokka" not in databases.stored("db")
    assert main(["--keyring", str(keys), "search", "quokka", "--url", url]) == 0
    assert "hello quokka" in capsys.readouterr().out


def test_keys_commands_need_a_keyring(
    databases: Databases, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "rotate", "--url", databases.url("db")]) == 2
    assert "needs --keyring" in capsys.readouterr().err


def test_export_stays_encrypted_and_imports_with_the_keyring_or_decrypted_without(
    databases: Databases, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, keys = databases.url("db"), str(tmp_path / "keys.json")
    _fill(url, tmp_path / "keys.json")
    sealed, plain = tmp_path / "sealed.jsonl", tmp_path / "plain.jsonl"
    assert main(["export", "--url", url, "--keyring", keys, "-o", str(sealed)]) == 0
    assert "2 data keys" in capsys.readouterr().out
    assert b"quokka" not in sealed.read_bytes()
    assert main(["export", "--url", url, "--decrypt", "-o", str(plain)]) == 2
    assert "needs --keyring" in capsys.readouterr().err
    assert main(["export", "--url", url, "--keyring", keys, "--decrypt", "-o", str(plain)]) == 0
    assert b"hello quokka" in plain.read_bytes()

    without = databases.url("without")
    assert main(["import", "--url", without, "-i", str(sealed)]) == 1
    assert "the export is encrypted" in capsys.readouterr().err
    assert databases.holds_nothing("without")  # a failed restore leaves nothing

    copy = databases.url("copy")
    assert main(["import", "--url", copy, "--keyring", keys, "-i", str(sealed)]) == 0
    assert "2 data keys" in capsys.readouterr().out
    assert main(["search", "quokka", "--url", copy, "--keyring", keys]) == 0
    assert "hello quokka" in capsys.readouterr().out
    assert b"quokka" not in databases.stored("copy")
    assert main(["import", "--url", without, "-i", str(plain)]) == 0
    capsys.readouterr()
    assert main(["search", "quokka", "--url", without]) == 0
    assert "hello quokka" in capsys.readouterr().out
