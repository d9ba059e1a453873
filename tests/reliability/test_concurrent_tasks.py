"""Concurrent asyncio tasks on one store, on a SQLite file and on Postgres: nothing is lost.

Each scenario writes distinct things at the same time, reads everything back with a fresh
``get``/``list_events``, records a row of figures and fails on any loss.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import (
    Event,
    Manager,
    SessionExistsError,
    SQLStore,
    StaleSessionError,
)
from reliability.figures import Figures
from reliability.helpers import count_present
from reliability.jobs import scoped_keys
from support.sql import PG_DISTRIBUTED, STORE_SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", [*STORE_SQL_BACKENDS, PG_DISTRIBUTED])

TASKS = 8


async def test_tasks_save_distinct_keys_of_every_scope(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """8 tasks, each saving its own session 15 times with a private, user: and app: key."""
    manager = Manager(SQLStore(engine), app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(TASKS)]
    saves = 15

    async def saver(session_id: str, prefix: str) -> None:
        for i in range(saves):
            session = await manager.get("org", session_id)
            for key, value in scoped_keys(prefix, i).items():
                session.set(key, value)
            await manager.save(session)

    await asyncio.gather(*(saver(s.id, f"t{n}") for n, s in enumerate(sessions)))

    expected = found = 0
    for n, session in enumerate(sessions):
        want = {k: v for i in range(saves) for k, v in scoped_keys(f"t{n}", i).items()}
        stored = await manager.get("org", session.id)
        expected += len(want)
        found += count_present(want, stored.state)
        assert stored.version == 1 + saves
    figures.record(
        "save user:/app:/private keys, tasks",
        backend,
        operations=TASKS * saves,
        expected=expected,
        found=found,
    )
    # Every session of the user sees every task's shared keys.
    fresh = await manager.create("org", "alice")
    shared = {k for k in fresh.state if k.startswith(("user:", "app:"))}
    assert len(shared) == 2 * TASKS * saves


async def test_tasks_append_events_with_keys_of_every_scope(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """8 tasks, each appending 15 events to its own session, every delta in three scopes."""
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(TASKS)]
    times = 15

    async def appender(session_id: str, prefix: str) -> None:
        for i in range(times):
            await store.append_event(
                "org",
                session_id,
                Event("agent", content=[prefix, i], state_delta=scoped_keys(prefix, i), tokens=1),
            )

    await asyncio.gather(*(appender(s.id, f"t{n}") for n, s in enumerate(sessions)))

    expected = found = 0
    for n, session in enumerate(sessions):
        prefix = f"t{n}"
        want = {k: v for i in range(times) for k, v in scoped_keys(prefix, i).items()}
        stored = await store.get("org", session.id)
        events = await store.list_events("org", session.id)
        contents = {tuple(e.content) for e in events}
        expected += len(want) + times
        found += count_present(want, stored.state)
        found += sum(1 for i in range(times) if (prefix, i) in contents)
        assert [e.seq for e in events] == list(range(1, times + 1))
        assert (stored.message_count, stored.token_total) == (times, times)
    figures.record(
        "append_event keys of every scope, tasks",
        backend,
        operations=TASKS * times,
        expected=expected,
        found=found,
    )


async def test_tasks_append_to_one_session_gapless(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """8 tasks appending 25 events each to ONE session: seqs 1..200, no gap, no duplicate."""
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    times = 25

    async def appender(task: int) -> None:
        for i in range(times):
            await store.append_event(
                "org",
                session.id,
                Event("agent", content=[task, i], state_delta={f"t{task}-{i}": i}, tokens=2),
            )

    await asyncio.gather(*(appender(t) for t in range(TASKS)))

    events = await store.list_events("org", session.id)
    contents = {tuple(e.content) for e in events}
    want = [(t, i) for t in range(TASKS) for i in range(times)]
    figures.record(
        "append_event to one session, tasks",
        backend,
        operations=len(want),
        expected=len(want),
        found=sum(1 for item in want if item in contents),
    )
    total = TASKS * times
    assert [e.seq for e in events] == list(range(1, total + 1))
    stored = await store.get("org", session.id)
    counters = (stored.message_count, stored.token_total, stored.version)
    assert counters == (total, 2 * total, 1 + total)
    assert {f"t{t}-{i}" for t, i in want} <= stored.state.keys()


async def test_tasks_create_distinct_sessions(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """20 concurrent creates of one user, each with a private, user: and app: key."""
    manager = Manager(SQLStore(engine), app_name="app")
    count = 20
    await asyncio.gather(
        *(
            manager.create("org", "alice", id=f"c{i}", state=scoped_keys(f"c{i}", i))
            for i in range(count)
        )
    )
    shared_want: dict[str, Any] = {}
    expected = found = 0
    for i in range(count):
        keys = scoped_keys(f"c{i}", i)
        shared_want.update({k: v for k, v in keys.items() if ":" in k})
        stored = await manager.get("org", f"c{i}")
        expected += len(keys)
        found += count_present(keys, stored.state)
    figures.record(
        "create with keys of every scope, tasks",
        backend,
        operations=count,
        expected=expected,
        found=found,
    )
    last = await manager.get("org", f"c{count - 1}")
    assert count_present(shared_want, last.state) == len(shared_want)


async def test_tasks_create_one_id_exactly_one_wins(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """10 concurrent creates of ONE id: one wins whole, nine get SessionExistsError, and no
    loser's user: or app: key is written."""
    manager = Manager(SQLStore(engine), app_name="app")
    count = 10
    results = await asyncio.gather(
        *(
            manager.create("org", "alice", id="same", state=scoped_keys(f"s{i}", i))
            for i in range(count)
        ),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, SessionExistsError) for e in errors), errors
    (winner,) = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    stored = await manager.get("org", "same")
    want = scoped_keys(f"s{winner}", winner)
    figures.record(
        "create one id at once, tasks",
        backend,
        operations=count,
        expected=len(want),
        found=count_present(want, stored.state),
        errors=len(errors),
    )
    assert len(errors) == count - 1
    assert stored.state == want  # nothing of the nine losers, in any scope
    assert stored.version == 1


