"""Copy a database written by Google ADK's ``DatabaseSessionService`` into durable-sessions.

``import_adk(source, store, org_id=...)`` reads ADK's current schema (tables ``sessions``,
``events``, ``app_states`` and ``user_states``, schema version 1: JSON, never pickle) and
writes, in one transaction of the target, all or nothing:

* every ADK session ``(app, user, id)`` as the durable session
  ``durable_session_id(app, user, id)``, with its private state, its creation and update
  times, and its events in the order ADK returns them (timestamp, then id), each stored as
  ``DurableSessionService.append_event`` stores it;
* every ``app:`` and ``user:`` key of ADK's state tables as a shared-state row.

Afterwards ``DurableSessionService`` returns the same sessions, events, state and update
times from every call that ADK's service returned. The source is only read (a SQLite file is
opened read-only). Memory stays flat, whatever the number or size of events: sessions are
read in pages; events are streamed without their data, which is read in batches of at most
BATCH_BYTES (or one event); rows are written in batches of at most BATCH_SIZE rows and
BATCH_BYTES. A second import of the same data is refused at the first
session or state key that already exists; nothing is written, so a failed or interrupted
import can simply be run again.

ADK's legacy schema (version 0, events pickled) is refused without unpickling anything: run
ADK's ``adk migrate session`` first and import its output.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from google.adk.events.event import Event as AdkEvent
from pydantic import ValidationError
from sqlalchemy import (
    Column,
    ColumnElement,
    DateTime,
    Dialect,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    bindparam,
    cast,
    func,
    inspect,
    make_url,
    select,
    tuple_,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL, Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.types import TypeEngine

from ...errors import InvalidArgumentError, SessionError
from ...model import new_id
from ...prepare import check_timestamp, timestamp_from_seconds
from ...sql.loader import Keyset, Loader, RowExistsError, text_size
from ...sql.schema import app_state, events, sessions, user_state
from ...sql.store import SQLStore
from ...sql.transactions import write_transaction
from ...sql.translate import translated
from ...state import (
    APP_PREFIX,
    MAX_DEPTH,
    USER_PREFIX,
    scope_of,
    validate_id,
    validate_key,
    validate_value,
)
from .records import durable_session_id, to_record

__all__ = ["AdkImportCounts", "AdkImportError", "import_adk"]

PAGE_SIZE = 500
"""ADK sessions (or state rows) read per page; their events are streamed."""
BATCH_SIZE = 500
"""Rows inserted per statement, and events read per batch, at most."""
BATCH_BYTES = 8 << 20
"""Event data read per batch, and written per statement, at most (as JSON text; an event
larger than this alone): memory does not grow with the size of events
(tests/adapters/test_adk_import.py)."""

_ASYNC = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "mysql": "mysql+asyncmy",
    "mariadb": "mariadb+asyncmy",
}
_MIGRATE_FIRST = (
    "it uses ADK's legacy schema, which pickles events; convert it first with ADK's own "
    "`adk migrate session --source_db_url SOURCE --dest_db_url NEW`, then import NEW"
)


class AdkImportError(SessionError):
    """Raised when an ADK database cannot be imported; nothing was written."""


@dataclass
class AdkImportCounts:
    """What an import wrote."""

    sessions: int = 0
    events: int = 0
    user_state: int = 0
    app_state: int = 0


# -- ADK's schema, version 1 (google-adk's sessions/schemas/v1.py) ----------------------------


class _AdkJSON(TypeDecorator[Any]):
    """ADK's ``DynamicJSON``: JSONB on Postgres, JSON text elsewhere."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(Text())

    def column_expression(self, colexpr: ColumnElement[Any]) -> ColumnElement[Any]:
        # Read as text and decoded by _JSONText, not by the driver (asyncpg decodes jsonb),
        # so that a value that does not decode names its row (see _object).
        return cast(colexpr, _JSONText())


class _JSONText(TypeDecorator[Any]):
    """JSON read as text and decoded here: a text that does not decode (malformed, nested
    too deeply) becomes an ``_Undecodable``, never an error raised while rows are fetched."""

    impl = Text
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, (str, bytes)):
            return _decoded(value)
        return value


