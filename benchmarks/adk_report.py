"""adk_adapter.md: Google ADK's DatabaseSessionService beside durable-sessions' ADK adapter.

    python -m benchmarks.adk_report RESULTS_JSON [--out benchmarks/results/adk_adapter.md]

Reads the side-by-side rows of a ``python -m benchmarks`` (``nox -s bench``) run, in which
both services get exactly the same ADK calls in one process, and writes one table per
backend and concurrency: throughput, latency and statements of each ADK call, and the
adapter's throughput over ADK's against the 5x target.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import WORKLOADS

TARGET = 5.0
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


def render(results: dict[str, Any]) -> str:
    rows = results["side_by_side"]
    lines = [
        "# Google ADK's DatabaseSessionService and durable-sessions' ADK adapter",
        "",
        "Both services get exactly the same ADK calls (`benchmarks/impl_adk.py`; the adapter, "
        "`benchmarks/impl_adk_adapter.py`, inherits them), each on a fresh database of the "
        "same server, in one process and one run, interleaved workload by workload. "
        f"✓ marks an adapter at least {TARGET:g}x ADK's throughput. Absolute figures on a "
        "noisy 2-core machine move between runs; the ratios are within one run.",
        "",
    ]
    for meta_key in sorted(results["runs"]):
        if meta_key.startswith("side_by_side/"):
            meta = results["runs"][meta_key]
            lines.append(f"- `{meta_key}`: {meta['when']}, `{meta['command']}`")
    lines.append("")
    combos = sorted({(r["backend"], r["concurrency"]) for r in rows}, key=lambda c: (c[0], c[1]))
    for backend, concurrency in combos:
        tasks = "sequential" if concurrency == 1 else f"{concurrency} concurrent tasks"
        lines += [
            f"## {backend}, {tasks}",
            "",
            "| ADK call | ops/s ADK | ops/s adapter | adapter/ADK | p50 ms ADK / adapter "
            "| stmts/op ADK / adapter | CPU us/op ADK / adapter |",
            "|---|---:|---:|---:|---:|---:|---:|",
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
            lines.append(
                f"| {CALLS[workload]} | {adk['ops_per_sec']:,.0f} | {ours['ops_per_sec']:,.0f} "
                f"| {ratio:.2f}x {mark} | {adk['p50_ms']:.2f} / {ours['p50_ms']:.2f} "
                f"| {stmts} | {adk['cpu_us_per_op']:,.0f} / {ours['cpu_us_per_op']:,.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adk_report")
    parser.add_argument("results", type=Path, help="a results.json of python -m benchmarks")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/adk_adapter.md"))
    args = parser.parse_args(argv)
    args.out.write_text(render(json.loads(args.results.read_text())), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
