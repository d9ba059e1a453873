"""(d) durable-sessions through its Google ADK adapter, ``durable_sessions.adk``.

``DurableSessionService(SQLStore(engine), org_id=...)``, driven by exactly the ADK calls
that (b) makes: this class inherits every primitive of ``impl_adk.Adk`` (create_session,
get_session with GetSessionConfig, append_event with EventActions(state_delta), list_sessions
with the 50 newest picked in Python, delete_session, the same fork equivalent) and only
swaps the service under them. So the numbers show what an ADK app gets by switching its
session service, nothing else changed.

The engine is built as durable-sessions' users build one (``create_async_engine`` with the
run's pool size, as (a) does; no ``pool_pre_ping``, which ADK's service adds on Postgres).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import SQLStore
from durable_sessions.adk import DurableSessionService

from .common import ORG, count_statements
from .impl_adk import Adk


class AdkAdapter(Adk):
    """durable-sessions' ``DurableSessionService`` on SQLStore, through ADK's own calls."""

    name = "adk-adapter"

    def __init__(self) -> None:
        super().__init__()
        self.engines: list[AsyncEngine] = []

    async def open(self, url: str) -> None:
        # Two engines on the database: one timed, one with the statement listener.
        assert self.counters is not None
        for counted in (False, True):
            engine = create_async_engine(
                url, pool_size=self.pool_size, pool_use_lifo=self.pool_lifo
            )
            self.engines.append(engine)
            store = SQLStore(engine)
            if not counted:
                await store.migrate()
            else:
                count_statements(engine, self.counters)
            self._twins.append(DurableSessionService(store, org_id=ORG))
        self.counting(False)

    async def release_counting(self) -> None:
        await self.engines[1].dispose()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.dispose()
