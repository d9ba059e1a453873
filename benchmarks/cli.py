"""The side-by-side and scaling suites: durable-sessions beside Google ADK's
DatabaseSessionService, its ADK adapter and the raw driver; latency as the tables grow.

``python -m benchmarks run side-by-side`` and ``python -m benchmarks run scaling`` call
``main`` here; it writes ``results.json``, ``results.md`` and the charts into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any

from .common import BACKENDS, WORKLOADS, command_line, ints, new_tmpdir, run_meta
from .report import load_results, save_results

SQLITE_MAX_SESSIONS = 100_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks run side-by-side",
        description=(
            "durable-sessions side by side with Google ADK's DatabaseSessionService, "
            "durable-sessions through its ADK adapter and the "
            "raw driver floor, on SQLite and Postgres (or MySQL/MariaDB); scaling curves."
        ),
    )
    parser.add_argument(
        "--backend",
        choices=[*BACKENDS, "mysql", "all"],
        default="all",
        help="all: SQLite and Postgres; mysql: MariaDB or MySQL at "
        "$DURABLE_SESSIONS_BENCH_MYSQL_URL (default mysql+asyncmy://root@127.0.0.1:3306)",
    )
    parser.add_argument(
        "--duration", type=float, default=3.0, help="seconds per workload (default 3)"
    )
    parser.add_argument(
        "--concurrency", type=ints, default=[1, 16], help="comma-separated (default 1,16)"
    )
    parser.add_argument(
        "--only", default="", help=f"comma-separated workloads out of: {','.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--scaling", action="store_true", help="also measure latency as the tables grow"
    )
    parser.add_argument(
        "--scaling-only", action="store_true", help="measure scaling, skip the side by side"
    )
    parser.add_argument(
        "--sizes",
        type=ints,
        default=[1_000, 10_000, 100_000],
        help="sessions in the table for --scaling (default 1000,10000,100000; "
        "Postgres can go to 1000000, SQLite stops at 100000)",
    )
    parser.add_argument(
        "--event-sizes",
        type=ints,
        default=[100, 1_000, 10_000],
        help="events in one transcript for --scaling (default 100,1000,10000; up to 100000)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=16,
        help="connections each implementation keeps (SQLAlchemy pool_size, for ours and "
        "ADK alike, overflow 10 on top; the floor's queue); default 16, the highest "
        "concurrency, so that no implementation opens and closes connections mid-run",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="Postgres: durable-sessions (and its ADK adapter) in distributed mode, Citus's "
        "shape (writes as transactions of single-table statements), forced on the benchmark "
        "databases by their setting durable_sessions.distributed",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    args = parser.parse_args(argv)
    if args.backend == "mysql" and (args.scaling or args.scaling_only or args.distributed):
        parser.error("on mysql only the side by side runs (no --scaling, no --distributed)")
    args.backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    args.workloads = [w for w in args.only.split(",") if w] or list(WORKLOADS)
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    return args


def log(text: str) -> None:
    print(text, flush=True)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from .runner import run_side_by_side
    from .scaling import run_scaling

    results = load_results(args.out)
    tmpdir = new_tmpdir()
    command = command_line()
    try:
        for backend in args.backends:
            if not args.scaling_only:
                log(f"== side by side on {backend}: {', '.join(args.workloads)}")
                rows = await run_side_by_side(
                    backend,
                    args.workloads,
                    args.concurrency,
                    args.duration,
                    tmpdir,
                    log,
                    args.pool_size,
                )
                results["side_by_side"] = [
                    r
                    for r in results["side_by_side"]
                    if not (r["backend"] == backend and r["workload"] in args.workloads)
                ] + rows
                results["runs"][f"side_by_side/{backend}"] = run_meta(args, command)
            if args.scaling or args.scaling_only:
                sizes = args.sizes
                if backend == "sqlite":
                    sizes = [s for s in sizes if s <= SQLITE_MAX_SESSIONS] or [min(args.sizes)]
                log(f"== scaling on {backend}: sessions {sizes}, events {args.event_sizes}")
                rows = await run_scaling(
                    backend, sizes, args.event_sizes, args.duration, tmpdir, log
                )
                results["scaling"] = [r for r in results["scaling"] if r["backend"] != backend]
                results["scaling"] += rows
                results["runs"][f"scaling/{backend}"] = run_meta(args, command)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.distributed:
        import os

        from .common import DISTRIBUTED_ENV

        os.environ[DISTRIBUTED_ENV] = "1"
    results = asyncio.run(_run(args))
    save_results(results, args.out, charts=not args.no_charts)
    log(
        f"results written to {args.out}/results.json, results.md"
        + ("" if args.no_charts else ", *.png")
    )
    return 0
