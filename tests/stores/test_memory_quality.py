"""Recall on a fixed corpus, on every store: 200 memories that answer nothing and 20 that
each answer one question asked in other words (``benchmarks.memory_corpus``). The memory that
answers each question is in the top 3 of ``search_memories``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from benchmarks.memory_corpus import ANSWERS, CORPUS, QUESTIONS

from durable_sessions import Memory, Store

BASE = datetime(2024, 1, 1, tzinfo=timezone.utc)


async def test_each_answer_is_in_the_top_3_of_its_question(store: Store) -> None:
    memories = [
        Memory(text, id=f"m{i:03d}", timestamp=BASE + timedelta(hours=i))
        for i, text in enumerate(CORPUS)
    ]
    await store.add_memories("acme", "assistant", "ada", memories)
    # Another user's and another organisation's copies of the answers change nothing.
    others = [Memory(text) for text in ANSWERS * 3]
    await store.add_memories("acme", "assistant", "bob", others)
    await store.add_memories("globex", "assistant", "ada", others)
    missed = {}
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        found = await store.search_memories("acme", "assistant", "ada", question, limit=3)
        if answer not in [m.text for m in found]:
            missed[question] = [m.text for m in found]
    assert missed == {}
