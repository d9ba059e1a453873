"""Initial schema: sessions, user state, app state and events.

Revision ID: 0001
Revises:
Create Date: 2025-11-30 00:00:00

A frozen snapshot of durable_sessions.sql.schema at the time of writing: every table,
column and type is spelled out here; the live schema module is not imported.

On MySQL (and MariaDB) ids, titles and state keys are ``VARBINARY`` (compared byte for
byte; their UTF-8 size limits keep every key within InnoDB's 3,072 bytes), JSON is
``LONGTEXT``, timestamps ``DATETIME(6)`` in UTC, and every table is InnoDB in utf8mb4.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


MYSQL = ("mysql", "mariadb")
"""The names SQLAlchemy gives the MySQL dialects."""

TABLE_OPTIONS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}
"""Every table on MySQL: InnoDB, utf8mb4."""


def _pk(name: str) -> str | None:
    """A primary key's name: none on MySQL, which names every primary key PRIMARY."""
    return None if op.get_context().dialect.name in MYSQL else name


def _id() -> sa.types.TypeEngine[str]:
    """An identifier column: org, session, user, app, event and author ids (at most 512
    UTF-8 bytes)."""
    return sa.String(255).with_variant(mysql.VARBINARY(512), *MYSQL)


def _text(size: int) -> sa.types.TypeEngine[str]:
    """Unbounded text; on MySQL bytes, ``size`` at most (titles, state keys)."""
    return sa.Text().with_variant(mysql.VARBINARY(size), *MYSQL)


def _json() -> sa.types.TypeEngine[object]:
    """JSON as TEXT on SQLite (a JSON column would get NUMERIC affinity), JSONB on Postgres,
    LONGTEXT on MySQL."""
    return (
        sa.Text()
        .with_variant(postgresql.JSONB(), "postgresql")
        .with_variant(mysql.LONGTEXT(), *MYSQL)
    )


def _timestamp() -> sa.types.TypeEngine[object]:
    """A timezone-aware timestamp (timestamptz on Postgres; DATETIME(6), UTC, on MySQL)."""
    return sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL)


def upgrade() -> None:
    """Create the four tables and their indexes."""
    op.create_table(
        "ds_sessions",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("id", _id(), nullable=False),
        sa.Column("user_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("title", _text(1024), nullable=False),
        sa.Column("state", _json(), nullable=False),
        sa.Column("parent_id", _id(), nullable=True),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.Column("message_count", sa.BigInteger(), nullable=False),
        sa.Column("token_total", sa.BigInteger(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "id", name=_pk("pk_ds_sessions")),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_ds_sessions_org_user_updated",
        "ds_sessions",
        ["org_id", "user_id", "updated_at", "id"],
        unique=False,
    )
    op.create_index(
        "ix_ds_sessions_org_updated",
        "ds_sessions",
        ["org_id", "updated_at", "id"],
        unique=False,
    )

    op.create_table(
        "ds_user_state",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("user_id", _id(), nullable=False),
        sa.Column("key", _text(1024), nullable=False),
        sa.Column("value", _json(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint(
            "org_id", "app_name", "user_id", "key", name=_pk("pk_ds_user_state")
        ),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_ds_user_state_org_user",
        "ds_user_state",
        ["org_id", "user_id"],
        unique=False,
    )

    op.create_table(
        "ds_app_state",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("key", _text(1024), nullable=False),
        sa.Column("value", _json(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "app_name", "key", name=_pk("pk_ds_app_state")),
        **TABLE_OPTIONS,
    )

    op.create_table(
        "ds_events",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("session_id", _id(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("id", _id(), nullable=False),
        sa.Column("author", _id(), nullable=False),
        sa.Column("invocation_id", _id(), nullable=False),
        sa.Column("content", _json(), nullable=True),
        sa.Column("state_delta", _json(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("timestamp", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "session_id", "seq", name=_pk("pk_ds_events")),
        sa.ForeignKeyConstraint(
            ["org_id", "session_id"],
            ["ds_sessions.org_id", "ds_sessions.id"],
            name="fk_ds_events_org_id_session_id_ds_sessions",
            ondelete="CASCADE",
        ),
        **TABLE_OPTIONS,
    )


def downgrade() -> None:
    """Drop the four tables and their indexes, dependents first."""
    op.drop_table("ds_events")
    op.drop_table("ds_app_state")
    op.drop_index("ix_ds_user_state_org_user", table_name="ds_user_state")
    op.drop_table("ds_user_state")
    op.drop_index("ix_ds_sessions_org_updated", table_name="ds_sessions")
    op.drop_index("ix_ds_sessions_org_user_updated", table_name="ds_sessions")
    op.drop_table("ds_sessions")
