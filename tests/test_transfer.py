"""Export and import as a library (``durable_sessions.sql.transfer``), on SQLite and Postgres."""

from __future__ import annotations

import io
import json

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Filter, Manager, SQLStore
from durable_sessions.sql.transfer import (
    ImportLineError,
    count_sessions,
    export_jsonl,
    import_jsonl,
)
from sqlhelpers import SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS)


async def fill(store: SQLStore) -> None:
    manager = Manager(store, app_name="app")
    for org in ("o1", "o2"):
        session = await manager.create(org, "u", id="s", state={"k": 1, "user:u": [1.0]})
        await manager.append_event(session, Event("user", {"text": "hi"}, tokens=3))
        await manager.append_event(session, Event("bot", {"text": "yo"}, state_delta={"app:a": 2}))
        await manager.fork(org, "s", with_events=True)


async def export(store: SQLStore) -> bytes:
    out = io.BytesIO()
    await export_jsonl(store, out)
    return out.getvalue()


async def test_export_then_import_round_trips_byte_for_byte(engine: AsyncEngine) -> None:
    source = SQLStore(engine)
    await fill(source)
    data = await export(source)
    lines = data.splitlines()
    assert json.loads(lines[0])["type"] == "header"
    assert await count_sessions(source) == 4

    # Into the same (emptied) database: delete everything, then import it back.
    manager = Manager(source)
    for org in ("o1", "o2"):
        for session in await manager.list(Filter(org)):
            await manager.delete(org, session.id)
        await manager.delete_user(org, "u")
    async with engine.begin() as conn:
        await conn.exec_driver_sql("DELETE FROM ds_app_state")
    counts = await import_jsonl(source, io.BytesIO(data))
    assert (counts.sessions, counts.events) == (4, 8)
    assert await export(source) == data
    restored = await source.get_with_events("o1", "s")
    assert restored.state == {"k": 1, "user:u": [1.0], "app:a": 2}
    assert [e.content for e in restored.events] == [{"text": "hi"}, {"text": "yo"}]
    # An imported session is a new life of its id: it gets an incarnation of its own.
    assert restored.incarnation


async def test_a_bad_line_names_itself_and_writes_nothing(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    await fill(store)
    data = (await export(store)).splitlines(keepends=True)
    async with engine.begin() as conn:
        for table in ("ds_events", "ds_sessions", "ds_user_state", "ds_app_state"):
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    broken = [*data[:3], b'{"type": "session", "id": 1}\n', *data[3:]]
    with pytest.raises(ImportLineError, match="line 4"):
        await import_jsonl(store, io.BytesIO(b"".join(broken)))
    assert await count_sessions(store) == 0


async def test_importing_over_existing_sessions_is_refused_whole(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    await fill(store)
    data = await export(store)
    before = await count_sessions(store)
    with pytest.raises(ImportLineError, match="already exists"):
        await import_jsonl(store, io.BytesIO(data))
    assert await count_sessions(store) == before
