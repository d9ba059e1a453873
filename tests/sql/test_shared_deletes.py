"""A save deletes a shared key only as it found it: a key gone when the save checks it, then
set again by another writer before the save's delete runs, keeps that newer value.

At READ COMMITTED nothing locks a row's absence, so the check cannot hold the key absent;
the save must not delete what it did not find. The test holds the save between its check
and its delete with a row lock on another of the user's keys, which the save writes first.
(MySQL's run of the same interleaving is in ``test_mysql.py``.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from durable_sessions import Manager, Store
from support.sql import PG_DISTRIBUTED, raw_pg

pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), PG_DISTRIBUTED]
)


async def blocked_on_a_lock(admin: Any, database: str, task: asyncio.Task[Any]) -> None:
    """Return once a connection to ``database`` waits for a row lock."""
    for _ in range(1000):
        assert not task.done(), task
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
            database,
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no connection waited for the held row")


async def test_a_shared_key_gone_when_a_save_checks_it_is_not_deleted_once_set_again(
    store: Store, backend_url: str
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
    async with raw_pg(backend_url) as holder, raw_pg(backend_url) as admin:
        held = holder.transaction()
        await held.start()
        await holder.execute(
            "SELECT 1 FROM ds_user_state WHERE org_id = 'org' AND key = 'gate' FOR UPDATE"
        )
        saving = asyncio.create_task(manager.save(reader))
        await blocked_on_a_lock(admin, make_url(backend_url).database or "", saving)
        setter.set("app:k", "v3")
        await manager.save(setter)
        await held.rollback()
        await saving
    state = (await manager.get("org", "s0")).state
    assert state["app:k"] == "v3"
    assert state["user:gate"] == 1
