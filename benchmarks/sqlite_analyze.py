"""SQLite: ANALYZE run while the full-text index is small, and appends as the index grows.

The README's search notes say that ``ANALYZE`` (or ``PRAGMA optimize``) run while the FTS5
index is still small makes SQLite plan FTS5's own range deletes on ``ds_events_fts_data``
as full scans, so that appends slow down as the index grows, and that deleting that
table's row of ``sqlite_stat1`` (or analysing again once grown) avoids it. This checks it.

Each variant is a SQLite file migrated and filled through ``SQLStore`` with ``--small``
events, then:

- ``small``: ``ANALYZE`` run then, never again;
- ``deleted``: the same ANALYZE, then ``DELETE FROM sqlite_stat1 WHERE tbl =
  'ds_events_fts_data'`` (the README's remedy);
- ``regrown``: the same ANALYZE, and ``ANALYZE`` again half way through the appends (the
  README's other remedy);
- ``never``: never analysed.

Then every variant's store appends ``--per-round`` events (``append_event``, one event per
call, each a transaction, spread over ``--sessions`` sessions), variant after variant
within a round, ``--rounds`` times: the index grows alike in each, and each round gives
each variant's appends per second and its ratio to ``deleted`` in that round (absolute
figures move with the machine's load; ratios within a round much less). At the end, the
statements FTS5 itself runs during appends are traced (``sqlite3`` trace callback, on a
copy of each file) and each one's ``EXPLAIN QUERY PLAN`` printed per variant.

    python -m benchmarks.sqlite_analyze
    python -m benchmarks.sqlite_analyze --small 50 --rounds 8 --per-round 1500

``--pragma-optimize`` checks the README's "(or ``PRAGMA optimize``)" instead, in seconds:
a file filled as above and never analysed is copied once per case, each case is run on a
new connection as a user would run it (plain ``PRAGMA optimize``; ``PRAGMA
optimize=0x10002``, which SQLite's documentation recommends at connection open; plain
``PRAGMA optimize`` after appends and a search on the same connection, as before closing
it; ``ANALYZE`` for comparison), and the ``sqlite_stat1`` row of ``ds_events_fts_data``
and the plan of FTS5's range delete are printed. It runs with Python's own ``sqlite3``
(the SQLite that aiosqlite, hence the store, uses) and again with ``pysqlite3`` when that
is importable (``pip install pysqlite3-binary``: a newer SQLite).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Manager, SQLStore

ORG = "bench"
VARIANTS = ("small", "deleted", "regrown", "never")
STAT_DELETE = "DELETE FROM sqlite_stat1 WHERE tbl = 'ds_events_fts_data'"
VOCABULARY = [f"w{n}" for n in range(5_000)]
WORDS = 12


def content(rng: random.Random) -> dict[str, Any]:
    """An ADK-shaped event content of WORDS words drawn from VOCABULARY."""
    text = " ".join(rng.choice(VOCABULARY) for _ in range(WORDS))
    return {"parts": [{"text": text}], "role": "user"}


class Variant:
    """One SQLite file, its engine and store, and the sessions appended to."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.url = f"sqlite+aiosqlite:///{path}"
        self.engine: AsyncEngine | None = None
        self.store: SQLStore | None = None
        self.sessions: list[str] = []
        self.rng = random.Random(name)
        self.appended = 0
        self.bulked = 0

    async def open(self) -> SQLStore:
        """A new engine: its connections read sqlite_stat1 afresh."""
        if self.engine is not None:
            await self.engine.dispose()
        self.engine = create_async_engine(self.url)
        self.store = SQLStore(self.engine)
        return self.store

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None

    async def append(self, count: int) -> float:
        """Append ``count`` events, one call each; return the seconds taken."""
        store = self.store
        assert store is not None
        began = time.perf_counter()
        for n in range(count):
            session_id = self.sessions[(self.appended + n) % len(self.sessions)]
            await store.append_event(ORG, session_id, Event("user", content(self.rng)))
        self.appended += count
        return time.perf_counter() - began


BULK_SESSIONS = 10
BULK_TRANSACTION = 20_000


def bulk(variant: Variant, count: int) -> float:
    """Grow the index: insert ``count`` events into the bulk sessions through ds_events (its
    triggers index them), BULK_TRANSACTION per transaction, on a connection of its own;
    return the seconds taken. The store never appends to these sessions."""
    began = time.perf_counter()
    con = sqlite3.connect(variant.path, isolation_level=None)
    try:
        done = 0
        while done < count:
            rows = []
            for _ in range(min(BULK_TRANSACTION, count - done)):
                n = variant.bulked
                session, seq = f"b{n % BULK_SESSIONS:03d}", n // BULK_SESSIONS + 1
                rows.append((ORG, session, seq, f"bulk-{n}", _json(content(variant.rng))))
                variant.bulked += 1
            con.execute("BEGIN IMMEDIATE")
            con.executemany(
                "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                "content, state_delta, tokens, timestamp) VALUES (?, ?, ?, ?, 'user', '', ?, "
                "'{}', 0, '2025-01-01 00:00:00.000000')",
                rows,
            )
            con.execute("COMMIT")
            done += len(rows)
    finally:
        con.close()
    return time.perf_counter() - began


