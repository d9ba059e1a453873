"""Shared plumbing: fresh databases, statement and round-trip counters, the timing loop."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

ORG = "bench"
APP = "bench-app"
LIST_USER = "lister"
DEFAULT_PG_ADMIN_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
DEFAULT_MYSQL_ADMIN_URL = "mysql+asyncmy://root@127.0.0.1:3306"
MYSQL_URL_ENV = "DURABLE_SESSIONS_BENCH_MYSQL_URL"
"""The MySQL (MariaDB) server the suites that take ``--backend mysql`` create their
databases on: a URL without a database, of a user who may create and drop them."""
WORKLOADS = (
    "create",
    "get",
    "get_recent20",
    "save",
    "append_event",
    "list50",
    "fork",
    "delete",
)
TX_WORDS = ("BEGIN", "COMMIT", "ROLLBACK", "END", "START")
COUNT_WARMUP = 3
"""Untimed ops per worker on the counting instance before statements are counted."""

Op = Callable[[], Awaitable[Any]]
"""One measured operation of one worker."""


DISTRIBUTED_ENV = "DURABLE_SESSIONS_BENCH_DISTRIBUTED"
"""Set (by ``--distributed``): the Postgres databases run every store in distributed mode."""


def pg_admin_url() -> str:
    return os.environ.get("DURABLE_SESSIONS_BENCH_POSTGRES_URL", DEFAULT_PG_ADMIN_URL)


def mysql_admin_url() -> str:
    return os.environ.get(MYSQL_URL_ENV, DEFAULT_MYSQL_ADMIN_URL)


async def raw_mysql_connect(sqlalchemy_url: str, *, autocommit: bool) -> Any:
    """A plain asyncmy connection to the server (and database) of a ``mysql+asyncmy://`` URL."""
    import asyncmy  # type: ignore[import-untyped]

    url = make_url(sqlalchemy_url)
    return await asyncmy.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.database,
        autocommit=autocommit,
    )


def raw_pg_dsn(sqlalchemy_url: str) -> str:
    """A libpq-style DSN for asyncpg from a ``postgresql+asyncpg://`` URL."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


# -- fresh databases ----------------------------------------------------------------------


class Database:
    """A fresh database for one implementation: a new Postgres or MySQL database, or a
    SQLite file."""

    def __init__(self, backend: str, label: str, tmpdir: Path) -> None:
        self.backend = backend
        self.label = label
        self.name = f"ds_bench_{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.path = tmpdir / f"{self.name}.db"

    @property
    def url(self) -> str:
        """The SQLAlchemy async URL of the database."""
        if self.backend == "sqlite":
            return f"sqlite+aiosqlite:///{self.path}"
        admin = mysql_admin_url() if self.backend == "mysql" else pg_admin_url()
        url = make_url(admin).set(database=self.name)
        return url.render_as_string(hide_password=False)

    async def create(self) -> None:
        if self.backend == "sqlite":
            import sqlite3

            # WAL is a property of the file: every implementation's connections get it.
            con = sqlite3.connect(self.path)
            con.execute("PRAGMA journal_mode = WAL")
            con.close()
            return
        if self.backend == "mysql":
            # utf8mb4, as a MySQL database for text in any language must be (durable-sessions'
            # tables name theirs; ADK's take the database's).
            await _mysql_admin(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
            return
        import asyncpg

        con = await asyncpg.connect(raw_pg_dsn(pg_admin_url()))
        try:
            await con.execute(f'CREATE DATABASE "{self.name}"')
            if os.environ.get(DISTRIBUTED_ENV):  # every SQLStore on it: distributed mode
                await con.execute(
                    f'ALTER DATABASE "{self.name}" SET durable_sessions.distributed = on'
                )
        finally:
            await con.close()

    async def drop(self) -> None:
        if self.backend == "sqlite":
            _remove_sqlite_files(self.path)
            return
        if self.backend == "mysql":
            await _mysql_admin(f"DROP DATABASE IF EXISTS `{self.name}`")
            return
        import asyncpg

        con = await asyncpg.connect(raw_pg_dsn(pg_admin_url()))
        try:
            await con.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await con.close()


async def _mysql_admin(sql: str) -> None:
    con = await raw_mysql_connect(mysql_admin_url(), autocommit=True)
    try:
        async with con.cursor() as cursor:
            await cursor.execute(sql)
    finally:
        con.close()


async def migrate_schema(url: str) -> None:
    """Create durable-sessions' schema in a database, through the library's migrations."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from durable_sessions import SQLStore

    engine = create_async_engine(url)
    try:
        await SQLStore(engine).migrate()
    finally:
        await engine.dispose()


