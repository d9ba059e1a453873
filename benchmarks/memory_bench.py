"""Long-term memory: search over one user's memories inside a large organisation, adding a
long session, and ADK's own memory services beside it.

``python -m benchmarks.memory_bench [--backend sqlite|postgres|all] [--quick] [--out DIR]``

- ``search``: ``--org-memories`` memories (1M by default) in one organisation, of which
  ``--user-memories`` (100k) are one user's and the rest spread over other users, each 12
  words drawn from a Zipf vocabulary of 20,000 words. ``DurableMemoryService.search_memory``
  (10 results) is timed for ``--queries`` questions of that user: a few common words and
  one or two rarer ones, as a user's message reads; then questions of common words only
  (the most memories to rank), and a whole message of 300 words.
- ``add``: ``add_session_to_memory`` of a ``--session-events`` event ADK session (1,000)
  for a new user, then of the same session again (nothing new to add).
- ``beside``: ADK's ``InMemoryMemoryService`` and, when the installed ADK has it, its
  ``SqliteMemoryService``, holding the same user's memories (only that user's: neither has
  organisations): the same searches and the same session.
- ``recall``: the top-3 hit rate of every service on ``benchmarks.memory_corpus`` (20
  questions asked in other words than their answers, among 200 distracting memories).

Seeding is bulk (COPY on Postgres, transactions of 20,000 rows on SQLite, the terms
computed as the store computes them); every timed operation goes through a service's
public API. Times are medians (p50) and p95 in milliseconds. Results: ``memory.json`` and
``memory.md`` in ``--out`` (``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import random
import sqlite3
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import SQLStore
from durable_sessions.memories import stored_terms

from .common import Database, command_line, migrate_schema, new_tmpdir, raw_pg_dsn, run_meta
from .memory_corpus import ANSWERS, CORPUS, QUESTIONS

ORG = "bench"
APP = "assistant"
USER = "ada"
VOCABULARY = 20_000
WORDS = 12
START = datetime(2025, 1, 1, tzinfo=timezone.utc)
RESULTS = Path(__file__).resolve().parent / "results"
QUICK_ARGS = ["--quick"]

COLUMNS = [
    "org_id", "app_name", "user_id", "id", "author", "timestamp", "text", "content",
    "metadata", "session_id", "seq", "terms",
]  # fmt: skip


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p95_ms": p95 * 1000}


async def _each(ops: list[Callable[[], Awaitable[Any]]], rounds: int) -> dict[str, float]:
    """Time every op ``rounds`` times (after one warm-up run of each)."""
    for op in ops:
        await op()
    samples = []
    for _ in range(rounds):
        for op in ops:
            began = time.perf_counter()
            await op()
            samples.append(time.perf_counter() - began)
    return _ms(samples)


class Words:
    """Pseudo-words of a Zipf vocabulary: ``w1`` the most common."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        weights = list(itertools.accumulate(1 / (r**1.07) for r in range(1, VOCABULARY + 1)))
        self.weights, self.top = weights, weights[-1]

    def draw(self) -> str:
        return f"w{bisect.bisect(self.weights, self.rng.random() * self.top) + 1}"

    def text(self, n: int = WORDS) -> str:
        return " ".join(self.draw() for _ in range(n))

    def question(self) -> str:
        """A user's question: four common words, one or two rarer ones."""
        common = [f"w{self.rng.randint(1, 20)}" for _ in range(4)]
        rare = [f"w{self.rng.randint(200, 5000)}" for _ in range(self.rng.randint(1, 2))]
        return " ".join(common + rare)

    def common_only(self) -> str:
        return " ".join(f"w{self.rng.randint(1, 10)}" for _ in range(5))


def _row(org: str, user: str, n: int, text: str) -> tuple[Any, ...]:
    content = json.dumps({"parts": [{"text": text}], "role": "user"})
    stamp = START + timedelta(seconds=n)
    terms = stored_terms(org, APP, user, text)
    return (org, APP, user, f"m{n:08d}", "user", stamp, text, content, "{}", None, None, terms)


