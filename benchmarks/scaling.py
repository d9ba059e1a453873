"""Scaling: durable-sessions' latency as the sessions table and one transcript grow.

Big tables are seeded with set-based SQL straight into the schema that ``store.migrate()``
created (``generate_series`` on Postgres, a recursive CTE on SQLite); every measured
operation goes through the library's public API.

Two more measurements run from here (``python -m benchmarks.scaling --help``): the time of
a whole export per session as the sessions table grows (``export``), and the export's peak
memory, in a child process of its own, as the number of 1 MB events grows (``memory``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, SessionService, SQLStore

from .common import APP, LIST_USER, ORG, Database, Op, measure
from .workloads import CONTENT

USERS = 1_000
"""Seeded sessions are spread over this many users."""
READER = "reader-session"
LONG = "long-session"
ROUNDS = 3


def _pg_sessions(first: int, last: int, prefix: str, user: str) -> str:
    return f"""
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
SELECT '{ORG}', '{prefix}' || lpad(g::text, 9, '0'), {user}, '{APP}', '', '{{"k": 1}}'::jsonb,
  NULL, now() - make_interval(secs => g), now() - make_interval(secs => g), 1, 0, 1, 1
FROM generate_series({first}, {last}) g"""


def _pg_events(session: str, first: int, last: int, total: int, one_each: bool) -> str:
    return f"""
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{ORG}', {session}, {"1" if one_each else "g"}, 'ev-' || g, 'user', '',
  '{_json(CONTENT)}'::jsonb, '{{}}'::jsonb, 0, now() - make_interval(secs => {total} - g)
FROM generate_series({first}, {last}) g"""


def _json(value: Any) -> str:
    import json

    return json.dumps(value).replace("'", "''")


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || ({secs}) || ' seconds') || '.000000'"


def _sqlite_sessions(first: int, last: int, prefix: str, user: str) -> str:
    stamp = _SQLITE_NOW.format(secs="x")
    return f"""
WITH RECURSIVE g(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM g WHERE x < {last})
INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, created_at,
  updated_at, message_count, token_total, event_seq, version)
SELECT '{ORG}', '{prefix}' || printf('%09d', x), {user}, '{APP}', '', '{{"k": 1}}', NULL,
  {stamp}, {stamp}, 1, 0, 1, 1 FROM g"""


def _sqlite_events(session: str, first: int, last: int, total: int, one_each: bool) -> str:
    seq = "1" if one_each else "x"
    return f"""
WITH RECURSIVE g(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM g WHERE x < {last})
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{ORG}', {session}, {seq}, 'ev-' || x, 'user', '', '{_json(CONTENT)}', '{{}}', 0,
  {_SQLITE_NOW.format(secs=f"{total} - x")} FROM g"""


class Seeder:
    """Grows the tables of one database with set-based SQL."""

    def __init__(self, engine: AsyncEngine, backend: str) -> None:
        self.engine = engine
        self.backend = backend
        self.sessions = 0
        var = "g" if backend == "postgres" else "x"
        self.users = f"'u' || ({var} % {USERS})"

    async def _exec(self, *statements: str) -> None:
        async with self.engine.begin() as conn:
            for sql in statements:
                await conn.exec_driver_sql(sql)
            await conn.exec_driver_sql("ANALYZE")

    def _s(self, first: int, last: int, prefix: str, user: str) -> str:
        fn = _pg_sessions if self.backend == "postgres" else _sqlite_sessions
        return fn(first, last, prefix, user)

    def _e(self, session: str, first: int, last: int, total: int, one_each: bool = False) -> str:
        """Events ``first..last``: of one session (seq = n), or one each of many sessions."""
        fn = _pg_events if self.backend == "postgres" else _sqlite_events
        return fn(session, first, last, total, one_each)

    async def fixtures(self) -> None:
        """The listed user's 1,000 sessions and a session of 1,000 events."""
        await self._exec(
            self._s(1, 1_000, "list-", f"'{LIST_USER}'"),
            *self._transcript(READER, 1_000),
        )

    def _transcript(self, prefix: str, size: int) -> list[str]:
        session = f"{prefix}-000000001"
        return [
            self._s(1, 1, prefix + "-", "'reader'"),
            self._e(f"'{session}'", 1, size, size),
            f"UPDATE ds_sessions SET event_seq = {size}, message_count = {size} "
            f"WHERE id = '{session}'",
        ]

    async def transcript(self, size: int) -> str:
        """Add a session of ``size`` events; return its id."""
        prefix = f"{LONG}{size}"
        await self._exec(*self._transcript(prefix, size))
        return f"{prefix}-000000001"

    async def grow_sessions(self, size: int) -> None:
        """Seed sessions (one event each) until the table holds ``size`` of them."""
        if size <= self.sessions:
            return
        first, last = self.sessions + 1, size
        pad = "lpad(g::text, 9, '0')" if self.backend == "postgres" else "printf('%09d', x)"
        events = self._e(f"'seed-' || {pad}", first, last, last, one_each=True)
        await self._exec(self._s(first, last, "seed-", self.users), events)
        self.sessions = size


