"""Fresh tables: the hot paths on a database filled from empty, before and after ANALYZE.

A new deployment starts on empty tables and serves traffic from its first session: each
pooled connection prepares the store's statements (asyncpg keeps them, and Postgres a plan
for each) while the tables hold a handful of rows. This benchmark fills databases
that way (one per state below), through the public API only, and then times the hot
paths on each, interleaved:

- ``fresh``: never analysed (autovacuum off for its tables), as a deploy fills before
  autovacuum first looks at it;
- ``empty``: analysed right after the migration, while empty (a deploy pipeline's
  ``vacuumdb --analyze``), not since;
- ``early``: analysed once when it held ``--early`` sessions (what autovacuum does to a new
  table after about 50 changes), not since;
- ``analyzed``: analysed once filled (which also makes every connection plan again).

Each op runs against every state in turn, round after round; the report gives each state's
throughput as a ratio of ``analyzed``'s in the same round (the median over rounds). With
``--explain`` it also prints, per state and op, the scans of the plans the connections
use right after the fill (``auto_explain`` loaded into each pooled connection, then off).

asyncpg keeps a prepared statement ``--statement-lifetime`` seconds (its
``max_cached_statement_lifetime``); the default here, 0, keeps each for the connection's
life, as Postgres keeps the plan of its foreign-key check of each event insert whatever
asyncpg does. With asyncpg's own default (300) the store's statements are prepared, and
planned, again every five minutes, and a run this long mixes both.

    python -m benchmarks.fresh_plans --backend all
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Filter, Manager, Session, SQLStore

from .common import APP, ORG, Database, new_tmpdir

STATES = ("fresh", "empty", "early", "analyzed")
TABLES = ("ds_sessions", "ds_events", "ds_user_state", "ds_app_state")
USERS = 16
POOL = 8
CONTENT = {"role": "user", "parts": [{"text": "What is the weather like in Paris today?"}]}

Op = Callable[[int], Awaitable[Any]]


def _state(worker: int, i: int) -> dict[str, Any]:
    return {"k": i, f"user:k{worker % 4}": i, f"app:k{worker % 4}": i}


class Filled:
    """One database of one state, filled from empty through the public API."""

    def __init__(
        self, backend: str, state: str, tmpdir: Path, lifetime: float, settings: dict[str, str]
    ) -> None:
        self.state = state
        self.lifetime = lifetime
        self.settings = settings
        self.db = Database(backend, f"fresh_{state}", tmpdir)
        self.engine: AsyncEngine | None = None
        self.store: SQLStore | None = None
        self.manager: Manager | None = None
        self.sessions: list[Session] = []

    async def open(self) -> None:
        await self.db.create()
        args: dict[str, Any] = {"max_cached_statement_lifetime": self.lifetime}
        if self.settings:
            args["server_settings"] = self.settings
        self.engine = create_async_engine(
            self.db.url,
            pool_size=POOL,
            max_overflow=0,
            connect_args=args if self.db.backend == "postgres" else {},
        )
        self.store = SQLStore(self.engine)
        await self.store.migrate()
        self.manager = Manager(self.store, app_name=APP)
        if self.db.backend == "postgres":  # nothing analyses behind the benchmark's back
            for table in TABLES:
                await self.sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        if self.state == "empty":
            await self.sql("ANALYZE")

    async def sql(self, text: str) -> None:
        assert self.engine is not None
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql(text)
            await conn.commit()

    async def fill(self, count: int, early: int) -> None:
        """``count`` sessions, each created, appended to, read and touched by one of
        ``POOL`` workers at once, as traffic would; ``early``: ANALYZE at that count."""
        manager = self.manager
        assert manager is not None
        made = 0

        async def worker(w: int) -> None:
            nonlocal made
            while made < count:
                made += 1
                i = made
                if self.state == "early" and i == early:
                    await self.sql("ANALYZE")
                session = await manager.create(ORG, f"u{i % USERS}", state=_state(w, i))
                await manager.append_event(session, _event(w, i))
                await manager.get(ORG, session.id)
                await manager.touch(session, 1, 3, "")
                self.sessions.append(session)

        await asyncio.gather(*(worker(w) for w in range(POOL)))
        if self.state == "analyzed":
            await self.sql("ANALYZE")

    def ops(self) -> dict[str, Op]:
        manager, store, sessions = self.manager, self.store, self.sessions
        assert manager is not None
        assert store is not None
        n = len(sessions)

        def pick(i: int) -> Session:
            return sessions[(i * 7919) % n]

        async def append_event(i: int) -> None:
            await manager.append_event(pick(i), _event(i % POOL, i))

        async def get(i: int) -> None:
            await manager.get(ORG, pick(i).id)

        async def save(i: int) -> None:
            session = await manager.get(ORG, pick(i).id)
            for key, value in _state(i % POOL, i).items():
                session.set(key, value)
            await manager.save(session)

        async def touch(i: int) -> None:
            await manager.touch(pick(i), 1, 3, "")

        async def list_events(i: int) -> None:
            await store.list_events(ORG, pick(i).id, limit=20)

        async def list_page(i: int) -> None:
            await manager.list_page(Filter(ORG, user_id=f"u{i % USERS}", limit=20))

        async def create(i: int) -> None:
            await manager.create(ORG, f"u{i % USERS}", state=_state(i % POOL, i))

        return {
            "append_event": append_event,
            "get": get,
            "save": save,
            "touch": touch,
            "list_events": list_events,
            "list_page": list_page,
            "create": create,
        }

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()
        await self.db.drop()


def _event(worker: int, i: int) -> Event:
    return Event(
        author="user",
        content=CONTENT,
        invocation_id=f"inv-{i}",
        state_delta=_state(worker, i),
        tokens=12,
    )


async def _rate(op: Op, ops: int, start: int, concurrency: int) -> float:
    """Ops per second of ``ops`` calls of ``op``, ``concurrency`` at a time."""
    counter = iter(range(start, start + ops))

    async def worker() -> None:
        for i in counter:
            await op(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ops / (time.perf_counter() - t0)


async def _each_connection(engine: AsyncEngine, *settings: str) -> list[Any]:
    """Run ``settings`` on every pooled connection; return the asyncpg connections."""
    conns = [await engine.connect() for _ in range(POOL)]
    raws = []
    try:
        for conn in conns:
            raw: Any = (await conn.get_raw_connection()).driver_connection
            for setting in settings:
                await raw.execute(setting)
            raws.append(raw)
    finally:
        for conn in conns:
            await conn.close()
    return raws


async def _plans(filled: Filled, ops: dict[str, Op]) -> dict[str, list[str]]:
    """The scans of the plans each op uses on the pooled connections (Postgres)."""
    assert filled.engine is not None
    messages: list[str] = []

    def listen(_conn: Any, message: Any) -> None:
        messages.append(message.message)

    raws = await _each_connection(
        filled.engine,
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_level = notice",
    )
    for raw in raws:
        raw.add_log_listener(listen)
    found: dict[str, list[str]] = {}
    try:
        for name, op in ops.items():
            messages.clear()
            await asyncio.gather(*(op(10_000_000 + i) for i in range(POOL)))
            scans = {
                re.sub(r"\s+\(cost.*", "", line.strip().removeprefix("->").strip())
                for message in messages
                for line in message.splitlines()
                if " on ds_" in line and "Scan" in line
            }
            found[name] = sorted(scans)
    finally:
        for raw in raws:
            raw.remove_log_listener(listen)
        await _each_connection(filled.engine, "SET auto_explain.log_min_duration = -1")
    return found


async def run(
    backend: str,
    states: list[str],
    sessions: int,
    early: int,
    rounds: int,
    ops: int,
    concurrency: int,
    explain: bool,
    lifetime: float,
    settings: dict[str, str],
) -> dict[str, Any]:
    """Fill one database per state, then time each op on each state in turn, per round."""
    if "analyzed" not in states:
        states = [*states, "analyzed"]
    tmpdir = new_tmpdir()
    opened = [Filled(backend, state, tmpdir, lifetime, settings) for state in states]
    plans: dict[str, dict[str, list[str]]] = {}
    try:
        for filled in opened:
            await filled.open()
            t0 = time.perf_counter()
            await filled.fill(sessions, early)
            print(f"{backend} {filled.state}: filled in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)  # fmt: skip
            if explain and backend == "postgres":
                plans[filled.state] = await _plans(filled, filled.ops())
        by_state = {filled.state: filled.ops() for filled in opened}
        names = list(by_state["analyzed"])
        rates: dict[str, dict[str, list[float]]] = {
            name: {state: [] for state in states} for name in names
        }
        for r in range(rounds):
            for name in names:
                for k, state in enumerate(states):
                    start = (r * len(states) + k) * ops
                    rate = await _rate(by_state[state][name], ops, start, concurrency)
                    rates[name][state].append(rate)
            print(f"{backend}: round {r + 1}/{rounds}", file=sys.stderr)
        result: dict[str, Any] = {
            "backend": backend,
            "states": states,
            "sessions": sessions,
            "statement_lifetime": lifetime,
            "pg_settings": settings,
            "ops": {},
        }
        for name in names:
            per = rates[name]
            base = per["analyzed"]
            result["ops"][name] = {
                "ops_per_sec": {s: statistics.median(per[s]) for s in states},
                "ratio": {
                    s: statistics.median(a / b for a, b in zip(per[s], base, strict=True))
                    for s in states
                    if s != "analyzed"
                },
            }
        if plans:
            result["plans"] = plans
        return result
    finally:
        for filled in opened:
            await filled.close()


def report(results: list[dict[str, Any]]) -> str:
    """The ratios as a Markdown table, then the plans in use when asked for."""
    others = [s for s in results[0]["states"] if s != "analyzed"]
    lines = [
        "| backend | op | " + " | ".join(f"{s}/analyzed" for s in others) + " | analyzed ops/s |",
        "|---|---|" + "---:|" * (len(others) + 1),
    ]
    for result in results:
        for name, row in result["ops"].items():
            ratios = " | ".join(f"{row['ratio'][s]:.2f}" for s in others)
            rate = row["ops_per_sec"]["analyzed"]
            lines.append(f"| {result['backend']} | {name} | {ratios} | {rate:,.0f} |")
    for result in results:
        for state, plans in result.get("plans", {}).items():
            lines.append(f"\n{result['backend']} {state}, right after the fill:")
            for name, scans in plans.items():
                lines.append(f"  {name}: {'; '.join(scans)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fresh_plans", description=__doc__)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument(
        "--states", default=",".join(STATES), help=f"comma-separated out of {','.join(STATES)}"
    )
    parser.add_argument("--sessions", type=int, default=8_000, help="sessions filled (8000)")
    parser.add_argument("--early", type=int, default=50, help="sessions at the early ANALYZE")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument("--ops", type=int, default=400, help="ops per op, state and round")
    parser.add_argument("--concurrency", type=int, default=4, help="ops at once (4)")
    parser.add_argument(
        "--explain", action="store_true", help="print the plans in use after the fill"
    )
    parser.add_argument(
        "--statement-lifetime",
        type=float,
        default=0,
        help="asyncpg's max_cached_statement_lifetime, seconds (0: the connection's life)",
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Postgres setting of every connection of the stores (e.g. enable_seqscan=off)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    settings = dict(item.split("=", 1) for item in args.pg_setting)
    states = [s for s in args.states.split(",") if s]
    if unknown := set(states) - set(STATES):
        parser.error(f"unknown states: {', '.join(sorted(unknown))}")
    results = [
        asyncio.run(
            run(b, states, args.sessions, args.early, args.rounds, args.ops, args.concurrency,
                args.explain, args.statement_lifetime, settings)
        )
        for b in backends
    ]  # fmt: skip
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
