"""SQLStore: the Store contract over one SQLAlchemy Core schema, on SQLite and Postgres.

This module checks each call's arguments, builds its parameters and shapes its results; the
statements and the programs that run them are per dialect (``sql/sqlite.py``,
``sql/postgres.py``), on the base of ``sql/statements.py`` and ``sql/programs.py``.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import (
    DeletionIncompleteError,
    InvalidArgumentError,
    SchemaNotMigratedError,
    StoreError,
)
from ..model import Event, Filter, Page, SearchHit, Session, new_id, utcnow
from ..prepare import (
    check_delete,
    check_delete_user,
    check_events_read,
    check_expected,
    check_fork,
    check_list_events,
    check_list_page,
    check_max_bytes,
    check_purge,
    check_search,
    check_session,
    check_timeout,
    check_title,
    check_touch,
    make_page,
    merge_state,
    page_fetch,
    prepare_create,
    prepare_event,
    prepare_update,
)
from ..state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, scope_of, validate_id
from ..store import check_after_seq
from .citus import detect_schema, make_distributed
from .dialect import dialect_ops, install_sqlite_pragmas
from .postgres import PostgresPrograms, PostgresStatements
from .programs import (
    Job,
    Programs,
    event_from_row,
    loads_document,
    shared_items,
)
from .runner import make_runner
from .search import fts_match, search_query
from .sqlite import SQLitePrograms, SQLiteStatements
from .statements import Statements

__all__ = ["SQLStore"]

T = TypeVar("T")

# Postgres: lock_not_available (lock_timeout ran out), deadlock_detected.
_LOCK_CONFLICTS = ("55P03", "40P01")
# Postgres: program_limit_exceeded (a json text past its 1 GB, or a jsonb value past 256 MB).
_TOO_LARGE = ("54000",)
# Postgres: undefined_function (``ds_search_text(json)`` of revision 0009 not there).
_NO_FUNCTION = ("42883",)


def _sqlstate_in(exc: BaseException, codes: tuple[str, ...]) -> bool:
    """Whether a store error was caused by a Postgres error with one of these SQLSTATEs."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) in codes:
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


def _events_read(
    org_id: str, session_id: str, limit: int | None, after: datetime | None
) -> tuple[tuple[bool, bool], dict[str, Any]]:
    """Check an events read; return its statement shape (after?, limit?) and parameters."""
    after = check_events_read(org_id, session_id, limit, after)
    params = {"k_org": org_id, "k_id": session_id, "k_after": after, "k_limit": limit}
    return (after is not None, limit is not None), params


