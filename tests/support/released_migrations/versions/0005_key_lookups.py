"""A lookup by primary key can take no other index of ds_sessions (Postgres's cached plans).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 03:00:00

On tables never analysed, Postgres has no statistics of ``org_id`` and prices
``org_id = $1`` at 0.5% of the rows. While ``ds_sessions`` holds a few thousand sessions
or fewer, a range of the two listing indexes on ``org_id`` alone then costs what the
primary key costs for ``org_id = $1 AND id = $2`` (one row each, rounded up), and the tie
goes to the index created last: ``ix_ds_sessions_org_updated``. A generic plan made then
(asyncpg prepares every statement; Postgres keeps a plan per connection after five
executions, and one for the foreign-key check of each event insert) keeps reading every
index entry of the organisation for each lookup as the table grows, until an ANALYZE
makes it plan again. This is what a new deployment does from its first session.

Here no listing index can serve a lookup by key:

- the index of one user's sessions leads with ``user_id`` (``(user_id, org_id,
  updated_at, id)``, renamed ``ix_ds_sessions_user_org_updated``): a lookup by key
  binds none of its leading column, so it costs a scan of the whole index;
- on Postgres, the index of an organisation's sessions compares ``org_id`` under the
  collation "POSIX" (the same byte order as the column's "C"; equality is unchanged), so
  that only a condition written ``org_id COLLATE "POSIX" = ...`` (the organisation-wide
  listings and purge) can use it; ``org_id = $1`` (every lookup by key, the foreign-key
  check) cannot.

SQLite plans a lookup by the whole of a unique key before anything else, and gets only the
new column order. On Postgres the two indexes are built again under the table's SHARE
lock (writes wait; reads go on): a pause that grows with the number of sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "ds_sessions"


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    """Lead the user index with user_id; on Postgres, org_id of the organisation index
    under "POSIX"."""
    op.drop_index("ix_ds_sessions_org_user_updated", table_name=TABLE)
    op.create_index(
        "ix_ds_sessions_user_org_updated", TABLE, ["user_id", "org_id", "updated_at", "id"]
    )
    if _postgres():
        op.drop_index("ix_ds_sessions_org_updated", table_name=TABLE)
        op.execute(
            f'CREATE INDEX ix_ds_sessions_org_updated ON {TABLE} (org_id COLLATE "POSIX", '
            "updated_at, id)"
        )


def downgrade() -> None:
    """Put back revision 0004's two indexes of sessions."""
    if _postgres():
        op.drop_index("ix_ds_sessions_org_updated", table_name=TABLE)
        op.create_index("ix_ds_sessions_org_updated", TABLE, ["org_id", "updated_at", "id"])
    op.drop_index("ix_ds_sessions_user_org_updated", table_name=TABLE)
    op.create_index(
        "ix_ds_sessions_org_user_updated", TABLE, ["org_id", "user_id", "updated_at", "id"]
    )
