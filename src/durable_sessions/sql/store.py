"""SQLStore: the Store contract over one SQLAlchemy Core schema, on SQLite, Postgres (Citus
too) and MySQL (MariaDB).

This module checks each call's arguments, builds its parameters and shapes its results; the
statements and the programs that run them are per dialect (``sql/dialects/``), on the base
of ``sql/statements.py`` and ``sql/programs.py``; with a keyring, values are sealed and
opened here (``sealing.Envelope``), and the writes that open values to seal them again are
``sql/sealed.py`` (fork) and ``sql/reseal.py`` (reencrypt).
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import (
    DeletionIncompleteError,
    InvalidArgumentError,
    SchemaNotMigratedError,
    SessionNotFoundError,
    StoreError,
)
from ..fulltext import fold, query_words
from ..jsoncodec import json_equal, loads_json, to_json
from ..memories import Memory, check_memory_search, check_owner, prepare_memories
from ..model import Event, Filter, Page, SearchHit, Session, new_id, utcnow
from ..prepare import (
    NO_TRUNCATION,
    check_delete,
    check_delete_user,
    check_events_read,
    check_expected,
    check_fork,
    check_guarded,
    check_list_events,
    check_list_page,
    check_max_bytes,
    check_purge,
    check_search,
    check_session,
    check_timeout,
    check_touch,
    events_json,
    make_page,
    merge_state,
    page_fetch,
    prepare_create,
    prepare_event,
    prepare_update,
)
from ..state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, scope_of, validate_id
from .attempts import watch_connects
from .dialect import dialect_ops
from .dialects import make_runner
from .dialects.citus.programs import detect_schema, make_distributed
from .dialects.mysql.programs import MySQLPrograms, MySQLStatements, retried
from .dialects.mysql.session import check_packet, install_mysql_session
from .dialects.postgresql.programs import PostgresPrograms, PostgresStatements
from .dialects.sqlite.pragmas import install_sqlite_pragmas
from .dialects.sqlite.programs import SQLitePrograms, SQLiteStatements
from .memories import (
    MemoryStatements,
    add_program,
    count_program,
    forget_program,
    forget_user_program,
    search_program,
)
from .programs import (
    Job,
    KeyDestroyed,
    OwnerChanged,
    Programs,
    event_from_row,
    session_from_row,
    shared_items,
)
from .runner import Program
from .schema import SEALED_TITLE_BYTES
from .search import fts_match, mysql_search_query, search_query
from .statements import Statements
from .translate import mysql_errno

if TYPE_CHECKING:
    from ..crypto import Keyring
    from ..sealing import DataKey, Envelope

__all__ = ["SQLStore"]

T = TypeVar("T")
# How many times a write seals again after finding its user's data key destroyed meanwhile.
_KEY_ATTEMPTS = 3

# Postgres: lock_not_available (lock_timeout ran out), deadlock_detected.
_LOCK_CONFLICTS = ("55P03", "40P01", "1205", "1213")
# Postgres: program_limit_exceeded (a json text past its 1 GB, or a jsonb value past 256 MB).
_TOO_LARGE = ("54000",)
# Postgres: undefined_function (``ds_search_text(json)`` missing: a downgraded schema).
_NO_FUNCTION = ("42883",)


def _guarded(
    org_id: str,
    session_id: str,
    expected_version: int | None,
    incarnation: str | None,
    *,
    after_seq: Any = NO_TRUNCATION,
    title: str | None = None,
) -> dict[str, Any]:
    """Check a guarded write to one session (``check_guarded``) and return the parameters
    its statements bind: the session's key, the guard, the time, and what it was given."""
    check_guarded(
        org_id, session_id, expected_version, incarnation, after_seq=after_seq, title=title or ""
    )
    params: dict[str, Any] = {
        "k_org": org_id, "k_id": session_id, "v_now": utcnow(),
        "v_expected": expected_version, "v_incarnation": incarnation,
    }  # fmt: skip
    if after_seq is not NO_TRUNCATION:
        params["k_after_seq"] = after_seq
    if title is not None:
        params["v_title"] = title
    return params


_NO_DISTRIBUTED_KEYRING = (
    "a keyring (encryption at rest) is not supported in distributed mode: its search index "
    "is a generated column of the content, which cannot read a blind index"
)


