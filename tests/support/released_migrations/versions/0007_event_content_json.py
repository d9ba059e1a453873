"""Postgres: an event's content is kept as ``json`` (its text), no longer ``jsonb``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 01:45:00

Every transcript read sends each event's content as JSON text, and from a ``jsonb`` column
Postgres first rebuilds that text from the binary tree (``jsonb_out``): for the contents of
1,000 small events, about half of the statement's time (``pgbench -M prepared``: 1.55-1.61 ms
from ``jsonb``, 0.83 ms from ``json``). A ``json`` value is its text, checked when written,
so a read sends it as stored. Nothing reads a content with ``jsonb`` operators but the
search, which casts it (``ds_search_text(content::jsonb)``), as the generated column
``search_vector`` now does: the vectors, and so every search's hits and order, are the
ones 0003 and 0006 give (the cast builds the same ``jsonb`` the column held).

A content stored before keeps the text ``jsonb`` gave it; one written after keeps the text
the write gave it. Python reads both as the same value.

The upgrade rewrites ``ds_events`` under an ACCESS EXCLUSIVE lock (reads and writes of
events wait), computes every event's ``search_vector`` again and rebuilds its GIN index:
a pause that grows with the number of events. The downgrade does the same the other way.
SQLite is untouched (its contents are TEXT).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _schema_prefix() -> str:
    """Revision 0003's schema prefix of the search functions (loaded by path)."""
    path = Path(__file__).with_name("0003_search.py")
    spec = importlib.util.spec_from_file_location("_durable_sessions_revision_0003", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._schema_prefix())


def _retype(content_type: str, vector_of: str) -> None:
    """Give ``content`` another type; the generated column that reads it goes and comes
    back (Postgres cannot change the type of a column a generated column uses)."""
    s = _schema_prefix()
    op.execute("DROP INDEX ix_ds_events_search")
    op.execute("ALTER TABLE ds_events DROP COLUMN search_vector")
    op.execute(
        f"ALTER TABLE ds_events ALTER COLUMN content TYPE {content_type} "
        f"USING content::{content_type}"
    )
    op.execute(
        "ALTER TABLE ds_events ADD COLUMN search_vector tsvector "
        f"GENERATED ALWAYS AS ({s}ds_search_vector({vector_of})) STORED"
    )
    op.execute("CREATE INDEX ix_ds_events_search ON ds_events USING gin (search_vector)")


def upgrade() -> None:
    """Keep event contents as ``json``; the search vector reads them cast to ``jsonb``."""
    if op.get_context().dialect.name != "postgresql":
        return
    _retype("json", "content::jsonb")


def downgrade() -> None:
    """Keep event contents as ``jsonb`` again, as 0003 to 0006 did."""
    if op.get_context().dialect.name != "postgresql":
        return
    _retype("jsonb", "content")
