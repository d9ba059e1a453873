"""Profile durable-sessions' Google ADK adapter: where does each ADK call's CPU go?

    python -m benchmarks.profile_adk --label after [--backend sqlite] [--ops 500]

Runs each ADK call the side-by-side benchmark makes (create, get, get with the 20 most
recent of 1,000 events, append with a state delta in every scope, list 1,000 sessions,
the fork equivalent, delete) sequentially through ``DurableSessionService`` on a fresh
database, then profiles the same calls with cProfile (timer: this thread's CPU time) and
groups self-time into buckets: ADK's and pydantic's model building, the adapter's own
Python, the rest of durable-sessions, SQLAlchemy, the driver, the event loop. Shares are
scaled to the unprofiled main-thread CPU per call. Each run is kept under its ``--label``
in ``profile_adk.json``; ``profile_adk.md`` shows every label side by side (e.g. the
adapter before and after a change).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.adk.events import Event, EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import SQLStore
from durable_sessions.adk import DurableSessionService

from .common import APP, ORG, Database, new_tmpdir, run_parallel
from .workloads import CONTENT, LIST_SIZE, TRANSCRIPT

CALLS = ("create", "get", "get_recent20", "append_event", "list_1000", "fork", "delete")
MODELS = "ADK/pydantic model building"
ADAPTER = "adapter Python (adk.py)"
STORE = "durable-sessions store"
SQLA = "SQLAlchemy"
DRIVER = "driver (asyncpg / aiosqlite hops)"
LOOP = "event loop, socket I/O, greenlet"
# (substring of the file path, bucket); the first match wins.
BUCKETS: list[tuple[str, str]] = [
    ("durable_sessions/_adk_models", MODELS),
    ("durable_sessions/adk", ADAPTER),
    ("/durable_sessions/", STORE),
    ("<string>", STORE),
    ("/pydantic", MODELS),
    ("google/adk/", MODELS),
    ("google/genai/", MODELS),
    ("/benchmarks/", "harness"),
    ("sqlalchemy/", SQLA),
    ("asyncpg", DRIVER),
    ("aiosqlite", DRIVER),
    ("threading.py", DRIVER),
    ("queue.py", DRIVER),
    ("asyncio", LOOP),
    ("selectors.py", LOOP),
]
BUILTINS: list[tuple[str, str]] = [
    ("pydantic_core", MODELS),
    ("epoll", LOOP),
    ("_socket", LOOP),
    ("_asyncio", LOOP),
    ("_contextvars", LOOP),
    ("greenlet", LOOP),
    ("sqlite3", DRIVER),
    ("_queue", DRIVER),
    ("_thread", DRIVER),
    ("asyncpg", DRIVER),
]
_TEXT = CONTENT["parts"][0]["text"]


def _bucket(filename: str, func: str) -> str | None:
    table, key = (BUILTINS, func) if filename == "~" else (BUCKETS, filename)
    for needle, bucket in table:
        if needle in key:
            return bucket
    return None if filename == "~" else "Python stdlib / other"


def _event(i: int, worker: int = 0) -> Event:
    delta = {"k": i, f"user:k{worker}": i, f"app:k{worker}": i}
    return Event(
        author="user",
        invocation_id=f"inv-{i}",
        content=types.Content(role="user", parts=[types.Part(text=_TEXT)]),
        actions=EventActions(state_delta=delta),
    )


async def _calls(service: DurableSessionService, n: int) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Seed the data and return one zero-argument coroutine function per ADK call."""
    seq = iter(range(1, 10**9))
    plain = await service.create_session(app_name=APP, user_id="u0", state={"k": 0})
    appender = await service.create_session(app_name=APP, user_id="u2", state={"k": 0})
    reader = await service.create_session(app_name=APP, user_id="reader", state={"k": 0})
    for i in range(TRANSCRIPT):
        await service.append_event(reader, _event(i))
    reader.events.clear()
    await run_parallel(
        LIST_SIZE, 4, lambda i: service.create_session(app_name=APP, user_id="lister")
    )
    doomed = await run_parallel(
        3 * n + 200, 4, lambda i: service.create_session(app_name=APP, user_id="u3")
    )

    async def create() -> None:
        await service.create_session(app_name=APP, user_id="u1", state={"k": next(seq)})

    async def get() -> None:
        await service.get_session(app_name=APP, user_id="u0", session_id=plain.id)

    recent = GetSessionConfig(num_recent_events=20)

    async def get_recent20() -> None:
        got = await service.get_session(
            app_name=APP, user_id="reader", session_id=reader.id, config=recent
        )
        assert got is not None
        assert len(got.events) == 20

    async def append_event() -> None:
        await service.append_event(appender, _event(next(seq), 2))
        appender.events.clear()

    async def list_1000() -> None:
        listed = await service.list_sessions(app_name=APP, user_id="lister")
        assert len(listed.sessions) == LIST_SIZE

    none = GetSessionConfig(num_recent_events=0)

    async def fork() -> None:
        parent = await service.get_session(
            app_name=APP, user_id="u0", session_id=plain.id, config=none
        )
        assert parent is not None
        private = {k: v for k, v in parent.state.items() if ":" not in k}
        private["forked_from"] = parent.id
        await service.create_session(app_name=APP, user_id="u0", state=private)

    async def delete() -> None:
        await service.delete_session(app_name=APP, user_id="u3", session_id=doomed.pop().id)

    return {
        "create": create,
        "get": get,
        "get_recent20": get_recent20,
        "append_event": append_event,
        "list_1000": list_1000,
        "fork": fork,
        "delete": delete,
    }