def run_sql(path: Path, *sql: str) -> list[Any]:
    """Run statements on a connection of its own; return the rows of the last."""
    with sqlite3.connect(path) as con:
        rows: list[Any] = []
        for statement in sql:
            rows = con.execute(statement).fetchall()
    con.close()
    return rows


async def prepare(variant: Variant, small: int, sessions: int) -> None:
    """Migrate and fill ``small`` events through the store; analyse as the variant says."""
    store = await variant.open()
    await store.migrate()
    manager = Manager(store, app_name="bench-app")
    variant.sessions = [
        (await manager.create(ORG, f"user-{n % 4}", id=f"s{n:03d}")).id for n in range(sessions)
    ]
    for n in range(BULK_SESSIONS):
        await manager.create(ORG, "bulk", id=f"b{n:03d}")
    await variant.append(small)
    await variant.close()
    if variant.name != "never":
        run_sql(variant.path, "ANALYZE")
    if variant.name == "deleted":
        run_sql(variant.path, STAT_DELETE)
    await variant.open()


def stat_of_data(path: Path) -> str:
    """The sqlite_stat1 row of ds_events_fts_data: its row count when analysed, "-" when not."""
    if not run_sql(path, "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"):
        return "-"
    rows = run_sql(path, "SELECT stat FROM sqlite_stat1 WHERE tbl = 'ds_events_fts_data'")
    return rows[0][0] if rows else "-"


def data_rows(path: Path) -> int:
    return int(run_sql(path, "SELECT count(*) FROM ds_events_fts_data")[0][0])


# -- FTS5's own statements and their plans ------------------------------------------------


def traced_fts_statements(path: Path, appends: int) -> list[str]:
    """The statements FTS5 runs on its shadow tables while events are inserted one
    transaction at a time (on a copy of the file; triggers fire as for the store's
    appends), distinct, parameters as ``?``."""
    copy = path.with_name(path.stem + "-trace.db")
    shutil.copy(path, copy)
    seen: list[str] = []
    con = sqlite3.connect(copy, isolation_level=None)
    try:
        _append_each(con, appends, "trace", seen.append)
    finally:
        con.close()
        copy.unlink()
    distinct: list[str] = []
    for statement in seen:
        # Statements run inside another (FTS5's, a trigger's) are reported as "-- SQL".
        statement = statement.removeprefix("-- ")
        if "_fts_data" not in statement and "_fts_idx" not in statement:
            continue
        general = re.sub(r"[xX]'[0-9a-fA-F]*'", "?", statement)
        general = re.sub(r"(?<![\w'])-?\d+(?![\w'])", "?", general)
        if general not in distinct:
            distinct.append(general)
    return distinct


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def plan(path: Path, statement: str) -> str:
    """SQLite's EXPLAIN QUERY PLAN of a statement (parameters bound to 1), on a new
    connection (which reads sqlite_stat1 as the store's connections do)."""
    params = [1] * statement.count("?")
    with sqlite3.connect(path) as con:
        rows = con.execute(f"EXPLAIN QUERY PLAN {statement}", params).fetchall()
    con.close()
    return " | ".join(str(row[-1]) for row in rows)


def _append_each(
    con: Any, appends: int, prefix: str, trace: Callable[[str], object] | None = None
) -> None:
    """Insert ``appends`` events at the end of session s000, one transaction each, as the
    store's appends do (the FTS5 triggers fire); ``trace`` gets every statement they run."""
    (seq,) = con.execute(
        "SELECT coalesce(max(seq), 0) FROM ds_events WHERE org_id = ? AND session_id = ?",
        (ORG, "s000"),
    ).fetchone()
    rng = random.Random(0)
    con.set_trace_callback(trace)
    try:
        for n in range(appends):
            con.execute("BEGIN IMMEDIATE")
            con.execute(
                "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                "content, state_delta, tokens, timestamp) VALUES (?, ?, ?, ?, 'user', '', ?, "
                "'{}', 0, '2025-01-01 00:00:00.000000')",
                (ORG, "s000", seq + n + 1, f"{prefix}-{n}", _json(content(rng))),
            )
            con.execute("COMMIT")
    finally:
        con.set_trace_callback(None)


# -- PRAGMA optimize -----------------------------------------------------------------------

RANGE_DELETE = "DELETE FROM 'main'.'ds_events_fts_data' WHERE id>=? AND id<=?"
"""FTS5's own range delete on its data table (traced in the full run)."""


