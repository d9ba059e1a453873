"""(c) The driver floor on SQLite: the same work by hand on raw aiosqlite, durable-sessions'
schema, one aiosqlite call (one thread hop) per statement.

Writes that touch several rows run between ``BEGIN IMMEDIATE`` and ``COMMIT`` (two more
hops), one writer at a time behind an ``asyncio.Lock``; single statements run in
autocommit. Timestamps and JSON use the text formats that
SQLAlchemy writes, so the library could read what the floor writes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import aiosqlite

from durable_sessions import new_id

from .common import APP, ORG, Counters, migrate_schema
from .floor_pg import Handle, _merge, _split
from .workloads import CONTENT, Implementation

INSERT_SESSION = """
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
VALUES (?, ?, ?, ?, '', ?, NULL, ?, ?, 0, 0, 0, 1) ON CONFLICT DO NOTHING RETURNING id
"""
UPSERT_USER = """
INSERT INTO ds_user_state (org_id, app_name, user_id, key, value, updated_at)
VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (org_id, app_name, user_id, key)
DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
"""
UPSERT_APP = """
INSERT INTO ds_app_state (org_id, app_name, key, value, updated_at)
VALUES (?, ?, ?, ?, ?) ON CONFLICT (org_id, app_name, key)
DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
"""
SHARED = """
SELECT 'u', key, json(value) FROM ds_user_state WHERE org_id = ? AND app_name = ? AND user_id = ?
UNION ALL
SELECT 'a', key, json(value) FROM ds_app_state WHERE org_id = ? AND app_name = ?
"""
GET = """
SELECT s.title, s.state, s.parent_id, s.created_at, s.updated_at, s.message_count,
  s.token_total, s.version,
  (SELECT json_group_object(key, json(value)) FROM ds_user_state
   WHERE org_id = :org AND app_name = :app AND user_id = :user) AS ustate,
  (SELECT json_group_object(key, json(value)) FROM ds_app_state
   WHERE org_id = :org AND app_name = :app) AS astate,
  e.seq, e.id, e.author, e.invocation_id, e.content, e.state_delta, e.tokens, e.timestamp
FROM ds_sessions s
LEFT JOIN (SELECT * FROM ds_events WHERE org_id = :org AND session_id = :id
           ORDER BY seq DESC LIMIT :lim) e ON 1
WHERE s.org_id = :org AND s.id = :id AND s.app_name = :app AND s.user_id = :user
"""
SAVE = """
UPDATE ds_sessions SET title = ?, state = ?, updated_at = ?, version = version + 1
WHERE org_id = ? AND id = ? AND version = ? RETURNING version
"""
APPEND = """
UPDATE ds_sessions SET event_seq = event_seq + 1, message_count = message_count + 1,
  token_total = token_total + ?, updated_at = ?, version = version + 1,
  state = json_patch(state, ?)
WHERE org_id = ? AND id = ? RETURNING event_seq, app_name, user_id
"""
INSERT_EVENT = """
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
LIST = """
SELECT org_id, id, user_id, app_name, title, parent_id, created_at, updated_at,
  message_count, token_total, version
FROM ds_sessions WHERE org_id = ? AND user_id = ? AND app_name = ?
ORDER BY updated_at DESC, id DESC LIMIT 50
"""
FORK = """
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
SELECT org_id, ?, user_id, app_name, title, json_set(state, '$.forked_from', ?), id, ?, ?,
  0, 0, 0, 1
FROM ds_sessions WHERE org_id = ? AND id = ? RETURNING user_id, app_name, state
"""
DELETE = "DELETE FROM ds_sessions WHERE org_id = ? AND id = ?"  # events: ON DELETE CASCADE
EVENTS = """
SELECT seq, id, author, invocation_id, content, state_delta, tokens, timestamp FROM ds_events
WHERE org_id = ? AND session_id = ? ORDER BY seq DESC LIMIT ?
"""


