"""Pages of a listing: one statement, a range of an index from the cursor on (never an
offset), ties broken by id, and cursors checked before any statement runs."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import (
    Event,
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    Manager,
    Page,
    Session,
    SQLStore,
    Store,
    new_id,
)
from durable_sessions.model import utcnow
from durable_sessions.sql.schema import sessions
from support.sql import (
    STORE_SQL_BACKENDS,
    index_scans,
    mysql_plan,
    pg_plan,
    sqlite_plan,
    statements,
    the_data_statement,
)

N = 3_000


async def _many_sessions(engine: AsyncEngine, n: int = N) -> None:
    """``n`` sessions of org "org" (every third of user "alice"), one a millisecond."""
    start = utcnow() - timedelta(days=1)
    rows = [
        {
            "org_id": "org", "id": f"s{i:05d}", "user_id": "alice" if i % 3 == 0 else "bob",
            "app_name": "app", "title": "", "state": {}, "parent_id": None,
            "created_at": start, "updated_at": start + timedelta(milliseconds=i),
            "message_count": 0, "token_total": 0, "event_seq": 0, "version": 1,
            "incarnation": "",
        }
        for i in range(n)
    ]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(sessions.insert(), rows)
        if engine.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE ds_sessions")
        elif engine.dialect.name in ("mysql", "mariadb"):
            await conn.exec_driver_sql("ANALYZE TABLE ds_sessions")


async def _walk(store: Store, filter: Filter) -> list[Page]:
    pages = [await store.list_page(filter)]
    while pages[-1].next_cursor is not None:
        pages.append(await store.list_page(filter, cursor=pages[-1].next_cursor))
    return pages


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
@pytest.mark.parametrize(
    ("user", "index"),
    [(None, "ix_ds_sessions_org_updated"), ("alice", "ix_ds_sessions_user_org_updated")],
)
async def test_a_deep_page_is_one_index_range_that_reads_only_its_rows(
    backend: str, engine: AsyncEngine, user: str | None, index: str
) -> None:
    await _many_sessions(engine)
    store = SQLStore(engine)
    filter = Filter("org", user_id=user, limit=20)
    page = await store.list_page(filter)
    for _ in range(30):  # 30 pages deep
        page = await store.list_page(filter, cursor=page.next_cursor)
    with statements(engine) as seen:
        deep = await store.list_page(filter, cursor=page.next_cursor)
    assert len(deep.sessions) == 20
    sql, params = the_data_statement(seen)
    # SQLAlchemy renders SQLite's LIMIT with "OFFSET ?", bound to 0: never a real offset.
    assert "OFFSET" not in sql.upper() or (sql.upper().endswith("OFFSET ?") and params[-1] == 0)
    if backend == "postgres":
        nodes = await pg_plan(engine, sql, params, analyze=True)
        scans = index_scans(nodes)
        assert scans, nodes
        assert scans[0]["Index Name"] == index
        assert scans[0]["Scan Direction"] == "Backward"
        assert scans[0]["Actual Rows"] <= 21  # the page and one more: is there a next?
        assert "updated_at" in scans[0].get("Index Cond", ""), scans[0]
        assert not [n for n in nodes if n["Node Type"] in ("Sort", "Seq Scan")]
    elif backend == "mysql":
        (read,) = await mysql_plan(engine, sql, params)
        assert (read["table"], read["key"]) == ("ds_sessions", index), str(read)
        assert "filesort" not in (read["Extra"] or ""), read
        # The organisation's listing is a range from the position. One user's, MariaDB
        # 10.11 reads along the user's entry of the index (ref), newest first, up to the
        # position: not checked here.
        if user is None:
            assert read["type"] == "range", str(read)
    else:
        details = await sqlite_plan(engine, sql, params)
        assert f"USING INDEX {index}" in details, details
        assert "(updated_at,id)<(?,?)" in details.replace(" ", ""), details
        assert "TEMP B-TREE" not in details, details


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_walking_every_page_returns_list_once_including_ties(
    backend: str, engine: AsyncEngine
) -> None:
    await _many_sessions(engine, 250)
    tie = datetime(2030, 1, 1, tzinfo=timezone.utc)
    async with engine.begin() as conn:  # 40 sessions updated in the same microsecond
        await conn.execute(update(sessions).where(sessions.c.id < "s00040").values(updated_at=tie))
    store = SQLStore(engine)
    for filter in (Filter("org", limit=7), Filter("org", user_id="alice", limit=6)):
        walked = [s.id for page in await _walk(store, filter) for s in page.sessions]
        listed = [s.id for s in await store.list(Filter(filter.org_id, user_id=filter.user_id))]
        assert walked == listed
        assert len(set(walked)) == len(walked)


def _forged(payload: Any) -> str:
    """A cursor with a valid checksum around any payload: checked field by field still."""
    raw = json.dumps(payload).encode()
    check = hashlib.sha256(b"durable-sessions page cursor\0" + raw).digest()[:8]
    return "P" + base64.urlsafe_b64encode(check + raw).decode().rstrip("=")


async def test_a_well_formed_cursor_with_wrong_fields_is_refused() -> None:
    store = InMemoryStore()
    filter = Filter("org", limit=1)
    listing = hashlib.sha256(json.dumps(["org", None, None, None]).encode()).hexdigest()[:16]
    assert (await store.list_page(filter, cursor=_forged(["p1", 0, "x", listing]))).sessions == []
    for payload in (
        ["p2", 0, "x", listing], ["p1", "0", "x", listing], ["p1", True, "x", listing],
        ["p1", 0.5, "x", listing], ["p1", 10**30, "x", listing], ["p1", 0, 7, listing],
        ["p1", 0, "", listing], ["p1", 0, "x" * 256, listing], ["p1", 0, "x\0", listing],
        ["p1", 0, "x", 1], ["p1", 0, "x"], {"p1": 0}, "p1", None,
    ):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match="not one this store made"):
            await store.list_page(filter, cursor=_forged(payload))
    with pytest.raises(InvalidArgumentError, match="another listing"):
        await store.list_page(filter, cursor=_forged(["p1", 0, "x", "0" * 16]))
    with pytest.raises(InvalidArgumentError, match="must be a Filter"):
        await store.list_page("org")  # type: ignore[arg-type]


async def test_a_cursor_never_starts_with_a_dash() -> None:
    """A cursor goes on command lines (`list --cursor C`): it starts with a letter, where
    base64url alone would start with "-" once in 64 cursors and read as an option."""
    store = InMemoryStore()
    for _ in range(300):
        await store.create(Session(id=new_id(), org_id="org", user_id="u"))
    cursors = [page.next_cursor for page in await _walk(store, Filter("org", limit=1))][:-1]
    assert len(cursors) == 299
    assert all(c is not None and c[0] == "P" for c in cursors)


async def test_the_page_size_and_with_state_may_change_from_page_to_page(store: Store) -> None:
    """README: "The page size and `with_state` may change from page to page". One walk per
    listing, each page asking for another size and with or without state: every session
    comes exactly once, in list's order; each page holds the size it asked for (but the
    last), and its sessions carry their whole state (as ``get`` reads it) exactly on the
    pages that asked for it."""
    manager = Manager(store, app_name="app")
    for n in range(23):
        await manager.create(
            "org", "alice" if n % 2 else "bob", state={"n": n, "user:u": n % 2, "app:a": "all"}
        )
    await manager.create("other-org", "alice", state={"n": -1})
    plan = [(1, True), (3, False), (2, True), (5, False), (4, True), (0, False)]
    for listing in (Filter("org"), Filter("org", user_id="alice")):
        expected = [s.id for s in await manager.list(listing)]
        assert len(expected) == (23 if listing.user_id is None else 11)
        walked: list[str] = []
        cursor = None
        step = 0
        while True:
            limit, with_state = plan[step % len(plan)]
            filter = replace(listing, limit=limit, with_state=with_state)
            page = await manager.list_page(filter, cursor=cursor)
            walked += [s.id for s in page.sessions]
            assert len(page.sessions) <= (limit or 100)
            if page.next_cursor is not None:
                assert len(page.sessions) == (limit or 100)
            for session in page.sessions:
                stored = (await store.get("org", session.id)).state
                assert stored["n"] >= 0
                assert session.state == (stored if with_state else {}), (step, with_state)
            step += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert walked == expected
        assert step >= 4  # the walk went through both kinds of page, back and forth


async def test_a_write_with_an_earlier_time_never_moves_a_session_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write takes its time before it waits (for a pooled connection, a row lock,
    SQLite's write lock); one that waited may carry a time earlier than a write committed
    meanwhile. Every write then leaves ``updated_at`` where it is: the session neither goes
    back in ``list`` nor comes twice in a walk of its pages."""
    manager = Manager(store, app_name="app")
    made = [await manager.create("org", "alice", id=name) for name in ("a", "b", "c")]
    first = await manager.list_page(Filter("org", limit=1))
    assert [s.id for s in first.sessions] == ["c"]
    newest = (await manager.get("org", "c")).updated_at

    def earlier() -> datetime:
        return newest - timedelta(hours=1)

    for module in ("durable_sessions.memory", "durable_sessions.sql.store"):
        monkeypatch.setattr(f"{module}.utcnow", earlier, raising=False)
    c = await manager.get("org", "c")
    c.set("k", 1)
    await manager.save(c)
    await store.touch("org", "c", messages=1)
    await store.append_event("org", "c", Event("user", content="x"))
    await store.append_events("org", "c", [Event("user", content="y"), Event("u")])
    await store.truncate_events("org", "c", after_seq=2)
    await store.pop_event("org", "c")
    monkeypatch.undo()

    got = await manager.get("org", "c")
    assert (got.version, got.updated_at) == (7, newest)
    assert [s.id for s in await manager.list(Filter("org"))] == ["c", "b", "a"]
    rest = await manager.list_page(Filter("org", limit=10), cursor=first.next_cursor)
    assert [s.id for s in rest.sessions] == ["b", "a"]
    assert made[0].updated_at < made[1].updated_at < newest
