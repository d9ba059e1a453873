"""Work run in spawned OS processes by the reliability scenarios.

``run_at_barrier`` waits until every process of a scenario has started, then runs one job:
the jobs of ``tests/support/workers.py`` (``touch``, ``append``, ``migrate``) or the ones below,
which write every scope and report what they did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore, StaleSessionError
from reliability.helpers import wait_at_barrier
from support import workers

__all__ = ["OWN_JOBS", "PROCESSES", "in_processes", "run_at_barrier", "scoped_keys"]

PROCESSES = 4
"""Worker processes of the multi-process scenarios (each scenario uses at most this many)."""


def scoped_keys(prefix: str, i: int) -> dict[str, Any]:
    """The three keys (private, ``user:``, ``app:``) one write of a scenario sets."""
    return {f"own-{prefix}-{i}": i, f"user:{prefix}-{i}": i, f"app:{prefix}-{i}": i}


async def _save_keys(manager: Manager, args: dict[str, Any]) -> dict[str, int]:
    for i in range(args["saves"]):
        session = await manager.get(args["org_id"], args["session_id"])
        for key, value in scoped_keys(args["prefix"], i).items():
            session.set(key, value)
        await manager.save(session)
    return {"operations": args["saves"]}


async def _append_keys(manager: Manager, args: dict[str, Any]) -> dict[str, int]:
    for i in range(args["times"]):
        await manager.store.append_event(
            args["org_id"],
            args["session_id"],
            Event(
                "agent",
                content=[args["prefix"], i],
                state_delta=scoped_keys(args["prefix"], i),
                tokens=1,
            ),
        )
    return {"operations": args["times"]}


async def _create(manager: Manager, args: dict[str, Any]) -> dict[str, int]:
    for i in range(args["count"]):
        await manager.create(
            args["org_id"],
            args["user_id"],
            id=f"{args['prefix']}-{i}",
            state=scoped_keys(args["prefix"], i),
        )
    return {"operations": args["count"]}


async def _stale_rounds(manager: Manager, args: dict[str, Any]) -> dict[str, Any]:
    """Each round: load the session, wait for the rival, change every scope, save."""
    me = args["me"]
    outcomes: list[str] = []
    for r in range(args["rounds"]):
        session = await manager.get(args["org_id"], args["session_id"])
        wait_at_barrier(f"{args['barrier_root']}/round-{r}", 2)
        session.set("k", f"{me}-{r}")
        session.set("user:from", f"{me}-{r}")
        session.set(f"app:{me}-{r}", r)
        session.set(f"only-{me}-{r}", r)
        try:
            await manager.save(session)
            outcomes.append("won")
        except StaleSessionError:
            outcomes.append("stale")
    return {"operations": args["rounds"], "outcomes": outcomes}


OWN_JOBS = {
    "save_keys": _save_keys,
    "append_keys": _append_keys,
    "create": _create,
    "stale_rounds": _stale_rounds,
}


async def _run(url: str, job: str, args: dict[str, Any]) -> dict[str, Any]:
    engine = create_async_engine(url)
    try:
        manager = Manager(SQLStore(engine), app_name=args.get("app_name", "app"))
        return await OWN_JOBS[job](manager, args)
    finally:
        await engine.dispose()


def run_at_barrier(barrier: str, parties: int, url: str, job: str, args: dict[str, Any]) -> Any:
    """Wait until ``parties`` processes reached ``barrier``, then run ``job`` in a new loop."""
    wait_at_barrier(barrier, parties)
    if job in OWN_JOBS:
        return asyncio.run(_run(url, job, args))
    return workers.run(url, job, args)


def in_processes(
    pool: ProcessPoolExecutor, url: str, jobs: Iterable[tuple[str, dict[str, Any]]], barrier: str
) -> list[Any]:
    """Run each job in its own worker process, all starting together at ``barrier``.

    The pool must have a worker per job: the barrier then proves that the jobs overlap.
    """
    jobs = list(jobs)
    futures = [
        pool.submit(run_at_barrier, barrier, len(jobs), url, job, args) for job, args in jobs
    ]
    return [f.result(timeout=240) for f in futures]
