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

from durable_sessions import SQLStore
from durable_sessions.adk import DurableSessionService
from durable_sessions.crypto import LocalKeyring
from durable_sessions.openai_agents import DurableSession


@pytest.fixture
async def encrypted(tmp_path: Path) -> AsyncIterator[tuple[SQLStore, Path]]:
    """An encrypted store on a new SQLite file, and the file."""
    db = tmp_path / "sessions.db"
    store = SQLStore.from_url(f"sqlite:///{db}", keyring=LocalKeyring(tmp_path / "keys.json"))
    await store.migrate()
    yield store, db
    await store.close()


@pytest.mark.sqlite
async def test_the_openai_agents_session_over_an_encrypted_store(encrypted: Any) -> None:
    store, db = encrypted
    session = DurableSession("conversation", store)
    items: list[Any] = [
        {"role": "user", "content": "my code is zorblax"},
        {"role": "assistant", "content": "noted"},
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    branch = await session.fork()
    assert await branch.get_items(limit=1) == items[1:]
    assert await session.pop_item() == items[1]
    assert b"zorblax" not in db.read_bytes()


@pytest.mark.sqlite
async def test_the_adk_service_over_an_encrypted_store(encrypted: Any) -> None:
    store, db = encrypted
    service = DurableSessionService(store, org_id="org")
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
    data = db.read_bytes()
    assert b"flumox" not in data
    assert b"quixotry" not in data
