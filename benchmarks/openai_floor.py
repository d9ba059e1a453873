"""How close the OpenAI Agents SDK adapter's writes are to their floor, beside the SDK's own.

    python -m benchmarks.openai_floor [--rounds 8] [--calls 300]

On Postgres only, interleaved round by round on one server, for ``add_items`` of a 2-item
turn and ``pop_item``:

- ``sdk``: the SDK's ``SQLAlchemySession``;
- ``ours``: durable-sessions' ``DurableSession`` on ``SQLStore``;
- ``floor``: the very statement and parameters ``ours`` sends, captured from one of its
  calls, replayed on one raw asyncpg connection in autocommit: no library code at all, so
  the fastest any client could run durable-sessions' schema (its counters, search index
  and listing indexes) through this write.

Each round times ``--calls`` calls of each, one after another, and prints the mean per call;
the summary gives the medians over rounds and the ratios ``sdk / ours`` (what the suite
reports) and ``sdk / floor`` (the most any client of this schema could report). Postgres is
``DURABLE_SESSIONS_BENCH_POSTGRES_URL`` (an admin URL: a fresh database is made and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from .common import Database, migrate_schema, new_tmpdir, raw_pg_dsn
from .openai_suite import TURN

Call = Callable[[], Awaitable[Any]]


async def _captured(call: Call) -> tuple[str, tuple[Any, ...]]:
    """The one statement (SQL and parameters) that ``call`` sends through asyncpg."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    real = asyncpg.Connection.fetch

    async def recording(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        seen.append((query, args))
        return await real(self, query, *args, **kwargs)

    asyncpg.Connection.fetch = recording  # type: ignore[method-assign]
    try:
        await call()
    finally:
        asyncpg.Connection.fetch = real  # type: ignore[method-assign]
    assert len(seen) == 1, f"expected one statement, saw {len(seen)}"
    return seen[0]


async def _mean_us(call: Call, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await call()
    return (time.perf_counter() - start) / calls * 1e6


async def run(args: argparse.Namespace) -> None:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    from durable_sessions import SQLStore
    from durable_sessions.openai_agents import DurableSession

    db = Database("postgres", "oa_floor", new_tmpdir())
    await db.create()
    try:
        await migrate_schema(db.url)
        engine = create_async_engine(db.url, pool_size=2)
        raw = await asyncpg.connect(raw_pg_dsn(db.url))
        ours_add = DurableSession("ours-add", SQLStore(engine))
        ours_pop = DurableSession("ours-pop", SQLStore(engine))
        floor_pop_session = DurableSession("floor-pop", SQLStore(engine))
        sdk_add = SQLAlchemySession("sdk-add", engine=engine, create_tables=True)
        sdk_pop = SQLAlchemySession("sdk-pop", engine=engine, create_tables=True)
        supply = args.rounds * args.calls + 50
        for session in (ours_pop, floor_pop_session, sdk_pop):
            for start in range(0, supply, 500):
                await session.add_items([TURN[i % 2] for i in range(min(500, supply - start))])
        await ours_add.add_items(TURN)
        await sdk_add.add_items(TURN)
        add_sql, add_args = await _captured(lambda: ours_add.add_items(TURN))
        pop_sql, pop_args = await _captured(floor_pop_session.pop_item)

        async def floor_add() -> None:
            await raw.fetch(add_sql, *add_args)

        async def floor_pop() -> None:
            await raw.fetch(pop_sql, *pop_args)

        plans: dict[str, dict[str, Call]] = {
            "add_items": {
                "sdk": lambda: sdk_add.add_items(TURN),
                "ours": lambda: ours_add.add_items(TURN),
                "floor": floor_add,
            },
            "pop_item": {"sdk": sdk_pop.pop_item, "ours": ours_pop.pop_item, "floor": floor_pop},
        }
        for workload, calls in plans.items():
            for call in calls.values():  # warm: prepared statements, caches, pool
                for _ in range(20):
                    await call()
            times: dict[str, list[float]] = {name: [] for name in calls}
            for round_ in range(args.rounds):
                order = list(calls.items())
                if round_ % 2:
                    order.reverse()
                for name, call in order:
                    times[name].append(await _mean_us(call, args.calls))
                print(
                    f"{workload} round {round_ + 1}: "
                    + ", ".join(f"{n} {times[n][-1]:.0f} µs" for n in calls),
                    flush=True,
                )
            med = {name: statistics.median(values) for name, values in times.items()}
            print(
                f"== {workload}: median µs per call: sdk {med['sdk']:.0f}, ours "
                f"{med['ours']:.0f}, floor {med['floor']:.0f}; sdk/ours "
                f"{med['sdk'] / med['ours']:.2f}x, sdk/floor {med['sdk'] / med['floor']:.2f}x",
                flush=True,
            )
        await raw.close()
        await engine.dispose()
    finally:
        await db.drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.openai_floor")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300, help="calls per round and side")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
