"""Online migrations: every earlier revision upgrades to head while the previous release reads
and writes, a killed migration leaves a consistent database that the next run finishes, and
a migration waits out a long transaction without making anyone wait behind it.

Databases at earlier revisions are made with the revisions as released
(``support.revisions.upgrade_released``), then filled with ``EVENTS`` events in bulk SQL; the
migration runs in a separate process, as a deploy runs it, while a probe (plain SQL, as the
previous release would) reads a session, reads a transcript and appends, each every 50 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.sql.dialects.mysql.programs import ATTEMPTS
from durable_sessions.sql.migrate import current, head, upgrade
from durable_sessions.sql.schema import VERSION_TABLE, metadata
from durable_sessions.sql.translate import mysql_errno
from support.revisions import upgrade_released
from support.sql import raw_mysql

SESSIONS = 200
PER_SESSION = 100
EVENTS = SESSIONS * PER_SESSION
"""Enough that the released revisions would hold a table for seconds, little enough for CI."""

PROBE_EVERY = 0.05
STALL = 2.0
"""The longest a probe operation may take while a migration runs."""

EARLIER = ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009"]

DIALECTS = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
]

MIGRATE = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions.sql.migrate import upgrade

async def main(url):
    engine = create_async_engine(url)
    try:
        report = await upgrade(engine, progress=lambda line: print(line, flush=True))
        print("REPORT", report.before, report.after, ",".join(report.applied), flush=True)
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, dialect: str) -> str:
    if dialect == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
    return make()


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """The test's own engine; on Postgres it prepares nothing to keep (the probe does, as
    the previous release would), so that its checks across the migration never meet a
    statement prepared before a column changed."""
    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":
        url = url.update_query_dict({"prepared_statement_cache_size": "0"})
    made = create_async_engine(url, connect_args=_connect_args(db_url))
    yield made
    await made.dispose()


def _connect_args(url: str) -> dict[str, Any]:
    # SQLite: a writer waits for the migration's batch (at most about a second) within
    # this busy timeout; the probe measures how long it actually waited.
    return {"timeout": 30} if url.startswith("sqlite") else {}


def _pg(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


def _mysql(engine: AsyncEngine) -> bool:
    return engine.dialect.name in ("mysql", "mariadb")


async def seed(engine: AsyncEngine, revision: str) -> None:
    """Make the database at ``revision`` as released, with SESSIONS sessions of PER_SESSION
    events each (every 50th event without content), in bulk SQL."""
    if _mysql(engine):  # every MySQL database was made by the current revisions
        await upgrade(engine, revision)
    else:
        await upgrade_released(engine, revision)
    incarnation = revision >= "0002"
    columns = (
        "org_id, id, user_id, app_name, title, state, parent_id, created_at, updated_at, "
        "message_count, token_total, event_seq, version" + (", incarnation" if incarnation else "")
    )
    event_columns = (
        "org_id, session_id, seq, id, author, invocation_id, content, state_delta, tokens, "
        "timestamp"
    )
    params = {"sessions": SESSIONS, "events": PER_SESSION}
    blank = ", ''" if incarnation else ""
    if _mysql(engine):
        now = "UTC_TIMESTAMP(6)"
        series = "(WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c "
        series += "WHERE n < :sessions) SELECT n FROM c) AS c"
        events_from = (
            "(WITH RECURSIVE a(s) AS (SELECT 1 UNION ALL SELECT s + 1 FROM a WHERE s < :sessions),"
            " b(q) AS (SELECT 1 UNION ALL SELECT q + 1 FROM b WHERE q < :events) "
            "SELECT s, q FROM a, b) AS sq"
        )
        content = (
            "CASE WHEN q % 50 = 0 THEN NULL ELSE json_object('text', CONCAT('weather report ', "
            "q, ' for session s', s), 'n', q) END"
        )
        sid, nid = "CONCAT('s', n)", "CONCAT('s', s)"
        eid = "CONCAT('e', s, '-', q)"
    elif _pg(engine):
        now = "now()"
        series = "generate_series(1, :sessions) AS n"
        events_from = "generate_series(1, :sessions) AS s, generate_series(1, :events) AS q"
        content = (
            "CASE WHEN q % 50 = 0 THEN NULL ELSE jsonb_build_object('text', 'weather report ' "
            "|| q || ' for session s' || s, 'n', q) END"
        )
        sid, nid = "'s' || n", "'s' || s"
        eid = "'e' || s || '-' || q"
    else:
        now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
        series = "(WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c "
        series += "WHERE n < :sessions) SELECT n FROM c)"
        events_from = (
            "(WITH RECURSIVE a(s) AS (SELECT 1 UNION ALL SELECT s + 1 FROM a WHERE s < :sessions),"
            " b(q) AS (SELECT 1 UNION ALL SELECT q + 1 FROM b WHERE q < :events) "
            "SELECT s, q FROM a, b)"
        )
        content = (
            "CASE WHEN q % 50 = 0 THEN NULL ELSE json_object('text', 'weather report ' "
            "|| q || ' for session s' || s, 'n', q) END"
        )
        sid, nid = "'s' || n", "'s' || s"
        eid = "'e' || s || '-' || q"
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"INSERT INTO ds_sessions ({columns}) SELECT 'org', {sid}, 'u', 'app', '', "
                f"'{{}}', NULL, {now}, {now}, 0, 0, :events, 1{blank} FROM {series}"
            ),
            params,
        )
        await conn.execute(
            text(
                f"INSERT INTO ds_events ({event_columns}) SELECT 'org', {nid}, q, "
                f"{eid}, 'assistant', 'run', {content}, '{{}}', 0, {now} "
                f"FROM {events_from}"
            ),
            params,
        )


async def snapshot(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
    """The seeded sessions and events as values (not as the driver or type spells them)."""
    as_text = "CHAR" if _mysql(engine) else "TEXT"
    async with engine.connect() as conn:
        sessions = [
            tuple(row)
            for row in await conn.execute(
                text(
                    f"SELECT id, user_id, app_name, title, CAST(state AS {as_text}) "
                    "FROM ds_sessions WHERE app_name = 'app' ORDER BY id"
                )
            )
        ]
        events = [
            (sid, seq, eid, None if content is None else json.loads(content))
            for sid, seq, eid, content in await conn.execute(
                text(
                    f"SELECT session_id, seq, id, CAST(content AS {as_text}) FROM ds_events "
                    "WHERE author = 'assistant' ORDER BY session_id, seq"
                )
            )
        ]
    return [(s[0], s[1], s[2], s[3], json.loads(s[4])) for s in sessions], events


def _replanned(exc: DBAPIError) -> bool:
    """Postgres's answer to a statement prepared before a column's type or collation
    changed (revisions 0004 and 0007): once per connection and statement; prepared again,
    it succeeds."""
    return "InvalidCachedStatement" in type(exc.orig).__name__


def _lost_a_lock(exc: DBAPIError) -> bool:
    """MySQL's answer to a transaction chosen to break a deadlock, a metadata lock's among
    them while an ALTER waits for its turn (or one that waited too long for a row lock):
    rolled back, it is to be run again, as the library's own writes are (``retried``)."""
    return mysql_errno(exc) in (1213, 1205)


