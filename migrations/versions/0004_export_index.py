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

Online on Postgres (``online.py``): no table is rewritten (the types stay the same), and no
index is rebuilt under a lock. For each index on these columns a twin that already compares
them under the new collation (``col COLLATE "C"``) is built ``CONCURRENTLY``; then, per
group of tables (sessions with events, which the foreign key ties; then each state table),
one short transaction under the lock timeout takes the tables' locks in the writers' order
(sessions before events), drops the old indexes and the foreign key, changes the columns'
collation (a catalog change: each twin now matches its column, and Postgres keeps it as it
is), makes each twin the primary key or gives it its old name, and adds the foreign key
back ``NOT VALID``; ``VALIDATE CONSTRAINT`` then checks it without blocking writes. A run
killed midway resumes: a group whose columns have the new collation is done, a valid twin is
kept, an invalid one is built again. Nothing changes on SQLite, whose text comparisons are
by code point already.

Citus refuses to alter a distribution column. On tables distributed before this revision
runs, ``org_id`` keeps its collation and every other column changes; the export stays
correct there, but sorts the rows of each page again. A database migrated before it is
distributed (as the README says) gets the C collation everywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

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


INDEXES: dict[str, list[tuple[str, bool, list[str]]]] = {
    "ds_sessions": [
        ("pk_ds_sessions", True, ["org_id", "id"]),
        ("ix_ds_sessions_org_user_updated", False, ["org_id", "user_id", "updated_at", "id"]),
        ("ix_ds_sessions_org_updated", False, ["org_id", "updated_at", "id"]),
    ],
    "ds_user_state": [
        ("pk_ds_user_state", True, ["org_id", "app_name", "user_id", "key"]),
        ("ix_ds_user_state_org_user", False, ["org_id", "user_id"]),
    ],
    "ds_app_state": [("pk_ds_app_state", True, ["org_id", "app_name", "key"])],
    "ds_events": [("pk_ds_events", True, ["org_id", "session_id", "seq"])],
}
"""The indexes on those columns (revisions 0001 and 0003): name, primary key, columns."""

GROUPS = [("ds_sessions", "ds_events"), ("ds_user_state",), ("ds_app_state",)]
"""Tables changed in one transaction, in the order writers lock them: the foreign key of
events on sessions must be dropped and added back around both."""

FOREIGN_KEY = "fk_ds_events_org_id_session_id_ds_sessions"
FOREIGN_KEY_SQL = (
    f"ALTER TABLE ds_events ADD CONSTRAINT {FOREIGN_KEY} FOREIGN KEY (org_id, session_id) "
    "REFERENCES ds_sessions (org_id, id) ON DELETE CASCADE NOT VALID"
)


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


def _distribution_columns() -> set[tuple[str, str]]:
    """The (table, column) pairs Citus distributes by: columns no ALTER TABLE may change."""
    rows = online.query(
        "SELECT logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey) "
        "FROM pg_dist_partition WHERE partkey IS NOT NULL"
        if online.scalar("SELECT to_regclass('pg_dist_partition')") is not None
        else "SELECT NULL, NULL WHERE FALSE"
    )
    return {(str(table), str(column)) for table, column in rows}


def _changing(table: str, fixed: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, kind) for name, kind in COLUMNS[table] if (table, name) not in fixed]


def _done(table: str, columns: list[tuple[str, str]], collation: str) -> bool:
    """Whether every changing column of ``table`` has ``collation`` already."""
    names = [name for name, _ in columns]
    left = online.scalar(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(:table) "
        "AND attname = ANY(:names) AND attcollation <> (SELECT oid FROM pg_collation "
        "WHERE collname = :collation AND collnamespace = 'pg_catalog'::regnamespace)",
        {"table": table, "names": names, "collation": collation},
    )
    return left == 0


def _twin(name: str, collation: str) -> str:
    return f"{name}_{'c' if collation == 'C' else 'd'}"


def _group(tables: tuple[str, ...], collation: str, fixed: set[tuple[str, str]]) -> None:
    """Give the columns of ``tables`` the collation ``collation``, online."""
    changing = {table: _changing(table, fixed) for table in tables}
    if all(_done(table, changing[table], collation) for table in tables):
        return
    for table in tables:
        names = {name for name, _ in changing[table]}
        for index, is_pk, columns in INDEXES[table]:
            spelled = ", ".join(
                f'{column} COLLATE "{collation}"' if column in names else column
                for column in columns
            )
            online.create_index(_twin(index, collation), f"ON {table} ({spelled})", unique=is_pk)
    body = [f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;" for table in tables]
    if "ds_events" in tables:
        body.append(f"ALTER TABLE ds_events DROP CONSTRAINT {FOREIGN_KEY};")
    for table in tables:
        primary = [index for index, is_pk, _ in INDEXES[table] if is_pk]
        others = [index for index, is_pk, _ in INDEXES[table] if not is_pk]
        body += [f"ALTER TABLE {table} DROP CONSTRAINT {index};" for index in primary]
        body += [f"DROP INDEX {index};" for index in others]
        alters = ", ".join(
            f'ALTER COLUMN {name} TYPE {kind} COLLATE "{collation}"'
            for name, kind in changing[table]
        )
        body.append(f"ALTER TABLE {table} {alters};")
        body += [
            f"ALTER TABLE {table} ADD CONSTRAINT {index} PRIMARY KEY USING INDEX "
            f"{_twin(index, collation)};"
            for index in primary
        ]
        body += [f"ALTER INDEX {_twin(index, collation)} RENAME TO {index};" for index in others]
    if "ds_events" in tables:
        body.append(f"{FOREIGN_KEY_SQL};")
    online.say(
        f"0004: {', '.join(tables)}: collation {collation} (a short exclusive lock)", shown=False
    )
    online.ddl("DO $do$ BEGIN\n" + "\n".join(body) + "\nEND $do$", f"0004 {tables[0]} swap")


def _collate(collation: str) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    if online.offline():
        raise NotImplementedError("revision 0004 reads the catalog; run it on the database")
    fixed = _distribution_columns()
    for tables in GROUPS:
        _group(tables, collation, fixed)
    validated = online.scalar(
        "SELECT convalidated FROM pg_constraint WHERE conname = :name "
        "AND conrelid = to_regclass('ds_events')",
        {"name": FOREIGN_KEY},
    )
    if validated is False:
        online.wait_ddl(f"ALTER TABLE ds_events VALIDATE CONSTRAINT {FOREIGN_KEY}")


def upgrade() -> None:
    """Give the id and key columns the C collation (Postgres only)."""
    _collate("C")


def downgrade() -> None:
    """Give the id and key columns the database's default collation back (Postgres only)."""
    _collate("default")
