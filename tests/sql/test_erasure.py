"""An erasure leaves none of the erased text in the SQLite file or its write-ahead log.

``delete_user`` and ``purge`` on SQLite: the full-text index would keep the removed words in
its segments, freed pages their old bytes and the write-ahead log the pages as they were.
Each test reads the files' bytes for a word only the erased user ever wrote (in events,
state, the title, and earlier versions of the session row), present before and absent
after, while another user's word stays in the file and findable by search.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from durable_sessions import Event, Manager, Memory, SQLStore

pytestmark = pytest.mark.sqlite

GONE = "zqxerasedmarker"
"""The erased user's word."""
KEPT = "zqxkeptmarker"
"""The other user's word."""


def file_bytes(path: Path) -> bytes:
    """The database file and its write-ahead log, as they are on disk."""
    found = path.read_bytes()
    wal = Path(f"{path}-wal")
    return found + (wal.read_bytes() if wal.exists() else b"")


def wal_size(path: Path) -> int:
    """The size of the database's write-ahead log."""
    return Path(f"{path}-wal").stat().st_size


async def fill(store: SQLStore, *, sessions: int = 3, shared: bool = True) -> None:
    """Sessions of mallory (``GONE``) and alice (``KEPT``), written in turns so that their
    rows share pages: each word in titles, private state, events (and with ``shared``,
    ``user:`` state and long-term memories, which outlive sessions), each session row
    rewritten by appends and saves."""
    manager = Manager(store, app_name="app")
    held = []
    for n in range(sessions):
        for user_id, word in (("mallory", GONE), ("alice", KEPT)):
            state = {"note": f"{word} private", **({f"user:{word}": word} if shared else {})}
            session = await manager.create("acme", user_id, state=state)
            session.title = f"Trip with {word} {n}"
            await manager.save(session)
            held.append((session, word))
    for turn in range(40):
        for session, word in held:
            text = f"turn {turn}: {word} says hello " + "padding " * 30
            await manager.append_event(session, Event(author="x", content={"text": text}))
    for session, word in held:
        session.set("note", f"still {word}")
        await manager.save(session)
    if shared:
        for n in range(20):
            for user_id, word in (("mallory", GONE), ("alice", KEPT)):
                memory = Memory(f"{word} remembers {n}", content={"text": word})
                await store.add_memories("acme", "app", user_id, [memory])


def secure_delete_off(dbapi_conn: Any, record: Any) -> None:
    """Start each connection as a SQLite built without SECURE_DELETE would (Debian's is
    built with it on): whatever is zeroed, the store's own settings zero it."""
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA secure_delete = OFF")
    cursor.close()


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncEngine:
    # The pool SQLAlchemy 2.1 gives a file database (2.0 gives NullPool, whose every
    # connection closes after use, and the last close removes the log altogether).
    engine = create_async_engine(
        f"sqlite+aiosqlite:///{tmp_path / 'erase.db'}", poolclass=AsyncAdaptedQueuePool
    )
    event.listen(engine.sync_engine, "connect", secure_delete_off)
    await SQLStore(engine).migrate()
    yield engine  # type: ignore[misc]
    await engine.dispose()


async def test_delete_user_leaves_none_of_their_words_in_the_file(
    sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    store = SQLStore(sqlite_engine)
    path = tmp_path / "erase.db"
    await fill(store)
    assert GONE.encode() in file_bytes(path)
    assert [h.session_id for h in await store.search("acme", GONE)]

    assert await store.delete_user("acme", "mallory") == 3

    on_disk = file_bytes(path)
    assert GONE.encode() not in on_disk
    assert KEPT.encode() in on_disk
    assert await store.search("acme", GONE) == []
    assert len(await store.search("acme", KEPT, limit=200)) == 120
    assert await store.search_memories("acme", "app", "mallory", GONE) == []
    assert len(await store.search_memories("acme", "app", "alice", KEPT)) == 20
    assert wal_size(path) == 0


async def test_purge_leaves_none_of_the_purged_words_in_the_file(
    sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    store = SQLStore(sqlite_engine)
    path = tmp_path / "erase.db"
    await fill(store, shared=False)  # user: state outlives a purge
    async with sqlite_engine.begin() as conn:  # mallory's sessions are old
        await conn.exec_driver_sql(
            "UPDATE ds_sessions SET updated_at = '2001-01-01 00:00:00.000000' "
            "WHERE user_id = 'mallory'"
        )
    assert GONE.encode() in file_bytes(path)

    assert await store.purge("acme", older_than=timedelta(days=1)) == 3

    on_disk = file_bytes(path)
    assert GONE.encode() not in on_disk
    assert KEPT.encode() in on_disk
    assert len(await store.search("acme", KEPT, limit=200)) == 120


async def test_an_erasure_that_removes_nothing_still_empties_the_log(
    sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    """Running it again (say after a reader held the log) finishes the job."""
    store = SQLStore(sqlite_engine)
    await fill(store, sessions=1)
    assert wal_size(tmp_path / "erase.db") > 0
    assert await store.delete_user("acme", "nobody") == 0
    assert wal_size(tmp_path / "erase.db") == 0
