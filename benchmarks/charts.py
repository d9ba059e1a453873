"""The PNG charts (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .common import WORKLOADS
from .labels import COLORS, IMPLS, LABELS, index


def side_by_side_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars of ops/s per workload, the four implementations side by side, per backend."""
    by = index(rows)
    backends = sorted({r["backend"] for r in rows}, reverse=True)
    concs = sorted({r["concurrency"] for r in rows})
    fig, axes = plt.subplots(
        len(backends), len(concs), figsize=(7.5 * len(concs), 4.6 * len(backends)), squeeze=False
    )
    width = 0.2
    centre = (len(IMPLS) - 1) / 2
    offset = {impl: (k - centre) * width for k, impl in enumerate(IMPLS)}
    for bi, backend in enumerate(backends):
        for ci, conc in enumerate(concs):
            ax = axes[bi][ci]
            workloads = [w for w in WORKLOADS if any((backend, w, conc, i) in by for i in IMPLS)]
            for impl in IMPLS:
                values = [
                    by.get((backend, w, conc, impl), {}).get("ops_per_sec", 0) for w in workloads
                ]
                xs = [x + offset[impl] for x in range(len(workloads))]
                ax.bar(xs, values, width, label=LABELS[impl], color=COLORS[impl])
            for x, w in enumerate(workloads):
                adk = by.get((backend, w, conc, "google-adk"), {}).get("ops_per_sec", 0)
                for impl in ("durable-sessions", "adk-adapter"):
                    ops = by.get((backend, w, conc, impl), {}).get("ops_per_sec", 0)
                    if ops and adk:
                        ratio = ops / adk
                        ax.annotate(
                            f"{ratio:.2g}x" if ratio < 1 else f"{ratio:.1f}x",
                            (x + offset[impl], ops),
                            ha="center",
                            va="bottom",
                            fontsize=6.5,
                            color=COLORS[impl],
                        )
            ax.set_yscale("log")
            ax.set_xticks(range(len(workloads)))
            ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("operations per second (log)")
            mode = "sequential" if conc == 1 else f"{conc} concurrent tasks"
            ax.set_title(f"{backend}, {mode}", fontsize=10)
            ax.grid(axis="y", which="major", alpha=0.3)
    fig.suptitle(
        "durable-sessions, Google ADK DatabaseSessionService, durable-sessions' ADK adapter, "
        "raw driver (numbers: throughput ÷ ADK's, over the blue and green bars)",
        fontsize=11,
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(IMPLS), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 / len(backends), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


OP_COLORS = {
    "get": "#1f77b4",
    "recent20": "#ff7f0e",
    "list50": "#2ca02c",
    "append": "#d62728",
}


def scaling_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """p50 latency against table size and transcript length, per backend."""
    backends = sorted({r["backend"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(len(backends), 2, figsize=(12, 4.2 * len(backends)), squeeze=False)
    for bi, backend in enumerate(backends):
        for ai, (axis, xlabel) in enumerate(
            (("sessions", "sessions in the table"), ("events", "events in the transcript"))
        ):
            ax = axes[bi][ai]
            sel = [r for r in rows if r["backend"] == backend and r["axis"] == axis]
            for op in dict.fromkeys(r["operation"] for r in sel):
                points = sorted((r["size"], r["p50_ms"]) for r in sel if r["operation"] == op)
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker="o",
                    label=f"{op}",
                    color=OP_COLORS.get(op, "#333333"),
                )
                ax.annotate(
                    f"{points[-1][1]:.2f}",
                    points[-1],
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
            ax.set_xscale("log")
            ax.set_ylim(bottom=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("p50 latency, ms")
            ax.set_title(f"{backend}: latency as the {xlabel} grow", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(
        "durable-sessions: p50 latency as the data grows (sequential; p99 in results.md)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
