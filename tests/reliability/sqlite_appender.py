"""Append events to one SQLite session forever, printing each committed seq (flushed).

Run as a script by the SIGKILL scenario of ``test_faults.py``::

    python sqlite_appender.py URL ORG_ID SESSION_ID RUN

Each event carries ``content = "RUN-i"`` and a state delta with a ``user:`` and a private
key, so a half-applied append would show as an event without its keys (or the reverse).
A line is printed only after ``append_event`` returned, i.e. after the commit.
"""

from __future__ import annotations

import asyncio
import sys

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, SQLStore


def delta_of(run: str, i: int) -> dict[str, int]:
    """The state delta of the ``i``-th event of ``run``."""
    return {f"user:{run}-{i}": i, f"own-{run}-{i}": i}


async def main(url: str, org_id: str, session_id: str, run: str) -> None:
    """Append until killed."""
    engine = create_async_engine(url)
    store = SQLStore(engine)
    i = 0
    while True:
        stored = await store.append_event(
            org_id,
            session_id,
            Event("agent", content=f"{run}-{i}", state_delta=delta_of(run, i), tokens=1),
        )
        sys.stdout.write(f"{stored.seq}\n")
        sys.stdout.flush()
        i += 1


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
