"""Scaling: durable-sessions' latency as the sessions table and one transcript grow.

Big tables are seeded with set-based SQL straight into the schema that ``store.migrate()``
created (``generate_series`` on Postgres, a recursive CTE on SQLite); every measured
operation goes through the library's public API.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, SessionService, SQLStore

from .common import APP, LIST_USER, ORG, Counters, Database, count_statements, measure
from .workloads import CONTENT

USERS = 1_000
"""Seeded sessions are spread over this many users."""
READER = "reader-session"
LONG = "long-session"


def _pg_sessions(first: int, last: int, prefix: str, user: str) -> str:
    return f"""
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
SELECT '{ORG}', '{prefix}' || lpad(g::text, 9, '0'), {user}, '{APP}', '', '{{"k": 1}}'::jsonb,
  NULL, now() - make_interval(secs => g), now() - make_interval(secs => g), 1, 0, 1, 1
FROM generate_series({first}, {last}) g"""


def _pg_events(session: str, first: int, last: int, total: int, one_each: bool) -> str:
    return f"""
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{ORG}', {session}, {"1" if one_each else "g"}, 'ev-' || g, 'user', '',
  '{_json(CONTENT)}'::jsonb, '{{}}'::jsonb, 0, now() - make_interval(secs => {total} - g)
FROM generate_series({first}, {last}) g"""


def _json(value: Any) -> str:
    import json

    return json.dumps(value).replace("'", "''")


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || ({secs}) || ' seconds') || '.000000'"


def _sqlite_sessions(first: int, last: int, prefix: str, user: str) -> str:
    stamp = _SQLITE_NOW.format(secs="x")
    return f"""
WITH RECURSIVE g(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM g WHERE x < {last})
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
SELECT '{ORG}', '{prefix}' || printf('%09d', x), {user}, '{APP}', '', '{{"k": 1}}', NULL,
  {stamp}, {stamp}, 1, 0, 1, 1 FROM g"""


def _sqlite_events(session: str, first: int, last: int, total: int, one_each: bool) -> str:
    seq = "1" if one_each else "x"
    return f"""
WITH RECURSIVE g(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM g WHERE x < {last})
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{ORG}', {session}, {seq}, 'ev-' || x, 'user', '', '{_json(CONTENT)}', '{{}}', 0,
  {_SQLITE_NOW.format(secs=f"{total} - x")} FROM g"""


class Seeder:
    """Grows the tables of one database with set-based SQL."""

    def __init__(self, engine: AsyncEngine, backend: str) -> None:
        self.engine = engine
        self.backend = backend
        self.sessions = 0
        self.events_in_long = 0

    async def _exec(self, *statements: str) -> None:
        async with self.engine.begin() as conn:
            for sql in statements:
                await conn.exec_driver_sql(sql)
            await conn.exec_driver_sql("ANALYZE")

    def _s(self, first: int, last: int, prefix: str, user: str) -> str:
        fn = _pg_sessions if self.backend == "postgres" else _sqlite_sessions
        return fn(first, last, prefix, user)

    def _e(self, session: str, first: int, last: int, total: int, one_each: bool = False) -> str:
        """Events ``first..last``: of one session (seq = n), or one each of many sessions."""
        fn = _pg_events if self.backend == "postgres" else _sqlite_events
        return fn(session, first, last, total, one_each)

    async def fixtures(self) -> None:
        """The listed user's 1,000 sessions, the 1,000-event session and the long one."""
        var = "g" if self.backend == "postgres" else "x"
        self.users = f"'u' || ({var} % {USERS})"
        await self._exec(
            self._s(1, 1_000, "list-", f"'{LIST_USER}'"),
            self._s(1, 1, READER + "-", "'reader'"),
            self._s(1, 1, LONG + "-", "'reader'"),
            self._e(f"'{READER}-000000001'", 1, 1_000, 1_000),
            f"UPDATE ds_sessions SET event_seq = 1000 WHERE id = '{READER}-000000001'",
        )

    async def grow_sessions(self, size: int) -> None:
        """Seed sessions (one event each) until the table holds ``size`` of them."""
        if size <= self.sessions:
            return
        first, last = self.sessions + 1, size
        pad = "lpad(g::text, 9, '0')" if self.backend == "postgres" else "printf('%09d', x)"
        events = self._e(f"'seed-' || {pad}", first, last, last, one_each=True)
        await self._exec(self._s(first, last, "seed-", self.users), events)
        self.sessions = size

    async def grow_transcript(self, size: int) -> None:
        """Seed events into the long session until it holds ``size`` of them."""
        if size <= self.events_in_long:
            return
        long_id = f"{LONG}-000000001"
        first = self.events_in_long + 1
        await self._exec(
            self._e(f"'{long_id}'", first, size, size),
            f"UPDATE ds_sessions SET event_seq = {size}, message_count = {size} "
            f"WHERE id = '{long_id}'",
        )
        self.events_in_long = size