class Target:
    """One database of a given size, with the library's objects over it."""

    def __init__(self, db: Database, engine: AsyncEngine) -> None:
        self.db = db
        self.engine = engine
        self.store = SQLStore(engine)
        self.manager = Manager(self.store, app_name=APP)
        self.service = SessionService(self.store, org_id=ORG)


async def _open(backend: str, tmpdir: Path, label: str, opened: list[Target]) -> Target:
    db = Database(backend, label, tmpdir)
    await db.create()
    engine = create_async_engine(db.url)
    target = Target(db, engine)
    opened.append(target)
    await target.store.migrate()
    return target


def _session_ops(target: Target, size: int, rng: random.Random) -> dict[str, Op]:
    service, manager = target.service, target.manager
    reader = f"{READER}-000000001"

    async def get() -> None:
        number = rng.randint(1, size)
        await service.get(
            app_name=APP, user_id=f"u{number % USERS}", session_id=f"seed-{number:09d}"
        )

    async def recent20() -> None:
        s = await service.get(
            app_name=APP, user_id="reader", session_id=reader, num_recent_events=20
        )
        assert len(s.events) == 20

    async def list50() -> None:
        found = await manager.list(Filter(ORG, user_id=LIST_USER, app_name=APP, limit=50))
        assert len(found) == 50

    return {"get": get, "recent20": recent20, "list50": list50}


async def _transcript_ops(target: Target, session_id: str) -> dict[str, Op]:
    service, manager = target.service, target.manager
    session = await manager.get(ORG, session_id)

    async def recent20() -> None:
        s = await service.get(
            app_name=APP, user_id="reader", session_id=session_id, num_recent_events=20
        )
        assert len(s.events) == 20

    async def get() -> None:
        await manager.get(ORG, session_id)

    async def append() -> None:
        event = Event(author="user", content=CONTENT, state_delta={"k": 1, "user:k": 1})
        await manager.append_event(session, event)

    return {"recent20": recent20, "get": get, "append": append}


