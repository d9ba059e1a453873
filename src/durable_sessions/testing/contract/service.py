"""The ADK-style SessionService over a store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SessionService,
    Store,
)

from ._common import (
    APP,
    OTHER_APP,
    OTHER_USER,
    USER,
    ContractBase,
)

__all__ = ["ServiceContract"]


class ServiceContract(ContractBase):
    """The ``SessionService`` over the store."""

    # -- SessionService (ADK style) ---------------------------------------------------------------

    async def test_service_create_with_and_without_an_id(self, service: SessionService) -> None:
        generated = await service.create(app_name=APP, user_id=USER, state={"p": 1, "user:u": 2})
        chosen = await service.create(app_name=APP, user_id=USER, session_id="chosen")

        assert generated.id
        assert generated.id != chosen.id
        assert chosen.id == "chosen"
        got = await service.get(app_name=APP, user_id=USER, session_id=generated.id)
        assert got.state == {"p": 1, "user:u": 2}
        assert (await service.get(app_name=APP, user_id=USER, session_id="chosen")).state == {
            "user:u": 2
        }
        with pytest.raises(SessionExistsError):
            await service.create(app_name=APP, user_id=USER, session_id="chosen")

    async def test_service_get_loads_events(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        base = datetime(2024, 5, 1, tzinfo=timezone.utc)
        for i in range(4):
            event = Event(author="user", content=i, timestamp=base + timedelta(minutes=i))
            await service.append_event(session.id, event)

        def contents(s: Session) -> list[Any]:
            return [e.content for e in s.events]

        full = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        recent = await service.get(
            app_name=APP, user_id=USER, session_id=session.id, num_recent_events=2
        )
        later = await service.get(
            app_name=APP, user_id=USER, session_id=session.id, after=base + timedelta(minutes=1)
        )
        both = await service.get(
            app_name=APP,
            user_id=USER,
            session_id=session.id,
            num_recent_events=1,
            after=base,
        )
        assert contents(full) == [0, 1, 2, 3]
        assert contents(recent) == [2, 3]
        assert contents(later) == [2, 3]
        assert contents(both) == [3]
        assert full.message_count == 4

    async def test_service_get_with_the_wrong_app_or_user_raises(
        self, service: SessionService
    ) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=OTHER_APP, user_id=USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=OTHER_USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=USER, session_id="nope")

    async def test_service_list_is_by_app_and_user(self, service: SessionService) -> None:
        mine = [(await service.create(app_name=APP, user_id=USER)).id for _ in range(2)]
        await service.create(app_name=APP, user_id=OTHER_USER)
        await service.create(app_name=OTHER_APP, user_id=USER)

        listed = await service.list(app_name=APP, user_id=USER)
        assert {s.id for s in listed} == set(mine)
        assert await service.list(app_name=OTHER_APP, user_id=OTHER_USER) == []

    async def test_service_delete(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await service.delete(app_name=APP, user_id=OTHER_USER, session_id=session.id)
        assert (
            await service.get(app_name=APP, user_id=USER, session_id=session.id)
        ).id == session.id

        await service.delete(app_name=APP, user_id=USER, session_id=session.id)

        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=USER, session_id=session.id)

    async def test_service_append_event_by_id(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        stored = await service.append_event(session.id, Event(author="user", state_delta={"p": 1}))

        assert stored.seq == 1
        got = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        assert got.state == {"p": 1}
        assert [e.id for e in got.events] == [stored.id]

    async def test_service_append_event_updates_the_session_object_in_place(
        self, service: SessionService, store: Store
    ) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        created_at, updated_at = session.created_at, session.updated_at
        yesterday = datetime.now(timezone.utc) - timedelta(days=1)  # e.g. an imported transcript
        event = Event(
            author="agent", state_delta={"p": 1, "temp:t": 2}, tokens=4, timestamp=yesterday
        )

        stored = await service.append_event(session, event)

        assert session.events == [stored]
        assert session.state == {"p": 1, "temp:t": 2}
        assert (session.message_count, session.token_total) == (1, 4)
        assert session.created_at == created_at
        assert session.updated_at >= updated_at
        session.set("q", 2)
        await store.update(session)  # the object's version kept up with the store's
        got = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        assert got.state == {"p": 1, "q": 2}
