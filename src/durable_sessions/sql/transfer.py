"""Stream a whole database to and from JSON Lines: sessions, shared state and events.

One JSON object per line, each with a ``type``: a ``header``; every ``session`` (with its
private state) followed by its ``event`` records by seq; then ``user_state`` and
``app_state`` rows. A record's fields are its table's columns; timestamps are ISO-8601 UTC
with microseconds. Export reads every organisation in keyset pages, in primary-key order by
code point, inside one read-only snapshot, and writes canonical lines (sorted keys, no
spaces, UTF-8): flat memory, a consistent copy, and the same bytes from SQLite and Postgres.
Import is all or nothing, one transaction inserting in batches: it refuses the input at the
first malformed line, or a session or state row that already exists, naming the line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, Any

from sqlalchemy import (
    ColumnElement,
    LargeBinary,
    Select,
    String,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    null,
    select,
    tuple_,
)
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import InvalidArgumentError, SessionError
from ..model import new_id
from ..prepare import check_title
from ..state import (
    APP_PREFIX,
    MAX_DEPTH,
    TEMP_PREFIX,
    USER_PREFIX,
    scope_of,
    validate_id,
    validate_key,
    validate_value,
)
from .dialect import dialect_ops
from .runner import TransactionConnection, write_transaction
from .schema import app_state, events, sessions, user_state
from .store import SQLStore
from .translate import translated

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ImportLineError",
    "TransferCounts",
    "count_sessions",
    "dumps",
    "export_jsonl",
    "import_jsonl",
]

FORMAT = "durable-sessions"
"""The ``format`` named by the header line of an export."""
FORMAT_VERSION = 1
"""The version of the export format this module writes and reads."""

PAGE_SIZE = 1000
"""Rows read per keyset page."""
EVENT_CHUNK = 2000
"""At most this many events are read per query (bounded by the sessions' ``event_seq``)."""
INLINE_BYTES = 4 << 10
"""A title or JSON value up to this size (as UTF-8 text) is read with its row."""
BATCH_BYTES = 8 << 20
"""Larger values are read apart, at most this many bytes of them per query (or one value).

So an export holds at most a page of sessions, a chunk of events (each value of either at
most INLINE_BYTES) and BATCH_BYTES of larger values or one larger value, whatever the data:
its memory does not grow with the number or the size of events (tests/sql/test_transfer.py).
"""
BATCH_SIZE = 1000
"""Rows inserted per statement on import."""

_MAX_BIGINT = 2**63 - 1


class ImportLineError(InvalidArgumentError):
    """Raised when an import line is malformed or clashes with stored data; nothing is written."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}; nothing was imported")
        self.line = line
        self.reason = reason


class _StreamError(Exception):
    """Carries an OSError of the caller's stream (its ``__cause__``) past ``translated``."""


@contextmanager
def _database(operation: str) -> Iterator[None]:
    """Translate database errors, but let the stream's own errors through unchanged."""
    try:
        with translated(operation):
            yield
    except _StreamError as exc:
        raise exc.__cause__ from None  # type: ignore[misc]


def _reading(lines: Iterable[bytes]) -> Iterator[bytes]:
    try:
        yield from lines
    except OSError as exc:
        raise _StreamError from exc


@dataclass
class TransferCounts:
    """How many records an export wrote or an import inserted."""

    sessions: int = 0
    events: int = 0
    user_state: int = 0
    app_state: int = 0

    def add(self, kind: str, count: int = 1) -> None:
        """Count more records of a kind: ``session``, ``event``, ``user_state``, ``app_state``."""
        name = {"session": "sessions", "event": "events"}.get(kind, kind)
        setattr(self, name, getattr(self, name) + count)


def dumps(record: Mapping[str, Any]) -> str:
    """Serialise one record canonically: sorted keys, no spaces, UTF-8 text."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _format_timestamp(value: datetime) -> str:
    return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"


# -- field checks: each returns the value to insert or raises ValueError/InvalidArgumentError

Check = Callable[[str, Any], Any]


def _count(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_BIGINT:
        raise ValueError("must be a non-negative 64-bit integer")
    return value


def _version(name: str, value: Any) -> Any:
    if _count(name, value) < 1:
        raise ValueError("must be at least 1 (a stored session's first version)")
    return value


def _timestamp(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be an ISO-8601 timestamp string")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO-8601 timestamp") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (write it in UTC, ending in Z)")
    return parsed.astimezone(timezone.utc)


def _json(name: str, value: Any) -> Any:
    # No size limit: these values were accepted by the store they come from.
    validate_value(name, value)
    return value


def _state(name: str, value: Any) -> Any:
    """Check private state (``state``) or an event's ``state_delta``."""
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    for key, item in value.items():
        scope = scope_of(validate_key(key))
        if name == "state" and scope != "private":
            raise ValueError(f"key {key!r} is not private state ({scope}: keys have own rows)")
        if scope == "temp":
            raise ValueError(f"key {key!r}: {TEMP_PREFIX} keys are never stored")
        validate_value(key, item)
    return value


def _shared_key(prefix: str) -> Check:
    def check(name: str, value: Any) -> Any:
        validate_key(prefix + value if isinstance(value, str) else value)
        return value

    return check


_CHECKS: dict[str, Check] = {
    "org_id": validate_id, "id": validate_id, "user_id": validate_id, "session_id": validate_id,
    "app_name": lambda name, value: validate_id(name, value, allow_empty=True),
    "author": lambda name, value: validate_id(name, value, allow_empty=True),
    "invocation_id": lambda name, value: validate_id(name, value, allow_empty=True),
    "parent_id": lambda name, value: None if value is None else validate_id(name, value),
    "title": lambda name, value: check_title(value),
    "created_at": _timestamp, "updated_at": _timestamp, "timestamp": _timestamp,
    "message_count": _count, "token_total": _count, "event_seq": _count, "version": _version,
    "seq": _count, "tokens": _count,
    "state": _state, "state_delta": _state, "content": _json, "value": _json,
}  # fmt: skip
_KEYS = {"user_state": _shared_key(USER_PREFIX), "app_state": _shared_key(APP_PREFIX)}
_TABLES = {"session": sessions, "event": events, "user_state": user_state, "app_state": app_state}

# Not exported: an import starts a new life of each session id (see Session.incarnation).
_LOCAL = {"incarnation"}

RECORDS: dict[str, tuple[Table, dict[str, Check]]] = {
    kind: (table, {col.name: _KEYS[kind] if col.name == "key" else _CHECKS[col.name]
                   for col in table.columns if col.name not in _LOCAL})
    for kind, table in _TABLES.items()
}  # fmt: skip
"""Each record type: its table, and a check for each field; the fields are the columns."""


def _record(kind: str, row: Mapping[Any, Any]) -> str:
    """One record's line; the export reads JSON values as text, decoded only here."""
    data: dict[str, Any] = {"type": kind}
    for name, how in _FIELDS[kind]:
        value = row[name]
        if value is not None and how:
            value = _format_timestamp(value) if how == _TIMESTAMP else json.loads(value)
        data[name] = value
    return dumps(data)


# -- export --------------------------------------------------------------------------------

_LARGE: dict[str, tuple[str, ...]] = {
    "session": ("title", "state"),
    "event": ("content", "state_delta"),
    "user_state": ("value",),
    "app_state": ("value",),
}
"""The columns of each record type whose size has no bound: a value larger than
INLINE_BYTES is not read with its row but apart, in batches of at most BATCH_BYTES."""
_JSON = {"state", "content", "state_delta", "value"}
"""The JSON columns: read as text (JSONB printed by Postgres), decoded one record at a time."""
_SIZE = "__size"
"""The suffix of the column that gives the size of a large column's value."""
_SIZES = {kind: [name + _SIZE for name in names] for kind, names in _LARGE.items()}
_TIMESTAMPS = {"created_at", "updated_at", "timestamp"}
_TIMESTAMP, _DECODE = 1, 2
_FIELDS: dict[str, list[tuple[str, int]]] = {
    kind: [
        (name, _TIMESTAMP if name in _TIMESTAMPS else _DECODE if name in _JSON else 0)
        for name in fields
    ]
    for kind, (_, fields) in RECORDS.items()
}
"""The fields of each record type, and whether each is a timestamp, JSON text, or as read."""


def _text(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A large column as text: JSON is cast, so that no driver or type decodes it."""
    return cast(column, Text) if column.name in _JSON else column


def _size(column: ColumnElement[Any], dialect: str) -> ColumnElement[int]:
    """The size of a column's value as UTF-8 text, in bytes (0 for NULL)."""
    if dialect == "postgresql":
        size = func.octet_length(_text(column))
    else:  # SQLite keeps JSON as text: its length in bytes, as a BLOB
        size = func.length(cast(column, LargeBinary))
    return func.coalesce(size, 0)


def _columns(kind: str, dialect: str) -> list[ColumnElement[Any]]:
    """The columns a query of ``kind`` records reads: each large value as text, only when
    it is at most INLINE_BYTES (else NULL), and the size of each large value."""
    table = RECORDS[kind][0]
    out: list[ColumnElement[Any]] = []
    sizes: list[ColumnElement[Any]] = []
    for col in table.columns:
        if col.name not in _LARGE[kind]:
            out.append(col)
            continue
        size = _size(col, dialect)
        out.append(case((size <= INLINE_BYTES, _text(col)), else_=null()).label(col.name))
        sizes.append(size.label(col.name + _SIZE))
    return out + sizes


def _large(kind: str, row: Row[Any]) -> int:
    """How many bytes of the row's values were left out for being large (0: none)."""
    mapping = row._mapping
    total = 0
    for name in _SIZES[kind]:
        size = mapping[name]
        if size > INLINE_BYTES:
            total += size
    return total


def page_queries(table: Table, dialect: str) -> tuple[Select[Any], Select[Any]]:
    """The keyset page queries of a table: the first page, and the page after a key.

    Rows come in primary-key order by code point: on Postgres, comparisons and the order
    are in the C collation, which the id and key columns have since revision 0004, so both
    queries read each page straight from the primary key (see tests/sql/test_transfer.py).
    """
    kind = next(kind for kind, (of, _) in RECORDS.items() if of is table)
    pk = list(table.primary_key.columns)
    pg = dialect == "postgresql"
    keys = [col.collate("C") if pg and isinstance(col.type, String) else col for col in pk]
    first = select(*_columns(kind, dialect)).order_by(*keys).limit(PAGE_SIZE)
    bound = tuple_(*[bindparam(f"after_{col.name}", type_=col.type) for col in pk])
    return first, first.where(tuple_(*keys) > bound)


async def _pages(conn: AsyncConnection, table: Table) -> AsyncIterator[Sequence[Row[Any]]]:
    """Yield the table's rows in primary-key order, one keyset page at a time."""
    pk = list(table.primary_key.columns)
    first, following = page_queries(table, conn.dialect.name)
    params: dict[str, Any] | None = None
    while True:
        rows = (await conn.execute(first if params is None else following, params or {})).all()
        if rows:
            yield rows
        if len(rows) < PAGE_SIZE:
            return
        last = rows[-1]._mapping
        params = {f"after_{col.name}": last[col.name] for col in pk}


async def _filled(
    conn: AsyncConnection, kind: str, rows: Sequence[Row[Any]]
) -> AsyncIterator[Mapping[Any, Any]]:
    """Yield each row with its large values, read apart in batches of BATCH_BYTES at most
    (a single value larger than that alone), only as the rows are reached."""
    table = RECORDS[kind][0]
    pk = list(table.primary_key.columns)
    names = _LARGE[kind]
    read: dict[tuple[Any, ...], Mapping[Any, Any]] = {}
    for index, row in enumerate(rows):
        if not _large(kind, row):
            yield row._mapping
            continue
        key = tuple(row._mapping[col.name] for col in pk)
        if key not in read:
            read.clear()  # the previous batch has been written
            batch: list[tuple[Any, ...]] = []
            total = 0
            for later in rows[index:]:
                size = _large(kind, later)
                if size and batch and total + size > BATCH_BYTES:
                    break
                if size:
                    batch.append(tuple(later._mapping[col.name] for col in pk))
                    total += size
            wanted = [_text(table.c[name]).label(name) for name in names]
            query = select(*pk, *wanted).where(tuple_(*pk).in_(batch))
            for found in (await conn.execute(query)).all():
                read[tuple(found._mapping[col.name] for col in pk)] = found._mapping
        values = read.pop(key)
        yield {**row._mapping, **{name: values[name] for name in names}}


def _chunks(page: Sequence[Row[Any]]) -> Iterable[list[Row[Any]]]:
    """Group a page of sessions of one organisation whose events fit in one query."""
    chunk: list[Row[Any]] = []
    budget = 0
    for row in page:
        if chunk and (row.org_id != chunk[0].org_id or budget + row.event_seq > EVENT_CHUNK):
            yield chunk
            chunk, budget = [], 0
        chunk.append(row)
        budget += row.event_seq
    if chunk:
        yield chunk


async def _session_records(
    conn: AsyncConnection, page: Sequence[Row[Any]]
) -> AsyncIterator[tuple[str, Mapping[Any, Any]]]:
    """Yield a page of sessions as records, each session followed by its events in seq order.

    At most EVENT_CHUNK events are read per query, their large values apart (``_filled``).
    """
    columns = _columns("event", conn.dialect.name)
    sessions_filled = _filled(conn, "session", page)
    for chunk in _chunks(page):
        of_chunk = select(*columns).where(
            events.c.org_id == chunk[0].org_id,
            events.c.session_id.in_([row.id for row in chunk if row.event_seq]),
        )
        if len(chunk) == 1 and chunk[0].event_seq > EVENT_CHUNK:
            yield "session", await anext(sessions_filled)  # a long transcript: by seq ranges
            for start in range(0, chunk[0].event_seq, EVENT_CHUNK):
                span = of_chunk.where(events.c.seq > start, events.c.seq <= start + EVENT_CHUNK)
                rows = (await conn.execute(span.order_by(events.c.seq))).all()
                async for record in _filled(conn, "event", rows):
                    yield "event", record
            continue
        by_session: dict[str, list[Row[Any]]] = {row.id: [] for row in chunk}
        if any(row.event_seq for row in chunk):
            for event in (await conn.execute(of_chunk)).all():
                by_session[event.session_id].append(event)
        counts = {row.id: len(by_session[row.id]) for row in chunk}
        ordered = [
            event
            for row in chunk
            for event in sorted(by_session.pop(row.id), key=lambda event: int(event.seq))
        ]
        filled = _filled(conn, "event", ordered)
        for row in chunk:
            yield "session", await anext(sessions_filled)
            for _ in range(counts[row.id]):
                yield "event", await anext(filled)


async def count_sessions(store: SQLStore) -> int:
    """Return how many sessions the database holds, across every organisation."""
    with translated("count sessions"):
        async with store.engine.connect() as conn:
            query = select(func.count()).select_from(sessions)
            return int((await conn.execute(query)).scalar_one())


async def export_jsonl(
    store: SQLStore, out: IO[bytes], *, progress: Callable[[int], None] | None = None
) -> TransferCounts:
    """Write every organisation's sessions, events and shared state to ``out`` as JSON Lines.

    Args:
        store: The store whose database is exported (its engine is used directly).
        out: A binary stream; one UTF-8 line is written per record.
        progress: Called with the number of sessions written since the last call.

    Returns:
        How many records of each kind were written.

    Raises:
        SchemaNotMigratedError: The database is not migrated.
        StoreUnavailableError: The database could not be reached.
    """
    counts = TransferCounts()

    def write(line: str) -> None:
        try:
            out.write(line.encode("utf-8") + b"\n")
        except OSError as exc:
            raise _StreamError from exc

    with _database("export"):
        async with store.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execution_options(isolation_level="REPEATABLE READ")
                await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            else:  # pysqlite opens no transaction for reads; BEGIN pins one WAL snapshot
                await conn.exec_driver_sql("BEGIN")
            write(dumps({"format": FORMAT, "type": "header", "version": FORMAT_VERSION}))
            async for page in _pages(conn, sessions):
                async for kind, record in _session_records(conn, page):
                    write(_record(kind, record))
                    counts.add(kind)
                if progress is not None:
                    progress(len(page))
            for kind in ("user_state", "app_state"):
                async for page in _pages(conn, RECORDS[kind][0]):
                    async for record in _filled(conn, kind, page):
                        write(_record(kind, record))
                    counts.add(kind, len(page))
            await conn.rollback()
    return counts


# -- import --------------------------------------------------------------------------------


def _loads(number: int, raw: bytes) -> Any:
    """Decode one line's JSON, or raise the line's error (never a bare RecursionError)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ImportLineError(number, "not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ImportLineError(number, f"not valid JSON ({exc.msg})") from None
    except RecursionError:
        # json gives up on nesting deeper than Python's recursion limit; no stored value
        # is nested deeper than MAX_DEPTH, so such a line was never an export's.
        raise ImportLineError(
            number, f"JSON nested too deeply (stored values have at most {MAX_DEPTH} levels)"
        ) from None


def _parse(number: int, raw: bytes) -> tuple[str, dict[str, Any]]:
    """Parse and check one line; return its record type and the row to insert."""
    data = _loads(number, raw)
    if not isinstance(data, dict):
        raise ImportLineError(number, "expected a JSON object")
    kind = data.pop("type", None)
    if kind == "header":
        raise ImportLineError(number, "a header may only be the first line")
    if kind not in RECORDS:
        expected = ", ".join(RECORDS)
        raise ImportLineError(number, f"unknown record type {kind!r} (expected {expected})")
    fields = RECORDS[kind][1]
    if missing := [name for name in fields if name not in data]:
        raise ImportLineError(number, f"{kind} record is missing the field {missing[0]!r}")
    if unknown := sorted(set(data) - set(fields)):
        raise ImportLineError(number, f"{kind} record has an unknown field {unknown[0]!r}")
    row: dict[str, Any] = {}
    for name, check in fields.items():
        try:
            row[name] = check(name, data[name])
        except (ValueError, SessionError) as exc:
            raise ImportLineError(number, f"{kind} field {name!r}: {exc}") from None
    if kind == "session" and row["event_seq"] > row["message_count"]:
        # Every event counts as a message, so a store's guard on message_count also keeps
        # the next event's seq within 64 bits.
        raise ImportLineError(
            number,
            f"session field 'event_seq': {row['event_seq']} is above its message_count "
            f"{row['message_count']} (every event counts as a message)",
        )
    return kind, row


def _check_header(raw: bytes) -> None:
    try:
        data = _loads(1, raw)
    except ImportLineError:
        data = None
    if not isinstance(data, dict) or data.get("type") != "header" or data.get("format") != FORMAT:
        raise ImportLineError(1, f"not a {FORMAT} export (the first line is not its header)")
    if data.get("version") != FORMAT_VERSION:
        version = data.get("version")
        raise ImportLineError(
            1, f"format version {version!r} is not {FORMAT_VERSION}, the one read here"
        )


class _Importer:
    """Buffers checked rows and inserts them in batches, refusing rows that already exist."""

    def __init__(self, conn: TransactionConnection) -> None:
        self.conn = conn
        self.ops = dialect_ops(conn.dialect.name, conn.dialect.driver)
        self.analyzed = BATCH_SIZE  # sessions inserted when statistics are next refreshed
        self.counts = TransferCounts()
        self.pending: dict[str, list[tuple[int, dict[str, Any]]]] = {k: [] for k in RECORDS}
        self.lines: dict[tuple[Any, ...], int] = {}  # primary keys pending, by kind
        self.size = 0
        self.session: dict[str, Any] | None = None
        self.last_seq = 0

    async def add(self, number: int, kind: str, row: dict[str, Any]) -> None:
        if kind == "session":
            row["incarnation"] = new_id()
            self.session, self.last_seq = row, 0
        elif kind == "event":
            self._check_event(number, row)
        table = RECORDS[kind][0]
        key = (kind, *(row[col.name] for col in table.primary_key.columns))
        if key in self.lines:
            raise ImportLineError(number, f"{_clash(kind, row)} on line {self.lines[key]}")
        self.lines[key] = number
        self.pending[kind].append((number, row))
        self.size += 1
        if self.size >= BATCH_SIZE:
            await self.flush()

    def _check_event(self, number: int, row: dict[str, Any]) -> None:
        owner = self.session
        if owner is None or (row["org_id"], row["session_id"]) != (owner["org_id"], owner["id"]):
            raise ImportLineError(
                number, f"event of session {row['session_id']!r} does not follow that session"
            )
        if not self.last_seq < row["seq"] <= owner["event_seq"]:
            raise ImportLineError(
                number,
                f"event seq {row['seq']} must be above {self.last_seq} and at most the "
                f"session's event_seq {owner['event_seq']}",
            )
        self.last_seq = row["seq"]

    async def flush(self) -> None:
        """Insert the pending rows; refuse the first whose primary key is already taken."""
        for kind in ("session", "event", "user_state", "app_state"):
            rows = self.pending[kind]
            if not rows:
                continue
            table = RECORDS[kind][0]
            pk = list(table.primary_key.columns)
            # One statement inserts and checks: a row that clashes returns no key.
            stmt = self.ops.insert_if_absent(table).returning(*pk)
            inserted = {tuple(row) for row in await self.conn.execute(stmt, [r for _, r in rows])}
            if len(inserted) < len(rows):
                number, row = next(
                    (n, r) for n, r in rows if tuple(r[col.name] for col in pk) not in inserted
                )
                where = "in the database, or earlier in the input"
                raise ImportLineError(number, f"{_clash(kind, row)} ({where})")
            self.counts.add(kind, len(rows))
            rows.clear()
            if kind == "session" and self.ops.is_postgres and self.counts.sessions >= self.analyzed:
                # Postgres plans the events' foreign-key check from the table's statistics;
                # refreshed as the table grows, it stays an index lookup, not a scan.
                await self.conn.exec_driver_sql("ANALYZE ds_sessions")
                self.analyzed = self.counts.sessions * 4
        self.size = 0
        self.lines.clear()


def _clash(kind: str, row: Mapping[str, Any]) -> str:
    if kind == "session":
        return f"session {row['id']!r} of organisation {row['org_id']!r} already exists"
    owner = f" of user {row['user_id']!r}" if kind == "user_state" else ""
    where = f"organisation {row['org_id']!r}, app {row['app_name']!r}"
    return f"{kind[:-6]}: state key {row['key']!r}{owner} ({where}) already exists"


async def import_jsonl(
    store: SQLStore, lines: Iterable[bytes], *, progress: Callable[[int], None] | None = None
) -> TransferCounts:
    """Insert an export's records into the store's database, all of them or none.

    Args:
        store: The store whose (migrated) database receives the records.
        lines: The export's lines as bytes, such as a file opened in binary mode.
        progress: Called with the number of bytes read since the last call.

    Returns:
        How many records of each kind were inserted.

    Raises:
        ImportLineError: A line is malformed, or its session or state row already exists;
            nothing is written.
        SchemaNotMigratedError: The database is not migrated.
        StoreUnavailableError: The database could not be reached.
    """
    with _database("import"):
        async with write_transaction(store.engine) as conn:
            importer = _Importer(conn)
            number = 0
            for number, raw in enumerate(_reading(lines), start=1):
                if progress is not None:
                    progress(len(raw))
                body = raw.rstrip(b"\n")
                if number == 1:
                    _check_header(body)
                    continue
                if not body.strip():
                    raise ImportLineError(number, "empty line")
                kind, row = _parse(number, body)
                await importer.add(number, kind, row)
            if number == 0:
                raise ImportLineError(1, f"the input is empty (expected a {FORMAT} export)")
            await importer.flush()
    return importer.counts
