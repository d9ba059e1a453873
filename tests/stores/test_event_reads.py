"""Reading the newest events is one indexed statement that reads no more than it returns."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Manager, SessionService, SQLStore
from durable_sessions.model import utcnow
from durable_sessions.sql.schema import events, sessions
from support.sql import (
    STORE_SQL_BACKENDS,
    data_statements,
    index_scans,
    mysql_plan,
    pg_plan,
    sqlite_plan,
    statements,
    the_data_statement,
)

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)

N = 10_000


async def _long_transcript(engine: AsyncEngine) -> str:
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    start = utcnow() - timedelta(hours=1)
    rows = [
        {
            "org_id": "org",
            "session_id": session.id,
            "seq": i,
            "id": f"e{i}",
            "author": "user",
            "invocation_id": "",
            "content": {"n": i},
            "state_delta": {},
            "tokens": 0,
            "timestamp": start + timedelta(milliseconds=i),
        }
        for i in range(1, N + 1)
    ]
    async with engine.begin() as conn:
        await conn.execute(events.insert(), rows)
        await conn.execute(update(sessions).where(sessions.c.id == session.id).values(event_seq=N))
    return session.id


async def test_recent_events_use_the_index_and_read_only_what_they_return(
    backend: str, engine: AsyncEngine
) -> None:
    session_id = await _long_transcript(engine)
    store = SQLStore(engine)
    await store.list_events("org", session_id, limit=1)  # warm up the connection

    with statements(engine) as seen:
        recent = await store.list_events("org", session_id, limit=20)
    assert [e.seq for e in recent] == list(range(N - 19, N + 1))
    assert [e.content for e in recent] == [{"n": i} for i in range(N - 19, N + 1)]
    sql, params = the_data_statement(seen)
    if backend == "postgres":
        nodes = await pg_plan(engine, sql, params, analyze=True)
        scans = index_scans(nodes)
        assert scans, nodes
        assert scans[0]["Index Name"] == "pk_ds_events"
        assert scans[0]["Scan Direction"] == "Backward"
        assert scans[0]["Actual Rows"] <= 20
        assert not [n for n in nodes if n["Node Type"] in ("Sort", "Seq Scan")]
    elif backend == "mysql":
        (read,) = await mysql_plan(engine, sql, params)
        assert (read["table"], read["key"]) == ("ds_events", "PRIMARY"), read
        assert "filesort" not in (read["Extra"] or ""), read
    else:
        details = await sqlite_plan(engine, sql, params)
        assert "USING PRIMARY KEY" in details or "USING INDEX" in details, details
        assert "TEMP B-TREE" not in details, details


async def test_after_filter_on_a_long_transcript(engine: AsyncEngine) -> None:
    session_id = await _long_transcript(engine)
    store = SQLStore(engine)
    everything = await store.list_events("org", session_id)
    assert len(everything) == N
    cut = everything[-6].timestamp
    later = await store.list_events("org", session_id, after=cut)
    assert [e.seq for e in later] == list(range(N - 4, N + 1))
    assert [e.seq for e in await store.list_events("org", session_id, after=cut, limit=2)] == [
        N - 1,
        N,
    ]


async def test_a_forward_page_is_one_index_range_that_reads_only_its_rows(
    backend: str, engine: AsyncEngine
) -> None:
    session_id = await _long_transcript(engine)
    store = SQLStore(engine)
    await store.list_events("org", session_id, limit=1)  # warm up the connection

    with statements(engine) as seen:
        page = await store.list_events("org", session_id, after_seq=5_000, limit=20)
    assert [e.seq for e in page] == list(range(5_001, 5_021))
    assert [e.content for e in page] == [{"n": i} for i in range(5_001, 5_021)]
    sql, params = the_data_statement(seen)
    if backend == "postgres":
        nodes = await pg_plan(engine, sql, params, analyze=True)
        scans = index_scans(nodes)
        assert scans, nodes
        assert scans[0]["Index Name"] == "pk_ds_events"
        assert scans[0]["Scan Direction"] == "Forward"
        assert "seq >" in scans[0]["Index Cond"], scans[0]
        assert scans[0]["Actual Rows"] <= 20
        assert not [n for n in nodes if n["Node Type"] in ("Sort", "Seq Scan")]
    elif backend == "mysql":
        (read,) = await mysql_plan(engine, sql, params)
        assert (read["table"], read["key"], read["type"]) == ("ds_events", "PRIMARY", "range")
        assert "filesort" not in (read["Extra"] or ""), read
    else:
        details = await sqlite_plan(engine, sql, params)
        assert "seq>?" in details.replace(" ", ""), details
        assert "TEMP B-TREE" not in details, details


@pytest.mark.slow
async def test_a_transcript_past_the_one_statement_limit_loads_whole(
    engine: AsyncEngine, backend: str
) -> None:
    # Postgres builds the one-statement read's transcript as one json text, which cannot
    # pass 1 GB (the largest value it allocates); past it, get_with_events,
    # get_with_events_json and list_event_contents read the events as rows instead, in a
    # second statement, and a truncation returns the events it removed the same way. 21
    # events of 50 MiB (a store without a value limit) pass it; SQLite reads rows anyway
    # and gets a smaller transcript (more events than the reads of the newest two).
    store = SQLStore(engine, max_value_bytes=None)
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "alice")
    # MySQL reads rows too; its events stay within the server's max_allowed_packet.
    count, size = {"postgres": (21, 50 << 20), "mysql": (3, 6 << 20)}.get(backend, (3, 55 << 20))
    big = "x" * size
    for i in range(count):
        await store.append_event("org", session.id, Event("user", {"i": i, "text": big}))
    del big
    seqs = list(range(1, count + 1))
    listed = await store.list_events("org", session.id)
    assert [e.content["i"] for e in listed] == [seq - 1 for seq in seqs]
    del listed
    # The contents read (the OpenAI adapter's get_items) joins them into one text in the
    # database; past 1 GB it reads one row per event instead.
    with statements(engine) as seen:
        contents = await store.list_event_contents("org", session.id)
    if backend == "postgres":  # the one-text read failed, the rows read came second
        assert len(data_statements(seen)) == 2, data_statements(seen)
    assert [(c["i"], len(c["text"])) for c in contents] == [(seq - 1, size) for seq in seqs]
    del contents
    newest = await store.list_event_contents("org", session.id, limit=2)
    assert [c["i"] for c in newest] == [count - 2, count - 1]
    del newest
    with statements(engine) as seen:
        got = await store.get_with_events("org", session.id)
    if backend == "postgres":  # the one-statement read failed, the rows read came second
        assert len(data_statements(seen)) >= 2, data_statements(seen)
    assert [e.seq for e in got.events] == seqs
    assert all(len(e.content["text"]) == size for e in got.events)
    assert got.message_count == count
    del got
    session_json, text = await store.get_with_events_json("org", session.id)
    assert session_json.message_count == count
    items = json.loads(text)
    del text
    assert [(item[0], item[4]["i"], len(item[4]["text"])) for item in items] == [
        (seq, seq - 1, size) for seq in seqs
    ]
    del items
    newest = await SessionService(store, org_id="org").get(
        app_name="app", user_id="alice", session_id=session.id, num_recent_events=2
    )
    assert newest is not None
    assert [e.seq for e in newest.events] == seqs[-2:]
    del newest
    # Truncating all of it returns every removed event, as every store does: on Postgres
    # the one statement fails (its json text past 1 GB) and the steps that read rows follow.
    with statements(engine) as seen:
        removed = await store.truncate_events("org", session.id, after_seq=0)
    if backend == "postgres":
        assert len(data_statements(seen)) >= 3, data_statements(seen)
    assert [(e.seq, e.content["i"], len(e.content["text"])) for e in removed] == [
        (seq, seq - 1, size) for seq in seqs
    ]
    del removed
    after = await store.get("org", session.id)
    assert (after.message_count, after.version) == (0, session.version + count + 1)
    assert await store.list_events("org", session.id) == []
    added = await store.append_event("org", session.id, Event("user", {"i": "next"}))
    assert added.seq == 1
