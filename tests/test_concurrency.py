"""Concurrent writers on SQLite and Postgres, in tasks and in separate processes: nothing lost."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Manager, SQLStore, StaleSessionError
from sqlhelpers import SQL_BACKENDS
from workers import run

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS)


def in_processes(url: str, jobs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Run each job in its own spawned OS process, all at once, and wait for them."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(jobs), mp_context=ctx) as pool:
        futures = [pool.submit(run, url, job, args) for job, args in jobs]
        return [f.result(timeout=240) for f in futures]


async def test_tasks_saving_distinct_user_keys_lose_nothing(engine: AsyncEngine) -> None:
    manager = Manager(SQLStore(engine), app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(20)]

    async def saver(session_id: str, prefix: int) -> None:
        for i in range(20):
            session = await manager.get("org", session_id)
            session.set(f"user:{prefix}-{i}", i)
            session.set(f"own-{i}", i)
            await manager.save(session)

    await asyncio.gather(*(saver(s.id, n) for n, s in enumerate(sessions)))
    fresh = await manager.create("org", "alice")
    user_keys = {k for k in fresh.state if k.startswith("user:")}
    assert user_keys == {f"user:{p}-{i}" for p in range(20) for i in range(20)}
    for session in sessions:
        own = {k for k in (await manager.get("org", session.id)).state if k.startswith("own-")}
        assert own == {f"own-{i}" for i in range(20)}


@pytest.mark.slow
async def test_processes_saving_distinct_user_keys_lose_nothing(
    engine: AsyncEngine, backend_url: str
) -> None:
    manager = Manager(SQLStore(engine), app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(4)]
    jobs = [
        ("save_user_keys", {"org_id": "org", "session_id": s.id, "prefix": f"p{n}", "saves": 25})
        for n, s in enumerate(sessions)
    ]
    await asyncio.to_thread(in_processes, backend_url, jobs)
    state = (await manager.get("org", sessions[0].id)).state
    expected = {f"user:p{n}-{i}" for n in range(4) for i in range(25)}
    assert {k for k in state if k.startswith("user:")} == expected


async def test_concurrent_creates_keep_every_shared_key(engine: AsyncEngine) -> None:
    manager = Manager(SQLStore(engine), app_name="app")
    created = await asyncio.gather(
        *(
            manager.create("org", "alice", state={f"user:u{i}": i, f"app:a{i}": i, "own": i})
            for i in range(20)
        )
    )
    state = (await manager.get("org", created[0].id)).state
    assert {k: v for k, v in state.items() if k.startswith("user:")} == {
        f"user:u{i}": i for i in range(20)
    }
    assert {k: v for k, v in state.items() if k.startswith("app:")} == {
        f"app:a{i}": i for i in range(20)
    }
    assert sorted([(await manager.get("org", s.id)).state["own"] for s in created]) == list(
        range(20)
    )


async def test_two_stale_copies_saved_at_once_exactly_one_loses(engine: AsyncEngine) -> None:
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice", state={"k": 0})
    for _ in range(10):
        a = await manager.get("org", session.id)
        b = await manager.get("org", session.id)
        a.set("k", "a")
        a.set("user:from", "a")
        b.set("k", "b")
        b.set("user:from", "b")
        b.set("only-b", True)
        results = await asyncio.gather(manager.save(a), manager.save(b), return_exceptions=True)
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(losers) == 1
        assert isinstance(losers[0], StaleSessionError)
        winner = "a" if results[1] is losers[0] else "b"
        stored = (await manager.get("org", session.id)).state
        assert stored["k"] == winner
        assert stored["user:from"] == winner
        assert ("only-b" in stored) == (winner == "b")
        if winner == "b":
            b.delete("only-b")
            await manager.save(b)


@pytest.mark.slow
async def test_touch_from_processes_keeps_exact_counters(
    engine: AsyncEngine, backend_url: str
) -> None:
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice")
    job = {"org_id": "org", "session_id": session.id, "times": 25}
    await asyncio.to_thread(in_processes, backend_url, [("touch", job)] * 4)
    stored = await manager.get("org", session.id)
    assert (stored.message_count, stored.token_total) == (100, 300)
    assert stored.version == 101


async def test_appends_from_tasks_are_gapless(engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")

    async def appender(task: int) -> None:
        for i in range(50):
            await store.append_event(
                "org",
                session.id,
                Event("agent", content=[task, i], state_delta={f"t{task}-{i}": i}, tokens=2),
            )

    await asyncio.gather(*(appender(t) for t in range(8)))
    events = await store.list_events("org", session.id)
    assert [e.seq for e in events] == list(range(1, 401))
    assert sorted(tuple(e.content) for e in events) == [(t, i) for t in range(8) for i in range(50)]
    stored = await store.get("org", session.id)
    assert {f"t{t}-{i}" for t in range(8) for i in range(50)} <= stored.state.keys()
    assert (stored.message_count, stored.token_total) == (400, 800)


@pytest.mark.slow
async def test_appends_from_processes_are_gapless(engine: AsyncEngine, backend_url: str) -> None:
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    jobs = [
        ("append", {"org_id": "org", "session_id": session.id, "prefix": f"p{n}", "times": 50})
        for n in range(4)
    ]
    await asyncio.to_thread(in_processes, backend_url, jobs)
    events = await store.list_events("org", session.id)
    assert [e.seq for e in events] == list(range(1, 201))
    stored = await store.get("org", session.id)
    assert {f"p{n}-{i}" for n in range(4) for i in range(50)} <= stored.state.keys()
    assert stored.message_count == 200


async def test_forks_taken_during_appends_copy_a_consistent_transcript(
    engine: AsyncEngine,
) -> None:
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    parent = await manager.create("org", "alice")

    async def appender() -> None:
        for i in range(40):
            await store.append_event("org", parent.id, Event("agent", content=i))

    async def forker() -> list[str]:
        made = []
        for _ in range(8):
            made.append((await manager.fork("org", parent.id, with_events=True)).id)
            await asyncio.sleep(0)
        return made

    _, children = await asyncio.gather(appender(), forker())
    for child_id in children:
        copied = await store.list_events("org", child_id)
        assert [e.seq for e in copied] == list(range(1, len(copied) + 1))
        child = await store.get("org", child_id)
        assert child.message_count == len(copied)
        nxt = await store.append_event("org", child_id, Event("user", content="next"))
        assert nxt.seq == len(copied) + 1
    assert len(await store.list_events("org", parent.id)) == 40
