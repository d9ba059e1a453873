"""Postgres: an event's searched text follows the order its content is stored in.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 04:30:00

An event's text is the string values of its content in the order they are stored, cut at
200,000 characters (``durable_sessions.fulltext.event_text``; the memory store and SQLite's
``json_tree`` read them so). Postgres's ``ds_search_text(content jsonb)`` (revision 0003)
walks a ``jsonb`` value, whose objects hold their keys shorter first: past 200,000
characters it cut other text than the other stores, so the vectors Postgres computed (the
trigger of revision 0008, the generated column of distributed mode) and the occurrences a
search counts for an event without positions (past 16,382 words, or a word 256 times)
differed from them.

``ds_events.content`` is ``json`` since revision 0007: its text, in the order written. Here
``ds_search_text(content json)`` and ``ds_search_vector(content json)`` read it in that order
and return exactly ``fulltext.event_text`` and ``fulltext.search_vector``: the text is cut
at the quotes (no quote is left unescaped inside a JSON string once ``\\\\`` and ``\\"`` are
set aside as the control characters 1 and 2, which a ``json`` value never holds), a string
followed by ``:`` is a key, the others are the values, decoded by Postgres's own JSON parser
when they hold an escape. No query runs per call: on the items of an OpenAI Agents SDK
turn, or ADK contents with escapes, 20-24 us an event, as the ``jsonb`` version with its
cast (25,000 turns, five runs each, interleaved); half its time on a content of 50,000
strings. An object that repeats a key gives each of its values (``json_tree`` does the
same; ``json.loads`` keeps the last one).

- The trigger ``ds_events_search_vector`` calls the ``json`` version (no cast).
- The stored vectors that may differ are computed again: those of the events whose
  content's text is longer than 200,000 bytes, where ``search_vector`` is a plain column.
  Online (``online.py``): in batches of short transactions over the primary key, each
  updating the long events of its range whose vector differs (so a run that was stopped
  resumes, and finds nothing left to do where it already passed).
- The ``jsonb`` versions stay (a generated column of a table Citus distributed before this
  revision calls them; the overloads do not make a call with a ``json`` or ``jsonb``
  argument ambiguous, only one with an untyped literal).

Where Citus distributes ``ds_events`` no table is altered or updated: the functions are
created, and the generated column keeps calling what it called (the recipe of
``durable_sessions.sql.dialects.citus.distribution_sql`` gives it
``ds_search_vector(content)``).

The downgrade puts back 0008's trigger function and drops the ``json`` versions (unless a
generated column calls them); the vectors stay as they are. SQLite is untouched.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op
from sqlalchemy import text

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAX_TEXT = 200_000
TRIGGER = "ds_events_search_vector"
"""Revision 0008's trigger, and its function, that fill a vector an insert did not bring."""
FUNCTIONS = ("ds_search_vector(json)", "ds_search_text(json)")


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
    """Whether Citus distributes ``ds_events`` (no ALTER TABLE or UPDATE of it here then)."""
    if op.get_context().as_sql:
        return False
    bind = op.get_bind()
    if bind.exec_driver_sql("SELECT to_regclass('pg_dist_partition')").scalar() is None:
        return False
    found = bind.exec_driver_sql(
        "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('ds_events')"
    ).first()
    return found is not None


def _plain_vector() -> bool:
    """Whether ``ds_events.search_vector`` is a plain column (revision 0008), not generated."""
    if op.get_context().as_sql:
        return True
    found = op.get_bind().exec_driver_sql(
        "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = to_regclass('ds_events') "
        "AND attname = 'search_vector' AND NOT attisdropped"
    )
    return found.scalar() == ""


def _exists(signature: str) -> bool:
    """Whether the function ``signature`` (schema-qualified, with its argument types) exists."""
    if op.get_context().as_sql:
        return True
    found = op.get_bind().execute(text("SELECT to_regprocedure(:f)"), {"f": signature})
    return found.scalar() is not None


def _called_by_a_column(signature: str) -> bool:
    """Whether an object (a generated column) depends on the function ``signature``."""
    if op.get_context().as_sql:
        return False
    found = op.get_bind().execute(
        text(
            "SELECT 1 FROM pg_depend WHERE refclassid = 'pg_proc'::regclass "
            "AND refobjid = to_regprocedure(:f) AND deptype = 'n'"
        ),
        {"f": signature},
    )
    return found.first() is not None


# PL/pgSQL variables of the text block, and the block itself.
TEXT_DECLARE = """
            json_text text;
            escaped boolean;
            pieces text[];
            piece text;
            inside text;
            strings text[] := '{}';
            total integer := -1;
            i integer := 0;"""


