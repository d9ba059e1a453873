"""The one SQLAlchemy Core schema, shared by SQLite, Postgres and MySQL (MariaDB).

On MySQL every id, name and state key is ``VARBINARY``: compared, ordered and indexed byte
for byte (so in code point order, as Postgres's "C" collation and SQLite do), where
MySQL's text collations fold case, pad with spaces or equate Unicode forms; the UTF-8 size
limits of ids and keys (``state.MAX_ID_BYTES``, ``state.MAX_KEY_BYTES``) keep every key
within InnoDB's 3,072 bytes. JSON payloads are ``LONGTEXT`` (up to 4 GB).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    ForeignKeyConstraint,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.postgresql import JSON, JSONB
from sqlalchemy.types import TypeEngine

from ..jsoncodec import from_json, to_json
from ..state import MAX_ID_BYTES, MAX_ID_LENGTH, MAX_KEY_BYTES

__all__ = [
    "MYSQL_NAMES",
    "MYSQL_TABLE",
    "SEALED_TITLE_BYTES",
    "VERSION_TABLE",
    "JSONDocument",
    "JSONValue",
    "UTCDateTime",
    "app_state",
    "events",
    "keys",
    "memories",
    "memory_terms",
    "metadata",
    "sessions",
    "user_state",
]

VERSION_TABLE = "durable_sessions_alembic_version"
"""Alembic's version table for this library, kept apart from the host application's."""

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

MYSQL_NAMES = ("mysql", "mariadb")
"""The names SQLAlchemy gives the MySQL dialects (MariaDB's is apart)."""

MYSQL_TABLE: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}
"""The options of every table on MySQL: InnoDB (row locks, foreign keys), utf8mb4."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""The schema of every table durable-sessions owns; Alembic's revisions mirror it."""


class _JSONText(TypeDecorator[Any]):
    """JSON kept as TEXT on SQLite.

    A column declared ``JSON`` has NUMERIC affinity in SQLite, which turns the text
    ``1.0`` into the integer 1 and long integers into lossy floats; TEXT keeps it as written.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return to_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else from_json(value)


class _PostgresJSON(TypeDecorator[Any]):
    """Postgres's JSON types, written through ``to_json`` so numbers keep their type."""

    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        # asyncpg's json and jsonb codecs (installed by SQLAlchemy) take the JSON text.
        return to_json

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        # The dialect's own type: on asyncpg its codec has decoded the value already
        # (SQLAlchemy 2.0's plain JSONB would decode it a second time).
        return self.impl_instance.dialect_impl(dialect).result_processor(dialect, coltype)


class _JSONB(_PostgresJSON):
    """JSONB: a parsed value, with Postgres's operators (state, deltas, shared values)."""

    impl = JSONB
    cache_ok = True


class _JSONDocument(_PostgresJSON):
    """JSON: its text, checked when written and sent as stored (event contents)."""

    impl = JSON
    cache_ok = True


class _MySQLJSONText(_JSONText):
    """JSON kept as LONGTEXT on MySQL (TEXT stops at 64 KB)."""

    impl = mysql.LONGTEXT  # type: ignore[assignment]
    cache_ok = True


class _Bytes(TypeDecorator[str]):
    """A string kept as ``VARBINARY`` on MySQL: its UTF-8 bytes, compared exactly."""

    impl = mysql.VARBINARY
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return value.encode("utf-8") if isinstance(value, str) else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else value


def _text_of(length: int | None, size: int) -> TypeEngine[str]:
    """A string column: ``String(length)`` (``Text`` when None) elsewhere, ``VARBINARY(size)``
    on MySQL."""
    base: TypeEngine[str] = String(length) if length is not None else Text()
    return base.with_variant(_Bytes(size), *MYSQL_NAMES)


_MYSQL_JSON = _MySQLJSONText()

JSONValue = _JSONText().with_variant(_JSONB(), "postgresql").with_variant(_MYSQL_JSON, *MYSQL_NAMES)
"""JSON as TEXT on SQLite, JSONB on Postgres; numbers come back with the type they had."""

