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

Revisions 0003 and 0007 in their online form leave the column plain with this trigger
already (see 0007); here the function and the trigger are then made sure of, which takes no
lock when they exist. The ``DROP EXPRESSION`` of a database that still has a generated
column is one short lock, under the lock timeout and tried again (``online.py``), with the
trigger created in the same transaction.

The downgrade keeps the plain column and its trigger, the form revision 0007 gives. SQLite
is untouched (its index is the FTS5 table of revision 0003).
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


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module, loaded by path."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schema_prefix() -> str:
    """Revision 0003's schema prefix of the search functions (loaded by path)."""
    return str(_revision("0003_search.py")._schema_prefix())


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


def _generated() -> bool:
    """Whether ``ds_events.search_vector`` is a generated column."""
    if op.get_context().as_sql:
        return True
    found = op.get_bind().exec_driver_sql(
        "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = to_regclass('ds_events') "
        "AND attname = 'search_vector' AND NOT attisdropped"
    )
    return found.scalar() == "s"


def upgrade() -> None:
    """Make ``search_vector`` a plain column, filled by the trigger when a write sends none."""
    if op.get_context().dialect.name != "postgresql" or _distributed():
        return
    r3 = _revision("0003_search.py")
    online = r3.online
    s = _schema_prefix()
    function, trigger = r3.trigger_statements(s, "NEW.content::jsonb")
    generated = _generated()
    if generated and _server_version() < 130000:
        # Postgres 12: no DROP EXPRESSION; copy the vectors into a plain column (a rewrite).
        op.execute("ALTER TABLE ds_events ADD COLUMN search_vector_plain tsvector")
        op.execute("UPDATE ds_events SET search_vector_plain = search_vector")
        op.execute("ALTER TABLE ds_events DROP COLUMN search_vector")  # and its index
        op.execute("ALTER TABLE ds_events RENAME COLUMN search_vector_plain TO search_vector")
        op.execute("CREATE INDEX ix_ds_events_search ON ds_events USING gin (search_vector)")
        generated = False
    op.execute(function)
    body = trigger.removeprefix("DO $do$ BEGIN").removesuffix("END $do$")
    if generated:
        online.ddl(
            "DO $do$ BEGIN\n"
            "LOCK TABLE ds_events IN ACCESS EXCLUSIVE MODE;\n"
            "ALTER TABLE ds_events ALTER COLUMN search_vector DROP EXPRESSION;\n"
            f"{body}END $do$",
            "0008 plain search_vector",
        )
    else:
        online.ddl(trigger, "0008 create the trigger ds_events_search_vector")


def downgrade() -> None:
    """Nothing: revision 0007 has the plain column and its trigger too."""
