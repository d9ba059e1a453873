"""Search beyond the contract: one definition of words on every store, the frozen copies
of it in the revision, the index each dialect reads, and the limits of what is indexed."""

from __future__ import annotations

import random
import sqlite3
import unicodedata
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, InMemoryStore, Manager, SQLStore, Store, fulltext
from support.revisions import load_revision
from support.sql import (
    STORE_SQL_BACKENDS,
    mysql_plan,
    pg_plan,
    sqlite_plan,
    statements,
    the_data_statement,
)


def _revision() -> ModuleType:
    return load_revision("0003_search.py")


def _assigned() -> list[str]:
    return [
        chr(code)
        for code in range(0x21, 0x110000)
        if unicodedata.category(chr(code)) not in ("Cn", "Cs")
    ]


# -- one definition ---------------------------------------------------------------------------


def test_the_revision_holds_frozen_copies_of_the_definition() -> None:
    revision = _revision()
    for name in ("WORD_RANGES", "SQLITE_SEPARATORS", "FOLD_FROM", "FOLD_TO"):
        assert getattr(revision, name) == getattr(fulltext, name), name
    assert (revision.MAX_TEXT, revision.MAX_WORD) == (fulltext.MAX_TEXT, fulltext.MAX_WORD)


@pytest.mark.skipif(unicodedata.unidata_version != "14.0.0", reason="the tables are Unicode 14")
def test_word_characters_are_unicode_14_letters_digits_and_marks() -> None:
    ranges = fulltext.parse_ranges(fulltext.WORD_RANGES)
    table = {code for first, last in ranges for code in range(first, last + 1)}
    expected = {
        code
        for code in range(0x110000)
        if unicodedata.category(chr(code))[0] in "LNM" or unicodedata.category(chr(code)) == "Co"
    }
    assert table == expected


def test_words_event_text_and_snippets() -> None:
    assert fulltext.words("Hello, WORLD! foo_bar e-mail x²y ΣΊΣΥΦΟΣ thanks🙏") == [
        "hello", "world", "foo", "bar", "e", "mail", "x²y", "σίσυφοσ", "thanks",
    ]  # fmt: skip
    content = {"parts": [{"text": "a"}, {"inline": {"data": "b", "n": 1}}], "role": "c"}
    assert fulltext.event_text(content) == "a b c"
    assert fulltext.event_text("x" * 300_000) == "x" * fulltext.MAX_TEXT
    assert fulltext.event_text(None) == fulltext.event_text([1, True, None]) == ""
    assert fulltext.query_words('Tea "tea" TEA -coffee') == ["Tea", "coffee"]
    line = fulltext.snippet({"text": "word " * 50 + "needle in a haystack"}, "NEEDLE")
    assert "needle in a haystack" in line
    assert line.startswith("…")


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(max_codepoint=0x7F), max_size=600))
@example("a" * 255 + " " + "b" * 256 + "_C9z")
def test_an_ascii_text_has_the_words_of_the_general_rule(ascii_text: str) -> None:
    # words() takes a shortcut for ASCII: lowercasing folds it, [0-9a-z] are its letters.
    general = fulltext._WORD.findall(fulltext.fold(ascii_text))
    assert fulltext.words(ascii_text) == [w for w in general if len(w) <= 255]


def test_sqlite_splits_every_character_as_fulltext_does() -> None:
    """SQLite's tokenizer, configured as the revision configures it, gives the very words
    ``fulltext.words`` gives for every assigned character (what is a word character, what
    separates words, and the words' text), but for one documented difference: capital
    letters its Unicode 6.1 tables do not fold (the README's search section)."""
    revision = _revision()
    separators = "".join(
        chr(c) for a, b in revision._ranges(revision.SQLITE_SEPARATORS) for c in range(a, b + 1)
    )
    tokenize = (
        f"unicode61 remove_diacritics 0 categories 'L* N* M* Co' separators '{separators}'"
    ).replace("'", "''")
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE f USING fts5(b, tokenize='{tokenize}')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, instance)")
    chars = _assigned()
    conn.executemany("INSERT INTO f (rowid, b) VALUES (?, ?)", [(ord(c), f"a{c}a") for c in chars])
    terms: dict[int, list[tuple[int, str]]] = {}
    for term, doc, offset in conn.execute("SELECT term, doc, offset FROM v"):
        terms.setdefault(doc, []).append((offset, term))
    differ, unfolded = [], []
    for c in chars:
        got = [term for _, term in sorted(terms.get(ord(c), []))]
        wanted = fulltext.words(f"a{c}a")
        if got == wanted:
            continue
        if [fulltext.fold(term) for term in got] == wanted:
            unfolded.append(c)  # the same word, a capital left as it is
        else:
            differ.append(hex(ord(c)))
    assert differ == []
    assert all(unicodedata.category(c) == "Lu" for c in unfolded), unfolded
    # The README names these: İ, and letters newer than Unicode 6.1 (Georgian Mtavruli).
    assert "\u0130" in unfolded
    assert "\u1c90" in unfolded


