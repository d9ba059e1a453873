"""A stale copy's state delta never wins: writers in separate "processes" (one engine and
store each, on one database) counting turns through reload-and-retry end at the exact total."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore, StaleSessionError
from support.sql import PG_DISTRIBUTED, STORE_SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", [*STORE_SQL_BACKENDS, PG_DISTRIBUTED])

PROCESSES = 3
TURNS = 6
"""Turns each process takes, each through several concurrent tasks."""


async def _turn(manager: Manager, conflicts: list[int]) -> None:
    """One turn as a service takes it: read (or create), compute the delta, append; on a
    conflict, read again and redo it."""
    while True:
        session = await manager.get_or_create("org", "alice", "counted")
        turns = session.get("turns", 0) + 1
        await asyncio.sleep(0)  # other turns read the same state meanwhile
        try:
            await manager.append_event(session, Event("agent", state_delta={"turns": turns}))
            return
        except StaleSessionError:
            conflicts.append(1)


async def test_turns_counted_by_processes_through_reload_and_retry_are_exact(
    engine: object, backend_url: str
) -> None:
    engines = [create_async_engine(backend_url) for _ in range(PROCESSES)]
    try:
        managers = [Manager(SQLStore(each), app_name="app") for each in engines]
        conflicts: list[int] = []
        await asyncio.gather(
            *(_turn(manager, conflicts) for manager in managers for _ in range(TURNS))
        )
        stored = await managers[0].get("org", "counted")
    finally:
        for each in engines:
            await each.dispose()
    assert stored.state["turns"] == PROCESSES * TURNS
    assert stored.message_count == PROCESSES * TURNS
    assert conflicts  # the processes did conflict, and every conflict was retried
