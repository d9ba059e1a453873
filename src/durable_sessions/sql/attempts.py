"""What a store operation knows about its connection attempts; read by ``translate.translated``.

``translated`` marks each store operation with an :class:`Attempt` in a context variable.
Two SQLAlchemy listeners read it, registered by ``watch_connects`` on the engine of each
store (``SQLStore`` calls it) and on no other engine: an application's other engines, and
its own use of the store's engine outside a store operation, are never affected.

* A SQLite file that does not exist is not created by a store operation: the connection is
  refused with ``SchemaNotMigratedError`` before SQLite would make an empty file. Migrating
  (``store.migrate()``, ``alembic upgrade head``, ``durable-sessions migrate``) creates it.
* A connection attempt that fails is told apart from a connection that failed in use: only
  in the second case can a write have reached the server.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from ..errors import SchemaNotMigratedError

__all__ = ["CURRENT", "Attempt", "watch_connects"]

MIGRATE_HINT = "run `durable-sessions migrate`, `alembic upgrade head` or `await store.migrate()`"


@dataclass
class Attempt:
    """One store operation: its name, and whether it is opening a connection right now."""

    operation: str
    creates: bool = False  # a migration: a SQLite file that does not exist is created
    connecting: bool = False


CURRENT: ContextVar[Attempt | None] = ContextVar("durable_sessions_attempt", default=None)
"""The store operation running in this context, if any."""


def _sqlite_path(cargs: Any, cparams: dict[str, Any]) -> Path | None:
    name = cargs[0] if cargs else cparams.get("database")
    if not isinstance(name, str) or not name or name == ":memory:":
        return None
    if cparams.get("uri") or name.startswith("file:"):
        return None  # a URI names its own open mode
    return Path(name)


def _on_do_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    attempt = CURRENT.get()
    if attempt is None:
        return
    if dialect.name == "sqlite" and not attempt.creates:
        path = _sqlite_path(cargs, cparams)
        if path is not None and not path.exists():
            raise SchemaNotMigratedError(
                f"{attempt.operation}: there is no database file {str(path)!r} (a store "
                f"does not create one); {MIGRATE_HINT}"
            )
    attempt.connecting = True


def _on_connect(dbapi_connection: Any, record: Any) -> None:
    attempt = CURRENT.get()
    if attempt is not None:
        attempt.connecting = False


def watch_connects(engine: Engine) -> None:
    """Register the two listeners on ``engine`` (its dialect's ``do_connect`` and its pool's
    ``connect``), once: stores sharing an engine share them.

    Looked for in the dispatch itself: a pool that ``engine.dispose()`` made anew carries
    its predecessor's listeners, which ``event.contains`` does not see there.
    """
    if _on_do_connect not in list(engine.dialect.dispatch.do_connect):
        event.listen(engine, "do_connect", _on_do_connect)
    if _on_connect not in list(engine.pool.dispatch.connect):
        event.listen(engine.pool, "connect", _on_connect)
