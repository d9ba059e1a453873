"""Postgres: an event's search vector is sent by the write, no longer computed per insert.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 23:00:00

Since revision 0003 ``ds_events.search_vector`` has been a generated column: every insert
ran ``ds_search_vector(content::jsonb)``, PL/pgSQL that extracts, folds and splits the
content's text, for each event. That was the largest part of an append's execution on the
server (an OpenAI Agents SDK turn of two items: about a third of the statement's time).
The library now computes the same vector in Python (``durable_sessions.fulltext``,
``search_vector``) and sends it with the event; here the column becomes a plain one:

- ``ALTER COLUMN ... DROP EXPRESSION`` (Postgres 13 and later: only the catalog changes;
  every stored vector and the GIN index stay as they are). On Postgres 12 the column is
  copied into a plain one instead, a rewrite of ``ds_events``.
- A trigger, ``ds_events_search_vector``, computes the vector as before for any insert
  that brings none (``WHEN (NEW.search_vector IS NULL)``): writers of an older release
  during a rolling upgrade, the bulk imports, distributed mode run on one Postgres, any
  other writer. The library's own appends bring one and never call it.

Where ``ds_events`` is already distributed by Citus, nothing changes: Citus runs no trigger
on a distributed table, and the generated column keeps computing the vectors (the library
sees which kind of column it writes to, and sends a vector only to a plain one). The
README's recipe puts a migrated schema's column back as a generated one before
distributing it (``durable_sessions.sql.dialects.citus.distribution_sql``).

The downgrade makes the column generated again: it is dropped and added back (a rewrite of
``ds_events`` that computes every vector) with its index. SQLite is untouched (its index is
the FTS5 table of revision 0003).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER = "ds_events_search_vector"
"""The trigger, and its function, that fill a vector an insert did not bring."""


def _schema_prefix() -> str:
    """Revision 0003's schema prefix of the search functions (loaded by path)."""
    path = Path(__file__).with_name("0003_search.py")
    spec = importlib.util.spec_from_file_location("_durable_sessions_revision_0003", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._schema_prefix())


def _distributed() -> bool:
    """Whether Citus distributes ``ds_events`` (no trigger may run on it then)."""
    if op.get_context().as_sql:
        return False
    bind = op.get_bind()
    if bind.exec_driver_sql("SELECT to_regclass('pg_dist_partition')").scalar() is None:
        return False
    found = bind.exec_driver_sql(
        "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('ds_events')"
    ).first()
    return found is not None


def _server_version() -> int:
    if op.get_context().as_sql:
        return 130000
    return int(op.get_bind().exec_driver_sql("SHOW server_version_num").scalar())


def upgrade() -> None:
    """Make ``search_vector`` a plain column, filled by the trigger when a write sends none."""
    if op.get_context().dialect.name != "postgresql" or _distributed():
        return
    s = _schema_prefix()
    if _server_version() >= 130000:
        op.execute("ALTER TABLE ds_events ALTER COLUMN search_vector DROP EXPRESSION")
    else:  # Postgres 12: no DROP EXPRESSION; copy the vectors into a plain column
        op.execute("ALTER TABLE ds_events ADD COLUMN search_vector_plain tsvector")
        op.execute("UPDATE ds_events SET search_vector_plain = search_vector")
        op.execute("ALTER TABLE ds_events DROP COLUMN search_vector")  # and its index
        op.execute("ALTER TABLE ds_events RENAME COLUMN search_vector_plain TO search_vector")
        op.execute("CREATE INDEX ix_ds_events_search ON ds_events USING gin (search_vector)")
    op.execute(
        f"""CREATE FUNCTION {s}{TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.search_vector := {s}ds_search_vector(NEW.content::jsonb);
            RETURN NEW;
        END
        $$"""
    )
    op.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON ds_events FOR EACH ROW "
        f"WHEN (NEW.search_vector IS NULL) EXECUTE FUNCTION {s}{TRIGGER}()"
    )


def downgrade() -> None:
    """Make ``search_vector`` a generated column again, as revisions 0003 to 0007 had it."""
    if op.get_context().dialect.name != "postgresql" or _distributed():
        return
    s = _schema_prefix()
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON ds_events")
    op.execute(f"DROP FUNCTION IF EXISTS {s}{TRIGGER}()")
    op.execute("ALTER TABLE ds_events DROP COLUMN search_vector")  # and its index
    op.execute(
        "ALTER TABLE ds_events ADD COLUMN search_vector tsvector "
        f"GENERATED ALWAYS AS ({s}ds_search_vector(content::jsonb)) STORED"
    )
    op.execute("CREATE INDEX ix_ds_events_search ON ds_events USING gin (search_vector)")
