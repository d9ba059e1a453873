"""Faults: a writer's connection killed mid-transaction (Postgres, MySQL), a writer process
SIGKILLed (SQLite), a Postgres server restarted under a running store. No partial write, a
typed error, and the same store object goes on working."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    Event,
    Filter,
    Manager,
    SessionError,
    SessionNotFoundError,
    SQLStore,
    StoreUnavailableError,
)
from reliability import pgcluster, sqlite_appender
from reliability.figures import Figures
from reliability.helpers import count_present
from reliability.mariadb_server import PrivateMariaDB
from reliability.pgcluster import ClusterUnavailable, PrivateCluster, find_pg_bindir
from support.sql import MYSQL, raw_mysql, raw_pg, snapshot

POSTGRES = [pytest.param("postgres", marks=pytest.mark.postgres)]
SQLITE = [pytest.param("sqlite", marks=pytest.mark.sqlite)]

# -- a writer's connection killed mid-transaction --------------------------------------------


async def blocked_behind(admin: Any, locker_pid: int, timeout: float = 10.0) -> int:
    """Return the pid of the backend waiting for a lock that ``locker_pid`` holds."""
    for _ in range(int(timeout / 0.01)):
        pids = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", locker_pid
        )
        if pids:
            assert len(pids) == 1
            return int(pids[0]["pid"])
        await asyncio.sleep(0.01)
    raise AssertionError("the writer never blocked on the locked ds_user_state row")


async def has_written(admin: Any, pid: int, session_id: str | None) -> bool:
    """Whether backend ``pid`` has already written in its open transaction.

    With a ``session_id``: whether it holds that session's row locked, i.e. updated it (a
    NOWAIT lock attempt fails). Without: whether it holds a transaction id, which Postgres
    hands out at a transaction's first write (here, the new session's row).
    """
    if session_id is None:
        return bool(
            await admin.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'transactionid' "
                "AND mode = 'ExclusiveLock' AND granted",
                pid,
            )
        )
    try:
        async with admin.transaction():
            await admin.execute(
                "SELECT 1 FROM ds_sessions WHERE org_id = 'org' AND id = $1 FOR UPDATE NOWAIT",
                session_id,
            )
    except asyncpg.exceptions.LockNotAvailableError:
        return True
    return False


async def mysql_blocked_writer(admin: Any, database: str, timeout: float = 10.0) -> Any:
    """Return the thread id of the one connection to ``database`` writing ``ds_user_state``
    (which waits for the row held): every write does so after it wrote its session row."""
    async with admin.cursor() as cursor:
        for _ in range(int(timeout / 0.01)):
            await cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST p "
                "WHERE p.DB = %s AND p.COMMAND = 'Query' "
                "AND p.INFO LIKE 'INSERT INTO ds_user_state%%'",
                (database,),
            )
            found = await cursor.fetchall()
            if found:
                assert len(found) == 1
                return found[0][0]
            await asyncio.sleep(0.01)
    raise AssertionError("the writer never blocked on the locked ds_user_state row")


Kill = Callable[[str | None], Awaitable[None]]
"""Kill the connection of the writer blocked behind the held row, once it has written
(with a session id: that session's row)."""


@contextlib.asynccontextmanager
async def user_key_held(backend: str, url: str) -> AsyncIterator[Kill]:
    """Another connection holds alice's ``user:k`` row locked in an open transaction (rolled
    back at the end of the block); the block gets the ``Kill`` of the writer behind it."""
    where = "org_id = 'org' AND app_name = 'app' AND user_id = 'alice'"
    if backend == "mysql":
        async with (
            raw_mysql(url) as locker,
            raw_mysql(url) as admin,
            locker.cursor() as cursor,
        ):
            await locker.begin()
            await cursor.execute(f"SELECT 1 FROM ds_user_state WHERE {where} AND `key` = 'k' "
                                 "FOR UPDATE")  # fmt: skip

            async def kill_mysql(session_id: str | None) -> None:
                writer = await mysql_blocked_writer(admin, make_url(url).database or "")
                async with admin.cursor() as killer:
                    await killer.execute(f"KILL CONNECTION {int(writer)}")

            try:
                yield kill_mysql
            finally:
                await locker.rollback()
        return
    async with raw_pg(url) as locker, raw_pg(url) as admin:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute(f"SELECT 1 FROM ds_user_state WHERE {where} AND key = 'k' FOR UPDATE")

        async def kill_pg(session_id: str | None) -> None:
            writer = await blocked_behind(admin, locker.get_server_pid())
            assert await has_written(admin, writer, session_id)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", writer)

        try:
            yield kill_pg
        finally:
            await transaction.rollback()


def scoped(n: int) -> dict[str, Any]:
    """The state one write of the kill scenario sets, in every scope."""
    return {"own": n, "user:k": n, "app:a": n}


@pytest.mark.parametrize("backend", [*POSTGRES, MYSQL])
@pytest.mark.parametrize("operation", ["save", "append_event", "create"])
async def test_writer_killed_mid_transaction(
    engine: AsyncEngine, backend: str, backend_url: str, operation: str, figures: Figures
) -> None:
    """The writer has written the session row and waits for a ``ds_user_state`` row that
    another connection holds locked; its connection is killed (``pg_terminate_backend``,
    MySQL's ``KILL CONNECTION``). Nothing of the write stays, a StoreUnavailableError is
    raised, and the same store object then writes fine."""
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "alice", state=scoped(0))

    async def write(n: int) -> None:
        if operation == "save":
            copy = await manager.get("org", session.id)
            for key, value in scoped(n).items():
                copy.set(key, value)
            await manager.save(copy)
        elif operation == "append_event":
            event = Event("agent", content=n, state_delta=scoped(n), tokens=5)
            await store.append_event("org", session.id, event)
        else:
            await manager.create("org", "alice", id=f"new-{n}", state=scoped(n))

    before = await snapshot(engine)
    async with user_key_held(backend, backend_url) as kill:
        attempt = asyncio.create_task(write(1))
        await kill(None if operation == "create" else session.id)
        with pytest.raises(SessionError) as caught:
            await attempt
    assert isinstance(caught.value, StoreUnavailableError), caught.value
    assert await snapshot(engine) == before  # no partial write, in any table

    await write(2)  # the next operation on the same store object succeeds
    if operation == "create":
        with pytest.raises(SessionNotFoundError):
            await manager.get("org", "new-1")
        stored = await manager.get("org", "new-2")
        assert stored.version == 1
    else:
        stored = await manager.get("org", session.id)
        assert stored.version == 2
    want: dict[str, Any] = scoped(2)
    found = count_present(want, stored.state)
    if operation == "append_event":
        events = await store.list_events("org", session.id)
        assert [(e.seq, e.content) for e in events] == [(1, 2)]
        assert (stored.message_count, stored.token_total) == (1, 5)
        want["event"] = 2
        found += len(events)
    figures.record(
        f"connection killed mid-{operation}",
        backend,
        operations=2,
        expected=len(want),
        found=found,
        errors=1,
    )


