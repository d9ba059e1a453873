"""``durable-sessions serve``: a live server on a read-only database, as a user starts it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
pytest.importorskip("uvicorn")

import httpx
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import SQLStore
from durable_sessions.cli import main
from durable_sessions.sql import migrate
from durable_sessions.sql.schema import VERSION_TABLE
from support.viewer import ORG, free_port, seed, wait_for_port

TOKEN = "tok-Visible-Nowhere"
PASSWORD = "pw-Visible-Nowhere"


def _seeded(url: str) -> None:
    async def work() -> None:
        engine = create_async_engine(url)
        try:
            store = SQLStore(engine)
            await store.migrate()
            await seed(store)
        finally:
            await engine.dispose()

    asyncio.run(work())


@contextmanager
def _serving(tmp_path: Path, *argv: str) -> Iterator[tuple[str, Path]]:
    """Run ``python -m durable_sessions ... serve --port P`` until the block ends; yield its
    base URL and the file holding everything it printed."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "durable_sessions", *argv, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for_port(port, alive=lambda: child.poll() is None)
        yield f"http://127.0.0.1:{port}", log
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_serve_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: durable-sessions serve")
    for option in ("--url", "--host", "--port", "--org", "--token"):
        assert option in out


@pytest.mark.sqlite
def test_serve_shows_one_organisation_read_only_behind_a_token(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    _seeded(f"sqlite+aiosqlite:///{path}")
    args = ["--url", f"sqlite:///{path}", "serve", "--org", ORG, "--token", TOKEN]
    with (
        _serving(tmp_path, *args) as (base, log),
        httpx.Client(base_url=base, follow_redirects=True) as client,
    ):
        assert client.get(f"/orgs/{ORG}").status_code == 401
        entered = client.get(f"/orgs/{ORG}?token={TOKEN}")  # follows the redirect
        assert entered.status_code == 200
        assert "Trip to Lisbon" in entered.text
        assert str(entered.url) == f"{base}/orgs/{ORG}"
        assert client.get("/orgs/rival").status_code == 404
        assert client.post(f"/orgs/{ORG}").status_code == 405
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        page = httpx.get(f"{base}/orgs/{ORG}/sessions/trip", headers=bearer)
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
    printed = log.read_text()
    assert "read-only" in printed
    assert f"Uvicorn running on http://127.0.0.1:{base.rsplit(':', 1)[1]}" in printed
    assert f"GET /orgs/{ORG} 401" in printed
    assert TOKEN not in printed


@pytest.mark.postgres
def test_serve_never_shows_the_password(tmp_path: Path, fresh_pg_url: Callable[[], str]) -> None:
    url = fresh_pg_url()
    _seeded(url)
    # The test server trusts local connections: the password is sent and never checked.
    with_password = make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)
    with (
        _serving(tmp_path, "--url", with_password, "serve") as (base, log),
        httpx.Client(base_url=base) as client,
    ):
        pages = [
            client.get("/"),
            client.get(f"/orgs/{ORG}"),
            client.get(f"/orgs/{ORG}/sessions/trip"),
            client.get(f"/orgs/{ORG}/sessions/missing"),
            client.get(f"/orgs/{ORG}?cursor=bad"),
        ]
        assert [p.status_code for p in pages] == [200, 200, 200, 404, 400]
        for page in pages:
            assert PASSWORD not in page.text
    printed = log.read_text()
    assert "***" in printed
    assert PASSWORD not in printed


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_sessions",
            "--url",
            f"postgresql://viewer:{PASSWORD}@127.0.0.1:1/nowhere",
            "serve",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("durable-sessions: error: cannot use the database at ")
    assert PASSWORD not in done.stderr


@pytest.mark.sqlite
def test_a_missing_database_file_is_one_line(tmp_path: Path) -> None:
    code = main(["--url", f"sqlite:///{tmp_path / 'none.db'}", "serve"])
    assert code == 1
    assert not (tmp_path / "none.db").exists()


def _stamp(url: str, revision: str) -> None:
    async def work() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    text(f"UPDATE {VERSION_TABLE} SET version_num = :r"), {"r": revision}
                )
        finally:
            await engine.dispose()

    asyncio.run(work())


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_serve_on_a_database_a_newer_version_migrated_says_upgrade_in_one_line(
    backend: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'newer.db'}"
    else:
        url = request.getfixturevalue("fresh_pg_url")()
    _seeded(url)
    _stamp(url, "9999_from_the_future")
    code = main(["--url", url, "serve", "--port", str(free_port())])
    captured = capsys.readouterr()
    assert (code, captured.out) == (1, "")
    assert captured.err == (
        "durable-sessions: error: this database is at revision 9999_from_the_future, newer "
        f"than this durable-sessions knows (head {migrate.head()}); upgrade durable-sessions\n"
    )


@pytest.mark.sqlite
def test_serve_on_a_database_behind_head_says_migrate_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'behind.db'}"
    _seeded(url)
    _stamp(url, "0001")
    code = main(["--url", url, "serve", "--port", str(free_port())])
    captured = capsys.readouterr()
    assert (code, captured.out) == (1, "")
    assert captured.err.startswith(
        "durable-sessions: error: the database schema is at 0001, this version needs "
    )
    assert captured.err.count("\n") == 1
    assert "durable-sessions --url" in captured.err  # the command names this database


def test_without_the_web_extra_serve_names_it(tmp_path: Path) -> None:
    # The child process plays an installation without starlette.
    program = (
        "import sys; sys.modules['starlette'] = None\n"
        "from durable_sessions.cli import main\n"
        f"sys.exit(main(['--url', 'sqlite:///{tmp_path / 'x.db'}', 'serve']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        'durable-sessions: error: the web viewer needs the optional "web" extra: '
        'pip install "durable-sessions[web]"'
    )
