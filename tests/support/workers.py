"""Work run in separate OS processes by the multi-process tests (spawned, so importable)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore


async def _run(url: str, job: str, args: dict[str, Any]) -> Any:
    engine = create_async_engine(url)
    store = SQLStore(engine)
    manager = Manager(store, app_name=args.get("app_name", "app"))
    try:
        if job == "save_user_keys":
            # One session per (process, task); each save sets a distinct user: key.
            for i in range(args["saves"]):
                session = await manager.get(args["org_id"], args["session_id"])
                session.set(f"user:{args['prefix']}-{i}", i)
                await manager.save(session)
        elif job == "touch":
            for _ in range(args["times"]):
                session = await manager.get(args["org_id"], args["session_id"])
                await manager.touch(session, 1, 3)
        elif job == "append":
            for i in range(args["times"]):
                await store.append_event(
                    args["org_id"],
                    args["session_id"],
                    Event("agent", content=i, state_delta={f"{args['prefix']}-{i}": i}, tokens=1),
                )
        elif job == "migrate":
            await store.migrate()
        else:
            raise ValueError(job)
    finally:
        await engine.dispose()
    return job


def run(url: str, job: str, args: dict[str, Any]) -> Any:
    """Run one job in this process's own event loop."""
    return asyncio.run(_run(url, job, args))
