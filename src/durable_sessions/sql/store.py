"""SQLStore: the Store contract over one SQLAlchemy Core schema, on SQLite and Postgres."""

from __future__ import annotations

import builtins
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from sqlalchemy import Text, and_, bindparam, delete, func, literal, select, true
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import (
    DeletionIncompleteError,
    InvalidArgumentError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
    StoreError,
)
from ..model import Event, Filter, Session, new_id, utcnow
from ..prepare import (
    RECREATED,
    check_counters,
    check_delete_user,
    check_events_read,
    check_expected,
    check_fork,
    check_max_bytes,
    check_purge,
    check_session,
    check_shared_deletes,
    check_timeout,
    check_touch,
    fork_state,
    merge_state,
    prepare_create,
    prepare_event,
    prepare_update,
)
from ..state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, scope_of, validate_id
from ..store import check_after_seq
from .dialect import dialect_ops, install_sqlite_pragmas
from .runner import Mode, Program, Query, make_runner
from .schema import events, sessions, user_state
from .statements import META, Statements

__all__ = ["SQLStore"]

_BATCH = 500
"""Sessions deleted per transaction by purge and delete_user."""
# Postgres: lock_not_available (lock_timeout ran out), deadlock_detected.
_LOCK_CONFLICTS = ("55P03", "40P01")


class _Batch(NamedTuple):
    """The statements of a batched delete (purge, delete_user)."""

    pick: Any
    drop_events: Any
    drop_sessions: Any
    count: Any
    lock_timeout: Any


