"""What a listener on the engine costs: get and append_event with and without one.

With any listener on the engine's events (tracing, statement counting) the store runs its
statements through SQLAlchemy's execution layer instead of straight on the driver. This
measures both paths in one process, interleaved, best of two rounds:

    python -m benchmarks.tracing_cost sqlite+aiosqlite:///bench.db
    python -m benchmarks.tracing_cost postgresql+asyncpg://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore


async def measure(url: str, gets: int = 2000) -> dict[str, tuple[float, float]]:
    """Best (get/s, append/s) of two rounds, without and with a cursor listener."""
    engine = create_async_engine(url)
    store = SQLStore(engine)
    await store.migrate()
    session = await Manager(store, app_name="a").create("o", "u", state={"k": 1})

    async def loop() -> tuple[float, float]:
        start = time.perf_counter()
        for _ in range(gets):
            await store.get("o", session.id)
        get_rate = gets / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(gets // 4):
            await store.append_event("o", session.id, Event("u", {"t": "x"}))
        return get_rate, (gets // 4) / (time.perf_counter() - start)

    def listener(*args: Any) -> None:
        pass

    rounds: dict[str, list[tuple[float, float]]] = {"plain": [], "listened": []}
    for _ in range(2):
        rounds["plain"].append(await loop())
        event.listen(engine.sync_engine, "before_cursor_execute", listener)
        rounds["listened"].append(await loop())
        event.remove(engine.sync_engine, "before_cursor_execute", listener)
    await engine.dispose()
    return {k: (max(r[0] for r in v), max(r[1] for r in v)) for k, v in rounds.items()}


def main() -> None:
    """Print both paths' rates and their ratio for the URL given."""
    found = asyncio.run(measure(sys.argv[1]))
    plain, listened = found["plain"], found["listened"]
    print(f"plain     get/s {plain[0]:8.0f}  append/s {plain[1]:8.0f}")
    print(f"listened  get/s {listened[0]:8.0f}  append/s {listened[1]:8.0f}")
    print(f"ratio     get {listened[0] / plain[0]:.2f}x  append {listened[1] / plain[1]:.2f}x")


if __name__ == "__main__":
    main()
