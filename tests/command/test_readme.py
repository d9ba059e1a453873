"""Every code block of the README runs as pasted: the Python examples, the command's lines,
and the two commands (the test command is the one CI runs)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)

DEMO_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -q ".[sqlite,cli]" '
    "&& .venv/bin/durable-sessions demo"
)
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q nox && .venv/bin/nox"
PG_PLACEHOLDER = "postgresql://app@db/app"
NEEDS = [
    ("google.adk", "google.adk", "adk"),
    ("durable_sessions.openai_agents", "agents", "openai-agents"),
]
"""A block that imports the first needs the second module, which the extra installs."""


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (``google.adk`` without any ``google``: no)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def blocks(*languages: str) -> list[str]:
    """The README's fenced code blocks in these languages, in order."""
    text = README.read_text(encoding="utf-8")
    return [code for language, code in FENCE.findall(text) if language in languages]


def python_blocks() -> list[Any]:
    return [
        pytest.param(code, id=f"python-{i}") for i, code in enumerate(blocks("python", "py"), 1)
    ]


def test_the_readme_has_its_examples() -> None:
    assert len(blocks("python", "py")) >= 1
    assert blocks("sh")


@pytest.mark.parametrize("code", python_blocks())
def test_every_python_block_runs_as_pasted(code: str, tmp_path: Path) -> None:
    for needs, module, extra in NEEDS:
        if needs in code and not _installed(module):
            pytest.skip(f"{module} is not installed (the {extra!r} extra)")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_usage_example_counts_one_message_once(tmp_path: Path) -> None:
    usage = next(code for code in blocks("python", "py") if "manager.touch" in code)
    assert "assert (session.message_count, session.token_total) == (1, 120)" in usage
    script = tmp_path / "usage.py"
    script.write_text(usage, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "My order is late 1 120" in done.stdout


# -- shell blocks ----------------------------------------------------------------------------


def test_every_shell_block_is_run_or_checked() -> None:
    """A new shell block needs a decision here: run it below, check it, or say why not."""
    for code in blocks("sh", "bash", "shell", "console"):
        if code.strip() in (DEMO_COMMAND, TEST_COMMAND):
            continue  # run below (the demo) and by CI (.ci/run: the test command)
        if code.startswith("docker compose"):
            continue  # starts a container: not run by the tests
        assert code == _command_code(), f"a README shell block no test runs:\n{code}"


def test_the_two_commands_stay_two_one_line_commands() -> None:
    text = README.read_text(encoding="utf-8")
    two = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert [code.strip() for _, code in FENCE.findall(two)][:2] == [DEMO_COMMAND, TEST_COMMAND]
    # Nothing installs outside a virtualenv: a distribution's python3 refuses that (PEP 668).
    for command in (DEMO_COMMAND, TEST_COMMAND):
        assert "python3 -m pip" not in command
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install ")


@pytest.mark.slow
@pytest.mark.sqlite
def test_the_demo_command_runs_as_written_in_a_fresh_copy(tmp_path: Path) -> None:
    """The first command, exactly as the README has it, in a copy of the checkout's files:
    a virtualenv of its own, the package installed from the copy, the demo to its end."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    clone = tmp_path / "clone"
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", "-c", DEMO_COMMAND],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4. Transcript" in done.stdout, done.stdout[-3000:]
    assert (clone / "durable-sessions.db").exists()


def test_ci_runs_the_readme_test_command_exactly_as_written() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in script.splitlines()


def test_published_installs_are_marked_as_such() -> None:
    """No index serves durable-sessions yet: an install from the index is said to be one."""
    text = README.read_text(encoding="utf-8")
    for found in re.finditer(r'pip install "durable-sessions\[', text):
        before = text[max(0, found.start() - 60) : found.start()]
        assert "published" in before.lower(), text[found.start() - 60 : found.end() + 20]


def _command_code() -> str:
    """The shell block of the README's section "The command"."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## The command\n", 1)[1].split("\n## ", 1)[0]
    return next(code for language, code in FENCE.findall(section) if language == "sh")


def _command_block() -> list[str]:
    lines = []
    for line in _command_code().splitlines():
        command = line.split("  #", 1)[0].strip()
        if command:
            lines.append(command)
    return lines


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> str | None:
    """A fresh Postgres database as a plain postgresql:// URL, or None when none is set."""
    if not os.environ.get("DURABLE_SESSIONS_TEST_POSTGRES_URL"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DURABLE_SESSIONS_TEST_POSTGRES_URL must be set when CI=true")
        return None
    make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
    return make_url(make()).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.mark.slow
def test_the_commands_lines_run_as_pasted(tmp_path: Path, postgres_url: str | None) -> None:
    """Each line of "The command", in order, in an empty directory, exits 0.

    The install line is the one line not run (it installs into .venv); `durable-sessions`
    is this interpreter's. The Postgres URL is a fresh test database's; SESSION_ID is the id
    the demo names in its closing hint.
    """
    lines = _command_block()
    install = lines.pop(0)
    assert install.startswith(".venv/bin/pip install")
    assert '"./[cli,postgres]"' in install  # the Postgres lines need the postgres extra
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "durable-sessions"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m durable_sessions "$@"\n')
    wrapper.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    session_id = ""
    for line in lines:
        if PG_PLACEHOLDER in line:
            if postgres_url is None:
                continue  # no Postgres here (under CI=true there always is)
            line = line.replace(PG_PLACEHOLDER, postgres_url)
        line = line.replace("SESSION_ID", session_id)
        done = subprocess.run(
            ["bash", "-c", f"set -e; {line.replace(' ; ', '; ')}"],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        if "Look closer: " in done.stdout:
            hint = done.stdout.strip().splitlines()[-1].removeprefix("Look closer: ")
            if postgres_url is not None and postgres_url in line:
                assert hint.startswith(f"durable-sessions --url {postgres_url} show ")
                subprocess.run(["bash", "-c", hint], cwd=work, env=env, check=True, timeout=120)
            elif "--url" not in line:
                session_id = hint.split(" show ", 1)[1]
    assert session_id
    assert (work / "copy.db").exists()
    copied = subprocess.run(
        ["bash", "-c", "durable-sessions --url sqlite:///copy.db export"],
        cwd=work,
        env=env,
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert copied.stdout == (work / "backup.jsonl").read_bytes()
