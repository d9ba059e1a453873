"""The ``durable-sessions`` command, driven as a user drives it: subprocesses and ``main(argv)``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url, update
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Filter, Manager, Memory, SessionNotFoundError, SQLStore
from durable_sessions.cli import main
from durable_sessions.sql import transfer
from durable_sessions.sql.migrate import head
from durable_sessions.sql.schema import sessions
from durable_sessions.sql.transfer import dumps
from support.memory import run_measured
from support.sql import raw_pg

PROG = "durable-sessions"
COMMANDS = [
    "demo", "migrate", "current", "check", "downgrade", "list", "show", "search", "fork",
    "delete", "purge", "delete-user", "export", "import", "serve",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_SESSIONS_URL", raising=False)


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty, unmigrated database of each dialect."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
    return make()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in-process; return its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run(
    *argv: str, cwd: Path | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m durable_sessions`` in a child process, as a shell would."""
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "durable_sessions", *argv],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env=env,
        timeout=300,
        check=False,
    )


def with_manager(url: str, work: Callable[[Manager], Awaitable[Any]]) -> Any:
    """Run ``work`` with a Manager on the database at ``url``, as an application would."""

    async def go() -> Any:
        engine = create_async_engine(url)
        try:
            return await work(Manager(SQLStore(engine), app_name="support"))
        finally:
            await engine.dispose()

    return asyncio.run(go())