def _use(con: Any, appends: int = 64) -> None:
    """What a connection of an application does before it closes: appends (FTS5's
    statements on its shadow tables run in the triggers) and a search."""
    _append_each(con, appends, "use")
    con.execute("SELECT rowid FROM ds_events_fts WHERE ds_events_fts MATCH 'w1'").fetchall()


OPTIMIZE_CASES: dict[str, list[str]] = {
    "nothing (never analysed)": [],
    "ANALYZE": ["ANALYZE"],
    "PRAGMA optimize": ["PRAGMA optimize"],
    "PRAGMA optimize=0x10002": ["PRAGMA optimize=0x10002"],
    "appends and a search, then PRAGMA optimize": ["use", "PRAGMA optimize"],
    "PRAGMA optimize=0x10002, appends, PRAGMA optimize": [
        "PRAGMA optimize=0x10002",
        "use",
        "PRAGMA optimize",
    ],
}
"""Each case: what one new connection runs on a copy of the small file ("use": _use)."""


def optimize_cases(source: Path, module: Any) -> list[str]:
    """Each case of OPTIMIZE_CASES on a copy of ``source`` with one SQLite library: the
    stat row of ds_events_fts_data afterwards and the plan of FTS5's range delete."""
    lines = []
    for name, steps in OPTIMIZE_CASES.items():
        copy = source.with_name(f"optimize-{len(lines)}.db")
        shutil.copy(source, copy)
        con = module.connect(copy, isolation_level=None)
        for step in steps:
            if step == "use":
                _use(con)
            else:
                con.execute(step).fetchall()
        con.close()
        con = module.connect(copy)
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
        stat = "-"
        if "sqlite_stat1" in tables:
            found = con.execute(
                "SELECT stat FROM sqlite_stat1 WHERE tbl = 'ds_events_fts_data'"
            ).fetchall()
            stat = found[0][0] if found else "-"
        rows = con.execute(f"EXPLAIN QUERY PLAN {RANGE_DELETE}", (1, 1)).fetchall()
        con.close()
        copy.unlink()
        plan_text = " | ".join(str(row[-1]) for row in rows)
        lines.append(f"| {name} | {stat} | {plan_text} |")
    return lines


def optimize_while_growing(source: Path, module: Any, steps: int = 4) -> list[str]:
    """``PRAGMA optimize=0x10002`` on a new connection (at open, as SQLite's documentation
    recommends) while the index grows, 5,000 events between connections: the stat row of
    ds_events_fts_data and the range delete's plan after each."""
    copy = source.with_name("optimize-growing.db")
    shutil.copy(source, copy)
    rng = random.Random(1)
    lines = []
    try:
        for step in range(steps + 1):
            con = module.connect(copy, isolation_level=None)
            if step:
                con.execute("BEGIN IMMEDIATE")
                for n in range((step - 1) * 5_000, step * 5_000):
                    con.execute(
                        "INSERT INTO ds_events (org_id, session_id, seq, id, author, "
                        "invocation_id, content, state_delta, tokens, timestamp) VALUES "
                        "(?, 'b000', ?, ?, 'user', '', ?, '{}', 0, '2025-01-01 00:00:00.000000')",
                        (ORG, n + 1, f"grow-{n}", _json(content(rng))),
                    )
                con.execute("COMMIT")
            (before,) = con.execute("SELECT count(*) FROM ds_events_fts_data").fetchone()
            con.execute("PRAGMA optimize=0x10002").fetchall()
            found = []
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchall():
                found = con.execute(
                    "SELECT stat FROM sqlite_stat1 WHERE tbl = 'ds_events_fts_data'"
                ).fetchall()
            con.close()
            con = module.connect(copy)
            rows = con.execute(f"EXPLAIN QUERY PLAN {RANGE_DELETE}", (1, 1)).fetchall()
            con.close()
            stat = found[0][0] if found else "-"
            plan_text = " | ".join(str(row[-1]) for row in rows)
            lines.append(f"| {step * 5_000:,} | {before:,} | {stat} | {plan_text} |")
    finally:
        copy.unlink(missing_ok=True)
    return lines


