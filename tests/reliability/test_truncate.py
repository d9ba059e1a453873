"""Truncation racing appends, on a SQLite file and on Postgres: seqs stay gapless, counters exact.

Tasks on two engines (two pools, as two processes would have) append single events and
batches while others truncate the same transcript at once. Afterwards every appended event
is either still stored or was returned by exactly one truncation, the stored seqs are 1..N
and the session's counters are the sums of the events that remain.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Manager, SQLStore
from reliability.figures import Figures
from support.sql import PG_DISTRIBUTED, STORE_SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", [*STORE_SQL_BACKENDS, PG_DISTRIBUTED])

APPENDERS = 6
TRUNCATERS = 3
ROUNDS = 25


async def test_appends_and_truncates_race_without_gaps_or_lost_counts(
    engine: AsyncEngine, backend: str, backend_url: str, figures: Figures
) -> None:
    """6 tasks appending (single events and batches of 3) and 3 truncating, 25 rounds each."""
    second = create_async_engine(backend_url)
    try:
        stores = [SQLStore(engine), SQLStore(second)]
        session = await Manager(stores[0], app_name="app").create("org", "alice")
        appended: list[Event] = []
        removed: list[Event] = []
        truncates = 0

        async def appender(task: int) -> None:
            store = stores[task % 2]
            for i in range(ROUNDS):
                tokens = task + 1
                if i % 2:
                    batch = [Event("agent", content=[task, i, j], tokens=tokens) for j in range(3)]
                    appended.extend(await store.append_events("org", session.id, batch))
                else:
                    event = Event("agent", content=[task, i], tokens=tokens)
                    appended.append(await store.append_event("org", session.id, event))

        async def truncater(task: int) -> None:
            nonlocal truncates
            store = stores[task % 2]
            pick = random.Random(task)
            for _ in range(ROUNDS):
                newest = await store.list_events("org", session.id, limit=1)
                last = newest[0].seq if newest else 0
                keep = pick.randint(max(0, last - 4), last + 1)
                removed.extend(await store.truncate_events("org", session.id, after_seq=keep))
                truncates += 1

        await asyncio.gather(
            *(appender(t) for t in range(APPENDERS)), *(truncater(t) for t in range(TRUNCATERS))
        )

        stored = await stores[0].list_events("org", session.id)
        meta = await stores[0].get("org", session.id)
    finally:
        await second.dispose()

    remaining = {e.id for e in stored}
    returned = Counter(e.id for e in removed)
    accounted = sum(1 for e in appended if (e.id in remaining) != (e.id in returned))
    figures.record(
        "append/truncate race, tasks on two engines",
        backend,
        operations=len(appended) + truncates,
        expected=len(appended),
        found=accounted,
    )
    assert all(n == 1 for n in returned.values()), "an event was removed twice"
    assert not remaining & set(returned), "a removed event is still stored"
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert meta.message_count == len(stored)
    assert meta.token_total == sum(e.tokens for e in stored)
    assert len(removed) > 0, "the truncations removed nothing: no race was run"
    # Removed events came back with the seqs they had, each batch's seqs consecutive.
    by_id = {e.id: e for e in appended}
    assert all(by_id[e.id].seq == e.seq for e in removed)
    nxt = await SQLStore(engine).append_event("org", session.id, Event("agent"))
    assert nxt.seq == len(stored) + 1