class Probe:
    """The previous release at work: reads a session, reads a transcript and appends, each
    every PROBE_EVERY seconds, timing every operation."""

    def __init__(self, url: str) -> None:
        self.engine = create_async_engine(url, connect_args=_connect_args(url))
        self.longest: dict[str, float] = {"session": 0.0, "transcript": 0.0, "append": 0.0}
        self.count: dict[str, int] = dict.fromkeys(self.longest, 0)
        self.errors: list[str] = []
        self.replanned = 0
        self.lost_locks = 0
        self.appended: list[tuple[str, int]] = []
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    async def _session(self, n: int) -> None:
        async with self.engine.connect() as conn:
            row = await conn.execute(
                text(
                    "SELECT id, user_id, event_seq FROM ds_sessions WHERE org_id = 'org' "
                    "AND id = :id"
                ),
                {"id": f"s{n % SESSIONS + 1}"},
            )
            assert row.one()

    async def _transcript(self, n: int) -> None:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT seq, content FROM ds_events WHERE org_id = 'org' "
                    "AND session_id = :id ORDER BY seq"
                ),
                {"id": f"s{n % SESSIONS + 1}"},
            )
            assert len(rows.all()) >= PER_SESSION

    async def _append(self, n: int) -> None:
        session = f"s{n % 5 + 1}"
        pg = self.engine.dialect.name == "postgresql"
        content = json.dumps({"text": f"probe append {n}"})
        if _mysql(self.engine):
            await self._append_mysql(session, n, content)
            return
        async with self.engine.begin() as conn:  # the writers' order: session, then event
            seq = (
                await conn.execute(
                    text(
                        "UPDATE ds_sessions SET event_seq = event_seq + 1, version = version + 1 "
                        "WHERE org_id = 'org' AND id = :id RETURNING event_seq"
                    ),
                    {"id": session},
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                    "content, state_delta, tokens, timestamp) VALUES ('org', :id, :seq, :eid, "
                    f"'probe', 'run', {'CAST(:c AS jsonb)' if pg else ':c'}, '{{}}', 0, "
                    f"{'now()' if pg else 'CURRENT_TIMESTAMP'})"
                ),
                {"id": session, "seq": seq, "eid": f"p{n}", "c": content},
            )
        self.appended.append((session, seq))

    async def _append_mysql(self, session: str, n: int, content: str) -> None:
        async with self.engine.begin() as conn:  # the writers' order: session, then event
            key = {"id": session}
            await conn.execute(
                text(
                    "UPDATE ds_sessions SET event_seq = event_seq + 1, version = version + 1 "
                    "WHERE org_id = 'org' AND id = :id"
                ),
                key,
            )
            seq = (
                await conn.execute(
                    text("SELECT event_seq FROM ds_sessions WHERE org_id = 'org' AND id = :id"),
                    key,
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO ds_events (org_id, session_id, seq, id, author, invocation_id, "
                    "content, state_delta, tokens, timestamp) VALUES ('org', :id, :seq, :eid, "
                    "'probe', 'run', :c, '{}', 0, UTC_TIMESTAMP(6))"
                ),
                {"id": session, "seq": seq, "eid": f"p{n}", "c": content},
            )
        self.appended.append((session, seq))

    async def _loop(self, name: str, operation: Callable[[int], Any]) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            try:
                for attempt in range(ATTEMPTS):
                    try:
                        await operation(n)
                        break
                    except DBAPIError as exc:
                        if _replanned(exc) and attempt == 0:
                            self.replanned += 1
                        elif _lost_a_lock(exc) and attempt < ATTEMPTS - 1:
                            self.lost_locks += 1
                        else:
                            raise
            except Exception as exc:
                self.errors.append(f"{name}: {exc!r}"[:500])
            took = time.monotonic() - started
            self.longest[name] = max(self.longest[name], took)
            self.count[name] += 1
            async with self._progress:
                self._progress.notify_all()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, PROBE_EVERY - took))

    async def rounds(self, n: int) -> None:
        """Wait until each operation has run ``n`` more times."""
        target = {name: count + n for name, count in self.count.items()}
        async with self._progress:
            await self._progress.wait_for(
                lambda: all(self.count[name] >= t for name, t in target.items())
            )

    async def __aenter__(self) -> Probe:
        self._tasks = [
            asyncio.create_task(self._loop("session", self._session)),
            asyncio.create_task(self._loop("transcript", self._transcript)),
            asyncio.create_task(self._loop("append", self._append)),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.engine.dispose()

    def check(self) -> None:
        assert not self.errors, self.errors[:5]
        assert all(count >= 3 for count in self.count.values()), self.count
        assert max(self.longest.values()) < STALL, self.longest


async def start_migration(url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        MIGRATE,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


SEARCH_OBJECTS = ("ix_ds_events_search", "ix_ds_memories_search", "search_vector", "search_terms")
"""The search index each dialect keeps outside the metadata (with SQLite's FTS tables and
MySQL's ``ds_event_words``)."""


def schema_drift(sync: Connection) -> list[Any]:
    """What differs between the database's schema and the metadata, the dialects' search
    indexes aside."""

    def included(obj: Any, name: Any, *_: Any) -> bool:
        return not (
            str(name).startswith(("ds_events_fts", "ds_memories_fts"))
            or name in SEARCH_OBJECTS
            or name == "ds_event_words"
        )

    context = MigrationContext.configure(
        sync,
        opts={"version_table": VERSION_TABLE, "compare_type": True, "include_object": included},
    )
    return list(compare_metadata(context, metadata))


async def check_at_head(engine: AsyncEngine, seeded: tuple[list[Any], list[Any]]) -> None:
    """At head with the seeded data intact, every event searchable, the schema the
    metadata describes, nothing of the migration's scaffolding left."""
    assert await current(engine) == head()
    assert await snapshot(engine) == seeded
    async with engine.connect() as conn:
        if _pg(engine):
            unfilled = await conn.scalar(
                text("SELECT count(*) FROM ds_events WHERE search_vector IS NULL")
            )
            nulls = await conn.scalar(text("SELECT count(*) FROM ds_events WHERE content IS NULL"))
            assert unfilled == nulls
            wrong = await conn.scalar(
                text(
                    "SELECT count(*) FROM ds_events WHERE seq % 7 = 0 "
                    "AND search_vector IS DISTINCT FROM ds_search_vector(content)"
                )
            )
            assert wrong == 0
            leftovers = await conn.execute(
                text(
                    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE NOT i.indisvalid OR c.relname LIKE '%\\_c' OR c.relname LIKE "
                    "'%\\_d' OR c.relname LIKE '%\\_posix' UNION ALL SELECT attname FROM "
                    "pg_attribute WHERE attrelid = 'ds_events'::regclass AND "
                    "attname = 'content_json' AND NOT attisdropped UNION ALL SELECT conname "
                    "FROM pg_constraint WHERE NOT convalidated"
                )
            )
            assert leftovers.all() == []
        else:
            keyed = await conn.scalar(text("SELECT count(*) FROM ds_events_fts_rowid"))
            assert keyed == await conn.scalar(text("SELECT count(*) FROM ds_events"))
            await conn.exec_driver_sql(
                "INSERT INTO ds_events_fts (ds_events_fts) VALUES ('integrity-check')"
            )

        assert await conn.run_sync(schema_drift) == []
    store = SQLStore(engine)
    hits = await store.search("org", "report 17 s5")
    assert [(h.session_id, h.event.seq) for h in hits] == [("s5", 17)]


@pytest.mark.slow
@pytest.mark.parametrize("revision", EARLIER)
async def test_upgrade_from_an_earlier_revision_while_the_service_works(
    db_url: str, engine: AsyncEngine, revision: str
) -> None:
    await seed(engine, revision)
    seeded = await snapshot(engine)
    async with Probe(db_url) as probe:
        await probe.rounds(3)  # the probe at work before the deploy starts
        proc = await start_migration(db_url)
        out, err = await proc.communicate()
        await probe.rounds(3)  # and after it
    assert proc.returncode == 0, (out + err).decode()
    last = out.decode().strip().splitlines()[-1].split()
    assert last[:3] == ["REPORT", revision, head()]
    assert last[3].split(",")[-1] == head()
    probe.check()
    await check_at_head(engine, seeded)
    store = SQLStore(engine)
    found = await store.search("org", "probe append", limit=10_000)
    assert sorted((h.session_id, h.event.seq) for h in found) == sorted(probe.appended)


async def _filled(engine: AsyncEngine, what: str) -> int:
    """How many events the backfill ``what`` has done (-1 before its column exists)."""
    sql = {
        "vectors": "SELECT count(*) FROM ds_events WHERE search_vector IS NOT NULL",
        "json": "SELECT count(*) FROM ds_events WHERE content_json IS NOT NULL",
        "fts": "SELECT count(*) FROM ds_events_fts_rowid",
    }[what]
    try:
        async with engine.connect() as conn:
            return int(await conn.scalar(text(sql)) or 0)
    except DBAPIError:
        return -1


KILLS = [
    pytest.param("sqlite", "0002", "fts", marks=pytest.mark.sqlite, id="sqlite-0003"),
    pytest.param("postgres", "0002", "vectors", marks=pytest.mark.postgres, id="pg-0003"),
    pytest.param("postgres", "0006", "json", marks=pytest.mark.postgres, id="pg-0007"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("dialect", "revision", "backfill"), KILLS, indirect=["dialect"])
async def test_a_migration_killed_during_a_backfill_resumes(
    db_url: str, engine: AsyncEngine, revision: str, backfill: str
) -> None:
    await seed(engine, revision)
    seeded = await snapshot(engine)
    proc = await start_migration(db_url)
    deadline = time.monotonic() + 120
    filled = -1
    while time.monotonic() < deadline and proc.returncode is None:
        filled = await _filled(engine, backfill)
        if 0 < filled < EVENTS * 0.8:
            break
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    await proc.communicate()
    assert 0 < filled < EVENTS, "the backfill was not caught midway"

    # Consistent: the revision being run is not stamped, the data is intact, and the
    # previous release goes on (its append gets its vector or index entry from the trigger).
    before = {"0002": "0002", "0006": "0006"}[revision]
    assert await current(engine) == before
    assert await snapshot(engine) == seeded
    async with Probe(db_url) as probe:
        await probe.rounds(5)
    probe.check()

    # The new release works on the half-migrated database: an event it writes is found,
    # an old one only once the backfill has reached it.
    if revision == "0002":
        store = SQLStore(engine)
        await Manager(store).create("org", "u", id="new")
        await store.append_event("org", "new", Event("user", content={"text": "fresh words"}))
        assert [h.session_id for h in await store.search("org", "fresh words")] == ["new"]
        assert len(await store.list_events("org", "s1")) >= PER_SESSION

    report = await upgrade(engine)
    assert report.before == before
    assert report.after == head()
    await check_at_head(engine, seeded)
    found = await SQLStore(engine).search("org", "probe append", limit=10_000)
    assert sorted((h.session_id, h.event.seq) for h in found) == sorted(probe.appended)


@pytest.mark.postgres
async def test_an_invalid_index_left_by_a_killed_build_is_built_again(
    fresh_pg_url: Callable[[], str],
) -> None:
    """A ``CREATE INDEX CONCURRENTLY`` that did not finish leaves an invalid index under
    the name; the next run drops it and builds the index it wants."""
    engine = create_async_engine(fresh_pg_url())
    try:
        await seed(engine, "0002")
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(DBAPIError):  # duplicates: the build fails, the index stays
                await conn.exec_driver_sql(
                    "CREATE UNIQUE INDEX CONCURRENTLY ix_ds_events_search ON ds_events (author)"
                )
            valid = await conn.scalar(
                text(
                    "SELECT indisvalid FROM pg_index "
                    "WHERE indexrelid = 'ix_ds_events_search'::regclass"
                )
            )
            assert valid is False
        await upgrade(engine)
        async with engine.connect() as conn:
            found = await conn.execute(
                text(
                    "SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index "
                    "WHERE indexrelid = 'ix_ds_events_search'::regclass"
                )
            )
            valid, definition = found.one()
        assert valid is True
        assert "gin (search_vector)" in definition
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_long_transaction_is_waited_out_without_stalling_anyone(
    fresh_pg_url: Callable[[], str],
) -> None:
    """Revision 0002 needs ``ds_sessions``' exclusive lock for an instant. A transaction
    that holds the table for seconds makes it wait: each try gives up after the lock
    timeout (so readers queued behind it wait no longer than that), and it tries again
    until the transaction ends."""
    url = fresh_pg_url()
    engine = create_async_engine(url)
    lines: list[str] = []
    try:
        await seed(engine, "0001")
        async with engine.connect() as blocker:
            await blocker.execute(text("SELECT count(*) FROM ds_sessions"))  # holds its lock
            async with Probe(url) as probe:
                migration = asyncio.create_task(
                    upgrade(engine, lock_timeout=0.2, progress=lines.append)
                )
                deadline = time.monotonic() + 30
                while not any("trying again" in line for line in lines):
                    assert time.monotonic() < deadline, lines
                    assert not migration.done()
                    await asyncio.sleep(0.05)
                while sum("trying again" in line for line in lines) < 3:  # several tries
                    assert time.monotonic() < deadline, lines
                    await asyncio.sleep(0.05)
                await probe.rounds(5)  # the probe at work meanwhile
                assert not migration.done()
                await blocker.rollback()
                report = await migration
        assert report.applied[0] == "0002"
        assert report.after == head()
        probe.check()
        assert max(probe.longest.values()) < 1.0, probe.longest
    finally:
        await engine.dispose()


async def test_concurrent_deploys_one_migrates_the_others_say_nothing_to_do(
    db_url: str,
) -> None:
    engines = [create_async_engine(db_url, connect_args=_connect_args(db_url)) for _ in range(3)]
    try:
        await upgrade(engines[0], "0002")
        reports = await asyncio.gather(*(upgrade(e) for e in engines))
        ran = [r for r in reports if r.changed]
        assert len(ran) == 1
        assert ran[0].before == "0002"
        assert ran[0].applied == tuple(f"{n:04d}" for n in range(3, int(head()) + 1))
        for report in reports:
            assert report.after == head()
            if not report.changed:
                assert report.before == head()
    finally:
        for engine in engines:
            await engine.dispose()


def test_the_released_revisions_are_kept_as_released() -> None:
    """The copies that make the databases users have must not drift from what shipped:
    each one's revision id, and its parent, is the current revision's. Revisions written
    since (0010 on) come after every released one."""
    from support.revisions import RELEASED, VERSIONS

    released = sorted(p.name for p in (RELEASED / "versions").glob("*.py"))
    current = sorted(p.name for p in VERSIONS.glob("*.py"))
    assert released == current[: len(released)]
    assert released[-1].startswith("0009_")
    assert os.path.isfile(RELEASED / "env.py")


@pytest.mark.mysql
@pytest.mark.slow
async def test_mysql_upgrades_to_head_while_the_service_works(
    fresh_mysql_url: Callable[[], str],
) -> None:
    """Every MySQL database was made by the current revisions: one at the first revision,
    filled, upgrades to head while the probe reads and appends, its data intact and the
    schema the metadata describes."""
    url = fresh_mysql_url()
    engine = create_async_engine(url)
    try:
        await seed(engine, "0001")
        seeded = await snapshot(engine)
        async with Probe(url) as probe:
            await probe.rounds(3)
            proc = await start_migration(url)
            out, err = await proc.communicate()
            await probe.rounds(3)
        assert proc.returncode == 0, (out + err).decode()
        assert out.decode().strip().splitlines()[-1].split()[:3] == ["REPORT", "0001", head()]
        probe.check()
        assert await current(engine) == head()
        assert await snapshot(engine) == seeded

        async with engine.connect() as conn:
            assert await conn.run_sync(schema_drift) == []
        store = SQLStore(engine)
        await store.append_event("org", "s3", Event("user", content={"text": "fresh words"}))
        assert [h.session_id for h in await store.search("org", "fresh words")] == ["s3"]
        assert len(await store.list_events("org", "s3")) > PER_SESSION
    finally:
        await engine.dispose()


def _mysql_steps(sync: Connection, lines: list[str]) -> dict[str, Any]:
    """The steps a future revision takes on a table in service, run through Alembic's
    context as a revision runs them."""
    from alembic.operations import Operations

    from support.revisions import load_online

    online = load_online()
    context = MigrationContext.configure(
        sync, opts={online.OPTIONS: {"lock_timeout": 1.0, "progress": lines.append}}
    )
    done: dict[str, Any] = {}
    with Operations.context(context):
        online.add_column("ds_events", "probe_note", "VARCHAR(40) NULL")
        online.add_column("ds_events", "probe_note", "VARCHAR(40) NULL")  # there: nothing
        done["filled"] = online.backfill(
            "probe notes",
            "UPDATE ds_events AS e SET probe_note = CONCAT('seq ', e.seq) "
            "WHERE {range} AND e.probe_note IS NULL",
        )
        # A batch reads a range of the primary key, not the whole of it (MySQL's range
        # optimiser reads a row comparison as no range at all: every batch would scan, and
        # lock, the table).
        bounds = {"lo_org": "org", "lo_session": "s150", "lo_seq": 5}
        bounds.update({"hi_org": "org", "hi_session": "s160", "hi_seq": 5})
        plan = online.query(
            "EXPLAIN UPDATE ds_events AS e SET probe_note = 'x' WHERE "
            + online._key_range("e", True, True),
            bounds,
        )[0]._mapping
        done["plan"] = (plan["type"], plan["key"], int(plan["rows"]) < EVENTS // 4)
        online.create_index("ix_ds_events_probe_note", "ON ds_events (probe_note)")
        done["built"] = online.index_state("ix_ds_events_probe_note")
        online.drop_index("ix_ds_events_probe_note")
        done["dropped"] = online.index_state("ix_ds_events_probe_note")
        with pytest.raises(ValueError, match="nullable"):
            online.add_column("ds_events", "probe_other", "INT NOT NULL DEFAULT 0")
    return done


@pytest.mark.mysql
async def test_mysql_online_steps_keep_the_service_working(
    fresh_mysql_url: Callable[[], str],
) -> None:
    """On a filled MySQL database at head, the online helpers add a column (INSTANT),
    backfill it in batches, and build and drop an index (INPLACE, LOCK=NONE: the server
    refuses these rather than lock the table) while the probe reads and appends; every
    row is filled exactly once, and nobody waits more than STALL."""
    url = fresh_mysql_url()
    engine = create_async_engine(url)
    lines: list[str] = []
    try:
        await seed(engine, head())
        async with Probe(url) as probe:
            await probe.rounds(3)
            async with engine.connect() as conn:
                done = await conn.run_sync(_mysql_steps, lines)
            await probe.rounds(3)
        probe.check()
        assert done["filled"] >= EVENTS
        assert (done["built"], done["dropped"]) == ("valid", None)
        assert done["plan"] == ("range", "PRIMARY", True)
        async with engine.connect() as conn:
            wrong = await conn.scalar(
                text(
                    "SELECT count(*) FROM ds_events WHERE author = 'assistant' "
                    "AND (probe_note IS NULL OR probe_note != CONCAT('seq ', seq))"
                )
            )
        assert wrong == 0
    finally:
        await engine.dispose()


async def _innodb_table_id(engine: AsyncEngine, table: str) -> int:
    """InnoDB's id of ``table``: a new one whenever the table is rebuilt (copied)."""
    async with engine.connect() as conn:
        version = str((await conn.exec_driver_sql("SELECT VERSION()")).scalar_one())
        view = "INNODB_SYS_TABLES" if "MariaDB" in version else "INNODB_TABLES"
        found = await conn.execute(
            text(f"SELECT table_id FROM information_schema.{view} WHERE name = :name"),
            {"name": f"{engine.url.database}/{table}"},
        )
        return int(found.scalar_one())


async def _title_type(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        found = await conn.exec_driver_sql(
            "SELECT column_type FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = 'ds_sessions' AND column_name = 'title'"
        )
        return str(found.scalar_one())


@pytest.mark.mysql
async def test_mysql_widens_the_title_column_in_place_waiting_out_a_long_transaction(
    fresh_mysql_url: Callable[[], str],
) -> None:
    """Revision 0014 on a filled MySQL database at 0013, while the probe reads and appends
    and a transaction holds ``ds_sessions`` (its metadata lock): the ALTER gives up after
    the lock timeout and tries again, so no reader or writer waits behind it longer than
    that, until the transaction ends; then it widens the title column without copying the
    table (InnoDB's id of the table stays), the data intact."""
    url = fresh_mysql_url()
    engine = create_async_engine(url)
    retried = asyncio.Event()
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if sum("trying again" in seen for seen in lines) >= 2:  # several tries
            retried.set()

    try:
        await seed(engine, "0013")
        seeded = await snapshot(engine)
        table_id = await _innodb_table_id(engine, "ds_sessions")
        assert await _title_type(engine) == "varbinary(1024)"
        async with raw_mysql(url) as blocker, blocker.cursor() as cursor:
            await blocker.begin()
            await cursor.execute("SELECT count(*) FROM ds_sessions")  # holds its lock
            await cursor.fetchall()
            async with Probe(url) as probe:
                await probe.rounds(3)
                migration = asyncio.create_task(
                    upgrade(engine, "0014", lock_timeout=1, progress=progress)
                )
                await asyncio.wait_for(retried.wait(), 60)
                await probe.rounds(3)  # the probe at work meanwhile
                assert not migration.done()
                await blocker.rollback()
                report = await migration
                await probe.rounds(3)
        assert report.applied == ("0014",), lines
        probe.check()
        assert await current(engine) == "0014"
        assert await _title_type(engine) == "varbinary(8448)"
        assert await _innodb_table_id(engine, "ds_sessions") == table_id  # not copied
        assert await snapshot(engine) == seeded
    finally:
        await engine.dispose()
