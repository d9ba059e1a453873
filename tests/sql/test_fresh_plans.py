"""On tables never analysed, every hot path is an index lookup on its own index (#12, 6).

A new deployment fills its tables before anything analyses them, and Postgres keeps a
generic plan of each prepared statement per connection (and one for the foreign-key check
of each event insert) from its sixth execution on, made with whatever the statistics said
then. Such a plan must already be the right index lookup: here every statement of the hot
paths, run through the public API on a small table that was never analysed, is planned
generically (``plan_cache_mode = force_generic_plan``) and must read ``ds_sessions`` by
the primary key for a lookup by key, by the user index for one user's listing and by the
organisation index for an organisation's: never a scan, never a sort, never another index
(which without statistics ties with the primary key, and keeps reading the whole
organisation once the table has grown). On SQLite, EXPLAIN QUERY PLAN of the same paths.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, Session, SessionService, SQLStore
from support.sql import STORE_SQL_BACKENDS, raw_pg, statements

ORG = "org"
APP = "app"
SESSIONS = 200
TABLES = ("ds_sessions", "ds_events", "ds_user_state", "ds_app_state")
KEY = "pk_ds_sessions"
USER_INDEX = "ix_ds_sessions_user_org_updated"
ORG_INDEX = "ix_ds_sessions_org_updated"
# The index each path must read ds_sessions through; None: it reads no ds_sessions row.
SESSIONS_INDEX: dict[str, str | None] = {
    "create": None,
    "get": KEY,
    "get_recent_events": KEY,
    "save": KEY,
    "touch": KEY,
    "append_event": KEY,
    "list_events": None,
    "list_page_of_a_user": USER_INDEX,
    "list_page_of_an_org": ORG_INDEX,
    "fork": KEY,
    "delete": KEY,
}
# The other tables are read through their primary key (user state: or its org/user index).
OTHER_INDEXES = {
    "ds_events": {"pk_ds_events"},
    "ds_user_state": {"pk_ds_user_state", "ix_ds_user_state_org_user"},
    "ds_app_state": {"pk_ds_app_state"},
}
# Postgres's own statement for the foreign-key check of every event insert (ri_triggers.c),
# run by every append: a lookup by key of ds_sessions, cached per connection like ours.
FK_CHECK = (
    'SELECT 1 FROM ONLY ds_sessions x WHERE "org_id"::pg_catalog.text '
    'OPERATOR(pg_catalog.=) $1::pg_catalog.text AND "id"::pg_catalog.text '
    "OPERATOR(pg_catalog.=) $2::pg_catalog.text FOR KEY SHARE OF x"
)


@pytest.fixture
async def fresh_engine(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[AsyncEngine]:
    """A new migrated database whose tables nothing analyses (autovacuum off for them)."""
    if backend == "sqlite":
        url = str(request.getfixturevalue("migrated_sqlite_url"))
    else:
        url = request.getfixturevalue("fresh_migrated_pg_url")()
    engine = create_async_engine(url)
    if backend == "postgres":
        async with engine.begin() as conn:
            for table in TABLES:
                await conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    yield engine
    await engine.dispose()


def _state(i: int) -> dict[str, Any]:
    return {"k": i, f"user:k{i % 3}": i, f"app:k{i % 3}": i}


async def _hot_paths(engine: AsyncEngine) -> dict[str, list[tuple[str, Any]]]:
    """Fill the tables through the public API, then record each hot path's statements."""
    store = SQLStore(engine)
    manager = Manager(store, app_name=APP)
    service = SessionService(store, org_id=ORG)
    made: list[Session] = []
    for i in range(SESSIONS):
        session = await manager.create(ORG, f"u{i % 7}", state=_state(i))
        await manager.append_event(session, Event("user", {"text": "hello"}, tokens=2))
        made.append(session)
    one, other = made[17], made[42]

    async def save() -> None:
        nonlocal one
        session = await manager.get(ORG, one.id)
        for key, value in _state(7).items():
            session.set(key, value)
        await manager.save(session)
        one = session  # the current copy, for the paths that follow

    async def pages(filter: Filter) -> None:
        page = await manager.list_page(filter)
        await manager.list_page(filter, cursor=page.next_cursor)

    paths = {
        "create": lambda: manager.create(ORG, "u1", state=_state(1)),
        "get": lambda: manager.get(ORG, one.id),
        "get_recent_events": lambda: service.get(
            app_name=APP, user_id=one.user_id, session_id=one.id, num_recent_events=5
        ),
        "save": save,
        "touch": lambda: manager.touch(one, 1, 5, "title"),
        "append_event": lambda: manager.append_event(
            one, Event("model", {"text": "hi"}, state_delta=_state(3), tokens=3)
        ),
        "list_events": lambda: store.list_events(ORG, one.id, limit=5),
        "list_page_of_a_user": lambda: pages(Filter(ORG, user_id="u3", limit=5)),
        "list_page_of_an_org": lambda: pages(Filter(ORG, limit=5)),
        "fork": lambda: manager.fork(ORG, one.id),
        "delete": lambda: manager.delete(ORG, other.id),
    }
    assert set(paths) == set(SESSIONS_INDEX)
    recorded = {}
    for name, path in paths.items():
        with statements(engine) as seen:
            await path()
        recorded[name] = [
            (sql, params)
            for sql, params in seen
            if not sql.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA"))
        ]
        assert recorded[name], name
    return recorded


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *[n for child in plan.get("Plans", ()) for n in _nodes(child)]]


