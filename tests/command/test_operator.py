"""What an operator meets: where ``export -o`` writes, a database a newer version migrated,
missing extras, and ``delete-user --dry-run``; each run as a shell runs the command."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    Event,
    Manager,
    SchemaTooNewError,
    SQLStore,
    StoreError,
)
from durable_sessions.sql import migrate
from durable_sessions.sql.schema import VERSION_TABLE
from support.sql import STORE_SQL_BACKENDS

PROG = "durable-sessions"
REPO = Path(__file__).resolve().parents[2]
FUTURE = "9999_from_the_future"


def run(
    *argv: str, cwd: Path | None = None, prelude: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the command in a child process; ``prelude`` runs first (to hide a module)."""
    code = f"{prelude}\nimport sys\nfrom durable_sessions.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )


def one_error_line(err: bytes) -> str:
    text_ = err.decode()
    assert "Traceback" not in text_
    (line,) = text_.splitlines()
    return line


def seeded(tmp_path: Path) -> str:
    """A migrated SQLite file holding one session with one event."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"

    async def seed() -> None:
        engine = create_async_engine(url)
        try:
            store = SQLStore(engine)
            await store.migrate()
            session = await Manager(store).create("default", "ada")
            await store.append_event("default", session.id, Event("ada", "hello"))
        finally:
            await engine.dispose()

    asyncio.run(seed())
    return url


# -- export -o: replace a regular file, write into anything else ---------------------------


@pytest.mark.sqlite
def test_export_into_a_fifo_writes_into_it_and_leaves_it_a_fifo(tmp_path: Path) -> None:
    url = seeded(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    done = run("--url", url, "export", "-o", str(fifo))
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received[0].count(b"\n") == 3  # the header, the session, its event
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.sqlite
def test_export_into_a_character_device_writes_into_it_and_leaves_it_a_device(
    tmp_path: Path,
) -> None:
    url = seeded(tmp_path)
    if os.geteuid() == 0:  # root could replace /dev/null itself: use a twin of it
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        device = Path(os.devnull)
    done = run("--url", url, "export", "-o", str(device))
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert b"Exported 1 sessions" in done.stdout + done.stderr
    assert not list(device.parent.glob(".null.partial"))


@pytest.mark.sqlite
def test_export_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    url = seeded(tmp_path)
    target = tmp_path / "backups" / "latest.jsonl"
    target.parent.mkdir()
    target.write_bytes(b"old backup\n")
    target.chmod(0o640)
    link = tmp_path / "export.jsonl"
    link.symlink_to(Path("backups") / "latest.jsonl")  # relative, as users make them
    done = run("--url", url, "export", "-o", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    assert os.readlink(link) == str(Path("backups") / "latest.jsonl")
    assert target.read_bytes().count(b"\n") == 3
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # its permissions kept
    assert sorted(p.name for p in target.parent.iterdir()) == ["latest.jsonl"]


@pytest.mark.sqlite
def test_export_to_dev_stdout_writes_into_stdout(tmp_path: Path) -> None:
    url = seeded(tmp_path)
    # stdout a pipe: the data comes down it, the summary goes to stderr.
    done = run("--url", url, "export", "-o", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(b"\n") == 3
    assert b"Exported 1 sessions" in done.stderr
    # stdout a regular file the shell opened: written into, not replaced by another file.
    out = tmp_path / "redirected.jsonl"
    with out.open("wb") as sink:
        inode = os.fstat(sink.fileno()).st_ino
        redirected = subprocess.run(
            [sys.executable, "-m", "durable_sessions", "--url", url, "export", "-o", "/dev/stdout"],
            stdout=sink, stderr=subprocess.PIPE, timeout=300, check=False,
        )  # fmt: skip
    assert redirected.returncode == 0, redirected.stderr
    assert out.stat().st_ino == inode
    assert out.read_bytes().count(b"\n") == 3


@pytest.mark.sqlite
def test_export_to_a_new_or_regular_file_is_still_all_or_nothing(tmp_path: Path) -> None:
    url = seeded(tmp_path)
    out = tmp_path / "new.jsonl"
    assert run("--url", url, "export", "-o", str(out)).returncode == 0
    first_inode = out.stat().st_ino
    assert run("--url", url, "export", "-o", str(out)).returncode == 0
    assert out.stat().st_ino != first_inode  # replaced by a rename, never half-written
    assert out.read_bytes().count(b"\n") == 3


# -- a database migrated by a newer version ------------------------------------------------


def stamp_future(url: str) -> None:
    async def stamp() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '{FUTURE}'"))
        finally:
            await engine.dispose()

    asyncio.run(stamp())


NEWER = (
    f"{PROG}: error: this database is at revision {FUTURE}, newer than this "
    f"durable-sessions knows (head {migrate.head()}); upgrade durable-sessions"
)


@pytest.mark.sqlite
@pytest.mark.parametrize(
    "argv",
    [["list"], ["migrate"], ["check"], ["current"], ["demo"], ["show", "x"], ["export"],
     ["import", "-i", os.devnull], ["downgrade", "base"]],
    ids=lambda argv: argv[0],
)  # fmt: skip
def test_every_command_on_a_newer_database_says_upgrade_in_one_line(
    argv: list[str], tmp_path: Path
) -> None:
    url = seeded(tmp_path)
    stamp_future(url)
    done = run("--url", url, *argv)
    assert done.returncode == 1
    assert one_error_line(done.stderr) == NEWER


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_migrate_on_a_newer_database_raises_schema_too_new(
    backend: str, backend_url: str
) -> None:
    engine = create_async_engine(backend_url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        async with engine.begin() as conn:
            await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '{FUTURE}'"))
        try:
            with pytest.raises(SchemaTooNewError) as raised:
                await store.migrate()
            assert isinstance(raised.value, StoreError)
            assert raised.value.revision == FUTURE
            assert str(raised.value) == NEWER.split("error: ", 1)[1]
            with pytest.raises(SchemaTooNewError):
                await migrate.downgrade(engine, "base")
        finally:
            async with engine.begin() as conn:
                await conn.execute(
                    text(f"UPDATE {VERSION_TABLE} SET version_num = '{migrate.head()}'")
                )
    finally:
        await engine.dispose()


@pytest.mark.sqlite
@pytest.mark.parametrize("words", [["upgrade", "head"], ["current"]], ids=" ".join)
def test_the_alembic_command_on_a_newer_database_says_upgrade_in_one_line(
    words: list[str], tmp_path: Path
) -> None:
    url = seeded(tmp_path)
    stamp_future(url)
    code = (
        "import sys\nfrom alembic.config import main\n"
        f"sys.exit(main(argv=['-c', {str(REPO / 'alembic.ini')!r}, *{words!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "DURABLE_SESSIONS_URL": url},
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    failed = [
        line for line in (done.stdout + done.stderr).decode().splitlines() if "INFO" not in line
    ]
    assert failed == ["FAILED: " + NEWER.split("error: ", 1)[1]]


# -- missing extras ------------------------------------------------------------------------

HIDE_RICH = "import sys; sys.modules['rich'] = None"
HIDE_ASYNCPG = "import sys; sys.modules['asyncpg'] = None"


@pytest.mark.sqlite
def test_demo_without_rich_names_the_extra(tmp_path: Path) -> None:
    done = run("--url", f"sqlite:///{tmp_path / 'demo.db'}", "demo", prelude=HIDE_RICH)
    assert done.returncode == 1
    assert one_error_line(done.stderr) == (
        f"{PROG}: error: tables and progress bars need the optional 'cli' extra: "
        "pip install 'durable-sessions[cli]'"
    )


def test_alembic_upgrade_without_asyncpg_names_the_extra(tmp_path: Path) -> None:
    code = (
        f"{HIDE_ASYNCPG}\nfrom alembic.config import main\n"
        f"sys.exit(main(argv=['-c', {str(REPO / 'alembic.ini')!r}, 'upgrade', 'head']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "DURABLE_SESSIONS_URL": "postgresql://nobody@127.0.0.1:1/none"},
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    output = (done.stdout + done.stderr).decode()
    assert output.strip().splitlines() == [
        "FAILED: the asyncpg driver is not installed: pip install 'durable-sessions[postgres]'"
    ]


@pytest.mark.parametrize(
    ("hidden", "argv", "line"),
    [
        ("asyncpg", ["--url", "postgresql://nobody@127.0.0.1:1/none", "list"],
         "the asyncpg driver is not installed: pip install 'durable-sessions[postgres]'"),
        ("aiosqlite", ["--url", "sqlite:///{tmp}/new.db", "migrate"],
         "the aiosqlite driver is not installed: pip install 'durable-sessions[sqlite]'"),
        ("google", ["--url", "sqlite:///{tmp}/x.db", "import-adk", "--from", "sqlite:///{tmp}/a.db"],
         'durable_sessions.adk needs Google ADK, which is not installed: '
         'pip install "durable-sessions[adk]"'),
    ],
    ids=["asyncpg", "aiosqlite", "google-adk"],
)  # fmt: skip
def test_a_command_without_its_extra_names_it_in_one_line(
    hidden: str, argv: list[str], line: str, tmp_path: Path
) -> None:
    prelude = f"import sys; sys.modules[{hidden!r}] = None"
    done = run(*(arg.format(tmp=tmp_path) for arg in argv), prelude=prelude)
    assert done.returncode == 1
    assert one_error_line(done.stderr) == f"{PROG}: error: {line}"
    assert not (tmp_path / "new.db").exists()


def test_the_openai_agents_adapter_without_its_sdk_names_the_extra() -> None:
    code = "import sys; sys.modules['agents'] = None\nimport durable_sessions.openai_agents"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 1
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: durable_sessions.openai_agents needs the OpenAI Agents SDK, which is not "
        'installed: pip install "durable-sessions[openai-agents]"'
    )


# -- delete-user --dry-run -----------------------------------------------------------------


@pytest.mark.sqlite
def test_delete_user_dry_run_counts_and_deletes_nothing(tmp_path: Path) -> None:
    url = seeded(tmp_path)

    async def add_state() -> None:
        engine = create_async_engine(url)
        try:
            await Manager(SQLStore(engine)).create("default", "ada", state={"user:lang": "en"})
        finally:
            await engine.dispose()

    asyncio.run(add_state())
    done = run("--url", url, "delete-user", "ada", "--dry-run")
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.decode() == (
        "Would delete 2 sessions (with their transcripts) and 1 user: state rows of "
        "user 'ada' in 'default'.\n"
    )
    listed = run("--url", url, "list")
    assert listed.stdout.decode().count("ada") == 2