# -- a SQLite writer process SIGKILLed mid-write ---------------------------------------------


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite+aiosqlite:///`` URL."""
    path = make_url(url).database
    assert path
    return path


def check_file(path: str) -> None:
    """The file passes SQLite's integrity and foreign-key checks (after WAL recovery)."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQLITE)
async def test_sqlite_writer_sigkilled_mid_write(
    engine: AsyncEngine, backend: str, backend_url: str, figures: Figures
) -> None:
    """A process appends events in a loop and is SIGKILLed right after reporting a commit
    (so most likely inside the next transaction), three times. Each time the file passes
    ``PRAGMA integrity_check``, every reported seq is stored, and every stored event comes
    with its whole state delta and its counter increments."""
    store = SQLStore(engine)
    session = await Manager(store, app_name="app").create("org", "alice")
    script = Path(sqlite_appender.__file__)
    reported: set[int] = set()
    runs = {"r0": 15, "r1": 40, "r2": 25}  # commits to see before each kill
    for run, commits in runs.items():
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            backend_url,
            "org",
            session.id,
            run,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        seen = 0
        while seen < commits:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            if not line:
                err = await proc.stderr.read() if proc.stderr else b""
                raise AssertionError(f"the appender exited early: {err.decode()}")
            reported.add(int(line))
            seen += 1
        os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
        check_file(sqlite_path(backend_url))

    events = await store.list_events("org", session.id)
    stored = await store.get("org", session.id)
    seqs = [e.seq for e in events]
    figures.record(
        "writer process SIGKILLed mid-append",
        backend,
        operations=len(events),
        expected=len(reported),
        found=len(reported & set(seqs)),
        errors=0,
    )
    assert seqs == list(range(1, len(events) + 1))  # gapless, nothing torn
    assert stored.message_count == stored.token_total == len(events)
    assert stored.version == 1 + len(events)
    for event in events:  # every stored event has its whole delta, in both scopes
        run, i = str(event.content).split("-")
        delta = sqlite_appender.delta_of(run, int(i))
        assert event.state_delta == delta
        assert count_present(delta, stored.state) == len(delta)


# -- Postgres restarted under a running store ------------------------------------------------


def cannot(server: str, reason: str) -> NoReturn:
    """Skip a restart test this machine cannot run, with its reason; under CI=true, fail it."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the {server} restart tests cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def private_cluster() -> Iterator[PrivateCluster]:
    """A throwaway Postgres cluster of this module alone, deleted afterwards.

    A machine that cannot run one (no server binaries, no ``runuser`` as root, a server
    that does not start) skips the tests with its reason locally, and fails them under
    CI=true, where they must run.
    """
    bindir = find_pg_bindir()
    if bindir is None:
        cannot("Postgres", "no Postgres server binaries (initdb, pg_ctl) to run a private cluster")
    try:
        cluster = PrivateCluster(bindir)
    except ClusterUnavailable as exc:
        cannot("Postgres", str(exc))
    try:
        try:
            cluster.start()
        except (RuntimeError, OSError) as exc:
            cannot("Postgres", f"the private Postgres cluster did not start: {exc}")
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[PrivateMariaDB]:
    """A throwaway MariaDB server of this module alone (never the shared one), deleted
    afterwards; skipped with its reason locally, failed under CI=true, when it cannot run."""
    try:
        server = PrivateMariaDB()
    except ClusterUnavailable as exc:
        cannot("MySQL", str(exc))
    try:
        try:
            server.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            cannot("MySQL", f"the private MariaDB server did not start: {exc}")
        yield server
    finally:
        server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="runuser is what root runs the server with")
