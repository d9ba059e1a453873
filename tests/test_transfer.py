"""Export and import as a library (``durable_sessions.sql.transfer``), on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Filter, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.sql.transfer import (
    ImportLineError,
    count_sessions,
    dumps,
    export_jsonl,
    import_jsonl,
)
from sqlhelpers import SQL_BACKENDS, snapshot

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


# -- deeply nested JSON: the line's error, nothing written ----------------------------------

DEEP = 100_000


def deep(depth: int = DEEP) -> str:
    """JSON text of a list nested ``depth`` levels deep (past Python's recursion limit)."""
    return "[" * depth + "]" * depth


async def tables_empty(engine: AsyncEngine) -> bool:
    return all(not rows for rows in (await snapshot(engine)).values())


def deep_inputs(record: bytes) -> dict[str, tuple[int, bytes]]:
    """Each deep input, and the line whose error it must be."""
    header = dumps({"format": "durable-sessions", "type": "header", "version": 1}).encode()
    value = record.replace(b'"state":{}', b'"state":{"k":' + deep().encode() + b"}")
    assert value != record
    return {
        "data line": (3, b"\n".join([header, record, deep().encode(), b""])),
        "value": (2, b"\n".join([header, value, b""])),
        "header": (1, b"\n".join([deep().encode(), record, b""])),
    }


SESSION = {
    "type": "session", "org_id": "o", "id": "s", "user_id": "u", "app_name": "a", "title": "",
    "state": {}, "parent_id": None, "created_at": "2025-01-02T03:04:05.000006Z",
    "updated_at": "2025-01-02T03:04:05.000006Z", "message_count": 0, "token_total": 0,
    "event_seq": 0, "version": 1,
}  # fmt: skip


@pytest.mark.parametrize("where", ["data line", "value", "header"])
async def test_deeply_nested_json_is_the_line_error(engine: AsyncEngine, where: str) -> None:
    """JSON nested 100,000 levels deep, as a whole line, inside a value or as the header,
    is an ImportLineError naming its line (not a RecursionError), and nothing is written."""
    store = SQLStore(engine)
    line, data = deep_inputs(dumps(SESSION).encode())[where]
    with pytest.raises(ImportLineError) as caught:
        await import_jsonl(store, io.BytesIO(data))
    assert caught.value.line == line
    assert str(caught.value).startswith(f"line {line}: ")
    assert await tables_empty(engine)


@pytest.mark.parametrize("where", ["data line", "value", "header"])
async def test_the_command_says_deeply_nested_json_in_one_line(
    engine: AsyncEngine,
    backend_url: str,
    tmp_path: Path,
    where: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    line, data = deep_inputs(dumps(SESSION).encode())[where]
    source = tmp_path / "deep.jsonl"
    source.write_bytes(data)
    argv = ["--url", backend_url, "import", "-i", str(source)]
    # The command runs its own event loop: in a thread of its own, off this test's loop.
    assert await asyncio.to_thread(main, argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"durable-sessions: error: line {line}: ")
    assert err.count("\n") == 1, err
    assert await tables_empty(engine)