def _lock_conflict(exc: BaseException) -> bool:
    """Whether a store error was Postgres giving up a row lock wait (timeout or deadlock)."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) in _LOCK_CONFLICTS:
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


def _session(row: Any, state: dict[str, Any] | None = None) -> Session:
    session = Session(
        id=row.id,
        org_id=row.org_id,
        user_id=row.user_id,
        app_name=row.app_name,
        title=row.title,
        state=state or {},
        created_at=row.created_at,
        updated_at=row.updated_at,
        message_count=row.message_count,
        token_total=row.token_total,
        version=row.version,
        parent_id=row.parent_id,
        incarnation=row.incarnation,
    )
    if state is not None:
        session.mark_persisted()
    return session


def _event(row: Any) -> Event:
    return Event(
        author=row.author,
        content=row.content,
        invocation_id=row.invocation_id,
        state_delta=row.state_delta,
        tokens=row.tokens,
        id=row.id,
        timestamp=row.timestamp,
        seq=row.seq,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _event_from_array(item: list[Any]) -> Event:
    seq, event_id, author, invocation_id, content, state_delta, tokens, micros = item
    return Event(
        author=author,
        content=content,
        invocation_id=invocation_id,
        state_delta=state_delta,
        tokens=tokens,
        id=event_id,
        timestamp=_EPOCH + timedelta(microseconds=micros),
        seq=seq,
    )


def _session_with_state(row: Any) -> Session:
    return _session(row, merge_state(row.state, *_shared(row.user_state, row.app_state)))


def _events_read(
    org_id: str, session_id: str, limit: int | None, after: datetime | None
) -> tuple[tuple[bool, bool], dict[str, Any]]:
    """Check an events read; return its statement shape (after?, limit?) and parameters."""
    after = check_events_read(org_id, session_id, limit, after)
    params = {"k_org": org_id, "k_id": session_id, "k_after": after, "k_limit": limit}
    return (after is not None, limit is not None), params


def _count(row: Any) -> int:
    return int(row.n)


def _shared(user: dict[str, Any] | None, app: dict[str, Any] | None) -> tuple[Any, Any]:
    return (user or {}).items(), (app or {}).items()


class SQLStore:
    """A session store on SQLite (aiosqlite) or Postgres (asyncpg), over SQLAlchemy Core.

    It takes a live ``AsyncEngine`` and borrows connections from its pool; it never opens
    another pool and never disposes an engine it did not create. It holds no cache, so any
    number of processes can share one database. The schema belongs to Alembic: run
    ``await store.migrate()`` (or ``alembic upgrade head``) before use.

    Every statement is defined once in SQLAlchemy Core and compiled once per dialect; each
    operation then runs on the pool's driver connection in one thread hop (SQLite) or, for
    the hot paths, one round trip (Postgres). SQLAlchemy's cursor events still fire, so
    tracing and statement counting keep working.

    Args:
        engine: An engine on ``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``.
        busy_timeout: SQLite only: seconds a writer waits for another writer's lock.
        lock_timeout: Seconds ``purge`` and ``delete_user`` wait, in all, for sessions that
            concurrent writers hold (Postgres row locks) or keep creating, before raising
            ``DeletionIncompleteError``.
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
        lock_timeout: float = 30.0,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise InvalidArgumentError(
                "SQLStore needs an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine)"
            )
        self._engine = engine
        self._owns_engine = False
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self.lock_timeout = check_timeout("lock_timeout", lock_timeout)
        self._ops = dialect_ops(engine.dialect.name, engine.dialect.driver)
        self._pg = self._ops.is_postgres
        if not self._pg:
            install_sqlite_pragmas(engine.sync_engine, int(busy_timeout * 1000))
        self._q = Statements(self._ops, engine.dialect)
        self._runner = make_runner(engine)

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> SQLStore:
        """Create a store with an engine of its own, which ``close()`` disposes.

        ``url`` is an async URL or a plain ``sqlite://`` or ``postgresql://`` one, which gets
        its async driver (the URLs the command line and ``alembic`` accept). Engine options
        are passed to ``create_async_engine``.

        Raises:
            InvalidArgumentError: The URL is not valid or names an unsupported database.
        """
        from ..urls import async_url

        store = cls(create_async_engine(async_url(url), **engine_options))
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

    # -- shared pieces of programs -------------------------------------------------------------

    def _write_shared(
        self, org_id: str, app_name: str, user_id: str, delta: ScopedDelta, now: datetime
    ) -> Program[None]:
        """SQLite: write shared keys, in sorted order (so concurrent writers never deadlock)."""
        q = self._q
        if delta.user_set:
            rows = [
                {"org_id": org_id, "app_name": app_name, "user_id": user_id, "key": k,
                 "value": delta.user_set[k], "updated_at": now}
                for k in sorted(delta.user_set)
            ]  # fmt: skip
            yield Query(q.upsert_user, rows, many=True)
        if delta.user_deleted:
            yield Query(
                q.delete_user_keys,
                {"k_org": org_id, "k_app": app_name, "k_user": user_id,
                 "k_keys": sorted(delta.user_deleted)},
            )  # fmt: skip
        if delta.app_set:
            rows = [
                {"org_id": org_id, "app_name": app_name, "key": k, "value": delta.app_set[k],
                 "updated_at": now}
                for k in sorted(delta.app_set)
            ]  # fmt: skip
            yield Query(q.upsert_app, rows, many=True)
        if delta.app_deleted:
            yield Query(
                q.delete_app_keys,
                {"k_org": org_id, "k_app": app_name, "k_keys": sorted(delta.app_deleted)},
            )

    @staticmethod
    def _shared_params(delta: ScopedDelta) -> dict[str, Any]:
        """Postgres: the shared delta as the parameters of a single-statement write."""
        return {
            "v_user_set": delta.user_set,
            "v_user_deleted": sorted(delta.user_deleted),
            "v_app_set": delta.app_set,
            "v_app_deleted": sorted(delta.app_deleted),
            "v_user_expected": delta.user_expected,
            "v_app_expected": delta.app_expected,
        }

    def _require(self, org_id: str, session_id: str) -> Program[int]:
        found = (yield Query(self._q.exists, {"k_org": org_id, "k_id": session_id})).first()
        if found is None:
            raise SessionNotFoundError(org_id, session_id)
        return int(found.version)

    # -- Store ---------------------------------------------------------------------------------

    async def create(self, session: Session) -> Session:
        """Store a new session and its initial state; fill in its timestamps and version."""
        delta = prepare_create(session, self.max_value_bytes)
        now = utcnow()
        row = {
            "org_id": session.org_id, "id": session.id, "user_id": session.user_id,
            "app_name": session.app_name, "title": session.title, "state": delta.private_set,
            "parent_id": session.parent_id, "created_at": now, "updated_at": now,
            "message_count": 0, "token_total": 0, "event_seq": 0, "version": 1,
            "incarnation": new_id(),
        }  # fmt: skip
        program = self._create_pg(row, delta) if self._pg else self._create_sqlite(row, delta)
        user, app = await self._runner.run(program, "atomic" if self._pg else "write", "create")
        temp = {k: v for k, v in session.state.items() if scope_of(k) == "temp"}
        session.state = {**merge_state(delta.private_set, user, app), **temp}
        session.created_at = session.updated_at = now
        session.message_count = session.token_total = 0
        session.version = 1
        session.incarnation = str(row["incarnation"])
        session.mark_persisted()
        return session

    def _create_pg(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        params = {**row, "k_org": row["org_id"], "v_now": row["created_at"]}
        params.update(self._shared_params(delta))
        found = (yield Query(self._q.pg_create, params)).first()
        if not found.created:
            raise SessionExistsError(row["org_id"], row["id"])
        # The statement's read predates its own writes: lay the new shared keys over it.
        return _shared({**(found.user_state or {}), **delta.user_set},
                       {**(found.app_state or {}), **delta.app_set})  # fmt: skip

    def _create_sqlite(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        org, app_name, user_id = row["org_id"], row["app_name"], row["user_id"]
        if (yield Query(self._q.insert_session, row)).first() is None:
            raise SessionExistsError(org, row["id"])
        yield from self._write_shared(org, app_name, user_id, delta, row["created_at"])
        shared = (
            yield Query(self._q.shared, {"k_org": org, "k_app": app_name, "k_user": user_id})
        ).first()
        return _shared(shared.user_state, shared.app_state)

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a session with its private and shared state merged into ``state``."""
        check_session(org_id, session_id)
        return await self._runner.run(self._get(org_id, session_id), "read", "get")

    def _get(self, org_id: str, session_id: str) -> Program[Session]:
        row = (yield Query(self._q.get, {"k_org": org_id, "k_id": session_id})).first()
        if row is None:
            raise SessionNotFoundError(org_id, session_id)
        return _session(row, merge_state(row.state, *_shared(row.user_state, row.app_state)))

    async def get_with_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> Session:
        """Return a session with its state, and its events in ``events`` (see ``Store``)."""
        shape, params = _events_read(org_id, session_id, limit, after)
        if self._pg:
            stmt = self._q.shape(("get+events", *shape), lambda: self._q.pg_get_with_events(*shape))
            program = self._get_with_events_pg(stmt, params)
        else:
            stmt = self._q.shape(("events", *shape), lambda: self._q.events_query(*shape))
            program = self._get_with_events_sqlite(stmt, params, limit is not None)
        return await self._runner.run(program, "read", "get")

    def _get_with_events_pg(self, stmt: Any, params: dict[str, Any]) -> Program[Session]:
        row = (yield Query(stmt, params)).first()
        if row is None:
            raise SessionNotFoundError(params["k_org"], params["k_id"])
        session = _session(row, merge_state(row.state, *_shared(row.user_state, row.app_state)))
        session.events = [_event_from_array(item) for item in row.events or ()]
        return session

    def _get_with_events_sqlite(
        self, stmt: Any, params: dict[str, Any], newest_first: bool
    ) -> Program[Session]:
        session = yield from self._get(params["k_org"], params["k_id"])
        session.events = [_event(row) for row in (yield Query(stmt, params)).rows]
        if newest_first:
            session.events.reverse()
        return session

    async def update(self, session: Session) -> Session:
        """Write the title and the state keys set or deleted since the session was read."""
        delta = prepare_update(session, self.max_value_bytes)
        now = utcnow()
        params = {
            "k_org": session.org_id, "k_id": session.id, "v_expected": session.version,
            "v_incarnation": session.incarnation, "v_title": session.title, "v_now": now,
            # The version check makes the stored private state equal to what this copy read.
            "v_state": {k: v for k, v in session.state.items() if scope_of(k) == "private"},
        }  # fmt: skip
        guarded = bool(delta.user_deleted or delta.app_deleted)
        program = (
            self._update_pg(params, delta, guarded)
            if self._pg
            else self._update_sqlite(session, params, delta, now)
        )
        # A delete of a shared key is checked against the value read, under a row lock taken
        # in the same transaction: on Postgres that save needs a transaction of its own.
        mode: Mode = "atomic" if self._pg and not guarded else "write"
        version = await self._runner.run(program, mode, "update")
        session.version = version
        session.updated_at = now
        session.mark_persisted()
        return session

    def _stale(self, params: dict[str, Any]) -> Program[None]:
        """Raise why a guarded write wrote nothing: no session, another life of the id, or
        another version."""
        org_id, session_id = params["k_org"], params["k_id"]
        found = (yield Query(self._q.meta, {"k_org": org_id, "k_id": session_id})).first()
        if found is None:
            raise SessionNotFoundError(org_id, session_id)
        expected = params.get("v_expected") or 0
        if params["v_incarnation"] not in (None, found.incarnation):
            raise StaleSessionError(org_id, session_id, expected, RECREATED)
        if "v_tokens" in params and params.get("v_expected") in (None, found.version):
            # touch or append_event, refused by its own guard against counter overflow
            counters = (found.message_count, found.token_total, found.version)
            messages = params.get("v_messages", 1)
            check_counters(org_id, session_id, counters, messages, params["v_tokens"])
        raise StaleSessionError(org_id, session_id, expected)

    def _check_shared_deletes(self, params: dict[str, Any], delta: ScopedDelta) -> Program[None]:
        """Lock the shared keys a save deletes and check they hold what the copy read."""
        org_id, session_id = params["k_org"], params["k_id"]
        owner = (yield Query(self._q.meta, {"k_org": org_id, "k_id": session_id})).first()
        if owner is None:
            raise SessionNotFoundError(org_id, session_id)
        stored: builtins.list[tuple[str, str, Any]] = []
        key = {"k_org": org_id, "k_app": owner.app_name, "k_user": owner.user_id}
        if delta.user_expected:
            found = yield Query(self._q.user_values, {**key, "k_keys": sorted(delta.user_expected)})
            stored += [("user", row.key, row.value) for row in found.rows]
        if delta.app_expected:
            found = yield Query(self._q.app_values, {**key, "k_keys": sorted(delta.app_expected)})
            stored += [("app", row.key, row.value) for row in found.rows]
        check_shared_deletes(org_id, session_id, params["v_expected"], stored, delta)

    def _update_pg(self, params: dict[str, Any], delta: ScopedDelta, guarded: bool) -> Program[int]:
        if guarded:
            yield from self._check_shared_deletes(params, delta)
        done = (yield Query(self._q.pg_update, {**params, **self._shared_params(delta)})).first()
        if done is None:
            yield from self._stale(params)
        return int(done.version)

    def _update_sqlite(
        self, session: Session, params: dict[str, Any], delta: ScopedDelta, now: datetime
    ) -> Program[int]:
        done = (yield Query(self._q.update, params)).first()
        if done is None:
            yield from self._stale(params)
        if delta.user_deleted or delta.app_deleted:
            yield from self._check_shared_deletes(params, delta)
        # The stored owner, not the copy's: a copy whose user_id or app_name was edited
        # still writes its shared keys where they belong.
        yield from self._write_shared(session.org_id, done.app_name, done.user_id, delta, now)
        return int(done.version)

    async def delete(self, org_id: str, session_id: str) -> None:
        """Delete a session with its private state and events."""
        check_session(org_id, session_id)
        await self._runner.run(
            self._delete(org_id, session_id), "atomic" if self._pg else "write", "delete"
        )

    def _delete(self, org_id: str, session_id: str) -> Program[None]:
        key = {"k_org": org_id, "k_id": session_id}
        if self._pg:
            gone = (yield Query(self._q.pg_delete, key)).rowcount
        else:
            yield Query(self._q.delete_events, key)
            gone = (yield Query(self._q.delete_session, key)).rowcount
        if not gone:
            raise SessionNotFoundError(org_id, session_id)

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return matching sessions, most recently updated first (state only on request)."""
        shape = (
            "list",
            filter.user_id is not None,
            filter.app_name is not None,
            filter.parent_id is not None,
            bool(filter.limit),
            filter.with_state,
        )

        def build() -> Any:
            columns = [*META, *self._q.state_columns()] if filter.with_state else META
            query = select(*columns).where(sessions.c.org_id == bindparam("k_org"))
            if filter.user_id is not None:
                query = query.where(sessions.c.user_id == bindparam("k_user"))
            if filter.app_name is not None:
                query = query.where(sessions.c.app_name == bindparam("k_app"))
            if filter.parent_id is not None:
                query = query.where(sessions.c.parent_id == bindparam("k_parent"))
            query = query.order_by(sessions.c.updated_at.desc(), sessions.c.id.desc())
            return query.limit(bindparam("k_limit")) if filter.limit else query

        stmt = self._q.shape(shape, build)
        params = {
            "k_org": filter.org_id, "k_user": filter.user_id, "k_app": filter.app_name,
            "k_parent": filter.parent_id, "k_limit": filter.limit,
        }  # fmt: skip
        make = _session_with_state if filter.with_state else _session
        return await self._runner.run(self._rows(stmt, params, make), "read", "list")

    @staticmethod
    def _rows(stmt: Any, params: dict[str, Any], make: Any) -> Program[builtins.list[Any]]:
        return [make(row) for row in (yield Query(stmt, params)).rows]

    async def append_event(
        self,
        org_id: str,
        session_id: str,
        event: Event,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event:
        """Append an event and apply its state delta, atomically (see ``Store``)."""
        check_session(org_id, session_id)
        check_expected(expected_version)
        stored, delta = prepare_event(event, self.max_value_bytes)
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "v_tokens": stored.tokens, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        if self._pg:
            program = self._append_pg(params, stored, delta)
        else:
            program = self._append_sqlite(params, stored, delta)
        stored.seq = await self._runner.run(
            program, "atomic" if self._pg else "write", "append_event"
        )
        return stored

    def _append_pg(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Program[int]:
        params.update(self._shared_params(delta))
        params.update(
            v_private_delta=delta.private_set, e_id=stored.id, e_author=stored.author,
            e_invocation_id=stored.invocation_id, e_content=stored.content,
            e_state_delta=stored.state_delta, e_timestamp=stored.timestamp,
        )  # fmt: skip
        row = (yield Query(self._q.pg_append, params)).first()
        if row is None:
            yield from self._stale(params)
        return int(row.event_seq)

    def _append_sqlite(
        self, params: dict[str, Any], stored: Event, delta: ScopedDelta
    ) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        q = self._q
        if delta.private_set:
            current = (yield Query(q.private_state, params)).first()
            if current is None:
                raise SessionNotFoundError(org_id, session_id)
            params["v_private_state"] = {**current.state, **delta.private_set}
            row = (yield Query(q.append_private, params)).first()
        else:
            row = (yield Query(q.append, params)).first()
        if row is None:
            yield from self._stale(params)
        yield Query(
            q.insert_event,
            {
                "org_id": org_id, "session_id": session_id, "seq": row.event_seq,
                "id": stored.id, "author": stored.author, "invocation_id": stored.invocation_id,
                "content": stored.content, "state_delta": stored.state_delta,
                "tokens": stored.tokens, "timestamp": stored.timestamp,
            },
        )  # fmt: skip
        yield from self._write_shared(org_id, row.app_name, row.user_id, delta, params["v_now"])
        return int(row.event_seq)

    async def list_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> builtins.list[Event]:
        """Return a session's events, oldest first (newest ``limit``, later than ``after``)."""
        shape, params = _events_read(org_id, session_id, limit, after)
        stmt = self._q.shape(("events", *shape), lambda: self._q.events_query(*shape))
        found = await self._runner.run(self._events(stmt, params), "read", "list_events")
        if limit is not None:
            found.reverse()
        return found

    def _events(self, stmt: Any, params: dict[str, Any]) -> Program[builtins.list[Event]]:
        rows = (yield Query(stmt, params)).rows
        if not rows:  # no events, or no session? Only then is a second statement needed.
            yield from self._require(params["k_org"], params["k_id"])
        return [_event(row) for row in rows]

    async def touch(
        self,
        org_id: str,
        session_id: str,
        *,
        messages: int = 0,
        tokens: int = 0,
        title: str = "",
        incarnation: str | None = None,
    ) -> Session:
        """Add to the counters in SQL and title an untitled session; return its metadata."""
        check_touch(org_id, session_id, messages, tokens, title)
        params = {
            "k_org": org_id, "k_id": session_id, "v_messages": messages, "v_tokens": tokens,
            "v_title": title, "v_now": utcnow(), "v_incarnation": incarnation,
        }  # fmt: skip
        return await self._runner.run(self._touch(params), "atomic", "touch")

    def _touch(self, params: dict[str, Any]) -> Program[Session]:
        row = (yield Query(self._q.touch, params)).first()
        if row is None:
            yield from self._stale(params)
        return _session(row)

    async def fork(
        self,
        org_id: str,
        session_id: str,
        *,
        new_session_id: str | None = None,
        with_events: bool = False,
    ) -> Session:
        """Create a child from the parent's private state (and transcript, in SQL)."""
        child_id = check_fork(org_id, session_id, new_session_id)
        if self._pg:
            params = {
                "k_org": org_id, "k_id": session_id, "k_child": child_id, "v_now": utcnow(),
                "v_with_events": with_events, "v_child_incarnation": new_id(),
            }  # fmt: skip
            return await self._runner.run(self._fork_pg(params), "atomic", "fork")
        program = self._fork(org_id, session_id, child_id, with_events, utcnow())
        return await self._runner.run(program, "write", "fork")

    def _fork_pg(self, params: dict[str, Any]) -> Program[Session]:
        child = (yield Query(self._q.pg_fork, params)).first()
        if child is None:
            yield from self._require(params["k_org"], params["k_id"])  # the parent is missing
            raise SessionExistsError(params["k_org"], params["k_child"])
        return _session(
            child, merge_state(child.state, *_shared(child.user_state, child.app_state))
        )

    def _fork(
        self, org_id: str, parent_id: str, child_id: str, with_events: bool, now: datetime
    ) -> Program[Session]:
        q = self._q
        parent = (yield Query(q.parent, {"k_org": org_id, "k_id": parent_id})).first()
        if parent is None:
            raise SessionNotFoundError(org_id, parent_id)
        private = fork_state(parent.state, parent_id)
        row = {
            "org_id": org_id, "id": child_id, "user_id": parent.user_id,
            "app_name": parent.app_name, "title": parent.title, "state": private,
            "parent_id": parent_id, "created_at": now, "updated_at": now,
            "message_count": parent.message_count if with_events else 0,
            "token_total": parent.token_total if with_events else 0,
            "event_seq": parent.event_seq if with_events else 0, "version": 1,
            "incarnation": new_id(),
        }  # fmt: skip
        if (yield Query(q.insert_session, row)).first() is None:
            raise SessionExistsError(org_id, child_id)
        if with_events:
            yield Query(q.copy_events, {"k_org": org_id, "k_id": parent_id, "k_child": child_id})
        shared = (
            yield Query(
                q.shared, {"k_org": org_id, "k_app": parent.app_name, "k_user": parent.user_id}
            )
        ).first()
        child = (yield Query(q.meta, {"k_org": org_id, "k_id": child_id})).first()
        return _session(child, merge_state(private, *_shared(shared.user_state, shared.app_state)))

    # -- retention -------------------------------------------------------------------------------

    def _batch_statements(self, kind: str, where: Any) -> _Batch:
        q, ops = self._q, self._ops
        # In index order, (updated_at, id) for purge and delete_user alike, so that batches
        # stop early and two of them lock the sessions they share in the same order.
        pick = (
            select(sessions.c.id)
            .where(where)
            .order_by(sessions.c.updated_at, sessions.c.id)
            .limit(_BATCH)
        )
        if self._pg:
            # Sessions that writers hold are waited for, never skipped; once free, each row
            # is checked against ``where`` again. The wait is bounded by the transaction's
            # lock_timeout (see _delete_batch).
            pick = pick.with_for_update()
        org = sessions.c.org_id == bindparam("k_org")
        return _Batch(
            q.shape((kind, "pick"), lambda: pick),
            q.shape(
                "drop_events",
                lambda: delete(events).where(
                    events.c.org_id == bindparam("k_org"), ops.in_list(events.c.session_id, "k_ids")
                ),
            ),
            q.shape(
                "drop_sessions",
                lambda: delete(sessions).where(org, ops.in_list(sessions.c.id, "k_ids")),
            ),
            q.shape((kind, "count"), lambda: select(func.count().label("n")).where(where)),
            q.shape(
                "lock_timeout",
                lambda: select(
                    func.set_config(
                        literal("lock_timeout"), bindparam("v_wait", type_=Text), true()
                    )
                ),
            ),
        )

    def _delete_batch(
        self, batch: _Batch, params: dict[str, Any], wait: float, last: Any
    ) -> Program[int]:
        """Delete up to _BATCH matching sessions with their events; return how many.

        When none is left, run ``last`` (if any) in the same transaction.
        """
        if self._pg:  # a bound on each row lock this transaction waits for
            yield Query(batch.lock_timeout, {"v_wait": f"{max(1, int(wait * 1000))}ms"})
        ids = [row.id for row in (yield Query(batch.pick, params)).rows]
        if not ids:
            if last is not None:
                yield Query(last, params)
            return 0
        yield Query(batch.drop_events, {"k_org": params["k_org"], "k_ids": ids})
        yield Query(batch.drop_sessions, {"k_org": params["k_org"], "k_ids": ids})
        return len(ids)

    async def _delete_all(
        self, kind: str, where: Any, params: dict[str, Any], last: Any = None
    ) -> int:
        """Delete every session matching ``where``, in batches, until a batch finds none.

        Each batch is a transaction of at most _BATCH sessions. A batch that finds fewer
        does not end the run (rows can be added, or freed, meanwhile): only an empty one
        does. Lock waits and deadlocks roll a batch back and it is tried again, until
        ``lock_timeout`` has passed in all; then ``DeletionIncompleteError`` says what is left.
        """
        batch = self._batch_statements(kind, where)
        deadline = time.monotonic() + self.lock_timeout
        total = 0
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                counts = await self._runner.run(
                    self._rows(batch.count, params, _count), "read", kind
                )
                raise DeletionIncompleteError(kind, params["k_org"], total, int(counts[0]))
            try:
                deleted = await self._runner.run(
                    self._delete_batch(batch, params, wait, last), "write", kind
                )
            except StoreError as exc:
                if not _lock_conflict(exc):
                    raise
                continue
            if not deleted:
                return total
            total += deleted

    async def purge(self, org_id: str, *, older_than: timedelta, dry_run: bool = False) -> int:
        """Delete sessions not updated within ``older_than``, in batches; return the count.

        Sessions that concurrent writers hold are waited for (up to ``lock_timeout`` in all)
        and deleted if they are still that old, never skipped; a session written meanwhile is
        new again and stays.

        Raises:
            InvalidArgumentError: ``older_than`` is negative, or reaches back before the year 1.
            DeletionIncompleteError: writers held sessions past ``lock_timeout``; what was
                deleted stays deleted, and running it again finishes the purge.
        """
        params = {"k_org": org_id, "k_cutoff": check_purge(org_id, older_than, utcnow())}
        where = and_(
            sessions.c.org_id == bindparam("k_org"),
            sessions.c.updated_at < bindparam("k_cutoff", type_=sessions.c.updated_at.type),
        )
        if dry_run:
            count = self._batch_statements("purge", where).count
            counts = await self._runner.run(self._rows(count, params, _count), "read", "purge")
            return int(counts[0])
        return await self._delete_all("purge", where, params)

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Erase a user's sessions, events and ``user:`` state in one organisation.

        Every session of the user that exists when it starts is deleted: sessions that
        concurrent writers hold are waited for (up to ``lock_timeout`` in all), never
        skipped. Sessions of the user created while it runs (by a create or a fork) are
        erased too, as it goes on until a pass finds none left; the ``user:`` state goes in
        that last pass. Only a session created after that pass survives: stop the user's
        traffic first for an erasure nothing can follow.

        Raises:
            DeletionIncompleteError: writers held, or kept creating, sessions of the user
                past ``lock_timeout``; what was deleted stays deleted, and running it again
                finishes the erasure.
        """
        check_delete_user(org_id, user_id)
        params = {"k_org": org_id, "k_user": user_id}
        where = and_(
            sessions.c.org_id == bindparam("k_org"), sessions.c.user_id == bindparam("k_user")
        )
        drop_state = self._q.shape(
            "drop_user_state",
            lambda: delete(user_state).where(
                user_state.c.org_id == bindparam("k_org"),
                user_state.c.user_id == bindparam("k_user"),
            ),
        )
        return await self._delete_all("delete_user", where, params, drop_state)

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` and ``app:`` state of (app, user), prefixed, in one statement."""
        validate_id("org_id", org_id)
        validate_id("app_name", app_name, allow_empty=True)
        validate_id("user_id", user_id)
        params = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        program = self._rows(self._q.shared, params, lambda row: row)
        (row,) = await self._runner.run(program, "read", "get_shared_state")
        return merge_state({}, *_shared(row.user_state, row.app_state))

    # -- batches and truncation ------------------------------------------------------------------

    async def append_events(
        self,
        org_id: str,
        session_id: str,
        events: builtins.list[Event],
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> builtins.list[Event]:
        """Append a batch of events, all or nothing, with consecutive seqs (see ``Store``).

        One statement on Postgres; one write transaction on SQLite.
        """
        check_session(org_id, session_id)
        check_expected(expected_version)
        prepared = [prepare_event(event, self.max_value_bytes) for event in events]
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        if not prepared:
            await self._runner.run(self._check_guard(params), "read", "append_events")
            return []
        stored = [event for event, _ in prepared]
        delta = ScopedDelta()
        for _, each in prepared:  # later events' keys win, as if appended one by one
            delta.private_set.update(each.private_set)
            delta.user_set.update(each.user_set)
            delta.app_set.update(each.app_set)
        params.update(
            v_count=len(stored), v_messages=len(stored), v_tokens=sum(e.tokens for e in stored)
        )
        if self._pg:
            program = self._append_many_pg(params, stored, delta)
        else:
            program = self._append_many_sqlite(params, stored, delta)
        last = await self._runner.run(program, "atomic" if self._pg else "write", "append_events")
        for offset, event in enumerate(stored, start=last - len(stored) + 1):
            event.seq = offset
        return stored

    def _append_many_pg(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Program[int]:
        params.update(self._shared_params(delta))
        params["v_private_delta"] = delta.private_set
        params["v_batch"] = [
            {"id": e.id, "author": e.author, "invocation_id": e.invocation_id,
             "content": e.content, "state_delta": e.state_delta, "tokens": e.tokens,
             "timestamp": e.timestamp.isoformat()}
            for e in stored
        ]  # fmt: skip
        stmt = self._q.shape("pg_append_many", self._q.pg_append_many)
        for _ in range(3):
            row = (yield Query(stmt, params)).first()
            if row is not None:
                return int(row.event_seq)
            # Nothing written: raise why, unless the session only became visible after the
            # statement's snapshot (created meanwhile); then the append is tried again.
            yield from self._check_guard(params)
        raise StaleSessionError(params["k_org"], params["k_id"], params["v_expected"] or 0)

    def _append_many_sqlite(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        q = self._q
        merge = bool(delta.private_set)
        if merge:
            current = (yield Query(q.private_state, params)).first()
            if current is None:
                raise SessionNotFoundError(org_id, session_id)
            params["v_private_state"] = {**current.state, **delta.private_set}
        stmt = q.shape(("append_many", merge), lambda: q.append_many(merge=merge))
        row = (yield Query(stmt, params)).first()
        if row is None:
            yield from self._stale(params)
        first = int(row.event_seq) - len(stored) + 1
        rows = [
            {"org_id": org_id, "session_id": session_id, "seq": seq, "id": e.id,
             "author": e.author, "invocation_id": e.invocation_id, "content": e.content,
             "state_delta": e.state_delta, "tokens": e.tokens, "timestamp": e.timestamp}
            for seq, e in enumerate(stored, start=first)
        ]  # fmt: skip
        yield Query(q.insert_event, rows, many=True)
        yield from self._write_shared(org_id, row.app_name, row.user_id, delta, params["v_now"])
        return int(row.event_seq)

    def _check_guard(self, params: dict[str, Any]) -> Program[None]:
        """Raise what a guarded write of this session would raise now, if anything."""
        org_id, session_id = params["k_org"], params["k_id"]
        found = (yield Query(self._q.meta, {"k_org": org_id, "k_id": session_id})).first()
        if found is None:
            raise SessionNotFoundError(org_id, session_id)
        expected = params["v_expected"]
        if params["v_incarnation"] not in (None, found.incarnation):
            raise StaleSessionError(org_id, session_id, expected or 0, RECREATED)
        if expected is not None and expected != found.version:
            raise StaleSessionError(org_id, session_id, expected)
        counters = (found.message_count, found.token_total, found.version)
        check_counters(
            org_id, session_id, counters, params.get("v_count", 0), params.get("v_tokens", 0)
        )

    async def truncate_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> builtins.list[Event]:
        """Remove the events after ``after_seq``; return them, oldest first (see ``Store``).

        One statement on Postgres (a second, locked attempt only if a concurrent write
        landed while it ran); one write transaction on SQLite.
        """
        check_session(org_id, session_id)
        check_after_seq(after_seq)
        check_expected(expected_version)
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "k_after_seq": after_seq, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        if not self._pg:
            program = self._truncate_sqlite(params)
            return await self._runner.run(program, "write", "truncate_events")
        removed = await self._runner.run(
            self._truncate_pg(params, locked=False), "atomic", "truncate_events"
        )
        if removed is None:  # a write landed between the statement's read and its lock
            removed = await self._runner.run(
                self._truncate_pg(params, locked=True), "write", "truncate_events"
            )
        assert removed is not None
        return removed

    def _truncate_pg(
        self, params: dict[str, Any], *, locked: bool
    ) -> Program[builtins.list[Event] | None]:
        q = self._q
        if locked:
            yield Query(q.shape("pg_lock_session", q.pg_lock_session), params)
        row = (yield Query(q.shape("pg_truncate", q.pg_truncate), params)).first()
        if row is None:
            yield from self._check_guard(params)
            if not locked:
                return None
            raise StaleSessionError(params["k_org"], params["k_id"], params["v_expected"] or 0)
        return [_event_from_array(item) for item in row.events or ()]

    def _truncate_sqlite(self, params: dict[str, Any]) -> Program[builtins.list[Event]]:
        q = self._q
        rows = (yield Query(q.shape("truncate_removed", q.truncate_removed), params)).rows
        removed = sorted((_event(row) for row in rows), key=lambda e: e.seq)
        params.update(v_count=len(removed), v_tokens=sum(e.tokens for e in removed))
        done = yield Query(q.shape("truncate_session", q.truncate_session), params)
        if done.first() is None:  # rolled back: the events stay
            yield from self._check_guard({**params, "v_count": 0, "v_tokens": 0})
            raise StaleSessionError(params["k_org"], params["k_id"], params["v_expected"] or 0)
        return removed

    async def list_event_contents(
        self, org_id: str, session_id: str, *, limit: int | None = None
    ) -> builtins.list[Any]:
        """Return the contents of a session's events, oldest first (see ``Store``).

        One statement: the database joins the contents into one JSON array, decoded at once.
        """
        _, params = _events_read(org_id, session_id, limit, None)
        has_limit = limit is not None
        stmt = self._q.shape(("contents", has_limit), lambda: self._q.event_contents(has_limit))
        return await self._runner.run(self._contents(stmt, params), "read", "list_events")

    def _contents(self, stmt: Any, params: dict[str, Any]) -> Program[builtins.list[Any]]:
        row = (yield Query(stmt, params)).first()
        found: builtins.list[Any] = json.loads(row.contents) if row.contents else []
        if not found:  # no events, or no session? Only then is a second statement needed.
            yield from self._require(params["k_org"], params["k_id"])
        return found
