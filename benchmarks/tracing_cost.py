"""What a listener on the engine costs: get and append_event with and without one.

With any listener on the engine's events (tracing, statement counting) the store runs its
statements through SQLAlchemy's execution layer instead of straight on the driver. This
measures both paths in one process, interleaved: each of ``--rounds`` rounds (two by
default) runs ``--gets`` gets then a quarter as many appends on each path, back to back,
the path that goes first rotating from one round to the next. On a shared machine many
short rounds (``--gets 400 --rounds 12``) give steadier ratios: the median of the rounds'
ratios and the whole run's are printed beside best against best.

    python -m benchmarks run tracing [--backend sqlite|postgres] [--otel]

With ``--otel`` a third path is measured in the same rounds: OpenTelemetry's SQLAlchemy
instrumentation attached to the engine (as the README and ``tests/sql/test_tracing.py`` do),
with a tracer provider whose span processor hands each span to an exporter that drops it.
That is the cost of the instrumentation and of making the spans, not of shipping them.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore

from .common import Database, new_tmpdir, run_meta, write_results

Rates = tuple[float, float]
"""(get/s, append_event/s) of one round."""


def _listen(engine: Engine) -> None:
    """Attach a bare ``before_cursor_execute`` listener that does nothing."""

    def listener(*args: Any) -> None:
        pass

    event.listen(engine, "before_cursor_execute", listener)


def _instrument(engine: Engine) -> Callable[[], None]:
    """Attach OpenTelemetry's SQLAlchemy instrumentation (spans made, then dropped);
    return what detaches it."""
    import sqlalchemy
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    instrumentor = SQLAlchemyInstrumentor()
    # 0.65b0 declares SQLAlchemy < 2.1: on 2.1 it instruments nothing without this.
    extra = {} if sqlalchemy.__version__.startswith("2.0.") else {"skip_dep_check": True}
    instrumentor.instrument(engine=engine, tracer_provider=provider, **extra)
    return instrumentor.uninstrument


async def measure(
    url: str, gets: int = 2000, rounds: int = 2, otel: bool = False
) -> dict[str, list[Rates]]:
    """Every round's (get/s, append/s) of each path, the paths interleaved in each round.

    Each path has an engine of its own on the same database: SQLAlchemy keeps an engine
    on its listened path (``Engine._has_events``) once anything was attached, even after
    ``event.remove``, so one engine cannot go back to the plain path.
    """
    names = ["plain", "listened"] + (["otel"] if otel else [])
    engines = {name: create_async_engine(url) for name in names}
    stores = {name: SQLStore(engine) for name, engine in engines.items()}
    await stores["plain"].migrate()
    session = await Manager(stores["plain"], app_name="a").create("o", "u", state={"k": 1})
    _listen(engines["listened"].sync_engine)
    detach = _instrument(engines["otel"].sync_engine) if otel else None

    async def loop(store: SQLStore) -> Rates:
        start = time.perf_counter()
        for _ in range(gets):
            await store.get("o", session.id)
        get_rate = gets / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(gets // 4):
            await store.append_event("o", session.id, Event("u", {"t": "x"}))
        return get_rate, (gets // 4) / (time.perf_counter() - start)

    found: dict[str, list[Rates]] = {name: [] for name in names}
    try:
        for name in names:  # warm-up: caches, prepared statements, each pool's connection
            assert engines[name].sync_engine._has_events == (name != "plain")
            await loop(stores[name])
        for r in range(rounds):
            # Each round starts with another path, so that no path is always first.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                found[name].append(await loop(stores[name]))
    finally:
        if detach is not None:
            detach()
        for engine in engines.values():
            await engine.dispose()
    return found


def summarize(found: dict[str, list[Rates]]) -> list[str]:
    """Each path's best round, then each path against the plain one three ways: best round
    against best round, whole run against whole run (all ops over all the time), and the
    median of the rounds' ratios (each round runs the paths back to back)."""
    lines = []
    best = {name: (max(r[0] for r in v), max(r[1] for r in v)) for name, v in found.items()}
    for name, (get, append) in best.items():
        lines.append(f"{name:9} best get/s {get:8.0f}  append/s {append:8.0f}")

    def whole(rates: list[Rates], i: int) -> float:  # rates of equal op counts: harmonic mean
        return len(rates) / sum(1 / r[i] for r in rates)

    plain = found["plain"]
    for name, rates in found.items():
        if name == "plain":
            continue
        ratios = []
        for i, op in enumerate(("get", "append")):
            per_round = sorted(r[i] / p[i] for r, p in zip(rates, plain, strict=True))
            ratios.append(
                f"{op} best {best[name][i] / best['plain'][i]:.2f}x "
                f"whole {whole(rates, i) / whole(plain, i):.2f}x "
                f"median {statistics.median(per_round):.2f}x "
                f"(rounds {per_round[0]:.2f}-{per_round[-1]:.2f}x)"
            )
        lines.append(f"ratio {name:9} " + "  ".join(ratios))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print each round, then each path's best rates and their ratios to the plain path."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks run tracing")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--otel", action="store_true", help="also OpenTelemetry's instrumentation")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gets", type=int, default=2000, help="gets per round (appends: 1/4)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    tmpdir = new_tmpdir()
    database = Database(args.backend, "tracing", tmpdir)

    async def run() -> dict[str, list[Rates]]:
        await database.create()
        try:
            return await measure(database.url, args.gets, args.rounds, args.otel)
        finally:
            await database.drop()

    try:
        found = asyncio.run(run())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    for n in range(args.rounds):
        line = "  ".join(
            f"{name} get/s {rates[n][0]:.0f} append/s {rates[n][1]:.0f}"
            for name, rates in found.items()
        )
        print(f"round {n + 1}: {line}")
    lines = summarize(found)
    print("\n".join(lines))
    meta = run_meta(args, "python -m benchmarks " + " ".join(sys.argv[1:]))
    data = {"meta": meta, "backend": args.backend, "rounds": found}
    write_results(args.out, "tracing", f"Engine listeners on {args.backend}", lines, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