def _term_counts(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ``ds_memory_terms`` rows of seeded memories, as the store's writes keep them."""
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for row in rows:
        org, app, user = row[0], row[1], row[2]
        counts[(org, app, user, "")] += 1
        counts.update((org, app, user, term) for term in row[-1].split(" ")[1:])
    return [(*key, n) for key, n in counts.items()]


TERM_COLUMNS = ["org_id", "app_name", "user_id", "term", "n"]


async def _seed(db: Database, rows: list[tuple[Any, ...]]) -> None:
    """Insert memories (and their term counts) as fast as each database takes them: COPY,
    or SQLite transactions."""
    counted = _term_counts(rows)
    if db.backend == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        con = await asyncpg.connect(raw_pg_dsn(db.url))
        try:
            for table, columns, records in (
                ("ds_memories", COLUMNS, rows),
                ("ds_memory_terms", TERM_COLUMNS, counted),
            ):
                for start in range(0, len(records), 100_000):
                    await con.copy_records_to_table(
                        table, records=records[start : start + 100_000], columns=columns
                    )
            await con.execute("VACUUM ANALYZE")
        finally:
            await con.close()
        return
    con = sqlite3.connect(db.path)
    try:
        marks = ", ".join("?" for _ in COLUMNS)
        sql = f"INSERT INTO ds_memories ({', '.join(COLUMNS)}) VALUES ({marks})"
        for start in range(0, len(rows), 20_000):
            with con:
                con.executemany(
                    sql,
                    (
                        (*r[:5], r[5].strftime("%Y-%m-%d %H:%M:%S.%f"), *r[6:])
                        for r in rows[start : start + 20_000]
                    ),
                )
        with con:
            con.executemany("INSERT INTO ds_memory_terms VALUES (?, ?, ?, ?, ?)", counted)
        con.execute("ANALYZE")
    finally:
        con.close()


def _corpus(org_size: int, user_size: int) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Every row of the organisation, and the texts of the user's memories."""
    words = Words(7)
    rows, mine = [], []
    others = max(1, (org_size - user_size) // 1000)
    for n in range(org_size):
        text = words.text()
        if n % max(1, org_size // user_size) == 0 and len(mine) < user_size:
            rows.append(_row(ORG, USER, n, text))
            mine.append(text)
        else:
            rows.append(_row(ORG, f"user-{n % others}", n, text))
    return rows, mine


def _adk_session(user: str, texts: list[str], session_id: str) -> Any:
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session
    from google.genai import types

    events = [
        Event(
            id=f"{session_id}-{i}",
            author="user",
            timestamp=START.timestamp() + i,
            content=types.Content(role="user", parts=[types.Part(text=text)]),
        )
        for i, text in enumerate(texts)
    ]
    return Session(app_name=APP, user_id=user, id=session_id, events=events)


def _top3_hits(found: list[list[str]]) -> float:
    hits = sum(answer in texts[:3] for answer, texts in zip(ANSWERS, found, strict=True))
    return hits / len(ANSWERS)


def _texts(response: Any) -> list[str]:
    return [" ".join(p.text for p in m.content.parts if p.text) for m in response.memories]


async def _recall(service: Any) -> float:
    """The top-3 hit rate of a memory service on the fixed corpus (a user of its own)."""
    session = _adk_session("recall", CORPUS, "recall")
    await service.add_session_to_memory(session)
    found = []
    for question in QUESTIONS:
        response = await service.search_memory(app_name=APP, user_id="recall", query=question)
        found.append(_texts(response))
    return _top3_hits(found)


async def _measure(service: Any, user_texts: list[str] | None, args: argparse.Namespace,
                   questions: list[str], common: list[str], long_message: str,
                   rounds: int) -> dict[str, Any]:  # fmt: skip
    """Time one service: its searches, adding a long session (twice), its recall."""
    out: dict[str, Any] = {}
    if user_texts is not None:  # ADK's services: ingest the user's memories first
        began = time.perf_counter()
        for start in range(0, len(user_texts), 1000):
            chunk = user_texts[start : start + 1000]
            await service.add_session_to_memory(_adk_session(USER, chunk, f"seed-{start}"))
        out["ingest_s"] = time.perf_counter() - began

    def search(query: str) -> Callable[[], Awaitable[Any]]:
        return lambda: service.search_memory(app_name=APP, user_id=USER, query=query)

    out["search"] = await _each([search(q) for q in questions], rounds)
    out["search_common_words"] = await _each([search(q) for q in common], rounds)
    out["search_long_message"] = await _each([search(long_message)], rounds)
    words = Words(11)
    adds, again = [], []
    for n in range(args.add_rounds):
        session = _adk_session(
            f"new-{n}", [words.text() for _ in range(args.session_events)], f"s{n}"
        )
        began = time.perf_counter()
        await service.add_session_to_memory(session)
        adds.append(time.perf_counter() - began)
        began = time.perf_counter()
        await service.add_session_to_memory(session)
        again.append(time.perf_counter() - began)
    out["add_session"] = _ms(adds)
    out["add_session_again"] = _ms(again)
    out["recall_top3"] = await _recall(service)
    return out


async def run_backend(backend: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from durable_sessions.adk import DurableMemoryService

    rows, mine = _corpus(args.org_memories, args.user_memories)
    words = Words(3)
    questions = [words.question() for _ in range(args.queries)]
    common = [words.common_only() for _ in range(max(3, args.queries // 4))]
    long_message = words.text(300)
    db = Database(backend, "memory", tmp)
    await db.create()
    try:
        await migrate_schema(db.url)
        began = time.perf_counter()
        await _seed(db, rows)
        seeded = time.perf_counter() - began
        print(f"{backend}: seeded {len(rows):,} memories in {seeded:.0f} s", file=sys.stderr)
        engine = create_async_engine(db.url)
        try:
            service = DurableMemoryService(SQLStore(engine), org_id=ORG, max_results=10)
            result = await _measure(
                service, None, args, questions, common, long_message, args.rounds
            )
        finally:
            await engine.dispose()
    finally:
        await db.drop()
    result["seed_s"] = seeded
    return {"ours": result, "_mine": mine, "_queries": (questions, common, long_message)}


async def run_adk(
    args: argparse.Namespace, mine: list[str], queries: Any, tmp: Path
) -> dict[str, Any]:
    from google.adk.memory.in_memory_memory_service import InMemoryMemoryService

    questions, common, long_message = queries
    rounds = max(1, args.rounds // 3)
    few = questions[: max(3, len(questions) // 5)]
    out: dict[str, Any] = {}
    print("adk in-memory ...", file=sys.stderr)
    out["adk_in_memory"] = await _measure(
        InMemoryMemoryService(), mine, args, few, common[:3], long_message, rounds
    )
    try:
        from google.adk.memory._sqlite_memory_service import SqliteMemoryService
    except ImportError:
        return out
    print("adk sqlite ...", file=sys.stderr)
    service = SqliteMemoryService(tmp / "adk_memory.db", max_results=10)
    try:
        out["adk_sqlite"] = await _measure(
            service, mine, args, questions, common, long_message, args.rounds
        )
    finally:
        close = getattr(service, "close", None)
        if close is not None:
            await close()
    return out


def _markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        "# Long-term memory",
        "",
        f"{data['org_memories']:,} memories in one organisation, {data['user_memories']:,} of "
        f"them one user's (12 words each, a Zipf vocabulary of 20,000 words); "
        f"{data['queries']} questions of that user, 10 results each; a session of "
        f"{data['session_events']:,} events added for a new user. Milliseconds, p50 (p95). "
        "ADK's services hold the user's memories only (they have no organisations). "
        "Top-3 recall: the fixed corpus of `benchmarks/memory_corpus.py`.",
        "",
        f"Run {meta['when']} on {meta['machine']}: `{meta['command']}`.",
        "",
        "| service | search | common words only | 300-word message | add 1,000-event session "
        "| add it again | top-3 recall |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(m: dict[str, float]) -> str:
        return f"{m['p50_ms']:.1f} ({m['p95_ms']:.1f})"

    for name, r in data["services"].items():
        lines.append(
            f"| {name} | {cell(r['search'])} | {cell(r['search_common_words'])} | "
            f"{cell(r['search_long_message'])} | {cell(r['add_session'])} | "
            f"{cell(r['add_session_again'])} | {r['recall_top3']:.0%} |"
        )
    return "\n".join(lines) + "\n"


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    tmp = new_tmpdir()
    services: dict[str, Any] = {}
    mine: list[str] = []
    queries: Any = None
    for backend in ["sqlite", "postgres"] if args.backend == "all" else [args.backend]:
        found = await run_backend(backend, args, tmp)
        services[f"DurableMemoryService ({backend})"] = found["ours"]
        mine, queries = found["_mine"], found["_queries"]
    if not args.no_adk:
        adk = await run_adk(args, mine, queries, tmp)
        if "adk_in_memory" in adk:
            services["ADK InMemoryMemoryService"] = adk["adk_in_memory"]
        if "adk_sqlite" in adk:
            services["ADK SqliteMemoryService"] = adk["adk_sqlite"]
    return {
        "meta": run_meta(args, command_line()),
        "org_memories": args.org_memories,
        "user_memories": args.user_memories,
        "queries": args.queries,
        "session_events": args.session_events,
        "services": services,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_bench")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--org-memories", type=int, default=1_000_000)
    parser.add_argument("--user-memories", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-events", type=int, default=1000)
    parser.add_argument("--add-rounds", type=int, default=3)
    parser.add_argument("--no-adk", action="store_true", help="leave ADK's services out")
    parser.add_argument(
        "--quick", action="store_true", help="20,000 memories, 5,000 of the user's: a check"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.org_memories, args.user_memories = 20_000, 5_000
        args.queries, args.rounds, args.add_rounds = 10, 1, 1
    warnings.simplefilter("ignore")  # ADK's experimental-feature notices
    data = asyncio.run(amain(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps(data, indent=1) + "\n")
    text = _markdown(data)
    (args.out / "memory.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