def test_as_root_without_runuser_a_cluster_is_unavailable_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip("no Postgres server binaries")
    monkeypatch.setattr(pgcluster, "find_runuser", lambda: None)
    with pytest.raises(ClusterUnavailable, match="there is no runuser"):
        PrivateCluster(bindir)


def test_runuser_is_found_off_a_normal_users_path(monkeypatch: pytest.MonkeyPatch) -> None:
    if not any(Path(d, "runuser").exists() for d in pgcluster.SYSTEM_BIN.split(os.pathsep)):
        pytest.skip("no runuser on this machine")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    found = pgcluster.find_runuser()
    assert found is not None
    assert Path(found).name == "runuser"


PRE_PING = pytest.mark.parametrize(
    "pre_ping",
    [
        pytest.param(False, id="plain-engine"),
        pytest.param(True, id="pool_pre_ping"),
    ],
)


@pytest.mark.slow
@pytest.mark.postgres
@PRE_PING
async def test_store_recovers_after_postgres_restart(
    private_cluster: PrivateCluster, pre_ping: bool, figures: Figures
) -> None:
    """A store with warm pooled connections sees its server restart. The same store object
    works again after at most one failed operation, which is a StoreUnavailableError (with
    ``pool_pre_ping=True``: none), and nothing committed before the restart is lost."""
    await recovers_after_restart(
        private_cluster.url, private_cluster.restart, "postgres", pre_ping, figures
    )


