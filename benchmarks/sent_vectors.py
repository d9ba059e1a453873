"""Appends on Postgres with the search vector sent by the write (revision 0008) or computed
by Postgres per insert (revisions 0003 to 0007), beside the SDK's own session.

    python -m benchmarks.sent_vectors [--rounds 10] [--calls 200]

The same code on two fresh databases of one server: one migrated to 0007 (a generated
``search_vector`` column: the store sends no vector and Postgres runs ``ds_search_vector``
for each event) and one to head (a plain column: the store sends the vector it computed).
Timed interleaved, round by round, the order alternating: the OpenAI Agents SDK adapter's
``add_items`` of a 2-item turn, the ADK-style ``append_event`` of one event with a text
content, and the SDK's ``SQLAlchemySession.add_items`` on the same server for the ratio.
Prints each round's mean per call and the medians. Postgres is
``DURABLE_SESSIONS_BENCH_POSTGRES_URL`` (an admin URL: the databases are made and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from .common import Database, new_tmpdir
from .openai_floor import Call, _mean_us
from .openai_suite import TURN


async def run(args: argparse.Namespace) -> None:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    from durable_sessions import Event, Manager, SQLStore
    from durable_sessions.migrate import upgrade
    from durable_sessions.openai_agents import DurableSession

    made: list[tuple[Database, Any]] = []
    calls: dict[str, Call] = {}
    try:
        for label, revision in (("0007", "0007"), ("head", "head")):
            db = Database("postgres", f"vectors_{label}", new_tmpdir())
            await db.create()
            engine = create_async_engine(db.url, pool_size=2)
            made.append((db, engine))
            await upgrade(engine, revision)
            store = SQLStore(engine)
            items = DurableSession("turns", store)
            await items.add_items(TURN)
            await Manager(store).create("bench", "u", id="events")

            async def add(items: DurableSession = items) -> None:
                await items.add_items(TURN)

            async def append(store: SQLStore = store) -> None:
                event = Event("user", content={"text": "What is the weather like in Paris?"})
                await store.append_event("bench", "events", event)

            calls[f"add_items {label}"] = add
            calls[f"append_event {label}"] = append
        sdk = SQLAlchemySession("sdk", engine=made[0][1], create_tables=True)
        await sdk.add_items(TURN)

        async def sdk_add() -> None:
            await sdk.add_items(TURN)

        calls["add_items SDK"] = sdk_add
        for call in calls.values():  # warm: prepared statements, caches, pool
            for _ in range(30):
                await call()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for round_ in range(args.rounds):
            order = list(calls.items())
            if round_ % 2:
                order.reverse()
            for name, call in order:
                times[name].append(await _mean_us(call, args.calls))
            print(
                f"round {round_ + 1}: " + ", ".join(f"{n} {times[n][-1]:.0f}" for n in calls),
                flush=True,
            )
        med = {name: statistics.median(values) for name, values in times.items()}
        for name in calls:
            print(f"== {name}: median {med[name]:.0f} µs per call", flush=True)
        for kind in ("add_items", "append_event"):
            before, after = med[f"{kind} 0007"], med[f"{kind} head"]
            print(f"== {kind}: {before:.0f} -> {after:.0f} µs ({after / before - 1:+.1%})")
        sdk_us = med["add_items SDK"]
        print(
            f"== SDK add_items / ours: {sdk_us / med['add_items 0007']:.2f}x at 0007, "
            f"{sdk_us / med['add_items head']:.2f}x at head"
        )
    finally:
        for db, engine in made:
            await engine.dispose()
            await db.drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sent_vectors")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200, help="calls per round and side")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
