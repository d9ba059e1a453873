"""Google ADK's memory service over any durable-sessions ``Store``: long-term memory that
lives in the same database as the sessions.

Wire it into a Runner beside the session service; ADK's ``load_memory`` tool and
``PreloadMemoryTool`` then search it::

    from durable_sessions.adk import DurableMemoryService, DurableSessionService

    runner = Runner(
        agent=agent, app_name="my_app",
        session_service=DurableSessionService(store, org_id="acme"),
        memory_service=DurableMemoryService(store, org_id="acme"),
    )
    ...
    await runner.memory_service.add_session_to_memory(session)  # what to remember

Each ADK event with text becomes one memory of the session's (app, user): its id is the
event's id (adding a session again adds only the events not added before), its text the
event's text parts joined by spaces, its content the event's ``Content`` as JSON, its author
and timestamp the event's, its session the durable session's id
(``durable_session_id(app, user, session_id)``). Events without text are skipped. Memories
outlive their session; ``delete_memory``, ``delete_memories`` and ``Store.delete_user``
erase them. ``search_memory`` returns the ``max_results`` best memories sharing a word with
the query (``Store.search_memories``: rare words weigh more, then newest first).

Requires the ``adk`` extra: ``pip install "durable-sessions[adk]"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.genai import types

from ...context import current_org_id
from ...errors import InvalidArgumentError
from ...model import Memory
from ...prepare import timestamp_from_seconds
from ...state import validate_id
from ...store import Store
from .records import durable_session_id

if TYPE_CHECKING:
    from google.adk.events.event import Event as AdkEvent
    from google.adk.sessions.session import Session as AdkSession

__all__ = ["DurableMemoryService"]


def _text(content: types.Content | None) -> str:
    """The text parts of a content, joined by spaces ("" when it has none)."""
    if content is None or not content.parts:
        return ""
    return " ".join(part.text for part in content.parts if part.text)


def _content_json(content: types.Content) -> Any:
    return content.model_dump(mode="json", exclude_none=True)


def _entry_time(entry: MemoryEntry, index: int) -> datetime | None:
    """A ``MemoryEntry``'s timestamp (ISO 8601 text; UTC when it names no zone)."""
    if entry.timestamp is None:
        return None
    try:
        moment = datetime.fromisoformat(entry.timestamp)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"memory {index} has a timestamp that is not ISO 8601: {entry.timestamp!r}"
        ) from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class DurableMemoryService(BaseMemoryService):
    """ADK's ``BaseMemoryService`` over a durable-sessions store.

    Args:
        store: Any ``Store`` (``SQLStore`` on a migrated database, ``InMemoryStore``).
        org_id: The organisation every call works in; None (the default) uses the one
            bound in the caller's context (``current_org_id()``) at each call.
        max_results: The most memories ``search_memory`` returns.

    Raises:
        InvalidArgumentError: ``org_id`` is malformed or ``max_results`` is not a positive
            integer.
    """

    def __init__(self, store: Store, *, org_id: str | None = None, max_results: int = 10) -> None:
        if org_id is not None:
            validate_id("org_id", org_id)
        if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
            raise InvalidArgumentError("max_results must be a positive integer")
        self.store = store
        self.org_id = org_id
        self.max_results = max_results

    def _org(self) -> str:
        return self.org_id if self.org_id is not None else current_org_id()

    async def add_session_to_memory(self, session: AdkSession) -> None:
        """Remember each event of the session that has text and was not added before."""
        await self._add_events(session.app_name, session.user_id, session.events, session.id)

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[AdkEvent],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Remember the given events that have text and were not added before, each with
        ``custom_metadata`` as its metadata."""
        await self._add_events(app_name, user_id, events, session_id, custom_metadata)

    async def _add_events(
        self,
        app_name: str,
        user_id: str,
        events: Sequence[AdkEvent],
        session_id: str | None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        durable = None if session_id is None else durable_session_id(app_name, user_id, session_id)
        metadata = dict(custom_metadata or {})
        memories = []
        seen: set[str] = set()
        for event in events:
            text = _text(event.content)
            # No text, or an id given twice (the first counts): nothing to add.
            if event.content is None or not text or event.id in seen:
                continue
            seen.add(event.id)
            memories.append(
                Memory(
                    text,
                    content=_content_json(event.content),
                    author=event.author,
                    timestamp=timestamp_from_seconds("event timestamp", event.timestamp),
                    id=event.id,
                    metadata=dict(metadata),
                    session_id=durable,
                )
            )
        if memories:
            await self.store.add_memories(self._org(), app_name, user_id, memories)

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Remember explicit memory entries (an entry's own ``custom_metadata`` over the
        call's); an entry without an id gets a new one, one whose id the user has is not
        added again.

        Raises:
            InvalidArgumentError: an entry's timestamp is not ISO 8601 text, or a field
                cannot be stored.
        """
        given = []
        for index, entry in enumerate(memories):
            given.append(
                Memory(
                    _text(entry.content),
                    content=_content_json(entry.content),
                    author=entry.author,
                    timestamp=_entry_time(entry, index),
                    id=entry.id,
                    metadata={**(custom_metadata or {}), **entry.custom_metadata},
                )
            )
        if given:
            await self.store.add_memories(self._org(), app_name, user_id, given)

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        """The user's ``max_results`` best memories sharing a word with ``query``."""
        found = await self.store.search_memories(
            self._org(), app_name, user_id, query, limit=self.max_results
        )
        return SearchMemoryResponse(memories=[_entry(memory) for memory in found])

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        """Delete one memory by the id ``search_memory`` gave it; without an id, nothing."""
        if memory_id:
            await self.store.delete_memories(self._org(), app_name, user_id, memory_id=memory_id)

    async def delete_memories(self, *, app_name: str, user_id: str) -> None:
        """Delete every memory of the user in that app."""
        await self.store.delete_memories(self._org(), app_name, user_id)


def _entry(memory: Memory) -> MemoryEntry:
    """The ``MemoryEntry`` of a stored memory (a content from its text when it has none)."""
    if isinstance(memory.content, dict):
        content = types.Content.model_validate(memory.content)
    else:
        content = types.Content(parts=[types.Part(text=memory.text)])
    assert memory.timestamp is not None
    return MemoryEntry(
        id=memory.id,
        content=content,
        author=memory.author,
        timestamp=memory.timestamp.isoformat(),
        custom_metadata=dict(memory.metadata or {}),
    )
