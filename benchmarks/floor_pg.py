"""(c) The driver floor on Postgres: the same work by hand on raw asyncpg, durable-sessions'
schema, one statement (one round trip) per operation: data-modifying CTEs for the writes,
a LATERAL join for the session with its newest events.

Connections come from a plain queue (no pool reset query); statements run in autocommit,
each one atomic by itself. JSON is encoded and decoded with the json module, as a library
must.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import asyncpg

from durable_sessions import new_id

from .common import APP, ORG, Counters, migrate_schema, raw_pg_dsn
from .workloads import CONTENT, Implementation

_SHARED_U = (
    "(SELECT coalesce(jsonb_object_agg(key, value), '{}') FROM ds_user_state"
    " WHERE org_id = $1 AND app_name = $3 AND user_id = $4)"
)
_SHARED_A = (
    "(SELECT coalesce(jsonb_object_agg(key, value), '{}') FROM ds_app_state"
    " WHERE org_id = $1 AND app_name = $3)"
)
_UPSERT_SHARED = """
u AS (INSERT INTO ds_user_state (org_id, app_name, user_id, key, value, updated_at)
      SELECT $1, s.app_name, s.user_id, j.key, j.value, $5 FROM s, jsonb_each($6::jsonb) j
      ON CONFLICT (org_id, app_name, user_id, key)
      DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at),
a AS (INSERT INTO ds_app_state (org_id, app_name, key, value, updated_at)
      SELECT $1, s.app_name, j.key, j.value, $5 FROM s, jsonb_each($7::jsonb) j
      ON CONFLICT (org_id, app_name, key)
      DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at)
"""
CREATE = f"""
WITH s AS (
  INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id,
    created_at, updated_at, message_count, token_total, event_seq, version)
  VALUES ($1, $2, $4, $3, '', $8::jsonb, NULL, $5, $5, 0, 0, 0, 1)
  ON CONFLICT DO NOTHING RETURNING app_name, user_id),
{_UPSERT_SHARED}
SELECT (SELECT count(*) FROM s) AS created, {_SHARED_U} AS ustate, {_SHARED_A} AS astate
"""
GET = f"""
SELECT s.title, s.state, s.parent_id, s.created_at, s.updated_at, s.message_count,
  s.token_total, s.version, {_SHARED_U} AS ustate, {_SHARED_A} AS astate,
  e.seq, e.id, e.author, e.invocation_id, e.content, e.state_delta, e.tokens, e.timestamp
FROM ds_sessions s
LEFT JOIN LATERAL (
  SELECT * FROM ds_events e WHERE e.org_id = s.org_id AND e.session_id = s.id
  ORDER BY e.seq DESC LIMIT $5) e ON true
WHERE s.org_id = $1 AND s.id = $2 AND s.app_name = $3 AND s.user_id = $4
"""
SAVE = f"""
WITH s AS (
  UPDATE ds_sessions SET title = $9, state = $10::jsonb, updated_at = $5, version = version + 1
  WHERE org_id = $1 AND id = $2 AND app_name = $3 AND user_id = $4 AND version = $8
  RETURNING version, app_name, user_id),
{_UPSERT_SHARED}
SELECT version FROM s
"""
APPEND = f"""
WITH s AS (
  UPDATE ds_sessions SET event_seq = event_seq + 1, message_count = message_count + 1,
    token_total = token_total + $8, updated_at = $5, version = version + 1,
    state = state || $9::jsonb
  WHERE org_id = $1 AND id = $2 RETURNING event_seq, app_name, user_id),
ev AS (
  INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
    state_delta, tokens, timestamp)
  SELECT $1, $2, s.event_seq, $3, 'user', $4, $10::jsonb, $11::jsonb, $8, $5 FROM s),
{_UPSERT_SHARED}
SELECT event_seq FROM s
"""
LIST = """
SELECT org_id, id, user_id, app_name, title, parent_id, created_at, updated_at,
  message_count, token_total, version
FROM ds_sessions WHERE org_id = $1 AND user_id = $2 AND app_name = $3
ORDER BY updated_at DESC, id DESC LIMIT 50
"""
FORK = """
WITH c AS (
  INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id,
    created_at, updated_at, message_count, token_total, event_seq, version)
  SELECT org_id, $3, user_id, app_name, title,
    state || jsonb_build_object('forked_from', $2::text), $2, $4, $4, 0, 0, 0, 1
  FROM ds_sessions WHERE org_id = $1 AND id = $2
  RETURNING *)
SELECT c.*,
  (SELECT coalesce(jsonb_object_agg(u.key, u.value), '{}') FROM ds_user_state u
   WHERE u.org_id = c.org_id AND u.app_name = c.app_name AND u.user_id = c.user_id) AS ustate,
  (SELECT coalesce(jsonb_object_agg(a.key, a.value), '{}') FROM ds_app_state a
   WHERE a.org_id = c.org_id AND a.app_name = c.app_name) AS astate
