"""An OpenAI Agents item's role becomes its event's author only if it fits an id's limits.

Kept apart from test_openai_agents.py: the role of 255 characters but over 512 bytes of
UTF-8 is stored, like a role over 255 characters, under the author ``"item"`` rather than
refused by the store's id check. On memory, SQLite and Postgres.
"""

from __future__ import annotations

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from durable_sessions import Store
from durable_sessions.openai_agents import DurableSession

ORG = "acme"


async def test_a_role_past_512_bytes_of_utf8_is_stored_as_an_item(store: Store) -> None:
    session = DurableSession("conv", store, org_id=ORG)
    wide = "\U0001f600" * 129  # 129 characters, 516 bytes
    fits = "\U0001f600" * 128  # 512 bytes: an author as it is
    items = [
        {"role": wide, "content": "a"},
        {"type": wide},
        {"role": fits, "content": "b"},
        {"role": "x" * 256, "content": "c"},
    ]
    await session.add_items(items)  # type: ignore[arg-type]
    assert await session.get_items() == items
    events = await store.list_events(ORG, session.session_id)
    assert [e.author for e in events] == ["item", "item", fits, "item"]