async def run_optimize(args: argparse.Namespace) -> None:
    """The --pragma-optimize check, with Python's sqlite3 and with pysqlite3 if present."""
    tmp = Path(tempfile.mkdtemp(prefix="ds-optimize-"))
    try:
        variant = Variant("never", tmp / "small.db")
        await prepare(variant, args.small, args.sessions)
        await variant.close()
        modules: list[tuple[str, Any]] = [("sqlite3 (Python's)", sqlite3)]
        try:
            import pysqlite3  # type: ignore[import-not-found]

            modules.append(("pysqlite3", pysqlite3))
        except ImportError:
            print("(pysqlite3 is not installed: Python's SQLite only)")
        print(
            f"Python {sys.version.split()[0]}; a file migrated and filled with {args.small} "
            "events through SQLStore, never analysed; each case on a copy, on a new connection"
        )
        for label, module in modules:
            print(f"\n### {label}: SQLite {module.sqlite_version}\n")
            print("| case | sqlite_stat1 of ds_events_fts_data | plan of the range delete |")
            print("|---|---|---|")
            print("\n".join(optimize_cases(variant.path, module)))
            print(
                "\nPRAGMA optimize=0x10002 at each new connection while the index grows:\n\n"
                "| events added | fts_data rows | sqlite_stat1 after | plan after |\n"
                "|---:|---:|---|---|"
            )
            print("\n".join(optimize_while_growing(variant.path, module)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the run --------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ds-analyze-"))
    variants = [Variant(name, tmp / f"{name}.db") for name in VARIANTS]
    print(
        f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}; "
        f"{args.small} events before ANALYZE, then {args.rounds} rounds of {args.per_round} "
        f"appends per variant over {args.sessions} sessions",
        flush=True,
    )
    try:
        for variant in variants:
            await prepare(variant, args.small, args.sessions)
        print("\nsqlite_stat1 of ds_events_fts_data after preparing:")
        for variant in variants:
            print(f"  {variant.name:<8} {stat_of_data(variant.path)}")

        rates: dict[str, list[float]] = {v.name: [] for v in variants}
        bulked: dict[str, list[float]] = {v.name: [] for v in variants}
        print(
            "\n| round | events | fts_data rows | "
            + " | ".join(f"{v.name} /s" for v in variants)
            + " | "
            + " | ".join(f"{v.name} / deleted" for v in variants if v.name != "deleted")
            + " |"
        )
        print("|" + "---:|" * (3 + 2 * len(variants) - 1))
        for number in range(1, args.rounds + 1):
            order = variants[number % len(variants) :] + variants[: number % len(variants)]
            for variant in order:
                if args.bulk:
                    bulked[variant.name].append(args.bulk / bulk(variant, args.bulk))
            for variant in order:
                taken = await variant.append(args.per_round)
                rates[variant.name].append(args.per_round / taken)
            ratios = {
                v.name: rates[v.name][-1] / rates["deleted"][-1]
                for v in variants
                if v.name != "deleted"
            }
            print(
                f"| {number} | {variants[0].appended + variants[0].bulked:,} | "
                f"{data_rows(variants[0].path):,} | "
                + " | ".join(f"{rates[v.name][-1]:,.0f}" for v in variants)
                + " | "
                + " | ".join(f"{ratio:.2f}" for ratio in ratios.values())
                + " |",
                flush=True,
            )
            if number == args.rounds // 2:
                regrown = next(v for v in variants if v.name == "regrown")
                await regrown.close()
                run_sql(regrown.path, "ANALYZE")
                await regrown.open()
                print(f"|  | regrown analysed again: {stat_of_data(regrown.path)} |")
        for variant in variants:
            await variant.close()

        print("\nMedian appends/s over the last half of the rounds, as a ratio of deleted's:")
        half = args.rounds // 2
        base = statistics.median(rates["deleted"][half:])
        for variant in variants:
            median = statistics.median(rates[variant.name][half:])
            print(f"  {variant.name:<8} {median:,.0f}/s  {median / base:.2f}x")

        if args.bulk:
            print("\nBulk inserts/s (20,000 a transaction) per round:")
            for variant in variants:
                figures = ", ".join(f"{rate:,.0f}" for rate in bulked[variant.name])
                print(f"  {variant.name:<8} {figures}")

        print("\nsqlite_stat1 of ds_events_fts_data at the end:")
        for variant in variants:
            print(f"  {variant.name:<8} {stat_of_data(variant.path)}")

        statements = traced_fts_statements(variants[1].path, args.trace)
        print(f"\nFTS5's statements on its shadow tables during {args.trace} appends, and plans:")
        for statement in statements:
            print(f"\n  {statement}")
            for variant in variants:
                print(f"    {variant.name:<8} {plan(variant.path, statement)}")
    finally:
        for variant in variants:
            await variant.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sqlite_analyze", description=__doc__
    )
    parser.add_argument("--small", type=int, default=50, help="events before ANALYZE")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=1500, help="appends per variant")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument(
        "--bulk", type=int, default=0, help="events inserted per variant before each round"
    )
    parser.add_argument("--trace", type=int, default=64, help="appends traced at the end")
    parser.add_argument(
        "--pragma-optimize",
        action="store_true",
        help="only check what PRAGMA optimize writes and the plan it leads to",
    )
    args = parser.parse_args(argv)
    asyncio.run(run_optimize(args) if args.pragma_optimize else run(args))


if __name__ == "__main__":
    main()
