"""Session incarnations: a copy read before a delete never writes into a re-created id.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 00:00:00

Adds ``ds_sessions.incarnation``, set to a fresh id by every create and fork. Rows that
exist when this runs keep an empty incarnation, which is still unique to them: any session
created afterwards under the same id gets a new one.

Online: a column with a constant default changes only the catalog (Postgres 11 and later,
and SQLite), so the table's lock lasts an instant; on Postgres it is taken under the lock
timeout and tried again (``online.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _online() -> ModuleType:
    """The online steps of the revisions (``migrations/online.py``), loaded by path."""
    path = Path(__file__).resolve().parents[1] / "online.py"
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_online_{revision}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


online = _online()


def upgrade() -> None:
    """Add the incarnation column (empty for existing sessions)."""
    if op.get_context().dialect.name == "postgresql":
        online.ddl(
            "ALTER TABLE ds_sessions ADD COLUMN IF NOT EXISTS incarnation varchar(36) "
            "NOT NULL DEFAULT ''"
        )
        return
    op.add_column(
        "ds_sessions",
        sa.Column(
            "incarnation",
            sa.String(36).with_variant(mysql.VARBINARY(36), "mysql", "mariadb"),
            nullable=False,
            server_default="",
        ),
    )


def downgrade() -> None:
    """Drop the incarnation column."""
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of ds_sessions would
    # cascade-delete every event through the foreign key.
    op.drop_column("ds_sessions", "incarnation")
