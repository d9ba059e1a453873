"""Serve the viewer: a store on a read-only connection, behind uvicorn."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import URL

try:
    import uvicorn
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        'serving the web viewer needs the optional "web" extra: '
        f'pip install "durable-sessions[web]" ({exc})'
    ) from exc
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import InvalidArgumentError, SchemaNotMigratedError
from ..model import Filter
from ..sql import migrate
from ..sql.store import SQLStore
from ..sql.urls import async_url
from .app import create_app

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "read_only_engine", "serve"]

DEFAULT_HOST = "127.0.0.1"
"""The address ``serve`` binds unless told otherwise: this machine only."""
DEFAULT_PORT = 8765
"""The port ``serve`` listens on unless told otherwise."""

logger = logging.getLogger("durable_sessions.web")


def read_only_engine(url: str | URL) -> AsyncEngine:
    """Return an engine on ``url`` whose connections cannot write.

    SQLite opens the file with ``mode=ro`` (it must exist); Postgres starts every
    transaction read-only (``default_transaction_read_only``), and MySQL sets its session's
    transactions read-only, so a statement that writes fails in the database itself.

    Raises:
        InvalidArgumentError: the URL is not valid, names an unsupported database, or
            names no SQLite file (an in-memory database has nothing to show).
        SchemaNotMigratedError: the SQLite file does not exist.
    """
    parsed = async_url(url)
    if parsed.get_backend_name() == "sqlite":
        name = parsed.database or ""
        if not name or name == ":memory:" or name.startswith("file:"):
            raise InvalidArgumentError(
                "the viewer needs a SQLite database file, e.g. sqlite:///sessions.db"
            )
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise SchemaNotMigratedError(f"there is no database file {str(path)!r}")
        read_only = parsed.set(
            database=f"file:{quote(str(path))}",
            query={**parsed.query, "mode": "ro", "uri": "true"},
        )
        return create_async_engine(read_only)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        # Every transaction of the session is read-only: a write fails in the server.
        mysql_options: dict[str, Any] = {
            "connect_timeout": 10,
            "init_command": "SET SESSION TRANSACTION READ ONLY",
        }
        return create_async_engine(parsed, connect_args=mysql_options)
    options: dict[str, Any] = {
        "timeout": 10,  # asyncpg waits 60 s by default
        "server_settings": {"default_transaction_read_only": "on"},
    }
    return create_async_engine(parsed, connect_args=options)


class _AccessLog:
    """Log each request's method, path (never its query: it may hold the token) and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def logging_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                logger.info("%s %s %s", scope["method"], scope["path"], message["status"])
            await send(message)

        await self.app(scope, receive, logging_send)


def _log_config() -> dict[str, Any]:
    """uvicorn's logging, with the viewer's own logger on its default handler."""
    config: dict[str, Any] = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["durable_sessions.web"] = {
        "handlers": ["default"],
        "level": "INFO",
        "propagate": False,
    }
    return config


async def serve(
    url: str | URL,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    org_id: str | None = None,
    token: str | None = None,
) -> None:
    """Serve the viewer of the database at ``url`` until interrupted.

    The database is opened read-only (see ``read_only_engine``) and checked once (reachable,
    its schema at this version's head) before the server starts. Logs name the database
    with its password masked, and requests without their query string.

    Args:
        url: The database, as the command line takes it (``sqlite:///sessions.db``,
            ``postgresql://user@host/db``).
        host: The address to bind; this machine only by default.
        port: The port to listen on.
        org_id: Show this organisation only (see ``create_app``).
        token: Require this token on every request (see ``create_app``).

    Raises:
        InvalidArgumentError: the URL, ``org_id`` or ``token`` is not valid.
        SchemaNotMigratedError: the database has no schema at this version's head.
        SchemaTooNewError: a newer durable-sessions migrated the database.
        StoreUnavailableError: the database cannot be reached.
    """
    engine = read_only_engine(url)
    try:
        store = SQLStore(engine)
        app = create_app(store, org_id=org_id, token=token)
        revision = await migrate.current(engine)
        migrate.check_known(revision)
        if revision != migrate.head():
            raise SchemaNotMigratedError(
                f"the database schema is at {revision or 'no revision'}, this version "
                f"needs {migrate.head()}; run `durable-sessions migrate`"
            )
        await store.list_page(Filter(org_id=org_id or "default", limit=1))
        safe = async_url(url).render_as_string(hide_password=True)
        config = uvicorn.Config(
            _AccessLog(app),
            host=host,
            port=port,
            lifespan="off",
            access_log=False,
            server_header=False,
            log_config=_log_config(),
        )
        server = uvicorn.Server(config)
        logger.info(
            "viewing %s read-only%s%s",
            safe,
            f", organisation {org_id!r} only" if org_id is not None else "",
            ", token required" if token is not None else "",
        )
        await server.serve()
    finally:
        await engine.dispose()
