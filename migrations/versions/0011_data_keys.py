"""The table of an encrypted store's data keys, each wrapped by a master key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 06:30:00

``ds_keys`` holds one row per data key (``durable_sessions.sealing``): the organisation,
the key's id (which every sealed value names), its kind and owner (a user's, an app's, or
the organisation's blind index key), the id of the master key that wrapped it and the
wrapped key (base64). A store without a keyring never reads or writes it.

Online: a new, empty table and its index, created in one short transaction; no table that
holds data is touched. The downgrade drops the table: data keys are destroyed with it, so a
database encrypted meanwhile cannot be read after a downgrade (run ``durable-sessions keys
reencrypt`` the other way first, or keep it at this revision).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


MYSQL = ("mysql", "mariadb")


def _id(length: int = 255, size: int = 512) -> sa.types.TypeEngine[str]:
    """An id column; on Postgres under the C collation, as revision 0004 gives every id; on
    MySQL its UTF-8 bytes (``size`` at most), compared exactly, as revision 0001 has them."""
    return (
        sa.String(length)
        .with_variant(sa.String(length, collation="C"), "postgresql")
        .with_variant(mysql.VARBINARY(size), *MYSQL)
    )


def _timestamp() -> sa.types.TypeEngine[object]:
    return sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL)


def upgrade() -> None:
    """Create ``ds_keys`` and its index (if a run stopped after that, nothing to do)."""
    if sa.inspect(op.get_bind()).has_table("ds_keys"):
        return
    op.create_table(
        "ds_keys",
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("key_id", _id(64, 64), nullable=False),
        sa.Column("kind", _id(16, 16), nullable=False),
        sa.Column("owner", _id(), nullable=False),
        sa.Column("master_id", sa.Text(), nullable=False),
        sa.Column("wrapped", sa.Text(), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint(
            "org_id",
            "key_id",
            name=None if op.get_context().dialect.name in MYSQL else "pk_ds_keys",
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mariadb_engine="InnoDB",
        mariadb_charset="utf8mb4",
        mariadb_collate="utf8mb4_bin",
    )
    op.create_index(
        "ix_ds_keys_org_kind_owner", "ds_keys", ["org_id", "kind", "owner", "created_at"]
    )


def downgrade() -> None:
    """Drop ``ds_keys`` (and with it every data key)."""
    op.drop_index("ix_ds_keys_org_kind_owner", table_name="ds_keys")
    op.drop_table("ds_keys")
