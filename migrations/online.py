"""Online steps for the revisions: short DDL under a lock timeout, batched backfills, indexes
built concurrently, each step committed on its own and safe to run again.

Every revision that touches a table holding data goes through these functions, never through
one long statement (see ``docs/guides/migrations.md``, "The rule"):

* ``ddl`` runs one statement (on Postgres a ``DO`` block when several must hold together)
  in a transaction of its own, under the ``lock_timeout`` env.py set, and runs it again
  with a growing pause when it times out waiting for a lock or is chosen as a deadlock's
  victim. So a migration never waits long behind a transaction, and nobody waits long
  behind the migration.
* ``wait_ddl`` runs a statement that waits without blocking reads or writes (``CREATE
  INDEX CONCURRENTLY``, ``VALIDATE CONSTRAINT``) with no lock timeout.
* ``create_index`` / ``drop_index``: ``CONCURRENTLY`` on Postgres; a build a kill left
  invalid is dropped and built again. On MySQL ``ALGORITHM=INPLACE, LOCK=NONE``: the server
  builds or drops the index while reads and writes go on, or refuses the statement (it
  never falls back to a copy of the table under a lock).
* ``add_column`` adds a nullable column: a catalogue change on Postgres and SQLite,
  ``ALGORITHM=INSTANT`` on MySQL (refused rather than rebuilding the table).
* ``backfill`` walks ``ds_events`` by primary key in batches, each its own short
  transaction (about ``BATCH_SECONDS``), and reports progress. The batch statement finds
  its rows by a predicate, so a killed backfill resumes where it stopped, and a batch is
  a no-op on rows already done.

A revision calls these from its ``upgrade()``; each call commits what came before it in
the revision (Alembic's ``autocommit_block``). Everything a revision does this way must be
idempotent: a migration killed midway leaves the revision unstamped, and the next run
runs it again from its start. Each revision loads this file by path, as the revisions load
each other (never ``durable_sessions``: a revision is a frozen snapshot).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from alembic import op
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

OPTIONS = "durable_sessions_online"
"""The key among the migration context's options of a dict of ``Options``' fields (env.py
sets it; a dict, since env.py and each revision load this file apart)."""

BATCH_SECONDS = 0.25
"""The time a backfill batch aims at: a writer waits at most about this long for its rows
(or, on SQLite, for the database)."""

FIRST_BATCH = 500
MAX_BATCH = 50_000
PROGRESS_EVERY = 2.0
"""Seconds between two progress lines of a backfill."""

RETRY_FIRST = 0.1
RETRY_MAX = 5.0
RETRY_FOR = 600.0
"""A statement that keeps timing out on a lock is tried again for this many seconds (with
pauses growing from ``RETRY_FIRST`` to ``RETRY_MAX``), then the migration fails."""

LOCK_NOT_AVAILABLE = "55P03"
DEADLOCK_DETECTED = "40P01"
MYSQL_ONLINE = "ALGORITHM=INPLACE LOCK=NONE"
"""How MySQL's index DDL is asked to run: in place, reads and writes going on. A server that
cannot refuses the statement instead of copying the table under a lock."""

MYSQL_LOCK_WAIT_TIMEOUT = 1205
MYSQL_DEADLOCK = 1213

log = logging.getLogger("durable_sessions.migrations")


class Options(NamedTuple):
    """What env.py passes to the revisions' online steps."""

    lock_timeout: float = 2.0
    """Seconds a statement may wait for a lock before it gives up and is tried again."""
    progress: Callable[[str], None] | None = None
    """Called with each progress line (besides the ``durable_sessions.migrations`` log)."""


def options() -> Options:
    """The options env.py set, or the defaults."""
    found = op.get_context().opts.get(OPTIONS)
    return Options(**found) if isinstance(found, dict) else Options()


def say(message: str, *, shown: bool = True) -> None:
    """Report progress to the ``durable_sessions.migrations`` log and, when ``shown``, to the
    caller's callback (which a quick migration of a small database leaves silent)."""
    log.info(message)
    callback = options().progress
    if shown and callback is not None:
        callback(message)


def postgres() -> bool:
    """Whether the migration runs on Postgres."""
    return op.get_context().dialect.name == "postgresql"


