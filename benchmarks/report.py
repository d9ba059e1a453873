"""results.json, results.md and the PNG charts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import WORKLOADS
from .labels import IMPLS, LABELS, index

TARGET_VS_ADK = 3.0
TARGET_VS_FLOOR = 0.5  # "within 2x of the floor"
FLOOR_TARGETED = ("get", "save", "append_event")
NOTES = """\
Each implementation runs in its own fresh database on the same server, in the same run,
workload by workload (the order rotates). Each keeps the same number of connections
(`--pool-size`, 16 by default: SQLAlchemy's `pool_size` for durable-sessions, ADK and the
ADK adapter, a queue of raw connections for the floor); with SQLAlchemy's default of 5
(+10 overflow), 16 tasks would open and close overflow connections all the time.
Concurrency c means c tasks in `asyncio.gather` over one engine. Ratios are throughput
ratios within this run; absolute numbers on a noisy 2-core machine move 2-4x between runs.

- *stmts/op*: SQL statements per operation (SQLAlchemy's `before_cursor_execute` for
  durable-sessions, ADK and the adapter, counted by hand for the floor),
  BEGIN/COMMIT/ROLLBACK not counted.
- *round trips/op*: on Postgres every asyncpg call that reaches the server (statements,
  BEGIN, COMMIT, ROLLBACK, ADK's pool pre-ping); on SQLite every hop to aiosqlite's worker
  thread (statements, fetches, commits, cursor closes).
- *CPU us/op*: process CPU time (all threads, the client side only) per operation.
- ADK equivalents: *save* is `append_event` with `EventActions(state_delta=...)` (ADK has no
  other way to write state; it stores an event too); *list50* is `list_sessions` (no limit:
  it loads all 1,000 sessions with their state) then the 50 newest picked in Python; *fork*
  is `get_session(num_recent_events=0)` + `create_session` with the parent's private keys.
- *ADK adapter*: durable-sessions' `durable_sessions.adk.DurableSessionService(SQLStore(engine),
  org_id=...)`, driven by exactly the same ADK calls as the ADK column (the same code, only
  the service differs; the ADK equivalents above apply to it too), on an engine built as
  durable-sessions' own (no `pool_pre_ping`). *adapter/ADK* is its throughput over ADK's.
- get is `SessionService.get` (state and events; the session has none); get_recent20 is
  `SessionService.get(num_recent_events=20)` on a session of 1,000 events.
"""


def empty_results() -> dict[str, Any]:
    return {"runs": {}, "side_by_side": [], "scaling": []}


def load_results(out: Path) -> dict[str, Any]:
    path = out / "results.json"
    if not path.exists():
        return empty_results()
    data: dict[str, Any] = json.loads(path.read_text())
    base = empty_results()
    base.update(data)
    return base


def save_results(results: dict[str, Any], out: Path, *, charts: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    (out / "results.md").write_text(markdown(results))
    if charts:
        try:
            from .charts import scaling_chart, side_by_side_chart
        except ImportError:  # matplotlib: the bench dependency group
            print("charts not drawn: matplotlib is not installed", flush=True)
            return

        if results["side_by_side"]:
            side_by_side_chart(results["side_by_side"], out / "side_by_side.png")
        if results["scaling"]:
            scaling_chart(results["scaling"], out / "scaling.png")


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits == 0 and value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{max(digits, 1) if value < 10 else digits}f}"


def _ratio(a: float, b: float) -> float | None:
    return a / b if a and b else None


_ALL = "ours / ADK / adapter / floor"
"""The order of the four values in a multi-value cell."""


def side_by_side_tables(rows: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    by = index(rows)
    for backend in sorted({r["backend"] for r in rows}, reverse=True):
        for conc in sorted({r["concurrency"] for r in rows if r["backend"] == backend}):
            title = "sequential" if conc == 1 else f"{conc} concurrent tasks"
            lines += [
                f"### {backend}, {title}",
                "",
                f"| workload | ops/s ours | ops/s ADK | ops/s ADK adapter | ops/s floor "
                f"| ours/ADK | ours/floor | adapter/ADK | p50 ms {_ALL} | p99 ms {_ALL} "
                f"| stmts/op {_ALL} | round trips/op {_ALL} | CPU us/op {_ALL} |",
                "|---|" + "---:|" * 12,
            ]
            for workload in WORKLOADS:
                cells = [by.get((backend, workload, conc, impl)) for impl in IMPLS]
                if all(c is None for c in cells):
                    continue
                ours, adk, adapter, floor = (c or {} for c in cells)

                def each(key: str, digits: int, cells: list[Any] = cells) -> str:
                    return " / ".join(_fmt((c or {}).get(key), digits) for c in cells)

                vs_adk = _ratio(ours.get("ops_per_sec", 0), adk.get("ops_per_sec", 0))
                vs_floor = _ratio(ours.get("ops_per_sec", 0), floor.get("ops_per_sec", 0))
                adapter_vs_adk = _ratio(adapter.get("ops_per_sec", 0), adk.get("ops_per_sec", 0))
                mark_adk = "" if vs_adk is None or vs_adk >= TARGET_VS_ADK else " ✗"
                mark_floor = ""
                if backend == "postgres" and workload in FLOOR_TARGETED and vs_floor is not None:
                    mark_floor = " ✓" if vs_floor >= TARGET_VS_FLOOR else " ✗"
                errors = [
                    f"{LABELS[i]}: {c['first_error'][:60]}"
                    for i, c in zip(IMPLS, cells, strict=True)
                    if c and c.get("errors")
                ]
                name = workload + (f" (errors: {'; '.join(errors)})" if errors else "")
                lines.append(
                    f"| {name} | {_fmt(ours.get('ops_per_sec'))} | {_fmt(adk.get('ops_per_sec'))} "
                    f"| {_fmt(adapter.get('ops_per_sec'))} | {_fmt(floor.get('ops_per_sec'))} "
                    f"| {_fmt(vs_adk, 2)}x{mark_adk} | {_fmt(vs_floor, 2)}x{mark_floor} "
                    f"| {_fmt(adapter_vs_adk, 2)}x "
                    f"| {each('p50_ms', 2)} | {each('p99_ms', 2)} | {each('statements_per_op', 1)} "
                    f"| {each('round_trips_per_op', 1)} | {each('cpu_us_per_op', 0)} |"
                )
            lines.append("")
    return lines


def scaling_tables(rows: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for backend in sorted({r["backend"] for r in rows}, reverse=True):
        for axis, what in (
            ("sessions", "sessions in the table"),
            ("events", "events in one transcript"),
        ):
            sel = [r for r in rows if r["backend"] == backend and r["axis"] == axis]
            if not sel:
                continue
            sizes = sorted({r["size"] for r in sel})
            ops = list(dict.fromkeys(r["operation"] for r in sel))
            lines += [
                f"### {backend}: p50 (p99) ms as the {what} grow",
                "",
                "| operation | "
                + " | ".join(f"{s:,}" for s in sizes)
                + " | largest/smallest p50 |",
                "|---|" + "---:|" * (len(sizes) + 1),
            ]
            for op in ops:
                cell = {r["size"]: r for r in sel if r["operation"] == op}
                values = [
                    f"{cell[s]['p50_ms']:.2f} ({cell[s]['p99_ms']:.2f})" if s in cell else "-"
                    for s in sizes
                ]
                first, last = cell.get(sizes[0]), cell.get(sizes[-1])
                growth = _ratio(last["p50_ms"], first["p50_ms"]) if first and last else None
                flag = "" if growth is None else (" ✓" if growth <= 1.3 else " ✗")
                lines.append(f"| {op} | " + " | ".join(values) + f" | {_fmt(growth, 2)}x{flag} |")
            lines.append("")
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Benchmark results", ""]
    for key, meta in sorted(results["runs"].items()):
        lines.append(
            f"- `{key}`: {meta['when']}, `{meta['command']}`, {meta['machine']}, "
            + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        )
    lines.append("")
    if results["side_by_side"]:
        lines += ["## Side by side", "", NOTES, "", "![side by side](side_by_side.png)", ""]
        lines += [
            f"✗ after ours/ADK: below the {TARGET_VS_ADK:.0f}x target. ✓/✗ after ours/floor "
            "(Postgres get, save, append_event): within 2x of the raw driver or not. "
            "adapter/ADK has no target.",
            "",
        ]
        lines += side_by_side_tables(results["side_by_side"])
    if results["scaling"]:
        lines += [
            "## Scaling",
            "",
            "durable-sessions alone, sequential, through the public API, over tables seeded "
            "with set-based SQL: one database per table size (each also holds the listed "
            "user's 1,000 sessions and a 1,000-event session), one session per transcript "
            "length. All points are measured in 3 short rounds, sizes and operations "
            "interleaved: p50 is the best round's, p99 the median round's (the machine is "
            "shared and noisy). get is `SessionService.get` of a random session of the table "
            "(state and its one event); recent20 `SessionService.get(num_recent_events=20)`; "
            "list50 the 50 newest of one user's 1,000 sessions; on the transcript axis get is "
            "`Manager.get` and append `Manager.append_event` with a two-scope delta (which "
            "lengthens the transcript a little as it runs). ✓: the largest size within 1.3x "
            "of the smallest.",
            "",
            "![scaling](scaling.png)",
            "",
        ]
        lines += scaling_tables(results["scaling"])
    return "\n".join(lines)
