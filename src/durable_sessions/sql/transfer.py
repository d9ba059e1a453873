"""Stream a whole database to and from JSON Lines: sessions, shared state, events, memories.

One JSON object per line, each with a ``type``: a ``header``; the wrapped data keys of an
encrypted store (``key`` records, none for a store without a keyring); every ``session``
(with its private state) followed by its ``event`` records by seq; then ``user_state`` and
``app_state`` rows, then long-term ``memory`` rows (their ``terms`` are not written: an
import computes them from the text). An encrypted store's values are written sealed, as
stored, unless the export is asked to decrypt them; an import into a store with the same
keyring computes their blind index again (``sealed_transfer``). A record's fields are its
table's columns; timestamps are ISO-8601 UTC with microseconds. Export reads every
organisation in keyset pages, in primary-key order by code point, inside one read-only
snapshot, and writes canonical lines (sorted keys, no spaces, UTF-8): flat memory, a
consistent copy, and the same bytes from SQLite and Postgres.
Import is all or nothing, one transaction inserting in batches (``loader.Loader``): it refuses
the input at the first malformed line, or a session or state row that already exists, naming
the line, and ends by refreshing the planner's statistics of the tables it filled.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    Text,
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
from ..memories import stored_terms
from ..model import new_id
from ..prepare import EARLIEST, LATEST, TIMESTAMP_RANGE, check_timestamp, check_title, cut_title
from ..state import (
    APP_PREFIX,
    MAX_DEPTH,
    MAX_INT64,
    TEMP_PREFIX,
    USER_PREFIX,
    check_text,
    scope_of,
    validate_id,
    validate_key,
    validate_value,
)
from .dialect import dialect_ops
from .loader import Keyset, Loader, RowExistsError, text_size
from .schema import app_state, events, keys, memories, memory_terms, sessions, user_state
from .store import SQLStore

if TYPE_CHECKING:
    from ..sealing import Envelope
    from .sealed_transfer import BlindIndexer
from .transactions import TransactionConnection, write_transaction
from .translate import translated

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ExportIncompleteError",
    "ImportLineError",
    "KeyringRequiredError",
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
"""Rows inserted per batch on import (and at most ``loader.BATCH_BYTES`` of lines)."""


class ImportLineError(InvalidArgumentError):
    """Raised when an import line is malformed or clashes with stored data; nothing is written."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}; nothing was imported")
        self.line = line
        self.reason = reason


class KeyringRequiredError(ImportLineError):
    """Raised when an export of an encrypted store (its first ``key`` record) is imported
    into a store without a keyring; nothing is written. Open the store with the keyring the
    export was written with, or export again with ``decrypt=True``."""

    def __init__(self, line: int) -> None:
        super().__init__(
            line,
            "the export is encrypted (it holds sealed values and their wrapped data keys): "
            "import it into a store opened with the keyring it was written with (--keyring), "
            "or export it decrypted (--decrypt)",
        )


class ExportIncompleteError(SessionError):
    """Raised by ``export_jsonl`` after it wrote every record it could: some rows cannot be
    exported (a timestamp no import could store, such as Postgres's ``infinity`` written
    past the stores' checks). The message names the first; ``rows`` names each (a session
    left out goes with its events), ``counts`` what was written."""

    def __init__(self, rows: list[str], counts: TransferCounts) -> None:
        more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
        super().__init__(
            f"export incomplete: {rows[0]}{more} could not be exported; every other record "
            "was written"
        )
        self.rows = rows
        self.counts = counts


class _Unexportable(Exception):
    """A row's value that no export line can hold (the reason is its message)."""


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
    """How many records an export wrote or an import inserted.

    ``titles_cut`` counts the imported sessions whose title was longer than
    ``prepare.MAX_TITLE_BYTES`` and was cut to it (an export never has any).
    """

    sessions: int = 0
    events: int = 0
    user_state: int = 0
    app_state: int = 0
    memories: int = 0
    titles_cut: int = 0
    keys: int = 0
    """The data keys of an encrypted store (``key`` records)."""
    keys_unreadable: int = 0
    """The imported data keys that the store's keyring cannot unwrap (of users erased since
    the export was written): their rows are imported, and cannot be read."""

    def add(self, kind: str, count: int = 1) -> None:
        """Count more records of a kind: ``key``, ``session``, ``event``, ``user_state``,
        ``app_state``, ``memory``."""
        names = {"key": "keys", "session": "sessions", "event": "events", "memory": "memories"}
        name = names.get(kind, kind)
        setattr(self, name, getattr(self, name) + count)