JSONDocument = (
    _JSONText().with_variant(_JSONDocument(), "postgresql").with_variant(_MYSQL_JSON, *MYSQL_NAMES)
)
"""JSON as TEXT on SQLite and JSON on Postgres (revision 0007): an event's content, which
reads send as stored, without Postgres rebuilding its text from ``jsonb``."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    Postgres keeps ``timestamptz``; SQLite keeps naive UTC text, which sorts correctly.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in MYSQL_NAMES:  # microseconds (a plain DATETIME keeps seconds)
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return super().load_dialect_impl(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use timezone-aware UTC")
        value = value.astimezone(timezone.utc)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        if dialect.driver == "asyncpg":
            return None  # asyncpg already returns timestamptz as an aware UTC datetime
        if dialect.name == "sqlite":
            return _sqlite_utc  # one C call instead of SQLAlchemy's parser and ours
        return super().result_processor(dialect, coltype)


def _sqlite_utc(value: Any) -> datetime | None:
    """Read SQLAlchemy's SQLite timestamp text ("YYYY-MM-DD HH:MM:SS.ffffff", UTC)."""
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value + "+00:00")  # one call: parsed with its zone
    except (TypeError, ValueError):
        return datetime.fromisoformat(value).replace(tzinfo=timezone.utc)


LONG_TEXT = Text().with_variant(mysql.LONGTEXT(), *MYSQL_NAMES)
"""Unbounded text: ``LONGTEXT`` on MySQL (its TEXT stops at 64 KB)."""

ID = _text_of(MAX_ID_LENGTH, MAX_ID_BYTES)
KEY = _text_of(None, MAX_KEY_BYTES)

SEALED_TITLE_BYTES = 8448
"""The size of a title's column on MySQL (revision 0014): a title sealed by a store with a
keyring. A title of ``prepare.MAX_TITLE_BYTES`` (1,024) UTF-8 bytes has a JSON text of at
most 6,146 bytes (1,024 control characters, each escaped as ``\\u0001``, and two quotes);
sealed, a 12-byte nonce and a 16-byte tag make 6,174 bytes, 8,232 in base64, after a head
``dse1:<key id>:`` of at most 70 bytes (a key id has at most 64, ``keys.key_id``): 8,302,
rounded up to a multiple of 256. Titles are still checked against 1,024 bytes."""

TITLE = _text_of(None, SEALED_TITLE_BYTES)
"""A session title: unbounded text (SQLite, Postgres), ``VARBINARY(SEALED_TITLE_BYTES)`` on
MySQL."""

TERM = _text_of(None, 1024)
"""A term of memories: a word of at most ``fulltext.MAX_WORD`` (255) characters, 1,020 UTF-8
bytes (``VARBINARY`` on MySQL, where it is part of a primary key)."""

