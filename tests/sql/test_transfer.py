"""Export and import as a library (``durable_sessions.sql.transfer``), on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, Memory, Session, SQLStore
from durable_sessions.cli import main
from durable_sessions.sql import transfer
from durable_sessions.sql.schema import app_state, sessions, user_state
from durable_sessions.sql.transfer import (
    ImportLineError,
    count_sessions,
    dumps,
    export_jsonl,
    import_jsonl,
    page_queries,
)
from durable_sessions.state import MAX_ID_BYTES, MAX_KEY_BYTES
from support.memory import run_measured
from support.sql import STORE_SQL_BACKENDS, mysql_plan, snapshot, statements

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)


async def fill(store: SQLStore) -> None:
    manager = Manager(store, app_name="app")
    for org in ("o1", "o2"):
        session = await manager.create(org, "u", id="s", state={"k": 1, "user:u": [1.0]})
        await manager.append_event(session, Event("user", {"text": "hi"}, tokens=3))
        await manager.append_event(session, Event("bot", {"text": "yo"}, state_delta={"app:a": 2}))
        await manager.fork(org, "s", with_events=True)
        await store.add_memories(
            org,
            "app",
            "u",
            [
                Memory("the hotel is in Porto", id="m1", session_id="s", seq=2),
                Memory(
                    "私の名前は太郎です",
                    id="m2",
                    content={"parts": [{"text": "私の名前は太郎です"}]},
                    author="user",
                    metadata={"source": "intake", "n": 1.0},
                ),
            ],
        )


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
    assert await source.search_memories("o1", "app", "u", "porto") == []
    counts = await import_jsonl(source, io.BytesIO(data))
    assert (counts.sessions, counts.events, counts.memories) == (4, 8, 4)
    assert await export(source) == data
    # Imported memories are searchable (their terms computed again), per tenant.
    (hotel,) = await source.search_memories("o1", "app", "u", "hotel")
    assert (hotel.id, hotel.session_id, hotel.seq) == ("m1", "s", 2)
    (taro,) = await source.search_memories("o2", "app", "u", "太郎")
    assert taro.metadata == {"source": "intake", "n": 1.0}
    assert taro.content == {"parts": [{"text": "私の名前は太郎です"}]}
    restored = await source.get_with_events("o1", "s")
    assert restored.state == {"k": 1, "user:u": [1.0], "app:a": 2}
    assert [e.content for e in restored.events] == [{"text": "hi"}, {"text": "yo"}]
    # An imported session is a new life of its id: it gets an incarnation of its own.
    assert restored.incarnation
    # Imported events are in the search index (the same triggers as appends), per tenant.
    hits = [(h.session_id, h.event.seq) for h in await source.search("o1", "yo")]
    assert sorted(hits) == sorted((s.id, 2) for s in await manager.list(Filter("o1")))
    assert len(hits) == 2  # the session and its fork
    assert [h.session_id for h in await source.search("o2", "hi")] != []
    assert await source.search("o3", "hi") == []


async def test_a_bad_line_names_itself_and_writes_nothing(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    await fill(store)
    data = (await export(store)).splitlines(keepends=True)
    async with engine.begin() as conn:
        for table in (
            "ds_events", "ds_sessions", "ds_user_state", "ds_app_state", "ds_memories",
            "ds_memory_terms",
        ):  # fmt: skip
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    broken = [*data[:3], b'{"type": "session", "id": 1}\n', *data[3:]]
    with pytest.raises(ImportLineError, match="line 4"):
        await import_jsonl(store, io.BytesIO(b"".join(broken)))
    assert await count_sessions(store) == 0
    last = len(data)
    memory = json.loads(data[-1])
    assert memory["type"] == "memory"
    for field, value, reason in [
        ("text", None, "must be a string"),
        ("text", "nul \u0000", "NUL"),
        ("metadata", [], "must be a JSON object"),
        ("seq", -1, "non-negative"),
        ("author", "", None),  # an empty author is allowed, as an event's
    ]:
        bad = dumps({**memory, field: value}).encode() + b"\n"
        if reason is None:
            await import_jsonl(store, io.BytesIO(b"".join([*data[:-1], bad])))
            for org in ("o1", "o2"):  # empty again
                await Manager(store).delete_user(org, "u")
                for session in await Manager(store).list(Filter(org)):
                    await Manager(store).delete(org, session.id)
            async with engine.begin() as conn:
                await conn.exec_driver_sql("DELETE FROM ds_app_state")
            continue
        with pytest.raises(ImportLineError, match=f"line {last}: memory field '{field}'.*{reason}"):
            await import_jsonl(store, io.BytesIO(b"".join([*data[:-1], bad])))
        assert await count_sessions(store) == 0
        assert await store.search_memories("o1", "app", "u", "porto") == []
    twice = [*data, data[-1]]
    with pytest.raises(ImportLineError, match=f"line {last + 1}: memory 'm2'.*already exists"):
        await import_jsonl(store, io.BytesIO(b"".join(twice)))


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


# -- the keyset walk reads each page from the primary key ----------------------------------


def bulk_export(sessions: int, shared: int) -> bytes:
    """An export of ``sessions`` sessions in two organisations and ``shared`` rows of each
    shared kind, built as text (quicker than the API for thousands of rows)."""
    stamp = "2025-01-02T03:04:05.000006Z"
    lines = [dumps({"format": "durable-sessions", "type": "header", "version": 1})]
    for n in range(sessions):
        lines.append(dumps({**SESSION, "org_id": f"o{n % 2}", "id": f"s{n:06d}",
                            "created_at": stamp, "updated_at": stamp}))  # fmt: skip
    for n in range(shared):
        value = {"org_id": f"o{n % 2}", "app_name": "a", "value": n, "updated_at": stamp}
        lines.append(dumps({**value, "type": "user_state", "user_id": f"u{n}", "key": "k"}))
        lines.append(dumps({**value, "type": "app_state", "key": f"k{n}"}))
    return "\n".join([*lines, ""]).encode()


async def test_export_pages_read_the_primary_key_in_order(engine: AsyncEngine) -> None:
    """Each page query (the first, and the one after a key) of sessions, user: and app:
    state is a range read of the primary key, in its order: no sort of the table (which
    made a Postgres export superlinear), on Postgres as on SQLite."""
    store = SQLStore(engine)
    await import_jsonl(store, io.BytesIO(bulk_export(5000, 5000)))
    pg = engine.dialect.name == "postgresql"
    mysql = engine.dialect.name in ("mysql", "mariadb")
    async with engine.connect() as conn:
        if mysql:
            await conn.exec_driver_sql("ANALYZE TABLE ds_sessions, ds_user_state, ds_app_state")
        else:
            await conn.exec_driver_sql("ANALYZE")
        for table, after in (
            (sessions, ("o0", "s002500")),
            (user_state, ("o0", "a", "u2500", "k")),
            (app_state, ("o0", "a", "k2500")),
        ):
            first, following = page_queries(table, engine.dialect.name)
            names = [f"after_{col.name}" for col in table.primary_key.columns]
            for query in (first, following.params(dict(zip(names, after, strict=True)))):
                if mysql:
                    compiled = query.compile(dialect=conn.dialect)
                    params = tuple(compiled.construct_params()[n] for n in compiled.positiontup)
                    (read,) = await mysql_plan(engine, str(compiled), params)
                    assert (read["table"], read["key"]) == (table.name, "PRIMARY"), read
                    assert "filesort" not in (read["Extra"] or ""), read
                    continue
                sql = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
                explain = "EXPLAIN " if pg else "EXPLAIN QUERY PLAN "
                plan = "\n".join(
                    str(row[-1]) for row in await conn.exec_driver_sql(explain + str(sql))
                )
                if pg:
                    assert f"Index Scan using pk_{table.name} on {table.name}" in plan, plan
                    assert "Sort" not in plan, plan
                else:
                    assert f"USING INDEX sqlite_autoindex_{table.name}_1" in plan, plan
                    assert "TEMP B-TREE" not in plan, plan


# -- large values: read apart, in bounded batches; memory flat whatever their size --------


async def fill_large(store: SQLStore) -> None:
    """Titles, state, events and shared values of every size around small limits."""
    manager = Manager(store, app_name="app")
    await fill(store)
    for n, size in enumerate((0, 5, 40, 300)):
        text = "é" * size
        session = await manager.create(
            "o3", "u", id=f"s{n}", title=text, state={"k": text, "user:u": text, "app:a": text}
        )
        await manager.append_event(session, Event("user", None, state_delta={"d": text}))
        for m in range(n + 2):
            await manager.append_event(session, Event("bot", {"m": m, "text": text * m}))


@pytest.mark.parametrize(("inline", "batch"), [(8, 64), (8, 1), (8, 10**9), (120, 700)])
async def test_large_values_read_apart_give_the_same_bytes(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, inline: int, batch: int
) -> None:
    """Values over INLINE_BYTES are read apart, in batches of BATCH_BYTES (one value alone
    when larger), within pages of 3 rows and chunks of 2 events: the same bytes."""
    store = SQLStore(engine)
    await fill_large(store)
    expected = await export(store)
    monkeypatch.setattr(transfer, "INLINE_BYTES", inline)
    monkeypatch.setattr(transfer, "BATCH_BYTES", batch)
    monkeypatch.setattr(transfer, "PAGE_SIZE", 3)
    monkeypatch.setattr(transfer, "EVENT_CHUNK", 2)
    with statements(engine) as seen:
        assert await export(store) == expected
    # Large values were indeed read apart: more statements than pages and chunks alone.
    assert sum("IN (" in sql and "CAST" in sql for sql, _ in seen) > 10


MEASURE = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions import SQLStore
from durable_sessions.sql.transfer import count_sessions, export_jsonl
from support.memory import peak_kib, restart_peak

class Sink:
    def write(self, data):
        return len(data)

async def main():
    engine = create_async_engine(sys.argv[1])
    store = SQLStore(engine)
    await count_sessions(store)  # every module loaded, a connection open
    before = restart_peak()
    counts = await export_jsonl(store, Sink())
    await engine.dispose()
    print(counts.events, before, peak_kib())

asyncio.run(main())
"""