def _remove_sqlite_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def new_tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ds-bench-"))


# -- counters -----------------------------------------------------------------------------


@dataclass
class Counters:
    """SQL statements seen by SQLAlchemy (or counted by hand) and driver calls.

    ``round_trips`` is what the driver did: on Postgres every asyncpg call that reaches the
    server (statements, BEGIN/COMMIT/ROLLBACK, pool pings); on MySQL every command asyncmy
    sends (statements, BEGIN/COMMIT/ROLLBACK, SET, pings); on SQLite every hop to
    aiosqlite's worker thread (statements, fetches, commits, cursor closes).
    """

    statements: int = 0
    round_trips: int = 0

    def reset(self) -> None:
        self.statements = 0
        self.round_trips = 0


DRIVER = Counters()
"""Driver calls of whatever implementation runs now (one runs at a time)."""

_ORIGINALS: list[tuple[Any, str, Any]] = []


def _count(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        DRIVER.round_trips += 1
        return await fn(*args, **kwargs)

    return wrapper


def driver_counting(on: bool) -> None:
    """Count asyncpg server calls, asyncmy commands and aiosqlite thread hops (on), or stop
    counting (off).

    The wrappers are installed only while counting, so timed runs pay nothing for them.
    """
    if not on:
        for owner, name, original in _ORIGINALS:
            setattr(owner, name, original)
        _ORIGINALS.clear()
        return
    if _ORIGINALS:
        return
    targets: list[tuple[Any, tuple[str, ...]]] = []
    try:
        import asyncpg.connection
        import asyncpg.prepared_stmt

        names = ("execute", "executemany", "fetch", "fetchrow", "fetchval")
        targets.append((asyncpg.connection.Connection, names))
        names = ("fetch", "fetchrow", "fetchval", "executemany")
        targets.append((asyncpg.prepared_stmt.PreparedStatement, names))
    except ImportError:
        pass
    try:
        import asyncmy.connection  # type: ignore[import-untyped]

        # Every command asyncmy sends (queries, BEGIN/COMMIT/ROLLBACK, pings) goes through it.
        targets.append((asyncmy.connection.Connection, ("_execute_command",)))
    except ImportError:
        pass
    try:
        import aiosqlite.core

        targets.append((aiosqlite.core.Connection, ("_execute",)))
    except ImportError:
        pass
    for owner, names in targets:
        for name in names:
            original = owner.__dict__[name]
            _ORIGINALS.append((owner, name, original))
            setattr(owner, name, _count(original))


def count_statements(engine: AsyncEngine, counters: Counters) -> None:
    """Count the statements an engine sends (``before_cursor_execute``), BEGIN/COMMIT aside."""

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(TX_WORDS):
            counters.statements += 1

    event.listen(engine.sync_engine, "before_cursor_execute", before)


# -- the timing loop ----------------------------------------------------------------------


@dataclass
class Measurement:
    """One implementation running one workload at one concurrency."""

    backend: str
    impl: str
    workload: str
    concurrency: int
    ops: int = 0
    errors: int = 0
    seconds: float = 0.0
    ops_per_sec: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    statements_per_op: float | None = None
    round_trips_per_op: float | None = None
    cpu_us_per_op: float = 0.0
    first_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def keep_best(best: dict[str, Measurement], m: Measurement) -> None:
    """Keep ``m`` in ``best`` (by implementation) if it is that implementation's first
    round or a faster one without errors: on a shared machine noise only slows a run down."""
    kept = best.get(m.impl)
    if kept is None or (m.ops_per_sec > kept.ops_per_sec and not m.errors):
        best[m.impl] = m


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def measure(
    ops: list[Op],
    *,
    duration: float,
    counters: Counters | None = None,
    switch: Callable[[bool], None] | None = None,
    max_ops: int | None = None,
    warmup: int = 5,
    count_ops: int = 5,
) -> dict[str, Any]:
    """Run each worker's op in a loop for ``duration`` seconds, all workers at once.

    Each worker first runs ``warmup`` untimed ops (compiled caches, prepared statements,
    pool connections). ``max_ops`` caps the ops of each worker (a finite supply, as for
    delete). Nothing counts during the timed run: round trips are counted afterwards over
    ``count_ops`` more ops per worker on the same instance, then statements over as many
    more with ``switch(True)`` routing the ops to an instance whose engine has the
    statement listener (a listener alone makes SQLAlchemy, and durable-sessions' runner,
    take another path, so round trips are not counted there). Returns ops, errors,
    seconds, latencies, CPU and per-op counts.
    """
    errors: list[BaseException] = []
    remaining = [max_ops if max_ops is not None else -1 for _ in ops]
    # A finite supply keeps enough back for the counting pass after the timed run.
    reserve = COUNT_WARMUP + 2 * count_ops if counters is not None else 0

    async def warm(index: int, op: Op) -> None:
        for _ in range(warmup):
            if remaining[index] == 0:
                return
            if remaining[index] > 0:
                remaining[index] -= 1
            try:
                await op()
            except Exception as exc:
                errors.append(exc)

    await asyncio.gather(*(warm(i, op) for i, op in enumerate(ops)))
    errors.clear()
    latencies: list[list[float]] = [[] for _ in ops]
    start = time.perf_counter()
    cpu_start = time.process_time()
    deadline = start + duration

    async def worker(index: int, op: Op) -> None:
        lat = latencies[index]
        clock = time.perf_counter
        while clock() < deadline and (remaining[index] < 0 or remaining[index] > reserve):
            if remaining[index] > 0:
                remaining[index] -= 1
            t0 = clock()
            try:
                await op()
            except Exception as exc:
                errors.append(exc)
                await asyncio.sleep(0.001)
                continue
            lat.append(clock() - t0)

    await asyncio.gather(*(worker(i, op) for i, op in enumerate(ops)))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    flat = sorted(x for lat in latencies for x in lat)
    n = len(flat)
    counted = trips_counted = trips = 0
    if counters is not None and count_ops:
        # Round trips on the timed instance itself: a listener would change the path the
        # runner takes (SQLAlchemy's execution layer, with BEGIN and COMMIT of its own).
        driver_counting(True)
        DRIVER.reset()
        try:
            done = await asyncio.gather(
                *(_some(i, op, count_ops, remaining, errors) for i, op in enumerate(ops))
            )
            trips_counted, trips = sum(done), DRIVER.round_trips
        finally:
            driver_counting(False)
        # Statements on the instance whose engine has the statement listener.
        if switch is not None:
            switch(True)
        try:
            # Warm the counting instance (its own pool, caches and prepared statements).
            await asyncio.gather(
                *(_some(i, op, COUNT_WARMUP, remaining) for i, op in enumerate(ops))
            )
            counters.reset()
            done = await asyncio.gather(
                *(_some(i, op, count_ops, remaining, errors) for i, op in enumerate(ops))
            )
            counted = sum(done)
        finally:
            if switch is not None:
                switch(False)
    return {
        "ops": n,
        "errors": len(errors),
        "first_error": repr(errors[0])[:300] if errors else "",
        "seconds": seconds,
        "ops_per_sec": n / seconds if seconds else 0.0,
        "p50_ms": percentile(flat, 0.50) * 1000,
        "p99_ms": percentile(flat, 0.99) * 1000,
        "mean_ms": (statistics.fmean(flat) * 1000) if flat else 0.0,
        "statements_per_op": (counters.statements / counted) if counters and counted else None,
        "round_trips_per_op": (trips / trips_counted) if trips_counted else None,
        "cpu_us_per_op": (cpu / n * 1e6) if n else 0.0,
    }


async def _some(
    index: int,
    op: Op,
    n: int,
    remaining: list[int],
    errors: list[BaseException] | None = None,
) -> int:
    """Run up to ``n`` ops of one worker, within its supply; return how many succeeded."""
    done = 0
    for _ in range(n):
        if remaining[index] == 0:
            break
        if remaining[index] > 0:
            remaining[index] -= 1
        try:
            await op()
            done += 1
        except Exception as exc:
            if errors is not None:
                errors.append(exc)
    return done


async def run_parallel(
    count: int, concurrency: int, make: Callable[[int], Awaitable[Any]]
) -> list[Any]:
    """Run ``make(i)`` for i in range(count), at most ``concurrency`` at a time (setup only)."""
    results: list[Any] = [None] * count
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            i = next_index
            next_index += 1
            results[i] = await make(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count) or 1)))
    return results


