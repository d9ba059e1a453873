"""How long revision 0007 (event contents as ``json`` on Postgres) takes on a filled table.

    python -m benchmarks.migration_cost [--sessions 2000] [--events 100]

A fresh Postgres database at revision 0006 gets ``--sessions`` sessions of ``--events``
small events each (an assistant message of about 150 bytes, as the OpenAI Agents SDK
writes them), written in one statement; then the upgrade to 0007, the downgrade to 0006
and the upgrade again are timed. Each rewrites ``ds_events`` under an exclusive lock and
computes every event's search vector again.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions.migrate import downgrade, upgrade

from .common import Database, new_tmpdir

FILL_SESSIONS = (
    "INSERT INTO ds_sessions (org_id, id, user_id, app_name, title, state, parent_id, "
    "created_at, updated_at, message_count, token_total, event_seq, version, incarnation) "
    "SELECT 'org', 's' || n, 'u', 'app', '', '{}', NULL, now(), now(), 0, 0, :events, 1, 'i' "
    "FROM generate_series(1, :sessions) AS n"
)
FILL_EVENTS = (
    "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, content, "
    "state_delta, tokens, timestamp) "
    "SELECT 'org', 's' || s, q, md5(s::text || '/' || q::text), 'assistant', 'run', "
    "jsonb_build_object('id', 'msg_' || q, 'type', 'message', 'role', 'assistant', "
    "'content', jsonb_build_array(jsonb_build_object('type', 'output_text', "
    "'text', 'Sunny, 24 degrees, light wind in Paris today, turn ' || q, "
    "'annotations', '[]'::jsonb))), '{}', 0, now() "
    "FROM generate_series(1, :sessions) AS s, generate_series(1, :events) AS q"
)


async def measure(sessions: int, events: int) -> None:
    tmpdir = new_tmpdir()
    db = Database("postgres", "migration", tmpdir)
    await db.create()
    engine = create_async_engine(db.url)
    try:
        await upgrade(engine, "0006")
        async with engine.begin() as conn:
            params = {"sessions": sessions, "events": events}
            await conn.execute(text(FILL_SESSIONS), params)
            await conn.execute(text(FILL_EVENTS), params)
        async with engine.connect() as conn:
            size = await conn.scalar(
                text("SELECT pg_size_pretty(pg_total_relation_size('ds_events'))")
            )
        print(f"{sessions * events:,} events in ds_events ({size})")
        for label, step in (
            ("upgrade 0006 -> 0007", lambda: upgrade(engine)),
            ("downgrade 0007 -> 0006", lambda: downgrade(engine, "0006")),
            ("upgrade 0006 -> 0007 again", lambda: upgrade(engine)),
        ):
            started = time.perf_counter()
            await step()
            print(f"{label}: {time.perf_counter() - started:.1f} s")
    finally:
        await engine.dispose()
        await db.drop()
        shutil.rmtree(tmpdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migration_cost")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--events", type=int, default=100, help="events per session")
    args = parser.parse_args(argv)
    asyncio.run(measure(args.sessions, args.events))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