def _text_block(target: str) -> str:
    """PL/pgSQL statements that set ``target`` to the text of the ``json`` value
    ``content``: its strings (not its keys) in stored order, joined by spaces, cut at
    ``MAX_TEXT`` characters (``fulltext.event_text``). Declared: ``TEXT_DECLARE``.

    Split at its quotes, a JSON text is what lies outside strings (odd pieces) and the
    strings (even pieces), once the two escapes that hold a quote or a backslash are set
    aside (``\\\\`` before ``\\"``, as a JSON parser reads them: left to right). A string
    whose next piece starts with ``:`` is a key."""
    backslash = "chr(92)"
    return f"""
            json_text := content::text;
            escaped := strpos(json_text, {backslash}) > 0;
            IF escaped THEN
                json_text := replace(replace(json_text, {backslash} || {backslash}, chr(1)),
                    {backslash} || '"', chr(2));
            END IF;
            pieces := string_to_array(json_text, '"');
            FOREACH piece IN ARRAY pieces LOOP
                i := i + 1;
                IF i % 2 = 0 THEN
                    inside := piece;
                ELSIF i > 1 AND left(ltrim(piece, E' \\t\\n\\r'), 1) <> ':' THEN
                    IF escaped AND strpos(inside, {backslash}) + strpos(inside, chr(1))
                            + strpos(inside, chr(2)) > 0 THEN
                        inside := CAST('"' || replace(replace(inside,
                            chr(1), {backslash} || {backslash}), chr(2), {backslash} || '"')
                            || '"' AS json) #>> '{{}}';
                    END IF;
                    strings := strings || inside;
                    total := total + 1 + char_length(inside);
                    EXIT WHEN total >= {MAX_TEXT};
                END IF;
            END LOOP;
            {target} := left(array_to_string(strings, ' '), {MAX_TEXT});"""


def function_statements(s: str) -> list[str]:
    """The ``CREATE OR REPLACE FUNCTION`` statements of ``ds_search_text(content json)`` and
    ``ds_search_vector(content json)`` in schema ``s`` (quoted, with a dot). The vector is
    revision 0006's, of this text (its statements, copied)."""
    r3 = _revision("0003_search.py")
    r6 = _revision("0006_cheaper_search_vector.py")
    q = r3.Q
    text_function = f"""CREATE OR REPLACE FUNCTION {s}ds_search_text(content json) RETURNS text
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            body text;{TEXT_DECLARE}
        BEGIN{_text_block("body")}
            RETURN body;
        END
        $$"""
    vector_function = f"""CREATE OR REPLACE FUNCTION {s}ds_search_vector(content json)
        RETURNS tsvector LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            body text;{TEXT_DECLARE}
            folded text;
            words text[];
            n integer;
            parts text[];
            found tsvector;
        BEGIN{_text_block("body")}{r6._words_block(r3, "body")}
            n := cardinality(words);
            IF n BETWEEN 1 AND {r6.FEW_WORDS} THEN
                FOR k IN 1..n LOOP
                    parts[k] := {q * 4} || words[k] || {q * 3}:{q} || k;
                END LOOP;
                RETURN CAST(array_to_string(parts, ' ') AS tsvector);
            END IF;
            IF n BETWEEN 1 AND 16382 THEN
                found := CAST(array_to_string(ARRAY(
                    SELECT {q * 4} || u.w || {q * 3}:{q} || u.n
                    FROM unnest(words) WITH ORDINALITY AS u(w, n)), ' ') AS tsvector);
                IF n < 256 OR NOT EXISTS (
                    SELECT FROM unnest(found) AS u WHERE cardinality(u.positions) >= 256
                ) THEN
                    RETURN found;
                END IF;
            END IF;
            RETURN array_to_tsvector(words);
        END
        $$"""
    return [text_function, vector_function]


def _trigger_function(s: str, content: str) -> str:
    """The trigger function of revision 0008, computing the vector of ``content``."""
    return f"""CREATE OR REPLACE FUNCTION {s}{TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.search_vector := {s}ds_search_vector({content});
            RETURN NEW;
        END
        $$"""


def upgrade() -> None:
    """Add the ``json`` search functions; the trigger and the long events' vectors use them."""
    if op.get_context().dialect.name != "postgresql":
        return
    s = _schema_prefix()
    for statement in function_statements(s):
        op.execute(statement)
    if _distributed():
        return
    if _exists(f"{s}{TRIGGER}()"):
        op.execute(_trigger_function(s, "NEW.content"))
    if _plain_vector():
        # Only a text longer than MAX_TEXT characters can be cut elsewhere; its JSON text
        # is longer still, in bytes (read from the value's header, not the value).
        online = _revision("0003_search.py").online
        long_and_stale = (
            f"octet_length(e.content::text) > {MAX_TEXT} "
            f"AND e.search_vector IS DISTINCT FROM {s}ds_search_vector(e.content)"
        )
        online.backfill(
            "0009 long events' vectors",
            f"UPDATE ds_events AS e SET search_vector = {s}ds_search_vector(e.content) "
            f"WHERE {{range}} AND {long_and_stale}",
        )


def downgrade() -> None:
    """Put back 0008's trigger function; drop the ``json`` search functions."""
    if op.get_context().dialect.name != "postgresql":
        return
    s = _schema_prefix()
    if not _distributed() and _exists(f"{s}{TRIGGER}()"):
        op.execute(_trigger_function(s, "NEW.content::jsonb"))
    if _called_by_a_column(f"{s}{FUNCTIONS[0]}"):
        return  # a generated column calls them (Citus's, made after this revision)
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {s}{signature}")
