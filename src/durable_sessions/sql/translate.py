"""The one error map: driver and SQLAlchemy errors to the library's error tree.

Used by the store's runner, the export and import, the migrations and the command line, so
the same failure reads the same everywhere: the library's class, the operation, and the
driver's own message (its first line, never a URL or password).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
from contextvars import Token
from types import TracebackType

from sqlalchemy import exc as sa_exc

from ..errors import SchemaNotMigratedError, SessionError, StoreError, StoreUnavailableError
from .attempts import CURRENT, MIGRATE_HINT, Attempt

__all__ = [
    "Translated",
    "describe",
    "driver_error",
    "is_disconnect",
    "is_timeout",
    "mysql_errno",
    "translate_error",
    "translated",
]

_MISSING_SCHEMA = ("no such table", "no such column", "does not exist")
# Connection exceptions, authorisation, missing catalog (database), resources, shutdowns.
_UNAVAILABLE_SQLSTATES = ("08", "28", "3D", "53", "57P")
# Raised only by a connection attempt: authorisation, no such database, too many
# connections, the server starting up.
_CONNECT_SQLSTATES = ("28", "3D", "53300", "57P03")
_HINT = MIGRATE_HINT
# What must never reach a message: a URL or DSN (it may carry a password), password=...
_SECRETS = re.compile(r"[a-z][a-z0-9+.-]*://\S*|\bpassword\s*[=:]\s*\S*", re.IGNORECASE)
_BACKGROUND = re.compile(r"\s*\(Background on this error at:[^)]*\)")


_DRIVER_ERRORS = (
    sa_exc.DBAPIError,
    sqlite3.Error,
    OSError,
    TimeoutError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
)
# asyncpg's and asyncmy's own errors, and SQLAlchemy's adapters of them (raised by the pool).
_DRIVER_MODULES = ("asyncpg", "asyncmy", "sqlalchemy.dialects")

# MySQL's error numbers: no such table, no such column.
_MYSQL_MISSING_SCHEMA = (1146, 1054)
# Raised only by a connection attempt: access denied (to the server, to the database), no
# such database, too many connections, cannot connect, unknown host.
_MYSQL_CONNECT = (1044, 1045, 1049, 1040, 1203, 2003, 2005)
# The connection is gone: server gone away, lost, killed, shut down, closed.
_MYSQL_DISCONNECT = (2006, 2013, 2014, 2045, 2055, 1053, 1927, 4031)


def translated(operation: str, *, writes: bool = True, creates: bool = False) -> Translated:
    """Turn driver and SQLAlchemy errors into the library's error tree (a ``with`` block).

    The error names the driver's own message (never a URL or password). It says the
    operation may not have completed only when ``writes`` and a connection was made, for
    then a write may have reached the server; a failed connection attempt wrote nothing.
    A SQLite file that does not exist is not created (``SchemaNotMigratedError``), unless
    ``creates`` (migrations).
    """
    return Translated(operation, writes, creates)


class Translated:
    """``translated``'s context manager: a class rather than a generator, for it wraps every
    store operation (entered and left in about half a generator's time)."""

    __slots__ = ("_attempt", "_token", "_writes")

    def __init__(self, operation: str, writes: bool, creates: bool) -> None:
        self._attempt = Attempt(operation, creates=creates)
        self._writes = writes
        self._token: Token[Attempt | None] | None = None

    def __enter__(self) -> None:
        self._token = CURRENT.set(self._attempt)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if (
                isinstance(exc, Exception)
                and not isinstance(exc, SessionError)
                and (
                    isinstance(exc, _DRIVER_ERRORS)
                    or type(exc).__module__.startswith(_DRIVER_MODULES)
                )
            ):
                attempt = self._attempt
                raise translate_error(
                    attempt.operation, exc, writes=self._writes, connecting=attempt.connecting
                ) from exc
            # No exception, or one that is not the driver's: it propagates unchanged.
        finally:
            token, self._token = self._token, None
            try:
                if token is not None:
                    CURRENT.reset(token)
            except ValueError:  # left in another context (an async generator moved on)
                CURRENT.set(None)


def driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception behind SQLAlchemy's wrappers and adapters."""
    found = getattr(exc, "orig", None) or exc
    while type(found).__module__.startswith("sqlalchemy") and found.__cause__ is not None:
        found = found.__cause__
    return found


def describe(exc: BaseException) -> str:
    """``Name: the driver's message``: its first line, without a URL or password."""
    text = _BACKGROUND.sub("", str(exc)).strip()
    line = " ".join(text.splitlines()[0].split()) if text else ""
    line = _SECRETS.sub("[...]", line)
    if len(line) > 300:
        line = line[:297] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def translate_error(
    operation: str, exc: BaseException, *, writes: bool = True, connecting: bool = False
) -> SessionError:
    """The library's error for a driver or SQLAlchemy error raised during ``operation``."""
    orig = driver_error(exc)
    cause = describe(orig)
    text = str(orig).lower()
    sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    errno = mysql_errno(orig)
    if (
        errno in _MYSQL_MISSING_SCHEMA
        or sqlstate in ("42P01", "42703", "428C9")
        or (
            type(orig).__name__ in ("OperationalError", "ProgrammingError")
            and any(marker in text for marker in _MISSING_SCHEMA)
            and not sqlstate.startswith(_CONNECT_SQLSTATES)  # 3D000: the database does not exist
        )
    ):
        return SchemaNotMigratedError(
            f"{operation}: the database schema is missing or out of date ({cause}); {_HINT}"
        )
    if isinstance(exc, sa_exc.TimeoutError):  # the pool had no connection free in time
        return StoreUnavailableError(
            f"{operation}: no pooled connection became free in time ({cause}); nothing was written"
        )
    never_connected = (
        connecting
        or errno in _MYSQL_CONNECT
        or sqlstate.startswith(_CONNECT_SQLSTATES)
        or isinstance(orig, (ConnectionRefusedError, socket.gaierror))
        or (isinstance(orig, sqlite3.Error) and "unable to open database file" in text)
    )
    if never_connected:
        return StoreUnavailableError(
            f"{operation}: could not connect to the database ({cause}); nothing was written"
        )
    if is_timeout(orig):
        if not writes:
            return StoreUnavailableError(
                f"{operation}: the database did not answer within the driver's timeout ({cause})"
            )
        return StoreUnavailableError(
            f"{operation}: the database did not answer within the driver's timeout ({cause}); "
            "the statement was cancelled, but may have completed first: read back before retrying"
        )
    if (
        is_disconnect(orig)
        or getattr(exc, "connection_invalidated", False)
        or sqlstate.startswith(_UNAVAILABLE_SQLSTATES)
    ):
        if not writes:
            return StoreUnavailableError(
                f"{operation}: the connection to the database failed ({cause})"
            )
        return StoreUnavailableError(
            f"{operation}: the connection to the database failed ({cause}); the operation may "
            "not have completed: read back before retrying"
        )
    if "database is locked" in text or "database is busy" in text:
        return StoreUnavailableError(
            f"{operation}: the database stayed locked past the busy timeout ({cause}); "
            "nothing was written"
        )
    return StoreError(f"{operation}: the database failed ({cause}); nothing was written")


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a driver's timeout on a statement (asyncpg's ``command_timeout``
    or ``timeout=``): the server did not answer in time, which says nothing of the
    connection; the driver has asked the server to cancel the statement."""
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError))


def mysql_errno(exc: BaseException) -> int | None:
    """The MySQL error number of an asyncmy error (its first argument), or None; behind
    SQLAlchemy's wrapper too."""
    exc = getattr(exc, "orig", None) or exc
    if not type(exc).__module__.startswith("asyncmy"):
        return None
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone or unusable (a timeout does not)."""
    if is_timeout(exc):
        return False
    if isinstance(exc, (OSError, ConnectionError)):
        return True
    module = type(exc).__module__
    if module.startswith("asyncmy"):
        errno = mysql_errno(exc)
        # InterfaceError: the connection is closed (asyncmy's "(0, '')").
        return errno in _MYSQL_DISCONNECT or type(exc).__name__ == "InterfaceError"
    if module.startswith("asyncpg"):
        import asyncpg  # type: ignore[import-untyped]

        return isinstance(
            exc,
            (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CannotConnectNowError,
                # The protocol is stuck mid-operation (e.g. the server ended the session
                # under it): the connection cannot be used again.
                asyncpg.InternalClientError,
            ),
        )
    return False
