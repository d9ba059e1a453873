"""This process's writers to one SQLite file: the queue they wait in and one write's journey."""

from __future__ import annotations

import asyncio
import sqlite3
import weakref
from collections import deque
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ..._private import aiosqlite_connection, aiosqlite_execute
from ...runner import Program

__all__ = [
    "GROUP_MAX",
    "Hop",
    "Job",
    "Writers",
    "end_transaction",
    "restore",
    "write_lock",
    "writers_of",
]


class Writers:
    """This process's writers to one SQLite engine, in one event loop: the lock that queues
    them (first come, first served) and the writes waiting to be taken into a transaction."""

    __slots__ = ("lock", "pending")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.pending: deque[Job] = deque()

    def take(self) -> list[Job]:
        """The waiting writes, oldest first, at most ``GROUP_MAX`` of them."""
        batch: list[Job] = []
        while self.pending and len(batch) < GROUP_MAX:
            job = self.pending.popleft()
            job.taken = True
            batch.append(job)
        return batch

    def put_back(self, jobs: list[Job]) -> None:
        """Return writes the worker thread never started, at the front, in their order."""
        for job in reversed(jobs):
            job.taken = False
            self.pending.appendleft(job)


GROUP_MAX = 32
"""The most writes committed together: a bound on how long one transaction holds SQLite's
write lock, which writers in other processes wait for."""

_WRITERS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Writers]] = (
    weakref.WeakKeyDictionary()
)


def writers_of(engine: AsyncEngine) -> Writers:
    """This process's writers to one SQLite engine, per event loop."""
    per_loop = _WRITERS.get(engine.sync_engine)
    if per_loop is None:
        per_loop = _WRITERS[engine.sync_engine] = weakref.WeakKeyDictionary()
    loop = asyncio.get_running_loop()
    writers = per_loop.get(loop)
    if writers is None:
        writers = per_loop[loop] = Writers()
    return writers


def write_lock(engine: AsyncEngine) -> asyncio.Lock:
    """The lock that queues this process's writers to one SQLite engine, per event loop."""
    return writers_of(engine).lock


class Hop:
    """One trip to aiosqlite's worker thread, as both sides see it."""

    __slots__ = ("clean", "done")

    def __init__(self) -> None:
        self.done = False  # set by the thread: it has finished with the connection
        self.clean = False  # set by the thread: and left it outside any transaction


class Job:
    """One write program, from its caller to the worker thread and back.

    The event loop sets ``taken`` (it is in a group) and ``abandoned`` (its caller is gone:
    commit nothing of it); the thread sets ``started`` and then the outcome, ``value`` (a
    one-item box) or ``error``.
    """

    __slots__ = ("abandoned", "error", "program", "started", "taken", "value")

    def __init__(self, program: Program[Any]) -> None:
        self.program = program
        self.taken = False
        self.abandoned = False
        self.started = False
        self.value: list[Any] = []
        self.error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Whether the thread has given this write its outcome."""
        return bool(self.value) or self.error is not None

    def outcome(self) -> Any:
        """The program's value, or its error raised."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.value.pop()


async def restore(driver: Any) -> bool:
    # The worker thread runs its queue in order: this runs once the program in flight has
    # finished with the connection.
    return bool(await aiosqlite_execute(driver, end_transaction, aiosqlite_connection(driver)))


def end_transaction(db: sqlite3.Connection) -> bool:
    """Roll back an open transaction; return whether the connection is outside one."""
    if db.in_transaction:
        db.rollback()
    return not db.in_transaction
