"""The registry of benchmark suites: each name, the module that runs it, and its quick options.

A suite is a module with ``main(argv: list[str] | None = None) -> int`` that accepts
``--out DIR`` and writes its results file(s) there. ``python -m benchmarks run NAME`` calls
it with the registry's fixed options, then ``--quick``'s options (the module's own
``QUICK_ARGS`` when it defines them), then ``--out`` and whatever follows ``--``. A suite
whose module (or a package it needs) is not installed is listed as unavailable, so suites
can be registered before their module lands.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

__all__ = ["SUITES", "Suite"]


@dataclass(frozen=True)
class Suite:
    """One benchmark suite.

    Attributes:
        module: The module whose ``main(argv)`` runs it.
        summary: One line saying what it measures.
        results: The files it writes into the results directory.
        fixed: Options always passed first.
        quick: Options for ``--quick``: a run of a few minutes at most, for checking that
            the suite works, not for figures.
        needs: Modules that must be importable besides ``module`` (extras, servers' drivers).
        takes_out: Whether ``main`` takes ``--out DIR``; a suite without it writes its
            results where it chooses (``results`` names them).
    """

    module: str
    summary: str
    results: tuple[str, ...]
    fixed: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    needs: tuple[str, ...] = field(default_factory=tuple)
    takes_out: bool = True

    def missing(self) -> str | None:
        """The first module this suite needs that cannot be found, or None."""
        for name in (self.module, *self.needs):
            try:
                if importlib.util.find_spec(name) is None:
                    return name
            except ModuleNotFoundError:  # its parent package is missing
                return name
        return None


_SHORT = ("--duration", "0.3", "--concurrency", "1,4")

SUITES: dict[str, Suite] = {
    "side-by-side": Suite(
        "benchmarks.cli",
        "durable-sessions, Google ADK, its ADK adapter and the raw driver: 8 workloads",
        ("results.json", "results.md", "side_by_side.png"),
        quick=(*_SHORT, "--no-charts"),
        needs=("google.adk",),
    ),
    "scaling": Suite(
        "benchmarks.cli",
        "latency as the sessions table (to 1M) and one transcript (to 100k) grow",
        ("results.json", "results.md", "scaling.png"),
        fixed=("--scaling-only",),
        quick=("--duration", "0.3", "--sizes", "1000", "--event-sizes", "100", "--no-charts"),
    ),
    "adk": Suite(
        "benchmarks.adk_bench",
        "every ADK call through the adapter beside ADK's DatabaseSessionService",
        ("adk_adapter.json", "adk_adapter.md"),
        quick=(*_SHORT, "--rounds", "1"),
        needs=("google.adk",),
    ),
    "guest-cost": Suite(
        "benchmarks.guest_cost",
        "the ADK adapter as shipped beside the host giving back GC, pool order, zeroing",
        ("guest_cost.json", "guest_cost.md"),
        needs=("google.adk",),
    ),
    "openai": Suite(
        "benchmarks.openai_suite",
        "the OpenAI Agents SDK session beside the SDK's SQLAlchemySession",
        ("openai.json", "openai.md"),
        quick=(*_SHORT, "--rounds", "1"),
        needs=("agents",),
    ),
    "paging-search": Suite(
        "benchmarks.paging_search",
        "list_page at page 1 and 1,000, search over 1M events, the index's cost per append",
        ("paging_search.json", "paging_search.md"),
        quick=("--sessions", "2000", "--events", "2000", "--appends", "200", "--rounds", "3"),
    ),
    "export": Suite(
        "benchmarks.scaling",
        "export time per session as the database grows, and its peak memory",
        ("export.json",),
        quick=("--sizes", "1000", "--events", "5", "--rounds", "1"),
    ),
    "import-analyze": Suite(
        "benchmarks.import_analyze",
        "a JSONL import of 100k events with and without its final ANALYZE, on both dialects",
        ("import_analyze.json", "import_analyze.md"),
        quick=("--events", "2000", "--rounds", "1"),
    ),
    "distributed": Suite(
        "benchmarks.distributed_cost",
        "distributed (Citus) mode against the default mode on one Postgres",
        ("distributed.json", "distributed.md"),
        quick=("--duration", "0.3", "--concurrency", "1", "--rounds", "1", "--only", "get,save"),
    ),
    "tracing": Suite(
        "benchmarks.tracing_cost",
        "get and append_event with an engine listener and OpenTelemetry's instrumentation",
        ("tracing.json", "tracing.md"),
        quick=("--gets", "300", "--rounds", "1"),
    ),
    "encryption": Suite(
        "benchmarks.encryption_cost",
        "the hot paths with a keyring (encryption at rest) against without",
        ("encryption_sqlite.json", "encryption_sqlite.md"),
        quick=("--ops", "20", "--rounds", "1", "--events", "20"),
        needs=("cryptography",),
    ),
    "keyring": Suite(
        "benchmarks.keyring_cost",
        "a LocalKeyring's file work (a new user, an erasure) as it grows to 100k users",
        ("keyring.json", "keyring.md"),
        quick=("--scopes", "100,1000", "--rounds", "3"),
        needs=("cryptography",),
    ),
    "profile": Suite(
        "benchmarks.profile",
        "where each hot path's CPU goes, beside the raw driver",
        ("profile.md",),
        quick=("--ops", "100", "--backend", "sqlite"),
    ),
    "web-viewer": Suite(
        "benchmarks.web_viewer",
        "the web viewer's list and transcript pages over 1M sessions and 100k events",
        ("web_viewer.md",),
        quick=("--quick", "--no-write"),
        needs=("starlette", "httpx"),
        takes_out=False,
    ),
    "memory": Suite(
        "benchmarks.memory_bench",
        "long-term memory: search among 1M memories, adding a session, ADK's services beside",
        ("memory.json", "memory.md"),
        quick=("--quick",),
    ),
    "migrations": Suite(
        "benchmarks.online_migration",
        "upgrade 0002 -> head of 1M events under a live probe, online and as once released",
        ("online_migration.md",),
        fixed=("--compare",),
        quick=("--sessions", "2000"),
    ),
}
"""Every suite by name, in the order ``python -m benchmarks list`` prints them."""
