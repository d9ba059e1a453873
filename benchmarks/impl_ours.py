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
        self.engines: list[AsyncEngine] = []
        self._twins: list[tuple[Manager, SessionService]] = []

    async def open(self, url: str) -> None:
        # Two engines on the database: one timed, one with the statement listener.
        for counted in (False, True):
            engine = create_async_engine(url, pool_size=self.pool_size)
            self.engines.append(engine)
            store = SQLStore(engine)
            if not counted:
                await store.migrate()
            else:
                count_statements(engine, self.counters)
            self._twins.append((Manager(store, app_name=APP), SessionService(store, org_id=ORG)))
        self.counting(False)

    def counting(self, on: bool) -> None:
        self.manager, self.service = self._twins[1 if on else 0]

    async def release_counting(self) -> None:
        await self.engines[1].dispose()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.dispose()

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