class _Undecodable:
    """A JSON value of the source that does not decode: the row holding it is refused,
    by name, in one line (``_object``)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decoded(text: str | bytes) -> Any:
    """The value of a JSON text of the source, or an ``_Undecodable`` saying why not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return _Undecodable(f"not valid JSON ({exc.msg} at character {exc.pos})")
    except RecursionError:
        # json gives up on nesting deeper than Python's recursion limit; no value durable
        # sessions stores is nested deeper than MAX_DEPTH.
        return _Undecodable(f"JSON nested too deeply (at most {MAX_DEPTH} levels are stored)")
    except ValueError as exc:  # bytes that are not UTF-8, say
        return _Undecodable(f"not JSON text ({exc})")


class _AdkTime(TypeDecorator[datetime]):
    """ADK's ``PreciseTimestamp``: a datetime, or a number of seconds since the epoch (as
    ADK's ``SqliteSessionService`` writes the same tables), which ADK reads as UTC."""

    impl = DateTime
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any]:
        parse = self.impl_instance.result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            # Numbers stay numbers, and a text that is no time stays text: _when converts
            # and checks them, naming the row they belong to.
            if isinstance(value, (int, float)) or value is None or parse is None:
                return value
            try:
                return parse(value)
            except (ValueError, TypeError):
                return value

        return process


_adk = MetaData()
_KEY = String(128)
_sessions = Table(
    "sessions",
    _adk,
    Column("app_name", _KEY, primary_key=True),
    Column("user_id", _KEY, primary_key=True),
    Column("id", _KEY, primary_key=True),
    Column("state", _AdkJSON),
    Column("create_time", _AdkTime),
    Column("update_time", _AdkTime),
)
_events = Table(
    "events",
    _adk,
    Column("id", _KEY, primary_key=True),
    Column("app_name", _KEY, primary_key=True),
    Column("user_id", _KEY, primary_key=True),
    Column("session_id", _KEY, primary_key=True),
    Column("invocation_id", String(256)),
    Column("timestamp", _AdkTime),
    Column("event_data", _AdkJSON),
)
_app_states = Table(
    "app_states",
    _adk,
    Column("app_name", _KEY, primary_key=True),
    Column("state", _AdkJSON),
    Column("update_time", _AdkTime),
)
_user_states = Table(
    "user_states",
    _adk,
    Column("app_name", _KEY, primary_key=True),
    Column("user_id", _KEY, primary_key=True),
    Column("state", _AdkJSON),
    Column("update_time", _AdkTime),
)
_metadata = Table("adk_internal_metadata", _adk, Column("key", _KEY), Column("value", Text))


def _when(name: str, value: Any) -> datetime:
    """A time of the source as a stored timestamp: ADK keeps naive UTC datetimes (and reads
    them as UTC), or seconds since the epoch; None (never written) is now.

    Raises:
        InvalidArgumentError: it is no time, or is out of the stored range
            (``prepare.check_timestamp``).
    """
    if value is None:
        return datetime.now(timezone.utc)
    if isinstance(value, datetime):
        aware = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
        return check_timestamp(name, aware)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timestamp_from_seconds(name, value)
    raise InvalidArgumentError(f"{name} {value!r} is not a time")


# -- the source -----------------------------------------------------------------------------


