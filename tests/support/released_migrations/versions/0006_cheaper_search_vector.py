"""Postgres: the same search words and vectors as revision 0003, for less work per event.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 19:30:00

Every event insert computes ``ds_events.search_vector`` (revision 0003), and on Postgres
that was most of an append's server time: its plan-per-call queries and regular
expressions ran for every event, whatever its size. Here ``ds_search_words`` and
``ds_search_vector`` are replaced by PL/pgSQL functions that return exactly what 0003's
return, for every input (``tests/sql/test_search_functions.py`` compares the two on a
corpus of edge cases), doing less:

- the text is split by making every character that is neither a word character nor a
  space a space, one character at a time, then splitting on spaces: Postgres's regular
  expressions cost most per match, and a match of a run of separators (``[^...]+``) at
  every space between two words cost twice the time of this whole split;
- the case foldings that ``lower()`` leaves are applied only to a text that is not ASCII
  (every one of them is outside ASCII): ``translate()`` scans its whole table for each
  character;
- runs of more than 255 word characters are dropped after the split, from the words,
  and only from a text longer than 255 characters, instead of by a bounded repetition in
  a regular expression run over every text;
- the words of a short content (up to 20) get their positions in a loop, without a
  query, and the check for a word at 256 positions or more runs only when there are 256
  words or more.

No stored vector changes, so nothing is rewritten: the upgrade and the downgrade only
replace functions. SQLite is untouched.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FEW_WORDS = 20
REPLACED = ("ds_search_words", "ds_search_vector")


def _revision_0003() -> ModuleType:
    """Revision 0003's module (its word class, foldings and functions), loaded by path."""
    path = Path(__file__).with_name("0003_search.py")
    spec = importlib.util.spec_from_file_location("_durable_sessions_revision_0003", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _words_block(r: ModuleType, source: str) -> str:
    """PL/pgSQL statements that set ``words`` to ``ds_search_words(source)`` of 0003
    (declared: ``folded text``, ``words text[]``)."""
    word = r._pg_class()
    fold_from = "E" + r.Q + "".join(f"\\u{ord(c):04x}" for c in r.FOLD_FROM) + r.Q
    fold_to = "E" + r.Q + "".join(f"\\u{ord(c):04x}" for c in r.FOLD_TO) + r.Q
    not_ascii = r._e(f"[^{r._pg_char(1)}-{r._pg_char(0x7F)}]")
    longest = r.MAX_WORD
    return f"""
            folded := lower({source});
            IF folded ~ {not_ascii} THEN
                folded := translate(folded, {fold_from}, {fold_to});
            END IF;
            words := array_remove(string_to_array(
                regexp_replace(folded, {r._e(f"[^ {word}]")}, ' ', 'g'), ' '), '');
            IF char_length(folded) > {longest} AND EXISTS (
                SELECT FROM unnest(words) AS u(w) WHERE char_length(u.w) > {longest}
            ) THEN
                words := ARRAY(
                    SELECT u.w FROM unnest(words) WITH ORDINALITY AS u(w, n)
                    WHERE char_length(u.w) <= {longest} ORDER BY u.n);
            END IF;"""


def _functions(s: str) -> list[str]:
    r = _revision_0003()
    q = r.Q
    words = f"""CREATE OR REPLACE FUNCTION {s}ds_search_words(text text) RETURNS text[]
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            folded text;
            words text[];
        BEGIN{_words_block(r, "text")}
            RETURN words;
        END
        $$"""
    vector = f"""CREATE OR REPLACE FUNCTION {s}ds_search_vector(content jsonb) RETURNS tsvector
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            folded text;
            words text[];
            n integer;
            parts text[];
            found tsvector;
        BEGIN{_words_block(r, f"{s}ds_search_text(content)")}
            n := cardinality(words);
            IF n BETWEEN 1 AND {FEW_WORDS} THEN
                FOR i IN 1..n LOOP
                    parts[i] := {q * 4} || words[i] || {q * 3}:{q} || i;
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
    return [words, vector]


def upgrade() -> None:
    """Replace ``ds_search_words`` and ``ds_search_vector`` by cheaper equivalents."""
    if op.get_context().dialect.name != "postgresql":
        return
    for statement in _functions(_revision_0003()._schema_prefix()):
        op.execute(statement)


def downgrade() -> None:
    """Put back revision 0003's ``ds_search_words`` and ``ds_search_vector``."""
    if op.get_context().dialect.name != "postgresql":
        return
    r = _revision_0003()
    s = r._schema_prefix()
    for statement in r.function_statements(s):
        if any(statement.startswith(f"CREATE FUNCTION {s}{name}(") for name in REPLACED):
            op.execute(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