def mysql() -> bool:
    """Whether the migration runs on MySQL or MariaDB (whose DDL commits by itself)."""
    return op.get_context().dialect.name in ("mysql", "mariadb")


def offline() -> bool:
    """Whether Alembic writes a script (``--sql``) instead of running on a database."""
    return bool(op.get_context().as_sql)


_depth = 0


@contextlib.contextmanager
def outside_transaction() -> Iterator[Connection]:
    """Commit what the revision did so far and run the block with every statement its own
    transaction (Alembic's ``autocommit_block``); nested calls share the outer block."""
    global _depth
    if _depth:
        yield op.get_bind()
        return
    with op.get_context().autocommit_block():
        _depth += 1
        try:
            yield op.get_bind()
        finally:
            _depth -= 1


def _sqlstate(exc: DBAPIError) -> str | None:
    orig: Any = exc.orig
    for candidate in (orig, getattr(orig, "__cause__", None)):
        state = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if state:
            return str(state)
    return None


def _transient(exc: DBAPIError) -> str | None:
    """Why ``exc`` is worth another try (a lock not granted in time, a deadlock, SQLite's
    database locked past its busy timeout), or None."""
    state = _sqlstate(exc)
    if "InvalidCachedStatement" in type(exc.orig).__name__:
        # A statement this connection prepared before a revision changed a column's type
        # or collation; the driver has dropped its prepared statements: prepare it again.
        return "a prepared statement outlived a column change"
    code = getattr(exc.orig, "args", (None,))[:1]
    if state == LOCK_NOT_AVAILABLE or code == (MYSQL_LOCK_WAIT_TIMEOUT,):
        return "a lock was not granted within the lock timeout"
    if state == DEADLOCK_DETECTED or code == (MYSQL_DEADLOCK,):
        return "a deadlock with another transaction"
    if "database is locked" in str(exc.orig):
        return "the database is locked"
    return None


def _pause(conn: Connection, seconds: float) -> None:
    """Wait without holding anything; on Postgres in the server, so that the caller's event
    loop (this runs in SQLAlchemy's greenlet) keeps running."""
    if postgres():
        conn.exec_driver_sql(f"SELECT pg_sleep({seconds:.3f})")
    elif mysql():
        conn.exec_driver_sql(f"SELECT SLEEP({seconds:.3f})")
    else:
        time.sleep(seconds)


def retrying(what: str, attempt: Callable[[Connection], Any]) -> Any:
    """Run ``attempt`` outside any transaction until it does not fail on a lock.

    Args:
        what: What the attempt does, for the progress lines.
        attempt: The work; it must leave nothing half done when it raises (one statement,
            or a transaction it rolls back).

    Returns:
        What ``attempt`` returned.
    """
    with outside_transaction() as conn:
        pause = RETRY_FIRST
        deadline = time.monotonic() + RETRY_FOR
        tries = 1
        while True:
            try:
                return attempt(conn)
            except DBAPIError as exc:
                reason = _transient(exc)
                if reason is None or time.monotonic() + pause > deadline:
                    raise
                tries += 1
                if "prepared statement" in reason and tries == 2:
                    continue  # at once, and once
                say(f"{what}: {reason}; trying again in {pause:.1f} s (attempt {tries})")
                _pause(conn, pause)
                pause = min(pause * 2, RETRY_MAX)


def _transaction(conn: Connection, statements: Sequence[str], params: dict[str, Any]) -> Any:
    """Run ``statements`` in one transaction (on SQLite a write transaction taken at once:
    BEGIN IMMEDIATE); return the rowcount of the last one that changes rows. A ``SELECT``
    among them adds the columns of its first row to the parameters of the statements after
    it."""
    conn.exec_driver_sql("START TRANSACTION" if mysql() else "BEGIN IMMEDIATE")
    try:
        count = 0
        for statement in statements:
            result = conn.execute(text(statement), params)
            if result.returns_rows:
                params = {**params, **dict(result.mappings().one())}
            else:
                count = result.rowcount
        conn.exec_driver_sql("COMMIT")
        return count
    except BaseException:
        with contextlib.suppress(Exception):
            conn.exec_driver_sql("ROLLBACK")
        raise


