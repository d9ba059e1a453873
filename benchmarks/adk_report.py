"""adk_adapter.md: Google ADK's DatabaseSessionService beside durable-sessions' ADK adapter.

    python -m benchmarks.adk_report RESULTS_JSON [--before RESULTS_JSON]
        [--out benchmarks/results/adk_adapter.md]

Reads the side-by-side rows of a ``python -m benchmarks`` (``nox -s bench``) run, in which
both services get exactly the same ADK calls in one process, and writes one table per
backend and concurrency: throughput, latency and statements of each ADK call, and the
adapter's throughput over ADK's against the 5x target. With ``--before``, an earlier run's
adapter/ADK ratio is shown beside it (each ratio within its own run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import WORKLOADS

TARGET = 5.0
DRIVERS = {"sqlite": "aiosqlite", "postgres": "asyncpg", "mysql": "asyncmy"}
"""Each backend's driver, in the order the floor's sentence names them."""
CALLS = {
    "create": "`create_session` (state in every scope)",
    "get": "`get_session`",
    "get_recent20": "`get_session(num_recent_events=20)`, 1,000 events",
    "save": "`append_event`, a state delta in every scope",
    "append_event": "`append_event`, content and a delta in every scope",
    "list50": "`list_sessions` of 1,000 sessions",
    "fork": "fork: `get_session(num_recent_events=0)` + `create_session`",
    "delete": "`delete_session`",
}


def _row(rows: list[dict[str, Any]], impl: str, **key: Any) -> dict[str, Any] | None:
    for row in rows:
        if row["impl"] == impl and all(row[k] == v for k, v in key.items()):
            return row
    return None


def _cpu_ratio(adk: dict[str, Any], ours: dict[str, Any]) -> str:
    """How many times the client CPU ADK spends per call the adapter spends."""
    mine = ours["cpu_us_per_op"]
    return f"{adk['cpu_us_per_op'] / mine:.1f}x" if mine else "-"


def _floor_cell(rows: list[dict[str, Any]], adk: dict[str, Any], key: dict[str, Any]) -> str:
    """The floor's throughput over ADK's for one call, where the floor ran it."""
    floor = _row(rows, "floor", **key)
    if floor is None or not adk["ops_per_sec"]:
        return " - |"
    return f" {floor['ops_per_sec'] / adk['ops_per_sec']:.2f}x |"


def render(results: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    rows = results["side_by_side"]
    earlier = before["side_by_side"] if before else []
    lines = [
        "# Google ADK's DatabaseSessionService and durable-sessions' ADK adapter",
        "",
        "Both services get exactly the same ADK calls (`benchmarks/impl_adk.py`; the adapter, "
        "`benchmarks/impl_adk_adapter.py`, inherits them), each on a fresh database of the "
        "same server, in one process and one run, interleaved workload by workload. "
        f"✓ marks an adapter at least {TARGET:g}x ADK's throughput. Absolute figures on a "
        "noisy 2-core machine move between runs; the ratios are within one run. *CPU "
        "ADK/adapter* is the client CPU per call (process time, all threads, over the timed "
        "run) of ADK over the adapter's: steadier than throughput when other work shares "
        "the cores, and what throughput approaches when the client is CPU-bound.",
        "",
    ]
    for label, run in (("before", before), ("", results)):
        for meta_key in sorted(run["runs"] if run else ()):
            if meta_key.startswith("side_by_side/"):
                meta = run["runs"][meta_key]
                name = f"{label} `{meta_key}`" if label else f"`{meta_key}`"
                lines.append(f"- {name}: {meta['when']}, `{meta['command']}`")
    lines.append("")
    floored = any(r["impl"] == "floor" for r in rows)
    if floored:
        backends = {r["backend"] for r in rows if r["impl"] == "floor"}
        drivers = " or ".join(d for b, d in DRIVERS.items() if b in backends)
        lines += [
            "*floor/ADK* is the driver floor's throughput over ADK's, for the calls whose whole "
            "work it does (`benchmarks.adk_bench.FLOORED`): one hand-written statement on raw "
            f"{drivers}, timed in the same rounds: about the best ratio a service "
            "doing that work on this driver could show.",
            "",
        ]
    combos = sorted({(r["backend"], r["concurrency"]) for r in rows}, key=lambda c: (c[0], c[1]))
    for backend, concurrency in combos:
        tasks = "sequential" if concurrency == 1 else f"{concurrency} concurrent tasks"
        then = " | adapter/ADK before | CPU ADK/adapter before" if earlier else ""
        then += " | floor/ADK" if floored else ""
        lines += [
            f"## {backend}, {tasks}",
            "",
            "| ADK call | ops/s ADK | ops/s adapter | adapter/ADK | p50 ms ADK / adapter "
            f"| stmts/op ADK / adapter | CPU us/op ADK / adapter | CPU ADK/adapter{then} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"
            + ("---:|---:|" if earlier else "")
            + ("---:|" if floored else ""),
        ]
        for workload in WORKLOADS:
            key = {"backend": backend, "concurrency": concurrency, "workload": workload}
            adk, ours = _row(rows, "google-adk", **key), _row(rows, "adk-adapter", **key)
            if adk is None or ours is None:
                continue
            ratio = ours["ops_per_sec"] / adk["ops_per_sec"] if adk["ops_per_sec"] else 0.0
            mark = "✓" if ratio >= TARGET else "✗"
            stmts = " / ".join(
                "-" if r["statements_per_op"] is None else f"{r['statements_per_op']:.1f}"
                for r in (adk, ours)
            )
            old = ""
            if earlier:
                was_adk = _row(earlier, "google-adk", **key)
                was_ours = _row(earlier, "adk-adapter", **key)
                if was_adk and was_ours and was_adk["ops_per_sec"]:
                    old = (
                        f" {was_ours['ops_per_sec'] / was_adk['ops_per_sec']:.2f}x "
                        f"| {_cpu_ratio(was_adk, was_ours)} |"
                    )
                else:
                    old = " - | - |"
            lines.append(
                f"| {CALLS[workload]} | {adk['ops_per_sec']:,.0f} | {ours['ops_per_sec']:,.0f} "
                f"| {ratio:.2f}x {mark} | {adk['p50_ms']:.2f} / {ours['p50_ms']:.2f} "
                f"| {stmts} | {adk['cpu_us_per_op']:,.0f} / {ours['cpu_us_per_op']:,.0f} "
                f"| {_cpu_ratio(adk, ours)} |{old}{_floor_cell(rows, adk, key) if floored else ''}"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adk_report")
    parser.add_argument("results", type=Path, help="a results.json of python -m benchmarks")
    parser.add_argument("--before", type=Path, help="an earlier run's results.json")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/adk_adapter.md"))
    args = parser.parse_args(argv)
    before = json.loads(args.before.read_text()) if args.before else None
    text = render(json.loads(args.results.read_text()), before)
    args.out.write_text(text, encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
