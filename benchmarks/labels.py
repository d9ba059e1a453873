"""The side-by-side suite's implementations: their order, names and colours in tables and charts."""

from __future__ import annotations

from typing import Any

IMPLS = ("durable-sessions", "google-adk", "adk-adapter", "floor")
LABELS = {
    "durable-sessions": "durable-sessions",
    "google-adk": "Google ADK",
    "adk-adapter": "durable-sessions ADK adapter",
    "floor": "raw driver",
}
COLORS = {
    "durable-sessions": "#1f77b4",
    "google-adk": "#ff7f0e",
    "adk-adapter": "#2ca02c",
    "floor": "#7f7f7f",
}


def index(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int, str], dict[str, Any]]:
    """Rows by (backend, workload, concurrency, implementation)."""
    return {(r["backend"], r["workload"], r["concurrency"], r["impl"]): r for r in rows}