def ddl(statement: str | Sequence[str], what: str | None = None) -> None:
    """Run DDL that takes a lock readers or writers wait for: in a transaction of its own,
    under the lock timeout, tried again while the lock is not granted in time.

    Args:
        statement: One statement; on SQLite also a list, run in one write transaction (on
            Postgres, several statements that must hold together go in one ``DO`` block).
        what: A short name for progress lines (default: the statement's start).
    """
    statements = [statement] if isinstance(statement, str) else list(statement)
    if offline():
        for one in statements:
            op.execute(one)
        return
    label = what or statements[0].split("\n")[0][:60]
    if mysql():  # each statement commits by itself; lock_wait_timeout bounds its wait
        for one in statements:
            retrying(label, _statement(one))
        return
    if postgres():
        assert len(statements) == 1, "Postgres: one statement (a DO block holds several)"
        retrying(label, lambda conn: conn.exec_driver_sql(statements[0]))
    else:
        retrying(label, lambda conn: _transaction(conn, statements, {}))


def _statement(sql: str) -> Callable[[Connection], Any]:
    """An attempt that runs ``sql``."""
    return lambda conn: conn.exec_driver_sql(sql)


def wait_ddl(statement: str, what: str | None = None) -> None:
    """Run a Postgres statement that may wait long for locks but blocks no reader or writer
    while it does (it takes at most SHARE UPDATE EXCLUSIVE: ``CREATE INDEX CONCURRENTLY``,
    ``VALIDATE CONSTRAINT``): without a lock timeout, in autocommit."""
    if offline():
        op.execute(statement)
        return
    label = what or statement[:60]

    def attempt(conn: Connection) -> None:
        conn.exec_driver_sql("SET lock_timeout = 0")
        try:
            conn.exec_driver_sql(statement)
        finally:
            conn.exec_driver_sql(f"SET lock_timeout = '{_timeout_ms()}ms'")

    retrying(label, attempt)


def _timeout_ms() -> int:
    return max(1, round(options().lock_timeout * 1000))


def query(sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    """Read rows outside the revision's transaction (so no lock is kept afterwards)."""
    found: list[Any] = retrying(
        "read", lambda conn: list(conn.execute(text(sql), params or {}).all())
    )
    return found


def scalar(sql: str, params: dict[str, Any] | None = None) -> Any:
    """The first column of the first row of ``sql``, or None."""
    rows = query(sql, params)
    return rows[0][0] if rows else None


def index_state(name: str) -> str | None:
    """``"valid"``, ``"invalid"`` (a concurrent build that did not finish) or None."""
    if offline():
        return None
    if postgres():
        found = scalar(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)",
            {"name": name},
        )
        return None if found is None else ("valid" if found else "invalid")
    if mysql():
        found = scalar(
            "SELECT 1 FROM information_schema.statistics WHERE table_schema = DATABASE() "
            "AND index_name = :name LIMIT 1",
            {"name": name},
        )
        return None if found is None else "valid"
    found = scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = :name", {"name": name}
    )
    return None if found is None else "valid"