async def _cpu(op: Callable[[], Awaitable[Any]], n: int) -> dict[str, float]:
    wall, proc, main = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(n):
        await op()
    return {
        "wall_us": (time.perf_counter() - wall) / n * 1e6,
        "cpu_us": (time.process_time() - proc) / n * 1e6,
        "main_cpu_us": (time.thread_time() - main) / n * 1e6,
    }


async def _profile(
    op: Callable[[], Awaitable[Any]], n: int
) -> tuple[dict[str, float], list[list[Any]]]:
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for _ in range(n):
        await op()
    profiler.disable()
    stats: Any = pstats.Stats(profiler)
    buckets: dict[str, float] = defaultdict(float)
    top: list[tuple[float, float, str]] = []
    for (filename, line, func), (_cc, nc, tt, _ct, callers) in stats.stats.items():
        own = _bucket(filename, func)
        if own is None:  # a plain builtin (len, isinstance): charged to its callers
            for (c_file, _line, c_func), caller in callers.items():
                buckets[_bucket(c_file, c_func) or "Python stdlib / other"] += caller[2]
        else:
            buckets[own] += tt
        where = filename.split("site-packages/")[-1].split("/src/")[-1]
        top.append((tt, nc / n, f"{where}:{line}({func})"))
    total = sum(buckets.values()) or 1.0
    top.sort(reverse=True)
    return {k: v / total for k, v in buckets.items()}, [
        [t / total, calls, name] for t, calls, name in top[:10]
    ]


