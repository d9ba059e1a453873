"""Profile durable-sessions' hot paths against the floor: where does each call's CPU go?

For each path: CPU per call without a profiler (main thread, and on SQLite aiosqlite's
worker thread apart), statements and round trips per call, then a cProfile run whose
self-time is grouped into buckets (statement build and compile, execution, result rows,
type processors, pool, async bridge, driver, event loop, our own Python). Bucket shares
are scaled to the unprofiled main-thread CPU, so the split is in microseconds per call.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Filter, Manager, SessionService, SQLStore

from .common import (
    APP,
    DRIVER,
    LIST_USER,
    ORG,
    Counters,
    Database,
    count_statements,
    driver_counting,
    new_tmpdir,
)
from .scaling import READER, Seeder
from .workloads import CONTENT, state_for

PATHS = ("get", "save", "append_event", "list_events20", "list50")
TYPES = "type processors (JSON, UTCDateTime)"
LOOP = "event loop, socket I/O"
BRIDGE = "async bridge (ext.asyncio, greenlet)"
HOPS = "driver: aiosqlite thread hops"
OURS = "durable-sessions Python"
# (substring of the file path, bucket); the first match wins.
BUCKETS: list[tuple[str, str]] = [
    ("durable_sessions/sql/schema.py", TYPES),
    ("/durable_sessions/", OURS),
    ("<string>", OURS),  # the namedtuple rows of durable-sessions' compiled statements
    ("/benchmarks/", "harness"),
    ("sqlalchemy/sql/sqltypes.py", TYPES),
    ("sqlalchemy/sql/type_api.py", TYPES),
    ("sqlalchemy/engine/processors", TYPES),
    ("/json/", TYPES),
    ("sqlalchemy/dialects/postgresql/json.py", TYPES),
    ("sqlalchemy/dialects/sqlite/json.py", TYPES),
    ("sqlalchemy/dialects/sqlite/base.py", TYPES),
    ("/datetime.py", TYPES),
    ("/re/", TYPES),  # json's scanner
    ("sqlalchemy/sql/", "SQLAlchemy statement build, cache key, compile"),
    ("sqlalchemy/engine/cursor.py", "SQLAlchemy result rows"),
    ("sqlalchemy/engine/result.py", "SQLAlchemy result rows"),
    ("sqlalchemy/engine/row.py", "SQLAlchemy result rows"),
    ("sqlalchemy/engine/_", "SQLAlchemy result rows"),
    ("sqlalchemy/engine/base.py", "SQLAlchemy execute (Connection, context)"),
    ("sqlalchemy/engine/default.py", "SQLAlchemy execute (Connection, context)"),
    ("sqlalchemy/pool/", "pool checkout/return, events"),
    ("sqlalchemy/event/", "pool checkout/return, events"),
    ("sqlalchemy/ext/asyncio/", BRIDGE),
    ("sqlalchemy/util/concurrency", BRIDGE),
    ("sqlalchemy/util/_concurrency", BRIDGE),
    ("sqlalchemy/connectors/asyncio.py", BRIDGE),
    ("sqlalchemy/dialects/", "SQLAlchemy DBAPI adapter (asyncpg/aiosqlite)"),
    ("sqlalchemy/", "SQLAlchemy other"),
    ("asyncpg", "driver: asyncpg"),
    ("aiosqlite", HOPS),
    ("threading.py", HOPS),
    ("queue.py", HOPS),
    ("asyncio", LOOP),
    ("selectors.py", LOOP),
]
# Builtins that are a cost of their own; any other builtin is charged to its callers.
BUILTINS: list[tuple[str, str]] = [
    ("epoll", LOOP),
    ("_socket", LOOP),
    ("_asyncio", LOOP),
    ("_contextvars", LOOP),
    ("greenlet", BRIDGE),
    ("sqlite3", HOPS),
    ("_queue", HOPS),
    ("_thread", HOPS),
    ("json", TYPES),
    ("datetime", TYPES),
    ("re.Pattern", TYPES),
    ("re.Match", TYPES),
    ("asyncpg", "driver: asyncpg"),
]


def bucket_of(filename: str) -> str:
    for needle, bucket in BUCKETS:
        if needle in filename:
            return bucket
    return "Python stdlib / other"


def _builtin_bucket(func: str) -> str | None:
    for needle, bucket in BUILTINS:
        if needle in func:
            return bucket
    return None


async def _cpu(op: Callable[[], Awaitable[Any]], n: int) -> dict[str, float]:
    wall, proc, main = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(n):
        await op()
    wall = time.perf_counter() - wall
    proc = time.process_time() - proc
    main = time.thread_time() - main
    return {
        "wall_us": wall / n * 1e6,
        "cpu_us": proc / n * 1e6,
        "main_cpu_us": main / n * 1e6,
        "worker_cpu_us": max(0.0, proc - main) / n * 1e6,
    }


async def _count(op: Callable[[], Awaitable[Any]], n: int, counters: Counters) -> dict[str, float]:
    driver_counting(True)
    counters.reset()
    DRIVER.reset()
    try:
        for _ in range(n):
            await op()
    finally:
        driver_counting(False)
    return {"statements": counters.statements / n, "round_trips": DRIVER.round_trips / n}


async def _profile(op: Callable[[], Awaitable[Any]], n: int) -> tuple[dict[str, float], list[Any]]:
    # CPU time of this thread, not wall time: waiting in epoll or for the GIL is not cost.
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for _ in range(n):
        await op()
    profiler.disable()
    stats: Any = pstats.Stats(profiler)
    buckets: dict[str, float] = defaultdict(float)
    top = []
    ours = []
    for (filename, line, func), (_cc, nc, tt, _ct, callers) in stats.stats.items():
        own = _builtin_bucket(func) if filename == "~" else bucket_of(filename)
        if own is None:
            # A plain builtin (isinstance, len, dict methods): charge whoever called it.
            for (c_file, _c_line, c_func), caller in callers.items():
                where = _builtin_bucket(c_func) if c_file == "~" else bucket_of(c_file)
                buckets[where or "Python stdlib / other"] += caller[2]
        else:
            buckets[own] += tt
        entry = (tt, nc, f"{_short(filename)}:{line}({func})")
        top.append(entry)
        if "/durable_sessions/" in filename:
            ours.append(entry)
    total = sum(buckets.values()) or 1.0
    top.sort(reverse=True)
    ours.sort(reverse=True)
    listed = top[:12] + [e for e in ours[:8] if e not in top[:12]]
    return {k: v / total for k, v in buckets.items()}, [
        (t / total, nc / n, name) for t, nc, name in listed
    ]


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


async def _ours_paths(store: SQLStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    manager = Manager(store, app_name=APP)
    service = SessionService(store, org_id=ORG)
    session = await manager.create(ORG, "u0", state=state_for(0, 0))
    writer = await manager.create(ORG, "u1", state=state_for(1, 0))
    appender = await manager.create(ORG, "u2", state=state_for(2, 0))
    seq = iter(range(1, 10**9))
    reader = f"{READER}-000000001"

    async def get() -> None:
        await service.get(app_name=APP, user_id="u0", session_id=session.id)

    async def save() -> None:
        i = next(seq)
        writer.set("k", i)
        writer.set("user:k1", i)
        writer.set("app:k1", i)
        await manager.save(writer)

    async def append_event() -> None:
        i = next(seq)
        delta = {"k": i, "user:k2": i, "app:k2": i}
        event = Event(author="user", content=CONTENT, state_delta=delta, tokens=12)
        await manager.append_event(appender, event)

    async def list_events20() -> None:
        await store.list_events(ORG, reader, limit=20)

    async def list50() -> None:
        await manager.list(Filter(ORG, user_id=LIST_USER, app_name=APP, limit=50))

    return {
        "get": get,
        "save": save,
        "append_event": append_event,
        "list_events20": list_events20,
        "list50": list50,
    }


async def _floor_paths(url: str, backend: str) -> tuple[dict[str, Any], Counters, Any]:
    from .runner import make_floor

    floor: Any = make_floor(backend)
    await floor.open(url)
    seeding = create_async_engine(url)
    await Seeder(seeding, backend).fixtures()
    await seeding.dispose()
    session = await floor.create("u0", state_for(0, 0))
    writer = await floor.create("u1", state_for(1, 0))
    appender = await floor.create("u2", state_for(2, 0))
    seq = iter(range(1, 10**9))
    reader = f"{READER}-000000001"
    paths = {
        "get": lambda: floor.get(session, None),
        "save": lambda: floor.save(writer, 1, next(seq)),
        "append_event": lambda: floor.append(appender, 2, next(seq)),
        "list_events20": lambda: floor.events(reader, 20),
        "list50": lambda: floor.list50(LIST_USER),
    }
    return paths, floor.counters, floor


async def run_profile(
    backends: list[str], n_ops: int, out: Path, log: Callable[[str], None]
) -> None:
    from .profile_report import write_profile

    tmpdir = new_tmpdir()
    results: dict[str, Any] = {}
    for backend in backends:
        dbs = [Database(backend, label, tmpdir) for label in ("prof_ours", "prof_floor")]
        for db in dbs:
            await db.create()
        try:
            # Timed on an engine without listeners; counted on a second one with the
            # statement listener (a listener makes SQLAlchemy and our runner do more).
            engine = create_async_engine(dbs[0].url)
            counting_engine = create_async_engine(dbs[0].url)
            store = SQLStore(engine)
            await store.migrate()
            await Seeder(engine, backend).fixtures()
            ours_counters = Counters()
            count_statements(counting_engine, ours_counters)
            ours = await _ours_paths(store)
            ours_counted = await _ours_paths(SQLStore(counting_engine))
            floor, floor_counters, floor_impl = await _floor_paths(dbs[1].url, backend)
            for path in PATHS:
                for op in (ours[path], floor[path], ours_counted[path]):
                    for _ in range(50):
                        await op()
                ours_cpu = await _cpu(ours[path], n_ops)
                ours_cpu.update(await _count(ours_counted[path], 20, ours_counters))
                floor_cpu = await _cpu(floor[path], n_ops)
                floor_cpu.update(await _count(floor[path], 20, floor_counters))
                split, top = await _profile(ours[path], n_ops)
                floor_split, _ = await _profile(floor[path], n_ops)
                results[f"{backend}/{path}"] = {
                    "ours": ours_cpu,
                    "floor": floor_cpu,
                    "split": split,
                    "floor_split": floor_split,
                    "top": top,
                }
                log(
                    f"  {backend:8} {path:14} ours cpu {ours_cpu['cpu_us']:7.0f} us "
                    f"(main {ours_cpu['main_cpu_us']:6.0f})  "
                    f"floor cpu {floor_cpu['cpu_us']:6.0f} us"
                    f"  ratio {ours_cpu['cpu_us'] / max(floor_cpu['cpu_us'], 1):5.1f}x"
                )
            await engine.dispose()
            await counting_engine.dispose()
            await floor_impl.close()
        finally:
            for db in dbs:
                await db.drop()
    write_profile(results, out / "profile.md", n_ops)
    log(f"profile written to {out / 'profile.md'}")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks run profile``: where each hot path's CPU goes, beside the floor."""
    import argparse
    import asyncio

    from .common import BACKENDS

    parser = argparse.ArgumentParser(prog="python -m benchmarks run profile")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument("--ops", type=int, default=2_000, help="calls per profiled path")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(run_profile(backends, args.ops, args.out, lambda t: print(t, flush=True)))
    return 0
