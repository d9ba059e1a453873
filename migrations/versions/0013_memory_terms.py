"""Long-term memory: ``ds_memory_terms``, each user's count of memories holding each term.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 07:50:00

Per (organisation, app, user) and term, how many of the user's memories hold the term (the
term ``""``: how many memories the user has): a search's weights, read by primary key
instead of counted. The store keeps it with every write of memories; keyed by organisation
first, as every table (Citus distributes it with the others, see
``durable_sessions.sql.dialects.citus.distribution_sql``).

The memories already stored are counted here from their ``terms`` column (revision 0010:
the owner's token, then the terms, space-separated), in pages along the primary key, one
user's counts at a time, in the revision's transaction (reading ``ds_memories`` blocks no
writer); a run that was stopped counts again from the start. Memories that a version of the
library without this table writes while it runs are not counted: upgrade the writers first
(``delete_memories`` then ``add_memories`` of a user recounts them). The table is new:
creating it waits for no one; its index is built in a step of its own (``CONCURRENTLY`` on
Postgres). The downgrade drops it.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "ds_memory_terms"
USER_INDEX = "ix_ds_memory_terms_org_user"
PAGE = 5000
MYSQL = ("mysql", "mariadb")


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


def _mysql() -> bool:
    return op.get_context().dialect.name in MYSQL


def _id() -> sa.types.TypeEngine[str]:
    """An identifier column: compared by code point (the C collation on Postgres, bytes on
    MySQL)."""
    return (
        sa.String(255)
        .with_variant(sa.String(255, collation="C"), "postgresql")
        .with_variant(mysql.VARBINARY(512), *MYSQL)
    )


def _term() -> sa.types.TypeEngine[str]:
    """A term: text (bytes on MySQL, compared exactly)."""
    return sa.Text().with_variant(mysql.VARBINARY(1024), *MYSQL)


def _count_stored() -> None:
    """Count the terms of the memories already stored, a user at a time."""
    if online.offline():
        return
    bind = op.get_bind()
    bind.exec_driver_sql(f"DELETE FROM {TABLE}")
    insert = sa.text(
        f"INSERT INTO {TABLE} (org_id, app_name, user_id, term, n) "
        "VALUES (:org_id, :app_name, :user_id, :term, :n)"
    )
    read = sa.text(
        "SELECT org_id, app_name, user_id, id, terms FROM ds_memories "
        "WHERE (org_id, app_name, user_id, id) > (:o, :a, :u, :i) "
        "ORDER BY org_id, app_name, user_id, id LIMIT :page"
    )
    owner: tuple[str, str, str] | None = None
    counts: Counter[str] = Counter()

    def flush() -> None:
        if owner is not None and counts:
            org, app, user = owner
            rows = [
                {"org_id": org, "app_name": app, "user_id": user, "term": t, "n": n}
                for t, n in sorted(counts.items())
            ]
            bind.execute(insert, rows)
        counts.clear()

    after = ("", "", "", "")
    while True:
        found = bind.execute(
            read, {"o": after[0], "a": after[1], "u": after[2], "i": after[3], "page": PAGE}
        ).all()
        for org, app, user, memory_id, terms in found:
            if (org, app, user) != owner:
                flush()
                owner = (org, app, user)
            counts[""] += 1
            counts.update(terms.split(" ")[1:])
            after = (org, app, user, memory_id)
        if len(found) < PAGE:
            break
    flush()


def upgrade() -> None:
    """Create ``ds_memory_terms`` and count the memories already stored."""
    op.create_table(
        TABLE,
        sa.Column("org_id", _id(), nullable=False),
        sa.Column("app_name", _id(), nullable=False),
        sa.Column("user_id", _id(), nullable=False),
        sa.Column("term", _term(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "org_id",
            "app_name",
            "user_id",
            "term",
            name=None if _mysql() else "pk_ds_memory_terms",
        ),
        if_not_exists=True,
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mariadb_engine="InnoDB",
        mariadb_charset="utf8mb4",
        mariadb_collate="utf8mb4_bin",
    )
    _count_stored()
    online.create_index(USER_INDEX, f"ON {TABLE} (org_id, user_id)")


def downgrade() -> None:
    """Drop ``ds_memory_terms``."""
    if _mysql():  # its index goes with it
        op.execute(f"DROP TABLE IF EXISTS {TABLE}")
        return
    op.execute(f"DROP INDEX IF EXISTS {USER_INDEX}")
    op.execute(f"DROP TABLE IF EXISTS {TABLE}")