sessions = Table(
    "ds_sessions",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("id", ID, nullable=False),
    Column("user_id", ID, nullable=False),
    Column("app_name", ID, nullable=False),
    Column("title", TITLE, nullable=False),
    # Private state only; user: and app: keys live one row per key in their own tables.
    Column("state", JSONValue, nullable=False),
    Column("parent_id", ID, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("message_count", BigInteger, nullable=False),
    Column("token_total", BigInteger, nullable=False),
    # The last seq handed to an event; the row lock on it keeps seqs gapless.
    Column("event_seq", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    # Which life of the id this row is: new at every create, so a copy read before a delete
    # never writes into a later session that reuses the id (versions restart at 1).
    Column("incarnation", _text_of(36, 36), nullable=False, server_default=""),
    PrimaryKeyConstraint("org_id", "id"),
    # Neither listing index can serve a lookup by key (org_id = ? AND id = ?), which must
    # take the primary key whatever the statistics (revision 0005): with none, Postgres
    # prices an org_id-only range of either as one row too, and a plan cached on a small
    # table keeps reading the whole organisation as it grows.
    # Serves list(): one user's sessions newest first (scanned backwards). It leads with
    # user_id: a lookup by key binds nothing of it.
    Index("ix_ds_sessions_user_org_updated", "user_id", "org_id", "updated_at", "id"),
    # Serves list() over a whole organisation and purge() by age. On Postgres org_id is
    # indexed under "POSIX" (the byte order of the column's "C"): only a condition under
    # that collation (Statements.whole_org) uses it, never org_id = :k_org.
    Index(
        "ix_ds_sessions_org_updated",
        "org_id",
        "updated_at",
        "id",
        postgresql_ops={"org_id": 'COLLATE "POSIX"'},
    ),
    **MYSQL_TABLE,
)

user_state = Table(
    "ds_user_state",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("app_name", ID, nullable=False),
    Column("user_id", ID, nullable=False),
    Column("key", KEY, nullable=False),
    Column("value", JSONValue, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("org_id", "app_name", "user_id", "key"),
    # Serves delete_user(), which spans every app of the organisation.
    Index("ix_ds_user_state_org_user", "org_id", "user_id"),
    **MYSQL_TABLE,
)

app_state = Table(
    "ds_app_state",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("app_name", ID, nullable=False),
    Column("key", KEY, nullable=False),
    Column("value", JSONValue, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("org_id", "app_name", "key"),
    **MYSQL_TABLE,
)

events = Table(
    "ds_events",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("session_id", ID, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("id", ID, nullable=False),
    Column("author", ID, nullable=False),
    Column("invocation_id", ID, nullable=False),
    Column("content", JSONDocument, nullable=True),
    Column("state_delta", JSONValue, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("timestamp", UTCDateTime, nullable=False),
    # (org, session, seq) is the recent-events index: the newest N are a backward range scan.
    PrimaryKeyConstraint("org_id", "session_id", "seq"),
    ForeignKeyConstraint(
        ["org_id", "session_id"],
        ["ds_sessions.org_id", "ds_sessions.id"],
        ondelete="CASCADE",
    ),
    **MYSQL_TABLE,
)

memories = Table(
    "ds_memories",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("app_name", ID, nullable=False),
    Column("user_id", ID, nullable=False),
    Column("id", ID, nullable=False),
    Column("author", ID, nullable=True),
    Column("timestamp", UTCDateTime, nullable=False),
    Column("text", LONG_TEXT, nullable=False),
    Column("content", JSONDocument, nullable=True),
    Column("metadata", JSONValue, nullable=False),
    # The session and event it came from, if any: no foreign key, a memory outlives them.
    Column("session_id", ID, nullable=True),
    Column("seq", BigInteger, nullable=True),
    # What the full-text index reads (revision 0010): the owner's token, then the terms of
    # the text (``durable_sessions.memories.stored_terms``), computed by the writer.
    Column("terms", LONG_TEXT, nullable=False),
    PrimaryKeyConstraint("org_id", "app_name", "user_id", "id"),
    # Serves delete_user(), which spans every app of the organisation.
    Index("ix_ds_memories_org_user", "org_id", "user_id"),
    **MYSQL_TABLE,
)
"""Long-term memories: one row per memory, keyed by organisation, app and user."""

keys = Table(
    "ds_keys",
    metadata,
    # The data keys of an encrypted store (``SQLStore(engine, keyring=...)``), each wrapped
    # by the keyring's master key ``master_id``; sealed values name their key by ``key_id``.
    Column("org_id", ID, nullable=False),
    Column("key_id", _text_of(64, 64), nullable=False),
    # "user" (owner: a user id), "app" (owner: an app name) or "index" (owner: "").
    Column("kind", _text_of(16, 16), nullable=False),
    Column("owner", ID, nullable=False),
    Column("master_id", Text, nullable=False),
    Column("wrapped", Text, nullable=False),  # base64
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("org_id", "key_id"),
    # Serves a scope's newest key, and the erasure of a user's.
    Index("ix_ds_keys_org_kind_owner", "org_id", "kind", "owner", "created_at"),
    **MYSQL_TABLE,
)

memory_terms = Table(
    "ds_memory_terms",
    metadata,
    Column("org_id", ID, nullable=False),
    Column("app_name", ID, nullable=False),
    Column("user_id", ID, nullable=False),
    # A term of the user's memories; "" stands for all of them.
    Column("term", TERM, nullable=False),
    # How many of the user's memories (in that app) hold the term: a search's weights.
    Column("n", BigInteger, nullable=False),
    PrimaryKeyConstraint("org_id", "app_name", "user_id", "term"),
    # Serves delete_user(), which spans every app of the organisation.
    Index("ix_ds_memory_terms_org_user", "org_id", "user_id"),
    **MYSQL_TABLE,
)
"""How many of each user's memories hold each term, kept by the writes of memories."""
