"""What the final ANALYZE of an import costs: a JSONL import with and without it.

``import_jsonl`` ends (as ``import_adk`` does) with ``ANALYZE`` of the tables it filled
(``sql/loader.py``). Each of ``--rounds`` rounds imports the same generated export
(``--events`` events in sessions of ``--per-session``, with user: and app: state) into a
new migrated database once as shipped and once with the loader's final ANALYZE left out,
the order alternating from round to round, then times that ANALYZE alone on the second
database. On SQLite and Postgres.

    python -m benchmarks run import-analyze [-- --events 100000 --rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partialmethod
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import SQLStore
from durable_sessions.sql import loader
from durable_sessions.sql.transfer import dumps, import_jsonl

from .common import Database, command_line, migrate_schema, new_tmpdir, run_meta

TABLES = "ds_sessions, ds_events, ds_user_state, ds_app_state"


def export_lines(events: int, per_session: int) -> bytes:
    """An export of ``events`` events in sessions of ``per_session``, and shared state."""
    when = "2025-01-02T03:04:05.000006Z"
    out = [dumps({"format": "durable-sessions", "type": "header", "version": 1})]
    sessions = max(1, events // per_session)
    for s in range(sessions):
        count = per_session if s < sessions - 1 else events - per_session * (sessions - 1)
        out.append(dumps({
            "type": "session", "org_id": "bench", "id": f"s{s:07d}", "user_id": f"u{s % 97}",
            "app_name": "app", "title": f"session {s}", "state": {"step": s},
            "parent_id": None, "created_at": when, "updated_at": when,
            "message_count": count, "token_total": count * 3, "event_seq": count, "version": 1,
        }))  # fmt: skip
        for n in range(1, count + 1):
            out.append(dumps({
                "type": "event", "org_id": "bench", "session_id": f"s{s:07d}", "seq": n,
                "id": f"e{s}-{n}", "author": "user" if n % 2 else "model",
                "invocation_id": f"i{n // 2}", "content": {"text": f"message {n} of {s} " * 4},
                "state_delta": {}, "tokens": 3, "timestamp": when,
            }))  # fmt: skip
    shared = {"org_id": "bench", "app_name": "app", "updated_at": when}
    for u in range(97):
        user = {"type": "user_state", "user_id": f"u{u}", "key": "lang", "value": "fr"}
        out.append(dumps({**shared, **user}))
    out.append(dumps({**shared, "type": "app_state", "key": "tier", "value": "gold"}))
    return ("\n".join(out) + "\n").encode()


@contextmanager
def final_analyze(on: bool) -> Iterator[None]:
    """The loader's final ANALYZE on or off (this benchmark process only)."""
    original = loader.Loader.finish
    if not on:
        loader.Loader.finish = partialmethod(original, analyze=False)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        loader.Loader.finish = original  # type: ignore[method-assign]


async def one_import(database: Database, data: bytes, analyze: bool) -> tuple[float, float]:
    """Seconds of the import into a new migrated database, and of ANALYZE run afterwards
    (0 when the import ran its own)."""
    await database.create()
    try:
        await migrate_schema(database.url)
        engine = create_async_engine(database.url)
        try:
            with final_analyze(analyze):
                start = time.perf_counter()
                await import_jsonl(SQLStore(engine), io.BytesIO(data))
                took = time.perf_counter() - start
            after = 0.0
            if not analyze:
                async with engine.begin() as conn:
                    start = time.perf_counter()
                    if database.backend == "sqlite":
                        for table in TABLES.split(", "):
                            await conn.exec_driver_sql(f"ANALYZE {table}")
                    else:
                        await conn.exec_driver_sql(f"ANALYZE {TABLES}")
                    after = time.perf_counter() - start
            return took, after
        finally:
            await engine.dispose()
    finally:
        await database.drop()


async def measure(backend: str, data: bytes, rounds: int, tmpdir: Path) -> dict[str, Any]:
    found: dict[str, list[float]] = {"with": [], "without": [], "analyze": []}
    for n in range(rounds):
        for analyze in (True, False) if n % 2 == 0 else (False, True):
            database = Database(backend, f"import{n}{int(analyze)}", tmpdir)
            took, after = await one_import(database, data, analyze)
            found["with" if analyze else "without"].append(took)
            if not analyze:
                found["analyze"].append(after)
            print(f"{backend} round {n + 1} {'with' if analyze else 'without'}: {took:.2f} s")
    return found


def summarize(results: dict[str, dict[str, list[float]]], events: int) -> list[str]:
    lines = [
        f"| dialect | import of {events:,} events, with the final ANALYZE | without | "
        "difference | the ANALYZE alone, afterwards |",
        "|---|---|---|---|---|",
    ]
    for backend, found in results.items():
        with_, without = statistics.median(found["with"]), statistics.median(found["without"])
        alone = statistics.median(found["analyze"])
        lines.append(
            f"| {backend} | {with_:.2f} s | {without:.2f} s | {with_ - without:+.2f} s "
            f"({(with_ - without) / without:+.1%}) | {alone:.3f} s |"
        )
    lines.append("")
    lines.append(f"Medians of {len(found['with'])} rounds; every round's figures are in the JSON.")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print each import's time, then the medians with and without the final ANALYZE."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks run import-analyze")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--per-session", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    data = export_lines(args.events, args.per_session)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    tmpdir = new_tmpdir()
    try:
        results = {
            backend: asyncio.run(measure(backend, data, args.rounds, tmpdir))
            for backend in backends
        }
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    lines = summarize(results, args.events)
    print("\n".join(lines))
    meta = run_meta(args, command_line())
    args.out.mkdir(parents=True, exist_ok=True)
    data_out = {"meta": meta, "events": args.events, "results": results}
    (args.out / "import_analyze.json").write_text(json.dumps(data_out, indent=1) + "\n")
    (args.out / "import_analyze.md").write_text(
        "# The final ANALYZE of an import\n\n" + "\n".join(lines) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
