"""Revision 0006's search functions return exactly what revision 0003's returned.

0006 replaces ``ds_search_words`` and ``ds_search_vector`` without rewriting any stored
vector, so the two versions must agree on every input: the same words for a search text,
the same tsvector for an event's content. Both run here side by side on one Postgres (0003's
under a schema of their own) over a corpus of edge cases: ASCII and not, the foldings
``lower()`` leaves, runs of word characters around the 255-character limit, a word at 256
positions, more than 16,382 words, escapes, nesting, and random mixes.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions.prepare import MAX_QUERY
from support.revisions import load_revision

pytestmark = pytest.mark.postgres

OLD = "ds_search_0003"


def _texts() -> list[str]:
    r = load_revision("0003_search.py")
    rng = random.Random(20261201)
    words = [chr(a) for a, _ in r._ranges(r.WORD_RANGES)][:400]
    cases = "\u0130\u0131\u1e9e\u00df\u03a3\u03c3\u03c2"  # dotted and dotless i, sharp s, sigmas
    letters = "abcXYZ019" + "".join(words) + r.FOLD_FROM + r.FOLD_TO + cases
    separators = " \t\n.,;:!?'\"\\/()[]{}<>-_+=*&^%$#@~`|\u00a0\u2014\u3000😀\U0001f600"
    texts = [
        "", " ", "...", "a", "A", "Hello, World!", "MIXED case Words",
        "\u0130stanbul \u0131i", " ".join(r.FOLD_FROM), " ".join(r.FOLD_TO), "straße STRASSE",
        "日本語のテキスト", "e\u0301t\u00e9",
        "a" * 255, "a" * 256, "b" * 300 + " ok", "ok " + "é" * 255, "ok " + "é" * 256 + " ok",
        ("x" * 254 + " ") * 3, "short " + "y" * 1000 + " tail " + "z" * 256,
        " ".join(["same"] * 255), " ".join(["same"] * 256), " ".join(["same"] * 300),
        " ".join(f"w{i}" for i in range(20)), " ".join(f"w{i}" for i in range(21)),
        " ".join(f"w{i % 7}" for i in range(64)), " ".join(f"w{i}" for i in range(16_382)),
        " ".join(f"w{i}" for i in range(16_383)), "x " * 20_000,
    ]  # fmt: skip
    for _ in range(300):
        size = rng.choice([1, 3, 8, 30, 120, 400])
        parts = []
        for _ in range(size):
            length = rng.choice([1, 2, 5, 12, 255, 256, 257])
            parts.append("".join(rng.choice(letters) for _ in range(length)))
            parts.append(rng.choice(separators) * rng.randint(1, 3))
        texts.append("".join(parts))
    return texts


def _contents(texts: list[str]) -> list[Any]:
    out: list[Any] = [None, {}, [], 1, True, "plain string", {"n": 1.5, "b": False, "z": None}]
    out += [{"role": "user", "content": t} for t in texts]
    out += [
        {"parts": [{"text": texts[i]}, {"text": texts[-i - 1]}], "meta": {"k": [texts[i], 3]}}
        for i in range(0, len(texts), 7)
    ]
    return out


async def test_revision_0006_agrees_with_0003_on_words_vectors_and_queries(
    migrated_pg_url: str,
) -> None:
    r = load_revision("0003_search.py")
    texts = _texts()
    contents = [json.dumps(c) for c in _contents(texts)]
    engine = create_async_engine(migrated_pg_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{OLD}"'))
            for statement in r.function_statements(f'"{OLD}".'):
                await conn.exec_driver_sql(statement)
            # Both the new functions and the frozen ones are here.
            kinds = dict(
                (
                    await conn.execute(
                        text(
                            "SELECT n.nspname || '.' || p.proname, l.lanname FROM pg_proc p "
                            "JOIN pg_namespace n ON n.oid = p.pronamespace "
                            "JOIN pg_language l ON l.oid = p.prolang "
                            "WHERE p.proname IN ('ds_search_words', 'ds_search_vector')"
                        )
                    )
                ).all()
            )
            assert kinds[f"{OLD}.ds_search_words"] == "sql"
            assert [k for k, v in kinds.items() if v == "plpgsql" and "words" in k]
            words = await conn.execute(
                text(
                    f"SELECT i, t FROM unnest(CAST(:ts AS text[])) WITH ORDINALITY AS u(t, i) "
                    f'WHERE ds_search_words(t) IS DISTINCT FROM "{OLD}".ds_search_words(t) '
                    # a search text is at most MAX_QUERY characters
                    f"OR CASE WHEN char_length(t) <= {MAX_QUERY} THEN ds_search_query(t)::text "
                    f'IS DISTINCT FROM "{OLD}".ds_search_query(t)::text END'
                ),
                {"ts": texts},
            )
            assert [row.t[:80] for row in words] == []
            vectors = await conn.execute(
                text(
                    "SELECT i, c FROM unnest(CAST(:cs AS jsonb[])) WITH ORDINALITY AS u(c, i) "
                    "WHERE ds_search_vector(c)::text "
                    f'IS DISTINCT FROM "{OLD}".ds_search_vector(c)::text'
                ),
                {"cs": contents},
            )
            assert [str(row.c)[:80] for row in vectors] == []
            # The corpus reaches every branch: no words, few, many, positions dropped.
            sizes = (
                await conn.execute(
                    text(
                        "SELECT cardinality(ds_search_words(t)) AS n, "
                        "ds_search_vector(to_jsonb(t))::text LIKE '%:%' AS positioned "
                        "FROM unnest(CAST(:ts AS text[])) AS u(t)"
                    ),
                    {"ts": texts},
                )
            ).all()
            counts = {row.n for row in sizes}
            assert {0, 1, 20, 21}.issubset(counts)
            assert max(counts) > 16_382
            assert any(256 <= row.n <= 16_382 and not row.positioned for row in sizes)
            await conn.rollback()
    finally:
        await engine.dispose()


def _jsonb_order(value: Any) -> Any:
    """``value`` with every object's keys in the order ``jsonb`` keeps them (shorter keys
    first, then by their bytes), which is the order ``ds_search_text`` reads them in."""
    if isinstance(value, dict):
        ordered = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in ordered}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


def _long_contents() -> list[Any]:
    """Contents whose text passes 200,000 characters, with keys ``jsonb`` would reorder
    (shorter first): their stored order decides what is cut, and where words are."""
    return [
        {"bb": "y " * 100_000, "a": "tail"},
        {"bb": "head", "a": "y " * 100_000},
        {"bb": "y " * 90_000 + "x " * 20_000, "a": "x " * 100_000},
        {"zz": {"long": ["w" * 10 + " "] * 18_000, "k": "after é"}, "a": "first"},
        {"text": "z" * 199_999, "b": ["cut", "gone"]},
    ]


# JSON texts as other writers store them: spaced, indented, escaped (ensure_ascii, with
# surrogate pairs), keys spaced from their colons.
RAW_TEXTS = [
    '{"a" : "x" , "b"\n:\t"y", "c":\r\n ["z" ,"w" ]}',
    '{"key:": "a:b", "q\\"": "\\"quoted\\" \\\\ end\\\\", "k": ":"}',
    '["\\u00e9t\\u00e9 \\ud83d\\ude00 caf\\u00c9", {"n": 1, "s": "\\n\\t\\/x\\b"}]',
    '"  top level  "',
    '{"": "", "e": ""}',
]


async def test_the_vector_a_write_sends_is_the_one_postgres_computes(
    migrated_pg_url: str,
) -> None:
    """``fulltext.search_vector``, which the writes send (revision 0008), gives for every
    content of the corpus exactly the vector of ``ds_search_vector`` of the ``json`` content
    (revision 0009), which the trigger computes for an insert that sends none, and
    ``fulltext.event_text`` exactly its ``ds_search_text``: strings in stored key order,
    also past 200,000 characters, for every way a JSON text may be written. Revision 0003's
    ``jsonb`` version gives the same vector of a content whose keys are in ``jsonb``'s
    order. Every branch is reached."""
    from durable_sessions.fulltext import event_text, search_vector

    contents = [*_contents(_texts()), *_long_contents()]
    texts = [json.dumps(c) for c in contents]
    texts += [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in contents[:50]]
    texts += [json.dumps(c, indent=2) for c in contents[:50]] + RAW_TEXTS
    sent = [search_vector(json.loads(t)) for t in texts]
    read = [event_text(json.loads(t)) for t in texts]
    reordered = [_jsonb_order(c) for c in contents]
    engine = create_async_engine(migrated_pg_url)
    try:
        async with engine.connect() as conn:
            differing = await conn.execute(
                text(
                    "SELECT i, c FROM unnest(CAST(:cs AS json[]), CAST(:vs AS text[]), "
                    "CAST(:ts AS text[])) WITH ORDINALITY AS u(c, v, t, i) "
                    "WHERE CAST(v AS tsvector)::text IS DISTINCT FROM ds_search_vector(c)::text "
                    "OR t IS DISTINCT FROM ds_search_text(c)"
                ),
                {"cs": texts, "vs": sent, "ts": read},
            )
            assert [str(row.c)[:80] for row in differing] == []
            differing = await conn.execute(
                text(
                    "SELECT i, c FROM unnest(CAST(:cs AS jsonb[]), CAST(:vs AS text[])) "
                    "WITH ORDINALITY AS u(c, v, i) "
                    "WHERE CAST(v AS tsvector) IS DISTINCT FROM ds_search_vector(c)"
                ),
                {
                    "cs": [json.dumps(c) for c in reordered],
                    "vs": [search_vector(c) for c in reordered],
                },
            )
            assert [str(row.c)[:80] for row in differing] == []
    finally:
        await engine.dispose()
    assert "" in sent  # no words
    assert any(":" not in v and v for v in sent)  # positions dropped (a word 256 times)
    assert max(v.count("'") // 2 for v in sent) > 16_382  # past the positions kept
    # The long contents: stored order differs from jsonb's, past the cut.
    for content in _long_contents():
        assert search_vector(content) != search_vector(_jsonb_order(content))
