"""``python -m benchmarks run openai``: durable-sessions' OpenAI Agents SDK session beside
the SDK's own ``SQLAlchemySession``, on the same server, in the same run.

Each implementation gets a fresh database (a new Postgres database, or SQLite file) and is
driven through the SDK's ``Session`` protocol only. Workloads, interleaved implementation by
implementation so that the machine's noise falls on both alike:

- ``add_items``: a 2-item turn (the user's message and the assistant's reply), each worker
  on its own conversation;
- ``get_items``: the whole of a 1,000-item history;
- ``get_items20``: ``get_items(limit=20)`` of that history;
- ``pop_item``: the newest item of a worker's own long conversation, removed and returned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .common import Database, Measurement, Op, keep_best, measure, migrate_schema, opened

__all__ = ["OPENAI_WORKLOADS", "main", "main_openai", "run_openai_suite"]

OPENAI_WORKLOADS = ("add_items", "get_items", "get_items20", "pop_item")
IMPLS = ("durable-sessions", "sdk-sqlalchemy")
HISTORY = 1_000
"""Items of the conversation that get_items and get_items20 read."""
FILL_BATCH = 500
USER = {"role": "user", "content": "What is the weather like in Paris today?"}
REPLY = {
    "id": "msg_0123456789",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [
        {"type": "output_text", "text": "Sunny, 24 degrees, light wind.", "annotations": []}
    ],
}
TURN = [USER, REPLY]


class _Impl:
    """One implementation: makes SDK sessions on its own engine."""

    def __init__(self, name: str, pool_size: int) -> None:
        self.name = name
        self.pool_size = pool_size
        self.engine: AsyncEngine | None = None
        self.store: Any = None

    async def open(self, url: str) -> None:
        self.engine = create_async_engine(url, pool_size=self.pool_size)
        if self.name == "durable-sessions":
            from durable_sessions import SQLStore

            await migrate_schema(url)
            self.store = SQLStore(self.engine)
        else:
            # Tables made once, as its users' migrations would; sessions then skip create_all.
            from agents.extensions.memory import SQLAlchemySession

            await SQLAlchemySession("setup", engine=self.engine, create_tables=True).get_items()

    def session(self, session_id: str) -> Any:
        if self.name == "durable-sessions":
            from durable_sessions.openai_agents import DurableSession

            return DurableSession(session_id, self.store)
        from agents.extensions.memory import SQLAlchemySession

        assert self.engine is not None
        return SQLAlchemySession(session_id, engine=self.engine)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()


async def _filled(impl: _Impl, session_id: str, count: int) -> Any:
    session = impl.session(session_id)
    done = 0
    while done < count:
        n = min(FILL_BATCH, count - done)
        await session.add_items([TURN[(done + i) % 2] for i in range(n)])
        done += n
    return session


async def _ops(
    impl: _Impl, workload: str, workers: int, supply: int, label: str
) -> tuple[list[Op], int | None]:
    if workload == "add_items":
        sessions = [impl.session(f"{label}-add-{w}") for w in range(workers)]
        return [(lambda s=s: s.add_items(TURN)) for s in sessions], None
    if workload in ("get_items", "get_items20"):
        history = await _filled(impl, f"{label}-history", HISTORY)
        assert len(await history.get_items()) == HISTORY
        if workload == "get_items":
            return [history.get_items for _ in range(workers)], None
        assert len(await history.get_items(limit=20)) == 20
        return [(lambda: history.get_items(limit=20)) for _ in range(workers)], None
    if workload == "pop_item":
        sessions = [await _filled(impl, f"{label}-pop-{w}", supply) for w in range(workers)]
        return [s.pop_item for s in sessions], supply
    raise ValueError(f"unknown workload {workload!r}")


async def _measured(
    impl: _Impl, backend: str, workload: str, concurrency: int, duration: float, label: str
) -> Measurement:
    """One timed run of ``workload`` on sessions of its own (named after ``label``)."""
    m = Measurement(backend, impl.name, workload, concurrency)
    # A pop consumes its history: enough for the run, warm-up and a margin.
    supply = max(200, int(4_000 * duration))
    ops, max_ops = await _ops(impl, workload, concurrency, supply, label)
    result = await measure(ops, duration=duration, max_ops=max_ops)
    for key, value in result.items():
        if hasattr(m, key):
            setattr(m, key, value)
    return m


async def run_openai_suite(
    backend: str,
    concurrencies: list[int],
    duration: float,
    tmpdir: Path,
    log: Callable[[str], None],
    pool_size: int = 16,
    workloads: tuple[str, ...] = OPENAI_WORKLOADS,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Measure every (workload, concurrency, implementation) ``rounds`` times, the order
    alternating, and return each implementation's best round (noise only slows a run
    down, and the SDK's calls move by a third between runs on a shared machine)."""
    impls = [_Impl(name, pool_size) for name in IMPLS]
    dbs = [Database(backend, label, tmpdir) for label in ("oa_ours", "oa_sdk")]
    rows: list[dict[str, Any]] = []
    async with opened(impls, dbs):
        turn = 0
        for workload in workloads:
            for concurrency in concurrencies:
                best: dict[str, Measurement] = {}
                for round_ in range(rounds):
                    order = impls[turn % 2 :] + impls[: turn % 2]
                    turn += 1
                    for impl in order:
                        m = await _measured(impl, backend, workload, concurrency, duration,
                                            f"{workload}-{concurrency}-{round_}")  # fmt: skip
                        log(
                            f"  {backend:8} {workload:12} c={concurrency:<3} {impl.name:17} "
                            f"{m.ops_per_sec:9.1f} ops/s  p50 {m.p50_ms:7.2f} ms  "
                            f"p99 {m.p99_ms:7.2f} ms" + (f"  ERRORS {m.errors}" if m.errors else "")
                        )
                        keep_best(best, m)
                rows += [asdict(best[impl.name]) for impl in impls]
                ours, sdk = best[IMPLS[0]].ops_per_sec, best[IMPLS[1]].ops_per_sec
                log(
                    f"    best of {rounds}: ours/SDK {ours / sdk:.2f}x"
                    if ours and sdk
                    else "    ours/SDK -"
                )
    return rows


