"""Two runs of ``python -m benchmarks`` side by side: what changed between two versions.

    python -m benchmarks.before_after BEFORE/results.json[,MORE...] AFTER/results.json[,MORE...]

Each side may be several runs (comma-separated): each cell then takes the run with the best
throughput of that implementation (best of n, the least disturbed by the machine).

For each backend, concurrency and workload: durable-sessions' throughput and client CPU per
operation in each run, and their ratio after/before. The raw-driver floor is the control:
its code is the same in both runs, so its after/before ratio shows how much the machine
itself moved between the runs, and *ours/floor* (each run against its own floor) is the
steadier comparison. Statements and round trips per operation are printed for both runs,
since a change in them is a change in behaviour, not noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OURS = "durable-sessions"
FLOOR = "floor"


def _index(results: dict[str, Any]) -> dict[tuple[str, int, str, str], dict[str, Any]]:
    best: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for r in results["side_by_side"]:
        key = (r["backend"], r["concurrency"], r["workload"], r["impl"])
        if key not in best or r["ops_per_sec"] > best[key]["ops_per_sec"]:
            best[key] = r
    return best


def _load(paths: str) -> dict[str, Any]:
    """Several results.json as one: every run named, every measurement kept."""
    merged: dict[str, Any] = {"runs": {}, "side_by_side": []}
    for n, path in enumerate(paths.split(",")):
        results = json.loads(Path(path).read_text())
        merged["runs"].update({f"{name} #{n + 1}": run for name, run in results["runs"].items()})
        merged["side_by_side"] += results["side_by_side"]
    return merged


def _ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}x" if before else "-"


def render(before: dict[str, Any], after: dict[str, Any], title: str = "") -> str:
    """A Markdown report of ``after`` against ``before`` (two results.json documents)."""
    old, new = _index(before), _index(after)
    lines = [f"# {title or 'Before and after'}", ""]
    for label, results in (("before", before), ("after", after)):
        for name, run in sorted(results["runs"].items()):
            lines.append(f"- {label} `{name}`: {run['when']}, `{run['command']}`")
    keys = sorted({k[:3] for k in new if k[3] == OURS and (*k[:3], OURS) in old})
    backends = sorted({k[0] for k in keys})
    for backend in backends:
        for concurrency in sorted({k[1] for k in keys if k[0] == backend}):
            lines += [
                "",
                f"## {backend}, concurrency {concurrency}",
                "",
                "| workload | ops/s before | ops/s after | after/before | floor after/before "
                "| ours/floor before | ours/floor after | CPU us/op before / after "
                "| stmts/op before / after | round trips/op before / after |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for workload in [k[2] for k in keys if k[:2] == (backend, concurrency)]:
                b, a = (
                    old[(backend, concurrency, workload, OURS)],
                    new[(backend, concurrency, workload, OURS)],
                )
                fb = old.get((backend, concurrency, workload, FLOOR))
                fa = new.get((backend, concurrency, workload, FLOOR))
                floor_moved = _ratio(fa["ops_per_sec"], fb["ops_per_sec"]) if fa and fb else "-"
                of_b = _ratio(b["ops_per_sec"], fb["ops_per_sec"]) if fb else "-"
                of_a = _ratio(a["ops_per_sec"], fa["ops_per_sec"]) if fa else "-"
                lines.append(
                    f"| {workload} | {b['ops_per_sec']:,.0f} | {a['ops_per_sec']:,.0f} "
                    f"| {_ratio(a['ops_per_sec'], b['ops_per_sec'])} | {floor_moved} "
                    f"| {of_b} | {of_a} "
                    f"| {b['cpu_us_per_op']:,.0f} / {a['cpu_us_per_op']:,.0f} "
                    f"| {b['statements_per_op']:.1f} / {a['statements_per_op']:.1f} "
                    f"| {b['round_trips_per_op']:.1f} / {a['round_trips_per_op']:.1f} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print (or write with ``--out``) the report of two results files."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.before_after")
    parser.add_argument("before", help="results.json of the earlier version (comma-separated)")
    parser.add_argument("after", help="results.json of the later version (comma-separated)")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = render(_load(args.before), _load(args.after), args.title)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
