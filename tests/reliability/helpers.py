"""Helpers shared by the reliability scenarios (the fixtures themselves live in conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Filter, Session, SessionNotFoundError, Store

__all__ = [
    "OwnedLoop",
    "canonical",
    "count_present",
    "event_view",
    "observe_org",
    "reset_tables",
    "session_view",
    "wait_at_barrier",
]

_T = TypeVar("_T")

TABLES = (
    "ds_events, ds_sessions, ds_user_state, ds_app_state, ds_memories, ds_memory_terms, ds_keys"
)


async def reset_tables(engine: AsyncEngine) -> None:
    """Empty every table of a migrated database: TRUNCATE on Postgres, DELETE on SQLite."""
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            await conn.exec_driver_sql(f"TRUNCATE {TABLES}")
        else:
            for table in TABLES.split(", "):
                await conn.exec_driver_sql(f"DELETE FROM {table}")


def canonical(value: Any) -> str:
    """A JSON value as text that tells ``1``, ``1.0`` and ``True`` apart and ignores key order."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=True)


def session_view(session: Session, *, with_times: bool = True) -> dict[str, Any]:
    """What a caller can observe of a session, as comparable plain data."""
    view: dict[str, Any] = {
        "id": session.id,
        "org_id": session.org_id,
        "user_id": session.user_id,
        "app_name": session.app_name,
        "title": session.title,
        "parent_id": session.parent_id,
        "message_count": session.message_count,
        "token_total": session.token_total,
        "version": session.version,
        "state": canonical(session.state),
    }
    if with_times:
        view["created_at"] = session.created_at.isoformat()
        view["updated_at"] = session.updated_at.isoformat()
    return view


def event_view(event: Event) -> tuple[Any, ...]:
    """What a caller can observe of a stored event, as a comparable tuple."""
    return (
        event.seq,
        event.id,
        event.author,
        event.invocation_id,
        canonical(event.content),
        canonical(event.state_delta),
        event.tokens,
        event.timestamp.isoformat(),
    )


async def observe_org(store: Store, org_id: str, *, with_times: bool = True) -> dict[str, Any]:
    """Everything the API shows of one organisation: sessions, merged state, transcripts.

    Listing order is kept; each listed session is read with ``get`` (state) and
    ``list_events`` (transcript). Without ``with_times``, the sessions' own timestamps are
    left out (two stores never stamp them alike); events keep theirs.
    """
    listed = await store.list(Filter(org_id))
    out: dict[str, Any] = {
        "list": [session_view(s, with_times=with_times) for s in listed],
        "sessions": {},
    }
    for meta in listed:
        try:
            full = await store.get(org_id, meta.id)
            events = await store.list_events(org_id, meta.id)
        except SessionNotFoundError:  # pragma: no cover - nothing deletes concurrently here
            continue
        out["sessions"][meta.id] = {
            "session": session_view(full, with_times=with_times),
            "events": [event_view(e) for e in events],
        }
    return out


def count_present(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> int:
    """How many of the expected keys are stored with exactly the expected value."""
    return sum(
        1
        for key, value in expected.items()
        if key in actual and canonical(actual[key]) == canonical(value)
    )


class OwnedLoop:
    """An event loop owned by a synchronous test (hypothesis drives it step by step)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine to completion on the owned loop."""
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Finish pending async generators and close the loop."""
        try:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()


def wait_at_barrier(directory: str, parties: int, timeout: float = 60.0) -> None:
    """Block until ``parties`` callers (in any process) have reached the barrier directory.

    Every caller leaves a file; all of them go on once the directory holds ``parties``
    files. A process-safe start line that needs no shared manager process.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / uuid.uuid4().hex).touch()
    deadline = time.monotonic() + timeout
    while sum(1 for _ in folder.iterdir()) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {directory}: fewer than {parties} parties arrived")
        time.sleep(0.002)