def dumps(record: Mapping[str, Any]) -> str:
    """Serialise one record canonically: sorted keys, no spaces, UTF-8 text."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _format_timestamp(value: datetime) -> str:
    return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"


def _exported_timestamp(name: str, value: datetime) -> str:
    """A stored timestamp as an export writes it, if an import can read it back."""
    # asyncpg reads Postgres's infinity and -infinity as naive datetime.max and .min.
    if value.tzinfo is None or not EARLIEST <= value <= LATEST:
        shown = "infinity" if value.tzinfo is None else _format_timestamp(value)
        raise _Unexportable(f"its {name} is {shown}, out of range ({TIMESTAMP_RANGE})")
    return _format_timestamp(value)


# -- field checks: each returns the value to insert or raises ValueError/InvalidArgumentError

Check = Callable[[str, Any], Any]


def _count(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64:
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
    return check_timestamp(repr(value), parsed)


_SEALED = "dse1:"
"""What a sealed value starts with (``sealing.PREFIX``, which needs the crypto extra)."""


def _title(name: str, value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_SEALED):
        # A sealed title is longer than its text, and must stay whole to decrypt.
        problem = check_text(value)
        if problem:
            raise ValueError(problem)
        return value
    # Cut, not refused: a title longer than MAX_TITLE_BYTES comes from a database written
    # before titles had a limit; the rest of the record is restored as it was.
    return check_title(cut_title(value) if isinstance(value, str) else value)


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


def _text_value(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    problem = check_text(value)
    if problem:
        raise ValueError(problem)
    return value


def _metadata(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    validate_value(name, value)
    return value


def _optional(check: Check) -> Check:
    return lambda name, value: None if value is None else check(name, value)


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
    "title": _title,
    "created_at": _timestamp, "updated_at": _timestamp, "timestamp": _timestamp,
    "message_count": _count, "token_total": _count, "event_seq": _count, "version": _version,
    "seq": _count, "tokens": _count,
    "state": _state, "state_delta": _state, "content": _json, "value": _json,
}  # fmt: skip
_KEY_KINDS = ("user", "app", "index")


def _key_id(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
        raise ValueError("must be a data key id (1 to 64 letters, digits, '_', '.' or '-')")
    return value


def _key_kind(name: str, value: Any) -> Any:
    if value not in _KEY_KINDS:
        raise ValueError(f"must be one of {', '.join(_KEY_KINDS)}")
    return value


def _wrapped(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a wrapped key in base64")
    try:
        base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("must be a wrapped key in base64") from None
    return value


_KEYS = {"user_state": _shared_key(USER_PREFIX), "app_state": _shared_key(APP_PREFIX)}
_TABLES = {
    "key": keys, "session": sessions, "event": events, "user_state": user_state,
    "app_state": app_state, "memory": memories,
}  # fmt: skip
_OWN_CHECKS: dict[str, dict[str, Check]] = {
    "key": {
        "key_id": _key_id, "kind": _key_kind,
        "owner": lambda name, value: validate_id(name, value, allow_empty=True),
        "master_id": _text_value, "wrapped": _wrapped,
    },
    "memory": {
        "author": _optional(_CHECKS["author"]), "session_id": _optional(validate_id),
        "seq": _optional(_count), "text": _text_value, "metadata": _metadata,
    },
}  # fmt: skip
"""Checks of a record type's fields that differ from the same column name's elsewhere."""

# Not exported: an import starts a new life of each session id (see Session.incarnation),
# and computes a memory's terms from its text.
_LOCAL = {"incarnation", "terms"}

RECORDS: dict[str, tuple[Table, dict[str, Check]]] = {
    kind: (table, {col.name: _KEYS[kind] if col.name == "key"
                   else _OWN_CHECKS.get(kind, {}).get(col.name) or _CHECKS[col.name]
                   for col in table.columns if col.name not in _LOCAL})
    for kind, table in _TABLES.items()
}  # fmt: skip
"""Each record type: its table, and a check for each field; the fields are the columns."""


def _record(kind: str, row: Mapping[Any, Any]) -> dict[str, Any]:
    """One record's fields; the export reads JSON values as text, decoded only here.

    Raises:
        _Unexportable: a value cannot be written as an import reads it.
    """
    data: dict[str, Any] = {"type": kind}
    try:
        for name, how in _FIELDS[kind]:
            value = row[name]
            if value is not None and how:
                decode = _exported_timestamp if how == _TIMESTAMP else _decoded
                value = decode(name, value)
            data[name] = value
    except (ValueError, OverflowError, RecursionError) as exc:
        raise _Unexportable(f"{type(exc).__name__}: {exc}") from None
    return data


def _line(data: Mapping[str, Any]) -> str:
    """One record's line.

    Raises:
        _Unexportable: a value cannot be written as an import reads it.
    """
    try:
        return dumps(data)
    except (ValueError, OverflowError, RecursionError) as exc:
        raise _Unexportable(f"{type(exc).__name__}: {exc}") from None


def _decoded(name: str, text: str) -> Any:
    return json.loads(text)


def _row_name(kind: str, row: Mapping[Any, Any]) -> str:
    """A row of an export, named for an operator."""
    org = f"organisation {row['org_id']!r}"
    if kind == "key":
        return f"data key {row['key_id']!r} of {org}"
    if kind == "session":
        return f"session {row['id']!r} of {org}"
    if kind == "event":
        return f"event {row['seq']} of session {row['session_id']!r} of {org}"
    if kind == "memory":
        return f"memory {row['id']!r} of user {row['user_id']!r} of {org}, app {row['app_name']!r}"
    owner = f" of user {row['user_id']!r}" if kind == "user_state" else ""
    return f"{kind[:-6]}: state key {row['key']!r}{owner} of {org}, app {row['app_name']!r}"


# -- export --------------------------------------------------------------------------------

_LARGE: dict[str, tuple[str, ...]] = {
    "key": (),
    "session": ("title", "state"),
    "event": ("content", "state_delta"),
    "user_state": ("value",),
    "app_state": ("value",),
    "memory": ("text", "content", "metadata"),
}
"""The columns of each record type whose size has no bound: a value larger than
INLINE_BYTES is not read with its row but apart, in batches of at most BATCH_BYTES."""
_JSON = {"state", "content", "state_delta", "value", "metadata"}
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
        size = text_size(col, dialect)
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
    are in the C collation, which the id and key columns have, so both
    queries read each page straight from the primary key (see tests/sql/test_transfer.py).
    """
    keyset = _keyset(table, dialect)
    return keyset.first, keyset.following


