"""Long-term memory: the table ``ds_memories`` and its full-text index.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 06:30:00

One row per memory, keyed by organisation, app, user and id (the organisation first, so
that Citus can distribute it with the other tables): author, timestamp, text, content
(JSON), metadata (a JSON object), the session and event seq it came from (no foreign key:
a memory outlives its session), and ``terms``: what the full-text index reads, written by
the store (the owner's token and the terms of the text, space-separated; see
``durable_sessions.memories``).

- Postgres: ``search_vector``, a generated ``tsvector`` of the terms (stored; Citus runs no
  trigger on a distributed table, a generated column it computes), under the GIN index
  ``ix_ds_memories_search``. Neither is in the SQLAlchemy metadata.
- SQLite: the FTS5 table ``ds_memories_fts`` over the terms, read through the view
  ``ds_memories_fts_text`` and keyed by ``ds_memories_fts_rowid`` (never by the table's own
  rowid, which VACUUM may renumber), kept in step by triggers on insert, delete and update,
  with the tokenizer of the events' index (revision 0003).
- MySQL: no index of the terms; a search reads the user's memories (a range of the primary
  key) and matches their terms as whole space-separated items.

The table is new and empty: creating it waits for no one. Online (``online.py``): each index
is built in a step of its own (``CONCURRENTLY`` on Postgres). The downgrade drops all of it,
memories included.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "ds_memories"
SEARCH_INDEX = "ix_ds_memories_search"
USER_INDEX = "ix_ds_memories_org_user"
SQLITE_TRIGGERS = ("ds_memories_fts_insert", "ds_memories_fts_delete", "ds_memories_fts_update")
KEY = ("org_id", "app_name", "user_id", "id")


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module, loaded by path."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


MYSQL = ("mysql", "mariadb")


def _mysql() -> bool:
    return op.get_context().dialect.name in MYSQL


def _text() -> sa.types.TypeEngine[str]:
    """Unbounded text (LONGTEXT on MySQL)."""
    return sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL)


def _id() -> sa.types.TypeEngine[str]:
    """An identifier column: compared by code point (the C collation on Postgres)."""
    return (
        sa.String(255)
        .with_variant(sa.String(255, collation="C"), "postgresql")
        .with_variant(mysql.VARBINARY(512), *MYSQL)
    )


def _json() -> sa.types.TypeEngine[object]:
    """JSON as TEXT on SQLite, JSONB on Postgres (the metadata)."""
    return (
        sa.Text()
        .with_variant(postgresql.JSONB(), "postgresql")
        .with_variant(mysql.LONGTEXT(), *MYSQL)
    )


def _document() -> sa.types.TypeEngine[object]:
    """JSON as TEXT on SQLite, JSON (its text as written) on Postgres (the content)."""
    return (
        sa.Text()
        .with_variant(postgresql.JSON(), "postgresql")
        .with_variant(mysql.LONGTEXT(), *MYSQL)
    )


def upgrade() -> None:
    """Create ``ds_memories`` and its full-text index."""
    r3 = _revision("0003_search.py")
    online = r3.online
    columns: list[sa.Column[object]] = [
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("user_id", _id(), nullable=False),
        sa.Column("id", _id(), nullable=False),
        sa.Column("author", _id(), nullable=True),
        sa.Column(
            "timestamp",
            sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL),
            nullable=False,
        ),
        sa.Column("text", _text(), nullable=False),
        sa.Column("content", _document(), nullable=True),
        sa.Column("metadata", _json(), nullable=False),
        sa.Column("session_id", _id(), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("terms", _text(), nullable=False),
    ]
    if _postgres():
        columns.append(
            sa.Column(
                "search_vector",
                postgresql.TSVECTOR(),
                sa.Computed("array_to_tsvector(string_to_array(terms, ' '))", persisted=True),
            )
        )
    op.create_table(
        TABLE,
        *columns,
        sa.PrimaryKeyConstraint(*KEY, name=None if _mysql() else "pk_ds_memories"),
        if_not_exists=True,
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mariadb_engine="InnoDB",
        mariadb_charset="utf8mb4",
        mariadb_collate="utf8mb4_bin",
    )
    if not _postgres() and not _mysql():
        _upgrade_sqlite(r3)
    online.create_index(USER_INDEX, f"ON {TABLE} (org_id, user_id)")
    if _postgres():
        online.create_index(SEARCH_INDEX, f"ON {TABLE} USING gin (search_vector)")


def _upgrade_sqlite(r3: ModuleType) -> None:
    q = r3.Q
    separators = "".join(
        chr(c) for a, b in r3._ranges(r3.SQLITE_SEPARATORS) for c in range(a, b + 1)
    )
    tokenize = (
        "unicode61 remove_diacritics 0 categories 'L* N* M* Co' "
        f"separators '{separators.replace(q, q + q)}'"
    )
    key = " AND ".join(f"{c} = {{0}}.{c}" for c in KEY)
    op.execute(
        "CREATE TABLE IF NOT EXISTS ds_memories_fts_rowid (rid INTEGER PRIMARY KEY, "
        "org_id VARCHAR(255) NOT NULL, app_name VARCHAR(255) NOT NULL, "
        "user_id VARCHAR(255) NOT NULL, id VARCHAR(255) NOT NULL, "
        "UNIQUE (org_id, app_name, user_id, id))"
    )
    op.execute(
        "CREATE VIEW IF NOT EXISTS ds_memories_fts_text (rid, terms) AS SELECT k.rid, m.terms "
        "FROM ds_memories_fts_rowid AS k JOIN ds_memories AS m ON "
        + " AND ".join(f"m.{c} = k.{c}" for c in KEY)
    )
    op.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS ds_memories_fts USING fts5(terms, "
        "content='ds_memories_fts_text', content_rowid='rid', "
        f"tokenize='{tokenize.replace(q, q + q)}')"
    )
    insert = (
        "INSERT INTO ds_memories_fts_rowid (org_id, app_name, user_id, id) "
        "VALUES (new.org_id, new.app_name, new.user_id, new.id); "
        "INSERT INTO ds_memories_fts (rowid, terms) VALUES (last_insert_rowid(), new.terms); "
    )
    remove = (
        "INSERT INTO ds_memories_fts (ds_memories_fts, rowid, terms) SELECT 'delete', rid, "
        f"old.terms FROM ds_memories_fts_rowid WHERE {key.format('old')}; "
        f"DELETE FROM ds_memories_fts_rowid WHERE {key.format('old')}; "
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_memories_fts_insert AFTER INSERT ON ds_memories "
        f"BEGIN {insert}END"
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_memories_fts_delete AFTER DELETE ON ds_memories "
        f"BEGIN {remove}END"
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_memories_fts_update AFTER UPDATE OF org_id, app_name, "
        f"user_id, id, terms ON ds_memories BEGIN {remove}{insert}END"
    )


def downgrade() -> None:
    """Drop ``ds_memories`` (its memories with it) and its full-text index."""
    if _mysql():  # its index goes with it
        op.execute(f"DROP TABLE IF EXISTS {TABLE}")
        return
    if _postgres():
        op.execute(f"DROP INDEX IF EXISTS {SEARCH_INDEX}")
    else:
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS ds_memories_fts")
        op.execute("DROP VIEW IF EXISTS ds_memories_fts_text")
        op.execute("DROP TABLE IF EXISTS ds_memories_fts_rowid")
    op.execute(f"DROP INDEX IF EXISTS {USER_INDEX}")
    op.execute(f"DROP TABLE IF EXISTS {TABLE}")
