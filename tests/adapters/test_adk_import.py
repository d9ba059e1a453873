"""import_adk and `durable-sessions import-adk`: databases written by google-adk's own
DatabaseSessionService (SQLite, Postgres, and MySQL through both of SQLAlchemy's dialects)
copied into SQLite, Postgres and MySQL, then every ADK call answered alike by ADK's service
on the source and DurableSessionService on the copy."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions import Session as AdkSession
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Filter, SQLStore, Store
from durable_sessions.adapters.adk import importer as importing
from durable_sessions.adk import (
    AdkImportError,
    DurableSessionService,
    durable_session_id,
    import_adk,
)
from support.adk import view
from support.memory import run_measured
from support.sql import STORE_SQL_BACKENDS, snapshot

ORG = "acme"
BASE = 1_750_000_000.0

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)


@pytest.fixture(
    params=[
        "adk-sqlite",
        pytest.param("adk-postgres", marks=pytest.mark.postgres),
        pytest.param("adk-mysql", marks=pytest.mark.mysql),
        pytest.param("adk-mariadb", marks=pytest.mark.mysql),
    ]
)
def adk_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database for ADK's DatabaseSessionService to write (on MySQL through
    either of SQLAlchemy's dialects: ``mysql+asyncmy`` and ``mariadb+asyncmy``)."""
    return new_adk_url(request, tmp_path, request.param)


def new_adk_url(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> str:
    """``adk_url`` of one kind (``adk-sqlite``, ``adk-postgres``, ``adk-mysql`` or
    ``adk-mariadb``)."""
    if kind == "adk-sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
    if kind in ("adk-mysql", "adk-mariadb"):
        made: Callable[[], str] = request.getfixturevalue("fresh_mysql_url")
        scheme = kind.removeprefix("adk-") + "+asyncmy"
        return make_url(made()).set(drivername=scheme).render_as_string(hide_password=False)
    make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
    return make()


def text(role: str, words: str) -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=words)])


def event(n: int, author: str = "user", **kwargs: Any) -> Event:
    return Event(invocation_id=f"inv-{n}", author=author, timestamp=BASE + n, **kwargs)


async def append(service: BaseSessionService, session: AdkSession, item: Event) -> None:
    """Append to ``session`` as read back from storage: through a ``mariadb://`` URL ADK
    keeps update times to the second, and an append to a session it has appended to since
    it was read fails as stale."""
    fresh = await service.get_session(
        app_name=session.app_name, user_id=session.user_id, session_id=session.id
    )
    assert fresh is not None
    await service.append_event(fresh, item)


async def write_with_adk(service: BaseSessionService) -> list[tuple[str, str, str]]:
    """Sessions, events and state of every scope, written by ADK itself; return the
    (app, user, id) of every session that remains."""
    kept = []
    main = await service.create_session(
        app_name="trips",
        user_id="alice",
        session_id="main",
        state={"topic": "paris", "user:lang": "fr", "app:tier": "gold", "temp:x": 1},
    )
    call = types.FunctionCall(id="fc-1", name="remember", args={"city": "Paris", "n": [1, 2.5]})
    answer = types.FunctionResponse(id="fc-1", name="remember", response={"ok": True})
    for item in [
        event(1, content=text("user", "I live in Paris")),
        event(
            2,
            "concierge",
            content=types.Content(role="model", parts=[types.Part(function_call=call)]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=7, candidates_token_count=5, total_token_count=12
            ),
        ),
        event(
            3,
            "concierge",
            content=types.Content(role="user", parts=[types.Part(function_response=answer)]),
            actions=EventActions(state_delta={"user:city": "Paris", "visits": 1}),
        ),
        event(
            4,
            "concierge",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="Noted."),
                    types.Part.from_bytes(data=b"\x00\x01png", mime_type="image/png"),
                ],
            ),
            usage_metadata=types.GenerateContentResponseUsageMetadata(total_token_count=20),
            actions=EventActions(state_delta={"app:motd": {"text": "hi"}, "temp:t": 1}),
        ),
        event(5, partial=True, content=text("model", "never stored")),
    ]:
        await append(service, main, item)
    kept.append(("trips", "alice", "main"))

    bob = await service.create_session(
        app_name="trips", user_id="bob", session_id="main", state={"n": 1, "user:lang": "de"}
    )
    for n in range(6, 36):  # more events than a page, for the paging below
        await append(service, bob, event(n, content=text("user", f"message {n}")))
    kept.append(("trips", "bob", "main"))

    empty = await service.create_session(app_name="trips", user_id="alice")
    kept.append(("trips", "alice", empty.id))
    for i in range(4):
        made = await service.create_session(
            app_name="other", user_id=f"user-{i}", state={"i": i, "app:flag": True}
        )
        kept.append(("other", f"user-{i}", made.id))
    gone = await service.create_session(app_name="trips", user_id="alice", session_id="gone")
    await append(service, gone, event(40))
    await service.delete_session(app_name="trips", user_id="alice", session_id="gone")
    return kept


