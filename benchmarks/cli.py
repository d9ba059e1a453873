"""Command line: which backends, workloads, concurrency, sizes; where the results go."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .common import WORKLOADS, new_tmpdir
from .report import load_results, save_results

BACKENDS = ("sqlite", "postgres")
SQLITE_MAX_SESSIONS = 100_000


def _ints(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "durable-sessions side by side with Google ADK's DatabaseSessionService, "
            "durable-sessions through its ADK adapter and the "
            "raw driver floor, on SQLite and Postgres; scaling curves; a profile."
        ),
    )
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument(
        "--duration", type=float, default=3.0, help="seconds per workload (default 3)"
    )
    parser.add_argument(
        "--concurrency", type=_ints, default=[1, 16], help="comma-separated (default 1,16)"
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
        type=_ints,
        default=[1_000, 10_000, 100_000],
        help="sessions in the table for --scaling (default 1000,10000,100000; "
        "Postgres can go to 1000000, SQLite stops at 100000)",
    )
    parser.add_argument(
        "--event-sizes",
        type=_ints,
        default=[100, 1_000, 10_000],
        help="events in one transcript for --scaling (default 100,1000,10000; up to 100000)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the hot paths (ours and the floor) instead of benchmarking",
    )
    parser.add_argument("--profile-ops", type=int, default=2_000, help="ops per profiled path")
    parser.add_argument(
        "--pool-size",
        type=int,
        default=16,
        help="connections each implementation keeps (SQLAlchemy pool_size, for ours and "
        "ADK alike, overflow 10 on top; the floor's queue); default 16, the highest "
        "concurrency, so that no implementation opens and closes connections mid-run",
    )
    parser.add_argument(
        "--suite",
        choices=["side-by-side", "openai"],
        default="side-by-side",
        help="openai: the OpenAI Agents SDK session beside the SDK's SQLAlchemySession "
        "(benchmarks/openai_suite.py; --backend, --duration, --concurrency, --rounds apply)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="openai suite: measure each (workload, concurrency) this many times, the order "
        "alternating, and keep each implementation's best (noise only slows a run down), "
        "as benchmarks.adk_bench does; default 3",
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
    command = "python -m benchmarks " + " ".join(sys.argv[1:])
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
                results["runs"][f"side_by_side/{backend}"] = _run_meta(args, command)
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
                results["runs"][f"scaling/{backend}"] = _run_meta(args, command)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return results


def _run_meta(args: argparse.Namespace, command: str) -> dict[str, Any]:
    import platform

    import sqlalchemy

    versions: dict[str, str] = {
        "python": platform.python_version(),
        "sqlalchemy": sqlalchemy.__version__,
    }
    for name in ("asyncpg", "aiosqlite", "google.adk", "durable_sessions"):
        try:
            module = __import__(name, fromlist=["__version__"])
            versions[name] = str(getattr(module, "__version__", "?"))
        except ImportError:
            versions[name] = "not installed"
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command,
        "duration": args.duration,
        "concurrency": args.concurrency,
        "pool_size": args.pool_size,
        "machine": f"{platform.machine()}, {_cores()} cores, {platform.system()}",
        "versions": versions,
    }


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.distributed:
        import os

        from .common import DISTRIBUTED_ENV

        os.environ[DISTRIBUTED_ENV] = "1"
    if args.profile:
        from .profile import run_profile

        asyncio.run(run_profile(args.backends, args.profile_ops, args.out, log))
        return 0
    if args.suite == "openai":
        from .openai_suite import main_openai

        return main_openai(args, log)
    results = asyncio.run(_run(args))
    save_results(results, args.out, charts=not args.no_charts)
    log(
        f"results written to {args.out}/results.json, results.md"
        + ("" if args.no_charts else ", *.png")
    )
    return 0