async def run_scaling(
    backend: str,
    sizes: list[int],
    event_sizes: list[int],
    duration: float,
    tmpdir: Path,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Measure get, recent20 and list50 per table size (one database per size), and
    recent20, get and append per transcript length (one session per length); the sizes
    are measured in interleaved rounds. Return the rows."""
    opened: list[Target] = []
    rows: list[dict[str, Any]] = []
    rng = random.Random(7)
    try:
        plans: list[tuple[str, int, Target, dict[str, Op]]] = []
        for size in sorted(sizes):
            target = await _open(backend, tmpdir, f"scale{size}", opened)
            seeder = Seeder(target.engine, backend)
            await seeder.fixtures()
            await seeder.grow_sessions(size)
            log(f"  seeded {size:,} sessions")
            plans.append(("sessions", size, target, _session_ops(target, size, rng)))
        first = opened[0]
        seeder = Seeder(first.engine, backend)
        for size in sorted(event_sizes):
            session_id = await seeder.transcript(size)
            plans.append(("events", size, first, await _transcript_ops(first, session_id)))
        log(f"  seeded transcripts of {', '.join(f'{s:,}' for s in sorted(event_sizes))} events")
        for axis in ("sessions", "events"):
            rows += await _rounds(backend, axis, [p for p in plans if p[0] == axis], duration, log)
    finally:
        for target in opened:
            await target.engine.dispose()
            await target.db.drop()
    return rows


async def _rounds(
    backend: str,
    axis: str,
    plans: list[tuple[str, int, Target, dict[str, Op]]],
    duration: float,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    # ROUNDS short rounds, sizes and operations interleaved, so that a burst of noise on
    # this shared machine hits one round of every point rather than one whole point.
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for _axis, size, _target, ops in plans:
            for name, op in ops.items():
                result = await measure([op], duration=duration / ROUNDS, warmup=10)
                results.setdefault((size, name), []).append(result)
    rows = []
    for (size, name), found in results.items():
        row = {
            "backend": backend,
            "axis": axis,
            "size": size,
            "operation": name,
            "p50_ms": min(r["p50_ms"] for r in found),
            "p99_ms": statistics.median(r["p99_ms"] for r in found),
            "ops_per_sec": max(r["ops_per_sec"] for r in found),
            "ops": sum(r["ops"] for r in found),
            "errors": sum(r["errors"] for r in found),
        }
        rows.append(row)
        log(
            f"  {backend:8} {axis:8} {size:>9,} {name:9} p50 {row['p50_ms']:7.3f} ms  "
            f"p99 {row['p99_ms']:7.3f} ms  {row['ops_per_sec']:8.1f} ops/s"
        )
    return rows


# -- export: time per session as the table grows, peak memory as events grow ---------------


class _Sink:
    """A binary stream that counts the bytes written to it and keeps none."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)


async def run_export_scaling(
    backend: str, sizes: list[int], tmpdir: Path, log: Callable[[str], None], rounds: int = 2
) -> list[dict[str, Any]]:
    """Export one database grown to each size in turn (sessions of one event each, as the
    latency curves seed them); return the best of ``rounds`` times per size."""
    from durable_sessions.sql.transfer import export_jsonl

    opened: list[Target] = []
    rows: list[dict[str, Any]] = []
    try:
        target = await _open(backend, tmpdir, "export", opened)
        seeder = Seeder(target.engine, backend)
        for size in sorted(sizes):
            await seeder.grow_sessions(size)
            times = []
            for _ in range(rounds):
                sink = _Sink()
                start = time.perf_counter()
                counts = await export_jsonl(target.store, sink)  # type: ignore[arg-type]
                times.append(time.perf_counter() - start)
            assert counts.sessions == size
            best = min(times)
            page_ms = await _last_page_ms(target, size)
            rows.append(
                {
                    "backend": backend,
                    "sessions": size,
                    "events": counts.events,
                    "seconds": round(best, 3),
                    "us_per_session": round(best / size * 1e6, 1),
                    "last_page_ms": round(page_ms, 2),
                    "output_mb": round(sink.size / 1e6, 1),
                }
            )
            log(
                f"  {backend:8} export {size:>9,} sessions  {best:8.2f} s  "
                f"{best / size * 1e6:7.1f} us/session  last page {page_ms:7.2f} ms  "
                f"({sink.size / 1e6:,.0f} MB written)"
            )
    finally:
        for target in opened:
            await target.engine.dispose()
            await target.db.drop()
    return rows


async def _last_page_ms(target: Target, size: int) -> float:
    """The best of five reads of the export's last page of sessions (its keyset query)."""
    from durable_sessions.sql.schema import sessions
    from durable_sessions.sql.transfer import PAGE_SIZE, page_queries

    following = page_queries(sessions, target.engine.dialect.name)[1]
    # Seeded ids are seed-000000001.. in one organisation: the last page follows this one.
    after = {"after_org_id": ORG, "after_id": f"seed-{max(size - PAGE_SIZE, 0):09d}"}
    best = float("inf")
    async with target.engine.connect() as conn:
        for _ in range(5):
            start = time.perf_counter()
            rows = (await conn.execute(following, after)).all()
            best = min(best, time.perf_counter() - start)
    assert len(rows) == min(size, PAGE_SIZE)
    return best * 1e3


EVENT_BYTES = 1 << 20
"""The size of each event's content in the memory measurement: a 1 MiB string."""

_PG_BIG_EVENTS = """
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{org}', 'big', g, 'ev-' || g, 'user', '',
  jsonb_build_object('text', repeat(md5(g::text), {repeats})), '{{}}'::jsonb, 0, now()
FROM generate_series(1, {count}) g"""

_SQLITE_BIG_EVENTS = """
WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < {count})
INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content,
  state_delta, tokens, timestamp)
SELECT '{org}', 'big', x, 'ev-' || x, 'user', '',
  '{{"text":"' || hex(zeroblob({half})) || '"}}', '{{}}', 0, '2025-01-01 00:00:00.000000'
FROM g"""

MEASURE_EXPORT = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions import SQLStore
from durable_sessions.sql.transfer import count_sessions, export_jsonl

class Sink:
    size = 0
    def write(self, data):
        self.size += len(data)
        return len(data)

def status_kib(field):
    # VmHWM is this process's own peak: ru_maxrss would also count the parent's RSS,
    # which Linux carries over a fork and exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

async def main():
    engine = create_async_engine(sys.argv[1])
    store = SQLStore(engine)
    await count_sessions(store)  # modules loaded, a connection open
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current RSS
    before = status_kib("VmRSS")
    sink = Sink()
    counts = await export_jsonl(store, sink)
    await engine.dispose()
    print(before, status_kib("VmHWM"), counts.events, sink.size)

asyncio.run(main())
"""


def measure_export_memory(url: str) -> dict[str, int]:
    """Export the database at ``url`` in a fresh child process; return its memory in KiB:
    ``peak`` (VmHWM) and ``before`` (RSS once loaded and connected, before exporting)."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_EXPORT, url],
        capture_output=True,
        check=True,
        timeout=3600,
    )
    before, peak, events, size = map(int, done.stdout.split())
    return {"before": before, "peak": peak, "events": events, "bytes": size}


