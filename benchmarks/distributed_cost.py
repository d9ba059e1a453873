"""What distributed mode costs on one Postgres: the default mode and distributed mode side by
side, in one process, interleaved workload by workload.

    python -m benchmarks run distributed [--concurrency 1,16] [--duration 3] [--rounds 2]

Two fresh databases on the server of ``DURABLE_SESSIONS_BENCH_POSTGRES_URL`` (default
``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``), each with durable-sessions
through its public API (the same code as ``python -m benchmarks``' durable-sessions
column): one on ``SQLStore(engine)``, the default mode, one on
``SQLStore(engine, distributed=True)``. Each round runs every workload at every
concurrency in both modes, one after the other, the first of the two alternating from one
workload to the next, so that the machine's noise falls on both alike. Printed: every
measurement, then distributed/default throughput per round and of the best of the rounds.
Round trips per operation (asyncpg calls reaching the server, BEGIN and COMMIT included)
are counted after each timed run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Manager, SessionService, SQLStore

from .common import (
    APP,
    ORG,
    WORKLOADS,
    Counters,
    Database,
    command_line,
    measure,
    new_tmpdir,
    opened,
    run_meta,
)
from .impl_ours import Ours
from .runner import MAX_DELETE_SUPPLY

MODES = ("default", "distributed")


class Mode(Ours):
    """durable-sessions on one engine, in the default mode or in distributed mode."""

    def __init__(self, distributed: bool) -> None:
        super().__init__()
        self.name = "distributed" if distributed else "default"
        self.distributed = distributed

    async def open(self, url: str) -> None:
        engine = create_async_engine(url, pool_size=self.pool_size)
        self.engines.append(engine)
        store = SQLStore(engine, distributed=self.distributed)
        await store.migrate()
        self.manager = Manager(store, app_name=APP)
        self.service = SessionService(store, org_id=ORG)

    def counting(self, on: bool) -> None:
        del on  # no statement-counting twin: round trips are counted on this engine

    async def release_counting(self) -> None:
        return


async def run(
    workloads: list[str], concurrencies: list[int], duration: float, rounds: int
) -> list[dict[str, Any]]:
    """Every (round, workload, concurrency, mode) once; return the rows."""
    tmpdir = new_tmpdir()
    impls = [Mode(distributed=False), Mode(distributed=True)]
    dbs = [Database("postgres", name, tmpdir) for name in MODES]
    rows: list[dict[str, Any]] = []
    create_rate: dict[tuple[str, int], float] = {}
    async with opened(impls, dbs):
        turn = 0
        for r in range(1, rounds + 1):
            for workload in workloads:
                for c in concurrencies:
                    order = impls if turn % 2 == 0 else impls[::-1]
                    turn += 1
                    for impl in order:
                        supply = None
                        if workload == "delete":
                            rate = create_rate.get((impl.name, c), 300.0)
                            supply = min(MAX_DELETE_SUPPLY, int(rate * duration * 1.5 / c)) + 25
                        ops = await impl.make_ops(workload, c, supply or 0)
                        found = await measure(
                            ops, duration=duration, counters=Counters(), max_ops=supply
                        )
                        if workload == "create":
                            create_rate[(impl.name, c)] = found["ops_per_sec"]
                        row = {"round": r, "workload": workload, "c": c, "mode": impl.name}
                        row.update(found)
                        rows.append(row)
                        print(_line(row), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    trips = row["round_trips_per_op"]
    text = (
        f"round {row['round']} {row['workload']:13} c={row['c']:<3} {row['mode']:11} "
        f"{row['ops_per_sec']:8.1f} ops/s  p50 {row['p50_ms']:7.2f} ms  "
        f"rt/op {'-' if trips is None else f'{trips:.1f}':>4}"
    )
    if row["errors"]:
        text += f"  ERRORS {row['errors']}: {row['first_error'][:120]}"
    return text


def summary(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: distributed/default per round and of each mode's best round."""
    rounds = sorted({row["round"] for row in rows})
    rate = {(x["round"], x["workload"], x["c"], x["mode"]): x["ops_per_sec"] for x in rows}
    trips = {(x["workload"], x["c"], x["mode"]): x["round_trips_per_op"] for x in rows}
    head = " | ".join(f"round {r}" for r in rounds)
    lines = [
        f"| workload | c | default ops/s (best) | distributed ops/s (best) | {head} "
        "| best/best | round trips/op default / distributed |",
        "|---|---:|---:|---:|" + "---:|" * len(rounds) + "---:|---:|",
    ]
    keys = sorted(
        {(x["workload"], x["c"]) for x in rows}, key=lambda k: (k[1], WORKLOADS.index(k[0]))
    )
    for workload, c in keys:
        best = {m: max(rate.get((r, workload, c, m), 0.0) for r in rounds) for m in MODES}
        per_round = []
        for r in rounds:
            a, b = rate.get((r, workload, c, "default")), rate.get((r, workload, c, "distributed"))
            per_round.append(f"{b / a:.2f}x" if a and b else "-")
        ratio = f"{best['distributed'] / best['default']:.2f}x" if best["default"] else "-"
        rt = " / ".join(
            "-" if trips.get((workload, c, m)) is None else f"{trips[(workload, c, m)]:.1f}"
            for m in MODES
        )
        lines.append(
            f"| {workload} | {c} | {best['default']:.0f} | {best['distributed']:.0f} | "
            + " | ".join(per_round)
            + f" | {ratio} | {rt} |"
        )
    return "\n".join(lines)


LINE = re.compile(r"^round (\d+) (\w+)\s+c=(\d+)\s+(default|distributed)\s+([\d.]+) ops/s")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks run distributed``: measure, print and write the ratios."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks run distributed")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help=f"out of: {','.join(WORKLOADS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    workloads = [w for w in args.only.split(",") if w] or list(WORKLOADS)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)
    rows = asyncio.run(run(workloads, concurrencies, args.duration, args.rounds))
    meta = run_meta(args, command_line())
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": rows}
    (args.out / "distributed.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    text = summary(rows)
    (args.out / "distributed.md").write_text(f"# Distributed mode on one Postgres\n\n{text}\n")
    print()
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