FROM c
"""
DELETE = "DELETE FROM ds_sessions WHERE org_id = $1 AND id = $2"  # events: ON DELETE CASCADE
EVENTS = """
SELECT seq, id, author, invocation_id, content, state_delta, tokens, timestamp FROM ds_events
WHERE org_id = $1 AND session_id = $2 ORDER BY seq DESC LIMIT $3
"""


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    private: dict[str, Any] = {}
    user: dict[str, Any] = {}
    app: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("user:"):
            user[key[5:]] = value
        elif key.startswith("app:"):
            app[key[4:]] = value
        elif not key.startswith("temp:"):
            private[key] = value
    return private, user, app


def _merge(private: dict[str, Any], user: dict[str, Any], app: dict[str, Any]) -> dict[str, Any]:
    state = dict(private)
    state.update(("user:" + k, v) for k, v in user.items())
    state.update(("app:" + k, v) for k, v in app.items())
    return state


class Handle:
    """What the floor knows of a session between operations."""

    __slots__ = ("id", "state", "user_id", "version")

    def __init__(self, id: str, user_id: str, state: dict[str, Any], version: int) -> None:
        self.id = id
        self.user_id = user_id
        self.state = state
        self.version = version


class FloorPostgres(Implementation):
    """Raw asyncpg, hand-written statements, a queue of connections."""

    name = "floor"

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()
        self._idle: asyncio.LifoQueue[asyncpg.Connection] = asyncio.LifoQueue()
        self._all: list[asyncpg.Connection] = []
        self._dsn = ""

    async def open(self, url: str) -> None:
        await migrate_schema(url)
        self._dsn = raw_pg_dsn(url)

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        if self._idle.empty() and len(self._all) < self.pool_size:
            conn = await asyncpg.connect(self._dsn)
            self._all.append(conn)
        else:
            conn = await self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put_nowait(conn)

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self.counters is not None
        self.counters.statements += 1
        async with self._conn() as conn:
            return await conn.fetch(sql, *args)

    async def create(self, user_id: str, state: dict[str, Any]) -> Handle:
        private, user, app = _split(state)
        session_id = new_id()
        now = datetime.now(timezone.utc)
        (row,) = await self._fetch(
            CREATE, ORG, session_id, APP, user_id, now,
            json.dumps(user), json.dumps(app), json.dumps(private),
        )  # fmt: skip
        if not row["created"]:
            raise RuntimeError("session exists")
        merged = _merge(
            private,
            {**json.loads(row["ustate"]), **user},
            {**json.loads(row["astate"]), **app},
        )
        return Handle(session_id, user_id, merged, 1)

    async def get(self, handle: Handle, recent: int | None) -> int:
        rows = await self._fetch(GET, ORG, handle.id, APP, handle.user_id, recent)
        if not rows:
            raise LookupError(handle.id)
        first = rows[0]
        _merge(json.loads(first["state"]), json.loads(first["ustate"]), json.loads(first["astate"]))
        events = [
            (
                r["seq"],
                r["id"],
                r["author"],
                r["invocation_id"],
                json.loads(r["content"]),
                json.loads(r["state_delta"]),
                r["tokens"],
                r["timestamp"],
            )
            for r in rows
            if r["seq"] is not None
        ]
        events.reverse()
        return len(events)

    async def save(self, handle: Handle, worker: int, i: int) -> None:
        handle.state.update(k=i, **{f"user:k{worker}": i, f"app:k{worker}": i})
        private, _, _ = _split(handle.state)
        rows = await self._fetch(
            SAVE, ORG, handle.id, APP, handle.user_id, datetime.now(timezone.utc),
            json.dumps({f"k{worker}": i}), json.dumps({f"k{worker}": i}),
            handle.version, "", json.dumps(private),
        )  # fmt: skip
        if not rows:
            raise RuntimeError("stale session")
        handle.version = rows[0]["version"]

    async def append(self, handle: Handle, worker: int, i: int) -> None:
        delta = {"k": i, f"user:k{worker}": i, f"app:k{worker}": i}
        private, user, app = _split(delta)
        rows = await self._fetch(
            APPEND, ORG, handle.id, new_id(), f"inv-{i}", datetime.now(timezone.utc),
            json.dumps(user), json.dumps(app), 12, json.dumps(private),
            json.dumps(CONTENT), json.dumps(delta),
        )  # fmt: skip
        if not rows:
            raise LookupError(handle.id)
        handle.version += 1

    async def list50(self, user_id: str) -> int:
        rows = await self._fetch(LIST, ORG, user_id, APP)
        return len([dict(r) for r in rows])

    async def fork(self, handle: Handle) -> Handle:
        child_id = new_id()
        rows = await self._fetch(FORK, ORG, handle.id, child_id, datetime.now(timezone.utc))
        if not rows:
            raise LookupError(handle.id)
        row = rows[0]
        state = _merge(
            json.loads(row["state"]), json.loads(row["ustate"]), json.loads(row["astate"])
        )
        return Handle(child_id, row["user_id"], state, 1)

    async def events(self, session_id: str, limit: int) -> int:
        """The newest ``limit`` events of a session, oldest first (list_events' floor)."""
        rows = await self._fetch(EVENTS, ORG, session_id, limit)
        found = [
            (r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6], r[7]) for r in rows
        ]
        found.reverse()
        return len(found)

    async def delete(self, handle: Handle) -> None:
        assert self.counters is not None
        self.counters.statements += 1
        async with self._conn() as conn:
            status = await conn.execute(DELETE, ORG, handle.id)
        if status != "DELETE 1":
            raise LookupError(handle.id)
