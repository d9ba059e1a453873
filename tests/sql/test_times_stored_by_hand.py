"""Times written past every check, straight in SQL (Postgres's ``infinity`` and
``-infinity``, SQLite's year 1): every read of the session still works and gives
timezone-aware UTC, the ends of the range as asyncpg reads them in a plain column."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from durable_sessions import Event, Filter, Manager, SQLStore
from durable_sessions.prepare import event_from_array
from support.sql import PG_DISTRIBUTED, SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", [*SQL_BACKENDS, PG_DISTRIBUTED])

LAST = datetime.max.replace(tzinfo=timezone.utc)
FIRST = datetime.min.replace(tzinfo=timezone.utc)


async def poison(store: SQLStore) -> tuple[datetime, datetime]:
    """Sessions a, b and c of two events each; then b's second event dated infinity and
    c's update time and b's creation time minus infinity (on SQLite, the year 1 for all
    three). Return what the late and the early time read as."""
    manager = Manager(store, app_name="app")
    for sid in ("a", "b", "c"):
        session = await manager.create("o", "u", id=sid, state={"user:k": 1})
        for n in range(2):
            await manager.append_event(session, Event("u", content=f"{sid}{n}"))
    pg = store.engine.dialect.name == "postgresql"
    late, early = ("'infinity'", "'-infinity'") if pg else ("'0001-01-01 00:00:00.000000'",) * 2
    async with store.engine.begin() as conn:
        await conn.exec_driver_sql(
            f"UPDATE ds_events SET timestamp = {late} WHERE session_id = 'b' AND seq = 2"
        )
        await conn.exec_driver_sql(f"UPDATE ds_sessions SET created_at = {early} WHERE id = 'b'")
        await conn.exec_driver_sql(f"UPDATE ds_sessions SET updated_at = {early} WHERE id = 'c'")
    return (LAST if pg else FIRST), FIRST


def aware(moment: datetime) -> bool:
    return moment.utcoffset() is not None and moment.tzinfo == timezone.utc


async def test_every_read_of_a_session_holding_such_a_time_works(store: SQLStore) -> None:
    late, early = await poison(store)

    events = await store.list_events("o", "b")
    assert [e.timestamp for e in events][1] == late
    assert all(aware(e.timestamp) for e in events)
    newest = await store.list_events("o", "b", limit=1)
    assert [e.seq for e in newest] == [2]
    assert [e.timestamp for e in newest] == [late]

    whole = await store.get_with_events("o", "b")
    assert [e.content for e in whole.events] == ["b0", "b1"]
    assert whole.events[1].timestamp == late
    assert whole.created_at == early
    assert all(aware(e.timestamp) for e in whole.events)
    assert aware(whole.created_at)
    assert aware(whole.updated_at)

    session, text = await store.get_with_events_json("o", "b")
    assert [event_from_array(item).timestamp for item in json.loads(text)] == [
        e.timestamp for e in events
    ]
    assert session.created_at == early

    c = await store.get("o", "c")
    assert c.updated_at == early
    assert aware(c.updated_at)
    listed = await store.list(Filter("o"))
    assert [s.id for s in listed] == ["b", "a", "c"]
    assert all(aware(s.updated_at) and aware(s.created_at) for s in listed)
    page = await store.list_page(Filter("o", limit=2))
    assert [s.id for s in page.sessions] == ["b", "a"]
    assert page.next_cursor is not None
    rest = await store.list_page(Filter("o", limit=2), cursor=page.next_cursor)
    assert [s.id for s in rest.sessions] == ["c"]
    assert rest.sessions[0].updated_at == early


async def test_search_fork_and_truncation_of_such_events_work(store: SQLStore) -> None:
    late, _ = await poison(store)
    (hit,) = await store.search("o", "b1")
    assert (hit.session_id, hit.event.timestamp) == ("b", late)
    child = await store.fork("o", "b", new_session_id="b2", with_events=True)
    assert [e.timestamp for e in await store.list_events("o", child.id)][1] == late
    removed = await store.truncate_events("o", "b", after_seq=1)
    assert [(e.seq, e.timestamp) for e in removed] == [(2, late)]
    popped = await store.pop_event("o", "b2")
    assert popped is not None
    assert popped.timestamp == late
