"""Stores on one database share each organisation's blind index key, however they race.

Two stores of one database (two engines, as two processes have) that both write an
organisation's first events must hash words with one key: otherwise each indexes its
events under its own key, and a search from either misses the other's events.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Session, SQLStore, Store
from durable_sessions.crypto import LocalKeyring
from durable_sessions.sealing import INDEX
from durable_sessions.sql.schema import keys
from support.sql import MYSQL, SQL_BACKENDS

ROUNDS = 12
"""Organisations whose first writes race (each round a new one)."""
EVENTS = 3
"""Events each store appends in a round."""


async def _first_writes(store: Store, org_id: str, name: str) -> None:
    await store.create(Session(f"s-{name}", org_id=org_id, user_id=name, app_name="app"))
    for n in range(EVENTS):
        content = {"text": f"shared words from {name} number{n}"}
        await store.append_event(org_id, f"s-{name}", Event(author=name, content=content))


async def _index_keys(engine: AsyncEngine, org_id: str) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).where(keys.c.org_id == org_id, keys.c.kind == INDEX)
        return int((await conn.execute(query)).scalar_one())


@pytest.mark.parametrize("backend", [*SQL_BACKENDS, MYSQL])
async def test_two_stores_racing_an_organisations_first_writes_share_one_index_key(
    engine: AsyncEngine, backend_url: str, tmp_path: Path
) -> None:
    other_engine = create_async_engine(backend_url)
    # Two processes: two engines, two keyrings reading one file.
    first = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    second = SQLStore(other_engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    try:
        for round_ in range(ROUNDS):
            org_id = f"org{round_}"
            await asyncio.gather(
                _first_writes(first, org_id, "alice"), _first_writes(second, org_id, "bob")
            )
            assert await _index_keys(engine, org_id) == 1
            for store in (first, second):
                hits = await store.search(org_id, "shared words", limit=100)
                assert sorted((h.session_id, h.event.seq) for h in hits) == sorted(
                    (f"s-{name}", seq) for name in ("alice", "bob") for seq in range(1, 4)
                )
                [hit] = await store.search(org_id, "bob number1")
                assert hit.event.content == {"text": "shared words from bob number1"}
    finally:
        await other_engine.dispose()
