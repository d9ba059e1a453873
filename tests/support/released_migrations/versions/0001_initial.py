"""Initial schema: sessions, user state, app state and events.

Revision ID: 0001
Revises:
Create Date: 2025-11-30 00:00:00

A frozen snapshot of durable_sessions.sql.schema at the time of writing: every table,
column and type is spelled out here; the live schema module is not imported.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.String:
    """An identifier column: org, session, user, app, event and author ids."""
    return sa.String(255)


def _json() -> sa.types.TypeEngine[object]:
    """JSON as TEXT on SQLite (a JSON column would get NUMERIC affinity), JSONB on Postgres."""
    return sa.Text().with_variant(postgresql.JSONB(), "postgresql")


def _timestamp() -> sa.DateTime:
    """A timezone-aware timestamp (timestamptz on Postgres)."""
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the four tables and their indexes."""
    op.create_table(
        "ds_sessions",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("id", _id(), nullable=False),
        sa.Column("user_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("state", _json(), nullable=False),
        sa.Column("parent_id", _id(), nullable=True),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.Column("message_count", sa.BigInteger(), nullable=False),
        sa.Column("token_total", sa.BigInteger(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "id", name="pk_ds_sessions"),
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
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", _json(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "app_name", "user_id", "key", name="pk_ds_user_state"),
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
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", _json(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "app_name", "key", name="pk_ds_app_state"),
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
        sa.PrimaryKeyConstraint("org_id", "session_id", "seq", name="pk_ds_events"),
        sa.ForeignKeyConstraint(
            ["org_id", "session_id"],
            ["ds_sessions.org_id", "ds_sessions.id"],
            name="fk_ds_events_org_id_session_id_ds_sessions",
            ondelete="CASCADE",
        ),
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