class _Opens(Protocol):
    async def open(self, url: str) -> None: ...

    async def close(self) -> None: ...


@asynccontextmanager
async def opened(impls: Sequence[_Opens], dbs: Sequence[Database]) -> AsyncIterator[None]:
    """Create each database and open its implementation on it; at the end, close every
    implementation opened and drop every database."""
    done: list[_Opens] = []
    try:
        for impl, db in zip(impls, dbs, strict=True):
            await db.create()
            await impl.open(db.url)
            done.append(impl)
        yield
    finally:
        for impl in done:
            await impl.close()
        for db in dbs:
            await db.drop()


BACKENDS = ("sqlite", "postgres")
"""The backends of ``--backend all``."""
MYSQL = "mysql"
"""MariaDB (or MySQL) through asyncmy: a backend of its own choosing (``--backend mysql``)."""


def ints(text: str) -> list[int]:
    """Parse a comma-separated list of integers (``1_000,10_000``)."""
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def command_line() -> str:
    """The command that ran this process, as typed: ``python -m benchmarks run NAME ...``
    through the suite runner, ``python -m benchmarks.MODULE ...`` for a module run alone."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name if spec is not None else "benchmarks"
    if name.endswith(".__main__"):
        name = name[: -len(".__main__")]
    return " ".join(["python -m", name, *sys.argv[1:]])


def write_results(out: Path, name: str, title: str, lines: Sequence[str], data: Any) -> None:
    """Write a suite's results: ``NAME.json`` (``data``) and ``NAME.md`` (``title``, then
    ``lines`` as a block), in ``out``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    body = "\n".join(lines)
    (out / f"{name}.md").write_text(f"# {title}\n\n```\n{body}\n```\n")


def run_meta(args: Any, command: str) -> dict[str, Any]:
    import platform

    import sqlalchemy

    versions: dict[str, str] = {
        "python": platform.python_version(),
        "sqlalchemy": sqlalchemy.__version__,
    }
    for name in ("asyncpg", "aiosqlite", "asyncmy", "google.adk", "durable_sessions"):
        try:
            module = __import__(name, fromlist=["__version__"])
            found = getattr(module, "__version__", None)
            if found is None:  # asyncmy keeps it in a submodule: ask its distribution
                from importlib.metadata import version

                found = version(name.split(".")[0])
            versions[name] = str(found)
        except ImportError:
            versions[name] = "not installed"
    """When, how and on what a run was made: kept beside its results."""
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command,
        "duration": getattr(args, "duration", None),
        "concurrency": getattr(args, "concurrency", None),
        "pool_size": getattr(args, "pool_size", None),
        "machine": f"{platform.machine()}, {cores()} cores, {platform.system()}",
        "versions": versions,
    }


def cores() -> int:
    """The machine's CPU count."""
    import os

    return os.cpu_count() or 0