def create_index(name: str, definition: str, *, unique: bool = False) -> None:
    """Build the index ``name`` (``definition``: ``ON table (columns)``) unless it exists.

    Postgres builds it ``CONCURRENTLY`` (reads and writes go on); an invalid index of that
    name, left by a build that was killed, is dropped first. MySQL builds it in place
    without a lock (``MYSQL_ONLINE``). SQLite builds it in one short write transaction.
    """
    kind = "UNIQUE INDEX" if unique else "INDEX"
    state = index_state(name)
    if state == "valid":
        return
    if postgres():
        if state == "invalid":
            say(f"dropping the unfinished index {name} (a build that was stopped)")
            wait_ddl(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        say(f"building the index {name} (concurrently)", shown=False)
        started = time.monotonic()
        wait_ddl(f"CREATE {kind} CONCURRENTLY {name} {definition}", f"index {name}")
        took = time.monotonic() - started
        say(f"built the index {name} (concurrently) in {took:.1f} s", shown=took >= PROGRESS_EVERY)
    elif mysql():  # in place, reads and writes going on, or refused
        ddl(f"CREATE {kind} {name} {definition} {MYSQL_ONLINE}", f"index {name}")
    else:
        ddl(f"CREATE {kind} IF NOT EXISTS {name} {definition}", f"index {name}")


def drop_index(name: str) -> None:
    """Drop the index ``name`` if it exists (``CONCURRENTLY`` on Postgres)."""
    if postgres():
        wait_ddl(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", f"drop index {name}")
    elif mysql():  # an index is dropped from its table, which MySQL needs named
        table = None if offline() else _table_of(name)
        if table is not None:
            ddl(
                f"ALTER TABLE {table} DROP INDEX {name}, {MYSQL_ONLINE.replace(' ', ', ')}",
                f"drop index {name}",
            )
    else:
        ddl(f"DROP INDEX IF EXISTS {name}", f"drop index {name}")


def column_exists(table: str, column: str) -> bool:
    """Whether ``table`` has the column ``column`` (False when Alembic writes a script)."""
    if offline():
        return False
    if postgres():
        sql = (
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = :table AND column_name = :column"
        )
    elif mysql():
        sql = (
            "SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = :table AND column_name = :column"
        )
    else:
        sql = "SELECT 1 FROM pragma_table_info(:table) WHERE name = :column"
    return scalar(sql, {"table": table, "column": column}) is not None


def add_column(table: str, column: str, definition: str) -> None:
    """Add the nullable column ``column`` (``definition``: its type, and a constant default
    if it has one) to ``table`` unless it is there.

    No table is rewritten: Postgres and SQLite change only their catalogue, under the lock
    timeout; MySQL adds it ``ALGORITHM=INSTANT`` and refuses a change that would copy the
    table. A ``NOT NULL`` column, or a default computed per row, breaks the rule (expand
    with a nullable column, backfill, then constrain): it is refused here.
    """
    if "NOT NULL" in definition.upper():
        raise ValueError(f"{table}.{column}: a new column is nullable (expand, then backfill)")
    if column_exists(table, column):
        return
    statement = f"ALTER TABLE {table} ADD COLUMN {column} {definition}"
    if mysql():
        statement += ", ALGORITHM=INSTANT"
    ddl(statement, f"add column {table}.{column}")


def _table_of(index: str) -> str | None:
    """The table of a MySQL index, or None when there is no such index."""
    found = scalar(
        "SELECT table_name FROM information_schema.statistics WHERE table_schema = DATABASE() "
        "AND index_name = :name LIMIT 1",
        {"name": index},
    )
    return None if found is None else str(found)


def _batch(conn: Connection, statements: list[str], params: dict[str, Any]) -> int:
    """One batch: a single Postgres statement (autocommit), or one transaction (SQLite's
    write transaction, MySQL's under the lock timeout)."""
    if postgres():
        return int(conn.execute(text(statements[0]), params).rowcount)
    return int(_transaction(conn, statements, params))


EVENT_KEY = ("org_id", "session_id", "seq")
"""The primary key of ``ds_events``, which the backfills walk."""


def _key_range(alias: str, lower: bool, upper: bool, *, one_org: bool = False) -> str:
    """The condition on ``alias``'s primary key that selects the keys after the lower key
    and up to the upper one.

    A B-tree ends a scan only at a bound on its leading columns that it can check column by
    column; a row comparison is such a bound on its first column only, so on its own an
    upper bound inside one organisation would let the scan run to the index's end. Within
    one organisation the upper bound is an equality on ``org_id`` and a row comparison on
    the next columns, which ends the scan at the batch's last key whatever the table's
    size; across organisations a plain bound on ``org_id`` ends it with the last one.
    """
    columns = ", ".join(f"{alias}.{c}" for c in EVENT_KEY)
    parts = []
    if mysql():  # its range optimiser reads a row comparison as no range at all
        return _mysql_key_range(alias, lower, upper)
    if lower:
        parts.append(f"({columns}) > (:lo_org, :lo_session, :lo_seq)")
    if upper and one_org:
        rest = f"({alias}.session_id, {alias}.seq)"
        parts.append(f"{alias}.org_id = :hi_org AND {rest} <= (:hi_session, :hi_seq)")
    elif upper:
        parts.append(f"({columns}) <= (:hi_org, :hi_session, :hi_seq)")
        parts.append(f"{alias}.org_id <= :hi_org")
    return " AND ".join(parts) or "TRUE"


def _mysql_key_range(alias: str, lower: bool, upper: bool) -> str:
    """``_key_range`` spelled as MySQL's range optimiser reads it: each row comparison
    written out column by column."""
    org, session, seq = (f"{alias}.{c}" for c in EVENT_KEY)
    parts = []
    if lower:
        parts.append(
            f"({org} > :lo_org OR ({org} = :lo_org AND ({session} > :lo_session "
            f"OR ({session} = :lo_session AND {seq} > :lo_seq))))"
        )
    if upper:
        parts.append(
            f"({org} < :hi_org OR ({org} = :hi_org AND ({session} < :hi_session "
            f"OR ({session} = :hi_session AND {seq} <= :hi_seq))))"
        )
    return " AND ".join(parts) or "TRUE"


def backfill(
    what: str,
    statements: str | Sequence[str],
    *,
    alias: str = "e",
    offline_statements: str | Sequence[str] | None = None,
) -> int:
    """Run ``statements`` over every event, a batch of primary keys at a time.

    Each statement holds ``{range}``, a condition on ``alias``'s key columns that selects
    the batch, and a predicate of its own that picks the rows still to do. A batch is one
    transaction (on SQLite all of ``statements`` in one write transaction, on MySQL in one
    transaction whose row locks are waited for at most the lock timeout; on Postgres one
    statement, which commits alone). The batch grows or shrinks to last about
    ``BATCH_SECONDS``. Progress is reported every ``PROGRESS_EVERY`` seconds.

    Args:
        what: What is filled, for progress lines ("search vectors").
        statements: The batch statement(s).
        alias: The alias of ``ds_events`` that ``{range}`` names.
        offline_statements: What ``--sql`` writes instead (all rows at once); by default
            ``statements`` over every row.

    Returns:
        The number of rows the statements changed (the last statement's count, summed).
    """
    batch = [statements] if isinstance(statements, str) else list(statements)
    if offline():
        for statement in offline_statements or [s.format(range="TRUE") for s in batch]:
            op.execute(statement)
        return 0
    assert postgres() is False or len(batch) == 1, "Postgres: one statement per batch"
    total = int(scalar("SELECT count(*) FROM ds_events") or 0)
    order = ", ".join(EVENT_KEY)
    started = last_report = time.monotonic()
    size = FIRST_BATCH
    seen = changed = 0
    lower: tuple[Any, ...] | None = None
    say(f"{what}: {total:,} events to look at", shown=False)
    while True:
        params: dict[str, Any] = {}
        if lower is not None:
            params.update(zip(("lo_org", "lo_session", "lo_seq"), lower, strict=True))
        upper = query(
            f"SELECT {order} FROM ds_events AS e WHERE {_key_range('e', lower is not None, False)} "
            f"ORDER BY {order} LIMIT 1 OFFSET :offset",
            {**params, "offset": size - 1},
        )
        if upper:
            params.update(zip(("hi_org", "hi_session", "hi_seq"), upper[0], strict=True))
        one_org = bool(upper) and lower is not None and lower[0] == upper[0][0]
        where = _key_range(alias, lower is not None, bool(upper), one_org=one_org)
        sql = [s.format(range=where) for s in batch]
        began = time.monotonic()
        count = retrying(what, lambda conn, sql=sql, params=params: _batch(conn, sql, params))
        took = time.monotonic() - began
        changed += max(count or 0, 0)
        if not upper:
            break
        seen += size
        lower = tuple(upper[0])
        if took < BATCH_SECONDS / 2:
            size = min(size * 2, MAX_BATCH)
        elif took > BATCH_SECONDS * 2 and size > 1:
            size = max(size // 2, 1)
        now = time.monotonic()
        if now - last_report >= PROGRESS_EVERY:
            last_report = now
            share = f" ({min(seen, total) * 100 // total}%)" if total else ""
            say(f"{what}: {min(seen, total):,} of {total:,} events{share}, {now - started:.0f} s")
    took = time.monotonic() - started
    say(f"{what}: done, {changed:,} events filled in {took:.1f} s", shown=took >= PROGRESS_EVERY)
    return changed
