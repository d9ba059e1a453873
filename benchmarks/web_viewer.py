"""The web viewer's pages at scale (#38): a list page over 1M sessions, a 100k-event transcript.

``python -m benchmarks.web_viewer [--quick] [--backend sqlite|postgres|all] [--rounds N]``

Each backend gets a fresh database (a SQLite file, or a Postgres database created beside
``DURABLE_SESSIONS_BENCH_POSTGRES_URL`` and dropped afterwards), migrated, then seeded in
bulk: N sessions in one organisation (1M; ``--quick`` 20k) as raw rows, a tenth of them
one user's, and one more session holding a transcript of M events (100k; ``--quick`` 5k)
appended through the store in batches. Each page is then requested through the viewer's
ASGI application (httpx's ``ASGITransport``, no sockets), as a browser asks for it, and
timed end to end: the store's statements, the template, the response. Times are p50 and
p90 of ``--rounds`` requests in milliseconds, after one untimed request of each.
Results: ``benchmarks/results/web_viewer.md`` (and the same table on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Filter, Session, SQLStore
from durable_sessions.web import create_app

from .common import Database, migrate_schema, new_tmpdir, raw_pg_dsn

ORG = "bench"
USER = "pager"
LONG = "long-transcript"
START = datetime(2025, 1, 1, tzinfo=timezone.utc)
BATCH = 1_000
RESULTS = Path(__file__).parent / "results" / "web_viewer.md"
SESSION_COLUMNS = [
    "org_id", "id", "user_id", "app_name", "title", "state", "parent_id", "created_at",
    "updated_at", "message_count", "token_total", "event_seq", "version", "incarnation",
]  # fmt: skip


def _session_rows(count: int) -> list[tuple[Any, ...]]:
    """Sessions updated one second apart (newest last), every tenth of user USER."""
    return [
        (
            ORG, f"s{n:07d}", USER if n % 10 == 0 else f"u{n % 1000}", "app",
            f"Conversation {n}", "{}", None, START + timedelta(seconds=n),
            START + timedelta(seconds=n), 0, 0, 0, 1, "",
        )
        for n in range(count)
    ]  # fmt: skip


async def _bulk_sessions(db: Database, count: int) -> None:
    """Insert ``count`` session rows: COPY on Postgres, transactions of 20k on SQLite."""
    rows = _session_rows(count)
    if db.backend == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        con = await asyncpg.connect(raw_pg_dsn(db.url))
        try:
            for start in range(0, len(rows), 100_000):
                await con.copy_records_to_table(
                    "ds_sessions", records=rows[start : start + 100_000], columns=SESSION_COLUMNS
                )
            await con.execute("ANALYZE")
        finally:
            await con.close()
        return

    def stored(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        return value

    con = sqlite3.connect(db.path)
    try:
        marks = ", ".join("?" for _ in SESSION_COLUMNS)
        sql = f"INSERT INTO ds_sessions ({', '.join(SESSION_COLUMNS)}) VALUES ({marks})"
        for start in range(0, len(rows), 20_000):
            with con:
                con.executemany(
                    sql, ([stored(v) for v in row] for row in rows[start : start + 20_000])
                )
        con.execute("ANALYZE")
    finally:
        con.close()


async def _long_transcript(store: SQLStore, events: int) -> None:
    """One session of ``events`` ADK-shaped events, appended in batches through the store."""
    await store.create(Session(id=LONG, org_id=ORG, user_id=USER, app_name="app", title="Long"))
    for first in range(0, events, BATCH):
        batch = [
            Event(
                author="user" if n % 2 else "agent",
                content={
                    "role": "user",
                    "parts": [{"text": f"Turn {n}: the tram leaves at {n % 24}h."}],
                },
                tokens=12,
                timestamp=START + timedelta(seconds=n),
            )
            for n in range(first, min(first + BATCH, events))
        ]
        await store.append_events(ORG, LONG, batch)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p90 * 1000


async def _time_page(client: httpx.AsyncClient, url: str, rounds: int) -> tuple[float, float, int]:
    warm = await client.get(url)
    assert warm.status_code == 200, (url, warm.status_code, warm.text[:300])
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        response = await client.get(url)
        samples.append(time.perf_counter() - began)
        assert response.status_code == 200
    p50, p90 = _percentiles(samples)
    return p50, p90, len(warm.content)


async def run_backend(
    backend: str, sessions: int, events: int, rounds: int, tmpdir: Path
) -> list[dict[str, Any]]:
    db = Database(backend, "web", tmpdir)
    await db.create()
    try:
        await migrate_schema(db.url)
        began = time.perf_counter()
        await _bulk_sessions(db, sessions)
        seeded_sessions = time.perf_counter() - began
        engine = create_async_engine(db.url)
        try:
            store = SQLStore(engine)
            began = time.perf_counter()
            await _long_transcript(store, events)
            seeded_events = time.perf_counter() - began
            print(
                f"  {backend}: seeded {sessions:,} sessions in {seeded_sessions:.0f} s, "
                f"{events:,} events in {seeded_events:.0f} s",
                flush=True,
            )
            middle = await store.list_page(Filter(org_id=ORG, limit=50))
            assert middle.next_cursor is not None
            pages: list[tuple[str, str]] = [
                ("sessions, first page", f"/orgs/{ORG}"),
                ("sessions, one user's first page", f"/orgs/{ORG}?user={USER}"),
                ("sessions, second page (cursor)", f"/orgs/{ORG}?cursor={middle.next_cursor}"),
                ("transcript, first page", f"/orgs/{ORG}/sessions/{LONG}"),
                (
                    "transcript, last page",
                    f"/orgs/{ORG}/sessions/{LONG}?after_seq={events - 50}",
                ),
                (
                    "transcript, middle page",
                    f"/orgs/{ORG}/sessions/{LONG}?after_seq={events // 2}",
                ),
            ]
            transport = httpx.ASGITransport(app=create_app(store))
            out = []
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                for label, url in pages:
                    p50, p90, size = await _time_page(client, url, rounds)
                    out.append(
                        {
                            "backend": backend,
                            "page": label,
                            "p50_ms": p50,
                            "p90_ms": p90,
                            "bytes": size,
                        }
                    )
                    print(f"  {backend:8} {label:34} p50 {p50:7.2f} ms  p90 {p90:7.2f} ms")
            return out
        finally:
            await engine.dispose()
    finally:
        await db.drop()


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | page | p50 ms | p90 ms | page bytes |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['backend']} | {row['page']} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} "
            f"| {row['bytes']:,} |"
        )
    return "\n".join(lines)


def _report(rows: list[dict[str, Any]], sessions: int, events: int, rounds: int) -> str:
    machine = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"
    return (
        "# Web viewer: page times at scale\n\n"
        f"`python -m benchmarks.web_viewer` with {sessions:,} sessions in one organisation "
        f"and one transcript of {events:,} events, {rounds} timed requests per page through "
        "the ASGI application (httpx ASGITransport: store statements, template, response; "
        f"no sockets). {machine}; measured {datetime.now(timezone.utc):%Y-%m-%d}.\n\n"
        f"{_table(rows)}\n\n"
        "Lists are one statement (a range of the `(org_id[, user_id], updated_at, id)` "
        "index from the cursor), transcript pages two (the session, then a range of "
        "`(org_id, session_id, seq)` after `after_seq`): the time does not grow with the "
        "number of sessions or events before the page.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.web_viewer", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20k sessions, 5k events")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=0, help="requests per page (30/100)")
    parser.add_argument("--sessions", type=int, default=0, help="override the session count")
    parser.add_argument("--events", type=int, default=0, help="override the event count")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    sessions = args.sessions or (20_000 if args.quick else 1_000_000)
    events = args.events or (5_000 if args.quick else 100_000)
    rounds = args.rounds or (30 if args.quick else 100)
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    tmpdir = new_tmpdir()
    rows: list[dict[str, Any]] = []
    for backend in backends:
        rows += asyncio.run(run_backend(backend, sessions, events, rounds, tmpdir))
    report = _report(rows, sessions, events, rounds)
    print()
    print(report)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
