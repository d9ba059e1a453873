"""(b) Google ADK's DatabaseSessionService doing the same work.

Equivalences, where ADK has no direct counterpart:
- save: ADK has no "write these keys" call; state changes go through ``append_event`` with
  an ``Event`` whose ``EventActions(state_delta=...)`` carries them (this is ADK's documented
  way), so an ADK save also stores an event row.
- list50: ``list_sessions`` takes no limit and loads every session of the user, with its
  state; the 50 newest are picked in Python afterwards.
- fork: ADK has none; ``get_session`` with ``num_recent_events=0`` reads the parent, then
  ``create_session`` makes the child with the parent's private keys and ``forked_from``.
"""

from __future__ import annotations

from typing import Any

from google.adk.events import Event, EventActions
from google.adk.sessions import DatabaseSessionService, Session
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types

from .common import APP, Counters, count_statements
from .workloads import CONTENT, Implementation

_SHARED = ("user:", "app:", "temp:")
_TEXT = CONTENT["parts"][0]["text"]


class Adk(Implementation):
    """google-adk's DatabaseSessionService, built from a URL as its users do.

    The primitives below use only ``BaseSessionService`` calls: ``impl_adk_adapter`` runs
    the very same ones against durable-sessions' ADK adapter.
    """

    name = "google-adk"

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()
        self.service: BaseSessionService | None = None
        self._twins: list[BaseSessionService] = []

    async def open(self, url: str) -> None:
        # From a URL, as documented; ADK then adds pool_pre_ping on Postgres by itself.
        # Two services on the database: one timed, one with the statement listener.
        for counted in (False, True):
            service = DatabaseSessionService(
                db_url=url, pool_size=self.pool_size, pool_use_lifo=self.pool_lifo
            )
            await service.prepare_tables()
            if counted:
                count_statements(service.db_engine, self.counters)
            self._twins.append(service)
        self.counting(False)

    def counting(self, on: bool) -> None:
        self.service = self._twins[1 if on else 0]

    async def release_counting(self) -> None:
        service = self._twins[1]
        assert isinstance(service, DatabaseSessionService)
        await service.db_engine.dispose()

    async def close(self) -> None:
        for service in self._twins:
            assert isinstance(service, DatabaseSessionService)
            await service.close()

    @property
    def svc(self) -> BaseSessionService:
        assert self.service is not None
        return self.service

    async def create(self, user_id: str, state: dict[str, Any]) -> Session:
        return await self.svc.create_session(app_name=APP, user_id=user_id, state=state)

    async def get(self, handle: Session, recent: int | None) -> int:
        config = GetSessionConfig(num_recent_events=recent) if recent is not None else None
        session = await self.svc.get_session(
            app_name=APP, user_id=handle.user_id, session_id=handle.id, config=config
        )
        assert session is not None
        return len(session.events)

    async def save(self, handle: Session, worker: int, i: int) -> None:
        event = Event(
            author="system",
            invocation_id=f"inv-{i}",
            actions=EventActions(state_delta={"k": i, f"user:k{worker}": i, f"app:k{worker}": i}),
        )
        await self.svc.append_event(handle, event)
        handle.events.clear()  # keep the in-memory object small; storage is unaffected

    async def append(self, handle: Session, worker: int, i: int) -> None:
        event = Event(
            author="user",
            invocation_id=f"inv-{i}",
            content=types.Content(role="user", parts=[types.Part(text=_TEXT)]),
            actions=EventActions(state_delta={"k": i, f"user:k{worker}": i, f"app:k{worker}": i}),
        )
        await self.svc.append_event(handle, event)
        handle.events.clear()

    async def list50(self, user_id: str) -> int:
        response = await self.svc.list_sessions(app_name=APP, user_id=user_id)
        newest = sorted(response.sessions, key=lambda s: s.last_update_time, reverse=True)
        return len(newest[:50])

    async def fork(self, handle: Session) -> Session:
        parent = await self.svc.get_session(
            app_name=APP,
            user_id=handle.user_id,
            session_id=handle.id,
            config=GetSessionConfig(num_recent_events=0),
        )
        assert parent is not None
        private = {k: v for k, v in parent.state.items() if not k.startswith(_SHARED)}
        private["forked_from"] = parent.id
        return await self.svc.create_session(app_name=APP, user_id=parent.user_id, state=private)

    async def delete(self, handle: Session) -> None:
        await self.svc.delete_session(app_name=APP, user_id=handle.user_id, session_id=handle.id)