class SQLStore:
    """A session store on SQLite (aiosqlite) or Postgres (asyncpg), over SQLAlchemy Core.

    It takes a live ``AsyncEngine`` and borrows connections from its pool; it never opens
    another pool and never disposes an engine it did not create. It holds no cache, so any
    number of processes can share one database. The schema belongs to Alembic: run
    ``await store.migrate()`` (or ``alembic upgrade head``) before use.

    Every statement is defined once in SQLAlchemy Core and compiled once per dialect; each
    operation then runs on the pool's driver connection in one thread hop (SQLite) or, for
    the hot paths, one round trip (Postgres). This class checks the arguments, builds the
    parameters and shapes the results; each dialect's statements and programs are in
    ``sql/sqlite.py`` and ``sql/postgres.py``.

    Args:
        engine: An engine on ``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``.
        busy_timeout: SQLite only: seconds a writer waits for another writer's lock.
        lock_timeout: Seconds ``purge`` and ``delete_user`` wait, in all, for sessions that
            concurrent writers hold (Postgres row locks) or keep creating, before raising
            ``DeletionIncompleteError``.
        max_value_bytes: The largest state value or event content accepted, as UTF-8 JSON;
            larger ones raise ``InvalidStateError``. None removes the limit.
        distributed: Postgres only: run every operation on one organisation's shard, for
            tables distributed by ``org_id`` (Citus; see ``sql/citus.py``): writes as one
            transaction of single-table statements instead of one statement each. None
            (the default) decides on first use: on when the database has the ``citus``
            extension, unless its setting ``durable_sessions.distributed`` is on or off.

    Raises:
        InvalidArgumentError: the engine is not async or its driver is not supported, or
            ``distributed`` is asked of SQLite.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        busy_timeout: float = 30.0,
        lock_timeout: float = 30.0,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
        distributed: bool | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise InvalidArgumentError(
                "SQLStore needs an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine)"
            )
        self._engine = engine
        self._owns_engine = False
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self.lock_timeout = check_timeout("lock_timeout", lock_timeout)
        ops = dialect_ops(engine.dialect.name, engine.dialect.driver)
        self._ops = ops
        self._chosen: Programs | None = None
        self._distributed: bool | None = None
        # Postgres: whether writes send search vectors (revision 0008's plain column); None
        # until the first operation asks the database, with the mode (``_ready``).
        self._vectors: bool | None = None
        # Postgres: whether search reads contents in stored order (``ds_search_text(json)``,
        # revision 0009); set off by a search that finds no such function (an older schema).
        self._stored_order = True
        self._wanted = distributed
        if ops.is_postgres:
            self._distributed = distributed
            if distributed:  # its writes never send vectors: nothing to ask
                self._choose(True, vectors=False)
                self._vectors = False
        elif distributed:
            raise InvalidArgumentError("distributed mode is for Postgres (Citus), not SQLite")
        else:
            install_sqlite_pragmas(engine.sync_engine, int(busy_timeout * 1000))
            self._chosen = SQLitePrograms(SQLiteStatements(ops, engine.dialect))
            self._distributed = False
            self._vectors = False
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

    @property
    def distributed(self) -> bool | None:
        """Whether the store runs in distributed mode; None until its first operation
        decides (Postgres with ``distributed=None``)."""
        return self._distributed

    @property
    def _programs(self) -> Programs:
        if self._chosen is None:  # not decided yet (_ready): one Postgres's, sending no vector
            self._choose(bool(self._distributed), vectors=False)
            assert self._chosen is not None
        return self._chosen

    @property
    def _q(self) -> Statements:
        return self._programs.q

    def _choose(self, distributed: bool, *, vectors: bool) -> None:
        dialect = self._engine.dialect
        if distributed:  # its writes never send vectors (see revision 0008)
            self._chosen = make_distributed(self._ops, dialect)
        else:
            self._chosen = PostgresPrograms(PostgresStatements(self._ops, dialect, vectors=vectors))
        self._distributed = distributed

    async def _ready(self, operation: str) -> None:
        """Decide on first use, once (every operation awaits this before it builds its
        program): Postgres asks the database for the mode (unless ``distributed`` said
        it) and whether ``ds_events.search_vector`` is a column writes fill."""
        if self._vectors is None:
            found = await self._runner.run(detect_schema(self._engine.dialect), "read", operation)
            distributed = found.distributed if self._wanted is None else self._wanted
            self._choose(distributed, vectors=bool(found.vectors))
            # Without the table (not migrated yet) the next operation asks again.
            self._vectors = found.vectors
            self._stored_order = True

    async def close(self) -> None:
        """Dispose the engine if this store created it (``from_url``); otherwise do nothing."""
        if self._owns_engine:
            await self._engine.dispose()

    async def migrate(self, revision: str = "head") -> None:
        """Run the bundled Alembic migrations up to ``revision`` on this store's engine."""
        from ..migrate import upgrade  # Alembic is imported only when migrating

        await upgrade(self._engine, revision)
        if self._ops.is_postgres:
            self._vectors = None  # the next operation looks at the migrated schema again
            self._stored_order = True

    async def _run(self, job: Job[T], operation: str) -> T:
        return await self._runner.run(job.program, job.mode, operation)

    async def _with_vectors(self, job: Callable[[], Job[T]], operation: str) -> T:
        """Run a write of events; if it sent search vectors to a schema that no longer takes
        them (downgraded below revision 0008 since the store looked), look again and run it
        once more: the statement that failed wrote nothing."""
        try:
            return await self._run(job(), operation)
        except SchemaNotMigratedError:
            if not self._vectors:
                raise
            self._vectors = None
            await self._ready(operation)
            if self._vectors:
                raise
            return await self._run(job(), operation)

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
        await self._ready("create")
        user, app = await self._run(self._programs.create(row, delta), "create")
        temp = {k: v for k, v in session.state.items() if scope_of(k) == "temp"}
        session.state = {**merge_state(delta.private_set, user, app), **temp}
        session.created_at = session.updated_at = now
        session.message_count = session.token_total = 0
        session.version = 1
        session.incarnation = str(row["incarnation"])
        session.mark_persisted()
        return session

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a session with its private and shared state merged into ``state``."""
        check_session(org_id, session_id)
        await self._ready("get")
        return await self._runner.run(self._programs.get(org_id, session_id), "read", "get")

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
        await self._ready("get")
        try:
            return await self._run(self._programs.get_with_events(shape, params), "get")
        except StoreError as exc:
            if not _sqlstate_in(exc, _TOO_LARGE):
                raise
        # Postgres builds the transcript as one json text, which cannot pass 1 GB: a
        # larger one is read as rows instead (whatever list_events returns, this returns).
        # The session and its events are then two statements, not one snapshot.
        return await self._run(self._programs.session_then_events(shape, params), "get")

    async def get_with_events_json(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> tuple[Session, str]:
        """Return a session with its state, and its events as JSON text (see ``Store``):
        nothing is decoded but the session row."""
        shape, params = _events_read(org_id, session_id, limit, after)
        await self._ready("get")
        try:
            return await self._run(self._programs.get_with_events_json(shape, params), "get")
        except StoreError as exc:
            if not _sqlstate_in(exc, _TOO_LARGE):
                raise
        # Past 1 GB, as for get_with_events: the events are read as rows.
        return await self._run(self._programs.session_then_events_json(shape, params), "get")

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
        await self._ready("update")
        session.version = await self._run(self._programs.update(params, delta), "update")
        session.updated_at = now
        session.mark_persisted()
        return session

    async def delete(
        self,
        org_id: str,
        session_id: str,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        """Delete a session with its private state and events (of that app and user only,
        when given: checked by the delete statement itself)."""
        check_delete(org_id, session_id, app_name, user_id)
        key = {"k_org": org_id, "k_id": session_id, "k_app": app_name, "k_user": user_id}
        await self._ready("delete")
        await self._run(self._programs.delete(key), "delete")

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return matching sessions, most recently updated first (state only on request)."""
        shape = (
            filter.user_id is not None,
            filter.app_name is not None,
            filter.parent_id is not None,
            bool(filter.limit),
            filter.with_state,
        )
        await self._ready("list")
        stmt = self._q.shape(("list", *shape), lambda: self._q.list_query(*shape))
        params = {
            "k_org": filter.org_id, "k_user": filter.user_id, "k_app": filter.app_name,
            "k_parent": filter.parent_id, "k_limit": filter.limit,
        }  # fmt: skip
        program = self._programs.listing(stmt, params, filter.with_state)
        return await self._runner.run(program, "read", "list")

    async def list_states_json(self, filter: Filter) -> str:
        """Return the listing of ``list(filter)`` with state as one JSON text (see ``Store``):
        one statement, each owner's shared state read once, nothing decoded."""
        shape = (
            filter.user_id is not None,
            filter.app_name is not None,
            filter.parent_id is not None,
            bool(filter.limit),
        )
        await self._ready("list")
        stmt = self._q.shape(("states", *shape), lambda: self._q.states_json_query(*shape))
        params = {
            "k_org": filter.org_id, "k_user": filter.user_id, "k_app": filter.app_name,
            "k_parent": filter.parent_id, "k_limit": filter.limit,
        }  # fmt: skip
        return await self._runner.run(self._programs.listing_json(stmt, params), "read", "list")

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Page:
        """Return one page of ``list`` after ``cursor``: one statement, a range of the
        ``(org_id[, user_id], updated_at, id)`` index from the position on (see ``Store``)."""
        size, position = check_list_page(filter, cursor)
        shape = (
            filter.user_id is not None,
            filter.app_name is not None,
            filter.parent_id is not None,
            True,
            filter.with_state,
            position is not None,
        )
        await self._ready("list")
        stmt = self._q.shape(("list", *shape), lambda: self._q.list_query(*shape))
        params = {
            "k_org": filter.org_id, "k_user": filter.user_id, "k_app": filter.app_name,
            "k_parent": filter.parent_id, "k_limit": page_fetch(size),
            "k_after_at": position[0] if position else None,
            "k_after_id": position[1] if position else None,
        }  # fmt: skip
        program = self._programs.listing(stmt, params, filter.with_state)
        found = await self._runner.run(program, "read", "list")
        return make_page(filter, found, size)

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
        check_expected(expected_version, incarnation)
        stored, delta = prepare_event(event, self.max_value_bytes)
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "v_tokens": stored.tokens, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        await self._ready("append_event")
        stored.seq = await self._with_vectors(
            lambda: self._programs.append(params, stored, delta), "append_event"
        )
        return stored

    async def list_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
        after_seq: int | None = None,
    ) -> builtins.list[Event]:
        """Return a session's events, oldest first (newest ``limit``, later than ``after``;
        with ``after_seq``, the oldest ``limit`` after it): one statement, a range of the
        ``(org_id, session_id, seq)`` key."""
        after = check_list_events(org_id, session_id, limit, after, after_seq)
        shape = (after is not None, limit is not None, after_seq is not None)
        params = {
            "k_org": org_id, "k_id": session_id, "k_after": after, "k_limit": limit,
            "k_after_seq": after_seq,
        }  # fmt: skip
        await self._ready("list_events")
        stmt = self._q.shape(("events", *shape), lambda: self._q.events_query(*shape))
        program = self._programs.events(stmt, params)
        found = await self._runner.run(program, "read", "list_events")
        if limit is not None and after_seq is None:
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
        incarnation: str | None = None,
    ) -> Session:
        """Add to the counters in SQL and title an untitled session; return its metadata."""
        check_touch(org_id, session_id, messages, tokens, title)
        check_expected(None, incarnation)
        params = {
            "k_org": org_id, "k_id": session_id, "v_messages": messages, "v_tokens": tokens,
            "v_title": title, "v_now": utcnow(), "v_incarnation": incarnation,
        }  # fmt: skip
        await self._ready("touch")
        return await self._runner.run(self._programs.touch(params), "atomic", "touch")

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
        # An incarnation tells apart the lives of one id. A generated child id is new, never
        # lived before, and every later life of it gets a new_id() of its own: it can serve
        # as its own first incarnation (one id fewer to make on every fork).
        incarnation = child_id if new_session_id is None else new_id()
        params = {
            "k_org": org_id, "k_id": session_id, "k_child": child_id, "v_now": utcnow(),
            "v_with_events": with_events, "v_child_incarnation": incarnation,
        }  # fmt: skip
        await self._ready("fork")
        return await self._with_vectors(lambda: self._programs.fork(params), "fork")

    # -- retention -------------------------------------------------------------------------------

    async def _delete_all(self, kind: str, params: dict[str, Any], last: Any = None) -> int:
        """Delete every session ``kind`` matches, in batches, until a batch finds none.

        Each batch is a transaction of at most ``BATCH`` sessions. A batch that finds fewer
        does not end the run (rows can be added, or freed, meanwhile): only an empty one
        does. Lock waits and deadlocks roll a batch back and it is tried again, until
        ``lock_timeout`` has passed in all; then ``DeletionIncompleteError`` says what is left.
        """
        await self._ready(kind)
        batch = self._q.retention(kind)
        deadline = time.monotonic() + self.lock_timeout
        total = 0
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                left = await self._runner.run(
                    self._programs.count(batch.remaining, params), "read", kind
                )
                raise DeletionIncompleteError(kind, params["k_org"], total, left)
            program = self._programs.delete_batch(batch, params, wait, last)
            try:
                deleted = await self._runner.run(program, "write", kind)
            except StoreError as exc:
                if not _sqlstate_in(exc, _LOCK_CONFLICTS):
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
        if dry_run:
            await self._ready("purge")
            count = self._programs.count(self._q.retention("purge").remaining, params)
            return await self._runner.run(count, "read", "purge")
        return await self._delete_all("purge", params)

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
        await self._ready("delete_user")
        return await self._delete_all("delete_user", params, self._q.drop_user_state)

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` and ``app:`` state of (app, user), prefixed, in one statement."""
        validate_id("org_id", org_id)
        validate_id("app_name", app_name, allow_empty=True)
        validate_id("user_id", user_id)
        params = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        await self._ready("get_shared_state")
        program = self._programs.rows(self._q.shared, params, lambda row: row)
        (row,) = await self._runner.run(program, "read", "get_shared_state")
        return merge_state({}, *shared_items(row.user_state, row.app_state))

    # -- batches and truncation ------------------------------------------------------------------

    async def append_events(
        self,
        org_id: str,
        session_id: str,
        events: builtins.list[Event],
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
        title: str = "",
    ) -> builtins.list[Event]:
        """Append a batch of events, all or nothing, with consecutive seqs (see ``Store``).

        One statement on Postgres; one write transaction on SQLite.
        """
        check_session(org_id, session_id)
        check_expected(expected_version, incarnation)
        check_title(title)
        prepared = [prepare_event(event, self.max_value_bytes) for event in events]
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation, "v_title": title,
        }  # fmt: skip
        await self._ready("append_events")
        if not prepared:
            await self._runner.run(self._programs.check_guard(params), "read", "append_events")
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
        last = await self._with_vectors(
            lambda: self._programs.append_many(params, stored, delta), "append_events"
        )
        for offset, event in enumerate(stored, start=last - len(stored) + 1):
            event.seq = offset
        return stored

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
        landed while it ran; removed events past 1 GB of JSON, which that statement cannot
        return, take a write transaction of steps instead); one write transaction on SQLite.
        """
        check_session(org_id, session_id)
        check_after_seq(after_seq)
        check_expected(expected_version, incarnation)
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "k_after_seq": after_seq, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        await self._ready("truncate_events")
        try:
            for job in self._programs.truncate(params):
                removed = await self._run(job, "truncate_events")
                if removed is not None:
                    return removed
        except StoreError as exc:
            # Postgres returns the removed events as one json text, which cannot pass 1 GB:
            # past it, nothing was written, and the truncation runs again in steps that
            # read them as rows (as SQLite's does).
            in_steps = self._programs.truncate_rows(params)
            if in_steps is None or not _sqlstate_in(exc, _TOO_LARGE):
                raise
            return await self._run(in_steps, "truncate_events")
        raise AssertionError("the last truncation job always answers")  # pragma: no cover

    async def pop_event(
        self,
        org_id: str,
        session_id: str,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event | None:
        """Remove the newest event and return it; None when there is none (see ``Store``).

        One statement on Postgres (a second, locked attempt only if a concurrent write
        landed while it ran); one write transaction on SQLite.
        """
        check_session(org_id, session_id)
        check_expected(expected_version, incarnation)
        params: dict[str, Any] = {
            "k_org": org_id, "k_id": session_id, "v_now": utcnow(),
            "v_expected": expected_version, "v_incarnation": incarnation,
        }  # fmt: skip
        await self._ready("pop_event")
        for job in self._programs.pop(params):
            removed = await self._run(job, "pop_event")
            if removed is not None:
                return removed[0] if removed else None
        raise AssertionError("the last pop job always answers")  # pragma: no cover

    async def list_event_contents(
        self, org_id: str, session_id: str, *, limit: int | None = None
    ) -> builtins.list[Any]:
        """Return the contents of a session's events, oldest first (see ``Store``).

        One statement: the database joins the contents into one JSON array, decoded at once
        (on Postgres, a transcript past 1 GB of JSON, which that statement cannot build, is
        read as one row per event instead).
        """
        _, params = _events_read(org_id, session_id, limit, None)
        has_limit = limit is not None
        await self._ready("list_events")
        stmt = self._q.contents_statement(has_limit)
        try:
            program = self._programs.contents(stmt, params)
            whole = await self._runner.run(program, "read", "list_events")
        except StoreError as exc:
            if not _sqlstate_in(exc, _TOO_LARGE):
                raise
            rows = self._q.contents_statement(has_limit, as_rows=True)
            program = self._programs.contents(rows, params, as_rows=True)
            whole = await self._runner.run(program, "read", "list_events")
        return [] if whole is None else loads_document(whole)

    # -- search ----------------------------------------------------------------------------------

    async def search(
        self,
        org_id: str,
        text: str,
        *,
        user_id: str | None = None,
        app_name: str | None = None,
        session_id: str | None = None,
        limit: int = 20,
    ) -> builtins.list[SearchHit]:
        """Return the events holding every word of ``text``, best first (see ``Store``).

        One statement over the full-text index: Postgres's GIN index on
        ``ds_events.search_vector``, SQLite's FTS5 table; every hit is ranked, so the
        cost grows with the number of events that hold all the words.
        """
        check_search(org_id, text, user_id, app_name, session_id, limit)
        shape = (user_id is not None, app_name is not None, session_id is not None)
        await self._ready("search")
        postgres = self._ops.is_postgres
        params = {
            "k_org": org_id, "k_text": text, "k_match": "" if postgres else fts_match(text),
            "k_user": user_id, "k_app": app_name, "k_session": session_id, "k_limit": limit,
        }  # fmt: skip
        while True:
            ordered = self._stored_order
            build = partial(search_query, postgres, *shape, stored_order=ordered)
            stmt = self._q.shape(("search", ordered, *shape), build)
            program = self._programs.rows(stmt, params, _hit_from_row)
            try:
                return await self._runner.run(program, "read", "search")
            except (StoreError, SchemaNotMigratedError) as exc:
                # A schema before revision 0009 (downgraded since the store looked): search
                # as it reads contents, cast to jsonb.
                if not (postgres and ordered and _sqlstate_in(exc, _NO_FUNCTION)):
                    raise
                self._stored_order = False


def _hit_from_row(row: Any) -> SearchHit:
    return SearchHit(row.session_id, event_from_row(row))