def _keyset(table: Table, dialect: str) -> Keyset:
    kind = next(kind for kind, (of, _) in RECORDS.items() if of is table)
    query = select(*_columns(kind, dialect))
    collation = "C" if dialect == "postgresql" else None
    return Keyset.over(query, list(table.primary_key.columns), limit=PAGE_SIZE, collation=collation)


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
    store: SQLStore,
    out: IO[bytes],
    *,
    progress: Callable[[int], None] | None = None,
    decrypt: bool = False,
) -> TransferCounts:
    """Write every organisation's sessions, events, shared state and long-term memories to
    ``out`` as JSON Lines.

    An encrypted database's export stays encrypted: its values as stored (sealed), and its
    data keys as stored (wrapped by the keyring's master keys), which an import into a
    store opened with the same keyring reads. With ``decrypt``, the store opens every
    value with its keyring and the export holds plaintext, and no keys: an export like one
    of a store without a keyring, which any store can import.

    Args:
        store: The store whose database is exported (its engine is used directly).
        out: A binary stream; one UTF-8 line is written per record.
        progress: Called with the number of sessions written since the last call.
        decrypt: Write plaintext (the store needs its keyring).

    A row that cannot be exported (see ``ExportIncompleteError``) stops nothing: it is left
    out (a session with its events), every other record is written, and the error then
    names it.

    Returns:
        How many records of each kind were written.

    Raises:
        ExportIncompleteError: Rows could not be exported; every other record was written.
        InvalidArgumentError: ``decrypt`` was asked of a store without a keyring.
        DecryptionError: ``decrypt``: a value does not decrypt with the store's keyring.
        SchemaNotMigratedError: The database is not migrated.
        StoreUnavailableError: The database could not be reached.
    """
    env = store._env  # the keyring, for a decrypted export
    if decrypt and env is None:
        raise InvalidArgumentError("a decrypted export needs a store with a keyring")
    if decrypt:
        from .sealed_transfer import open_record
    counts = TransferCounts()
    left_out: list[str] = []
    dropped: tuple[Any, Any] | None = None  # the session left out, whose events follow it

    async def record(kind: str, row: Mapping[Any, Any]) -> None:
        nonlocal dropped
        if kind == "event" and dropped == (row["org_id"], row["session_id"]):
            return
        try:
            data = _record(kind, row)
            if decrypt:
                assert env is not None
                data = await open_record(env, kind, data)
            line = _line(data)
        except _Unexportable as exc:
            with_events = " (with its events)" if kind == "session" and row["event_seq"] else ""
            left_out.append(f"{_row_name(kind, row)}{with_events}: {exc}")
            if kind == "session":
                dropped = (row["org_id"], row["id"])
            return
        if kind == "session":
            dropped = None
        write(line)
        counts.add(kind)

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
            if not decrypt:  # first: an import unwraps them to index what follows
                async for page in _keyset(keys, conn.dialect.name).pages(conn):
                    for key_row in page:
                        await record("key", key_row._mapping)
            async for page in _keyset(sessions, conn.dialect.name).pages(conn):
                async for kind, row in _session_records(conn, page):
                    await record(kind, row)
                if progress is not None:
                    progress(len(page))
            for kind in ("user_state", "app_state", "memory"):
                async for page in _keyset(RECORDS[kind][0], conn.dialect.name).pages(conn):
                    async for row in _filled(conn, kind, page):
                        await record(kind, row)
            await conn.rollback()
    if left_out:
        raise ExportIncompleteError(left_out, counts)
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


