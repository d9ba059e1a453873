"""How long an upgrade from revision 0002 to head takes on a filled database, and how long the
service waits meanwhile.

    python -m benchmarks.online_migration [--sessions 100000] [--events 10] [--backend postgres]
        [--released] [--keep]

A fresh database at revision 0002 gets ``--sessions`` sessions of ``--events`` small events
each (an assistant message of about 150 bytes, as the OpenAI Agents SDK writes them), in
bulk ``INSERT ... SELECT`` statements; then ``durable-sessions``' upgrade to head runs in a
process of its own, as a deploy runs it, while a probe (plain SQL, as the previous release
does it) reads a session, reads a transcript of ``--events`` events and appends an event,
each every 50 ms. Printed: the total time of the upgrade, its progress lines with the time
each came, and per probe operation the number done, the median and the longest wait.

``--released`` runs the revisions as released before they ran online
(``tests/support/released_migrations``: one transaction, tables rewritten) instead, for
comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions.sql.migrate import upgrade

from .common import Database, new_tmpdir

PROBE_EVERY = 0.05
RELEASED = Path(__file__).resolve().parents[1] / "tests" / "support" / "released_migrations"

FILL_SESSIONS = {
    "postgres": (
        "INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, "
        "created_at, updated_at, message_count, token_total, event_seq, version, incarnation) "
        "SELECT 'org', 's' || n, 'u' || (n % 1000), 'app', '', '{}', NULL, now(), now(), 0, 0, "
        ":events, 1, 'i' FROM generate_series(CAST(:first AS int), CAST(:last AS int)) AS n"
    ),
    "sqlite": (
        "WITH RECURSIVE c(n) AS (SELECT :first UNION ALL SELECT n + 1 FROM c WHERE n < :last) "
        "INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, "
        "created_at, updated_at, message_count, token_total, event_seq, version, incarnation) "
        "SELECT 'org', 's' || n, 'u' || (n % 1000), 'app', '', '{}', NULL, "
        "strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), 0, 0, "
        ":events, 1, 'i' FROM c"
    ),
}
FILL_EVENTS = {
    "postgres": (
        "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content, "
        "state_delta, tokens, timestamp) "
        "SELECT 'org', 's' || s, q, md5(s::text || '/' || q::text), 'assistant', 'run', "
        "jsonb_build_object('id', 'msg_' || q, 'type', 'message', 'role', 'assistant', "
        "'content', jsonb_build_array(jsonb_build_object('type', 'output_text', "
        "'text', 'Sunny, 24 degrees, light wind in Paris today, turn ' || q, "
        "'annotations', '[]'::jsonb))), '{}', 0, now() "
        "FROM generate_series(CAST(:first AS int), CAST(:last AS int)) AS s, "
        "generate_series(1, CAST(:events AS int)) AS q"
    ),
    "sqlite": (
        "WITH RECURSIVE a(s) AS (SELECT :first UNION ALL SELECT s + 1 FROM a WHERE s < :last), "
        "b(q) AS (SELECT 1 UNION ALL SELECT q + 1 FROM b WHERE q < :events) "
        "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content, "
        "state_delta, tokens, timestamp) "
        "SELECT 'org', 's' || s, q, 'e' || s || '/' || q, 'assistant', 'run', "
        "json_object('id', 'msg_' || q, 'type', 'message', 'role', 'assistant', "
        "'content', json_array(json_object('type', 'output_text', "
        "'text', 'Sunny, 24 degrees, light wind in Paris today, turn ' || q, "
        "'annotations', json('[]')))), '{}', 0, strftime('%Y-%m-%d %H:%M:%f', 'now') "
        "FROM a, b"
    ),
}

CURRENT = """
import asyncio, sys, time
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions.sql.migrate import upgrade

async def main(url):
    engine = create_async_engine(url)
    started = time.monotonic()
    def progress(line):
        print(f"{time.monotonic() - started:7.1f} s  {line}", flush=True)
    try:
        report = await upgrade(engine, progress=progress)
        progress(f"ran {', '.join(report.applied)}")
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""

