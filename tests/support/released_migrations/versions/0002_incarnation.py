"""Session incarnations: a copy read before a delete never writes into a re-created id.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 00:00:00

Adds ``ds_sessions.incarnation``, set to a fresh id by every create and fork. Rows that
exist when this runs keep an empty incarnation, which is still unique to them: any session
created afterwards under the same id gets a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the incarnation column (empty for existing sessions)."""
    op.add_column(
        "ds_sessions", sa.Column("incarnation", sa.String(36), nullable=False, server_default="")
    )


def downgrade() -> None:
    """Drop the incarnation column."""
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of ds_sessions would
    # cascade-delete every event through the foreign key.
    op.drop_column("ds_sessions", "incarnation")
