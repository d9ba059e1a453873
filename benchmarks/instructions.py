"""Client instructions per operation, counted by callgrind: a measure load cannot move.

Throughput on a shared two-core machine moves by 20-30% between runs of the same code, so a
"within 5%" claim about the hot paths cannot rest on it. Callgrind counts the instructions the
client process executes (Python, SQLAlchemy, the driver, and on SQLite the SQLite engine itself);
waiting on a socket costs none, so Postgres' own work is not counted. The same code, inputs and
environment give the same count to a fraction of a percent whatever else the machine does.

Each tree is run in its own process under ``valgrind --tool=callgrind``. The child prepares each
workload through the same primitives as ``nox -s bench`` (``benchmarks/impl_ours.py``), warms
it, then runs it ``--ops`` times between two calls of ``os.getpgrp``; callgrind dumps its counters
at every such call (``--dump-before=getpgrp``), so one dump holds exactly the measured loop.

    python -m benchmarks.instructions --backend postgres --tree before=/work/wt-before/src \\
        --tree after=src --out benchmarks/results/instructions.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = ("create", "get", "get_recent20", "save", "append_event", "list50", "fork", "delete")
WARMUP = 30


def _mark() -> None:
    os.getpgrp()  # callgrind dumps its counters here (--dump-before=getpgrp)


async def _child(backend: str, ops: int, workloads: list[str], wall: bool = False) -> None:
    from .common import Database, new_tmpdir
    from .impl_ours import Ours

    db = Database(backend, "instr", new_tmpdir())
    await db.create()
    impl = Ours()
    impl.pool_size = 1
    try:
        await impl.open(db.url)
        for workload in workloads:
            (op,) = await impl.make_ops(workload, 1, supply=ops + WARMUP)
            for _ in range(WARMUP):
                await op()
            _mark()
            start = time.perf_counter()
            for _ in range(ops):
                await op()
            elapsed = time.perf_counter() - start
            _mark()
            if wall:
                print(json.dumps({"workload": workload, "us_per_op": elapsed / ops * 1e6}))
            print(f"measured {workload}", file=sys.stderr)
    finally:
        await impl.close()
        await db.drop()


_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def _count(tree: str, backend: str, ops: int, workloads: list[str]) -> dict[str, float]:
    """Run the child under callgrind on ``tree`` (a ``src`` folder); instructions per op."""
    with tempfile.TemporaryDirectory(prefix="ds-instr-") as out:
        env = {**os.environ, "PYTHONPATH": f"{Path(tree).resolve()}{os.pathsep}{Path.cwd()}"}
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getpgrp",
            f"--callgrind-out-file={out}/cg.out",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            "--backend",
            backend,
            "--ops",
            str(ops),
            "--workloads",
            ",".join(workloads),
        ]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        dumps = sorted(Path(out).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1] or 0))
        counts = []
        for dump in dumps:
            found = _TOTALS.search(dump.read_text(errors="replace"))
            counts.append(int(found.group(1)) if found else 0)
    # Dump 1 ends at the first mark (start-up and setup); then loop, setup, loop, ...
    loops = counts[1::2][: len(workloads)]
    if len(loops) != len(workloads):
        raise RuntimeError(f"expected {len(workloads)} measured dumps, got {counts}")
    return {w: n / ops for w, n in zip(workloads, loops, strict=True)}


def _wall(tree: str, backend: str, ops: int, workloads: list[str]) -> dict[str, float]:
    """Run the child (no valgrind) on ``tree``; wall-clock microseconds per op, c=1."""
    env = {**os.environ, "PYTHONPATH": f"{Path(tree).resolve()}{os.pathsep}{Path.cwd()}"}
    cmd = [sys.executable, "-m", "benchmarks.instructions", "--child", "--wall", "1"]
    cmd += ["--backend", backend, "--ops", str(ops), "--workloads", ",".join(workloads)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {f["workload"]: f["us_per_op"] for f in found}


def _wall_table(args: argparse.Namespace, trees: list[list[str]], workloads: list[str]) -> str:
    """Alternate the trees' processes for ``--wall`` rounds; median wall time per op."""
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for _ in range(args.wall):
        for label, path in trees:
            runs[label].append(_wall(path, args.backend, args.ops, workloads))
    labels = [label for label, _ in trees]
    lines = [
        f"## {args.backend}: wall-clock us per op, one task (median of {args.wall} alternated "
        f"processes, {args.ops} ops each)",
        "",
        f"`python -m benchmarks.instructions --backend {args.backend} --wall {args.wall} "
        + " ".join(f"--tree {label}={path}" for label, path in trees)
        + "`",
        "",
        "| workload | "
        + " | ".join(f"{label} us/op (min-max)" for label in labels)
        + " |"
        + (f" {labels[-1]}/{labels[0]} |" if len(labels) > 1 else ""),
        "|---|" + "---:|" * (len(labels) + (1 if len(labels) > 1 else 0)),
    ]
    for w in workloads:
        med = {label: statistics.median(r[w] for r in runs[label]) for label in labels}
        cells = " | ".join(
            f"{med[label]:,.0f} ({min(r[w] for r in runs[label]):,.0f}-"
            f"{max(r[w] for r in runs[label]):,.0f})"
            for label in labels
        )
        ratio = f" {med[labels[-1]] / med[labels[0]]:.3f} |" if len(labels) > 1 else ""
        lines.append(f"| {w} | {cells} |{ratio}")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Count instructions per op for each tree and print (or write) the comparison table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a src folder")
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", help="append the table to this Markdown file")
    parser.add_argument(
        "--wall",
        type=int,
        default=0,
        help="instead of counting instructions, time ROUNDS alternated processes per tree "
        "(wall clock: the server's work included, the machine's load too)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    if args.child:
        asyncio.run(_child(args.backend, args.ops, workloads, bool(args.wall)))
        return
    trees = [t.split("=", 1) for t in args.tree] or [["here", "src"]]
    if args.wall:
        text = _wall_table(args, trees, workloads)
        print(text)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write("\n" + text)
        return
    results = {label: _count(path, args.backend, args.ops, workloads) for label, path in trees}
    labels = [label for label, _ in trees]
    head = " | ".join(f"{label} instr/op" for label in labels)
    lines = [
        f"## {args.backend}: client instructions per op ({args.ops} ops after {WARMUP} warm-up)",
        "",
        f"`python -m benchmarks.instructions --backend {args.backend} "
        + " ".join(f"--tree {label}={path}" for label, path in trees)
        + "`",
        "",
        f"| workload | {head} |" + (f" {labels[-1]}/{labels[0]} |" if len(labels) > 1 else ""),
        "|---|" + "---:|" * (len(labels) + (1 if len(labels) > 1 else 0)),
    ]
    for w in workloads:
        cells = " | ".join(f"{results[label][w]:,.0f}" for label in labels)
        ratio = (
            f" {results[labels[-1]][w] / results[labels[0]][w]:.3f} |" if len(labels) > 1 else ""
        )
        lines.append(f"| {w} | {cells} |{ratio}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
