"""SQLStore: the Store contract over one SQLAlchemy Core schema, on SQLite and Postgres."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..errors import (
    InvalidArgumentError,
    SchemaNotMigratedError,
    SessionError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
    StoreUnavailableError,
)
from ..model import Event, Filter, Session, new_id, utcnow
from ..prepare import (
    check_after,
    check_count,
    check_limit,
    check_max_bytes,
    check_older_than,
    check_session,
    check_title,
    fork_state,
    merge_state,
    prepare_create,
    prepare_event,
    prepare_update,
)
from ..state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, scope_of, validate_id
from .dialect import dialect_ops, install_sqlite_pragmas
from .schema import app_state, events, sessions, user_state

__all__ = ["SQLStore"]

_META = [
    sessions.c.org_id,
    sessions.c.id,
    sessions.c.user_id,
    sessions.c.app_name,
    sessions.c.title,
    sessions.c.parent_id,
    sessions.c.created_at,
    sessions.c.updated_at,
    sessions.c.message_count,
    sessions.c.token_total,
    sessions.c.version,
]
_EVENT_COLS = [
    events.c.seq,
    events.c.id,
    events.c.author,
    events.c.invocation_id,
    events.c.content,
    events.c.state_delta,
    events.c.tokens,
    events.c.timestamp,
]
_SESSION_KEY = and_(sessions.c.org_id == bindparam("k_org"), sessions.c.id == bindparam("k_id"))
_EVENTS_KEY = and_(events.c.org_id == bindparam("k_org"), events.c.session_id == bindparam("k_id"))
_MISSING_SCHEMA = ("no such table", "no such column", "does not exist")
_PURGE_BATCH = 500


def _session_from_row(row: Any, state: dict[str, Any] | None = None) -> Session:
    m = row._mapping
    session = Session(
        id=m["id"],
        org_id=m["org_id"],
        user_id=m["user_id"],
        app_name=m["app_name"],
        title=m["title"],
        state=state or {},
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        message_count=m["message_count"],
        token_total=m["token_total"],
        version=m["version"],
        parent_id=m["parent_id"],
    )
    if state is not None:
        session.mark_persisted()
    return session


def _event_from_row(row: Any) -> Event:
    m = row._mapping
    return Event(
        author=m["author"],
        content=m["content"],
        invocation_id=m["invocation_id"],
        state_delta=m["state_delta"],
        tokens=m["tokens"],
        id=m["id"],
        timestamp=m["timestamp"],
        seq=m["seq"],
    )


@contextmanager
def _translated(operation: str) -> Iterator[None]:
    """Translate driver errors into the library's error tree: the one boundary for it."""
    try:
        yield
    except SessionError:
        raise
    except sa_exc.DBAPIError as exc:
        text = str(exc.orig).lower()
        if any(marker in text for marker in _MISSING_SCHEMA):
            raise SchemaNotMigratedError(
                f"{operation}: the database schema is missing or out of date; run "
                "`durable-sessions migrate`, `alembic upgrade head` or `await store.migrate()`"
            ) from exc
        raise StoreUnavailableError(
            f"{operation}: the database failed ({type(exc.orig).__name__}); nothing was written "
            "by this operation"
        ) from exc
    except (OSError, TimeoutError, sa_exc.DisconnectionError, sa_exc.TimeoutError) as exc:
        raise StoreUnavailableError(
            f"{operation}: the database could not be reached ({type(exc).__name__})"
        ) from exc