def _no_keyring(operation: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{operation} needs a store with a keyring (encryption at rest)")


def _sqlstate_in(exc: BaseException, codes: tuple[str, ...]) -> bool:
    """Whether a store error was caused by a Postgres error with one of these SQLSTATEs (or
    a MySQL error with one of these numbers)."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) in codes or str(mysql_errno(seen)) in codes:
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


_SEALED_NOTHING = {"k_key": None, "k_sealed_user": None, "k_sealed_app": None}
"""The parameters of an encrypted store's write of a session row that seals nothing."""


def _sealed_for(key: DataKey, user_id: str, app_name: str) -> dict[str, Any]:
    """The parameters of an encrypted store's write of a session row that seals with the
    user's data key ``key``, for the session of ``user_id`` and ``app_name``
    (``Statements.key_held``)."""
    return {"k_key": key.key_id, "k_sealed_user": user_id, "k_sealed_app": app_name}


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
        keyring: Encrypt at rest (``durable_sessions.crypto``; the ``crypto`` extra): titles,
            state values of every scope and events are stored sealed with data keys of the
            session's user (``app:`` state: of the app), which the keyring wraps (table
            ``ds_keys``); search reads a blind index. See ``docs/guides/encryption.md``.
            None (the default) stores plaintext; rows written so are read either way.

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
        keyring: Keyring | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise InvalidArgumentError(
                "SQLStore needs an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine)"
            )
        self._engine = engine
        self._owns_engine = False
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self.lock_timeout = check_timeout("lock_timeout", lock_timeout)
        if distributed and keyring is not None:
            raise InvalidArgumentError(_NO_DISTRIBUTED_KEYRING)
        ops = dialect_ops(engine.dialect.name, engine.dialect.driver)
        self._ops = ops
        self._sealed = keyring is not None
        self._chosen: Programs | None = None
        self._distributed: bool | None = None
        # Postgres: whether writes send search vectors (a plain ``search_vector`` column); None
        # until the first operation asks the database, with the mode (``_ready``).
        self._vectors: bool | None = None
        # Postgres: whether search reads contents in stored order (``ds_search_text(json)``);
        # set off by a search that finds no such function (a downgraded schema).
        self._stored_order = True
        self._wanted = distributed
        if ops.is_postgres:
            self._distributed = distributed
            if distributed:  # its writes never send vectors: nothing to ask
                self._choose(True, vectors=False)
                self._vectors = False
        elif distributed:
            raise InvalidArgumentError("distributed mode is for Postgres (Citus) only")
        elif ops.is_mysql:
            install_mysql_session(engine.sync_engine)
            self._chosen = MySQLPrograms(MySQLStatements(ops, engine.dialect, sealed=self._sealed))
            self._distributed = False
            self._vectors = None  # the first operation checks max_allowed_packet (_ready)
        else:
            install_sqlite_pragmas(engine.sync_engine, int(busy_timeout * 1000))
            statements = SQLiteStatements(ops, engine.dialect, blind=self._sealed)
            self._chosen = SQLitePrograms(statements)
            self._distributed = False
            self._vectors = False
        watch_connects(engine.sync_engine)
        self._runner = make_runner(engine)
        self._env: Envelope | None = None
        self._stepwise: Any = None  # with a keyring: the statements of sql/sealed.py
        # With a keyring: the owner (incarnation, user, app) of sessions this process read or
        # wrote, to choose their data key (see ``_owner``).
        self._owners: dict[tuple[str, str], tuple[str, str, str]] = {}
        if keyring is not None:
            from ..sealing import Envelope, Sealer
            from .keys import SQLKeyTable

            table = SQLKeyTable(
                lambda name, build: self._q.shape(name, build), self._runner.run, self._q.ops
            )
            self._env = Envelope(Sealer(keyring, table))

    @classmethod
    def from_url(
        cls, url: str, *, keyring: Keyring | None = None, **engine_options: Any
    ) -> SQLStore:
        """Create a store with an engine of its own, which ``close()`` disposes.

        ``url`` is an async URL or a plain ``sqlite://`` or ``postgresql://`` one, which gets
        its async driver (the URLs the command line and ``alembic`` accept). Engine options
        are passed to ``create_async_engine``; ``keyring`` to the store.

        Raises:
            InvalidArgumentError: The URL is not valid or names an unsupported database.
        """
        from .urls import async_url

        store = cls(create_async_engine(async_url(url), **engine_options), keyring=keyring)
        store._owns_engine = True
        return store

    @property
    def engine(self) -> AsyncEngine:
        """The engine the store runs on."""
        return self._engine

    @property
    def keyring(self) -> Keyring | None:
        """The keyring the store encrypts with; None when it stores plaintext."""
        return None if self._env is None else self._env.sealer.keyring

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
        if distributed:  # its writes never send vectors (Citus runs no trigger)
            self._chosen = make_distributed(self._ops, dialect)
        else:
            self._chosen = PostgresPrograms(
                PostgresStatements(self._ops, dialect, vectors=vectors, sealed=self._sealed)
            )
        self._distributed = distributed

    async def _ready(self, operation: str) -> None:
        """Decide on first use, once (every operation awaits this before it builds its
        program): Postgres asks the database for the mode (unless ``distributed`` said
        it) and whether ``ds_events.search_vector`` is a column writes fill; MySQL, in one
        read, for ``max_allowed_packet`` and (with a keyring) the title column's size."""
        if self._vectors is None and self._ops.is_mysql:
            programs = self._programs
            assert isinstance(programs, MySQLPrograms)
            sealed = self._env is not None  # titles sealed: is the column wide enough?
            limits = programs.limits(title=sealed)
            packet, width = await self._runner.run(limits, "read", operation)
            check_packet(packet, self.max_value_bytes)
            if width is not None and width < SEALED_TITLE_BYTES:
                raise SchemaNotMigratedError(
                    "a store with a keyring on MySQL stores sealed titles, which need "
                    "revision 0014: run `durable-sessions migrate` (or store.migrate())"
                )
            self._vectors = False
        elif self._vectors is None:
            found = await self._runner.run(detect_schema(self._engine.dialect), "read", operation)
            distributed = found.distributed if self._wanted is None else self._wanted
            self._choose(distributed, vectors=bool(found.vectors))
            # Without the table (not migrated yet) the next operation asks again.
            self._vectors = found.vectors
            self._stored_order = True
            if distributed and self._env is not None:
                raise InvalidArgumentError(_NO_DISTRIBUTED_KEYRING)

    async def close(self) -> None:
        """Dispose the engine if this store created it (``from_url``); otherwise do nothing."""
        if self._owns_engine:
            await self._engine.dispose()

    async def migrate(
        self,
        revision: str = "head",
        *,
        lock_timeout: float | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """Run the bundled Alembic migrations up to ``revision`` on this store's engine.

        Online on Postgres: the service may go on reading and writing meanwhile, and several
        processes may call it at once (they take turns; the later ones find nothing to do).

        Args:
            revision: The target revision id, or ``"head"``.
            lock_timeout: Seconds a migration statement waits for a table lock before it
                gives way and tries again, so that it never queues the service's queries
                behind a long transaction.
            progress: Called with each progress line of a long backfill.

        Raises:
            SchemaTooNewError: A newer durable-sessions migrated the database.
            StoreUnavailableError: The database could not be reached.
            ValueError: ``lock_timeout`` is not a positive number.
        """
        from .migrate import upgrade  # Alembic is imported only when migrating

        await upgrade(self._engine, revision, lock_timeout=lock_timeout, progress=progress)
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

    # -- encryption (with a keyring) -------------------------------------------------------------

    async def _opened(self, session: Session, *, with_state: bool = True) -> Session:
        """Open a session read from the database (its title and state), in place."""
        if self._env is not None:
            await self._env.open_session(session)
            if with_state:
                session.mark_persisted()
            self._remember_owner(session)
        return session

    async def _opened_events(
        self, org_id: str, session_id: str, events: builtins.list[Event]
    ) -> builtins.list[Event]:
        """Open events read from the database."""
        if self._env is None:
            return events
        return await self._env.open_events(org_id, session_id, events)

    def _remember_owner(self, session: Session) -> None:
        if len(self._owners) > 100_000:
            self._owners.clear()
        self._owners[(session.org_id, session.id)] = (
            session.incarnation,
            session.user_id,
            session.app_name,
        )

    async def _owner(
        self, org_id: str, session_id: str, incarnation: str | None
    ) -> tuple[str, str]:
        """The (user, app) of a session, whose data keys seal what is written to it.

        Known from this process's reads and writes of the session; read otherwise, and
        whenever the caller names another incarnation. An unguarded write (no incarnation)
        to an id deleted and made again for another owner since this process saw it finds
        the row changed hands in its own statement, and is sealed again for the owner read
        anew (``_sealed_write``).
        """
        known = self._owners.get((org_id, session_id))
        if known is not None and incarnation in (None, known[0]):
            return known[1], known[2]
        params = {"k_org": org_id, "k_id": session_id}
        rows = await self._runner.run(
            self._programs.rows(self._q.meta, params, session_from_row), "read", "owner"
        )
        if not rows:
            raise SessionNotFoundError(org_id, session_id)
        self._remember_owner(rows[0])
        return rows[0].user_id, rows[0].app_name

    async def _keys(
        self, org_id: str, user_id: str, app_name: str, with_app: bool
    ) -> tuple[DataKey, DataKey | None]:
        """The user's data key and, ``with_app``, the app's."""
        env = self._env
        assert env is not None
        user = await env.user_key(org_id, user_id)
        return user, (await env.app_key(org_id, app_name) if with_app else None)

    async def _session_keys(
        self, org_id: str, session_id: str, incarnation: str | None, with_app: bool
    ) -> tuple[str, str, DataKey, DataKey | None]:
        """The owner of a session and the data keys that seal what is written to it."""
        user_id, app_name = await self._owner(org_id, session_id, incarnation)
        user, app = await self._keys(org_id, user_id, app_name, with_app)
        return user_id, app_name, user, app

    async def _sealed_write(self, org_id: str, write: Callable[[], Awaitable[T]]) -> T:
        """Run a write that seals with a user's data key and names it (``k_key``).

        Another process's ``delete_user`` may have destroyed a key this process holds: what
        is sealed with it never opens again. Each such write checks, in its own statement
        or under the lock it writes under (``Statements.key_held``, ``Programs.check_key``),
        that the key is still in the key table, and writes nothing when it is not
        (``KeyDestroyed``: the user came back after the erasure, and the session is new or
        was made since); this process then forgets the key and the write seals again with
        the user's current key. Each also checks that the session row is still the user's
        and app's it sealed for (``k_sealed_user``, ``k_sealed_app``): an unguarded write to
        an id deleted and made again for another owner since this process learnt its owner
        writes nothing (``OwnerChanged``), and seals again for the owner read anew.
        """
        env = self._env
        assert env is not None
        for _ in range(_KEY_ATTEMPTS - 1):
            try:
                return await write()
            except KeyDestroyed as gone:
                env.sealer.destroyed(org_id, gone.key_id)
            except OwnerChanged as moved:
                self._owners.pop((moved.org_id, moved.session_id), None)
        return await write()

    async def _expected(self, org: str, app: str, user: str, delta: ScopedDelta) -> ScopedDelta:
        """A save's expected values of the shared keys it deletes (of the session's owner,
        ``user`` and ``app``), as stored.

        The statements compare a stored value with the expected one as stored text: each
        stored value equal (opened) to what the copy read is expected as it is stored; one
        that differs stays as read, which no sealed text equals (the save is stale).
        """
        env = self._env
        assert env is not None
        key = {"k_org": org, "k_app": app, "k_user": user}
        for scope, expected in (("user", delta.user_expected), ("app", delta.app_expected)):
            if not expected:
                continue
            stmt = self._q.user_values if scope == "user" else self._q.app_values
            program = self._programs.rows(stmt, {**key, "k_keys": sorted(expected)}, tuple)
            for name, value in await self._runner.run(program, "read", "update"):
                if scope == "user":
                    opened = (await env.open_user(org, app, user, [(name, value)]))[name]
                else:
                    opened = (await env.open_app(org, app, [(name, value)]))[name]
                if json_equal(opened, expected[name]):
                    expected[name] = value
        return delta

    # -- keys ------------------------------------------------------------------------------------

    async def rotate_keys(self) -> int:
        """Re-wrap every data key under the keyring's current master key; return how many.

        Only ``ds_keys`` changes (no sealed value is rewritten); afterwards the keyring's
        older master keys can be removed (``LocalKeyring.remove``). Run it after the
        keyring got a new current master key (``LocalKeyring.rotate()``, or the KMS's).

        Raises:
            InvalidArgumentError: the store has no keyring.
            DecryptionError: a data key does not unwrap (its master key is gone already).
        """
        if self._env is None:
            raise _no_keyring("rotate_keys")
        await self._ready("rotate_keys")
        return await self._env.sealer.rotate()

    async def reencrypt(self, *, new_keys: bool = True, batch: int = 500) -> int:
        """Move every row to the current data key of its user (or app); return how many
        rows were rewritten.

        With ``new_keys`` (the default), every user and app that owns data gets a new data
        key first, so that every row moves; without, rows move to the keys that are current
        (resuming a run that was stopped, or sealing what was written before the store had
        a keyring). Long-term memories move too. Online: each table is walked by primary
        key in batches of ``batch`` rows, each written in a short transaction that skips a
        row written meanwhile; a run can be stopped and run again. The organisation's blind
        index key stays.

        Raises:
            InvalidArgumentError: the store has no keyring, or ``batch`` is not positive.
            DecryptionError: a stored value does not decrypt (the message names its table
                and row).
        """
        if self._env is None:
            raise _no_keyring("reencrypt")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgumentError(f"batch must be a positive integer, not {batch!r}")
        from ..sealing import APP, USER
        from .reseal import Resealer

        await self._ready("reencrypt")
        env = self._env
        resealer = Resealer(
            env,
            lambda n, b: self._q.shape(n, b),
            self._runner.run,
            self._ops,
            batch,
            self._memory_q,
        )
        if new_keys:
            users, apps = await resealer.scopes()
            for org_id, user_id in users:
                await env.sealer.new_key(org_id, USER, user_id)
            for org_id, app_name in apps:
                await env.sealer.new_key(org_id, APP, app_name)
        moved = await resealer.sessions()
        moved += await resealer.events()
        moved += await resealer.shared(USER)
        moved += await resealer.shared(APP)
        moved += await resealer.memories()
        # SQLite: the plaintext words of the events sealed now leave the full-text index's
        # segments, and the old pages the log (as after an erasure).
        await self._erase_traces("reencrypt", "", moved, moved)
        return moved

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
        env = self._env
        if env is None:
            user, app = await self._run(self._programs.create(row, delta), "create")
        else:
            org, sid, app_name, user_id = (
                session.org_id,
                session.id,
                session.app_name,
                session.user_id,
            )

            async def write() -> tuple[Any, Any]:
                keys = await self._keys(org, user_id, app_name, bool(delta.app_set))
                stored = env.seal_changes(*keys, org, sid, app_name, user_id, delta)
                sealed = {
                    **row, "k_key": keys[0].key_id, "state": stored.private_set,
                    "title": env.seal_title(keys[0], org, sid, session.title),
                }  # fmt: skip
                return await self._run(self._programs.create(sealed, stored), "create")

            user, app = await self._sealed_write(org, write)
            user = (await env.open_user(org, app_name, user_id, user)).items()
            app = (await env.open_app(org, app_name, app)).items()
        temp = {k: v for k, v in session.state.items() if scope_of(k) == "temp"}
        session.state = {**merge_state(delta.private_set, user, app), **temp}
        session.created_at = session.updated_at = now
        session.message_count = session.token_total = 0
        session.version = 1
        session.incarnation = str(row["incarnation"])
        session.mark_persisted()
        if env is not None:
            self._remember_owner(session)
        return session

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a session with its private and shared state merged into ``state``."""
        check_session(org_id, session_id)
        await self._ready("get")
        session = await self._runner.run(self._programs.get(org_id, session_id), "read", "get")
        return await self._opened(session)

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
            session = await self._run(self._programs.get_with_events(shape, params), "get")
        except StoreError as exc:
            if not _sqlstate_in(exc, _TOO_LARGE):
                raise
            # Postgres builds the transcript as one json text, which cannot pass 1 GB: a
            # larger one is read as rows instead (whatever list_events returns, this
            # returns). The session and its events are then two statements, not one snapshot.
            session = await self._run(self._programs.session_then_events(shape, params), "get")
        session.events = await self._opened_events(org_id, session_id, session.events)
        return await self._opened(session)

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
        if self._env is not None:  # the events are opened one by one: as get_with_events
            session = await self.get_with_events(org_id, session_id, limit=limit, after=after)
            text, session.events = events_json(session.events), []
            return session, text
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
        env = self._env
        if env is None:
            session.version = await self._run(self._programs.update(params, delta), "update")
        else:
            org, sid = session.org_id, session.id

            async def write() -> int:
                # Sealed for the stored owner, not the copy's: a copy whose user_id or
                # app_name was edited writes where the session belongs, as without a keyring.
                user_id, app_name, user, app = await self._session_keys(
                    org, sid, session.incarnation, bool(delta.app_set)
                )
                stored = env.seal_changes(user, app, org, sid, app_name, user_id, delta)
                if stored.user_expected or stored.app_expected:
                    stored = await self._expected(org, app_name, user_id, stored)
                private = cast("dict[str, Any]", params["v_state"])
                sealed = {
                    **params, **_sealed_for(user, user_id, app_name),
                    "v_title": env.seal_title(user, org, sid, session.title),
                    "v_state": env.seal_private(user, org, sid, private),
                }  # fmt: skip
                return await self._run(self._programs.update(sealed, stored), "update")

            session.version = await self._sealed_write(org, write)
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
        self._owners.pop((org_id, session_id), None)

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
        found = await self._runner.run(program, "read", "list")
        for session in found if self._env is not None else ():
            await self._opened(session, with_state=filter.with_state)
        return found

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
        text = await self._runner.run(self._programs.listing_json(stmt, params), "read", "list")
        env = self._env
        if env is None:
            return text
        org, listing = filter.org_id, loads_json(text)
        assert isinstance(listing, dict)
        for row in listing["sessions"]:
            row[6] = await env.open_private(org, row[0], row[6])
        for row in listing["users"]:
            row[2] = await env.open_user(org, row[0], row[1], row[2].items())
        for row in listing["apps"]:
            row[1] = await env.open_app(org, row[0], row[1].items())
        return to_json(listing)

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
        for session in found if self._env is not None else ():
            await self._opened(session, with_state=filter.with_state)
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
        params = _guarded(org_id, session_id, expected_version, incarnation)
        stored, delta = prepare_event(event, self.max_value_bytes)
        params["v_tokens"] = stored.tokens
        await self._ready("append_event")
        if self._env is None:
            stored.seq = await self._with_vectors(
                lambda: self._programs.append(params, stored, delta), "append_event"
            )
            return stored

        async def write() -> int:
            sealed, sealed_delta, _ = await self._seal_events(params, incarnation, [stored], delta)
            return await self._with_vectors(
                lambda: self._programs.append(params, sealed[0], sealed_delta), "append_event"
            )

        stored.seq = await self._sealed_write(org_id, write)
        return stored

    async def _seal_events(
        self,
        params: dict[str, Any],
        incarnation: str | None,
        events: builtins.list[Event],
        delta: ScopedDelta,
    ) -> tuple[builtins.list[Event], ScopedDelta, DataKey]:
        """Events and their delta as stored, sealed with the session owner's keys, and the
        user's data key, which the write's ``params`` name (``k_key``)."""
        env = self._env
        assert env is not None
        org_id, session_id = params["k_org"], params["k_id"]
        user_id, app_name, user, app = await self._session_keys(
            org_id, session_id, incarnation, bool(delta.app_set)
        )
        params.update(_sealed_for(user, user_id, app_name))
        index = await env.sealer.index_key(org_id)
        sealed: builtins.list[Event] = [
            env.seal_event(user, org_id, session_id, e, index.blind(e.content)) for e in events
        ]
        stored = env.seal_changes(user, app, org_id, session_id, app_name, user_id, delta)
        return sealed, stored, user

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
        return await self._opened_events(org_id, session_id, found)

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
        env = self._env
        if env is not None:
            params.update(_SEALED_NOTHING)  # without a title
        if env is None or not title:
            found = await self._runner.run(self._programs.touch(params), "atomic", "touch")
        else:

            async def write() -> Session:
                user_id, app_name, key, _ = await self._session_keys(
                    org_id, session_id, incarnation, False
                )
                sealed_title = env.seal_title(key, org_id, session_id, title)
                sealed = {
                    **params, **_sealed_for(key, user_id, app_name), "v_title": sealed_title,
                }  # fmt: skip
                return await self._runner.run(self._programs.touch(sealed), "atomic", "touch")

            found = await self._sealed_write(org_id, write)
        return await self._opened(found, with_state=False)

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
        if self._env is not None:
            return await self._fork_sealed(params)
        return await self._with_vectors(lambda: self._programs.fork(params), "fork")

    async def _fork_sealed(self, params: dict[str, Any]) -> Session:
        """A fork with a keyring: one write transaction that opens the parent's values
        and seals them for the child (``sql/sealed.py``)."""
        from ..sealing import USER
        from .sealed import sealed_fork, sealed_fork_statements

        env = self._env
        assert env is not None
        org_id = params["k_org"]
        user_id, _ = await self._owner(org_id, params["k_id"], None)
        keys = await env.sealer.scope_keys(org_id, USER, user_id)
        current = await env.user_key(org_id, user_id)
        index = await env.sealer.index_key(org_id)
        if self._stepwise is None:
            own = None if self._ops.is_postgres else self._q  # SQLite's or MySQL's
            self._stepwise = sealed_fork_statements(self._ops, self._engine.dialect, own)
        statements = self._stepwise
        job = sealed_fork(statements, params, keys, current, index)
        return await self._opened(await self._run(job, "fork"))

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
            return await self._count_doomed("purge", params)
        deleted = await self._delete_all("purge", params)
        await self._erase_traces("purge", org_id, deleted)
        return deleted

    async def delete_user(self, org_id: str, user_id: str, *, dry_run: bool = False) -> int:
        """Erase a user's sessions, events and ``user:`` state in one organisation.

        Every session of the user that exists when it starts is deleted: sessions that
        concurrent writers hold are waited for (up to ``lock_timeout`` in all), never
        skipped. Sessions of the user created while it runs (by a create or a fork) are
        erased too, as it goes on until a pass finds none left; the ``user:`` state goes in
        that last pass. Only a session created after that pass survives: stop the user's
        traffic first for an erasure nothing can follow. With ``dry_run``, nothing is
        deleted: the count is of the sessions it would delete now (as ``purge``'s).

        What leaves the disk, and when:

        - SQLite: nothing of what it removed is left in the database file or its
          write-ahead log when it returns. The store's connections overwrite freed bytes
          with zeros (``PRAGMA secure_delete``), the full-text index is merged so that the
          removed words leave its segments (one merge of the whole index, after the
          deletes), and the log is checkpointed and truncated. A file written before
          without ``secure_delete`` (by an older version, or another program) may still
          hold bytes freed back then: ``VACUUM`` it once.
        - Postgres: the rows are gone for every query at commit, but their bytes stay in
          the table, TOAST and index pages until those are reused, and in the write-ahead
          log, its archive and backups until those are recycled or expire. ``VACUUM``
          (autovacuum) only marks the space free; ``VACUUM FULL`` (an exclusive lock) or
          ``pg_repack`` rewrite the tables into new files, and the old files' blocks are
          then the filesystem's. See ``docs/guides/erasure.md``.

        Raises:
            DeletionIncompleteError: writers held, or kept creating, sessions of the user
                past ``lock_timeout``, or (SQLite) readers kept the write-ahead log from
                being emptied that long; what was deleted stays deleted, and running it
                again finishes the erasure.
        """
        check_delete_user(org_id, user_id)
        params = {"k_org": org_id, "k_user": user_id}
        if dry_run:
            return await self._count_doomed("delete_user", params)
        await self._ready("delete_user")
        deleted, forgotten = await self._delete_user_rows(params)
        if self._env is not None:  # crypto-shredding: every copy of the rows is noise now
            from ..sealing import USER

            await self._env.sealer.forget(org_id, USER, user_id)
            self._owners.clear()
            # Rows written for the user meanwhile were sealed with the keys just destroyed:
            # they go too, rather than stay unreadable.
            late, late_memories = await self._delete_user_rows(params)
            deleted, forgotten = deleted + late, forgotten + late_memories
        await self._erase_traces("delete_user", org_id, deleted, forgotten)
        return deleted

    async def _delete_user_rows(self, params: dict[str, Any]) -> tuple[int, int]:
        """Delete a user's sessions (with their events), user state and memories; return
        how many sessions and memories."""
        deleted = await self._delete_all("delete_user", params, self._q.drop_user_state)
        program = forget_user_program(self._memory_q, params)
        return deleted, await self._runner.run(program, "write", "delete_user")

    async def count_user_memories(self, org_id: str, user_id: str) -> int:
        """Return how many long-term memories the user has in the organisation, over every
        app: what ``delete_user`` erases beside the user's sessions."""
        check_delete_user(org_id, user_id)
        await self._ready("count_user_memories")
        params = {"k_org": org_id, "k_user": user_id}
        program = count_program(self._memory_q.count_user, params)
        return await self._runner.run(program, "read", "count_user_memories")

    async def count_user_state(self, org_id: str, user_id: str) -> int:
        """Return how many ``user:`` keys the user has in the organisation, over every app:
        what ``delete_user`` erases beside the user's sessions."""
        check_delete_user(org_id, user_id)
        await self._ready("count_user_state")
        params = {"k_org": org_id, "k_user": user_id}
        program = self._programs.count(self._q.count_user_state, params)
        return await self._runner.run(program, "read", "count_user_state")

    async def _count_doomed(self, kind: str, params: dict[str, Any]) -> int:
        """The sessions a ``purge`` or ``delete_user`` would delete now."""
        await self._ready(kind)
        count = self._programs.count(self._q.retention(kind).remaining, params)
        return await self._runner.run(count, "read", kind)

    async def _erase_traces(self, kind: str, org_id: str, deleted: int, forgotten: int = 0) -> None:
        """SQLite: leave nothing of what an erasure removed in the file or its log.

        The rows' bytes were zeroed as they were freed (``secure_delete``); the full-text
        index still holds the removed events' words until its segments merge (merged here
        when sessions were deleted), and the write-ahead log holds the pages as they were
        before (copied back and truncated here; a reader still on an old page is waited
        for, up to ``lock_timeout``). Postgres keeps no such promise (see ``delete_user``).
        """
        programs = self._programs
        if not isinstance(programs, SQLitePrograms):
            return
        if deleted:
            await self._run(programs.merge_search_index(), kind)
        if forgotten:
            await self._run(programs.merge_memory_index(), kind)
        deadline = time.monotonic() + self.lock_timeout
        while not await self._run(programs.checkpoint(), kind):
            if time.monotonic() >= deadline:
                raise DeletionIncompleteError(
                    kind, org_id, deleted, 0,
                    reason="readers kept the write-ahead log, which still holds the erased "
                    "pages, from being emptied",
                )  # fmt: skip
            await asyncio.sleep(0.05)

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` and ``app:`` state of (app, user), prefixed, in one statement."""
        validate_id("org_id", org_id)
        validate_id("app_name", app_name, allow_empty=True)
        validate_id("user_id", user_id)
        params = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        await self._ready("get_shared_state")
        program = self._programs.rows(self._q.shared, params, lambda row: row)
        (row,) = await self._runner.run(program, "read", "get_shared_state")
        shared = merge_state({}, *shared_items(row.user_state, row.app_state))
        if self._env is not None:
            shared = await self._env.open_state(org_id, "", app_name, user_id, shared)
        return shared

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
        params = _guarded(org_id, session_id, expected_version, incarnation, title=title)
        prepared = [prepare_event(event, self.max_value_bytes) for event in events]
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
        env = self._env
        if env is None:
            last = await self._with_vectors(
                lambda: self._programs.append_many(params, stored, delta), "append_events"
            )
        else:

            async def write() -> int:
                kept, sealed_delta, key = await self._seal_events(
                    params, incarnation, stored, delta
                )
                params["v_title"] = env.seal_title(key, org_id, session_id, title)
                return await self._with_vectors(
                    lambda: self._programs.append_many(params, kept, sealed_delta),
                    "append_events",
                )

            last = await self._sealed_write(org_id, write)
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
        params = _guarded(org_id, session_id, expected_version, incarnation, after_seq=after_seq)
        await self._ready("truncate_events")
        try:
            for job in self._programs.truncate(params):
                removed = await self._run(job, "truncate_events")
                if removed is not None:
                    return await self._opened_events(org_id, session_id, removed)
        except StoreError as exc:
            # Postgres returns the removed events as one json text, which cannot pass 1 GB:
            # past it, nothing was written, and the truncation runs again in steps that
            # read them as rows (as SQLite's does).
            in_steps = self._programs.truncate_rows(params)
            if in_steps is None or not _sqlstate_in(exc, _TOO_LARGE):
                raise
            removed = await self._run(in_steps, "truncate_events")
            return await self._opened_events(org_id, session_id, removed)
        raise AssertionError("the last truncation job always answers")  # pragma: no cover

    async def discard_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> int:
        """Remove the events after ``after_seq``; return how many (see ``Store``).

        One write transaction: the session row locked (Postgres), the removed events
        counted and their tokens summed in SQL, deleted, and the counters moved; no event
        is read, so its memory is the same for ten events or a million.
        """
        params = _guarded(org_id, session_id, expected_version, incarnation, after_seq=after_seq)
        await self._ready("discard_events")
        return await self._run(self._programs.discard(params), "discard_events")

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
        params = _guarded(org_id, session_id, expected_version, incarnation)
        await self._ready("pop_event")
        for job in self._programs.pop(params):
            removed = await self._run(job, "pop_event")
            if removed is not None:
                removed = await self._opened_events(org_id, session_id, removed)
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
        if self._env is not None:  # each content opened with its event's id: read the events
            return [e.content for e in await self.list_events(org_id, session_id, limit=limit)]
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
        return [] if whole is None else loads_json(whole)

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
        wanted = check_search(org_id, text, user_id, app_name, session_id, limit)
        shape = (user_id is not None, app_name is not None, session_id is not None)
        await self._ready("search")
        postgres = self._ops.is_postgres
        if self._env is not None:  # the blind index: the words' keyed hashes
            index = await self._env.sealer.index_key(org_id)
            text = " ".join(index.term(word) for word in wanted)
        params = {
            "k_org": org_id, "k_text": text, "k_match": "" if postgres else fts_match(text),
            "k_user": user_id, "k_app": app_name, "k_session": session_id, "k_limit": limit,
        }  # fmt: skip
        if self._ops.is_mysql:
            wanted = sorted({fold(word) for word in query_words(text)})
            params["k_words"] = wanted  # type: ignore[assignment]
            params["k_count"] = len(wanted)
            stmt = self._q.shape(("search", *shape), partial(mysql_search_query, *shape))
            program = self._programs.rows(stmt, params, _hit_from_row)
            return await self._opened_hits(
                org_id, await self._runner.run(program, "read", "search")
            )
        while True:
            ordered = self._stored_order
            build = partial(search_query, postgres, *shape, stored_order=ordered)
            stmt = self._q.shape(("search", ordered, *shape), build)
            program = self._programs.rows(stmt, params, _hit_from_row)
            try:
                hits = await self._runner.run(program, "read", "search")
                return await self._opened_hits(org_id, hits)
            except (StoreError, SchemaNotMigratedError) as exc:
                # A schema without ``ds_search_text(json)`` (downgraded since the store
                # looked): search as it reads contents, cast to jsonb.
                if not (postgres and ordered and _sqlstate_in(exc, _NO_FUNCTION)):
                    raise
                self._stored_order = False

    async def _opened_hits(
        self, org_id: str, hits: builtins.list[SearchHit]
    ) -> builtins.list[SearchHit]:
        """Open the events of search hits read from the database."""
        if self._env is None:
            return hits
        open_ = self._env.open_event
        return [SearchHit(h.session_id, await open_(org_id, h.session_id, h.event)) for h in hits]

    # -- long-term memory ------------------------------------------------------------------------

    @property
    def _memory_q(self) -> MemoryStatements:
        return MemoryStatements(self._q, self._ops.is_postgres, bool(self._distributed))

    def _memory_write(self, make: Callable[[], Program[T]]) -> Program[T]:
        """A write of memories; on MySQL run again after a deadlock or a lock wait timeout
        (the user's row lock of ``ds_memory_terms`` is taken by an upsert)."""
        return retried(make) if self._ops.is_mysql else make()

    async def add_memories(
        self, org_id: str, app_name: str, user_id: str, memories: builtins.list[Memory]
    ) -> builtins.list[Memory]:
        """Add memories of a user in one transaction; those whose id the user has are
        skipped (see ``Store``)."""
        check_owner(org_id, app_name, user_id)
        prepared = prepare_memories(memories, self.max_value_bytes)
        if not prepared:
            return []
        await self._ready("add_memories")
        owner = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        env = self._env
        if env is None:
            program = self._memory_write(lambda: add_program(self._memory_q, owner, prepared))
            return await self._runner.run(program, "write", "add_memories")
        key = await env.user_key(org_id, user_id, verify=True)  # erased elsewhere since?
        index = await env.sealer.index_key(org_id)
        sealed: builtins.list[Memory] = [
            env.seal_memory(key, index, org_id, app_name, user_id, m) for m in prepared
        ]
        program = self._memory_write(lambda: add_program(self._memory_q, owner, sealed))
        added = {m.id for m in await self._runner.run(program, "write", "add_memories")}
        return [m for m in prepared if m.id in added]

    async def search_memories(
        self, org_id: str, app_name: str, user_id: str, text: str, *, limit: int = 20
    ) -> builtins.list[Memory]:
        """Return the user's memories sharing a word with ``text``, best first (see
        ``Store``): two statements over the full-text index (GIN on Postgres, FTS5 on
        SQLite), the user's term counts and then the ranked memories."""
        terms = check_memory_search(org_id, app_name, user_id, text, limit)
        if not terms:
            return []
        await self._ready("search_memories")
        owner = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        env = self._env
        if env is not None:  # the blind index: the terms' keyed hashes
            index = await env.sealer.index_key(org_id)
            terms = [index.term(term) for term in terms]
        program = search_program(self._memory_q, owner, terms, limit)
        found = await self._runner.run(program, "read", "search_memories")
        if env is None:
            return found
        return await env.open_memories(org_id, app_name, user_id, found)

    async def delete_memories(
        self, org_id: str, app_name: str, user_id: str, *, memory_id: str | None = None
    ) -> int:
        """Delete one memory of the user, or all of them in that app; return how many."""
        check_owner(org_id, app_name, user_id)
        owner = {"k_org": org_id, "k_app": app_name, "k_user": user_id}
        if memory_id is not None:
            validate_id("memory_id", memory_id)
        await self._ready("delete_memories")
        program = self._memory_write(lambda: forget_program(self._memory_q, owner, memory_id))
        return await self._runner.run(program, "write", "delete_memories")


def _hit_from_row(row: Any) -> SearchHit:
    return SearchHit(row.session_id, event_from_row(row))