def one_error_line(err: str) -> str:
    """Assert that stderr is one clean error line, and return it."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{PROG}: error: ")
    return lines[0]


def migrate(url: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--url", url, "migrate"]) == 0


# -- help ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: {PROG} {command}")


def test_the_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    assert all(f"    {command}" in out for command in COMMANDS)


# -- demo ----------------------------------------------------------------------------------


def _demo_sessions(stdout: str) -> list[str]:
    table = stdout.split('5. Sessions of app "demo"')[1]
    return [line for line in table.splitlines() if "Hi! I'm Ada" in line]


@pytest.mark.sqlite
def test_demo_runs_twice_on_the_default_sqlite_file(tmp_path: Path) -> None:
    first = run("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == b""
    out = first.stdout.decode()
    for heading in ("1. A new conversation", "2. Restart and resume", "3. Fork", "4. Transcript"):
        assert heading in out
    assert "Hi! I'm Ada and I'd like to plan a weekend in Lisbon." in out
    assert "temp:" not in out.split("2. Restart and resume")[1].split("3. Fork")[0].replace(
        "temp: keys never", ""
    )
    assert len(_demo_sessions(out)) == 2
    assert (tmp_path / "durable-sessions.db").exists()
    assert "\x1b[" not in out  # no colour codes in a pipe

    second = run("demo", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    out = second.stdout.decode()
    assert "Welcome back, Ada! Last time it was Lisbon." in out
    assert "booking #2" in out
    assert len(_demo_sessions(out)) == 4


@pytest.mark.postgres
def test_demo_runs_twice_on_postgres(
    fresh_pg_url: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_pg_url()
    code, out, err = cli(capsys, "--url", url, "demo")
    assert (code, err) == (0, "")
    assert len(_demo_sessions(out)) == 2
    code, out, err = cli(capsys, "demo", "--url", url)
    assert (code, err) == (0, "")
    assert len(_demo_sessions(out)) == 4
    assert "Welcome back" in out
    # The closing hint names this database, and runs as printed.
    hint = out.strip().splitlines()[-1]
    assert hint.startswith(f"Look closer: durable-sessions --url {url} show ")
    code, shown, err = cli(capsys, *shlex.split(hint.removeprefix("Look closer: "))[1:])
    assert (code, err) == (0, "")
    assert "Welcome back" in shown


@pytest.mark.sqlite
def test_the_demos_closing_hint_runs_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    code, out, _ = cli(capsys, "--url", url, "demo", "--org", "acme")
    assert code == 0
    hint = out.strip().splitlines()[-1]
    assert hint.startswith(f"Look closer: durable-sessions --url {url} show ")
    assert hint.endswith(" --org acme")
    code, shown, err = cli(capsys, *shlex.split(hint.removeprefix("Look closer: "))[1:])
    assert (code, err) == (0, "")
    assert "organisation  acme" in shown


# -- migrations ----------------------------------------------------------------------------


def test_migrate_current_check_downgrade(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--url", db_url, "check")
    assert code == 1
    assert out.strip().endswith(f"run `durable-sessions --url {db_url} migrate`.")
    if db_url.startswith("sqlite"):
        assert not Path(db_url.split("///", 1)[1]).exists(), "check must not create the file"
    assert cli(capsys, "--url", db_url, "current")[:2] == (0, f"none (head is {HEAD})\n")

    assert cli(capsys, "--url", db_url, "migrate")[:2] == (0, f"Migrated from base to {HEAD}.\n")
    again = cli(capsys, "migrate", "--url", db_url)[:2]
    assert again == (0, f"Already at head ({HEAD}); nothing to do.\n")
    assert cli(capsys, "--url", db_url, "check")[:2] == (0, f"The schema is at head ({HEAD}).\n")
    assert cli(capsys, "--url", db_url, "current")[:2] == (0, f"{HEAD} (head)\n")

    assert cli(capsys, "--url", db_url, "downgrade", "base")[:2] == (
        0,
        f"Downgraded from {HEAD} to base.\n",
    )
    assert cli(capsys, "--url", db_url, "check")[0] == 1
    code, _, err = cli(capsys, "--url", db_url, "list")
    assert code == 1
    assert f"run `durable-sessions --url {db_url} migrate`" in one_error_line(err)

    assert cli(capsys, "--url", db_url, "migrate", "--revision", "0001")[0] == 0
    assert cli(capsys, "--url", db_url, "check")[0] == 1  # behind head
    assert cli(capsys, "--url", db_url, "migrate")[:2] == (0, f"Migrated from 0001 to {HEAD}.\n")
    assert cli(capsys, "--url", db_url, "check")[0] == 0


def test_migrate_to_an_unknown_revision_is_one_clean_line(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "--url", db_url, "migrate", "--revision", "nope")
    assert code == 1
    assert "nope" in one_error_line(err)


@pytest.mark.sqlite
def test_the_url_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DURABLE_SESSIONS_URL", f"sqlite:///{tmp_path / 'env.db'}")
    assert cli(capsys, "migrate")[0] == 0
    assert (tmp_path / "env.db").exists()


# -- list, show, fork, delete --------------------------------------------------------------


async def _seed_conversations(manager: Manager) -> dict[str, str]:
    ada = await manager.create(
        "acme", "ada", state={"plan": "pro", "user:lang": "en", "app:motd": "hi", "temp:x": 1}
    )
    await manager.append_event(ada, Event(author="ada", content="My order is late", tokens=4))
    await manager.append_event(
        ada, Event(author="agent", content={"tool": "track"}, state_delta={"step": 2}, tokens=6)
    )
    await manager.append_event(ada, Event(author="agent", content="It ships today", tokens=3))
    await manager.touch(ada, messages=0, first_message="My order is late")
    bob = await manager.create("acme", "bob", state={"plan": "free"})
    await manager.create("other", "ada")
    return {"ada": ada.id, "bob": bob.id}


def test_list_show_fork_delete(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    migrate(db_url)
    ids = with_manager(db_url, _seed_conversations)

    code, out, err = cli(capsys, "--url", db_url, "list", "--org", "acme")
    assert (code, err) == (0, "")
    assert ids["ada"] in out
    assert ids["bob"] in out
    assert "My order is late" in out
    assert out.splitlines()[0].split() == [
        "id", "title", "user", "app", "updated", "(UTC)", "messages", "tokens",
    ]  # fmt: skip
    code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", "--user", "bob")
    assert ids["bob"] in out
    assert ids["ada"] not in out
    code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", "--limit", "1")
    assert ids["bob"] in out
    assert "--all (or --limit 0) shows every page" in out
    code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", "--app", "nope")
    assert out == "No sessions in organisation 'acme' match.\n"

    code, out, err = cli(
        capsys, "--url", db_url, "show", ids["ada"], "--org", "acme", "--events", "2"
    )
    assert (code, err) == (0, "")
    assert "title         My order is late" in out
    assert "messages      3" in out
    assert "tokens        13" in out
    state = out.split("State")[1].split("Last 2 of 3 events")[0]
    rows = [line.split() for line in state.splitlines()[3:] if line.strip()]
    assert rows == [
        ["private", "plan", '"pro"'],
        ["private", "step", "2"],
        ["user", "user:lang", '"en"'],
        ["app", "app:motd", '"hi"'],
    ]
    events = out.split("Last 2 of 3 events")[1]
    assert '{"tool":"track"}' in events
    assert '{"step":2}' in events
    assert "It ships today" in events
    assert "My order is late" not in events

    code, out, err = cli(
        capsys, "--url", db_url, "fork", ids["ada"], "--org", "acme", "--with-events"
    )
    assert (code, err) == (0, "")
    child_id = out.split(" into ")[1].split()[0]
    assert out.endswith("with its 3 events.\n")
    child = with_manager(db_url, lambda m: m.get("acme", child_id))
    assert child.parent_id == ids["ada"]
    assert child.state["forked_from"] == ids["ada"]
    copied = with_manager(db_url, lambda m: m.store.list_events("acme", child_id))
    assert [e.content for e in copied][-1] == "It ships today"

    code, out, _ = cli(capsys, "--url", db_url, "delete", ids["ada"], "--org", "acme")
    assert code == 0
    assert ids["ada"] in out
    with pytest.raises(SessionNotFoundError):
        with_manager(db_url, lambda m: m.get("acme", ids["ada"]))
    code, _, err = cli(capsys, "--url", db_url, "show", ids["ada"], "--org", "acme")
    assert code == 1
    assert one_error_line(err) == (
        f"{PROG}: error: session {ids['ada']!r} not found in organisation 'acme'"
    )


def _hinted(out: str) -> list[str]:
    """The arguments of the command a hint names (between backticks), without the program."""
    command = out.split("`")[1]
    words = shlex.split(command)
    assert words[0] == PROG
    return words[1:]


async def _many_sessions(manager: Manager) -> list[str]:
    made = []
    for n in range(5):
        session = await manager.create("acme", "ada" if n % 2 else "bob", id=f"s{n}")
        await manager.append_event(session, Event(author="ada", content=f"message {n}"))
        made.append(session.id)
    return made[::-1]  # newest first


def test_list_pages_by_cursor_and_streams_every_page(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)
    newest_first = with_manager(db_url, _many_sessions)

    def ids(out: str) -> list[str]:
        return [line.split()[0] for line in out.splitlines() if line.split()[:1] != ["id"]
                and line.startswith("s")]  # fmt: skip

    code, out, err = cli(capsys, "--url", db_url, "list", "--org", "acme", "--limit", "2")
    assert (code, err) == (0, "")
    assert ids(out) == newest_first[:2]
    walked = ids(out)
    while "The next" in out:
        hinted = _hinted(out)
        assert hinted[:5] == ["--url", db_url, "list", "--org", "acme"]
        code, out, err = cli(capsys, *hinted)
        assert (code, err) == (0, "")
        walked += ids(out)
    assert walked == newest_first

    for every in (["--all", "--limit", "2"], ["--limit", "0"]):
        code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", *every)
        assert code == 0
        assert ids(out) == newest_first
        assert out.count("messages") == 1  # one header, pages streamed below it
        assert "The next" not in out
    code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", "--user", "ada", "--all")
    assert ids(out) == [i for i in newest_first if i in ("s1", "s3")]

    code, out, _ = cli(capsys, "--url", db_url, "list", "--org", "acme", "--limit", "1")
    cursor = _hinted(out)[_hinted(out).index("--cursor") + 1]
    code, _, err = cli(capsys, "--url", db_url, "list", "--org", "acme", "--cursor", cursor + "x")
    assert code == 1
    assert "cursor is not one this store made" in one_error_line(err)
    code, _, err = cli(
        capsys, "--url", db_url, "list", "--org", "acme", "--user", "ada", "--cursor", cursor
    )
    assert code == 1
    assert "another listing" in one_error_line(err)


def test_show_reads_a_transcript_forward_after_a_seq(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)
    ids = with_manager(db_url, _seed_conversations)
    code, out, err = cli(
        capsys, "--url", db_url, "show", ids["ada"], "--org", "acme", "--after-seq", "1",
        "--events", "1",
    )  # fmt: skip
    assert (code, err) == (0, "")
    events = out.split("1 events after #1 (of 3)")[1]
    assert '{"tool":"track"}' in events
    assert "It ships today" not in events
    assert _hinted(events)[-2:] == ["--after-seq", "2"]
    code, out, _ = cli(capsys, *_hinted(events))
    assert "It ships today" in out.split("after #2")[1]
    assert "The next events" not in out


async def _searchable(manager: Manager) -> dict[str, str]:
    ada = await manager.create("acme", "ada")
    bob = await manager.create("acme", "bob")
    await manager.append_event(
        ada, Event(author="ada", content={"parts": [{"text": "Where is my parcel? " * 8}]})
    )
    await manager.append_event(ada, Event(author="agent", content="Your parcel ships today"))
    await manager.append_event(bob, Event(author="bob", content="A parcel, a parcel!"))
    return {"ada": ada.id, "bob": bob.id}


def test_search_prints_session_seq_author_and_a_snippet(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)
    ids = with_manager(db_url, _searchable)
    code, out, err = cli(capsys, "--url", db_url, "search", "PARCEL", "--org", "acme")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["session", "#", "author", "text"]
    rows = [line.split(maxsplit=3) for line in lines[2:]]
    # Eight mentions, then two (bob's, newer), then one.
    assert [row[:3] for row in rows] == [
        [ids["ada"], "1", "ada"], [ids["bob"], "1", "bob"], [ids["ada"], "2", "agent"],
    ]  # fmt: skip
    assert rows[0][3].startswith("Where is my parcel? Where is my parcel?")
    assert rows[0][3].endswith("…")  # a snippet, not the whole text
    assert rows[2][3] == "Your parcel ships today"

    code, out, _ = cli(
        capsys, "--url", db_url, "search", "parcel", "today", "--org", "acme", "--user", "ada"
    )
    assert [line.split()[:2] for line in out.splitlines()[2:]] == [[ids["ada"], "2"]]
    code, out, _ = cli(capsys, "--url", db_url, "search", "parcel", "--org", "acme", "--limit", "1")
    assert len(out.splitlines()[2:]) == 1
    code, out, _ = cli(capsys, "--url", db_url, "search", '"parcel', "OR", "nope", "--org", "acme")
    assert out == "No events in organisation 'acme' hold every word of '\"parcel OR nope'.\n"
    code, _, err = cli(capsys, "--url", db_url, "search", "?!", "--org", "acme")
    assert code == 1
    assert "no word to search for" in one_error_line(err)


# -- retention -----------------------------------------------------------------------------


def _age(url: str, session_ids: list[str], days: int) -> None:
    async def go() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                stamp = datetime.now(timezone.utc) - timedelta(days=days)
                await conn.execute(
                    update(sessions).where(sessions.c.id.in_(session_ids)).values(updated_at=stamp)
                )
        finally:
            await engine.dispose()

    asyncio.run(go())


def test_purge_dry_run_then_real(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    migrate(db_url)

    async def seed(manager: Manager) -> list[str]:
        return [(await manager.create(org, "ada")).id for org in ("acme", "acme", "acme", "other")]

    old_one, old_two, fresh, other = with_manager(db_url, seed)
    _age(db_url, [old_one, old_two, other], days=45)

    code, out, err = cli(
        capsys, "--url", db_url, "purge", "--org", "acme", "--older-than", "30d", "--dry-run"
    )
    assert (code, err) == (0, "")
    assert out == "Would delete 2 sessions of organisation 'acme' not updated in 30d.\n"
    assert len(with_manager(db_url, lambda m: m.list(Filter("acme")))) == 3

    code, out, err = cli(
        capsys, "--url", db_url, "purge", "--org", "acme", "--older-than", "4w", "--yes"
    )
    assert (code, err) == (0, "")
    assert out == "Deleted 2 sessions of organisation 'acme' not updated in 4w.\n"
    assert [s.id for s in with_manager(db_url, lambda m: m.list(Filter("acme")))] == [fresh]
    assert [s.id for s in with_manager(db_url, lambda m: m.list(Filter("other")))] == [other]

    code, out, _ = cli(capsys, "--url", db_url, "purge", "--org", "acme", "--older-than", "90s")
    assert out.startswith("Deleted 0 sessions")


@pytest.mark.parametrize("age", ["30", "30x", "d", "-1d", "1.5h", ""])
def test_purge_refuses_a_bad_duration(age: str, tmp_path: Path) -> None:
    done = run("--url", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "purge", f"--older-than={age}")
    assert done.returncode == 2
    line = one_error_line(done.stderr.decode())
    assert f"invalid duration {age!r}" in line


@pytest.mark.parametrize("age", ["999999d", "99999999d", "200000w"])
def test_purge_refuses_a_period_reaching_before_the_year_one(
    age: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys, "--url", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "purge", f"--older-than={age}"
    )
    assert (code, out) == (2, "")
    line = one_error_line(err)
    assert f"duration {age!r} is too long: older_than reaches back before the year 1" in line
    assert not (tmp_path / "x.db").exists()  # refused before the database was opened


@pytest.mark.sqlite
def test_purge_of_999999_days_is_one_line_in_a_child_process(tmp_path: Path) -> None:
    done = run("--url", f"sqlite:///{tmp_path / 'x.db'}", "purge", "--older-than", "999999d")
    assert done.returncode == 2
    assert "is too long" in one_error_line(done.stderr.decode())


def test_delete_user(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    migrate(db_url)

    async def seed(manager: Manager) -> None:
        for _ in range(3):
            await manager.create("acme", "ada", state={"user:lang": "en"})
        await manager.create("acme", "bob", state={"user:lang": "fr"})

    with_manager(db_url, seed)
    code, out, err = cli(capsys, "--url", db_url, "delete-user", "ada", "--org", "acme", "-y")
    assert (code, err) == (0, "")
    assert out == "Deleted 3 sessions and the user: state of user 'ada' in 'acme'.\n"
    left = with_manager(db_url, lambda m: m.list(Filter("acme")))
    assert [s.user_id for s in left] == ["bob"]
    again = with_manager(db_url, lambda m: m.create("acme", "ada"))
    assert "user:lang" not in again.state


def test_delete_user_counts_and_erases_memories(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)

    async def seed(manager: Manager) -> None:
        await manager.create("acme", "ada")
        for app in ("support", "sales"):
            await manager.store.add_memories("acme", app, "ada", [Memory(f"ada uses {app}")])
        await manager.store.add_memories("acme", "support", "bob", [Memory("bob uses support")])

    with_manager(db_url, seed)
    code, out, _ = cli(capsys, "--url", db_url, "delete-user", "ada", "--org", "acme", "--dry-run")
    assert (code, out) == (
        0,
        "Would delete 1 sessions (with their transcripts), 2 memories and 0 user: state rows "
        "of user 'ada' in 'acme'.\n",
    )
    code, out, err = cli(capsys, "--url", db_url, "delete-user", "ada", "--org", "acme", "-y")
    assert (code, err) == (0, "")
    assert out == "Deleted 1 sessions, 2 memories and the user: state of user 'ada' in 'acme'.\n"

    async def uses(manager: Manager) -> list[str]:
        found = []
        for app in ("support", "sales"):
            for user in ("ada", "bob"):
                found += [
                    m.text for m in await manager.store.search_memories("acme", app, user, "uses")
                ]
        return found

    assert with_manager(db_url, uses) == ["bob uses support"]


# -- export and import ---------------------------------------------------------------------


async def _seed_everything(manager: Manager) -> None:
    """Sessions across organisations whose ids sort differently by byte and by locale."""
    store = manager.store
    value = {
        "n": 1, "f": 0.5, "neg": -2.25, "big": 2**70, "null": None, "t": True,
        "nested": {"z": [1, None, False, {"é": "ü"}], "a": {}, "": []},
        "text": "line\nbreak \u2028 tab\t quote\" 😀 \\ ",
    }  # fmt: skip
    for org in ("acme", "Zeta", "émile", "a-b", "ab", "A", "a_b"):
        for app in ("support", ""):
            apps = Manager(store, app_name=app)
            first = await apps.create(
                org, "Ada 😀", state={**value, "user:name": "Ada", "app:cfg": {"k": [1, 2]}}
            )
            await apps.append_event(first, Event(author="Ada 😀", content="Hello ☕", tokens=2))
            await apps.append_event(
                first,
                Event(
                    author="agent",
                    content={"tool": "search", "args": [1, 2.5, None]},
                    invocation_id="inv-1",
                    state_delta={"step": 1, "user:seen": True, "temp:scratch": 1},
                    tokens=7,
                ),
            )
            await apps.append_event(first, Event(author="agent", content=None))
            await apps.touch(first, messages=0, tokens=5, first_message="Hello ☕ there")
            await apps.fork(org, first.id, with_events=True)
            await apps.fork(org, first.id)
            await apps.create(org, "bob", id="Session-B" if app else "session-B", state={"x": "Ω"})
            await apps.create(org, "bob", id=f"session_b-{app or 'none'}")


def _export(url: str, path: Path) -> bytes:
    assert main(["--url", url, "export", "--output", str(path)]) == 0
    return path.read_bytes()


def _import(url: str, path: Path) -> None:
    migrate(url)
    assert main(["--url", url, "import", "--input", str(path)]) == 0


def _assert_canonical(data: bytes) -> list[dict[str, Any]]:
    lines = data.decode("utf-8").split("\n")
    assert lines.pop() == ""
    records = [json.loads(line) for line in lines]
    assert [dumps(record) for record in records] == lines
    assert records[0] == {"format": "durable-sessions", "type": "header", "version": 1}
    return records


@pytest.mark.sqlite
@pytest.mark.postgres
def test_sqlite_export_imports_into_postgres_and_exports_the_same_bytes(
    tmp_path: Path, fresh_pg_url: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_url = f"sqlite+aiosqlite:///{tmp_path / 'source.db'}"
    migrate(sqlite_url)
    with_manager(sqlite_url, _seed_everything)
    original = _export(sqlite_url, tmp_path / "sqlite.jsonl")
    records = _assert_canonical(original)
    kinds = [record["type"] for record in records]
    assert kinds.count("session") == 7 * 2 * 5
    assert kinds.count("event") == 7 * 2 * 6
    assert kinds.count("user_state") == 7 * 2 * 2
    assert kinds.count("app_state") == 7 * 2

    pg_url = fresh_pg_url()
    _import(pg_url, tmp_path / "sqlite.jsonl")
    assert _export(pg_url, tmp_path / "postgres.jsonl") == original

    # The imported sessions are live: state reads back and the transcript carries on.
    session_id = next(r["id"] for r in records if r["type"] == "session" and r["event_seq"] == 3)
    org_id = next(r["org_id"] for r in records if r.get("id") == session_id)

    async def carry_on(manager: Manager) -> int:
        session = await manager.get(org_id, session_id)
        assert session.state["nested"]["z"][3] == {"é": "ü"}
        return (await manager.append_event(session, Event(author="agent"))).seq

    assert with_manager(pg_url, carry_on) == 4
    capsys.readouterr()


@pytest.mark.sqlite
@pytest.mark.postgres
def test_postgres_export_imports_into_sqlite_and_exports_the_same_bytes(
    tmp_path: Path, fresh_pg_url: Callable[[], str]
) -> None:
    pg_url = fresh_pg_url()
    migrate(pg_url)
    with_manager(pg_url, _seed_everything)
    original = _export(pg_url, tmp_path / "postgres.jsonl")
    _assert_canonical(original)

    sqlite_url = f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}"
    _import(sqlite_url, tmp_path / "postgres.jsonl")
    assert _export(sqlite_url, tmp_path / "sqlite.jsonl") == original
    again = fresh_pg_url()
    _import(again, tmp_path / "sqlite.jsonl")
    assert _export(again, tmp_path / "again.jsonl") == original


def test_tiny_pages_chunks_and_batches_give_the_same_bytes(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(db_url)
    with_manager(db_url, _seed_everything)
    expected = _export(db_url, tmp_path / "default.jsonl")
    # Pages of 3 rows, 2 events per query (so each 3-event transcript is read in ranges),
    # inserts of 2 rows: every boundary of the keyset, the chunks and the batches is crossed.
    monkeypatch.setattr(transfer, "PAGE_SIZE", 3)
    monkeypatch.setattr(transfer, "EVENT_CHUNK", 2)
    monkeypatch.setattr(transfer, "BATCH_SIZE", 2)
    assert _export(db_url, tmp_path / "tiny.jsonl") == expected
    copy = f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}"
    _import(copy, tmp_path / "tiny.jsonl")
    assert _export(copy, tmp_path / "copy.jsonl") == expected


@pytest.mark.sqlite
def test_export_to_stdout_and_import_from_stdin(tmp_path: Path) -> None:
    source = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
    target = f"sqlite+aiosqlite:///{tmp_path / 'b.db'}"
    migrate(source)
    migrate(target)
    with_manager(source, _seed_conversations)
    exported = run("--url", source, "export")
    assert exported.returncode == 0
    assert exported.stderr.decode() == (
        "Exported 3 sessions, 3 events, 1 user: and 1 app: state rows.\n"
    )
    _assert_canonical(exported.stdout)
    imported = run("--url", target, "import", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == b"Imported 3 sessions, 3 events, 1 user: and 1 app: state rows.\n"
    assert run("--url", target, "export").stdout == exported.stdout


def _session(session_id: str, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "session", "org_id": "acme", "id": session_id, "user_id": "ada",
        "app_name": "support", "title": "", "state": {"k": 1}, "parent_id": None,
        "created_at": "2025-01-02T03:04:05.000006Z", "updated_at": "2025-01-02T03:04:05.000006Z",
        "message_count": 1, "token_total": 2, "event_seq": 1, "version": 2,
    }  # fmt: skip
    record.update(changes)
    return record


def _event(session_id: str, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "event", "org_id": "acme", "session_id": session_id, "seq": 1,
        "id": f"e-{session_id}", "author": "ada", "invocation_id": "", "content": "hi",
        "state_delta": {}, "tokens": 2, "timestamp": "2025-01-02T03:04:05Z",
    }  # fmt: skip
    record.update(changes)
    return record


HEAD = head()
"""The newest revision (``tests/sql/test_migrations.py`` names it)."""
HEADER = dumps({"format": "durable-sessions", "type": "header", "version": 1})


def _bad(record: dict[str, Any], **changes: Any) -> str:
    return dumps({**record, **changes})


S3, E2 = _session("s3"), _event("s2")
MALFORMED = [
    pytest.param("{not json", "not valid JSON", id="bad-json"),
    pytest.param('["a list"]', "expected a JSON object", id="not-an-object"),
    pytest.param(_bad(S3, type="sesion"), "unknown record type 'sesion'", id="unknown-type"),
    pytest.param(dumps({k: v for k, v in S3.items() if k != "version"}),
                 "missing the field 'version'", id="missing-field"),
    pytest.param(_bad(S3, colour="red"), "unknown field 'colour'", id="unknown-field"),
    pytest.param(_bad(S3, state={"k": "\u0000"}), "NUL", id="nul-in-state"),
    pytest.param(_bad(S3, state={"k": float("nan")}), "not a JSON number", id="nan"),
    pytest.param(_bad(S3, state={"temp:k": 1}), "temp:", id="temp-key"),
    pytest.param(_bad(S3, state={"user:k": 1}), "not private", id="shared-key"),
    pytest.param(_bad(S3, created_at="yesterday"), "not an ISO-8601", id="bad-time"),
    pytest.param(_bad(S3, created_at="2025-01-02T03:04:05"), "no time zone", id="naive-time"),
    pytest.param(_bad(S3, version=-1), "non-negative", id="negative-count"),
    pytest.param(_bad(S3, version=0), "'version': must be at least 1", id="version-zero"),
    pytest.param(_bad(S3, token_total=2**63), "non-negative 64-bit", id="count-past-64-bits"),
    pytest.param(_bad(S3, version=True), "non-negative 64-bit", id="bool-version"),
    pytest.param(_bad(S3, version=2.0), "non-negative 64-bit", id="float-version"),
    pytest.param(_bad(S3, event_seq=2), "event_seq': 2 is above its message_count 1",
                 id="event-seq-above-messages"),
    pytest.param(_bad(S3, id=""), "must not be empty", id="empty-id"),
    pytest.param(dumps(_event("s1")), "does not follow that session", id="stray-event"),
    pytest.param(_bad(E2, seq=2), "at most the session's event_seq 1", id="seq-too-high"),
    pytest.param(dumps(E2).replace('"hi"', '"\\udc80"'), "surrogate", id="lone-surrogate"),
    pytest.param(_bad(E2, state_delta={"temp:k": 1}), "never stored", id="temp-delta"),
    pytest.param(dumps(_session("s1")), "already exists on line 2",
                 id="duplicate"),
    pytest.param(HEADER, "a header may only be the first line", id="second-header"),
    pytest.param("", "empty line", id="empty-line"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "problem"), MALFORMED)
def test_import_refuses_a_malformed_line_and_writes_nothing(
    line: str, problem: str, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)
    lines = [HEADER, dumps(_session("s1")), dumps(_event("s1")), dumps(_session("s2")), line]
    source = tmp_path / "broken.jsonl"
    source.write_text("\n".join([*lines, dumps(_event("s2"))]) + "\n", encoding="utf-8")
    capsys.readouterr()
    code, out, err = cli(capsys, "--url", db_url, "import", "--input", str(source))
    assert (code, out) == (1, "")
    error = one_error_line(err)
    assert error.startswith(f"{PROG}: error: line 5: ")
    assert problem in error
    assert error.endswith("nothing was imported")
    assert _export(db_url, tmp_path / "after.jsonl") == (HEADER + "\n").encode()


def test_import_refuses_a_file_without_header_and_ids_already_stored(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate(db_url)
    headless = tmp_path / "headless.jsonl"
    headless.write_text(dumps(_session("s1")) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "--url", db_url, "import", "-i", str(headless))
    assert code == 1
    assert "line 1: not a durable-sessions export" in one_error_line(err)

    good = tmp_path / "good.jsonl"
    good.write_text(f"{HEADER}\n{dumps(_session('s1'))}\n{dumps(_event('s1'))}\n", encoding="utf-8")
    assert cli(capsys, "--url", db_url, "import", "-i", str(good))[0] == 0
    before = _export(db_url, tmp_path / "before.jsonl")
    code, _, err = cli(capsys, "--url", db_url, "import", "-i", str(good))
    assert code == 1
    clash = "line 2: session 's1' of organisation 'acme' already exists (in the database, or"
    assert clash in one_error_line(err)
    assert _export(db_url, tmp_path / "after.jsonl") == before

    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    code, _, err = cli(capsys, "--url", db_url, "import", "-i", str(empty))
    assert code == 1
    assert "the input is empty" in one_error_line(err)


# -- errors a user makes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "::not a url s3cret", "list"], "the database URL is not valid"),
        (["--url", "mssql://ada:s3cret@db/x", "list"], "unsupported database URL scheme 'mssql'"),
        (["--url", "postgresql://ada:s3cret@127.0.0.1:1/x", "list"], "cannot use the database at "
         "postgresql+asyncpg://ada:***@127.0.0.1:1/x (ConnectionRefusedError"),
        (["--url", "postgresql://ada:s3cret@127.0.0.1:1/x", "migrate"], "ConnectionRefusedError"),
    ],
)  # fmt: skip
def test_url_and_connection_errors_are_one_line_without_the_password(
    argv: list[str], message: str
) -> None:
    done = run(*argv)
    assert done.returncode == 1
    line = one_error_line(done.stderr.decode())
    assert message in line
    assert "s3cret" not in line
    assert done.stdout == b""


def _with_query(url: str, **params: str) -> str:
    return make_url(url).update_query_dict(params).render_as_string(hide_password=False)


@pytest.mark.postgres
def test_libpq_sslmode_works_in_a_postgres_url(
    fresh_pg_url: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """asyncpg takes ssl=, not libpq's sslmode=: the URL handling translates it, for the
    command and for SQLStore.from_url alike."""
    url = fresh_pg_url()
    plain = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    code, _, err = cli(capsys, "--url", _with_query(plain, sslmode="disable"), "migrate")
    assert (code, err) == (0, "")
    code, _, err = cli(capsys, "--url", _with_query(url, sslmode="prefer"), "check")
    assert (code, err) == (0, "")

    async def listed() -> list[Any]:
        store = SQLStore.from_url(_with_query(url, sslmode="disable"))
        try:
            return await store.list(Filter("acme"))
        finally:
            await store.close()

    assert asyncio.run(listed()) == []


@pytest.mark.postgres
def test_sslmode_require_without_tls_on_the_server_is_one_line(
    fresh_pg_url: Callable[[], str],
) -> None:
    url = fresh_pg_url()

    async def tls_on() -> bool:
        async with raw_pg(url) as conn:
            return bool(await conn.fetchval("SHOW ssl") == "on")

    if asyncio.run(tls_on()):
        pytest.skip("this Postgres server offers TLS")
    done = run("--url", _with_query(url, sslmode="require"), "current")
    assert done.returncode == 1
    line = one_error_line(done.stderr.decode())
    assert "cannot use the database at" in line
    assert "SSL" in line


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"sslmode": "bogus"}, "the URL's TLS mode (ssl or sslmode) must be one of disable"),
        ({"ssl": "yes"}, "the URL's TLS mode (ssl or sslmode) must be one of disable"),
        ({"sslmode": "require", "ssl": "disable"}, "gives both ssl and sslmode"),
        ({"sslrootcert": "/etc/root.crt"}, "set the environment variable PGSSLROOTCERT"),
    ],
)
def test_bad_tls_parameters_in_a_postgres_url_are_one_line(
    query: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _with_query("postgresql://ada:s3cret@127.0.0.1:1/x", **query)
    code, out, err = cli(capsys, "--url", url, "current")
    assert (code, out) == (1, "")
    line = one_error_line(err)
    assert message in line
    assert "s3cret" not in line


@pytest.mark.sqlite
def test_a_missing_sqlite_file_is_not_created_by_reading_commands(tmp_path: Path) -> None:
    done = run("list", cwd=tmp_path)
    assert done.returncode == 1
    assert "there is no database file 'durable-sessions.db'" in one_error_line(done.stderr.decode())
    assert not (tmp_path / "durable-sessions.db").exists()


@pytest.mark.postgres
def test_an_unmigrated_postgres_database_is_one_line(
    fresh_pg_url: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_pg_url()
    code, _, err = cli(capsys, "--url", url, "show", "x")
    assert code == 1
    assert one_error_line(err) == (
        f"{PROG}: error: the database schema is at no revision, this version needs {HEAD}; "
        f"run `{PROG} --url {url} migrate`"
    )


@pytest.mark.sqlite
def test_an_unknown_id_in_a_child_process_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    migrate(url)
    for argv in (["show", "nope"], ["fork", "nope"], ["delete", "nope"]):
        done = run("--url", url, *argv)
        assert done.returncode == 1
        assert one_error_line(done.stderr.decode()) == (
            f"{PROG}: error: session 'nope' not found in organisation 'default'"
        )


@pytest.mark.sqlite
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "list", "--limit", "many")
    assert code == 2
    assert "expected a whole number" in err
    assert cli(capsys)[0] == 2
    assert cli(capsys, "--version")[0] == 0


@pytest.mark.sqlite
def test_a_missing_rich_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    migrate(url)
    for name in [n for n in sys.modules if n == "rich" or n.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "durable_sessions.cli.demo", raising=False)
    monkeypatch.delitem(sys.modules, "durable_sessions.cli.render", raising=False)
    monkeypatch.setitem(sys.modules, "rich", None)  # makes `import rich` fail
    code, _, err = cli(capsys, "--url", url, "list")
    assert code == 1
    assert "pip install 'durable-sessions[cli]'" in one_error_line(err)
    assert cli(capsys, "--url", url, "check")[0] == 0  # migrations need no rich


# -- a terminal, and a large database ------------------------------------------------------


@pytest.mark.sqlite
def test_progress_bars_on_a_terminal_leave_clean_output(tmp_path: Path) -> None:
    import pty

    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    migrate(url)
    with_manager(url, _seed_conversations)
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "durable_sessions", "--url", url, "export", "-o", "out.jsonl"],
            cwd=tmp_path, stdout=follower, stderr=follower, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(follower)
        screen = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed its end
            while chunk := os.read(leader, 65536):
                screen += chunk
        os.close(leader)
    assert done.returncode == 0, screen
    assert b"Traceback" not in screen
    assert b"Exported 3 sessions" in screen
    _assert_canonical((tmp_path / "out.jsonl").read_bytes())


def _write_big_export(path: Path, count: int) -> None:
    stamp = "2025-01-02T03:04:05.123456Z"
    with path.open("w", encoding="utf-8") as out:
        out.write(HEADER + "\n")
        for i in range(count):
            sid = f"s{i:07d}"
            events = 1 if i % 10 == 0 else 0
            out.write(dumps(_session(sid, org_id="bulk", user_id=f"u{i % 100:02d}", state={"i": i},
                                     created_at=stamp, updated_at=stamp, event_seq=events,
                                     message_count=events)) + "\n")  # fmt: skip
            if events:
                out.write(dumps(_event(sid, org_id="bulk", timestamp=stamp)) + "\n")
        for user in range(100):
            row = {"type": "user_state", "org_id": "bulk", "app_name": "support", "key": "lang",
                   "user_id": f"u{user:02d}", "value": "en", "updated_at": stamp}  # fmt: skip
            out.write(dumps(row) + "\n")


MEASURE = """
import sys
from durable_sessions.cli import main
from support.memory import peak_kib, restart_peak

