"""Search reads an event's text in the order its content is stored, on every store: the
200,000-character cut and the occurrences counted past positions (revision 0009 on
Postgres, where ``jsonb`` would reorder the keys).

Each test runs on every store through the ``store`` fixture (memory, SQLite, Postgres and
Postgres in distributed mode) and states what the memory store answers.
"""

from __future__ import annotations

from durable_sessions import Event, InMemoryStore, Manager, Store


async def _seqs(store: Store, text: str) -> list[int]:
    return [hit.event.seq for hit in await store.search("org", text, limit=100)]


async def test_rank_past_positions_counts_the_text_in_stored_key_order(store: Store) -> None:
    """An event past 16,382 words is ranked by counting its words, in the first 200,000
    characters of its text, whose strings come in the order the content holds them: event
    2's text is 90,000 "y" then 20,000 "x" of which 10,000 fit, so event 1 (50,000 "x")
    ranks first, as on memory."""
    memory = InMemoryStore()
    big = {"bb": "y " * 90_000 + "x " * 20_000, "a": "x " * 100_000}
    for target in (memory, store):
        await Manager(target, app_name="app").create("org", "u", id="s")
        await target.append_event("org", "s", Event("u", content="x " * 50_000))
        await target.append_event("org", "s", Event("u", content=big))
    assert await _seqs(memory, "x") == [1, 2]
    assert await _seqs(store, "x") == [1, 2]


async def test_the_200000_character_cut_follows_stored_key_order(store: Store) -> None:
    """Only the first 200,000 characters of an event's text are searched, its strings in
    the order the content holds them (not jsonb's, shorter keys first)."""
    await Manager(store, app_name="app").create("org", "u", id="s")
    past = {"bb": "y " * 100_000, "a": "tail"}  # "tail" comes after character 200,000
    within = {"bb": "head", "a": "y " * 100_000}  # "head" comes first
    await store.append_event("org", "s", Event("u", content=past))
    await store.append_event("org", "s", Event("u", content=within))
    assert await _seqs(store, "tail") == []
    assert await _seqs(store, "head") == [2]
