"""(a) durable-sessions, through its public API only: Manager and SessionService on SQLStore."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, Session, SessionService, SQLStore

from .common import APP, ORG, Counters, count_statements
from .workloads import CONTENT, Implementation


class Ours(Implementation):
    """durable-sessions on one engine with SQLAlchemy's default pool."""

    name = "durable-sessions"

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()
        self.engine: AsyncEngine | None = None

    async def open(self, url: str) -> None:
        self.engine = create_async_engine(url)
        store = SQLStore(self.engine)
        await store.migrate()
        count_statements(self.engine, self.counters)
        self.store = store
        self.manager = Manager(store, app_name=APP)
        self.service = SessionService(store, org_id=ORG)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()

    async def create(self, user_id: str, state: dict[str, Any]) -> Session:
        return await self.manager.create(ORG, user_id, state=state)

    async def get(self, handle: Session, recent: int | None) -> int:
        session = await self.service.get(
            app_name=APP, user_id=handle.user_id, session_id=handle.id, num_recent_events=recent
        )
        return len(session.events)

    async def save(self, handle: Session, worker: int, i: int) -> None:
        handle.set("k", i)
        handle.set(f"user:k{worker}", i)
        handle.set(f"app:k{worker}", i)
        await self.manager.save(handle)

    async def append(self, handle: Session, worker: int, i: int) -> None:
        event = Event(
            author="user",
            content=CONTENT,
            invocation_id=f"inv-{i}",
            state_delta={"k": i, f"user:k{worker}": i, f"app:k{worker}": i},
            tokens=12,
        )
        await self.manager.append_event(handle, event)

    async def list50(self, user_id: str) -> int:
        found = await self.manager.list(Filter(ORG, user_id=user_id, app_name=APP, limit=50))
        return len(found)

    async def fork(self, handle: Session) -> Session:
        return await self.manager.fork(ORG, handle.id)

    async def delete(self, handle: Session) -> None:
        await self.manager.delete(ORG, handle.id)