def _masked(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _source_url(source: str | URL) -> URL:
    """The async URL to read ``source`` through, refusing what cannot be an ADK database."""
    try:
        url = make_url(source)
    except (sa_exc.ArgumentError, ValueError):
        raise AdkImportError(
            "the ADK database URL is not valid; expected e.g. sqlite:///sessions.db or "
            "postgresql://user@host/db"
        ) from None
    backend = url.get_backend_name()
    if backend not in _ASYNC:
        raise AdkImportError(
            f"cannot import an ADK database on {backend!r}: SQLite, Postgres and MySQL "
            "(MariaDB) are supported"
        )
    url = url.set(drivername=_ASYNC[backend])
    if backend == "sqlite":
        name = url.database or ""
        if not name or name == ":memory:" or name.startswith("file:"):
            raise AdkImportError("the ADK database must be a SQLite file (a path in the URL)")
        path = Path(name)
        if not path.is_file():
            raise AdkImportError(f"there is no ADK database file {name!r}")
        # Read-only: an import never changes (or creates) its source.
        where = quote(str(path.resolve()))
        url = url.set(database=f"file:{where}", query={"uri": "true", "mode": "ro"})
    return url


@contextmanager
def _from_source(where: str) -> Iterator[None]:
    """Report the source's database errors as one line naming it (never a password)."""
    try:
        yield
    except SessionError:
        raise  # the target's errors, already translated, and this module's own
    except Exception as exc:
        # ValueError, TypeError: a value read that is not what ADK's schema says (JSON
        # text that is not JSON, a time that is not a time), which ADK cannot read either.
        known = isinstance(exc, (sa_exc.SQLAlchemyError, OSError, ValueError, TypeError))
        if known or type(exc).__module__.startswith(("asyncpg", "asyncmy", "sqlite3", "aiosqlite")):
            raise AdkImportError(f"cannot read the ADK database at {where}: {_why(exc)}") from None
        raise


@asynccontextmanager
async def _reading(source: str | URL | AsyncEngine) -> AsyncIterator[_Source]:
    """The source inside one read-only snapshot, its schema checked."""
    if isinstance(source, AsyncEngine):
        engine, owned, where = source, False, _masked(source.url)
    else:
        url = _source_url(source)
        engine, owned, where = create_async_engine(url), True, _masked(url)
    try:
        with _from_source(where):
            conn = await engine.connect()
        try:
            with _from_source(where):
                if conn.dialect.name == "postgresql":
                    await conn.execution_options(isolation_level="REPEATABLE READ")
                    await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                elif conn.dialect.name in ("mysql", "mariadb"):
                    await conn.execution_options(isolation_level="REPEATABLE READ")
                    await conn.exec_driver_sql(
                        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"
                    )
                else:
                    await conn.exec_driver_sql("BEGIN")  # one snapshot of the file
                await _check_schema(conn, where)
            yield _Source(conn, where)
        finally:
            with _from_source(where):
                await conn.close()
    finally:
        if owned:
            await engine.dispose()


@dataclass
class _Source:
    conn: AsyncConnection
    where: str

    def errors(self) -> Any:
        """A block whose database errors are the source's."""
        return _from_source(self.where)


def _why(exc: BaseException) -> str:
    while exc.__cause__ is not None and not str(exc).strip():
        exc = exc.__cause__
    cause = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return text


async def _check_schema(conn: AsyncConnection, where: str) -> None:
    """Refuse a database that is not ADK's, or is in ADK's legacy (pickle) schema."""

    def tables(sync: Any) -> dict[str, set[str]]:
        found = inspect(sync)
        names = set(found.get_table_names())
        return {name: {c["name"] for c in found.get_columns(name)} for name in names}

    found = await conn.run_sync(tables)
    if "adk_internal_metadata" in found:
        stmt = select(_metadata.c.value).where(_metadata.c.key == "schema_version")
        version = (await conn.execute(stmt)).scalar()
        if version == "1":
            missing = {"sessions", "events", "app_states", "user_states"} - set(found)
            if missing:
                raise AdkImportError(f"the ADK database at {where} lacks {sorted(missing)}")
            return
        if version == "0":
            raise AdkImportError(f"cannot import the ADK database at {where}: {_MIGRATE_FIRST}")
        raise AdkImportError(
            f"the ADK database at {where} has schema version {version!r}; this import reads "
            "version 1 (google-adk 1.x and 2.x)"
        )
    legacy = found.get("events", set())
    if "actions" in legacy and "event_data" not in legacy:
        raise AdkImportError(f"cannot import the ADK database at {where}: {_MIGRATE_FIRST}")
    # No metadata, and events kept as JSON: ADK reads it as its current schema (a file of
    # ADK's SqliteSessionService, say, which writes the same tables).
    if "event_data" in legacy and {"sessions", "app_states", "user_states"} <= set(found):
        return
    raise AdkImportError(f"{where} is not a database of ADK's DatabaseSessionService")


# -- conversion -----------------------------------------------------------------------------


class _RefusedValue(AdkImportError, InvalidArgumentError):
    """An ``AdkImportError`` for a value of the source durable-sessions cannot store (a
    time out of range, JSON that does not decode): an ``InvalidArgumentError`` as well, as
    the same value given to a store would raise."""


def _refuse(what: str, reason: str) -> AdkImportError:
    return _RefusedValue(f"cannot import {what}: {reason}; nothing was imported")


def _object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object of the source (NULL: an empty one).

    Raises:
        InvalidArgumentError: it is another JSON value, which ADK cannot read either.
    """
    if value is None:
        return {}
    if isinstance(value, _Undecodable):
        raise InvalidArgumentError(f"{what} is {value.reason}")
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} is not a JSON object but {type(value).__name__}")
    return value


def _session_row(org_id: str, row: Row[Any]) -> dict[str, Any]:
    what = f"ADK session {row.id!r} of user {row.user_id!r} in app {row.app_name!r}"
    try:
        validate_id("app_name", row.app_name, allow_empty=True)
        validate_id("user_id", row.user_id)
        durable_id = durable_session_id(row.app_name, row.user_id, row.id)
        validate_id("session id", durable_id)
        state = dict(_object(row.state, "its state"))
        for key, value in state.items():
            if scope_of(validate_key(key)) != "private":
                raise InvalidArgumentError(f"its state key {key!r} is not a session key")
            validate_value(key, value)
        created = _when("its create_time", row.create_time)
        updated = created if row.update_time is None else _when("its update_time", row.update_time)
    except InvalidArgumentError as exc:
        raise _refuse(what, str(exc)) from None
    return {
        "org_id": org_id, "id": durable_id, "user_id": row.user_id,
        "app_name": row.app_name, "title": "", "state": state, "parent_id": None,
        "created_at": created, "updated_at": updated,
        "message_count": 0, "token_total": 0, "event_seq": 0, "version": 1,
        "incarnation": new_id(),
    }  # fmt: skip


def _event_row(
    org_id: str, session: dict[str, Any], seq: int, row: Row[Any], event_data: Any
) -> dict[str, Any]:
    """The durable row of an ADK event (``row`` without its data, ``event_data``): the event
    as ADK returns it, stored as the adapter stores an appended one."""
    what = f"event {row.id!r} of ADK session {row.session_id!r} of user {row.user_id!r}"
    try:
        data = dict(_object(event_data, "its data"))
        # The column orders the events (and ADK reads it as a time): checked even when the
        # JSON has a timestamp, which is then the event's, as ADK reads it.
        column = _when("its timestamp", row.timestamp)
        if data.get("timestamp") is None:
            data["timestamp"] = column.timestamp()
        event = AdkEvent.model_validate(
            {**data, "id": row.id, "invocation_id": row.invocation_id or ""}
        )
        record = to_record(event)
        validate_id("author", record.author, allow_empty=True)
        validate_id("invocation_id", record.invocation_id, allow_empty=True)
        validate_value("<event content>", record.content)
        for key, value in record.state_delta.items():
            validate_key(key)
            validate_value(key, value)
    except (ValidationError, InvalidArgumentError) as exc:
        reason = str(exc).splitlines()[0]
        raise _refuse(what, reason) from None
    return {
        "org_id": org_id, "session_id": session["id"], "seq": seq, "id": record.id,
        "author": record.author, "invocation_id": record.invocation_id,
        "content": record.content, "state_delta": record.state_delta, "tokens": record.tokens,
        "timestamp": record.timestamp,
    }  # fmt: skip


def _state_rows(
    org_id: str, row: Row[Any], prefix: str, user_id: str | None
) -> list[dict[str, Any]]:
    rows = []
    try:
        validate_id("app_name", row.app_name, allow_empty=True)
        state = _object(row.state, "it")
    except InvalidArgumentError as exc:
        raise _refuse(f"the {prefix} state of app {row.app_name!r}", str(exc)) from None
    for key, value in state.items():
        try:
            validate_key(prefix + key if isinstance(key, str) else key)
            validate_value(prefix + key, value)
        except InvalidArgumentError as exc:
            raise _refuse(f"the {prefix} state of app {row.app_name!r}", str(exc)) from None
        found = {"org_id": org_id, "app_name": row.app_name, "key": key, "value": value}
        if user_id is not None:
            found["user_id"] = user_id
        try:
            found["updated_at"] = _when("its update_time", row.update_time)
        except InvalidArgumentError as exc:
            raise _refuse(f"the {prefix} state of app {row.app_name!r}", str(exc)) from None
        rows.append(found)
    return rows


# -- the target -----------------------------------------------------------------------------


_TABLES = (sessions, events, user_state, app_state)


_finish = (
    update(sessions)
    .where(sessions.c.org_id == bindparam("k_org"), sessions.c.id == bindparam("k_id"))
    .values(
        message_count=bindparam("v_count"),
        token_total=bindparam("v_tokens"),
        event_seq=bindparam("v_count"),
    )
)


def _pages(source: _Source, table: Table) -> AsyncIterator[Sequence[Row[Any]]]:
    """The source table's rows by primary key, a keyset page at a time."""
    keyset = Keyset.over(select(table), list(table.primary_key.columns), limit=PAGE_SIZE)
    return keyset.pages(source.conn, source.errors)


async def _copy_sessions(
    source: _Source,
    loader: Loader,
    org_id: str,
    progress: Callable[[int], None] | None,
) -> None:
    e = _events
    async for page in _pages(source, _sessions):
        by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
        for row in page:
            made = _session_row(org_id, row)
            by_key[(row.app_name, row.user_id, row.id)] = made
            await loader.add(sessions, made)
        await loader.flush()  # the events refer to them
        first, last = page[0], page[-1]
        owner = tuple_(e.c.app_name, e.c.user_id, e.c.session_id)
        of_page = (
            select(
                *_EVENT_KEY,
                e.c.invocation_id,
                e.c.timestamp,
                text_size(_events.c.event_data, source.conn.dialect.name).label("size"),
            )
            .where(owner >= tuple_(first.app_name, first.user_id, first.id))
            .where(owner <= tuple_(last.app_name, last.user_id, last.id))
            # As ADK returns a session's events: by timestamp, then id.
            .order_by(e.c.app_name, e.c.user_id, e.c.session_id, e.c.timestamp, e.c.id)
        )
        counted: dict[str, list[int]] = {}
        async for row, event_data in _with_data(source, _streamed(source, of_page)):
            session = by_key.get((row.app_name, row.user_id, row.session_id))
            if session is None:
                continue  # an event without its session: ADK never returns it
            seen = counted.setdefault(session["id"], [0, 0])
            seen[0] += 1
            made = _event_row(org_id, session, seen[0], row, event_data)
            del event_data
            seen[1] += made["tokens"]
            await loader.add(events, made, size=row.size)
        await loader.flush()
        if counted:
            finished = [
                {"k_org": org_id, "k_id": sid, "v_count": n, "v_tokens": tokens}
                for sid, (n, tokens) in counted.items()
            ]
            with translated("import-adk"):
                await loader.conn.execute(_finish, finished)
        if progress is not None:
            progress(len(page))


_EVENT_KEY = (_events.c.id, _events.c.app_name, _events.c.user_id, _events.c.session_id)
"""The primary key of ADK's events, in its order."""


async def _with_data(
    source: _Source, rows: AsyncIterator[Row[Any]]
) -> AsyncIterator[tuple[Row[Any], Any]]:
    """Each event row (streamed without its data) with its data, read by primary key in
    batches of at most BATCH_SIZE events and BATCH_BYTES (or one larger event), on the
    source's connection and snapshot, as the rows are reached."""
    batch: list[Row[Any]] = []
    total = 0
    async for row in rows:
        if batch and (len(batch) >= BATCH_SIZE or total + row.size > BATCH_BYTES):
            async for item in _filled(source, batch):
                yield item
            batch, total = [], 0
        batch.append(row)
        total += row.size
    async for item in _filled(source, batch):
        yield item


async def _filled(source: _Source, batch: list[Row[Any]]) -> AsyncIterator[tuple[Row[Any], Any]]:
    if not batch:
        return
    keys = [tuple(row._mapping[col.name] for col in _EVENT_KEY) for row in batch]
    query = select(*_EVENT_KEY, _events.c.event_data).where(tuple_(*_EVENT_KEY).in_(keys))
    with source.errors():
        found = {tuple(row[:4]): row.event_data for row in await source.conn.execute(query)}
    for row, key in zip(batch, keys, strict=True):
        yield row, found.pop(key, None)


async def _streamed(source: _Source, query: Any) -> AsyncIterator[Row[Any]]:
    """The rows of a source query, streamed (a server-side cursor on Postgres). On MySQL
    read whole: a connection streaming a result runs no other statement until it has read
    it all, and the events' data is read meanwhile (the rows hold no data: keys and sizes)."""
    if source.conn.dialect.name in ("mysql", "mariadb"):
        with source.errors():
            every = (await source.conn.execute(query)).all()
        for row in every:
            yield row
        return
    with source.errors():
        result = await source.conn.stream(query)
    iterator = result.__aiter__()
    while True:
        with source.errors():
            try:
                row = await iterator.__anext__()
            except StopAsyncIteration:
                return
        yield row


async def _copy_state(source: _Source, loader: Loader, org_id: str) -> None:
    async for page in _pages(source, _app_states):
        for row in page:
            for made in _state_rows(org_id, row, APP_PREFIX, None):
                await loader.add(app_state, made)
    async for page in _pages(source, _user_states):
        for row in page:
            try:
                validate_id("user_id", row.user_id)
            except InvalidArgumentError as exc:
                raise _refuse(f"the user: state of app {row.app_name!r}", str(exc)) from None
            for made in _state_rows(org_id, row, USER_PREFIX, row.user_id):
                await loader.add(user_state, made)


async def count_adk_sessions(source: str | URL | AsyncEngine) -> int:
    """Return how many sessions an ADK database holds (for a progress bar).

    Raises:
        AdkImportError: the source is missing, unreadable or not ADK's current schema.
    """
    async with _reading(source) as found, found.errors():
        query = select(func.count()).select_from(_sessions)
        return int((await found.conn.execute(query)).scalar_one())


async def import_adk(
    source: str | URL | AsyncEngine,
    store: SQLStore,
    *,
    org_id: str,
    progress: Callable[[int], None] | None = None,
) -> AdkImportCounts:
    """Copy every session, event and shared state of an ADK database into ``org_id``.

    All or nothing, in one transaction of the target (see the module's docstring). Into a
    store with a keyring, what was copied is then sealed, as every row it writes
    (``SQLStore.reencrypt(new_keys=False)``, online and in batches, over the whole store:
    until it returns, the copied rows are in plaintext; if it is stopped, run
    ``durable-sessions keys reencrypt --resume`` to finish).

    Args:
        source: The ADK database: the URL its ``DatabaseSessionService`` was given
            (``sqlite:///...``, ``sqlite+aiosqlite:///...``, ``postgresql://...``,
            ``postgresql+asyncpg://...``), or an ``AsyncEngine`` on it.
        store: The durable-sessions store (migrated) that receives the data.
        org_id: The organisation the sessions and state go to.
        progress: Called with the number of sessions copied since the last call.

    Returns:
        How many sessions, events and state rows were written.

    Raises:
        AdkImportError: The source is missing, unreadable, not an ADK database, in ADK's
            legacy pickle schema, holds a value durable-sessions cannot store, or clashes
            with what the target already holds. Nothing is written. For a value (JSON that
            does not decode or is nested too deeply, a time that is no time, NaN, infinite
            or out of the stored range, see ``prepare.check_timestamp``), it is also an
            ``InvalidArgumentError``, and its one-line message names the row.
        SchemaNotMigratedError: The target database is not migrated.
        StoreUnavailableError: The target database could not be reached.
    """
    validate_id("org_id", org_id)
    if not isinstance(store, SQLStore):
        raise InvalidArgumentError("import_adk writes into a SQLStore (a migrated database)")
    async with _reading(source) as found:
        with translated("import-adk"), _refused_clash():
            async with write_transaction(store.engine) as target:
                loader = Loader(target, _TABLES, batch_rows=BATCH_SIZE, batch_bytes=BATCH_BYTES)
                await _copy_sessions(found, loader, org_id, progress)
                await _copy_state(found, loader, org_id)
                await loader.finish()
    if store.keyring is not None:
        await store.reencrypt(new_keys=False)
    return AdkImportCounts(**loader.counted())


@contextmanager
def _refused_clash() -> Iterator[None]:
    """A row that already exists refuses the import."""
    try:
        yield
    except RowExistsError as exc:
        raise AdkImportError(f"{exc}; nothing was imported") from exc