def _stamp() -> str:
    """Now, as SQLAlchemy stores a UTC timestamp on SQLite."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc)


class FloorSqlite(Implementation):
    """Raw aiosqlite, hand-written statements, a queue of connections."""

    name = "floor"

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()
        self._idle: asyncio.LifoQueue[aiosqlite.Connection] = asyncio.LifoQueue()
        self._all: list[aiosqlite.Connection] = []
        self._path = ""
        # One writer at a time, queued in-process: SQLite's own busy handler sleeps and
        # retries (up to ~100 ms a nap), which costs far more than waiting on a lock here.
        self._writer = asyncio.Lock()

    async def open(self, url: str) -> None:
        await migrate_schema(url)
        self._path = url.split(":///", 1)[1]

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        if self._idle.empty() and len(self._all) < self.pool_size:
            conn = await aiosqlite.connect(self._path, isolation_level=None)
            await conn.execute("PRAGMA busy_timeout = 30000")
            await conn.execute("PRAGMA foreign_keys = ON")
            self._all.append(conn)
        else:
            conn = await self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put_nowait(conn)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._writer, self._conn() as conn:
            await conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")

    async def _rows(self, conn: aiosqlite.Connection, sql: str, params: Any) -> list[Any]:
        assert self.counters is not None
        self.counters.statements += 1
        return list(await conn.execute_fetchall(sql, params))

    async def _run(self, conn: aiosqlite.Connection, sql: str, params: Any) -> int:
        assert self.counters is not None
        self.counters.statements += 1
        cursor = await conn.execute(sql, params)
        return cursor.rowcount

    async def _upsert_shared(
        self, conn: aiosqlite.Connection, user_id: str, user: dict[str, Any],
        app: dict[str, Any], now: str,
    ) -> None:  # fmt: skip
        for key in sorted(user):
            await self._run(conn, UPSERT_USER, (ORG, APP, user_id, key, json.dumps(user[key]), now))
        for key in sorted(app):
            await self._run(conn, UPSERT_APP, (ORG, APP, key, json.dumps(app[key]), now))

    async def _shared(
        self, conn: aiosqlite.Connection, user_id: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        user: dict[str, Any] = {}
        app: dict[str, Any] = {}
        for scope, key, value in await self._rows(conn, SHARED, (ORG, APP, user_id, ORG, APP)):
            (user if scope == "u" else app)[key] = json.loads(value)
        return user, app

    async def create(self, user_id: str, state: dict[str, Any]) -> Handle:
        private, user, app = _split(state)
        session_id = new_id()
        now = _stamp()
        params = (ORG, session_id, user_id, APP, json.dumps(private), now, now)
        async with self._tx() as conn:
            if not await self._rows(conn, INSERT_SESSION, params):
                raise RuntimeError("session exists")
            await self._upsert_shared(conn, user_id, user, app, now)
            shared_user, shared_app = await self._shared(conn, user_id)
        return Handle(session_id, user_id, _merge(private, shared_user, shared_app), 1)

    async def get(self, handle: Handle, recent: int | None) -> int:
        params = {
            "org": ORG, "id": handle.id, "app": APP, "user": handle.user_id,
            "lim": -1 if recent is None else recent,
        }  # fmt: skip
        async with self._conn() as conn:
            rows = await self._rows(conn, GET, params)
        if not rows:
            raise LookupError(handle.id)
        first = rows[0]
        _merge(json.loads(first[1]), json.loads(first[8]), json.loads(first[9]))
        _parse(first[3])
        _parse(first[4])
        events = sorted(
            (
                r[10],
                r[11],
                r[12],
                r[13],
                json.loads(r[14]),
                json.loads(r[15]),
                r[16],
                _parse(r[17]),
            )
            for r in rows
            if r[10] is not None
        )
        return len(events)

    async def save(self, handle: Handle, worker: int, i: int) -> None:
        handle.state.update(k=i, **{f"user:k{worker}": i, f"app:k{worker}": i})
        private, _, _ = _split(handle.state)
        now = _stamp()
        params = ("", json.dumps(private), now, ORG, handle.id, handle.version)
        async with self._tx() as conn:
            rows = await self._rows(conn, SAVE, params)
            if not rows:
                raise RuntimeError("stale session")
            await self._upsert_shared(
                conn, handle.user_id, {f"k{worker}": i}, {f"k{worker}": i}, now
            )
        handle.version = rows[0][0]

    async def append(self, handle: Handle, worker: int, i: int) -> None:
        delta = {"k": i, f"user:k{worker}": i, f"app:k{worker}": i}
        private, user, app = _split(delta)
        now = _stamp()
        async with self._tx() as conn:
            rows = await self._rows(conn, APPEND, (12, now, json.dumps(private), ORG, handle.id))
            if not rows:
                raise LookupError(handle.id)
            seq = rows[0][0]
            event = (
                ORG, handle.id, seq, new_id(), "user", f"inv-{i}", json.dumps(CONTENT),
                json.dumps(delta), 12, now,
            )  # fmt: skip
            await self._run(conn, INSERT_EVENT, event)
            await self._upsert_shared(conn, handle.user_id, user, app, now)
        handle.version += 1

    async def list50(self, user_id: str) -> int:
        async with self._conn() as conn:
            rows = await self._rows(conn, LIST, (ORG, user_id, APP))
        return len([(r[0], r[1], _parse(r[6]), _parse(r[7])) for r in rows])

    async def fork(self, handle: Handle) -> Handle:
        child_id = new_id()
        now = _stamp()
        async with self._conn() as conn:
            rows = await self._rows(conn, FORK, (child_id, handle.id, now, now, ORG, handle.id))
            if not rows:
                raise LookupError(handle.id)
            user, app = await self._shared(conn, rows[0][0])
        return Handle(child_id, rows[0][0], _merge(json.loads(rows[0][2]), user, app), 1)

    async def events(self, session_id: str, limit: int) -> int:
        """The newest ``limit`` events of a session, oldest first (list_events' floor)."""
        async with self._conn() as conn:
            rows = await self._rows(conn, EVENTS, (ORG, session_id, limit))
        found = [
            (r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6], _parse(r[7]))
            for r in rows
        ]
        found.reverse()
        return len(found)

    async def delete(self, handle: Handle) -> None:
        async with self._conn() as conn:
            if await self._run(conn, DELETE, (ORG, handle.id)) != 1:
                raise LookupError(handle.id)
