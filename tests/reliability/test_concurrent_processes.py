"""Separate OS processes sharing one SQLite file, or one Postgres or MySQL database: nothing is
lost.

Every scenario runs its jobs in spawned worker processes (``reliability.jobs``) that start
together at a file barrier, so the writes really overlap; the parent reads everything back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Manager, SQLStore
from durable_sessions.sql.migrate import current, head
from reliability.figures import Figures
from reliability.helpers import count_present
from reliability.jobs import PROCESSES, in_processes, scoped_keys
from support.sql import MYSQL, PG_DISTRIBUTED, SQL_BACKENDS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("backend", [*SQL_BACKENDS, PG_DISTRIBUTED, MYSQL]),
]

SCHEMA_TABLES = {"ds_sessions", "ds_user_state", "ds_app_state", "ds_events"}


async def run_jobs(
    pool: ProcessPoolExecutor, url: str, jobs: list[tuple[str, dict[str, Any]]], barrier: str
) -> list[Any]:
    """Run the jobs in the worker processes without blocking this test's event loop."""
    assert len(jobs) <= PROCESSES
    return await asyncio.to_thread(in_processes, pool, url, jobs, barrier)


async def test_processes_save_distinct_keys_of_every_scope(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes, each saving its own session 20 times with a private, user: and app: key."""
    manager = Manager(SQLStore(engine), app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(PROCESSES)]
    saves = 20
    jobs = [
        ("save_keys", {"org_id": "org", "session_id": s.id, "prefix": f"p{n}", "saves": saves})
        for n, s in enumerate(sessions)
    ]
    await run_jobs(process_pool, backend_url, jobs, barrier_dir("save"))
    expected = found = 0
    for n, session in enumerate(sessions):
        want = {k: v for i in range(saves) for k, v in scoped_keys(f"p{n}", i).items()}
        stored = await manager.get("org", session.id)
        expected += len(want)
        found += count_present(want, stored.state)
        assert stored.version == 1 + saves
    figures.record(
        "save user:/app:/private keys, processes",
        backend,
        operations=PROCESSES * saves,
        expected=expected,
        found=found,
    )


async def test_processes_append_events_with_keys_of_every_scope(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes, each appending 20 events to its own session, every delta in 3 scopes."""
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    sessions = [await manager.create("org", "alice") for _ in range(PROCESSES)]
    times = 20
    jobs = [
        ("append_keys", {"org_id": "org", "session_id": s.id, "prefix": f"p{n}", "times": times})
        for n, s in enumerate(sessions)
    ]
    await run_jobs(process_pool, backend_url, jobs, barrier_dir("append_keys"))
    expected = found = 0
    for n, session in enumerate(sessions):
        prefix = f"p{n}"
        want = {k: v for i in range(times) for k, v in scoped_keys(prefix, i).items()}
        stored = await store.get("org", session.id)
        events = await store.list_events("org", session.id)
        contents = {tuple(e.content) for e in events}
        expected += len(want) + times
        found += count_present(want, stored.state)
        found += sum(1 for i in range(times) if (prefix, i) in contents)
        assert [e.seq for e in events] == list(range(1, times + 1))
    figures.record(
        "append_event keys of every scope, processes",
        backend,
        operations=PROCESSES * times,
        expected=expected,
        found=found,
    )


async def test_processes_append_to_one_session_gapless(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes appending 40 events each to ONE session (``workers.py``'s append job)."""
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    times = 40
    jobs = [
        ("append", {"org_id": "org", "session_id": session.id, "prefix": f"p{n}", "times": times})
        for n in range(PROCESSES)
    ]
    await run_jobs(process_pool, backend_url, jobs, barrier_dir("append_one"))
    events = await store.list_events("org", session.id)
    stored = await store.get("org", session.id)
    want = {f"p{n}-{i}": i for n in range(PROCESSES) for i in range(times)}
    total = PROCESSES * times
    figures.record(
        "append_event to one session, processes",
        backend,
        operations=total,
        expected=total,
        found=count_present(want, stored.state),
    )
    assert [e.seq for e in events] == list(range(1, total + 1))
    counters = (stored.message_count, stored.token_total, stored.version)
    assert counters == (total, total, 1 + total)


async def test_processes_create_sessions(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes creating 10 sessions each for one user, with keys of every scope."""
    count = 10
    jobs = [
        ("create", {"org_id": "org", "user_id": "alice", "prefix": f"p{n}", "count": count})
        for n in range(PROCESSES)
    ]
    await run_jobs(process_pool, backend_url, jobs, barrier_dir("create"))
    manager = Manager(SQLStore(engine), app_name="app")
    expected = found = 0
    for n in range(PROCESSES):
        for i in range(count):
            keys = scoped_keys(f"p{n}", i)
            stored = await manager.get("org", f"p{n}-{i}")
            expected += len(keys)
            found += count_present(keys, stored.state)
    figures.record(
        "create with keys of every scope, processes",
        backend,
        operations=PROCESSES * count,
        expected=expected,
        found=found,
    )


async def test_processes_touch_keeps_exact_counters(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes touching one session 25 times each (``workers.py``'s touch job)."""
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice")
    times = 25
    job = {"org_id": "org", "session_id": session.id, "times": times}
    await run_jobs(process_pool, backend_url, [("touch", job)] * PROCESSES, barrier_dir("touch"))
    stored = await manager.get("org", session.id)
    total = PROCESSES * times
    figures.record(
        "touch counters, processes",
        backend,
        operations=total,
        expected=total,
        found=stored.message_count,
    )
    counters = (stored.message_count, stored.token_total, stored.version)
    assert counters == (total, 3 * total, 1 + total)


async def test_processes_two_stale_copies_exactly_one_stale_error(
    engine: AsyncEngine,
    backend: str,
    backend_url: str,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """Two processes load one version, meet at a barrier, save: each round exactly one
    StaleSessionError, the winner's keys whole, nothing of the loser."""
    manager = Manager(SQLStore(engine), app_name="app")
    session = await manager.create("org", "alice", state={"k": "init"})
    rounds = 8
    root = barrier_dir("stale")
    jobs = [
        (
            "stale_rounds",
            {
                "org_id": "org",
                "session_id": session.id,
                "me": me,
                "rounds": rounds,
                "barrier_root": root,
            },
        )
        for me in ("a", "b")
    ]
    results = await run_jobs(process_pool, backend_url, jobs, f"{root}/start")
    outcomes = {me: r["outcomes"] for me, r in zip(("a", "b"), results, strict=True)}
    stored = (await manager.get("org", session.id)).state
    expected = found = stale = 0
    for r in range(rounds):
        pair = sorted((outcomes["a"][r], outcomes["b"][r]))
        assert pair == ["stale", "won"], (r, outcomes)
        stale += 1
        winner, loser = ("a", "b") if outcomes["a"][r] == "won" else ("b", "a")
        want = {f"app:{winner}-{r}": r, f"only-{winner}-{r}": r}
        expected += len(want)
        found += count_present(want, stored)
        assert f"app:{loser}-{r}" not in stored
        assert f"only-{loser}-{r}" not in stored
    last = "a" if outcomes["a"][-1] == "won" else "b"
    assert stored["k"] == stored["user:from"] == f"{last}-{rounds - 1}"
    figures.record(
        "two stale copies saved at once, processes",
        backend,
        operations=2 * rounds,
        expected=expected,
        found=found,
        errors=stale,
    )


async def _schema(url: str) -> tuple[set[str], str | None]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        revision = await current(engine)
        manager = Manager(SQLStore(engine), app_name="app")
        session = await manager.create("org", "alice", state={"user:k": 1})
        assert (await manager.get("org", session.id)).state == {"user:k": 1}
        return tables, revision
    finally:
        await engine.dispose()


async def test_processes_migrate_fresh_databases_at_once(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    process_pool: ProcessPoolExecutor,
    barrier_dir: Callable[[str], str],
    figures: Figures,
) -> None:
    """4 processes run ``migrate()`` on one fresh database at once (2 databases): all
    succeed, the schema is whole and at head, and a store works on it."""
    databases = 2
    expected = found = 0
    for d in range(databases):
        if backend == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path / f'fresh-{d}.db'}"
        elif backend == "mysql":
            url = request.getfixturevalue("fresh_mysql_url")()
        else:
            url = request.getfixturevalue("fresh_pg_url")()
        await run_jobs(
            process_pool, url, [("migrate", {})] * PROCESSES, barrier_dir(f"migrate-{d}")
        )
        tables, revision = await _schema(url)
        want = {*SCHEMA_TABLES, f"revision {head()}"}
        have = {t for t in tables if t in SCHEMA_TABLES} | {f"revision {revision}"}
        expected += len(want)
        found += len(want & have)
    figures.record(
        "migrate() from processes, fresh databases",
        backend,
        operations=databases * PROCESSES,
        expected=expected,
        found=found,
    )
