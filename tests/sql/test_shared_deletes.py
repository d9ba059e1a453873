"""A save deletes a shared key only as it found it: a key gone when the save checks it, then
set again by another writer before the save's delete runs, keeps that newer value.

At READ COMMITTED nothing locks a row's absence, so the check cannot hold the key absent;
the save must not delete what it did not find. The test holds the save between its check
and its delete with a row lock on another of the user's keys, which the save writes first
(``user:`` keys before ``app:`` keys). SQLite is not here: its writer holds the whole
database, so no other save can run between the check and the delete.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from durable_sessions import Manager, Store
from support.sql import MYSQL, PG_DISTRIBUTED, raw_mysql, raw_pg

pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), PG_DISTRIBUTED, MYSQL]
)

Waiter = Callable[[], Awaitable[bool]]
"""Whether a connection of the test's database now waits for the held row."""


@asynccontextmanager
async def _pg_holding(url: str, select: str) -> AsyncIterator[Waiter]:
    database = make_url(url).database or ""
    async with raw_pg(url) as holder, raw_pg(url) as admin:
        held = holder.transaction()
        await held.start()
        await holder.execute(select)

        async def waiting() -> bool:
            return bool(
                await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                    "AND wait_event_type = 'Lock'",
                    database,
                )
            )

        try:
            yield waiting
        finally:
            await held.rollback()


@asynccontextmanager
async def _mysql_holding(url: str, select: str) -> AsyncIterator[Waiter]:
    database = make_url(url).database or ""
    async with raw_mysql(url) as holder, raw_mysql(url) as admin, holder.cursor() as cursor:
        await holder.begin()
        await cursor.execute(select.replace(" key ", " `key` "))

        async def waiting() -> bool:
            async with admin.cursor() as watch:
                await watch.execute(
                    "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = %s "
                    "AND COMMAND = 'Query' AND INFO LIKE 'INSERT INTO ds_user_state%%'",
                    (database,),
                )
                return bool((await watch.fetchone())[0])

        try:
            yield waiting
        finally:
            await holder.rollback()


def holding(backend: str, url: str, select: str) -> Any:
    """Hold the row ``select`` locks (FOR UPDATE) on another connection until the block
    ends; the block gets what tells whether a connection waits for it."""
    return (_mysql_holding if backend == "mysql" else _pg_holding)(url, select)


async def blocked_on_a_lock(waiting: Waiter, task: asyncio.Task[Any]) -> None:
    """Return once a connection waits for the held row (polled: the wait has no event)."""
    for _ in range(1000):
        assert not task.done(), task
        if await waiting():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no connection waited for the held row")


async def test_a_shared_key_gone_when_a_save_checks_it_is_not_deleted_once_set_again(
    store: Store, backend: str, backend_url: str
) -> None:
    # A copy that read app:k = "v0" deletes it, after another copy deleted it already; its
    # save also sets user:gate, whose row another connection holds. Meanwhile a third copy
    # sets app:k = "v3". Once the save goes on, its delete must not remove "v3", a value it
    # never read.
    manager = Manager(store, app_name="app")
    await manager.create("org", "ada", id="s0", state={"app:k": "v0", "user:gate": 0})
    reader = await manager.create("org", "ada", id="s1")
    deleter = await manager.create("org", "ada", id="s2")
    setter = await manager.create("org", "ada", id="s3")
    deleter.delete("app:k")
    await manager.save(deleter)
    reader.delete("app:k")
    reader.set("user:gate", 1)
    gate = "SELECT 1 FROM ds_user_state WHERE org_id = 'org' AND key = 'gate' FOR UPDATE"
    async with holding(backend, backend_url, gate) as waiting:
        saving = asyncio.create_task(manager.save(reader))
        await blocked_on_a_lock(waiting, saving)
        setter.set("app:k", "v3")
        await manager.save(setter)
    await saving
    state = (await manager.get("org", "s0")).state
    assert state["app:k"] == "v3"
    assert state["user:gate"] == 1