class SQLStore:
    """A session store on SQLite (aiosqlite) or Postgres (asyncpg), through SQLAlchemy Core.

    It takes a live ``AsyncEngine`` and shares its pool; it never opens another and never
    disposes an engine it did not create. It holds no cache, so any number of processes can
    share one database. The schema belongs to Alembic: run ``await store.migrate()`` (or
    ``alembic upgrade head``) before use.

    Args:
        engine: An engine on ``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``.
        busy_timeout: SQLite only: seconds a writer waits for another writer's lock.
        max_value_bytes: The largest state value or event content accepted, as UTF-8 JSON;
            larger ones raise ``InvalidStateError``. None removes the limit.

    Raises:
        InvalidArgumentError: the engine is not async or its driver is not supported.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        busy_timeout: float = 30.0,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise InvalidArgumentError(
                "SQLStore needs an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine)"
            )
        self._engine = engine
        self._owns_engine = False
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self._ops = dialect_ops(engine.dialect.name, engine.dialect.driver)
        if self._ops.name == "sqlite":
            install_sqlite_pragmas(engine.sync_engine, int(busy_timeout * 1000))
            self._reader = engine
        else:
            # A single-statement read needs no transaction: autocommit spares BEGIN/ROLLBACK.
            self._reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._build_statements()

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> SQLStore:
        """Create a store with an engine of its own, which ``close()`` disposes."""
        store = cls(create_async_engine(url, **engine_options))
        store._owns_engine = True
        return store

    @property
    def engine(self) -> AsyncEngine:
        """The engine the store runs on."""
        return self._engine

    async def close(self) -> None:
        """Dispose the engine if this store created it (``from_url``); otherwise do nothing."""
        if self._owns_engine:
            await self._engine.dispose()

    async def migrate(self, revision: str = "head") -> None:
        """Run the bundled Alembic migrations up to ``revision`` on this store's engine."""
        from ..migrate import upgrade  # Alembic is imported only when migrating

        await upgrade(self._engine, revision)

    # -- statements, built once ------------------------------------------------------------

    def _build_statements(self) -> None:
        ops = self._ops
        self._q_get = select(*_META).where(_SESSION_KEY)
        self._q_shared = union_all(
            select(literal("u").label("scope"), user_state.c.key, user_state.c.value).where(
                user_state.c.org_id == bindparam("k_org"),
                user_state.c.app_name == bindparam("k_app"),
                user_state.c.user_id == bindparam("k_user"),
            ),
            select(literal("a").label("scope"), app_state.c.key, app_state.c.value).where(
                app_state.c.org_id == bindparam("k_org"),
                app_state.c.app_name == bindparam("k_app"),
            ),
        )
        self._q_exists = select(sessions.c.version).where(_SESSION_KEY)
        self._q_insert = ops.insert_if_absent(sessions).returning(sessions.c.id)
        self._q_upsert_user = ops.upsert(
            user_state, ["org_id", "app_name", "user_id", "key"], ["value", "updated_at"]
        )
        self._q_upsert_app = ops.upsert(
            app_state, ["org_id", "app_name", "key"], ["value", "updated_at"]
        )
        self._q_delete_user_keys = delete(user_state).where(
            user_state.c.org_id == bindparam("k_org"),
            user_state.c.app_name == bindparam("k_app"),
            user_state.c.user_id == bindparam("k_user"),
            user_state.c.key.in_(bindparam("k_keys", expanding=True)),
        )
        self._q_delete_app_keys = delete(app_state).where(
            app_state.c.org_id == bindparam("k_org"),
            app_state.c.app_name == bindparam("k_app"),
            app_state.c.key.in_(bindparam("k_keys", expanding=True)),
        )
        self._q_update = (
            update(sessions)
            .where(_SESSION_KEY, sessions.c.version == bindparam("v_expected"))
            .values(
                title=bindparam("v_title"),
                state=bindparam("v_state"),
                updated_at=bindparam("v_now"),
                version=sessions.c.version + 1,
            )
            .returning(sessions.c.version)
        )
        self._q_touch = (
            update(sessions)
            .where(_SESSION_KEY)
            .values(
                message_count=sessions.c.message_count + bindparam("v_messages"),
                token_total=sessions.c.token_total + bindparam("v_tokens"),
                title=case((sessions.c.title == "", bindparam("v_title")), else_=sessions.c.title),
                updated_at=bindparam("v_now"),
                version=sessions.c.version + 1,
            )
            .returning(*_META)
        )
        append_values: dict[str, Any] = {
            "event_seq": sessions.c.event_seq + 1,
            "message_count": sessions.c.message_count + 1,
            "token_total": sessions.c.token_total + bindparam("v_tokens"),
            "updated_at": bindparam("v_now"),
            "version": sessions.c.version + 1,
        }
        returning = (sessions.c.event_seq, sessions.c.app_name, sessions.c.user_id)
        self._q_append = (
            update(sessions).where(_SESSION_KEY).values(append_values).returning(*returning)
        )
        if ops.merge_private is not None:
            self._q_append_private = (
                update(sessions)
                .where(_SESSION_KEY)
                .values({**append_values, "state": ops.merge_private()})
                .returning(*returning)
            )
        else:
            self._q_append_private = (
                update(sessions)
                .where(_SESSION_KEY)
                .values({**append_values, "state": bindparam("v_private_state")})
                .returning(*returning)
            )
        self._q_private_state = select(sessions.c.state).where(_SESSION_KEY)
        self._q_insert_event = events.insert()
        self._q_delete_events = delete(events).where(_EVENTS_KEY)
        self._q_delete_session = delete(sessions).where(_SESSION_KEY)
        self._q_parent = select(*_META, sessions.c.state, sessions.c.event_seq).where(_SESSION_KEY)
        if ops.name == "postgresql":
            # Holds off appends to the parent while its transcript is copied.
            self._q_parent = self._q_parent.with_for_update()
        copied = select(
            events.c.org_id,
            bindparam("k_child"),
            *_EVENT_COLS,
        ).where(_EVENTS_KEY)
        self._q_copy_events = events.insert().from_select(
            ["org_id", "session_id", *[c.name for c in _EVENT_COLS]], copied
        )

    # -- plumbing --------------------------------------------------------------------------

    @asynccontextmanager
    async def _read(self, operation: str) -> AsyncIterator[AsyncConnection]:
        with _translated(operation):
            async with self._reader.connect() as conn:
                yield conn

    @asynccontextmanager
    async def _write(self, operation: str) -> AsyncIterator[AsyncConnection]:
        with _translated(operation):
            async with self._engine.begin() as conn:
                if self._ops.begin_write:
                    await conn.exec_driver_sql(self._ops.begin_write)
                yield conn

    async def _shared_rows(
        self, conn: AsyncConnection, org_id: str, app_name: str, user_id: str
    ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        rows = await conn.execute(
            self._q_shared, {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        )
        user: list[tuple[str, Any]] = []
        app: list[tuple[str, Any]] = []
        for scope, key, value in rows:
            (user if scope == "u" else app).append((key, value))
        return user, app

    async def _write_shared(
        self,
        conn: AsyncConnection,
        org_id: str,
        app_name: str,
        user_id: str,
        delta: ScopedDelta,
        now: datetime,
    ) -> None:
        # Keys are written in sorted order so concurrent writers lock rows in the same order.
        if delta.user_set:
            await conn.execute(
                self._q_upsert_user,
                [
                    {
                        "org_id": org_id,
                        "app_name": app_name,
                        "user_id": user_id,
                        "key": k,
                        "value": delta.user_set[k],
                        "updated_at": now,
                    }
                    for k in sorted(delta.user_set)
                ],
            )
        if delta.user_deleted:
            await conn.execute(
                self._q_delete_user_keys,
                {
                    "k_org": org_id,
                    "k_app": app_name,
                    "k_user": user_id,
                    "k_keys": sorted(delta.user_deleted),
                },
            )
        if delta.app_set:
            await conn.execute(
                self._q_upsert_app,
                [
                    {
                        "org_id": org_id,
                        "app_name": app_name,
                        "key": k,
                        "value": delta.app_set[k],
                        "updated_at": now,
                    }
                    for k in sorted(delta.app_set)
                ],
            )
        if delta.app_deleted:
            await conn.execute(
                self._q_delete_app_keys,
                {"k_org": org_id, "k_app": app_name, "k_keys": sorted(delta.app_deleted)},
            )

    async def _require(self, conn: AsyncConnection, org_id: str, session_id: str) -> int:
        version = (
            await conn.execute(self._q_exists, {"k_org": org_id, "k_id": session_id})
        ).scalar()
        if version is None:
            raise SessionNotFoundError(org_id, session_id)
        return int(version)

    # -- Store -----------------------------------------------------------------------------

    async def create(self, session: Session) -> Session:
        """Store a new session and its initial state; fill in its timestamps and version."""
        delta = prepare_create(session, self.max_value_bytes)
        now = utcnow()
        async with self._write("create") as conn:
            inserted = await conn.execute(
                self._q_insert,
                {
                    "org_id": session.org_id,
                    "id": session.id,
                    "user_id": session.user_id,
                    "app_name": session.app_name,
                    "title": session.title,
                    "state": delta.private_set,
                    "parent_id": session.parent_id,
                    "created_at": now,
                    "updated_at": now,
                    "message_count": 0,
                    "token_total": 0,
                    "event_seq": 0,
                    "version": 1,
                },
            )
            if inserted.first() is None:
                raise SessionExistsError(session.org_id, session.id)
            await self._write_shared(
                conn, session.org_id, session.app_name, session.user_id, delta, now
            )
            user, app = await self._shared_rows(
                conn, session.org_id, session.app_name, session.user_id
            )
        temp = {k: v for k, v in session.state.items() if scope_of(k) == "temp"}
        session.state = {**merge_state(delta.private_set, user, app), **temp}
        session.created_at = session.updated_at = now
        session.message_count = session.token_total = 0
        session.version = 1
        session.mark_persisted()
        return session

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a session with its private and shared state merged into ``state``."""
        check_session(org_id, session_id)
        async with self._read("get") as conn:
            row = (
                await conn.execute(
                    select(*_META, sessions.c.state).where(_SESSION_KEY),
                    {"k_org": org_id, "k_id": session_id},
                )
            ).first()
            if row is None:
                raise SessionNotFoundError(org_id, session_id)
            user, app = await self._shared_rows(conn, org_id, row.app_name, row.user_id)
        return _session_from_row(row, merge_state(row.state, user, app))

    async def update(self, session: Session) -> Session:
        """Write the title and the state keys set or deleted since the session was read."""
        delta = prepare_update(session, self.max_value_bytes)
        private = {k: v for k, v in session.state.items() if scope_of(k) == "private"}
        now = utcnow()
        async with self._write("update") as conn:
            done = (
                await conn.execute(
                    self._q_update,
                    {
                        "k_org": session.org_id,
                        "k_id": session.id,
                        "v_expected": session.version,
                        "v_title": session.title,
                        "v_state": private,
                        "v_now": now,
                    },
                )
            ).first()
            if done is None:
                await self._require(conn, session.org_id, session.id)
                raise StaleSessionError(session.org_id, session.id, session.version)
            await self._write_shared(
                conn, session.org_id, session.app_name, session.user_id, delta, now
            )
        session.version = int(done[0])
        session.updated_at = now
        session.mark_persisted()
        return session

    async def delete(self, org_id: str, session_id: str) -> None:
        """Delete a session with its private state and events."""
        check_session(org_id, session_id)
        params = {"k_org": org_id, "k_id": session_id}
        async with self._write("delete") as conn:
            await conn.execute(self._q_delete_events, params)
            result = await conn.execute(self._q_delete_session, params)
            if result.rowcount == 0:
                raise SessionNotFoundError(org_id, session_id)

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return matching sessions, most recently updated first, without state."""
        query = select(*_META).where(sessions.c.org_id == filter.org_id)
        if filter.user_id is not None:
            query = query.where(sessions.c.user_id == filter.user_id)
        if filter.app_name is not None:
            query = query.where(sessions.c.app_name == filter.app_name)
        if filter.parent_id is not None:
            query = query.where(sessions.c.parent_id == filter.parent_id)
        query = query.order_by(sessions.c.updated_at.desc(), sessions.c.id.desc())
        if filter.limit:
            query = query.limit(filter.limit)
        async with self._read("list") as conn:
            rows = (await conn.execute(query)).all()
        return [_session_from_row(row) for row in rows]

    async def append_event(self, org_id: str, session_id: str, event: Event) -> Event:
        """Append an event and apply its state delta, atomically."""
        check_session(org_id, session_id)
        stored, delta = prepare_event(event, self.max_value_bytes)
        now = utcnow()
        params: dict[str, Any] = {
            "k_org": org_id,
            "k_id": session_id,
            "v_tokens": stored.tokens,
            "v_now": now,
        }
        async with self._write("append_event") as conn:
            if delta.private_set:
                if self._ops.merge_private is not None:
                    params["v_private_delta"] = delta.private_set
                else:
                    current = (await conn.execute(self._q_private_state, params)).scalar()
                    if current is None:
                        raise SessionNotFoundError(org_id, session_id)
                    params["v_private_state"] = {**current, **delta.private_set}
                row = (await conn.execute(self._q_append_private, params)).first()
            else:
                row = (await conn.execute(self._q_append, params)).first()
            if row is None:
                raise SessionNotFoundError(org_id, session_id)
            stored.seq = int(row.event_seq)
            await conn.execute(
                self._q_insert_event,
                {
                    "org_id": org_id,
                    "session_id": session_id,
                    "seq": stored.seq,
                    "id": stored.id,
                    "author": stored.author,
                    "invocation_id": stored.invocation_id,
                    "content": stored.content,
                    "state_delta": stored.state_delta,
                    "tokens": stored.tokens,
                    "timestamp": stored.timestamp,
                },
            )
            await self._write_shared(conn, org_id, row.app_name, row.user_id, delta, now)
        return stored

    async def list_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> builtins.list[Event]:
        """Return a session's events, oldest first (newest ``limit``, later than ``after``)."""
        check_session(org_id, session_id)
        check_limit(limit)
        after = check_after(after)
        query = select(*_EVENT_COLS).where(
            events.c.org_id == org_id, events.c.session_id == session_id
        )
        if after is not None:
            query = query.where(events.c.timestamp > after)
        if limit is not None:
            # Newest first through the (org, session, seq) key, then put back in order.
            query = query.order_by(events.c.seq.desc()).limit(limit)
        else:
            query = query.order_by(events.c.seq)
        async with self._read("list_events") as conn:
            rows = (await conn.execute(query)).all()
            if not rows:
                await self._require(conn, org_id, session_id)
        found = [_event_from_row(row) for row in rows]
        if limit is not None:
            found.reverse()
        return found

    async def touch(
        self,
        org_id: str,
        session_id: str,
        *,
        messages: int = 0,
        tokens: int = 0,
        title: str = "",
    ) -> Session:
        """Add to the counters in SQL and title an untitled session; return its metadata."""
        check_session(org_id, session_id)
        check_count("messages", messages)
        check_count("tokens", tokens)
        check_title(title)
        async with self._write("touch") as conn:
            row = (
                await conn.execute(
                    self._q_touch,
                    {
                        "k_org": org_id,
                        "k_id": session_id,
                        "v_messages": messages,
                        "v_tokens": tokens,
                        "v_title": title,
                        "v_now": utcnow(),
                    },
                )
            ).first()
            if row is None:
                raise SessionNotFoundError(org_id, session_id)
        return _session_from_row(row)

    async def fork(
        self,
        org_id: str,
        session_id: str,
        *,
        new_session_id: str | None = None,
        with_events: bool = False,
    ) -> Session:
        """Create a child from the parent's private state (and transcript, in SQL)."""
        check_session(org_id, session_id)
        child_id = new_id() if new_session_id is None else new_session_id
        validate_id("new_session_id", child_id)
        now = utcnow()
        async with self._write("fork") as conn:
            parent = (
                await conn.execute(self._q_parent, {"k_org": org_id, "k_id": session_id})
            ).first()
            if parent is None:
                raise SessionNotFoundError(org_id, session_id)
            private = fork_state(parent.state, session_id)
            inserted = await conn.execute(
                self._q_insert,
                {
                    "org_id": org_id,
                    "id": child_id,
                    "user_id": parent.user_id,
                    "app_name": parent.app_name,
                    "title": parent.title,
                    "state": private,
                    "parent_id": session_id,
                    "created_at": now,
                    "updated_at": now,
                    "message_count": parent.message_count if with_events else 0,
                    "token_total": parent.token_total if with_events else 0,
                    "event_seq": parent.event_seq if with_events else 0,
                    "version": 1,
                },
            )
            if inserted.first() is None:
                raise SessionExistsError(org_id, child_id)
            if with_events:
                await conn.execute(
                    self._q_copy_events,
                    {"k_org": org_id, "k_id": session_id, "k_child": child_id},
                )
            user, app = await self._shared_rows(conn, org_id, parent.app_name, parent.user_id)
            child = (await conn.execute(self._q_get, {"k_org": org_id, "k_id": child_id})).one()
        return _session_from_row(child, merge_state(private, user, app))

    async def _delete_where(self, operation: str, condition: Any, *, lock: bool) -> int:
        """Delete matching sessions and their events in bounded batches; return the count."""
        deleted = 0
        while True:
            async with self._write(operation) as conn:
                pick = select(sessions.c.org_id, sessions.c.id).where(condition).limit(_PURGE_BATCH)
                if lock and self._ops.name == "postgresql":
                    pick = pick.with_for_update(skip_locked=True)
                ids = (await conn.execute(pick)).all()
                if not ids:
                    return deleted
                org_id = ids[0].org_id
                batch = [row.id for row in ids]
                await conn.execute(
                    delete(events).where(events.c.org_id == org_id, events.c.session_id.in_(batch))
                )
                result = await conn.execute(
                    delete(sessions).where(sessions.c.org_id == org_id, sessions.c.id.in_(batch))
                )
                deleted += result.rowcount
            if len(ids) < _PURGE_BATCH:
                return deleted

    async def purge(self, org_id: str, *, older_than: timedelta, dry_run: bool = False) -> int:
        """Delete sessions not updated within ``older_than``, in batches; return the count."""
        validate_id("org_id", org_id)
        cutoff = utcnow() - check_older_than(older_than)
        condition = and_(sessions.c.org_id == org_id, sessions.c.updated_at < cutoff)
        if dry_run:
            async with self._read("purge") as conn:
                query = select(func.count()).select_from(sessions).where(condition)
                return int((await conn.execute(query)).scalar_one())
        return await self._delete_where("purge", condition, lock=True)

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Erase a user's sessions, events and ``user:`` state in one organisation."""
        validate_id("org_id", org_id)
        validate_id("user_id", user_id)
        condition = and_(sessions.c.org_id == org_id, sessions.c.user_id == user_id)
        count = await self._delete_where("delete_user", condition, lock=False)
        async with self._write("delete_user") as conn:
            await conn.execute(
                delete(user_state).where(
                    user_state.c.org_id == org_id, user_state.c.user_id == user_id
                )
            )
        return count