CEILING_MIB = 64
"""What the export may add to its memory over 300 events of 1 MiB (it added 300+ before)."""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
async def test_export_memory_stays_flat_with_300_events_of_1_mib(
    engine: AsyncEngine, backend_url: str
) -> None:
    """An export of 300 events of 1 MiB each, measured in a child process (VmHWM):
    its peak is under CEILING_MIB over its memory before exporting."""
    store = SQLStore(engine)
    session = await Manager(store).create("o", "u")
    big = "x" * ((1 << 20) - 2)  # 1 MiB as JSON, the default max_value_bytes
    for _ in range(30):
        await store.append_events("o", session.id, [Event("bot", big) for _ in range(10)])
    out = await asyncio.to_thread(run_measured, MEASURE, backend_url)
    events, before, peak = map(int, out.split())
    assert events == 300
    growth_mib = (peak - before) / 1024
    assert growth_mib < CEILING_MIB, f"peak {peak / 1024:.0f} MiB, {growth_mib:.0f} MiB more"


# -- ids and keys at their byte limits, and one byte over ----------------------------------


def wide(size: int, low: int = 0x1F300, high: int = 0x1F64F, seed: int = 0) -> str:
    """Random characters of one UTF-8 width (4 bytes by default), ASCII-padded to ``size``."""
    rng = random.Random(f"{seed}:{size}")
    width = len(chr(low).encode())
    chars = "".join(chr(rng.randint(low, high)) for _ in range(size // width))
    return chars + "p" * (size % width)


def cjk_key(prefix: str, seed: int = 0) -> str:
    """A key of exactly MAX_KEY_BYTES: the prefix, then 3-byte characters."""
    return prefix + wide(MAX_KEY_BYTES - len(prefix), 0x4E00, 0x9FFF, seed)


async def test_the_widest_ids_and_keys_from_sqlite_import_and_export_the_same_bytes(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """A SQLite database holding 512-byte ids and 1,024-byte keys in every scope exports;
    the export imports into SQLite and Postgres and exports again byte for byte."""
    source_engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'widest.db'}")
    try:
        source = SQLStore(source_engine)
        await source.migrate()
        ids = [wide(MAX_ID_BYTES, seed=n) for n in range(8)]
        state = {cjk_key(prefix, n): n for n in range(2) for prefix in ("", "user:", "app:")}
        await source.create(
            Session(id=ids[0], org_id=ids[1], user_id=ids[2], app_name=ids[3], state=state)
        )
        event = Event(ids[4], {"k": 1}, invocation_id=ids[5], id=ids[6], state_delta=state)
        await source.append_event(ids[1], ids[0], event)
        await source.fork(ids[1], ids[0], new_session_id=ids[7], with_events=True)
        data = await export(source)
    finally:
        await source_engine.dispose()
    store = SQLStore(engine)
    counts = await import_jsonl(store, io.BytesIO(data))
    assert (counts.sessions, counts.events, counts.user_state, counts.app_state) == (2, 2, 2, 2)
    assert await export(store) == data


def over(kind: str, field: str) -> tuple[dict[str, Any], str]:
    """A record whose ``field`` is one byte over its limit, and the reason given for it."""
    stamp = "2025-01-02T03:04:05.000006Z"
    if field == "key":
        prefix = "user:" if kind == "user_state" else "app:"
        value = cjk_key(prefix)[len(prefix) :] + "x"
        record = {"type": kind, "org_id": "o", "app_name": "a", "key": value, "value": 1,
                  "updated_at": stamp}  # fmt: skip
        if kind == "user_state":
            record["user_id"] = "u"
        return record, f"the key is {MAX_KEY_BYTES + 1} bytes as UTF-8"
    value = wide(MAX_ID_BYTES) + "x"
    if field == "state":
        key = cjk_key("") + "x"
        return {**SESSION, "state": {key: 1}}, f"the key is {MAX_KEY_BYTES + 1} bytes as UTF-8"
    return {**SESSION, field: value}, f"{field} is {MAX_ID_BYTES + 1} bytes as UTF-8"


@pytest.mark.parametrize(
    ("kind", "field"),
    [("session", "org_id"), ("session", "id"), ("session", "user_id"), ("session", "app_name"),
     ("session", "parent_id"), ("session", "state"), ("user_state", "key"),
     ("app_state", "key")],
)  # fmt: skip
async def test_import_refuses_an_id_or_key_one_byte_over_naming_the_line(
    engine: AsyncEngine, kind: str, field: str
) -> None:
    """The import applies the stores' byte limits: the line's error, and nothing written."""
    record, reason = over(kind, field)
    header = dumps({"format": "durable-sessions", "type": "header", "version": 1})
    good = dumps({**SESSION, "id": "first"})
    data = "\n".join([header, good, dumps(record), ""]).encode()
    with pytest.raises(ImportLineError) as caught:
        await import_jsonl(SQLStore(engine), io.BytesIO(data))
    assert caught.value.line == 3
    assert f"line 3: {kind} field {field!r}: " in str(caught.value)
    assert reason in str(caught.value)
    assert await tables_empty(engine)
