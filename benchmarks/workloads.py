"""The eight workloads, written once over the primitives each implementation provides."""

from __future__ import annotations

import abc
import itertools
from typing import Any

from .common import LIST_USER, Counters, Op, run_parallel

LIST_SIZE = 1_000
"""Sessions of the listed user (list50 returns the 50 newest of these)."""
TRANSCRIPT = 1_000
"""Events of the session whose 20 most recent are read (get_recent20)."""
CONTENT = {"role": "user", "parts": [{"text": "What is the weather like in Paris today?"}]}


def state_for(worker: int, i: int) -> dict[str, Any]:
    """One private, one ``user:`` and one ``app:`` key; each worker its own shared keys."""
    return {"k": i, f"user:k{worker}": i, f"app:k{worker}": i}


class Implementation(abc.ABC):
    """One way of doing the work: durable-sessions, Google ADK or the raw driver."""

    name: str = ""
    counters: Counters | None = None
    pool_size: int = 16
    """Connections kept open: SQLAlchemy's ``pool_size`` (overflow 10 on top), or the floor's."""
    pool_lifo: bool = False
    """Whether SQLAlchemy's pool lends the connection returned last (``pool_use_lifo``)
    rather than its default, the one idle longest."""

    def __init__(self) -> None:
        self._recent: Any = None
        self._listed = False
        self._seq = itertools.count(1)

    # -- life cycle ----------------------------------------------------------------------

    @abc.abstractmethod
    async def open(self, url: str) -> None:
        """Connect to a fresh database and create the schema."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    def counting(self, on: bool) -> None:
        """Send the primitives to the instance whose engine counts statements (on) or to
        the one that is timed (off). The floor counts by hand and has one instance."""
        del on

    async def release_counting(self) -> None:
        """Close the pooled connections of the counting instance, if any.

        Called after each measurement. The counting instance is warmed again before every
        counting pass, so counts do not change; without this, the idle counting pools of
        four implementations (16 connections each) would exceed Postgres' default
        ``max_connections`` of 100 next to the timed pools.
        """
        return  # the floor has one instance and counts by hand

    # -- primitives ----------------------------------------------------------------------

    @abc.abstractmethod
    async def create(self, user_id: str, state: dict[str, Any]) -> Any:
        """Create a session; return a handle the other primitives accept."""

    @abc.abstractmethod
    async def get(self, handle: Any, recent: int | None) -> int:
        """Read a session with its state and events (newest ``recent``); return #events."""

    @abc.abstractmethod
    async def save(self, handle: Any, worker: int, i: int) -> None:
        """Write one private, one ``user:`` and one ``app:`` key."""

    @abc.abstractmethod
    async def append(self, handle: Any, worker: int, i: int) -> None:
        """Append an event whose state_delta touches the three scopes."""

    @abc.abstractmethod
    async def list50(self, user_id: str) -> int:
        """List the 50 most recently updated sessions of a user; return how many."""

    @abc.abstractmethod
    async def fork(self, handle: Any) -> Any:
        """Fork a session (private state copied, shared state shared)."""

    @abc.abstractmethod
    async def delete(self, handle: Any) -> None:
        """Delete a session."""

    # -- workloads -----------------------------------------------------------------------

    async def _sessions(self, workers: int, label: str) -> list[Any]:
        return await run_parallel(
            workers, 4, lambda w: self.create(f"u{w}", {**state_for(w, 0), "label": label})
        )

    async def _recent_session(self) -> Any:
        if self._recent is None:
            handle = await self.create("reader", state_for(0, 0))
            for i in range(TRANSCRIPT):
                await self.append(handle, 0, i)
            self._recent = handle
        return self._recent

    async def _list_user(self) -> None:
        if not self._listed:
            # The first alone: ADK's service makes a user's state row with their first
            # session, and two first sessions at once collide on MySQL (a duplicate key).
            await self.create(LIST_USER, {"n": 0})
            await run_parallel(LIST_SIZE - 1, 4, lambda i: self.create(LIST_USER, {"n": i + 1}))
            self._listed = True

    async def make_ops(self, workload: str, workers: int, supply: int = 0) -> list[Op]:
        """Prepare the data a workload needs and return one op per worker.

        ``supply`` is, for ``delete``, how many sessions to create per worker beforehand.
        """
        seq = self._seq
        if workload == "create":

            def create_op(w: int) -> Op:
                return lambda: self.create(f"u{w}", state_for(w, next(seq)))

            return [create_op(w) for w in range(workers)]
        if workload == "get":
            handles = await self._sessions(workers, "get")
            assert await self.get(handles[0], None) == 0
            return [(lambda h=h: self.get(h, None)) for h in handles]
        if workload == "get_recent20":
            handle = await self._recent_session()
            got = await self.get(handle, 20)
            assert got == 20, f"{self.name}: get_recent20 returned {got} events"
            return [(lambda: self.get(handle, 20)) for _ in range(workers)]
        if workload in ("save", "append_event"):
            handles = await self._sessions(workers, workload)
            prim = self.save if workload == "save" else self.append

            def write_op(w: int, h: Any) -> Op:
                return lambda: prim(h, w, next(seq))

            return [write_op(w, h) for w, h in enumerate(handles)]
        if workload == "list50":
            await self._list_user()
            got = await self.list50(LIST_USER)
            assert got == 50, f"{self.name}: list50 returned {got} sessions"
            return [(lambda: self.list50(LIST_USER)) for _ in range(workers)]
        if workload == "fork":
            handles = await self._sessions(workers, "fork")
            return [(lambda h=h: self.fork(h)) for h in handles]
        if workload == "delete":
            per_worker = max(supply, 10)
            made = await run_parallel(
                per_worker * workers, 8, lambda i: self.create(f"u{i % workers}", {"d": i})
            )
            stacks = [made[w::workers] for w in range(workers)]

            def delete_op(stack: list[Any]) -> Op:
                return lambda: self.delete(stack.pop())

            return [delete_op(stack) for stack in stacks]
        raise ValueError(f"unknown workload {workload!r}")
