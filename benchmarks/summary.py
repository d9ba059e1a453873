"""The performance page's tables, made from the suites' results files.

``python -m benchmarks report`` writes one Markdown file per suite into
``benchmarks/results/summary/``; ``docs/performance.md`` includes them, so the page shows
what the results files hold and nothing else. Each table ends with the run's date, machine
and command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SUMMARIES", "write_summaries"]

SIDE_BY_SIDE = ("create", "get", "get_recent20", "save", "append_event", "list50", "fork", "delete")
WORKLOAD_NAMES = {
    "create": "create",
    "get": "get",
    "get_recent20": "get + 20 recent events",
    "save": "save",
    "append_event": "append_event",
    "list50": "list 50 of 1,000",
    "fork": "fork",
    "delete": "delete",
}


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _rate(value: float | None) -> str:
    if not value:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _times(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.1f}x" if a / b < 100 else f"{a / b:,.0f}x"


def _runs(runs: dict[str, dict[str, Any]], prefix: str) -> list[str]:
    lines = []
    for key in sorted(k for k in runs if k.startswith(prefix)):
        run = runs[key]
        versions = ", ".join(f"{k} {v}" for k, v in sorted(run.get("versions", {}).items()))
        lines.append(
            f"- `{key.split('/', 1)[1]}`: {run['when']}, {run.get('machine', '?')}"
            f" ({versions}): `{run['command']}`"
        )
    return lines


def side_by_side(results_dir: Path) -> str | None:
    """Ops/s of durable-sessions, Google ADK and the adapter, one task and 16, per backend."""
    data = _load(results_dir / "results.json")
    if not data or not data.get("side_by_side"):
        return None
    by = {
        (r["backend"], r["workload"], r["concurrency"], r["impl"]): r["ops_per_sec"]
        for r in data["side_by_side"]
    }
    out = []
    for backend in ("postgres", "sqlite", "mysql"):
        if not any(k[0] == backend for k in by):
            continue
        out += [
            f"**{BACKEND_NAMES[backend]}**, operations per second:",
            "",
            "| workload | durable-sessions | Google ADK | ADK adapter | vs ADK "
            "| 16 tasks: ours | ADK | vs ADK |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for w in SIDE_BY_SIDE:
            ours, adk, adapter = (by.get((backend, w, 1, i)) for i in _IMPLS)
            ours16, adk16 = by.get((backend, w, 16, _IMPLS[0])), by.get((backend, w, 16, _IMPLS[1]))
            out.append(
                f"| {WORKLOAD_NAMES[w]} | {_rate(ours)} | {_rate(adk)} | {_rate(adapter)} "
                f"| {_times(ours, adk)} | {_rate(ours16)} | {_rate(adk16)} "
                f"| {_times(ours16, adk16)} |"
            )
        out.append("")
    out += ["Runs:", "", *_runs(data.get("runs", {}), "side_by_side/")]
    return "\n".join(out) + "\n"


_IMPLS = ("durable-sessions", "google-adk", "adk-adapter")
BACKEND_NAMES = {"postgres": "Postgres", "sqlite": "SQLite", "mysql": "MariaDB"}


def scaling(results_dir: Path) -> str | None:
    """Median latency of each operation at each size, per backend."""
    data = _load(results_dir / "results.json")
    if not data or not data.get("scaling"):
        return None
    rows = data["scaling"]
    out = []
    for axis, what in (("sessions", "sessions in the table"), ("events", "events in one session")):
        sizes = sorted({r["size"] for r in rows if r["axis"] == axis})
        if not sizes:
            continue
        out += [
            f"Median latency in ms, by {what}:",
            "",
            "| backend | operation | " + " | ".join(f"{s:,}" for s in sizes) + " |",
            "|---|---|" + "---:|" * len(sizes),
        ]
        keys = sorted({(r["backend"], r["operation"]) for r in rows if r["axis"] == axis})
        for backend, op in sorted(keys, key=lambda k: (k[0] != "postgres", k)):
            cells = {
                r["size"]: r["p50_ms"]
                for r in rows
                if (r["axis"], r["backend"], r["operation"]) == (axis, backend, op)
            }
            values = " | ".join(f"{cells[s]:.2f}" if s in cells else "-" for s in sizes)
            out.append(f"| {backend} | {op} | {values} |")
        out.append("")
    out += ["Runs:", "", *_runs(data.get("runs", {}), "scaling/")]
    return "\n".join(out) + "\n"


ADK_CALLS = {
    "create": "`create_session`",
    "get": "`get_session`",
    "get_recent20": "`get_session`, 20 recent of 1,000 events",
    "save": "`append_event`, a state delta",
    "append_event": "`append_event`, content and a delta",
    "list50": "`list_sessions` of 1,000",
    "fork": "fork: `get_session` + `create_session`",
    "delete": "`delete_session`",
}


def adk(results_dir: Path) -> str | None:
    """Each ADK call's ops/s through the adapter over ADK's own service."""
    data = _load(results_dir / "adk_adapter.json")
    if not data or not data.get("side_by_side"):
        return None
    by = {
        (r["backend"], r["workload"], r["concurrency"], r["impl"]): r["ops_per_sec"]
        for r in data["side_by_side"]
    }
    out = [
        "Throughput of the ADK adapter over ADK's `DatabaseSessionService`, the same ADK calls:",
        "",
        "| ADK call | Postgres, 1 task | Postgres, 16 | SQLite, 1 task | SQLite, 16 |",
        "|---|---:|---:|---:|---:|",
    ]
    for w, name in ADK_CALLS.items():
        cells = [
            _times(by.get((b, w, c, "adk-adapter")), by.get((b, w, c, "google-adk")))
            for b in ("postgres", "sqlite")
            for c in (1, 16)
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "Runs:", "", *_runs(data.get("runs", {}), "side_by_side/")]
    return "\n".join(out) + "\n"


def adk_mysql(results_dir: Path) -> str | None:
    """Each ADK call's ops/s on MySQL (MariaDB): ADK's service, the adapter, their ratio."""
    data = _load(results_dir / "adk_adapter_mysql.json")
    if not data or not data.get("side_by_side"):
        return None
    by = {
        (r["backend"], r["workload"], r["concurrency"], r["impl"]): r["ops_per_sec"]
        for r in data["side_by_side"]
    }
    out = [
        "Operations per second of ADK's `DatabaseSessionService` and of the ADK adapter on "
        "the same server, the same ADK calls:",
        "",
        "| ADK call | 1 task: ADK | adapter | vs ADK | 16 tasks: ADK | adapter | vs ADK |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w, name in ADK_CALLS.items():
        cells = []
        for c in (1, 16):
            adk_rate = by.get(("mysql", w, c, "google-adk"))
            ours = by.get(("mysql", w, c, "adk-adapter"))
            cells += [_rate(adk_rate), _rate(ours), _times(ours, adk_rate)]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "Runs:", "", *_runs(data.get("runs", {}), "side_by_side/")]
    return "\n".join(out) + "\n"


def openai(results_dir: Path) -> str | None:
    """Ops/s of the SDK session over the SDK's SQLAlchemySession."""
    data = _load(results_dir / "openai.json")
    if not data or not data.get("rows"):
        return None
    by = {
        (r["backend"], r["workload"], r["concurrency"], r["impl"]): r["ops_per_sec"]
        for r in data["rows"]
    }
    names = {
        "add_items": "`add_items`, a 2-item turn",
        "get_items": "`get_items()`, 1,000 items",
        "get_items20": "`get_items(limit=20)`",
        "pop_item": "`pop_item`",
    }
    out = [
        "Throughput of `DurableSession` over the SDK's `SQLAlchemySession`:",
        "",
        "| call | Postgres, 1 task | Postgres, 16 | SQLite, 1 task | SQLite, 16 |",
        "|---|---:|---:|---:|---:|",
    ]
    for w, name in names.items():
        cells = [
            _times(by.get((b, w, c, "durable-sessions")), by.get((b, w, c, "sdk-sqlalchemy")))
            for b in ("postgres", "sqlite")
            for c in (1, 16)
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    meta = data.get("meta", {})
    out += ["", f"Run: {meta.get('when', '?')}: `{meta.get('command', '?')}`"]
    return "\n".join(out) + "\n"


def paging_search(results_dir: Path) -> str | None:
    """Paging and search medians at their largest sizes."""
    data = _load(results_dir / "paging_search.json")
    if not data or not data.get("rows"):
        return None
    rows = data["rows"]
    out = []
    pages = [r for r in rows if r.get("part") == "paging"]
    if pages:
        out += [
            "| backend | sessions | listing | page | median ms | `OFFSET` median ms |",
            "|---|---:|---|---:|---:|---:|",
        ]
        out += [
            f"| {r['backend']} | {r['sessions']:,} | {r['filter']} | {r['page']:,} "
            f"| {r['median_ms']:.2f} | {r['offset_median_ms']:.2f} |"
            for r in pages
        ]
        out.append("")
    searches = [r for r in rows if r.get("part") == "search"]
    if searches:
        out += [
            "| backend | events | words | narrowed by | events holding them | median ms |",
            "|---|---:|---|---|---:|---:|",
        ]
        out += [
            f"| {r['backend']} | {r['events']:,} | `{r['query']}` | {r['narrowed'] or '-'} "
            f"| {r['events_holding']:,} | {r['median_ms']:.2f} |"
            for r in searches
        ]
        out.append("")
    writes = [r for r in rows if r.get("part") == "writes"]
    if writes:
        out += ["| backend | schema | `append_event` median ms |", "|---|---|---:|"]
        out += [f"| {r['backend']} | {r['revision']} | {r['median_ms']:.3f} |" for r in writes]
        out.append("")
    meta = data.get("meta") or {}
    machine = data.get("machine", {})
    out.append(
        f"Run: {meta.get('when', '?')}, Python {machine.get('python', '?')}, "
        f"{machine.get('cpus', '?')} cores: `{meta.get('command', '?')}`"
    )
    return "\n".join(out) + "\n"


def guest_cost(results_dir: Path) -> str | None:
    """The shipped adapter over ADK, and each speed-up the host could give back over it."""
    data = _load(results_dir / "guest_cost.json")
    if not data or not data.get("rows"):
        return None
    by = {
        (r["backend"], r["workload"], r["concurrency"], r["impl"]): r["ops_per_sec"]
        for r in data["rows"]
    }
    out = [
        "Throughput of the ADK adapter as shipped over ADK's `DatabaseSessionService`, and of "
        "the same adapter with each speed-up given back by the application over the adapter "
        "as shipped (above 1.0x is what that speed-up wins):",
        "",
        "| ADK call | tasks | Postgres: vs ADK | `pool_use_lifo` | GC off "
        "| SQLite: vs ADK | `pool_use_lifo` | GC off | `secure_delete` off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    concurrencies = sorted({r["concurrency"] for r in data["rows"]})
    for w, name in ADK_CALLS.items():
        for c in concurrencies:
            cells = []
            for b, variants in (
                ("postgres", ("lifo", "gc-off")),
                ("sqlite", ("lifo", "gc-off", "no-zeroing")),
            ):
                guest = by.get((b, w, c, "guest"))
                cells.append(_times(guest, by.get((b, w, c, "google-adk"))))
                cells += [_times(by.get((b, w, c, v)), guest) for v in variants]
            out.append(f"| {name} | {c} | " + " | ".join(cells) + " |")
    meta = data.get("meta", {})
    out += [
        "",
        f"Run: {meta.get('when', '?')}, {meta.get('machine', '?')}: `{meta.get('command', '?')}`",
    ]
    return "\n".join(out) + "\n"


SUMMARIES: dict[str, Callable[[Path], str | None]] = {
    "side-by-side": side_by_side,
    "scaling": scaling,
    "adk": adk,
    "adk-mysql": adk_mysql,
    "guest-cost": guest_cost,
    "openai": openai,
    "paging-search": paging_search,
}
"""Each summarised suite's table maker, by name (the file is ``summary/NAME.md``): the
suite's name, or the suite's and a backend's."""

_SUITE_OF = {"adk-mysql": "adk"}
"""The suite whose results a summary not named after one is made from."""


def write_summaries(results_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Write ``summary/NAME.md`` for each suite with results; return the files written."""
    written = []
    (results_dir / "summary").mkdir(parents=True, exist_ok=True)
    for name, make in SUMMARIES.items():
        if names is not None and _SUITE_OF.get(name, name) not in names:
            continue
        text = make(results_dir)
        if text is None:
            continue
        path = results_dir / "summary" / f"{name}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