CONFIGS = [
    None,
    GetSessionConfig(num_recent_events=0),
    GetSessionConfig(num_recent_events=2),
    GetSessionConfig(num_recent_events=100),
    GetSessionConfig(after_timestamp=BASE + 3),
    GetSessionConfig(after_timestamp=BASE + 20, num_recent_events=3),
]


async def assert_same_answers(
    adk: BaseSessionService, ours: DurableSessionService, kept: list[tuple[str, str, str]]
) -> None:
    for app_name, user_id, session_id in [*kept, ("trips", "alice", "gone")]:
        for config in CONFIGS:
            expected = await adk.get_session(
                app_name=app_name, user_id=user_id, session_id=session_id, config=config
            )
            got = await ours.get_session(
                app_name=app_name, user_id=user_id, session_id=session_id, config=config
            )
            assert view(got) == view(expected), (app_name, user_id, session_id, config)
    for app_name in ("trips", "other", "nobody"):
        users = [*sorted({user for app, user, _ in kept if app == app_name}), "nobody"]
        for user_id in [None, *users]:
            expected_list = await adk.list_sessions(app_name=app_name, user_id=user_id)
            got_list = await ours.list_sessions(app_name=app_name, user_id=user_id)
            assert [view(s) for s in got_list.sessions] == [view(s) for s in expected_list.sessions]
            if user_id is not None:
                assert await ours.get_user_state(
                    app_name=app_name, user_id=user_id
                ) == await adk.get_user_state(app_name=app_name, user_id=user_id)


async def test_an_adk_database_reads_back_alike_after_import(
    adk_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importing, "PAGE_SIZE", 3)  # pages and batches end mid-way
    monkeypatch.setattr(importing, "BATCH_SIZE", 4)
    adk = DatabaseSessionService(db_url=adk_url)
    try:
        kept = await write_with_adk(adk)
        assert isinstance(store, SQLStore)
        progress: list[int] = []
        counts = await import_adk(adk_url, store, org_id=ORG, progress=progress.append)
        assert sum(progress) == counts.sessions == len(kept) == 7
        assert counts.events == 4 + 30
        assert counts.user_state == 3  # alice's lang and city, bob's lang
        assert counts.app_state == 3  # trips' tier and motd, other's flag

        ours = DurableSessionService(store, org_id=ORG)
        await assert_same_answers(adk, ours, kept)

        # The sessions are durable sessions now: counters, ids, and they go on.
        alice = await store.get(ORG, durable_session_id("trips", "alice", "main"))
        assert (alice.message_count, alice.token_total) == (4, 32)
        assert alice.state == {
            "topic": "paris",
            "visits": 1,
            "user:lang": "fr",
            "user:city": "Paris",
            "app:tier": "gold",
            "app:motd": {"text": "hi"},
        }
        assert len(await store.list(Filter(ORG))) == 7
        resumed = await ours.get_session(app_name="trips", user_id="alice", session_id="main")
        assert resumed is not None
        await ours.append_event(resumed, event(50, content=text("user", "And now?")))
        again = await ours.get_session(app_name="trips", user_id="alice", session_id="main")
        assert again is not None
        assert [e.invocation_id for e in again.events] == [f"inv-{n}" for n in (1, 2, 3, 4, 50)]
        assert (await store.get(ORG, alice.id)).message_count == 5
    finally:
        await adk.close()


async def test_a_second_import_is_refused_and_writes_nothing(
    adk_url: str, store: Store, engine: AsyncEngine
) -> None:
    adk = DatabaseSessionService(db_url=adk_url)
    try:
        await write_with_adk(adk)
    finally:
        await adk.close()
    assert isinstance(store, SQLStore)
    await import_adk(adk_url, store, org_id=ORG)
    before = await snapshot(engine)
    with pytest.raises(AdkImportError, match="of organisation 'acme' already exists"):
        await import_adk(adk_url, store, org_id=ORG)
    assert await snapshot(engine) == before
    # Another organisation is another namespace: the same data goes in again.
    counts = await import_adk(adk_url, store, org_id="other-org")
    assert counts.sessions == 7


