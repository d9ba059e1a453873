"""The ADK and OpenAI Agents adapters over encrypted stores: the same answers, no plaintext."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")
pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from google.adk.events import Event as AdkEvent
from google.adk.events import EventActions
from google.genai import types

from durable_sessions.adk import DurableSessionService
from durable_sessions.openai_agents import DurableSession
from support.sql import MYSQL, SQL_BACKENDS
from support.vaults import open_vault


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.memory), *SQL_BACKENDS, MYSQL])
async def encrypted(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An encrypted store of every kind, and what its database holds (``raw()``)."""
    async for vault in open_vault(request, tmp_path):
        yield vault


async def test_the_openai_agents_session_over_an_encrypted_store(encrypted: Any) -> None:
    session = DurableSession("conversation", encrypted.store)
    items: list[Any] = [
        {"role": "user", "content": "my code is zorblax"},
        {"role": "assistant", "content": "noted"},
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    branch = await session.fork()
    assert await branch.get_items(limit=1) == items[1:]
    assert await session.pop_item() == items[1]
    assert b"zorblax" not in await encrypted.raw()


async def test_the_adk_service_over_an_encrypted_store(encrypted: Any) -> None:
    service = DurableSessionService(encrypted.store, org_id="org")
    session = await service.create_session(
        app_name="app", user_id="u", state={"user:pin": "quixotry"}
    )
    content = types.Content(role="user", parts=[types.Part(text="hello flumox")])
    event = AdkEvent(
        author="user", invocation_id="i1", content=content,
        actions=EventActions(state_delta={"k": "v"}),
    )  # fmt: skip
    await service.append_event(session, event)
    found = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert found is not None
    assert found.state == {"k": "v", "user:pin": "quixotry"}
    assert [e.content.parts[0].text for e in found.events if e.content and e.content.parts] == [
        "hello flumox"
    ]
    data = await encrypted.raw()
    assert b"flumox" not in data
    assert b"quixotry" not in data