async def test_tasks_touch_keeps_exact_counters(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """8 tasks touching one session 25 times each (1 message, 3 tokens): exact counters."""
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice")
    times = 25

    async def toucher() -> None:
        copy = await manager.get("org", session.id)
        for _ in range(times):
            await manager.touch(copy, 1, 3)

    await asyncio.gather(*(toucher() for _ in range(TASKS)))
    stored = await manager.get("org", session.id)
    total = TASKS * times
    figures.record(
        "touch counters, tasks",
        backend,
        operations=total,
        expected=total,
        found=stored.message_count,
    )
    counters = (stored.message_count, stored.token_total, stored.version)
    assert counters == (total, 3 * total, 1 + total)


async def test_tasks_two_stale_copies_exactly_one_stale_error(
    engine: AsyncEngine, backend: str, figures: Figures
) -> None:
    """Two copies of one version saved at once, 10 rounds: each round exactly one
    StaleSessionError, the winner's keys whole, nothing of the loser in any scope."""
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice", state={"k": "init"})
    rounds = 10
    expected = found = stale = 0
    for r in range(rounds):
        copies = {me: await manager.get("org", session.id) for me in ("a", "b")}
        for me, copy in copies.items():
            copy.set("k", f"{me}-{r}")
            copy.set("user:from", f"{me}-{r}")
            copy.set(f"app:{me}-{r}", r)
            copy.set(f"only-{me}-{r}", r)
        results = await asyncio.gather(
            manager.save(copies["a"]), manager.save(copies["b"]), return_exceptions=True
        )
        losers = [r_ for r_ in results if isinstance(r_, BaseException)]
        assert len(losers) == 1, results
        assert isinstance(losers[0], StaleSessionError)
        stale += 1
        winner, loser = ("b", "a") if results[0] is losers[0] else ("a", "b")
        stored = (await manager.get("org", session.id)).state
        want = {
            "k": f"{winner}-{r}",
            "user:from": f"{winner}-{r}",
            f"app:{winner}-{r}": r,
            f"only-{winner}-{r}": r,
        }
        expected += len(want)
        found += count_present(want, stored)
        assert f"app:{loser}-{r}" not in stored
        assert f"only-{loser}-{r}" not in stored
    figures.record(
        "two stale copies saved at once, tasks",
        backend,
        operations=2 * rounds,
        expected=expected,
        found=found,
        errors=stale,
    )
    assert (await manager.get("org", session.id)).version == 1 + rounds


# -- moved from the former tests/test_concurrency.py: what the scenarios above do not cover


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