assert main(sys.argv[1:3] + ["check"]) == 0  # load every module and open the database once
before = restart_peak()
code = main(sys.argv[1:])
print(code, (peak_kib() - before) // 1024)
"""


def _peak_growth_mib(*argv: str) -> int:
    code, growth = run_measured(MEASURE, *argv).splitlines()[-1].split()
    assert code == "0"
    return int(growth)


@pytest.mark.slow
@pytest.mark.sqlite
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_memory_stays_flat_exporting_and_importing_100_000_sessions(tmp_path: Path) -> None:
    growth: dict[int, tuple[int, int]] = {}
    for count in (10_000, 100_000):
        source, copy = tmp_path / f"{count}.jsonl", tmp_path / f"{count}-again.jsonl"
        _write_big_export(source, count)
        url = f"sqlite+aiosqlite:///{tmp_path / f'{count}.db'}"
        migrate(url)
        imported = _peak_growth_mib("--url", url, "import", "-i", str(source))
        exported = _peak_growth_mib("--url", url, "export", "-o", str(copy))
        assert copy.read_bytes() == source.read_bytes()
        growth[count] = (imported, exported)
    small, large = growth[10_000], growth[100_000]
    # Ten times the sessions, the same memory: a few MiB of noise, nowhere near 10x.
    print(growth)
    assert large[0] <= small[0] + 8, growth
    assert large[1] <= small[1] + 8, growth
    assert max(large) < 64, growth


# -- restoring, hints, confirmations -------------------------------------------------------


@pytest.mark.sqlite
def test_the_readme_restore_into_a_new_database_just_works(tmp_path: Path) -> None:
    """`durable-sessions --url sqlite:///copy.db import -i backup.jsonl`, as the README says."""
    assert run("migrate", cwd=tmp_path).returncode == 0
    with_manager(f"sqlite+aiosqlite:///{tmp_path / 'durable-sessions.db'}", _seed_conversations)
    assert run("export", "-o", "backup.jsonl", cwd=tmp_path).returncode == 0
    done = run("--url", "sqlite:///copy.db", "import", "-i", "backup.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert lines[0].startswith("Migrated the empty database to ")
    assert lines[1] == "Imported 3 sessions, 3 events, 1 user: and 1 app: state rows."
    again = run("--url", "sqlite:///copy.db", "export", cwd=tmp_path)
    assert again.stdout == (tmp_path / "backup.jsonl").read_bytes()


def test_import_into_an_unmigrated_database_migrates_it(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "one.jsonl"
    source.write_text(f"{HEADER}\n{dumps(_session('s1'))}\n{dumps(_event('s1'))}\n")
    code, out, err = cli(capsys, "--url", db_url, "import", "-i", str(source))
    assert (code, err) == (0, "")
    assert out.endswith("Imported 1 sessions, 1 events, 0 user: and 0 app: state rows.\n")
    assert cli(capsys, "--url", db_url, "check")[0] == 0


@pytest.mark.sqlite
def test_a_failed_restore_into_a_new_sqlite_file_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(f"{HEADER}\n{{not json\n")
    target = tmp_path / "new.db"
    code, _, err = cli(capsys, "--url", f"sqlite:///{target}", "import", "-i", str(broken))
    assert code == 1
    assert "line 2: not valid JSON" in one_error_line(err)
    assert list(tmp_path.iterdir()) == [broken]


def test_import_into_an_outdated_database_hints_with_the_url(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from durable_sessions.sql import migrate as migrations

    first = "0001"
    if migrations.head() == first:
        pytest.skip("one revision only: no database can be behind")
    assert cli(capsys, "--url", db_url, "migrate", "--revision", first)[0] == 0
    source = tmp_path / "header.jsonl"
    source.write_text(f"{HEADER}\n")
    code, _, err = cli(capsys, "--url", db_url, "import", "-i", str(source))
    assert code == 1
    assert one_error_line(err).endswith(f"; run `durable-sessions --url {db_url} migrate`")


@pytest.mark.sqlite
def test_every_hint_carries_the_url_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    for argv in (["list"], ["export"], ["show", "x"]):
        code, _, err = cli(capsys, "--url", url, *argv)
        assert code == 1
        line = one_error_line(err)
        assert f"create it with `durable-sessions --url {url} migrate`" in line
        assert f"(or try `durable-sessions --url {url} demo`)" in line
    code, out, _ = cli(capsys, "check", "--url", url)
    assert code == 1
    assert out.strip().endswith(f"run `durable-sessions --url {url} migrate`.")
    assert not (tmp_path / "missing.db").exists()
    # Without --url, the hint needs none: the default file or $DURABLE_SESSIONS_URL.
    done = run("list", cwd=tmp_path)
    assert "create it with `durable-sessions migrate`" in one_error_line(done.stderr.decode())


@pytest.mark.postgres
def test_a_hint_masks_the_password_of_the_url_given(
    fresh_pg_url: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    from sqlalchemy import make_url

    url = make_url(fresh_pg_url()).set(password="s3cret")
    given = url.render_as_string(hide_password=False)
    code, _, err = cli(capsys, "--url", given, "list")
    assert code == 1
    line = one_error_line(err)
    masked = url.render_as_string(hide_password=True)
    assert f"run `durable-sessions --url '{masked}' migrate`" in line
    assert "s3cret" not in line


def _aged_sessions(url: str) -> None:
    migrate(url)

    async def seed(manager: Manager) -> list[str]:
        return [(await manager.create("acme", "ada", state={"user:k": 1})).id for _ in range(2)]

    _age(url, with_manager(url, seed), days=45)


DESTRUCTIVE = [
    pytest.param(
        ["purge", "--org", "acme", "--older-than", "30d"],
        "purge would delete 2 sessions of organisation 'acme' not updated in 30d",
        id="purge",
    ),
    pytest.param(
        ["delete-user", "ada", "--org", "acme"],
        "delete-user would delete 2 sessions (with their transcripts) and 1 user: state rows "
        "of user 'ada' in 'acme'",
        id="delete-user",
    ),
]


@pytest.mark.sqlite
@pytest.mark.parametrize(("argv", "refusal"), DESTRUCTIVE)
def test_destructive_commands_without_a_terminal_need_yes(
    argv: list[str], refusal: str, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    _aged_sessions(url)
    done = run("--url", url, *argv, stdin=b"y\n")  # a pipe is not a terminal: no answer read
    assert done.returncode == 1
    assert one_error_line(done.stderr.decode()) == (
        f"{PROG}: error: {refusal}; confirm with --yes (there is no terminal to ask on)"
    )
    assert done.stdout == b""
    assert len(with_manager(url, lambda m: m.list(Filter("acme")))) == 2
    done = run("--url", url, *argv, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("Deleted 2 sessions")
    assert with_manager(url, lambda m: m.list(Filter("acme"))) == []


def _on_a_terminal(argv: list[str], answer: bytes) -> tuple[int, bytes]:
    """Run the command with a terminal as stdin, stdout and stderr; type ``answer``."""
    import pty

    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "durable_sessions", *argv],
            stdin=follower, stdout=follower, stderr=follower,
        )  # fmt: skip
        os.write(leader, answer)
        code = child.wait(timeout=120)
    finally:
        os.close(follower)
        screen = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed its end
            while chunk := os.read(leader, 65536):
                screen += chunk
        os.close(leader)
    return code, screen


@pytest.mark.sqlite
@pytest.mark.parametrize(("argv", "refusal"), DESTRUCTIVE)
def test_destructive_commands_ask_on_a_terminal(
    argv: list[str], refusal: str, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    _aged_sessions(url)
    question = refusal.split(" would delete ", 1)[1]
    code, screen = _on_a_terminal(["--url", url, *argv], b"n\n")
    assert code == 1, screen
    assert f"Delete {question}? [y/N]".encode() in screen
    assert b"nothing was deleted" in screen
    assert len(with_manager(url, lambda m: m.list(Filter("acme")))) == 2
    code, screen = _on_a_terminal(["--url", url, *argv], b"y\n")
    assert code == 0, screen
    assert b"Deleted 2 sessions" in screen
    assert with_manager(url, lambda m: m.list(Filter("acme"))) == []


@pytest.mark.sqlite
def test_nothing_to_delete_asks_nothing(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    migrate(url)
    done = run("--url", url, "purge", "--older-than", "30d")
    assert (done.returncode, done.stderr) == (0, b"")
    done = run("--url", url, "delete-user", "nobody")
    assert (done.returncode, done.stderr) == (0, b"")