async def run_scaling(
    backend: str,
    sizes: list[int],
    event_sizes: list[int],
    duration: float,
    tmpdir: Path,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Measure get, recent20 and list50 per table size, and recent20, get and append per
    transcript length; return the rows."""
    db = Database(backend, "scaling", tmpdir)
    await db.create()
    engine = create_async_engine(db.url)
    rows: list[dict[str, Any]] = []
    try:
        store = SQLStore(engine)
        await store.migrate()
        counters = Counters()
        count_statements(engine, counters)
        manager = Manager(store, app_name=APP)
        service = SessionService(store, org_id=ORG)
        seeder = Seeder(engine, backend)
        await seeder.fixtures()
        rng = random.Random(7)
        reader = f"{READER}-000000001"

        async def run(axis: str, size: int, operation: str, op: Callable[[], Any]) -> None:
            result = await measure([op], duration=duration, counters=counters, warmup=20)
            row = {"backend": backend, "axis": axis, "size": size, "operation": operation, **result}
            rows.append(row)
            log(
                f"  {backend:8} {axis:8} {size:>9,} {operation:9} p50 {row['p50_ms']:7.3f} ms  "
                f"p99 {row['p99_ms']:7.3f} ms  {row['ops_per_sec']:8.1f} ops/s"
            )

        for size in sorted(sizes):
            await seeder.grow_sessions(size)

            async def get_random(size: int = size) -> None:
                sid = f"seed-{rng.randint(1, size):09d}"
                user = f"u{int(sid[5:]) % USERS}"
                await service.get(app_name=APP, user_id=user, session_id=sid)

            async def recent20() -> None:
                s = await service.get(
                    app_name=APP, user_id="reader", session_id=reader, num_recent_events=20
                )
                assert len(s.events) == 20

            async def list50() -> None:
                found = await manager.list(Filter(ORG, user_id=LIST_USER, app_name=APP, limit=50))
                assert len(found) == 50

            await run("sessions", size, "get", get_random)
            await run("sessions", size, "recent20", recent20)
            await run("sessions", size, "list50", list50)

        long_id = f"{LONG}-000000001"
        for size in sorted(event_sizes):
            await seeder.grow_transcript(size)
            session = await manager.get(ORG, long_id)

            async def long_recent20() -> None:
                s = await service.get(
                    app_name=APP, user_id="reader", session_id=long_id, num_recent_events=20
                )
                assert len(s.events) == 20

            async def long_get() -> None:
                await manager.get(ORG, long_id)

            async def long_append(session: Any = session) -> None:
                event = Event(author="user", content=CONTENT, state_delta={"k": 1, "user:k": 1})
                await manager.append_event(session, event)

            await run("events", size, "recent20", long_recent20)
            await run("events", size, "get", long_get)
            await run("events", size, "append", long_append)
            # The appends above made the transcript longer; the next seed starts past them.
            seeder.events_in_long = (await manager.get(ORG, long_id)).message_count
    finally:
        await engine.dispose()
        await db.drop()
    return rows
