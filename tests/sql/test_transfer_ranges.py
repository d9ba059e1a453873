"""Export and import at the edges: timestamps past the stored range, long titles, and a row
no export line can hold (Postgres's infinity), which stops nothing else."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.prepare import MAX_TITLE_BYTES
from durable_sessions.sql.transfer import (
    ExportIncompleteError,
    ImportLineError,
    count_sessions,
    dumps,
    export_jsonl,
    import_jsonl,
)
from support.sql import STORE_SQL_BACKENDS, snapshot

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)

HEADER = dumps({"format": "durable-sessions", "type": "header", "version": 1})
STAMP = "2025-01-02T03:04:05.000006Z"
SESSION = {
    "type": "session", "org_id": "o", "id": "s", "user_id": "u", "app_name": "a", "title": "",
    "state": {}, "parent_id": None, "created_at": STAMP, "updated_at": STAMP,
    "message_count": 1, "token_total": 0, "event_seq": 1, "version": 1,
}  # fmt: skip
EVENT = {
    "type": "event", "org_id": "o", "session_id": "s", "seq": 1, "id": "e1", "author": "u",
    "invocation_id": "", "content": "hi", "state_delta": {}, "tokens": 0, "timestamp": STAMP,
}  # fmt: skip


def jsonl(*records: dict[str, object]) -> bytes:
    return "\n".join([HEADER, *(dumps(r) for r in records), ""]).encode()


async def empty(engine: AsyncEngine) -> bool:
    return all(not rows for rows in (await snapshot(engine)).values())


@pytest.mark.parametrize(
    ("kind", "field"),
    [("session", "created_at"), ("session", "updated_at"), ("event", "timestamp")],
)
@pytest.mark.parametrize(
    "stamp",
    [
        "0001-01-01T00:00:00.000000Z",  # datetime.min: Postgres's -infinity
        "9999-12-31T23:59:59.999999Z",  # datetime.max: Postgres's infinity
        "0001-01-01T23:59:59.999999Z",
        "9999-12-31T00:00:00.000000Z",
        "0001-01-02T10:00:00+14:00",
    ],
)
async def test_import_refuses_timestamps_past_the_stored_range(
    engine: AsyncEngine, kind: str, field: str, stamp: str
) -> None:
    session, event = dict(SESSION), dict(EVENT)
    (session if kind == "session" else event)[field] = stamp
    with pytest.raises(ImportLineError) as caught:
        await import_jsonl(SQLStore(engine), io.BytesIO(jsonl(session, event)))
    line = 2 if kind == "session" else 3
    assert str(caught.value).startswith(f"line {line}: {kind} field {field!r}: ")
    assert "out of range" in str(caught.value)
    assert await empty(engine)


async def test_import_takes_the_ends_of_the_range_and_exports_them_again(
    engine: AsyncEngine,
) -> None:
    store = SQLStore(engine)
    session = {**SESSION, "created_at": "0001-01-02T00:00:00.000000Z"}
    session["updated_at"] = "9999-12-30T23:59:59.999999Z"
    event = {**EVENT, "timestamp": "0001-01-02T00:00:00.000000Z"}
    data = jsonl(session, event)
    await import_jsonl(store, io.BytesIO(data))
    out = io.BytesIO()
    await export_jsonl(store, out)
    assert out.getvalue() == data
    assert [e.timestamp.year for e in await store.list_events("o", "s")] == [1]
    assert (await store.get_with_events("o", "s")).events[0].timestamp.year == 1


async def test_import_cuts_a_long_title_at_a_character_boundary(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    title = "a" + "é" * 2000  # the 1,024th byte is the first of an "é"
    counts = await import_jsonl(store, io.BytesIO(jsonl({**SESSION, "title": title}, EVENT)))
    assert (counts.sessions, counts.titles_cut) == (1, 1)
    stored = (await store.get("o", "s")).title
    assert stored == "a" + "é" * 511
    assert len(stored.encode("utf-8")) == MAX_TITLE_BYTES - 1


async def test_the_import_command_says_how_many_titles_it_cut(
    engine: AsyncEngine, backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fits = {**SESSION, "id": "fits", "title": "é" * 512}
    long = {**SESSION, "title": "t" * 5000}
    source = tmp_path / "long-titles.jsonl"
    source.write_bytes(jsonl(fits, long, EVENT))
    argv = ["--url", backend_url, "import", "-i", str(source)]
    assert await asyncio.to_thread(main, argv) == 0
    captured = capsys.readouterr()
    assert captured.out == "Imported 2 sessions, 1 events, 0 user: and 0 app: state rows.\n"
    assert captured.err == "Cut 1 session title longer than the 1,024-byte limit.\n"
    store = SQLStore(engine)
    assert (await store.get("o", "s")).title == "t" * MAX_TITLE_BYTES
    assert (await store.get("o", "fits")).title == "é" * 512


async def poison(engine: AsyncEngine) -> None:
    """Three sessions of two events; then, past every check, written straight in SQL: the
    middle session's second event dated infinity (on SQLite, the year 1, out of range as
    well), and the third session's update time minus infinity (the year 1)."""
    manager = Manager(SQLStore(engine), app_name="app")
    for sid in ("a", "b", "c"):
        session = await manager.create("o", "u", id=sid, state={"user:k": 1})
        for n in range(2):
            await manager.append_event(session, Event("u", content=f"{sid}{n}"))
    pg = engine.dialect.name == "postgresql"
    late, early = ("'infinity'", "'-infinity'") if pg else ("'0001-01-01 00:00:00'",) * 2
    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            f"UPDATE ds_events SET timestamp = {late} WHERE session_id = 'b' AND seq = 2"
        )
        await conn.exec_driver_sql(f"UPDATE ds_sessions SET updated_at = {early} WHERE id = 'c'")


