"""SQLite: the full-text index reads an encrypted store's blind index text.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 07:00:00

An encrypted store (``SQLStore(engine, keyring=...)``) stores event contents sealed; its
search reads a blind index instead: the keyed hashes of the words (``sealing``). On
SQLite each event row carries that text in a new nullable column ``search_terms``, and the
FTS5 table's view and triggers (revision 0003) read ``coalesce(search_terms, <the
content's text>)``: the events of a store without a keyring (``search_terms`` NULL) are
indexed exactly as before. Postgres is untouched: an encrypted store's writes send the
vector of the blind terms (revision 0008's plain column).

Online: one short write transaction (``ADD COLUMN`` changes no row on SQLite; the view
and the triggers are dropped and created again in it). The downgrade puts back 0003's view
and triggers, indexes every event again from its content (in the same transaction; an
encrypted event's sealed text then holds no word of it), and drops the column.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op
from sqlalchemy import text

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = "org_id = {0}.org_id AND session_id = {0}.session_id AND seq = {0}.seq"


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module, loaded by path."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sqlite() -> bool:
    return op.get_context().dialect.name == "sqlite"


def _body(row: str, blind: bool) -> str:
    """What the index reads of an event row (``new``, ``old`` or ``e``)."""
    content = _revision("0003_search.py")._sqlite_text(f"{row}.content")
    return f"coalesce({row}.search_terms, {content})" if blind else content


def _index(blind: bool) -> None:
    """Drop and create the view and triggers of the FTS5 table, reading ``_body``."""
    for name in ("ds_events_fts_insert", "ds_events_fts_delete", "ds_events_fts_update"):
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP VIEW IF EXISTS ds_events_fts_text")
    op.execute(
        "CREATE VIEW ds_events_fts_text (rid, body) AS SELECT k.rid, "
        f"{_body('e', blind)} "
        "FROM ds_events_fts_rowid AS k JOIN ds_events AS e ON e.org_id = k.org_id "
        "AND e.session_id = k.session_id AND e.seq = k.seq"
    )
    insert = (
        "INSERT INTO ds_events_fts_rowid (org_id, session_id, seq) "
        "VALUES (new.org_id, new.session_id, new.seq); "
        "INSERT INTO ds_events_fts (rowid, body) VALUES (last_insert_rowid(), "
        f"{_body('new', blind)}); "
    )
    remove = (
        "INSERT INTO ds_events_fts (ds_events_fts, rowid, body) SELECT 'delete', rid, "
        f"{_body('old', blind)} FROM ds_events_fts_rowid WHERE {KEY.format('old')}; "
        f"DELETE FROM ds_events_fts_rowid WHERE {KEY.format('old')}; "
    )
    columns = "org_id, session_id, seq, content" + (", search_terms" if blind else "")
    op.execute(f"CREATE TRIGGER ds_events_fts_insert AFTER INSERT ON ds_events BEGIN {insert}END")
    op.execute(f"CREATE TRIGGER ds_events_fts_delete AFTER DELETE ON ds_events BEGIN {remove}END")
    op.execute(
        f"CREATE TRIGGER ds_events_fts_update AFTER UPDATE OF {columns} ON ds_events "
        f"BEGIN {remove}{insert}END"
    )


def _has_column() -> bool:
    found = op.get_bind().execute(text("SELECT name FROM pragma_table_info('ds_events')"))
    return "search_terms" in set(found.scalars())


def upgrade() -> None:
    """SQLite: add ``ds_events.search_terms`` and index it where it is set."""
    if not _sqlite():
        return
    if not _has_column():
        op.execute("ALTER TABLE ds_events ADD COLUMN search_terms TEXT")
    _index(blind=True)


def downgrade() -> None:
    """SQLite: index the contents again, as revision 0003 does, and drop the column."""
    if not _sqlite():
        return
    _index(blind=False)
    # Index again from the view (FTS5's 'rebuild' cannot read a view replaced in the same
    # transaction): an encrypted event's sealed text holds no word of what it says.
    op.execute("INSERT INTO ds_events_fts (ds_events_fts) VALUES ('delete-all')")
    op.execute("INSERT INTO ds_events_fts (rowid, body) SELECT rid, body FROM ds_events_fts_text")
    if _has_column():
        op.execute("ALTER TABLE ds_events DROP COLUMN search_terms")