def render_table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table: each (backend, workload, concurrency) with both and the ratio."""
    by_key: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = (row["backend"], row["workload"], row["concurrency"])
        by_key.setdefault(key, {})[row["impl"]] = row
    out = [
        "| backend | workload | c | durable-sessions ops/s (p50 ms) "
        "| SDK SQLAlchemySession ops/s (p50 ms) | ours / SDK |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (backend, workload, concurrency), pair in sorted(
        by_key.items(), key=lambda kv: (kv[0][0], OPENAI_WORKLOADS.index(kv[0][1]), kv[0][2])
    ):
        ours, sdk = pair.get(IMPLS[0], {}), pair.get(IMPLS[1], {})
        a, b = ours.get("ops_per_sec", 0.0), sdk.get("ops_per_sec", 0.0)
        ratio = f"{a / b:.1f}x" if a and b else "-"
        out.append(
            f"| {backend} | {workload} | {concurrency} | {a:,.0f} ({ours.get('p50_ms', 0):.2f}) "
            f"| {b:,.0f} ({sdk.get('p50_ms', 0):.2f}) | {ratio} |"
        )
    return out


def save(rows: list[dict[str, Any]], out: Path, command: str) -> None:
    """Write ``openai.json`` (rows, merged by backend with earlier runs) and ``openai.md``."""
    path = out / "openai.json"
    previous: list[dict[str, Any]] = []
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8")).get("rows", [])
    backends = {r["backend"] for r in rows}
    merged = [r for r in previous if r["backend"] not in backends] + rows
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command}
    path.write_text(json.dumps({"meta": meta, "rows": merged}, indent=1) + "\n", encoding="utf-8")
    lines = [
        "# OpenAI Agents SDK sessions: durable-sessions beside the SDK's SQLAlchemySession",
        "",
        f"`{command}`, {meta['when']}. Both through the SDK's `Session` protocol, each in a "
        "fresh database on the same server, interleaved; with `--rounds N` (3 by default) "
        "each row is the implementation's best of N runs, the order alternating. Higher "
        "ops/s is better.",
        "",
        *render_table(merged),
        "",
    ]
    (out / "openai.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks run openai``: parse the options, run the suite, write results."""
    import argparse

    from .common import BACKENDS, ints

    parser = argparse.ArgumentParser(prog="python -m benchmarks run openai")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=ints, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell; the best is kept")
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    args.out.mkdir(parents=True, exist_ok=True)
    return main_openai(args, lambda text: print(text, flush=True))


def main_openai(args: Any, log: Callable[[str], None]) -> int:
    """Run the suite with parsed options and write its results."""
    import asyncio
    import shutil
    import sys

    from .common import new_tmpdir

    command = "python -m benchmarks " + " ".join(sys.argv[1:])
    tmpdir = new_tmpdir()
    rows: list[dict[str, Any]] = []
    try:
        for backend in args.backends:
            log(f"== OpenAI Agents SDK sessions on {backend}: {', '.join(OPENAI_WORKLOADS)}")
            rows += asyncio.run(
                run_openai_suite(backend, args.concurrency, args.duration, tmpdir, log,
                                 args.pool_size, rounds=args.rounds)
            )  # fmt: skip
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    save(rows, args.out, command)
    for line in render_table(rows):
        log(line)
    log(f"results written to {args.out}/openai.json, openai.md")
    return 0