async def _generic_plan(conn: Any, sql: str) -> list[dict[str, Any]]:
    """The nodes of the plan Postgres caches for ``sql`` without looking at values."""
    count = max((int(n) for n in re.findall(r"\$(\d+)", sql)), default=0)
    await conn.execute(f"PREPARE hot AS {sql}")
    try:
        values = f"({', '.join(['NULL'] * count)})" if count else ""
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE hot{values}")
    finally:
        await conn.execute("DEALLOCATE hot")
    return _nodes(json.loads(raw)[0]["Plan"])


def _wrong(name: str, nodes: list[dict[str, Any]]) -> list[str]:
    """How a plan of the path ``name`` reads a table otherwise than it must."""
    found = []
    for node in nodes:
        relation, kind = node.get("Relation Name"), node["Node Type"]
        if kind in ("Seq Scan", "Sort", "Incremental Sort"):
            found.append(f"{kind} {relation or ''}")
        if relation not in TABLES or not kind.endswith("Scan"):
            continue
        index = node.get("Index Name")
        expected = {SESSIONS_INDEX[name]} if relation == "ds_sessions" else OTHER_INDEXES[relation]
        if kind not in ("Index Scan", "Index Only Scan") or index not in expected:
            found.append(f"{kind} on {relation} using {index}")
    return found


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_hot_paths_are_index_lookups_on_tables_never_analyzed(
    backend: str, fresh_engine: AsyncEngine
) -> None:
    recorded = await _hot_paths(fresh_engine)
    if backend == "sqlite":
        await _check_sqlite(fresh_engine, recorded)
        return
    async with raw_pg(fresh_engine.url.render_as_string(hide_password=False)) as conn:
        never = await conn.fetchval(
            "SELECT bool_and(last_analyze IS NULL AND last_autoanalyze IS NULL "
            "AND last_vacuum IS NULL AND last_autovacuum IS NULL) "
            "FROM pg_stat_user_tables WHERE relname = ANY($1::text[])",
            list(TABLES),
        )
        assert never, "the tables were analysed: the test would prove nothing"
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        wrong: dict[str, list[str]] = {}
        read_sessions: dict[str, set[str]] = {}
        for name, seen in recorded.items():
            for sql, _ in seen:
                nodes = await _generic_plan(conn, sql)
                if found := _wrong(name, nodes):
                    wrong.setdefault(name, []).extend(found)
                read_sessions.setdefault(name, set()).update(
                    n.get("Index Name", "")
                    for n in nodes
                    if n.get("Relation Name") == "ds_sessions"
                )
        fk_check = _wrong("append_event", await _generic_plan(conn, FK_CHECK))
        assert wrong == {}
        assert fk_check == []
    # Every path that reads sessions read them through its index (not only no wrong one).
    for name, index in SESSIONS_INDEX.items():
        if index is not None:
            assert index in read_sessions[name], (name, read_sessions[name])


async def _check_sqlite(engine: AsyncEngine, recorded: dict[str, list[tuple[str, Any]]]) -> None:
    wrong: dict[str, list[str]] = {}
    async with engine.connect() as conn:
        assert not (
            await conn.exec_driver_sql(
                "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'"
            )
        ).scalar()
        for name, seen in recorded.items():
            expected = {
                "ds_sessions": SESSIONS_INDEX[name] or "",
                "ds_events": "sqlite_autoindex_ds_events_1",
                "ds_user_state": "sqlite_autoindex_ds_user_state_1",
                "ds_app_state": "sqlite_autoindex_ds_app_state_1",
            }
            for sql, params in seen:
                rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)).all()
                for detail in (str(row[-1]) for row in rows):
                    match = re.match(
                        r"(SCAN|SEARCH) (ds_\w+)(?: USING (?:COVERING )?INDEX (\w+))?", detail
                    )
                    if "TEMP B-TREE" in detail:
                        wrong.setdefault(name, []).append(detail)
                    if not match or match[2] not in expected:
                        continue
                    index = match[3]
                    if index == "sqlite_autoindex_ds_sessions_1":
                        index = KEY
                    if match[1] == "SCAN" or index != expected[match[2]]:
                        wrong.setdefault(name, []).append(detail)
    assert wrong == {}