@pytest.mark.postgres
async def test_postgres_splits_and_folds_every_character_as_fulltext_does(
    migrated_pg_url: str,
) -> None:
    """ds_search_words agrees with fulltext.words on every assigned character (which is
    a word character, and its case folding, on this database's UTF-8 locale)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    chars = _assigned()
    engine = create_async_engine(migrated_pg_url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                text("SELECT ds_search_words('a' || c || 'a') FROM unnest(CAST(:cs AS text[])) c"),
                {"cs": chars},
            )
            found = [row[0] for row in result]
    finally:
        await engine.dispose()
    split = [
        hex(ord(c))
        for c, got in zip(chars, found, strict=True)
        if len(got) != len(fulltext.words(f"a{c}a"))
    ]
    assert split == []
    # Case folding is the database locale's lower(): on C.UTF-8 it agrees with Python's
    # for every letter both know of (Python's Unicode may be newer than the locale's).
    folded = [
        hex(ord(c))
        for c, got in zip(chars, found, strict=True)
        if got != fulltext.words(f"a{c}a") and unicodedata.category(c) != "Lu"
    ]
    assert folded == []


# -- the same answers on every store ----------------------------------------------------------

VOCABULARY = [
    "alpha", "beta", "gamma", "delta", "Lisbon", "lisbon", "LISBON", "flight", "Flight",
    "hotel", "booking", "café", "cafe", "ΣΊΣΥΦΟΣ", "σίσυφος", "Привет", "日本語", "x2", "42",
    "thanks🙏", "e-mail", "bob@example.com", "or", "and", "not", "near",
]  # fmt: skip


@pytest.mark.parametrize("backend", ["memory", *STORE_SQL_BACKENDS])
async def test_every_store_gives_the_memory_stores_answers(store: Store) -> None:
    memory = InMemoryStore()
    rng = random.Random(14)
    for target in (memory, store):
        rng.seed(14)
        for s in range(12):
            manager = Manager(target, app_name="app" if s % 3 else "other")
            session = await manager.create("org", f"user{s % 4}", id=f"s{s:02d}")
            contents: list[Any] = []
            for _ in range(15):
                words = " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 12)))
                shape = rng.randrange(4)
                contents.append(
                    [
                        words,
                        {"parts": [{"text": words}], "role": "user"},
                        {"text": words},
                        [1, words],
                    ][shape]
                )
            await target.append_events(
                "org", session.id, [Event("user", content=c) for c in contents]
            )
    queries = [
        "alpha", "lisbon flight", "CAFÉ", "cafe", "σίσυφος", "日本語", "thanks", "e mail",
        "bob example com", "or", "not near", "x2", "42", "alpha beta gamma", "hotel -booking",
        '"lisbon"', "user", "delta*",
    ]  # fmt: skip
    for query in queries:
        for kwargs in ({"limit": 200}, {"user_id": "user1"}, {"app_name": "other", "limit": 3}):
            expected = await memory.search("org", query, **kwargs)  # type: ignore[arg-type]
            got = await store.search("org", query, **kwargs)  # type: ignore[arg-type]
            assert [(h.session_id, h.event.seq) for h in got] == [
                (h.session_id, h.event.seq) for h in expected
            ], (query, kwargs)


@pytest.mark.parametrize("backend", ["memory", *STORE_SQL_BACKENDS])
async def test_only_the_first_200000_characters_are_searched(store: Store) -> None:
    session = await Manager(store).create("org", "alice", id="big")
    big = "early " + "x " * 99_994 + "edge  late"  # "late" starts at character 200,000
    assert big.index("late") == fulltext.MAX_TEXT
    await store.append_event("org", session.id, Event("tool", content={"output": big}))
    assert [h.session_id for h in await store.search("org", "early edge")] == ["big"]
    assert await store.search("org", "late") == []


@pytest.mark.parametrize("backend", ["memory", *STORE_SQL_BACKENDS])
async def test_occurrences_are_counted_past_what_positions_hold(store: Store) -> None:
    """Postgres keeps at most 256 positions of a word and none past the 16,383rd word;
    such events are counted from their content, so they rank as everywhere else."""
    session = await Manager(store).create("org", "alice", id="s")
    contents = [
        "x " * 300,  # 300 occurrences (more than 256 positions)
        "x " * 299,
        "y " * 20_000 + "x x x x",  # 4, past word 16,383
        "x x x x x",  # 5
    ]
    for content in contents:
        await store.append_event("org", session.id, Event("user", content=content))
    assert [h.event.seq for h in await store.search("org", "x")] == [1, 2, 4, 3]


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_huge_and_odd_contents_are_stored_and_searched(engine: AsyncEngine) -> None:
    """Contents past what one tsvector holds, words longer than any index entry, quotes
    and escapes: every append lands, and search reads what it can."""
    store = SQLStore(engine, max_value_bytes=None)
    session = await Manager(store).create("org", "alice", id="odd")
    rng = random.Random(1)
    distinct = " ".join(f"{rng.getrandbits(64):016x}" for _ in range(200_000))  # 3.4 MB
    odd = ['quote " back \\ slash', "tab\tnew\nline\u0001ctl", "long " + "y" * 3_000]
    await store.append_event("org", session.id, Event("tool", content=distinct))
    await store.append_event("org", session.id, Event("tool", content={"odd": odd}))
    first = distinct.split()[0]
    assert [h.event.seq for h in await store.search("org", first)] == [1]
    assert [h.event.seq for h in await store.search("org", "back slash quote")] == [2]
    assert [h.event.seq for h in await store.search("org", "tab new line ctl")] == [2]
    assert [h.event.seq for h in await store.search("org", "long")] == [2]


# -- the index each dialect reads -------------------------------------------------------------


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_search_is_one_statement_served_by_the_full_text_index(
    backend: str, engine: AsyncEngine
) -> None:
    store = SQLStore(engine)
    for s in range(30):
        session = await Manager(store).create("org", "alice", id=f"s{s}")
        contents = [f"filler words number {n}" for n in range(20)]
        if s == 7:
            contents[3] = "the rare needle"
        await store.append_events("org", session.id, [Event("user", content=c) for c in contents])
    if backend == "postgres":
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ANALYZE ds_events, ds_sessions")
    with statements(engine) as seen:
        hits = await store.search("org", "needle rare")
    assert [(h.session_id, h.event.seq) for h in hits] == [("s7", 4)]
    sql, params = the_data_statement(seen)
    if backend == "postgres":
        # A small table: make every scan look dear.
        nodes = await pg_plan(engine, sql, params, settings=["SET enable_seqscan = off"])
        assert [n["Index Name"] for n in nodes if "Index Name" in n] == ["ix_ds_events_search"]
    elif backend == "mysql":
        reads = {read["table"]: read for read in await mysql_plan(engine, sql, params)}
        assert reads["ds_event_words"]["key"] == "PRIMARY", reads
        assert reads["ds_events"]["key"] == "PRIMARY", reads
    else:
        details = await sqlite_plan(engine, sql, params)
        assert "SCAN ds_events_fts VIRTUAL TABLE INDEX" in details, details
        assert "ds_events_fts_rowid USING INTEGER PRIMARY KEY" in details, details
        assert "ds_events USING INDEX sqlite_autoindex_ds_events_1" in details, details


@pytest.mark.postgres
@pytest.mark.parametrize("ctype", ["C", "C.UTF-8"])
async def test_vectors_are_sent_only_to_a_database_that_folds_as_fulltext_does(
    pg_base_url: str, ctype: str
) -> None:
    """A write sends its events' search vectors, folded as ``fulltext.fold`` folds, only where
    the database's ``lower()`` folds alike (a search's words are folded there): under the
    "C" locale (ASCII only) Postgres computes them, so that a search for a non-ASCII
    capital finds the same capital, as before revision 0008."""
    from sqlalchemy import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from conftest import _run_admin, drop_pg_database

    name = f"ds_test_fold_{ctype.replace('.', '_').replace('-', '_').lower()}"
    _run_admin(pg_base_url, f'DROP DATABASE IF EXISTS "{name}"')
    _run_admin(
        pg_base_url,
        f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' "
        f"LC_COLLATE '{ctype}' LC_CTYPE '{ctype}'",
    )
    url = make_url(pg_base_url).set(database=name).render_as_string(hide_password=False)
    engine = create_async_engine(url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        await Manager(store).create("org", "u", id="s")
        async with engine.begin() as conn:  # with no trigger, only a sent vector is stored
            await conn.exec_driver_sql("ALTER TABLE ds_events DISABLE TRIGGER USER")
        await store.append_event("org", "s", Event("user", content="ÉCOLE ouverte"))
        async with engine.connect() as conn:
            sent = (await conn.exec_driver_sql("SELECT search_vector FROM ds_events")).scalar()
        assert (sent is not None) is (ctype != "C")
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE ds_events ENABLE TRIGGER USER")
            await conn.exec_driver_sql("DELETE FROM ds_events")
        await store.append_event("org", "s", Event("user", content="ÉCOLE ouverte"))
        assert [h.event.content for h in await store.search("org", "ÉCOLE")] == ["ÉCOLE ouverte"]
        assert len(await store.search("org", "OUVERTE")) == 1
    finally:
        await engine.dispose()
        drop_pg_database(pg_base_url, url)
