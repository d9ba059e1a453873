"""(c) The driver floor on MySQL (MariaDB): the same work by hand on raw asyncmy,
durable-sessions' schema, the fewest statements each operation needs.

MySQL has no ``UPDATE ... RETURNING`` and no data-modifying CTEs, so a write that touches
several tables is several statements between ``BEGIN`` and ``COMMIT``: an append bumps the
session row's ``event_seq`` into a user variable (``@seq := event_seq + 1``) that the
event's and its words' inserts read on the server, with no round trip back; shared keys go
in one multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` per table. Reads, ``fork`` (an
``INSERT ... SELECT``) and ``delete`` are single statements in autocommit, each atomic by
itself; a read of a session and its newest events is one ``SELECT`` joining a derived table.

Connections come from a plain queue (no pool reset query), at READ COMMITTED as the
library's writes run; a transaction that loses a deadlock or a lock wait is run again, as
the library's are. Events go in with their words (``ds_event_words``, the schema's search
index on MySQL), computed by the library's word rules. JSON is encoded and decoded with the
json module, as a library must.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

from durable_sessions import new_id
from durable_sessions.fulltext import event_text, words

from .common import APP, ORG, Counters, migrate_schema, raw_mysql_connect
from .floor_pg import Handle, _merge, _split
from .workloads import CONTENT, Implementation

ATTEMPTS = 5
_RETRIED = (1213, 1205)  # deadlock; lock wait timeout

INSERT_SESSION = """
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version, incarnation)
VALUES (%s, %s, %s, %s, '', %s, NULL, %s, %s, 0, 0, 0, 1, %s)
"""
UPSERT_USER = """
INSERT INTO ds_user_state (org_id, app_name, user_id, `key`, value, updated_at) VALUES {rows}
ON DUPLICATE KEY UPDATE value = VALUES(value), updated_at = VALUES(updated_at)
"""
UPSERT_APP = """
INSERT INTO ds_app_state (org_id, app_name, `key`, value, updated_at) VALUES {rows}
ON DUPLICATE KEY UPDATE value = VALUES(value), updated_at = VALUES(updated_at)
"""
SHARED = """
SELECT 'u', `key`, value FROM ds_user_state WHERE org_id = %s AND app_name = %s AND user_id = %s
UNION ALL
SELECT 'a', `key`, value FROM ds_app_state WHERE org_id = %s AND app_name = %s
"""
_AGG = (
    "CONCAT('{', COALESCE(GROUP_CONCAT("
    "CONCAT(JSON_QUOTE(CONVERT(`key` USING utf8mb4)), ':', value)), ''), '}')"
)
"""A scope's shared keys as one JSON object, built from the stored JSON texts."""
GET = f"""
SELECT s.title, s.state, s.parent_id, s.created_at, s.updated_at, s.message_count,
  s.token_total, s.version,
  (SELECT {_AGG} FROM ds_user_state
   WHERE org_id = s.org_id AND app_name = s.app_name AND user_id = s.user_id) AS ustate,
  (SELECT {_AGG} FROM ds_app_state WHERE org_id = s.org_id AND app_name = s.app_name) AS astate,
  e.seq, e.id, e.author, e.invocation_id, e.content, e.state_delta, e.tokens, e.timestamp
FROM ds_sessions s
LEFT JOIN (SELECT * FROM ds_events WHERE org_id = %s AND session_id = %s
           ORDER BY seq DESC LIMIT %s) e ON 1
WHERE s.org_id = %s AND s.id = %s AND s.app_name = %s AND s.user_id = %s
"""
SAVE = """
UPDATE ds_sessions SET title = %s, state = %s, updated_at = %s, version = version + 1
WHERE org_id = %s AND id = %s AND version = %s
"""
APPEND = """
UPDATE ds_sessions SET event_seq = (@seq := event_seq + 1), message_count = message_count + 1,
  token_total = token_total + %s, updated_at = %s, version = version + 1,
  state = JSON_MERGE_PATCH(state, %s)
WHERE org_id = %s AND id = %s
"""
INSERT_EVENT = """
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp) VALUES (%s, %s, @seq, %s, %s, %s, %s, %s, %s, %s)
"""
INSERT_WORDS = "INSERT INTO ds_event_words (org_id, word, session_id, seq, n) VALUES {rows}"
LIST = """
SELECT org_id, id, user_id, app_name, title, parent_id, created_at, updated_at,
  message_count, token_total, version
FROM ds_sessions WHERE org_id = %s AND user_id = %s AND app_name = %s
ORDER BY updated_at DESC, id DESC LIMIT 50
"""
FORK = """
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version, incarnation)
SELECT org_id, %s, user_id, app_name, title, JSON_SET(state, '$.forked_from', %s), id, %s, %s,
  0, 0, 0, 1, %s
FROM ds_sessions WHERE org_id = %s AND id = %s
"""
FORKED = """
SELECT 's', s.user_id, s.state FROM ds_sessions s WHERE s.org_id = %s AND s.id = %s
UNION ALL
SELECT 'u', u.`key`, u.value FROM ds_user_state u JOIN ds_sessions s
  ON u.org_id = s.org_id AND u.app_name = s.app_name AND u.user_id = s.user_id
  WHERE s.org_id = %s AND s.id = %s
UNION ALL
SELECT 'a', a.`key`, a.value FROM ds_app_state a JOIN ds_sessions s
  ON a.org_id = s.org_id AND a.app_name = s.app_name
  WHERE s.org_id = %s AND s.id = %s
"""
DELETE = "DELETE FROM ds_sessions WHERE org_id = %s AND id = %s"  # events, words: CASCADE
EVENTS = """
SELECT seq, id, author, invocation_id, content, state_delta, tokens, timestamp FROM ds_events
WHERE org_id = %s AND session_id = %s ORDER BY seq DESC LIMIT %s
"""
ALL_EVENTS = 1 << 62
"""The LIMIT of a read of every event."""