async def test_a_row_that_cannot_be_exported_stops_nothing_else(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    await poison(engine)
    out = io.BytesIO()
    with pytest.raises(ExportIncompleteError) as caught:
        await export_jsonl(store, out)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "export incomplete: event 2 of session 'b' of organisation 'o': its timestamp is "
    )
    assert "(and 1 more rows)" in message
    assert caught.value.rows[1].startswith(
        "session 'c' of organisation 'o' (with its events): its updated_at is "
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    written = [
        (r["type"], r["id"] if r["type"] == "session" else r.get("session_id"), r.get("seq"))
        for r in records
    ]
    assert written == [
        ("header", None, None),
        ("session", "a", None),
        ("event", "a", 1),
        ("event", "a", 2),
        ("session", "b", None),
        ("event", "b", 1),
        ("user_state", None, None),
    ]
    counts = caught.value.counts
    assert (counts.sessions, counts.events, counts.user_state) == (2, 3, 1)

    # What was written imports whole into an empty database.
    async with engine.begin() as conn:
        for table in ("ds_events", "ds_sessions", "ds_user_state", "ds_app_state"):
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    restored = await import_jsonl(store, io.BytesIO(out.getvalue()))
    assert (restored.sessions, restored.events) == (2, 3)
    assert await count_sessions(store) == 2


async def test_the_export_command_keeps_the_rest_and_names_the_row_in_one_line(
    engine: AsyncEngine, backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await poison(engine)
    target = tmp_path / "backup.jsonl"
    argv = ["--url", backend_url, "export", "-o", str(target)]
    # The command runs its own event loop: in a thread of its own, off this test's loop.
    assert await asyncio.to_thread(main, argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith(
        "durable-sessions: error: export incomplete: event 2 of session 'b'"
    )
    assert captured.err.count("\n") == 1, captured.err
    assert "Exported 2 sessions, 3 events" in captured.out
    kinds = [json.loads(line)["type"] for line in target.read_bytes().splitlines()]
    assert kinds.count("session") == 2
    assert kinds.count("event") == 3