RELEASED_RUN = """
import asyncio, sys
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import create_async_engine

async def main(url, location):
    engine = create_async_engine(url)
    def run(connection):
        config = Config()
        config.set_main_option("script_location", location)
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    try:
        async with engine.connect() as conn:
            await conn.run_sync(run)
            await conn.commit()
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


class Probe:
    """The previous release at work: each operation every PROBE_EVERY seconds, timed."""

    def __init__(self, url: str, sessions: int, events: int) -> None:
        self.engine = create_async_engine(url, connect_args=_connect_args(url))
        self.sessions = sessions
        self.events = events
        self.times: dict[str, list[float]] = {"session": [], "transcript": [], "append": []}
        self.errors: dict[str, int] = dict.fromkeys(self.times, 0)
        self.replanned = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _session(self, n: int) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(
                text("SELECT * FROM ds_sessions WHERE org_id = 'org' AND id = :id"),
                {"id": f"s{n * 7919 % self.sessions + 1}"},
            )

    async def _transcript(self, n: int) -> None:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT seq, id, author, content, timestamp FROM ds_events "
                    "WHERE org_id = 'org' AND session_id = :id ORDER BY seq"
                ),
                {"id": f"s{n * 7907 % self.sessions + 1}"},
            )
            rows.all()

    async def _append(self, n: int) -> None:
        pg = self.engine.dialect.name == "postgresql"
        session = f"s{n * 7901 % self.sessions + 1}"
        async with self.engine.begin() as conn:
            seq = (
                await conn.execute(
                    text(
                        "UPDATE ds_sessions SET event_seq = event_seq + 1, version = version + 1 "
                        "WHERE org_id = 'org' AND id = :id RETURNING event_seq"
                    ),
                    {"id": session},
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                    "content, state_delta, tokens, timestamp) VALUES ('org', :id, :seq, :eid, "
                    f"'user', 'probe', {'CAST(:c AS jsonb)' if pg else ':c'}, '{{}}', 0, "
                    f"{'now()' if pg else 'CURRENT_TIMESTAMP'})"
                ),
                {
                    "id": session,
                    "seq": seq,
                    "eid": f"probe-{n}",
                    "c": json.dumps({"text": f"probe append {n}"}),
                },
            )

    async def _loop(self, name: str, operation: Any) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            try:
                try:
                    await operation(n)
                except DBAPIError as exc:  # prepared before a column changed: once
                    if "InvalidCachedStatement" not in type(exc.orig).__name__:
                        raise
                    self.replanned += 1
                    await operation(n)
            except Exception as exc:
                self.errors[name] += 1
                print(f"probe {name}: {exc!r}"[:300], file=sys.stderr)
            took = time.monotonic() - started
            self.times[name].append(took)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, PROBE_EVERY - took))

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(name, getattr(self, f"_{name}"))) for name in self.times
        ]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.engine.dispose()


def _connect_args(url: str) -> dict[str, Any]:
    return {"timeout": 60} if url.startswith("sqlite") else {}


async def fill(engine: AsyncEngine, backend: str, sessions: int, events: int) -> None:
    step = 10_000
    for first in range(1, sessions + 1, step):
        last = min(first + step - 1, sessions)
        params = {"first": first, "last": last, "events": events}
        async with engine.begin() as conn:
            await conn.execute(text(FILL_SESSIONS[backend]), params)
            await conn.execute(text(FILL_EVENTS[backend]), params)
    if backend == "postgres":
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE")


async def measure(
    backend: str, sessions: int, events: int, released: bool, keep: bool
) -> list[str]:
    """Fill, upgrade under the probe, and return the result as Markdown lines."""
    tmpdir = new_tmpdir()
    db = Database(backend, "online_migration", tmpdir)
    await db.create()
    url = db.url
    if backend == "postgres":
        url = make_url(url).update_query_dict({"prepared_statement_cache_size": "0"})
        url = url.render_as_string(hide_password=False)
    engine = create_async_engine(url, connect_args=_connect_args(url))
    try:
        await upgrade(engine, "0002")
        started = time.monotonic()
        await fill(engine, backend, sessions, events)
        print(
            f"filled {sessions:,} sessions, {sessions * events:,} events at 0002 "
            f"in {time.monotonic() - started:.0f} s"
        )
        probe = Probe(db.url, sessions, events)
        probe.start()
        await asyncio.sleep(1.0)
        args = ["-c", RELEASED_RUN, db.url, str(RELEASED)] if released else ["-c", CURRENT, db.url]
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(sys.executable, *args)
        await proc.wait()
        total = time.monotonic() - started
        await asyncio.sleep(1.0)
        await probe.stop()
        kind = "released revisions (one transaction)" if released else "online revisions"
        lines = [
            f"### {backend}: upgrade 0002 -> head, {kind}",
            "",
            f"{sessions:,} sessions, {sessions * events:,} events; the upgrade took "
            f"{total:.1f} s (exit {proc.returncode}); the probe's operations meanwhile:",
            "",
            "| operation | done | median ms | longest ms | errors |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, times in probe.times.items():
            lines.append(
                f"| {name} | {len(times)} | {statistics.median(times) * 1000:.1f} "
                f"| {max(times) * 1000:.0f} | {probe.errors[name]} |"
            )
        lines += ["", f"Statements prepared again after a column change: {probe.replanned}.", ""]
        print("\n".join(lines))
        return lines
    finally:
        await engine.dispose()
        if not keep:
            await db.drop()
            shutil.rmtree(tmpdir, ignore_errors=True)
        else:
            print(f"kept: {db.url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.online_migration")
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10, help="events per session")
    parser.add_argument("--released", action="store_true", help="the released revisions")
    parser.add_argument(
        "--compare", action="store_true", help="the online revisions, then the released ones"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--out", type=Path, help="write online_migration.md into this directory")
    args = parser.parse_args(argv)
    kinds = [False, True] if args.compare else [args.released]
    lines = [
        "# Online migrations: an upgrade under a live probe",
        "",
        "A probe reads a session, reads a transcript and appends an event every 50 ms while "
        "the upgrade runs in a process of its own.",
        "",
    ]
    for released in kinds:
        lines += asyncio.run(measure(args.backend, args.sessions, args.events, released, args.keep))
    command = " ".join(["python -m benchmarks.online_migration", *(argv or sys.argv[1:])])
    lines += [f"Command: `{command}`", ""]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "online_migration.md").write_text("\n".join(lines), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
