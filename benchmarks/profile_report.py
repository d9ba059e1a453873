"""profile.md: the per-call CPU of each hot path, split into buckets, against the floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_profile(results: dict[str, Any], path: Path, n_ops: int) -> None:
    lines = [
        "# Where the time goes: durable-sessions' hot paths against the raw driver",
        "",
        f"Sequential, {n_ops} calls per path after 50 warm-up calls. CPU is client-side "
        "process time per call; on SQLite *worker* is aiosqlite's thread (sqlite3 itself and "
        "the queue), which cProfile cannot see. The split is cProfile self-time shares of the "
        "main thread (timer: thread CPU time, so waiting in epoll or for the GIL is not "
        "counted), scaled to the unprofiled main-thread CPU per call.",
        "",
    ]
    backends = list(dict.fromkeys(key.split("/")[0] for key in results))
    for backend in backends:
        keys = [k for k in results if k.startswith(backend + "/")]
        lines += [
            f"## {backend}",
            "",
            "| path | wall us ours / floor | CPU us ours / floor | ours/floor CPU "
            "| main / worker CPU us ours | stmts ours / floor | round trips ours / floor |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key in keys:
            o, f = results[key]["ours"], results[key]["floor"]
            lines.append(
                f"| {key.split('/')[1]} | {o['wall_us']:.0f} / {f['wall_us']:.0f} "
                f"| {o['cpu_us']:.0f} / {f['cpu_us']:.0f} "
                f"| {o['cpu_us'] / max(f['cpu_us'], 1):.1f}x "
                f"| {o['main_cpu_us']:.0f} / {o['worker_cpu_us']:.0f} "
                f"| {o['statements']:.1f} / {f['statements']:.1f} "
                f"| {o['round_trips']:.1f} / {f['round_trips']:.1f} |"
            )
        lines.append("")
        buckets = sorted(
            {b for k in keys for b in results[k]["split"]},
            key=lambda b: -sum(results[k]["split"].get(b, 0) for k in keys),
        )
        paths = [k.split("/")[1] for k in keys]
        lines += [
            f"### {backend}: main-thread CPU per call of durable-sessions, us (floor total last)",
            "",
            "| bucket | " + " | ".join(paths) + " |",
            "|---|" + "---:|" * len(paths),
        ]
        for bucket in buckets:
            cells = [
                f"{results[k]['split'].get(bucket, 0) * results[k]['ours']['main_cpu_us']:.0f}"
                for k in keys
            ]
            lines.append(f"| {bucket} | " + " | ".join(cells) + " |")
        lines.append(
            "| **floor, whole call (main thread)** | "
            + " | ".join(f"**{results[k]['floor']['main_cpu_us']:.0f}**" for k in keys)
            + " |"
        )
        lines.append("")
        floor_buckets = sorted(
            {b for k in keys for b in results[k]["floor_split"]},
            key=lambda b: -sum(results[k]["floor_split"].get(b, 0) for k in keys),
        )
        lines += [
            f"### {backend}: main-thread CPU per call of the floor, us",
            "",
            "| bucket | " + " | ".join(paths) + " |",
            "|---|" + "---:|" * len(paths),
        ]
        for bucket in floor_buckets:
            cells = [
                f"{results[k]['floor_split'].get(bucket, 0) * results[k]['floor']['main_cpu_us']:.0f}"  # noqa: E501
                for k in keys
            ]
            lines.append(f"| {bucket} | " + " | ".join(cells) + " |")
        lines.append("")
        for key in keys:
            lines += [
                f"<details><summary>{key}: top functions by self time (durable-sessions)</summary>",
                "",
                "| share | calls/op | function |",
                "|---:|---:|---|",
            ]
            for share, calls, name in results[key]["top"]:
                lines.append(f"| {share * 100:.1f}% | {calls:.1f} | `{name}` |")
            lines += ["", "</details>", ""]
    path.write_text("\n".join(lines) + "\n")