async def test_a_value_durable_sessions_cannot_store_refuses_the_whole_import(
    tmp_path: Path, store: Store, engine: AsyncEngine
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
    adk = DatabaseSessionService(db_url=url)
    try:
        await adk.create_session(app_name="a", user_id="u", session_id="fine", state={"x": 1})
        await adk.create_session(app_name="a", user_id="u", session_id="nan", state={"x": 1.5})
    finally:
        await adk.close()
    with sqlite3.connect(tmp_path / "adk.db") as raw:  # ADK's SQLite JSON allows NaN
        raw.execute("UPDATE sessions SET state = '{\"x\": NaN}' WHERE id = 'nan'")
    before = await snapshot(engine)
    assert isinstance(store, SQLStore)
    with pytest.raises(AdkImportError) as caught:
        await import_adk(url, store, org_id=ORG)
    message = str(caught.value)
    assert "'nan'" in message
    assert "NaN" in message or "nan" in message
    assert "nothing was imported" in message
    assert "\n" not in message
    assert await snapshot(engine) == before


async def test_the_legacy_pickle_schema_is_refused_with_the_command_to_run(
    tmp_path: Path, store: Store
) -> None:
    from google.adk.sessions.schemas import v0

    path = tmp_path / "legacy.db"
    sync = create_engine(f"sqlite:///{path}")
    v0.Base.metadata.create_all(sync)
    sync.dispose()
    with sqlite3.connect(path) as raw:  # a row that would fail to unpickle if anyone tried
        raw.execute(
            "INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time) "
            "VALUES ('a', 'u', 's', '{}', '2025-01-01 00:00:00', '2025-01-01 00:00:00')"
        )
        raw.execute(
            "INSERT INTO events (id, app_name, user_id, session_id, invocation_id, author, "
            "actions, timestamp) VALUES ('e', 'a', 'u', 's', 'i', 'user', X'00FF', "
            "'2025-01-01 00:00:00')"
        )
    assert isinstance(store, SQLStore)
    with pytest.raises(AdkImportError, match="adk migrate session") as caught:
        await import_adk(f"sqlite:///{path}", store, org_id=ORG)
    assert "legacy schema" in str(caught.value)


async def test_a_missing_or_unreadable_source_is_one_clear_error(
    tmp_path: Path, store: Store
) -> None:
    assert isinstance(store, SQLStore)
    missing = tmp_path / "missing.db"
    with pytest.raises(AdkImportError, match="there is no ADK database file"):
        await import_adk(f"sqlite:///{missing}", store, org_id=ORG)
    assert not missing.exists()  # never created
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(AdkImportError, match="cannot read the ADK database"):
        await import_adk(f"sqlite:///{garbage}", store, org_id=ORG)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE notes (x)").connection.close()
    with pytest.raises(AdkImportError, match="is not a database of ADK's"):
        await import_adk(f"sqlite:///{other}", store, org_id=ORG)
    with pytest.raises(AdkImportError, match="cannot read the ADK database at") as caught:
        await import_adk("postgresql://ada:s3cret@127.0.0.1:1/nope", store, org_id=ORG)
    assert "s3cret" not in str(caught.value)
    with pytest.raises(AdkImportError, match="SQLite, Postgres and MySQL"):
        await import_adk("mssql://u@h/db", store, org_id=ORG)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "durable_sessions", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


COMMAND_SOURCE = {"sqlite": "adk-sqlite", "postgres": "adk-postgres", "mysql": "adk-mariadb"}
"""The ADK database the command imports into each store: the import itself runs over every
pair of source and store above, in process; the command adds its wiring, its output and its
one-line errors, which one source per store covers (each a process of its own)."""


async def test_the_command_imports_once_and_explains_failures_in_one_line(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    backend_url: str,
    backend: str,
    engine: AsyncEngine,
) -> None:
    adk_url = new_adk_url(request, tmp_path, COMMAND_SOURCE[backend])
    adk = DatabaseSessionService(db_url=adk_url)
    try:
        kept = await write_with_adk(adk)
    finally:
        await adk.close()
    target = ["--url", backend_url]
    done = cli(*target, "import-adk", "--from", adk_url, "--org", ORG)
    assert done.returncode == 0, done.stderr
    assert "Imported 7 sessions, 34 events, 3 user: and 3 app: state rows" in done.stdout
    ours = DurableSessionService(SQLStore(engine), org_id=ORG)
    listed = await ours.list_sessions(app_name="trips")
    assert sorted((s.user_id, s.id) for s in listed.sessions) == sorted(
        (user, sid) for app, user, sid in kept if app == "trips"
    )
    shown = cli(*target, "show", "trips/alice/main", "--org", ORG)
    assert shown.returncode == 0, shown.stderr
    assert "alice" in shown.stdout

    again = cli(*target, "import-adk", "--from", adk_url, "--org", ORG)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1
    assert "already exists" in again.stderr
    assert "Traceback" not in again.stderr
    for source, expected in (
        ("sqlite:///no/such/adk.db", "there is no ADK database file"),
        ("postgresql://ada:s3cret@127.0.0.1:1/nope", "cannot read the ADK database"),
        ("mysql://ada:s3cret@127.0.0.1:1/nope", "cannot read the ADK database"),
    ):
        failed = cli(*target, "import-adk", "--from", source, "--org", ORG)
        assert failed.returncode == 1
        assert expected in failed.stderr
        assert failed.stderr.count("\n") == 1
        assert "s3cret" not in failed.stderr


# -- the source is only read; memory stays flat ---------------------------------------------


def beside(path: Path) -> dict[str, tuple[str, int]]:
    """Every file in the source's directory: its SHA-256 and its mtime (ns)."""
    return {
        entry.name: (hashlib.sha256(entry.read_bytes()).hexdigest(), entry.stat().st_mtime_ns)
        for entry in sorted(path.parent.iterdir())
    }


@pytest.mark.parametrize("journal", ["delete", "wal"])
async def test_a_sqlite_source_is_only_read(tmp_path: Path, store: Store, journal: str) -> None:
    """The import opens a SQLite source read-only: its bytes and mtime are unchanged. In
    ADK's own (rollback) journal mode no file is made beside it (no -journal, -wal or -shm);
    a file switched to WAL gets what SQLite gives any reader of a WAL database, an empty
    -wal and the -shm index, and nothing else."""
    path = tmp_path / "source" / "adk.db"
    path.parent.mkdir()
    url = f"sqlite+aiosqlite:///{path}"
    adk = DatabaseSessionService(db_url=url)
    try:
        kept = await write_with_adk(adk)
    finally:
        await adk.close()
    raw = sqlite3.connect(path)
    assert raw.execute(f"PRAGMA journal_mode = {journal}").fetchone() == (journal,)
    raw.close()
    # An old mtime: a write now, however small, would move it.
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = beside(path)
    assert list(before) == ["adk.db"]
    assert isinstance(store, SQLStore)
    readers = {"adk.db-wal", "adk.db-shm"} if journal == "wal" else set()

    def unchanged() -> None:
        after = beside(path)
        assert after["adk.db"] == before["adk.db"]
        assert set(after) == {"adk.db", *readers}
        if readers:
            assert (path.parent / "adk.db-wal").stat().st_size == 0

    counts = await import_adk(url, store, org_id=ORG)
    assert counts.sessions == len(kept)
    unchanged()
    # The command too (with a plain sqlite:/// URL), into another organisation.
    target = store.engine.url.render_as_string(hide_password=False)
    done = await asyncio.to_thread(
        cli, "--url", target, "import-adk", "--from", f"sqlite:///{path}", "--org", "again"
    )
    assert done.returncode == 0, done.stderr
    assert "Imported 7 sessions" in done.stdout
    unchanged()


BIG_EVENT_CHARS = (1 << 20) - 1024
"""The text of a large event: with the rest of it, about 1 MiB as JSON."""
EVENTS_PER_SESSION = 10
SIZES = (50, 200)
"""Events of about 1 MiB in the small and the large source."""
GROWTH_MIB = 96
"""What an import may add to its memory at its peak, whatever the data: about 45-57 MiB
here (batches of BATCH_BYTES read, decoded, converted and written); before events were read
and written in batches of bounded bytes, 164 and 673 MiB into SQLite, 252 and 1,057 MiB into
Postgres, for 50 and 200 events."""
SPREAD_MIB = 16
"""How much more the import of 4 times the data may add: noise, not the data."""


async def write_big(url: str, events: int) -> None:
    """An ADK database of ``events`` events of about 1 MiB each, written by ADK itself, in
    sessions of EVENTS_PER_SESSION (none held in memory for long)."""
    adk = DatabaseSessionService(db_url=url)
    try:
        for start in range(0, events, EVENTS_PER_SESSION):
            session = await adk.create_session(
                app_name="big", user_id=f"user-{start}", state={"n": start, "user:k": start}
            )
            for n in range(start, min(events, start + EVENTS_PER_SESSION)):
                await adk.append_event(
                    session,
                    event(
                        n,
                        "model",
                        content=text("model", "x" * BIG_EVENT_CHARS),
                        usage_metadata=types.GenerateContentResponseUsageMetadata(
                            total_token_count=n
                        ),
                    ),
                )
                session.events.clear()  # only this test's copy: ADK stores each as appended
    finally:
        await adk.close()


@pytest.fixture(scope="module")
def big_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """A small ADK database (to warm up with) and one of each of SIZES, made once."""
    where = tmp_path_factory.mktemp("big-adk")
    urls = {size: f"sqlite+aiosqlite:///{where / f'adk-{size}.db'}" for size in (1, *SIZES)}

    async def build() -> None:
        for size, url in urls.items():
            await write_big(url, size)

    with ThreadPoolExecutor(1) as pool:  # its own loop, off any test's
        pool.submit(asyncio.run, build()).result()
    return urls


MEASURE = """
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions import SQLStore
from durable_sessions.adk import import_adk
from support.memory import peak_kib, restart_peak

async def main():
    warm, source, target, org = sys.argv[1:5]
    engine = create_async_engine(target)
    store = SQLStore(engine)
    # Every module loaded, every statement compiled, a connection open on each side.
    await import_adk(warm, store, org_id="warm-" + org)
    before = restart_peak()
    counts = await import_adk(source, store, org_id=org)
    peak = peak_kib()
    await engine.dispose()
    print(counts.events, before, peak)

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
async def test_import_memory_does_not_grow_with_the_data(
    big_sources: dict[int, str], store: Store, backend_url: str
) -> None:
    """Sources of 50 and 200 events of 1 MiB, each imported by a child process (VmHWM):
    its peak stays under GROWTH_MIB over its memory before importing, and the import of 4
    times the data adds at most SPREAD_MIB more."""
    growth = {}
    for size in SIZES:
        out = await asyncio.to_thread(
            run_measured, MEASURE, big_sources[1], big_sources[size], backend_url, f"o{size}"
        )
        events, before, peak = map(int, out.split())
        assert events == size
        growth[size] = (peak - before) / 1024
    small, large = (growth[size] for size in SIZES)
    assert large < GROWTH_MIB, growth
    assert large - small < SPREAD_MIB, growth
    # The data arrived whole: every session, event and token, and the text of an event.
    imported = await store.list(Filter("o200"))
    assert len(imported) == 200 // EVENTS_PER_SESSION
    assert sum(s.message_count for s in imported) == 200
    assert sum(s.token_total for s in imported) == sum(range(200))
    ours = DurableSessionService(store, org_id="o200")
    adk_id = imported[0].id.rpartition("/")[2]
    got = await ours.get_session(app_name="big", user_id=imported[0].user_id, session_id=adk_id)
    assert got is not None
    assert len(got.events) == EVENTS_PER_SESSION
    texts = [e.content.parts[0].text for e in got.events if e.content and e.content.parts]
    assert texts == ["x" * BIG_EVENT_CHARS] * EVENTS_PER_SESSION


async def test_an_import_into_an_encrypted_store_is_sealed(
    tmp_path: Path, engine: AsyncEngine, backend: str
) -> None:
    """Into a store with a keyring, what import_adk copied is sealed when it returns: no
    stored title, state value, event or search word holds the ADK data in clear, and every
    ADK call and search answers as before."""
    from durable_sessions.crypto import LocalKeyring

    adk_url = f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
    adk = DatabaseSessionService(db_url=adk_url)
    store = SQLStore(engine, keyring=LocalKeyring(tmp_path / "keys.json"))
    try:
        kept = await write_with_adk(adk)
        counts = await import_adk(adk_url, store, org_id=ORG)
        assert (counts.sessions, counts.events) == (7, 34)
        # Each holds a space, a dot or a quote, which no sealed text (base64) does.
        stored = repr(await snapshot(engine))
        for text in ("I live in Paris", '"Paris"', "Noted.", "message 17", '"gold"', '"fr"'):
            assert text not in stored, text
        if backend == "mysql":
            async with engine.connect() as conn:
                found = await conn.exec_driver_sql("SELECT word FROM ds_event_words")
                words = {bytes(row[0]).decode() for row in found}
            assert words
            assert not words & {"paris", "noted", "message", "17"}
        await assert_same_answers(adk, DurableSessionService(store, org_id=ORG), kept)
        hits = await store.search(ORG, "live in Paris")
        assert [h.event.invocation_id for h in hits] == ["inv-1"]
    finally:
        await adk.close()
