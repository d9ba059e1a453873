"""The settings every MySQL connection of a store gets, and the server's checks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from ....errors import StoreError

__all__ = ["GROUP_CONCAT_MAX", "check_packet", "install_mysql_session", "required_packet"]

_SESSION_DONE = "durable_sessions_mysql_session"

GROUP_CONCAT_MAX = 1 << 30
"""``group_concat_max_len`` of the store's connections (1 GB, MariaDB's largest): shared
state is aggregated as one JSON text with ``GROUP_CONCAT``, which the server's default
(1 MB) would cut short."""

MIN_PACKET = 16 << 20
"""The smallest ``max_allowed_packet`` a store runs with (MariaDB's default)."""


def install_mysql_session(engine: Engine) -> None:
    """Give every MySQL connection of ``engine`` the store's ``group_concat_max_len`` (a
    setting of the connection's session, which nothing else of the library changes).

    Runs at checkout, once per DBAPI connection (like SQLite's pragmas), so connections
    pooled before the store was made get it too.
    """
    if on_checkout in list(engine.pool.dispatch.checkout):
        return
    event.listen(engine, "checkout", on_checkout)


def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
    """Set the session's ``group_concat_max_len`` once per connection."""
    if record.info.get(_SESSION_DONE):
        return
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX}")
    finally:
        cursor.close()
    record.info[_SESSION_DONE] = True


on_checkout.done_key = _SESSION_DONE  # type: ignore[attr-defined]


def required_packet(max_value_bytes: int | None) -> int:
    """The ``max_allowed_packet`` a store needs: a statement carries a value of up to
    ``max_value_bytes`` as an escaped literal (each byte at most two), and more besides.
    With no value limit, ``MIN_PACKET``: a statement larger than the server takes then
    fails (``StoreUnavailableError``: the server drops the connection)."""
    if max_value_bytes is None:
        return MIN_PACKET
    return max(MIN_PACKET, 2 * max_value_bytes + (1 << 20))


def check_packet(found: int, max_value_bytes: int | None) -> None:
    """Raise ``StoreError`` naming the setting when the server's ``max_allowed_packet``
    (``found``) is below what the store needs."""
    needed = required_packet(max_value_bytes)
    if found < needed:
        megabytes = -(-needed // (1 << 20))
        raise StoreError(
            f"the MySQL server's max_allowed_packet is {found} bytes; durable-sessions needs "
            f"at least {needed} (max_value_bytes={max_value_bytes}): set max_allowed_packet = "
            f"{megabytes}M in the server's configuration (or SET GLOBAL max_allowed_packet = "
            f"{needed}), or lower max_value_bytes"
        )
