"""MySQL: ``ds_sessions.title`` holds a sealed title (``VARBINARY(8448)``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 23:50:00

With a keyring (encryption at rest) a store keeps each title sealed: the text
``dse1:<key id>:<base64(nonce + AES-GCM of the title's JSON)>``, up to ``SEALED_TITLE_BYTES``
bytes for the longest title a store takes (1,024 UTF-8 bytes). On MySQL (and MariaDB) the
column was ``VARBINARY(1024)`` (revision 0001), which holds the title in clear only; it
becomes ``VARBINARY(8448) NOT NULL`` (no default, as before). Titles are checked against
1,024 bytes as before: a title stored in clear never needs more. SQLite and Postgres keep
their titles as unbounded text: nothing to do there.

Online: a ``VARBINARY`` that grows and keeps a length prefix of two bytes (both sizes are
over 255) changes only the table's definition: ``ALGORITHM=INPLACE, LOCK=NONE``, which
MariaDB runs instantly (10.11: InnoDB keeps the table, see
``tests/sql/test_online_migrations.py``) and MySQL 8 in place without rebuilding the table
(its manual: extending a ``VARCHAR`` changes metadata only); a server that would have to
copy the table refuses the statement instead. The statement waits only for the table's
metadata lock, which a transaction that has read or written ``ds_sessions`` and not ended
holds: under the lock timeout, tried again until it gets it (``online.ddl``), so nobody
waits behind it longer than that timeout.

The downgrade first looks for a title longer than 1,024 bytes (a sealed one) and, if there
is one, refuses with ``CommandError`` and changes nothing: a store with a keyring on MySQL
needs this revision. Otherwise it narrows the column back to ``VARBINARY(1024)``, which a
server can only do by copying the table (``ALGORITHM=COPY, LOCK=SHARED``): reads go on,
writes to ``ds_sessions`` wait until the copy ends (the metadata lock is waited for as in
the upgrade). The copy runs in strict SQL mode, so that a sealed title written meanwhile
fails the statement rather than being cut.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic.util import CommandError
from sqlalchemy.engine import Connection

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TITLE_BYTES = 1024
"""The column before this revision (revision 0001): the longest title, in UTF-8 bytes."""

SEALED_TITLE_BYTES = 8448
"""The column after it, as ``durable_sessions.sql.schema.SEALED_TITLE_BYTES`` (copied: a
revision is a frozen snapshot). A title of 1,024 bytes has a JSON text of at most 6,146
bytes (1,024 control characters, each escaped as ``\\u0001``, and two quotes); sealed, a
12-byte nonce and a 16-byte tag make 6,174 bytes, 8,232 in base64, after a head
``dse1:<key id>:`` of at most 70 bytes (a key id has at most 64): 8,302, rounded up to
a multiple of 256."""


def _online() -> ModuleType:
    """The online steps of the revisions (``migrations/online.py``), loaded by path."""
    path = Path(__file__).resolve().parents[1] / "online.py"
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_online_{revision}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


online = _online()


def _alter(size: int, how: str) -> str:
    return f"ALTER TABLE ds_sessions MODIFY COLUMN title VARBINARY({size}) NOT NULL, {how}"


def _narrow(conn: Connection) -> None:
    """Narrow the column in strict SQL mode (a title too long fails the copy, never cut),
    then give the connection its own mode back."""
    mode = conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar()
    conn.exec_driver_sql(
        "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')"
    )
    try:
        conn.exec_driver_sql(_alter(TITLE_BYTES, "ALGORITHM=COPY, LOCK=SHARED"))
    finally:
        conn.exec_driver_sql("SET SESSION sql_mode = %s", (mode,))


def upgrade() -> None:
    """MySQL: widen ``ds_sessions.title`` to ``VARBINARY(8448)``, in place."""
    if not online.mysql():
        return
    online.ddl(
        _alter(SEALED_TITLE_BYTES, online.MYSQL_ONLINE.replace(" ", ", ")),
        "0014 widen ds_sessions.title",
    )


def downgrade() -> None:
    """MySQL: narrow ``ds_sessions.title`` back to ``VARBINARY(1024)``, unless a sealed
    title is stored."""
    if not online.mysql():
        return
    if online.offline():
        raise NotImplementedError(
            "revision 0014's downgrade reads the titles; run it on the database"
        )
    sealed = online.scalar(f"SELECT count(*) FROM ds_sessions WHERE LENGTH(title) > {TITLE_BYTES}")
    if sealed:
        raise CommandError(
            f"revision 0014 cannot be downgraded: {sealed} session title(s) are longer than "
            f"{TITLE_BYTES} bytes, sealed titles that a store with a keyring wrote; a store "
            "with a keyring on MySQL needs revision 0014 (nothing was changed)"
        )
    online.say("0014: narrowing ds_sessions.title (a copy of the table; writes wait)")
    online.retrying("0014 narrow ds_sessions.title", _narrow)