def _parse(number: int, raw: bytes, cut: list[int]) -> tuple[str, dict[str, Any]]:
    """Parse and check one line; return its record type and the row to insert. A session
    whose title was cut adds one to ``cut[0]``."""
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
    if kind == "session" and row["title"] != data["title"]:
        cut[0] += 1
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
    """Checks that each event follows its session, and loads the rows, tagged by line.

    Into an encrypted store (``env``), the export's data keys are unwrapped as they come
    (a wrong keyring fails at the first) and loaded, and the sealed events and memories
    are indexed (``sealed_transfer.BlindIndexer``).
    """

    def __init__(self, conn: TransactionConnection, env: Envelope | None) -> None:
        self.loader = Loader(
            conn,
            [table for table, _ in RECORDS.values()],
            batch_rows=BATCH_SIZE,
            where=lambda line: f"on line {line}",
        )
        self.conn = conn
        self.session: dict[str, Any] | None = None
        self.last_seq = 0
        self.terms: Counter[tuple[str, str, str, str]] = Counter()
        self.index_keys = 0
        self.keys_done = False
        self.blind: BlindIndexer | None = None
        if env is not None:
            from .sealed_transfer import BlindIndexer

            self.blind = BlindIndexer(conn, env, self.loader.flush)

    async def add(self, number: int, kind: str, row: dict[str, Any], size: int) -> None:
        blind = self.blind
        if blind is not None and kind != "key" and not self.keys_done:
            blind.end_of_keys()
            self.keys_done = True
        if kind == "key":
            if blind is None:
                raise KeyringRequiredError(number)
            await blind.check_key(number, row)
            if row["kind"] == "index":
                # The database's own index key, if it has one, indexes the imported events.
                await blind.add_index_key(row)
                self.index_keys += 1
                return
            blind.keys_held = True
        elif kind == "session":
            row["incarnation"] = new_id()
            self.session, self.last_seq = row, 0
        elif kind == "event":
            self._check_event(number, row)
            if blind is not None:
                await blind.event(number, row)
        elif kind == "memory":
            terms = None if blind is None else await blind.memory_terms(number, row)
            if terms is None:
                terms = stored_terms(row["org_id"], row["app_name"], row["user_id"], row["text"])
            row["terms"] = terms
            owner: tuple[str, str, str] = (row["org_id"], row["app_name"], row["user_id"])
            every = (*owner, "")
            self.terms[every] += 1
            self.terms.update((*owner, term) for term in row["terms"].split(" ")[1:])
        await self.loader.add(RECORDS[kind][0], row, size=size, tag=number)
        if blind is not None and blind.pending >= BATCH_SIZE:
            await self.loader.flush()  # the events' rows first, then their index
            await blind.write()

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

    async def finish(self) -> TransferCounts:
        unreadable = 0
        if self.blind is not None:
            if not self.keys_done:
                self.blind.end_of_keys()
            await self.loader.flush()
            await self.blind.write()
            unreadable = len(self.blind.unreadable)
        await self.loader.finish()
        await self._count_terms()
        counts = TransferCounts(**self.loader.counted())
        counts.keys += self.index_keys
        counts.keys_unreadable = unreadable
        return counts

    async def _count_terms(self) -> None:
        """Add the imported memories' terms to their owners' term counts
        (``ds_memory_terms``), in key order."""
        if not self.terms:
            return
        table = memory_terms
        ops = dialect_ops(self.conn.dialect.name, self.conn.dialect.driver)
        stmt = ops.insert(table)
        if ops.is_mysql:  # the key of ON DUPLICATE KEY is the primary key
            stmt = stmt.on_duplicate_key_update(  # type: ignore[attr-defined]
                n=table.c.n + stmt.inserted.n  # type: ignore[attr-defined]
            )
        else:
            stmt = stmt.on_conflict_do_update(  # type: ignore[attr-defined]
                index_elements=["org_id", "app_name", "user_id", "term"],
                set_={"n": table.c.n + stmt.excluded.n},  # type: ignore[attr-defined]
            )
        names = ("org_id", "app_name", "user_id", "term")
        params = [
            {**dict(zip(names, key, strict=True)), "n": n} for key, n in sorted(self.terms.items())
        ]
        for start in range(0, len(params), BATCH_SIZE):
            await self.conn.execute(stmt, params[start : start + BATCH_SIZE])