@pytest.mark.slow
@pytest.mark.mysql
@PRE_PING
async def test_store_recovers_after_mysql_restart(
    private_mariadb: PrivateMariaDB, pre_ping: bool, figures: Figures
) -> None:
    """The same, on a MariaDB server of the test's own."""
    await recovers_after_restart(
        private_mariadb.url, private_mariadb.restart, "mysql", pre_ping, figures
    )


async def recovers_after_restart(
    url: str, restart: Callable[[], None], backend: str, pre_ping: bool, figures: Figures
) -> None:
    """Warm a store's pool, ``restart`` its server, then run every kind of operation."""
    # As the README builds it: create_async_engine(url), optionally with pool_pre_ping.
    engine = create_async_engine(url, pool_pre_ping=pre_ping)
    try:
        store = SQLStore(engine)
        await store.migrate()
        manager = Manager(store, app_name="app")
        org = f"org-{'ping' if pre_ping else 'plain'}"
        written: dict[str, Any] = {}
        created = await asyncio.gather(  # several connections in the pool, all to be dropped
            *(manager.create(org, "alice", state={f"user:before-{i}": i}) for i in range(4))
        )
        written.update({f"user:before-{i}": i for i in range(4)})
        sid = created[0].id

        await asyncio.to_thread(restart)

        async def save() -> None:
            copy = await manager.get(org, sid)
            copy.set("user:after", 1)
            copy.set("own-after", 1)
            await manager.save(copy)

        async def append() -> None:
            await store.append_event(org, sid, Event("agent", content="after", tokens=1))

        async def create() -> None:
            await manager.create(org, "alice", id="after-restart", state={"app:after": 1})

        operations: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("get", lambda: manager.get(org, sid)),
            ("save", save),
            ("append_event", append),
            ("touch", lambda: store.touch(org, sid, messages=1)),
            ("list", lambda: manager.list(Filter(org))),
            ("list_events", lambda: store.list_events(org, sid)),
            ("create", create),
        ]
        failures: list[tuple[str, StoreUnavailableError]] = []
        attempts = 0
        for name, operation in operations:
            attempts += 1
            try:
                await operation()
            except StoreUnavailableError as exc:  # anything else fails the test
                failures.append((name, exc))
                attempts += 1
                await operation()  # a second failure would fail the test here
        written.update({"user:after": 1, "own-after": 1})
        assert len(failures) <= 1, failures
        if pre_ping:
            assert failures == []
        else:
            assert [name for name, _ in failures] in ([], ["get"])

        stored = await manager.get(org, sid)
        fresh = await manager.get(org, "after-restart")
        events = await store.list_events(org, sid)
        assert [e.content for e in events] == ["after"]
        assert fresh.state["app:after"] == 1
        engine_kind = "pool_pre_ping" if pre_ping else "plain engine"
        figures.record(
            f"server restarted under the store, {engine_kind}",
            backend,
            operations=attempts,
            expected=len(written),
            found=count_present(written, stored.state),
            errors=len(failures),
        )
    finally:
        await engine.dispose()


# -- connection errors that are not a missing schema -----------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("wrong", ["database", "role"])
async def test_missing_database_or_role_is_store_unavailable(pg_base_url: str, wrong: str) -> None:
    url = make_url(pg_base_url)
    if wrong == "database":
        url = url.set(database="ds_no_such_database")
    else:
        url = url.set(username="ds_no_such_role")
    engine = create_async_engine(url)
    try:
        with pytest.raises(StoreUnavailableError):
            await SQLStore(engine).get("org", "id")
    finally:
        await engine.dispose()
