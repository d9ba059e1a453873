"""What being a good guest costs: the ADK adapter as shipped beside the same adapter with
each speed-up it no longer takes from the host process given back, in one run.

    python -m benchmarks run guest-cost [--backend all|sqlite|postgres] [--duration 1.5]
        [--concurrency 1,16] [--rounds 3] [--only W,...] [--out benchmarks/results]

The library leaves the host's garbage collector, its pool's order and (on SQLite) its
erasure guarantee as they are. Each can be had back by the application that wants it, on
its own engine or process, and each variant here is exactly that application:

- ``guest``: the adapter as shipped (``create_async_engine(url)``; the pool's own order,
  the garbage collector on, ``secure_delete`` on).
- ``lifo``: the same with ``pool_use_lifo=True``: the pool lends the connection returned
  last, as the library once arranged by reordering the pool's queue.
- ``gc-off``: the garbage collector disabled for each measurement (``gc.disable()``), the
  most that pausing it during decodes and collecting before reads could win.
- ``no-zeroing`` (SQLite): ``PRAGMA secure_delete = OFF`` on each connection after the
  store's own settings, so a delete no longer zeroes what it frees (and an erasure no
  longer guarantees that the removed words are gone from the file).

Google ADK's ``DatabaseSessionService`` runs in the same rounds, so the 5x-ADK figure of the
shipped adapter is read from the same run. Each variant has a fresh database of its own;
the order of the implementations alternates from round to round and each keeps its best
round (noise only slows a run down). Writes ``guest_cost.json`` and ``guest_cost.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event

from .adk_bench import best_of_rounds
from .common import BACKENDS, WORKLOADS, Measurement, command_line, ints, run_meta
from .impl_adk import Adk
from .impl_adk_adapter import AdkAdapter
from .workloads import Implementation

QUICK_ARGS = ["--duration", "0.3", "--concurrency", "1", "--rounds", "1", "--only", "get,delete"]

VARIANTS = {
    "guest": "as shipped",
    "lifo": "pool_use_lifo=True",
    "gc-off": "garbage collector off",
    "no-zeroing": "secure_delete off (SQLite)",
}
"""Each variant of the adapter, by implementation name, and what it changes."""


def _secure_delete_off(dbapi_connection: Any, record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA secure_delete = OFF")
    cursor.close()


class Variant(AdkAdapter):
    """The ADK adapter with one of ``VARIANTS`` applied by its application."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.pool_lifo = name == "lifo"

    async def open(self, url: str) -> None:
        await super().open(url)
        if self.name == "no-zeroing":
            # After the store's listener (registered when the store was made), so it wins.
            for engine in self.engines:
                event.listen(engine.sync_engine, "connect", _secure_delete_off)


@contextlib.contextmanager
def _collector(impl: Implementation) -> Iterator[None]:
    """The garbage collector off while the ``gc-off`` variant is measured."""
    if impl.name != "gc-off":
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def run(backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    names = [n for n in VARIANTS if n != "no-zeroing" or backend == "sqlite"]
    impls: list[Implementation] = [Adk(), *(Variant(n) for n in names)]

    def over_guest(best: dict[str, Measurement]) -> str:
        guest = best["guest"].ops_per_sec
        return f"guest/ADK {guest / best['google-adk'].ops_per_sec:.2f}x; " + ", ".join(
            f"{n} {best[n].ops_per_sec / guest:.2f}x guest" for n in names[1:]
        )

    labels = [impl.name for impl in impls]
    return await best_of_rounds(impls, labels, backend, args, over_guest, around=_collector)


def render(data: dict[str, Any]) -> str:
    """The Markdown report of a ``guest_cost.json``."""
    rows = data["rows"]
    by = {(r["backend"], r["workload"], r["concurrency"], r["impl"]): r for r in rows}
    lines = [
        "# What being a good guest costs",
        "",
        "The ADK adapter as shipped (`guest`) beside the same adapter with each speed-up the",
        "library no longer takes from its host given back by the application, and Google ADK's",
        "`DatabaseSessionService`, in one run: calls per second, best of "
        f"{data['meta'].get('rounds', '?')} rounds of {data['meta'].get('duration', '?')} s.",
        "A variant's column is its rate over `guest`'s: above 1.00x is what the speed-up wins.",
        "",
        f"Command: `{data['meta'].get('command', '')}`",
        "",
    ]
    for backend in dict.fromkeys(r["backend"] for r in rows):
        names = [
            n for n in VARIANTS if any(r["impl"] == n for r in rows if r["backend"] == backend)
        ]
        lines += [
            f"## {backend}",
            "",
            "| call | tasks | ADK | guest | guest/ADK | "
            + " | ".join(VARIANTS[n] for n in names[1:])
            + " |",
            "|---|---:|---:|---:|---:|" + "---:|" * (len(names) - 1),
        ]
        for workload in dict.fromkeys(r["workload"] for r in rows if r["backend"] == backend):
            for c in sorted({r["concurrency"] for r in rows if r["backend"] == backend}):
                adk = by.get((backend, workload, c, "google-adk"))
                guest = by.get((backend, workload, c, "guest"))
                if adk is None or guest is None:
                    continue
                g = guest["ops_per_sec"]
                cells = [
                    f"{by[(backend, workload, c, n)]['ops_per_sec'] / g:.2f}x" for n in names[1:]
                ]
                lines.append(
                    f"| {workload} | {c} | {adk['ops_per_sec']:,.0f} | {g:,.0f} | "
                    f"{g / adk['ops_per_sec']:.2f}x | " + " | ".join(cells) + " |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks run guest-cost")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--concurrency", type=ints, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3, help="measurements kept best of")
    parser.add_argument("--only", default="", help="comma-separated workloads")
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.workloads = [w for w in WORKLOADS if not args.only or w in args.only.split(",")]
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    rows: list[dict[str, Any]] = []
    for backend in backends:
        rows += asyncio.run(run(backend, args))
    meta = run_meta(args, command_line())
    meta.update(rounds=args.rounds, duration=args.duration)
    data = {"meta": meta, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "guest_cost.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    (args.out / "guest_cost.md").write_text(render(data), encoding="utf-8")
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