async def profile_backend(backend: str, n: int, log: Callable[[str], None]) -> dict[str, Any]:
    db = Database(backend, "prof_adk", new_tmpdir())
    await db.create()
    engine = create_async_engine(db.url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        calls = await _calls(DurableSessionService(store, org_id=ORG), n)
        results: dict[str, Any] = {}
        for name in CALLS:
            op = calls[name]
            heavy = name == "list_1000"  # a thousand sessions a call: a tenth of the calls
            for _ in range(5 if heavy else 50):
                await op()  # warm-up: compiled statements, pool, caches
            runs = max(1, n // 10) if heavy else n
            cpu = await _cpu(op, runs)
            split, top = await _profile(op, runs)
            results[name] = {"cpu": cpu, "split": split, "top": top, "calls": runs}
            log(
                f"  {backend:8} {name:13} cpu {cpu['cpu_us']:8.0f} us  "
                f"(main {cpu['main_cpu_us']:7.0f})  models "
                f"{split.get(MODELS, 0.0) * cpu['main_cpu_us']:7.0f} us  adapter "
                f"{split.get(ADAPTER, 0.0) * cpu['main_cpu_us']:6.0f} us"
            )
        return results
    finally:
        await engine.dispose()
        await db.drop()


def write_markdown(data: dict[str, Any], path: Path) -> None:
    """Render every label's figures: CPU per call, then the split of the newest label."""
    labels = list(data)
    lines = [
        "# Where the ADK adapter's time goes",
        "",
        "`python -m benchmarks.profile_adk --label LABEL`: each ADK call the side-by-side "
        "benchmark makes, sequentially through `DurableSessionService(SQLStore(engine))`; "
        "CPU is client-side process time per call (get_recent20: 20 of 1,000 events; "
        "list_1000: `list_sessions` of a user with 1,000 sessions; fork: "
        "`get_session(num_recent_events=0)` + `create_session`). The split is cProfile "
        "self-time shares of the main thread, scaled to its unprofiled CPU per call; "
        "cProfile charges each Python call more than C work, so it overstates Python-heavy "
        "code (such as `_adk_models`' rebuild) beside pydantic-core's validation. On SQLite "
        "the store's statements and row decoding run on aiosqlite's thread: only the CPU "
        "column counts them.",
        "",
    ]
    for label in labels:
        note = data[label].get("note", "")
        lines.append(f"- *{label}*: {data[label].get('when', '')}{'; ' + note if note else ''}")
    lines.append("")
    for backend in ("sqlite", "postgres"):
        runs = [(label, data[label]["results"].get(backend)) for label in labels]
        runs = [(label, r) for label, r in runs if r]
        if not runs:
            continue
        lines += [f"## {backend}", ""]
        head = " | ".join(f"CPU us {label}" for label, _ in runs)
        lines += [f"| call | {head} |", "|---|" + "---:|" * len(runs)]
        for call in CALLS:
            cells = " | ".join(
                f"{r[call]['cpu']['cpu_us']:,.0f}" if call in r else "-" for _, r in runs
            )
            lines.append(f"| {call} | {cells} |")
        lines.append("")
        for label, r in runs:
            buckets = sorted(
                {b for call in r.values() for b in call["split"]},
                key=lambda b: -sum(c["split"].get(b, 0.0) * c["cpu"]["main_cpu_us"]
                                   for c in r.values()),
            )  # fmt: skip
            lines += [
                f"### {backend}, {label}: main-thread CPU per call by bucket, us",
                "",
                "| bucket | " + " | ".join(CALLS) + " |",
                "|---|" + "---:|" * len(CALLS),
            ]
            for bucket in buckets:
                cells = " | ".join(
                    f"{r[c]['split'].get(bucket, 0.0) * r[c]['cpu']['main_cpu_us']:,.0f}"
                    if c in r
                    else "-"
                    for c in CALLS
                )
                lines.append(f"| {bucket} | {cells} |")
            lines.append("")
            for call in ("get_recent20", "list_1000"):
                if call not in r:
                    continue
                lines += [
                    f"<details><summary>{backend}, {label}, {call}: top functions by "
                    "self time</summary>",
                    "",
                    "| share | calls/op | function |",
                    "|---:|---:|---|",
                ]
                for share, calls, name in r[call]["top"]:
                    lines.append(f"| {share:.1%} | {calls:,.1f} | `{name}` |")
                lines += ["", "</details>", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_adk")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--ops", type=int, default=500, help="calls per path (default 500)")
    parser.add_argument("--label", default="current", help="the name this run is kept under")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--keep-best",
        action="store_true",
        help="keep, per call, the run with the least CPU among this and the label's earlier "
        "ones (alternate runs of two labels on a shared machine, then compare the best)",
    )
    parser.add_argument("--render", action="store_true", help="only rewrite the .md")
    args = parser.parse_args(argv)
    if args.render:
        write_markdown(
            json.loads((args.out / "profile_adk.json").read_text()), args.out / "profile_adk.md"
        )
        return 0
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    store = args.out / "profile_adk.json"
    data: dict[str, Any] = json.loads(store.read_text()) if store.exists() else {}
    entry = data.setdefault(args.label, {"when": "", "results": {}})
    for backend in backends:
        print(f"== {backend}, {args.ops} calls per path", flush=True)
        fresh = asyncio.run(profile_backend(backend, args.ops, print))
        kept = entry["results"].get(backend, {}) if args.keep_best else {}
        for call, figures in fresh.items():
            old = kept.get(call)
            if old is None or figures["cpu"]["cpu_us"] < old["cpu"]["cpu_us"]:
                kept[call] = figures
        entry["results"][backend] = kept
    entry["when"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    args.out.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    write_markdown(data, args.out / "profile_adk.md")
    print(f"written to {store} and {args.out / 'profile_adk.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