def _now() -> datetime:
    """Now, as the schema stores it on MySQL: naive UTC, microseconds."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _text(value: Any) -> str:
    """A ``VARBINARY`` column's value as text."""
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _values(width: int, count: int) -> str:
    row = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([row] * count)


def _errno(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class FloorMySQL(Implementation):
    """Raw asyncmy, hand-written statements, a queue of connections."""

    name = "floor"

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()
        self._idle: asyncio.LifoQueue[Any] = asyncio.LifoQueue()
        self._all: list[Any] = []
        self._url = ""

    async def open(self, url: str) -> None:
        await migrate_schema(url)
        self._url = url

    async def close(self) -> None:
        for conn in self._all:
            conn.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        if self._idle.empty() and len(self._all) < self.pool_size:
            conn = await raw_mysql_connect(self._url, autocommit=True)
            async with conn.cursor() as cursor:
                await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                await cursor.execute("SET SESSION group_concat_max_len = 1073741824")
            self._all.append(conn)
        else:
            conn = await self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put_nowait(conn)

    async def _rows(self, conn: Any, sql: str, params: Any) -> list[Any]:
        assert self.counters is not None
        self.counters.statements += 1
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall())

    async def _run(self, conn: Any, sql: str, params: Any) -> int:
        assert self.counters is not None
        self.counters.statements += 1
        async with conn.cursor() as cursor:
            return int(await cursor.execute(sql, params))

    async def _tx(self, work: Any) -> Any:
        """Run ``work(conn)`` between BEGIN and COMMIT; again after a deadlock or lock wait."""
        async with self._conn() as conn:
            for attempt in range(ATTEMPTS):
                await conn.begin()
                try:
                    result = await work(conn)
                except BaseException as exc:
                    await conn.rollback()
                    if _errno(exc) in _RETRIED and attempt < ATTEMPTS - 1:
                        continue
                    raise
                await conn.commit()
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _upsert_shared(
        self, conn: Any, user_id: str, user: dict[str, Any], app: dict[str, Any], now: datetime
    ) -> None:
        if user:
            params: list[Any] = []
            for key in sorted(user):
                params += (ORG, APP, user_id, key, json.dumps(user[key]), now)
            await self._run(conn, UPSERT_USER.format(rows=_values(6, len(user))), params)
        if app:
            params = []
            for key in sorted(app):
                params += (ORG, APP, key, json.dumps(app[key]), now)
            await self._run(conn, UPSERT_APP.format(rows=_values(5, len(app))), params)

    @staticmethod
    def _scoped(rows: list[Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {"s": {}, "u": {}, "a": {}}
        for scope, key, value in rows:
            found[_text(scope)][_text(key)] = value
        return found["s"], found["u"], found["a"]

    async def create(self, user_id: str, state: dict[str, Any]) -> Handle:
        private, user, app = _split(state)
        session_id = new_id()
        now = _now()
        params = (ORG, session_id, user_id, APP, json.dumps(private), now, now, new_id())

        async def work(conn: Any) -> list[Any]:
            await self._run(conn, INSERT_SESSION, params)
            await self._upsert_shared(conn, user_id, user, app, now)
            return await self._rows(conn, SHARED, (ORG, APP, user_id, ORG, APP))

        _, shared_user, shared_app = self._scoped(await self._tx(work))
        shared_user = {k: json.loads(v) for k, v in shared_user.items()}
        shared_app = {k: json.loads(v) for k, v in shared_app.items()}
        return Handle(session_id, user_id, _merge(private, shared_user, shared_app), 1)

    async def get(self, handle: Handle, recent: int | None) -> int:
        limit = ALL_EVENTS if recent is None else recent
        params = (ORG, handle.id, limit, ORG, handle.id, APP, handle.user_id)
        async with self._conn() as conn:
            rows = await self._rows(conn, GET, params)
        if not rows:
            raise LookupError(handle.id)
        first = rows[0]
        _merge(json.loads(first[1]), json.loads(first[8]), json.loads(first[9]))
        events = sorted(
            (
                r[10],
                _text(r[11]),
                _text(r[12]),
                _text(r[13]),
                json.loads(r[14]),
                json.loads(r[15]),
                r[16],
                r[17].replace(tzinfo=timezone.utc),
            )
            for r in rows
            if r[10] is not None
        )
        return len(events)

    async def save(self, handle: Handle, worker: int, i: int) -> None:
        handle.state.update(k=i, **{f"user:k{worker}": i, f"app:k{worker}": i})
        private, _, _ = _split(handle.state)
        now = _now()
        params = ("", json.dumps(private), now, ORG, handle.id, handle.version)

        async def work(conn: Any) -> None:
            if not await self._run(conn, SAVE, params):
                raise RuntimeError("stale session")
            shared = {f"k{worker}": i}
            await self._upsert_shared(conn, handle.user_id, shared, shared, now)

        await self._tx(work)
        handle.version += 1

    async def append(self, handle: Handle, worker: int, i: int) -> None:
        delta = {"k": i, f"user:k{worker}": i, f"app:k{worker}": i}
        private, user, app = _split(delta)
        now = _now()
        event = (
            ORG, handle.id, new_id(), "user", f"inv-{i}", json.dumps(CONTENT),
            json.dumps(delta), 12, now,
        )  # fmt: skip
        counts = Counter(words(event_text(CONTENT)))
        word_params: list[Any] = []
        for word, n in counts.items():
            word_params += (ORG, word.encode(), handle.id, n)
        insert_words = INSERT_WORDS.format(rows=", ".join(["(%s, %s, %s, @seq, %s)"] * len(counts)))

        async def work(conn: Any) -> None:
            if not await self._run(conn, APPEND, (12, now, json.dumps(private), ORG, handle.id)):
                raise LookupError(handle.id)
            await self._run(conn, INSERT_EVENT, event)
            if counts:
                await self._run(conn, insert_words, word_params)
            await self._upsert_shared(conn, handle.user_id, user, app, now)

        await self._tx(work)
        handle.version += 1

    async def list50(self, user_id: str) -> int:
        async with self._conn() as conn:
            rows = await self._rows(conn, LIST, (ORG, user_id, APP))
        return len([(_text(r[0]), _text(r[1]), r[6], r[7]) for r in rows])

    async def fork(self, handle: Handle) -> Handle:
        child_id = new_id()
        now = _now()
        async with self._conn() as conn:
            params = (child_id, handle.id, now, now, new_id(), ORG, handle.id)
            if not await self._run(conn, FORK, params):
                raise LookupError(handle.id)
            rows = await self._rows(conn, FORKED, (ORG, child_id) * 3)
        session, user, app = self._scoped(rows)
        ((user_id, state),) = session.items()
        loaded = _merge(
            json.loads(state),
            {k: json.loads(v) for k, v in user.items()},
            {k: json.loads(v) for k, v in app.items()},
        )
        return Handle(child_id, user_id, loaded, 1)

    async def events(self, session_id: str, limit: int) -> int:
        """The newest ``limit`` events of a session, oldest first (list_events' floor)."""
        async with self._conn() as conn:
            rows = await self._rows(conn, EVENTS, (ORG, session_id, limit))
        found = [
            (r[0], _text(r[1]), _text(r[2]), _text(r[3]), json.loads(r[4]), json.loads(r[5]),
             r[6], r[7].replace(tzinfo=timezone.utc))
            for r in rows
        ]  # fmt: skip
        found.reverse()
        return len(found)

    async def delete(self, handle: Handle) -> None:
        async with self._conn() as conn:
            if await self._run(conn, DELETE, (ORG, handle.id)) != 1:
                raise LookupError(handle.id)
