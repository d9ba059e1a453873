"""Export and import of an encrypted store, on SQLite, Postgres and MySQL.

An export of an encrypted store stays encrypted (sealed values and wrapped data keys) and
imports into a fresh database opened with the same keyring: every value reads back, and
search finds the same hits. Asked to decrypt, it holds plaintext that any store imports. A
store without the keyring refuses an encrypted export whole.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    DecryptionError,
    Event,
    Filter,
    InvalidArgumentError,
    Manager,
    Memory,
    SQLStore,
)
from durable_sessions.crypto import LocalKeyring
from durable_sessions.sealing import INDEX, PREFIX
from durable_sessions.sql import transfer
from durable_sessions.sql.schema import events, keys, sessions
from durable_sessions.sql.transfer import KeyringRequiredError, export_jsonl, import_jsonl
from support.sql import MYSQL, SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", [*SQL_BACKENDS, MYSQL])

SECRET = "quokkasecret"
"""A word users said: never in an encrypted export, found by search after an import."""
ORGS = ("acme", "globex")
WORDS = ("porto", "lisbon", SECRET, "hello")


@pytest.fixture
def fresh_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Callable[[], str]:
    """Make another migrated, empty database of the backend."""
    made = iter(range(100))

    def make() -> str:
        if backend == "sqlite":
            path = tmp_path / f"fresh{next(made)}.db"
            shutil.copy(request.getfixturevalue("sqlite_template"), path)
            return f"sqlite+aiosqlite:///{path}"
        if backend == "mysql":
            return str(request.getfixturevalue("fresh_migrated_mysql_url")())
        return str(request.getfixturevalue("fresh_migrated_pg_url")())

    return make


async def fill(store: SQLStore) -> None:
    """Two organisations, two users each: titles, state of every scope, events with deltas,
    a fork with its transcript, and memories with content and metadata."""
    for org in ORGS:
        manager = Manager(store, app_name="app")
        for user in ("alice", "bob"):
            session = await manager.create(
                org, user, id=f"s-{user}", state={"note": f"{SECRET} private", "user:plan": "pro"}
            )
            session.title = f"Trip to porto with {SECRET}"
            session.set("app:motd", f"{SECRET} banner")
            await manager.save(session)
            for n, word in enumerate(WORDS):
                event = Event(
                    "user", {"text": f"{word} {user} {org} turn{n}"}, state_delta={"k": n}
                )
                await manager.append_event(session, event)
            await store.add_memories(
                org,
                "app",
                user,
                [
                    Memory(f"{user} likes {SECRET} in porto", id=f"m-{user}"),
                    Memory(
                        "lisbon trams",
                        content={"parts": [{"text": "lisbon trams"}]},
                        metadata={"source": SECRET},
                    ),
                ],
            )
        await manager.fork(org, "s-alice", with_events=True)


async def everything(store: SQLStore) -> dict[str, Any]:
    """What a user reads of the store: sessions, transcripts, state, search, memories."""
    seen: dict[str, Any] = {}
    for org in ORGS:
        for session in await store.list(Filter(org)):
            full = await store.get_with_events(org, session.id)
            seen[f"{org}/{session.id}"] = (
                full.title,
                full.state,
                [(e.seq, e.author, e.content, e.state_delta) for e in full.events],
            )
        for user in ("alice", "bob"):
            seen[f"{org}/shared/{user}"] = await store.get_shared_state(org, "app", user)
            for word in (*WORDS, "trams"):
                memories = await store.search_memories(org, "app", user, word)
                seen[f"{org}/memories/{user}/{word}"] = [
                    (m.id, m.text, m.content, m.metadata) for m in memories
                ]
        for word in (*WORDS, "alice", "bob turn3"):
            hits = await store.search(org, word, limit=100)
            seen[f"{org}/search/{word}"] = [(h.session_id, h.event.seq) for h in hits]
    return seen


async def export(store: SQLStore, **options: Any) -> bytes:
    out = io.BytesIO()
    await export_jsonl(store, out, **options)
    return out.getvalue()


async def count(engine: AsyncEngine, table: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_an_encrypted_export_imports_into_a_fresh_database_with_the_same_keyring(
    engine: AsyncEngine, fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    source = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    await fill(source)
    expected = await everything(source)
    assert expected["acme/search/" + SECRET]  # the blind index finds it in the source
    data = await export(source)
    assert SECRET.encode() not in data
    assert b"porto" not in data
    kinds = [json.loads(line)["type"] for line in data.splitlines()]
    assert kinds[0] == "header"
    # the keys first: 2 users and 1 app per organisation, and its index key
    assert kinds[1:9] == ["key"] * 8
    assert "key" not in kinds[9:]

    target_engine = create_async_engine(fresh_url())
    try:
        target = SQLStore(target_engine, keyring=LocalKeyring(tmp_path / "keys.json"))
        counts = await import_jsonl(target, data.splitlines(keepends=True))
        assert counts.keys == 8
        assert counts.sessions == 6
        assert counts.events == 24
        assert await everything(target) == expected
        assert await export(target) == data  # the same keys, the same sealed values
    finally:
        await target_engine.dispose()


async def test_an_import_into_an_organisation_already_there_indexes_with_its_index_key(
    engine: AsyncEngine, fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    keyring = tmp_path / "keys.json"
    source = SQLStore(engine, keyring=LocalKeyring(keyring))
    await fill(source)
    found = {h.session_id for h in await source.search("acme", "porto", limit=100)}
    assert len(found) == 3  # alice's, bob's and the fork
    target_engine = create_async_engine(fresh_url())
    try:
        target = SQLStore(target_engine, keyring=LocalKeyring(keyring))
        await Manager(target, app_name="app").create("acme", "carol", id="s-carol")
        await target.append_event("acme", "s-carol", Event("user", {"text": "porto carol"}))
        await import_jsonl(target, (await export(source)).splitlines(keepends=True))
        async with target_engine.connect() as conn:
            query = select(func.count()).where(keys.c.org_id == "acme", keys.c.kind == INDEX)
            assert (await conn.execute(query)).scalar_one() == 1
        hits = await target.search("acme", "porto", limit=100)
        assert {h.session_id for h in hits} == found | {"s-carol"}
        [memory] = await target.search_memories("acme", "app", "bob", "likes")
        assert memory.text == f"bob likes {SECRET} in porto"
    finally:
        await target_engine.dispose()


async def test_an_encrypted_export_is_refused_whole_by_a_store_without_the_keyring(
    engine: AsyncEngine, fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    source = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    await fill(source)
    data = await export(source)
    target_engine = create_async_engine(fresh_url())
    try:
        with pytest.raises(KeyringRequiredError) as caught:
            await import_jsonl(SQLStore(target_engine), data.splitlines(keepends=True))
        assert caught.value.line == 2
        assert "--keyring" in str(caught.value)
        assert isinstance(caught.value, transfer.ImportLineError)
        other = SQLStore(target_engine, keyring=LocalKeyring(tmp_path / "other.json"))
        with pytest.raises(DecryptionError, match="line 2"):
            await import_jsonl(other, data.splitlines(keepends=True))
        for table in (keys, sessions, events):
            assert await count(target_engine, table) == 0
    finally:
        await target_engine.dispose()


async def test_a_decrypted_export_holds_plaintext_that_any_store_imports(
    engine: AsyncEngine, fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    source = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    await fill(source)
    expected = await everything(source)
    data = await export(source, decrypt=True)
    assert PREFIX.encode() not in data
    assert SECRET.encode() in data
    assert "key" not in {json.loads(line)["type"] for line in data.splitlines()}
    target_engine = create_async_engine(fresh_url())
    try:
        plain = SQLStore(target_engine)  # no keyring
        counts = await import_jsonl(plain, data.splitlines(keepends=True))
        assert counts.keys == 0
        assert await everything(plain) == expected
        # a plaintext store's own export is the same bytes: nothing of the keyring is left
        assert await export(plain) == data
    finally:
        await target_engine.dispose()
    with pytest.raises(InvalidArgumentError, match="keyring"):
        await export(SQLStore(engine), decrypt=True)


async def test_the_sealed_prefix_is_the_one_the_import_knows(backend: str) -> None:
    assert transfer._SEALED == PREFIX


async def test_a_user_erased_since_the_export_stays_unreadable_and_the_rest_imports(
    engine: AsyncEngine, fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    source = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    await fill(source)
    data = await export(source)
    await source.delete_user("acme", "alice")  # destroys her secret in the keyring
    target_engine = create_async_engine(fresh_url())
    try:
        target = SQLStore(target_engine, keyring=LocalKeyring(tmp_path / "keys.json"))
        counts = await import_jsonl(target, data.splitlines(keepends=True))
        assert (counts.sessions, counts.keys, counts.keys_unreadable) == (6, 8, 1)
        with pytest.raises(DecryptionError):
            await target.get("acme", "s-alice")
        assert (await target.get("acme", "s-bob")).state["note"] == f"{SECRET} private"
        hits = await target.search("acme", "porto", limit=100)
        assert {h.session_id for h in hits} == {"s-bob"}
        assert await target.search_memories("acme", "app", "alice", "likes") == []
        assert len(await target.search("globex", "porto", limit=100)) == 3
    finally:
        await target_engine.dispose()
