"""Side by side: the four implementations (durable-sessions, Google ADK, durable-sessions
through its ADK adapter, the raw-driver floor), each in a fresh database on the same server,
interleaved workload by workload so that the machine's noise falls on all of them alike."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .common import Database, Measurement, measure, opened
from .workloads import Implementation

IMPL_ORDER = ("durable-sessions", "google-adk", "adk-adapter", "floor")
DB_LABELS = ("ours", "adk", "adapter", "floor")
"""Each implementation's database name label, in IMPL_ORDER."""
MAX_DELETE_SUPPLY = 4_000
"""Sessions created per worker, at most, before a delete run."""


def make_floor(backend: str) -> Implementation:
    """The driver floor of ``backend``: raw asyncpg, asyncmy or aiosqlite, hand-written
    statements."""
    if backend == "postgres":
        from .floor_pg import FloorPostgres

        return FloorPostgres()
    if backend == "mysql":
        from .floor_mysql import FloorMySQL

        return FloorMySQL()
    from .floor_sqlite import FloorSqlite

    return FloorSqlite()


def make_implementations(backend: str, pool_size: int) -> list[Implementation]:
    from .impl_adk import Adk
    from .impl_adk_adapter import AdkAdapter
    from .impl_ours import Ours

    impls = [Ours(), Adk(), AdkAdapter(), make_floor(backend)]
    assert tuple(impl.name for impl in impls) == IMPL_ORDER
    for impl in impls:
        impl.pool_size = pool_size
    return impls


async def run_side_by_side(
    backend: str,
    workloads: list[str],
    concurrencies: list[int],
    duration: float,
    tmpdir: Path,
    log: Callable[[str], None],
    pool_size: int = 16,
) -> list[dict[str, Any]]:
    """Measure every (workload, concurrency, implementation) once; return the rows."""
    impls = make_implementations(backend, pool_size)
    dbs = [Database(backend, label, tmpdir) for label in DB_LABELS]
    rows: list[dict[str, Any]] = []
    create_rate: dict[tuple[str, int], float] = {}
    async with opened(impls, dbs):
        turn = 0
        for workload in workloads:
            for concurrency in concurrencies:
                shift = turn % len(impls)
                order = impls[shift:] + impls[:shift]
                turn += 1
                rate: dict[str, float] = {}
                for impl in order:
                    m = await _one(impl, backend, workload, concurrency, duration, create_rate)
                    if workload == "create" and m.ops_per_sec:
                        create_rate[(impl.name, concurrency)] = m.ops_per_sec
                    rate[impl.name] = m.ops_per_sec
                    rows.append(asdict(m))
                    log(_line(m))
                log(_ratios(rate))
    return rows


async def _one(
    impl: Implementation,
    backend: str,
    workload: str,
    concurrency: int,
    duration: float,
    create_rate: dict[tuple[str, int], float],
) -> Measurement:
    m = Measurement(backend, impl.name, workload, concurrency)
    supply: int | None = None
    if workload == "delete":
        rate = create_rate.get((impl.name, concurrency), 300.0)
        # What the timed run may use, plus warm-up and the counting pass afterwards.
        supply = min(MAX_DELETE_SUPPLY, int(rate * duration * 1.5 / concurrency)) + 25
    try:
        ops = await impl.make_ops(workload, concurrency, supply or 0)
        try:
            result = await measure(
                ops, duration=duration, counters=impl.counters, switch=impl.counting, max_ops=supply
            )
        finally:
            await impl.release_counting()
    except Exception as exc:  # one implementation failing must not end the run
        m.errors = 1
        m.first_error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300]
        return m
    for key, value in result.items():
        if hasattr(m, key):
            setattr(m, key, value)
        else:
            m.extra[key] = value
    return m


def _ratios(rate: dict[str, float]) -> str:
    """The throughput ratios of one (workload, concurrency), for the console."""

    def ratio(a: str, b: str) -> str:
        x, y = rate.get(a, 0.0), rate.get(b, 0.0)
        return f"{x / y:.2f}x" if x and y else "-"

    return (
        f"    ours/ADK {ratio('durable-sessions', 'google-adk')}  "
        f"adapter/ADK {ratio('adk-adapter', 'google-adk')}  "
        f"ours/floor {ratio('durable-sessions', 'floor')}"
    )


def _line(m: Measurement) -> str:
    stmts = "-" if m.statements_per_op is None else f"{m.statements_per_op:.1f}"
    trips = "-" if m.round_trips_per_op is None else f"{m.round_trips_per_op:.1f}"
    text = (
        f"  {m.backend:8} {m.workload:13} c={m.concurrency:<3} {m.impl:17} "
        f"{m.ops_per_sec:9.1f} ops/s  p50 {m.p50_ms:7.2f} ms  p99 {m.p99_ms:7.2f} ms  "
        f"stmts {stmts:>4}  rt {trips:>5}  cpu {m.cpu_us_per_op:7.0f} us"
    )
    if m.errors:
        text += f"  ERRORS {m.errors}: {m.first_error[:120]}"
    return text