@contextmanager
def _line_of_clash() -> Iterator[None]:
    """A row that already exists is the error of its line."""
    try:
        yield
    except RowExistsError as exc:
        raise ImportLineError(exc.tag, str(exc)) from exc


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

    Every field is checked as a store checks it: a timestamp outside ``prepare.EARLIEST``
    to ``prepare.LATEST`` (0001-01-02 to 9999-12-30 UTC) is refused. A session title longer
    than ``prepare.MAX_TITLE_BYTES`` (1,024 UTF-8 bytes, a limit older databases did not
    have) is cut to it at a character boundary, not refused, and counted (``titles_cut``).
    The planner's statistics of the tables written are refreshed (``ANALYZE``) before the
    transaction commits.

    Raises:
        ImportLineError: A line is malformed, or its session or state row already exists;
            nothing is written.
        SchemaNotMigratedError: The database is not migrated.
        StoreUnavailableError: The database could not be reached.
    """
    with _database("import"), _line_of_clash():
        async with write_transaction(store.engine) as conn:
            importer = _Importer(conn, store._env)
            number = 0
            cut = [0]
            for number, raw in enumerate(_reading(lines), start=1):
                if progress is not None:
                    progress(len(raw))
                body = raw.rstrip(b"\n")
                if number == 1:
                    _check_header(body)
                    continue
                if not body.strip():
                    raise ImportLineError(number, "empty line")
                kind, row = _parse(number, body, cut)
                await importer.add(number, kind, row, len(body))
            if number == 0:
                raise ImportLineError(1, f"the input is empty (expected a {FORMAT} export)")
            counts = await importer.finish()
    counts.titles_cut = cut[0]
    return counts
