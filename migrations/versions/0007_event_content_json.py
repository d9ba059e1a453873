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

Online on Postgres 13 and later (``online.py``): expand, backfill, contract.

1. Where ``search_vector`` is still a generated column (this revision's earlier form, and
   0003's), it becomes a plain one in one short lock (``DROP EXPRESSION``: the vectors and
   the index stay) with revision 0008's trigger, which fills the vector of an insert that
   brings none (``ds_search_vector(NEW.content::jsonb)``: the same vectors as before).
2. ``content_json json`` is added empty, and a trigger keeps it equal to ``content::json``
   on every insert and every update of ``content``.
3. The events stored before get it in batches of short transactions (resumable: the rows
   where it is missing).
4. One short lock swaps the columns: ``content`` is dropped (a catalog change) and
   ``content_json`` takes its name; the trigger goes.

Readers and writers of the previous release go on meanwhile. After the swap a statement
that a connection prepared before it and that returns ``content`` fails once with "cached
plan must not change result type" (Postgres's answer to any column type change), and
succeeds when prepared again. The bytes of the dropped ``jsonb`` column stay in each row
until the row is rewritten (``VACUUM FULL`` or ``pg_repack`` reclaim them). Every event is
updated once: ``VACUUM`` (or autovacuum) reclaims the old row versions.

On Postgres 12 (no ``DROP EXPRESSION``) and where Citus distributes ``ds_events``, the
column is rewritten in place as before, under an ACCESS EXCLUSIVE lock. The downgrade
rewrites the column back to ``jsonb`` (the table under an exclusive lock). SQLite is
untouched (its contents are TEXT).
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


CONTENT_TRIGGER = "ds_events_content_json"
"""The trigger, and its function, that keep ``content_json`` in step during the upgrade."""


def _revision(filename: str) -> ModuleType:
    """An earlier revision's module, loaded by path."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def _schema_prefix() -> str:
    """Revision 0003's schema prefix of the search functions (loaded by path)."""
    return str(_revision("0003_search.py")._schema_prefix())


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


def _distributed() -> bool:
    """Whether Citus distributes ``ds_events``."""
    if online.offline() or online.scalar("SELECT to_regclass('pg_dist_partition')") is None:
        return False
    found = online.scalar(
        "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('ds_events')"
    )
    return found is not None


def _column(name: str) -> tuple[str, str] | None:
    """``(type, attgenerated)`` of the column ``name`` of ``ds_events``, or None."""
    if online.offline():
        return None
    rows = online.query(
        "SELECT format_type(atttypid, atttypmod), attgenerated::text FROM pg_attribute "
        "WHERE attrelid = to_regclass('ds_events') AND attname = :name AND NOT attisdropped",
        {"name": name},
    )
    return (str(rows[0][0]), str(rows[0][1])) if rows else None


def _server_version() -> int:
    if online.offline():
        return 130000
    return int(online.scalar("SHOW server_version_num"))


def _plain_vector(s: str) -> None:
    """Make a generated ``search_vector`` a plain column filled by 0008's trigger."""
    function, trigger = _revision("0003_search.py").trigger_statements(s, "NEW.content::jsonb")
    op.execute(function)
    body = trigger.removeprefix("DO $do$ BEGIN").removesuffix("END $do$")
    online.ddl(
        "DO $do$ BEGIN\n"
        "LOCK TABLE ds_events IN ACCESS EXCLUSIVE MODE;\n"
        "ALTER TABLE ds_events ALTER COLUMN search_vector DROP EXPRESSION;\n"
        f"{body}END $do$",
        "0007 plain search_vector",
    )


def _upgrade_online() -> None:
    s = _schema_prefix()
    vector = _column("search_vector")
    if vector is not None and vector[1] == "s":
        _plain_vector(s)
    content = _column("content")
    if content is not None and content[0] == "json":
        return  # swapped by a run that was stopped before its stamp
    online.ddl("ALTER TABLE ds_events ADD COLUMN IF NOT EXISTS content_json json")
    op.execute(
        f"""CREATE OR REPLACE FUNCTION {s}{CONTENT_TRIGGER}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.content_json := NEW.content::json;
            RETURN NEW;
        END
        $$"""
    )
    online.ddl(
        f"""DO $do$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = to_regclass('ds_events')
                AND tgname = '{CONTENT_TRIGGER}') THEN
            CREATE TRIGGER {CONTENT_TRIGGER} BEFORE INSERT OR UPDATE OF content ON ds_events
                FOR EACH ROW EXECUTE FUNCTION {s}{CONTENT_TRIGGER}();
        END IF;
        END $do$""",
        "0007 create the trigger ds_events_content_json",
    )
    missing = "e.content_json IS NULL AND e.content IS NOT NULL"
    online.backfill(
        "0007 json contents",
        f"UPDATE ds_events AS e SET content_json = e.content::json WHERE {{range}} AND {missing}",
        offline_statements=f"UPDATE ds_events AS e SET content_json = e.content::json "
        f"WHERE {missing}",
    )
    # The trigger fills every row written since it exists, the backfill every row before.
    if not online.offline():
        left = online.scalar(f"SELECT count(*) FROM ds_events AS e WHERE {missing}")
        if left:
            raise RuntimeError(f"0007: {left} events still without content_json")
    # The search trigger's function is created again with the swap: PL/pgSQL keeps, per
    # session, plans of NEW.content as jsonb ("type of parameter does not match that when
    # preparing the plan") until its function changes.
    search_function = _revision("0003_search.py").trigger_statements(s, "NEW.content::jsonb")[0]
    online.ddl(
        f"""DO $do$ BEGIN
        LOCK TABLE ds_events IN ACCESS EXCLUSIVE MODE;
        DROP TRIGGER {CONTENT_TRIGGER} ON ds_events;
        ALTER TABLE ds_events DROP COLUMN content;
        ALTER TABLE ds_events RENAME COLUMN content_json TO content;
        {search_function};
        END $do$""",
        "0007 swap the content columns",
    )
    op.execute(f"DROP FUNCTION IF EXISTS {s}{CONTENT_TRIGGER}()")


def upgrade() -> None:
    """Keep event contents as ``json``; the search vector reads them cast to ``jsonb``."""
    if op.get_context().dialect.name != "postgresql":
        return
    if _distributed() or _server_version() < 130000:
        vector = _column("search_vector")
        if vector is not None and vector[1] == "s":
            _retype("json", "content::jsonb")
        else:
            op.execute("ALTER TABLE ds_events ALTER COLUMN content TYPE json USING content::json")
        return
    _upgrade_online()


def downgrade() -> None:
    """Keep event contents as ``jsonb`` again, as 0003 to 0006 did."""
    if op.get_context().dialect.name != "postgresql":
        return
    vector = _column("search_vector")
    if vector is not None and vector[1] == "s":
        _retype("jsonb", "content")
        return
    op.execute("ALTER TABLE ds_events ALTER COLUMN content TYPE jsonb USING content::jsonb")
