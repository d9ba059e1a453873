"""Database URLs: the one place that turns a URL a user typed into the URL the store runs on.

The command line, the ``alembic`` command (``migrations/env.py``) and ``SQLStore.from_url``
accept the same URLs through :func:`async_url`: the async URLs themselves
(``sqlite+aiosqlite:///sessions.db``, ``postgresql+asyncpg://user@host/db``,
``mysql+asyncmy://user@host/db``, ``mariadb+asyncmy://user@host/db``) and the plain
``sqlite://``, ``postgresql://``, ``postgres://``, ``mysql://`` and ``mariadb://`` forms,
which get their async driver.
A Postgres URL may name its TLS mode libpq's way (``?sslmode=require``) or asyncpg's
(``?ssl=require``).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import URL, make_url
from sqlalchemy import exc as sa_exc

from ..errors import InvalidArgumentError
from .dialect import SUPPORTED

__all__ = ["ASYNC_DRIVERS", "async_url", "missing_driver", "sqlite_file"]

ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "mysql": "mysql+asyncmy",
    "mariadb": "mariadb+asyncmy",
}
"""Plain URL schemes and the async driver each is mapped to."""

DRIVER_EXTRAS = {"aiosqlite": "sqlite", "asyncpg": "postgres", "asyncmy": "mysql"}
"""The extra of durable-sessions that installs each async driver."""


def missing_driver(url: URL) -> str:
    """The one line that says a URL's driver is not installed, naming its extra."""
    driver = url.get_driver_name()
    extra = DRIVER_EXTRAS.get(driver)
    install = f"pip install 'durable-sessions[{extra}]'" if extra else f"install {driver}"
    return f"the {driver} driver is not installed: {install}"


EXAMPLES = "sqlite:///sessions.db, postgresql://user@host:5432/db or mysql://user@host:3306/db"

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""The TLS modes of a Postgres URL (libpq's ``sslmode``, asyncpg's ``ssl``)."""
_SSL_FILES = {
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslcrl": "PGSSLCRL",
}


def async_url(raw: str | URL) -> URL:
    """Parse a database URL and give a plain ``sqlite://``, ``postgresql://``, ``mysql://`` or
    ``mariadb://`` URL its driver.

    Args:
        raw: The URL as the user gave it, or a ``sqlalchemy.URL``.

    Returns:
        The URL with the async driver SQLStore runs on (aiosqlite, asyncpg or asyncmy).

    Raises:
        InvalidArgumentError: The text is not a URL, or it names a database or driver
            SQLStore does not run on. The message never repeats the text: it may hold a
            password.
    """
    if isinstance(raw, URL):
        url = raw
    else:
        try:
            url = make_url(raw)
        except (sa_exc.ArgumentError, ValueError):
            raise InvalidArgumentError(
                f"the database URL is not valid; expected e.g. {EXAMPLES}"
            ) from None
    url = url.set(drivername=ASYNC_DRIVERS.get(url.drivername, url.drivername))
    try:
        pair = (url.get_backend_name(), url.get_driver_name())
    except (sa_exc.ArgumentError, ValueError):  # pragma: no cover - defensive
        pair = ("", "")
    if pair not in SUPPORTED:
        raise InvalidArgumentError(
            f"unsupported database URL scheme {url.drivername!r}; use sqlite:// "
            "(sqlite+aiosqlite://), postgresql:// (postgresql+asyncpg://), mysql:// "
            "(mysql+asyncmy://) or mariadb:// (mariadb+asyncmy://)"
        )
    return _postgres_tls(url) if pair[0] == "postgresql" else url


def _postgres_tls(url: URL) -> URL:
    """Give asyncpg the TLS mode as ``ssl=``: it takes libpq's ``sslmode`` as an unknown
    keyword (a TypeError at connect time), and names an unknown mode only in a traceback."""
    query = dict(url.query)
    for name, variable in _SSL_FILES.items():
        if name in query:
            raise InvalidArgumentError(
                f"the URL parameter {name!r} is not taken by asyncpg; set the environment "
                f"variable {variable} to the file instead"
            )
    if "sslmode" in query:
        mode = query.pop("sslmode")
        if query.setdefault("ssl", mode) != mode:
            raise InvalidArgumentError("the URL gives both ssl and sslmode; give one of them")
    given = query.get("ssl")
    if given is not None and given not in SSL_MODES:
        raise InvalidArgumentError(
            f"the URL's TLS mode (ssl or sslmode) must be one of {', '.join(SSL_MODES)}"
        )
    return url.set(query=query)


def sqlite_file(url: URL) -> Path | None:
    """Return the file a SQLite URL names, or None (another database, memory or a URI)."""
    name = url.database
    if url.get_backend_name() != "sqlite" or not name or name == ":memory:":
        return None
    return None if name.startswith("file:") else Path(name)
