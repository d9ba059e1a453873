"""Clearing a long transcript takes no memory in proportion to it (SQLite, Postgres and
distributed Postgres).

``DurableSession.clear_session`` (``Store.discard_events(after_seq=0)``) on transcripts of
2,000 and 20,000 items of about 1.5 KB, each measured in a child process (VmHWM): the peak
it adds is the same for both, where reading the removed events back would add some 30 MB
more for the longer one.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, SQLStore
from durable_sessions.openai_agents import DurableSession
from support.memory import run_measured
from support.sql import PG_DISTRIBUTED, STORE_SQL_BACKENDS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status"
)

MEASURE = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions import SQLStore
from durable_sessions.openai_agents import DurableSession
from support.memory import peak_kib, restart_peak

async def main():
    engine = create_async_engine(sys.argv[1])
    store = SQLStore(engine)
    session = DurableSession(sys.argv[2], store, org_id="acme", user_id="alice")
    await session.get_items(limit=1)  # modules loaded, a connection open, the owner checked
    before = restart_peak()
    await session.clear_session()
    grown = peak_kib() - before
    left = await store.get("acme", sys.argv[2])
    await engine.dispose()
    print(left.message_count, grown)

asyncio.run(main())
"""

ITEM = {
    "id": "msg_0123456789",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "words " * 230, "annotations": []}],
}
SLACK_MIB = 4
"""What the longer transcript's clearing may add over the shorter one's (allocator noise)."""


async def fill(store: SQLStore, session_id: str, items: int) -> None:
    session = DurableSession(session_id, store, org_id="acme", user_id="alice")
    await session.add_items([{"role": "user", "content": "hello"}])
    for _ in range(0, items - 1, 1000):
        await store.append_events("acme", session_id, [Event("assistant", ITEM)] * 1000)


@pytest.mark.parametrize("backend", [*STORE_SQL_BACKENDS, PG_DISTRIBUTED])
async def test_clearing_20_000_items_takes_no_more_memory_than_2_000(
    engine: AsyncEngine, backend_url: str
) -> None:
    store = SQLStore(engine)
    grown = {}
    for items in (2_001, 20_001):
        session_id = f"long-{items}"
        await fill(store, session_id, items)
        out = await asyncio.to_thread(run_measured, MEASURE, backend_url, session_id)
        left, grown[items] = map(int, out.split())
        assert left == 0
        assert await store.list_events("acme", session_id) == []
    difference_mib = (grown[20_001] - grown[2_001]) / 1024
    assert difference_mib < SLACK_MIB, f"{grown} KiB: {difference_mib:.1f} MiB more"
