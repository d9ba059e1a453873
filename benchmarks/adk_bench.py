"""Google ADK's DatabaseSessionService against durable-sessions' ADK adapter, only.

    python -m benchmarks run adk [--backend all|sqlite|postgres|mysql] [--duration 2]
        [--concurrency 1,16] [--rounds 3] [--mysql-url URL] [--out benchmarks/results]

The two ADK implementations of ``nox -s bench`` (``impl_adk.Adk`` and
``impl_adk_adapter.AdkAdapter``: the same ADK calls, only the service differs), each on a
fresh database of the same server, in one process, workload by workload, the order
alternating. On a shared machine each (workload, concurrency) is measured ``--rounds``
times and each service keeps its best round: noise only ever slows a run down. Writes
``adk_adapter.json`` in the format of the side-by-side suite and ``adk_adapter.md``
(``benchmarks.adk_report`` renders it) to ``--out``.

``--backend all`` is SQLite and Postgres. ``--backend mysql`` runs on MariaDB (or MySQL):
ADK's service through a ``mysql+asyncmy://`` URL, the adapter on the same server, each in a
fresh database that the run creates and drops on the server of ``--mysql-url`` (default
``$DURABLE_SESSIONS_BENCH_MYSQL_URL``, else ``mysql+asyncmy://root@127.0.0.1:3306``); it
writes ``adk_adapter_mysql.json`` and ``adk_adapter_mysql.md`` instead.

For the calls in ``FLOORED`` a third implementation runs in the same rounds: the driver
floor of ``nox -s bench`` (``floor_sqlite.FloorSqlite``, ``floor_pg.FloorPostgres``,
``floor_mysql.FloorMySQL``: raw aiosqlite, asyncpg or asyncmy, one hand-written statement),
whose work for those calls is the least any durable service can do. Its throughput over
ADK's is about the best ratio a service could show for them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .common import (
    BACKENDS,
    DEFAULT_MYSQL_ADMIN_URL,
    MYSQL,
    MYSQL_URL_ENV,
    WORKLOADS,
    Database,
    Measurement,
    command_line,
    ints,
    keep_best,
    mysql_admin_url,
    new_tmpdir,
    raw_mysql_connect,
    run_meta,
)
from .report import empty_results
from .runner import MAX_DELETE_SUPPLY, _line, _one, make_floor
from .workloads import Implementation

FLOORED = ("delete",)
"""ADK calls whose whole work the driver floor does too: ``delete_session`` deletes one
session row (its events by ``ON DELETE CASCADE``), one statement committed on its own."""


def _whole_round(impl: Implementation) -> AbstractContextManager[object]:
    return contextlib.nullcontext()


async def best_of_rounds(
    impls: list[Implementation],
    labels: list[str],
    backend: str,
    args: argparse.Namespace,
    summary: Callable[[dict[str, Measurement]], str],
    *,
    timed: Callable[[Implementation, str], bool] = lambda impl, workload: True,
    around: Callable[[Implementation], AbstractContextManager[object]] = _whole_round,
    create_rate: dict[tuple[str, int], float] | None = None,
) -> list[dict[str, Any]]:
    """Measure implementations side by side: each on a fresh database of ``backend`` (named
    by its label), every workload of ``args.workloads`` at every ``args.concurrency``
    ``args.rounds`` times, the order alternating from round to round, each keeping its best
    round; print each measurement and, per (workload, concurrency), ``summary`` of the best.

    Args:
        timed: Whether an implementation runs a workload (the others skip it).
        around: What each of an implementation's measurements runs inside.
        create_rate: Delete supplies of implementations that time no create, by (name,
            concurrency).
    """
    tmpdir = new_tmpdir()
    dbs = [Database(backend, label, tmpdir) for label in labels]
    opened: list[Implementation] = []
    rows: list[dict[str, Any]] = []
    create_rate = dict(create_rate or {})
    try:
        for impl, db in zip(impls, dbs, strict=True):
            impl.pool_size = args.pool_size
            await db.create()
            await impl.open(db.url)
            opened.append(impl)
        for workload in args.workloads:
            for concurrency in args.concurrency:
                best: dict[str, Measurement] = {}
                chosen = [i for i in impls if timed(i, workload)]
                for round_ in range(args.rounds):
                    for impl in chosen if round_ % 2 == 0 else chosen[::-1]:
                        with around(impl):
                            m = await _one(
                                impl, backend, workload, concurrency, args.duration, create_rate
                            )
                        if workload == "create" and m.ops_per_sec:
                            create_rate[(impl.name, concurrency)] = m.ops_per_sec
                        print(_line(m), flush=True)
                        keep_best(best, m)
                rows += [asdict(m) for m in best.values()]
                print(f"    best of {args.rounds}: {summary(best)}", flush=True)
    finally:
        for impl in opened:
            await impl.close()
        for db in dbs:
            await db.drop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    return rows


def _adapter_over_adk(best: dict[str, Measurement]) -> str:
    adk, ours = best["google-adk"].ops_per_sec, best["adk-adapter"].ops_per_sec
    floor = best["floor"].ops_per_sec if "floor" in best else 0.0
    return f"adapter/ADK {ours / adk if adk else 0:.2f}x" + (
        f"  floor/ADK {floor / adk if adk else 0:.2f}x" if floor else ""
    )


async def run(backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from .impl_adk import Adk
    from .impl_adk_adapter import AdkAdapter

    impls: list[Implementation] = [Adk(), AdkAdapter()]
    labels = ["adk", "adapter"]
    if any(w in FLOORED for w in args.workloads):
        impls.append(make_floor(backend))
        labels.append("floor")
    for impl in impls:
        impl.pool_lifo = args.pool_lifo
    return await best_of_rounds(
        impls,
        labels,
        backend,
        args,
        _adapter_over_adk,
        timed=lambda impl, workload: impl.name != "floor" or workload in FLOORED,
        # The floor times no create: its delete supply is the most a run may take.
        create_rate={("floor", c): float(MAX_DELETE_SUPPLY) for c in args.concurrency},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks run adk")
    parser.add_argument(
        "--backend",
        choices=[*BACKENDS, MYSQL, "all"],
        default="all",
        help="all: sqlite and postgres, written to adk_adapter.*; mysql: MariaDB or MySQL, "
        "written to adk_adapter_mysql.*",
    )
    parser.add_argument(
        "--mysql-url",
        default=None,
        help="the MySQL server the mysql backend makes its databases on, a URL without a "
        f"database (default ${MYSQL_URL_ENV}, else {DEFAULT_MYSQL_ADMIN_URL})",
    )
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=ints, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3, help="measurements kept best of")
    parser.add_argument("--only", default="", help="comma-separated workloads")
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument(
        "--pool-lifo",
        action="store_true",
        help="both services' pools lend the connection returned last (pool_use_lifo=True)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.only.split(",") if w] or list(WORKLOADS)
    args.profile = False
    if args.mysql_url:
        os.environ[MYSQL_URL_ENV] = args.mysql_url  # read by common.Database
    results = empty_results()
    command = command_line()
    for backend in BACKENDS if args.backend == "all" else [args.backend]:
        print(f"== {backend}: {', '.join(args.workloads)}", flush=True)
        results["side_by_side"] += asyncio.run(run(backend, args))
        results["runs"][f"side_by_side/{backend}"] = meta = run_meta(args, command)
        if backend == MYSQL:
            meta["versions"]["server"] = asyncio.run(server_version())
    args.out.mkdir(parents=True, exist_ok=True)
    from .adk_report import render

    stem = results_stem(args.backend)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(render(results), encoding="utf-8")
    print(f"written to {args.out / stem}.json and {stem}.md")
    return 0


async def server_version() -> str:
    """The MySQL server's version (``VERSION()``: MariaDB's names MariaDB)."""
    con = await raw_mysql_connect(mysql_admin_url(), autocommit=True)
    try:
        async with con.cursor() as cursor:
            await cursor.execute("SELECT VERSION()")
            return str((await cursor.fetchone())[0])
    finally:
        con.close()


def results_stem(backend: str) -> str:
    """The name of a run's results files: MySQL's are apart from SQLite's and Postgres's,
    so that a run of either never replaces the other's."""
    return "adk_adapter_mysql" if backend == MYSQL else "adk_adapter"


if __name__ == "__main__":
    raise SystemExit(main())