async def seed_big_events(target: Target, backend: str, count: int) -> None:
    """One session of ``count`` events whose content is a string of EVENT_BYTES."""
    from durable_sessions import Session

    await target.store.create(Session(id="big", org_id=ORG, user_id="u", app_name=APP))
    if backend == "postgres":
        sql = _PG_BIG_EVENTS.format(org=ORG, count=count, repeats=EVENT_BYTES // 32)
    else:
        sql = _SQLITE_BIG_EVENTS.format(org=ORG, count=count, half=EVENT_BYTES // 2)
    async with target.engine.begin() as conn:
        await conn.exec_driver_sql(sql)
        await conn.exec_driver_sql(
            f"UPDATE ds_sessions SET event_seq = {count}, message_count = {count} WHERE id = 'big'"
        )


async def run_export_memory(
    backend: str, counts: list[int], tmpdir: Path, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Peak memory of exporting one session of N events of 1 MiB each, per N."""
    rows: list[dict[str, Any]] = []
    for count in counts:
        opened: list[Target] = []
        try:
            target = await _open(backend, tmpdir, f"mem{count}", opened)
            await seed_big_events(target, backend, count)
            await target.engine.dispose()
            found = measure_export_memory(target.db.url)
        finally:
            for target in opened:
                await target.engine.dispose()
                await target.db.drop()
        assert found["events"] == count
        row = {
            "backend": backend,
            "events": count,
            "event_mb": EVENT_BYTES / (1 << 20),
            "peak_rss_mb": round(found["peak"] / 1024),
            "growth_mb": round((found["peak"] - found["before"]) / 1024),
            "output_mb": round(found["bytes"] / 1e6),
        }
        rows.append(row)
        log(
            f"  {backend:8} export of {count:>5,} events of 1 MiB: peak RSS "
            f"{row['peak_rss_mb']:,} MB, {row['growth_mb']:,} MB over the RSS before exporting"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks run export``: the export's time and memory as data grows."""
    from .common import BACKENDS, ints, new_tmpdir, run_meta

    parser = argparse.ArgumentParser(prog="python -m benchmarks run export")
    parser.add_argument("what", choices=["export", "memory", "all"], nargs="?", default="all")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument(
        "--sizes", type=ints, default=[1_000, 10_000, 100_000, 300_000],
        help="export: sessions in the table (default 1000,10000,100000,300000)",
    )  # fmt: skip
    parser.add_argument(
        "--events", type=ints, default=[100, 1_000],
        help="memory: events of 1 MiB in one session (default 100,1000)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="export: runs per size (best)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]

    def log(text: str) -> None:
        print(text, flush=True)

    async def run() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        tmpdir = new_tmpdir()
        try:
            for backend in backends:
                if args.what in ("export", "all"):
                    rows += await run_export_scaling(backend, args.sizes, tmpdir, log, args.rounds)
                if args.what in ("memory", "all"):
                    rows += await run_export_memory(backend, args.events, tmpdir, log)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        return rows

    rows = asyncio.run(run())
    meta = run_meta(args, "python -m benchmarks " + " ".join(sys.argv[1:]))
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": rows}
    (args.out / "export.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
