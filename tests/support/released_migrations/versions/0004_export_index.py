"""Postgres compares ids and state keys by code point (the C collation), as SQLite does.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 01:30:00

Every id and key column of the four tables takes the C collation on Postgres, so their
primary keys and indexes are ordered by code point, the order of SQLite's BINARY and of
Python. The export's keyset walk lists rows in that order (the same bytes from either
dialect) and now reads each page straight from a primary key, instead of sorting the whole
table for every page. Comparisons of ids become byte comparisons; equality is unchanged
(every collation involved is deterministic), and so is every value stored.

On Postgres this rebuilds the indexes of the four tables (no table is rewritten: the types
stay the same) under their ACCESS EXCLUSIVE locks: a pause that grows with the size of the
indexes. Nothing changes on SQLite, whose text comparisons are by code point already.

Citus refuses to alter a distribution column. On tables distributed before this revision
runs, ``org_id`` keeps its collation and every other column changes; the export stays
correct there, but sorts the rows of each page again. A database migrated before it is
distributed (as the README says) gets the C collation everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = "varchar(255)"
KEY = "text"
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "ds_sessions": [
        ("org_id", ID), ("id", ID), ("user_id", ID), ("app_name", ID), ("parent_id", ID),
    ],
    "ds_user_state": [("org_id", ID), ("app_name", ID), ("user_id", ID), ("key", KEY)],
    "ds_app_state": [("org_id", ID), ("app_name", ID), ("key", KEY)],
    "ds_events": [
        ("org_id", ID), ("session_id", ID), ("id", ID), ("author", ID), ("invocation_id", ID),
    ],
}  # fmt: skip
"""The columns whose collation changes, with their (unchanged) types."""


def _distribution_columns() -> set[tuple[str, str]]:
    """The (table, column) pairs Citus distributes by: columns no ALTER TABLE may change."""
    bind = op.get_bind()
    if bind.exec_driver_sql("SELECT to_regclass('pg_dist_partition')").scalar() is None:
        return set()
    rows = bind.exec_driver_sql(
        "SELECT logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey) "
        "FROM pg_dist_partition WHERE partkey IS NOT NULL"
    ).all()
    return {(str(table), str(column)) for table, column in rows}


def _collate(collation: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    fixed = _distribution_columns()
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f'ALTER COLUMN {name} TYPE {kind} COLLATE "{collation}"'
            for name, kind in columns
            if (table, name) not in fixed
        )
        op.execute(f"ALTER TABLE {table} {changes}")


def upgrade() -> None:
    """Give the id and key columns the C collation (Postgres only)."""
    _collate("C")


def downgrade() -> None:
    """Give the id and key columns the database's default collation back (Postgres only)."""
    _collate("default")
