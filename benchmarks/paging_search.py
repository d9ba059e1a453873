"""Paging and search at scale (#14): page 1 against page 1,000, search over 1M events.

``python -m benchmarks.paging_search [paging|search|writes|all] --backend sqlite|postgres|all``

- ``paging``: N sessions (1M by default) in one organisation, a tenth of them one user's.
  ``list_page`` of 100 is timed at page 1 and at page 1,000 (reached by walking the
  cursors), for the whole organisation and for the user; beside it, for scale, the same
  page read with ``OFFSET`` in plain SQL (what keyset pages replace).
- ``search``: M events (1M by default) in 10,000 sessions, each an ADK-shaped content of
  12 words drawn from a Zipf vocabulary of 20,000 words, plus a second organisation of the
  same size. ``search(limit=20)`` is timed for words that 10, 1,000, 10,000 and 100,000
  events hold, two words together, and narrowed to one user.
- ``writes``: what the full-text index costs an append: ``append_event`` on revision 0002
  (no index) against head, on fresh databases (and, from ``search``, on its database of
  2M indexed events).

Seeding is bulk (COPY on Postgres, transactions of 20,000 rows on SQLite); every timed
operation goes through the library's public API. Times are medians (and p95) of
``--rounds`` runs, in milliseconds. Results: ``--json`` (and a Markdown table on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import os
import platform
import random
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, SQLStore
from durable_sessions.sql.migrate import upgrade

from .common import Database, command_line, new_tmpdir, raw_pg_dsn, run_meta

ORG = "bench"
OTHER_ORG = "bench-other"
USER = "pager"
PAGE = 100
DEEP = 1_000
VOCABULARY = 20_000
WORDS_PER_EVENT = 12
SESSIONS_FOR_EVENTS = 10_000
START = datetime(2025, 1, 1, tzinfo=timezone.utc)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1000, "p95_ms": p95 * 1000}


async def _timed(op: Callable[[], Awaitable[Any]], rounds: int) -> tuple[dict[str, float], Any]:
    result = await op()  # warm: plans, caches
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        result = await op()
        samples.append(time.perf_counter() - began)
    return _ms(samples), result


# -- seeding -------------------------------------------------------------------------------


def _session_rows(count: int, org: str, prefix: str) -> list[tuple[Any, ...]]:
    """Sessions updated one second apart (newest last), every tenth of user USER."""
    return [
        (
            org, f"{prefix}{n:07d}", USER if n % 10 == 0 else f"u{n % 1000}", "app", "",
            "{}", None, START + timedelta(seconds=n), START + timedelta(seconds=n),
            0, 0, 0, 1, "",
        )
        for n in range(count)
    ]  # fmt: skip


SESSION_COLUMNS = [
    "org_id", "id", "user_id", "app_name", "title", "state", "parent_id", "created_at",
    "updated_at", "message_count", "token_total", "event_seq", "version", "incarnation",
]  # fmt: skip
EVENT_COLUMNS = [
    "org_id", "session_id", "seq", "id", "author", "invocation_id", "content", "state_delta",
    "tokens", "timestamp",
]  # fmt: skip


async def _bulk(
    db: Database, table: str, columns: list[str], rows: list[tuple[Any, ...]], analyze: bool
) -> None:
    """Insert rows as fast as each database takes them: COPY, or SQLite transactions.

    ``analyze`` only once the full-text index holds what it will hold: SQLite plans FTS5's
    own range deletes on a shadow table analyzed while nearly empty as full scans, and every
    later append then reads the whole index (see the README's search notes).
    """
    if db.backend == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        con = await asyncpg.connect(raw_pg_dsn(db.url))
        try:
            for start in range(0, len(rows), 100_000):
                await con.copy_records_to_table(
                    table, records=rows[start : start + 100_000], columns=columns
                )
            if analyze:
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
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
        for start in range(0, len(rows), 20_000):  # one huge transaction spills and crawls
            with con:
                con.executemany(
                    sql, ([stored(v) for v in row] for row in rows[start : start + 20_000])
                )
        if analyze:
            con.execute("ANALYZE")
    finally:
        con.close()


def _zipf(rng: random.Random) -> Callable[[], int]:
    weights = list(itertools.accumulate(1 / (rank**1.07) for rank in range(1, VOCABULARY + 1)))
    top = weights[-1]
    return lambda: bisect.bisect(weights, rng.random() * top)


def _corpus(count: int, seed: int) -> tuple[list[list[str]], Counter[str]]:
    """``count`` events of WORDS_PER_EVENT Zipf words, and each word's event frequency."""
    rng = random.Random(seed)
    draw = _zipf(rng)
    texts = [[f"w{draw()}" for _ in range(WORDS_PER_EVENT)] for _ in range(count)]
    frequency: Counter[str] = Counter()
    for words in texts:
        frequency.update(set(words))
    return texts, frequency


def _event_rows(org: str, texts: list[list[str]]) -> list[tuple[Any, ...]]:
    per_session = max(1, len(texts) // SESSIONS_FOR_EVENTS)
    rows = []
    for n, words in enumerate(texts):
        session, seq = divmod(n, per_session)
        content = {"parts": [{"text": " ".join(words).capitalize() + "."}], "role": "user"}
        rows.append(
            (
                org, f"s{session:07d}", seq + 1, f"{org}-e{n}", "user", "",
                json.dumps(content), "{}", 0, START + timedelta(seconds=n),
            )
        )  # fmt: skip
    return rows


# -- the measurements ------------------------------------------------------------------------


async def _offset_page(engine: AsyncEngine, user: str | None, offset: int) -> int:
    where = "org_id = :org" + (" AND user_id = :user" if user else "")
    sql = (
        "SELECT org_id, id, user_id, app_name, title, parent_id, created_at, updated_at, "
        f"message_count, token_total, version FROM ds_sessions WHERE {where} "
        f"ORDER BY updated_at DESC, id DESC LIMIT {PAGE} OFFSET {offset}"
    )
    from sqlalchemy import text

    async with engine.connect() as conn:
        rows = await conn.execute(text(sql), {"org": ORG, "user": user})
        return len(rows.all())


async def paging(db: Database, sessions: int, rounds: int) -> list[dict[str, Any]]:
    began = time.perf_counter()
    await _bulk(db, "ds_sessions", SESSION_COLUMNS, _session_rows(sessions, ORG, "p"), True)
    print(f"  seeded {sessions:,} sessions in {time.perf_counter() - began:.0f} s", flush=True)
    engine = create_async_engine(db.url)
    store = SQLStore(engine)
    out = []
    try:
        for user in (None, USER):
            filter = Filter(ORG, user_id=user, limit=PAGE)
            cursors: list[str | None] = [None]
            walk = time.perf_counter()
            page = await store.list_page(filter)
            while len(cursors) < DEEP and page.next_cursor is not None:
                cursors.append(page.next_cursor)
                page = await store.list_page(filter, cursor=page.next_cursor)
            walked = time.perf_counter() - walk
            depth = len(cursors)
            for number in (1, depth):
                cursor = cursors[number - 1]
                timing, found = await _timed(
                    lambda c=cursor, f=filter: store.list_page(f, cursor=c), rounds
                )
                assert len(found.sessions) == PAGE
                offset, _ = await _timed(
                    lambda n=number, u=user: _offset_page(engine, u, (n - 1) * PAGE), rounds
                )
                out.append(
                    {
                        "part": "paging", "backend": db.backend, "sessions": sessions,
                        "filter": "user (1/10)" if user else "organisation", "page": number,
                        **timing, "offset_median_ms": offset["median_ms"],
                        "walk_pages_per_s": depth / walked,
                    }
                )  # fmt: skip
                print(f"  {out[-1]}", flush=True)
    finally:
        await engine.dispose()
    return out


async def search(db: Database, events: int, rounds: int) -> list[dict[str, Any]]:
    texts, frequency = _corpus(events, seed=14)
    began = time.perf_counter()
    count = min(SESSIONS_FOR_EVENTS, events)
    for org in (ORG, OTHER_ORG):
        await _bulk(db, "ds_sessions", SESSION_COLUMNS, _session_rows(count, org, "s"), False)
        org_texts = texts if org == ORG else _corpus(events, seed=15)[0]
        last = org == OTHER_ORG
        await _bulk(db, "ds_events", EVENT_COLUMNS, _event_rows(org, org_texts), last)
    print(
        f"  seeded 2 x {events:,} events (indexed) in {time.perf_counter() - began:.0f} s",
        flush=True,
    )
    by_frequency = sorted(frequency.items(), key=lambda item: item[1])
    counts = [n for _, n in by_frequency]

    def word_held_by(target: int) -> str:
        return by_frequency[min(bisect.bisect_left(counts, target), len(counts) - 1)][0]

    rare, medium, common = word_held_by(10), word_held_by(1_000), word_held_by(10_000)
    commonest = word_held_by(100_000)
    queries = [
        (rare, {}), (medium, {}), (common, {}), (commonest, {}),
        (f"{common} {rare}", {}), (f"{commonest} {common}", {}), (common, {"user_id": USER}),
    ]  # fmt: skip
    engine = create_async_engine(db.url)
    store = SQLStore(engine)
    out = []
    try:
        for text, narrow in queries:
            timing, hits = await _timed(
                lambda t=text, n=narrow: store.search(ORG, t, limit=20, **n), rounds
            )
            holding = sum(all(w in set(ws) for w in text.split()) for ws in texts)
            out.append(
                {
                    "part": "search", "backend": db.backend, "events": events,
                    "query": text, "narrowed": ",".join(narrow) or "", "events_holding": holding,
                    "hits": len(hits), **timing,
                }
            )  # fmt: skip
            print(f"  {out[-1]}", flush=True)
        # Appends to this database: the index holds 2M events already.
        per_session = max(1, events // SESSIONS_FOR_EVENTS)
        async with engine.begin() as conn:  # the seeded sessions' seqs, as appends left them
            await conn.exec_driver_sql(
                f"UPDATE ds_sessions SET event_seq = {per_session}, message_count = {per_session}"
            )
        samples = []
        extra, _ = _corpus(1_000, seed=4)
        for n, words in enumerate(extra):
            content = {"parts": [{"text": " ".join(words)}], "role": "user"}
            began = time.perf_counter()
            await store.append_event(ORG, f"s{n % count:07d}", Event("user", content=content))
            samples.append(time.perf_counter() - began)
        out.append(
            {
                "part": "writes", "backend": db.backend, "revision": f"head, {2 * events:,} events",
                "appends": len(samples), **_ms(samples[100:]),
            }
        )  # fmt: skip
        print(f"  {out[-1]}", flush=True)
    finally:
        await engine.dispose()
    return out


async def writes(db: Database, appends: int) -> list[dict[str, Any]]:
    """Appends on revision 0002 and on head, in alternating blocks of 100 (a shared machine's
    load then weighs on both alike), to fresh databases."""
    other = Database(db.backend, "ps_writes_0002", Path(db.path).parent)
    await other.create()
    try:
        targets = []
        for revision, where in (("0002", other), ("head", db)):
            engine = create_async_engine(where.url)
            await upgrade(engine, revision)
            store = SQLStore(engine)
            manager = Manager(store)
            sessions = [(await manager.create(ORG, USER)).id for _ in range(10)]
            targets.append((revision, engine, store, sessions, []))
        texts, _ = _corpus(appends, seed=3)
        for block in range(0, appends, 100):
            for _, _, store, sessions, samples in targets:
                for n in range(block, min(block + 100, appends)):
                    content = {"parts": [{"text": " ".join(texts[n])}], "role": "user"}
                    event = Event("user", content=content)
                    began = time.perf_counter()
                    await store.append_event(ORG, sessions[n % 10], event)
                    samples.append(time.perf_counter() - began)
        out = []
        for revision, engine, _, _, samples in targets:
            await engine.dispose()
            out.append(
                {
                    "part": "writes", "backend": db.backend, "revision": revision,
                    "appends": appends, **_ms(samples[100:]),
                }
            )  # fmt: skip
            print(f"  {out[-1]}", flush=True)
        return out
    finally:
        await other.drop()


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    parts = ["paging", "search", "writes"] if args.what == "all" else [args.what]
    tmpdir = new_tmpdir()
    rows: list[dict[str, Any]] = []
    for backend in backends:
        for part in parts:
            print(f"{backend}: {part}", flush=True)
            db = Database(backend, f"ps_{part}", tmpdir)
            await db.create()
            try:
                if part == "writes":
                    rows += await writes(db, args.appends)
                    continue
                engine = create_async_engine(db.url)
                try:
                    await SQLStore(engine).migrate()
                finally:
                    await engine.dispose()
                if part == "paging":
                    rows += await paging(db, args.sessions, args.rounds)
                else:
                    rows += await search(db, args.events, args.rounds)
            finally:
                await db.drop()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    paging = [r for r in rows if r["part"] == "paging"]
    if paging:
        lines += [
            "| backend | sessions | listing | page | median ms | p95 ms | OFFSET median ms |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['backend']} | {r['sessions']:,} | {r['filter']} | {r['page']:,} | "
            f"{r['median_ms']:.2f} | {r['p95_ms']:.2f} | {r['offset_median_ms']:.2f} |"
            for r in paging
        ]
        lines.append("")
    found = [r for r in rows if r["part"] == "search"]
    if found:
        lines += [
            "| backend | events | query | narrowed | events holding it | median ms | p95 ms |",
            "|---|---:|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {r['backend']} | {r['events']:,} | `{r['query']}` | {r['narrowed']} | "
            f"{r['events_holding']:,} | {r['median_ms']:.2f} | {r['p95_ms']:.2f} |"
            for r in found
        ]
        lines.append("")
    written = [r for r in rows if r["part"] == "writes"]
    if written:
        lines += ["| backend | schema | append_event median ms | p95 ms |", "|---|---|---:|---:|"]
        lines += [
            f"| {r['backend']} | {r['revision']} | {r['median_ms']:.3f} | {r['p95_ms']:.3f} |"
            for r in written
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks run paging-search")
    parser.add_argument("what", choices=["paging", "search", "writes", "all"], nargs="?",
                        default="all")  # fmt: skip
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    machine = {"python": platform.python_version(), "cpus": os.cpu_count()}
    meta = run_meta(args, command_line())
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine, "meta": meta, "rows": rows}
    (args.out / "paging_search.json").write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(rows)
    (args.out / "paging_search.md").write_text(f"# Paging and search\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
