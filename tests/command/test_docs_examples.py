"""Every example in README.md and docs/ runs as written; the README's commands run as pasted.

A Python block runs on SQLite by default; a page's block runs twice in a row in one
directory (an example must work when run again). A block whose first line is
``# needs: postgres`` runs against a fresh test database put in place of
``postgresql://app@db/app``; ``# needs: adk`` or ``# needs: openai-agents`` need that extra
installed. The guarantees page names tests: each
must exist. The README's shell blocks keep their own checks below.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)

DEMO_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -q ".[sqlite,cli]" '
    "&& .venv/bin/durable-sessions demo"
)
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q nox && .venv/bin/nox"
PG_PLACEHOLDER = "postgresql://app@db/app"
NEEDS_MODULES = {
    "postgres": "asyncpg",
    "adk": "google.adk",
    "openai-agents": "agents",
    "web": "starlette",
    "fastapi": "fastapi",
}
"""What a ``# needs: NAME`` line asks for, as the module that must be importable."""
IMPORTS_NEED = [
    ("google.adk", "adk"),
    ("durable_sessions.openai_agents", "openai-agents"),
    ("durable_sessions.web", "web"),
    ("fastapi", "fastapi"),
]
"""A block that imports the first needs the second, whether or not it says so."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def needs(self) -> list[str]:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        found = re.fullmatch(r"#\s*needs:\s*(.+)", first.strip())
        needs = [n.strip() for n in found.group(1).split(",")] if found else []
        for module, need in IMPORTS_NEED:
            if re.search(rf"^(from|import) {re.escape(module)}\b", self.code, re.M):
                needs.append(need)
        return sorted(set(needs))


def markdown_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def parse_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of ``path``, indented ones (inside list items) dedented."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = re.fullmatch(r"( *)```(\w*).*", lines[i])
        if opening is None:
            i += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j])
            j += 1
        code = textwrap.dedent("\n".join(body)) + "\n"
        if indent:
            code = "\n".join(line.removeprefix(indent) for line in body) + "\n"
        found.append(Block(path, i + 1, language, code))
        i = j + 1
    return found


def all_blocks(*languages: str) -> list[Block]:
    return [b for path in markdown_files() for b in parse_blocks(path) if b.language in languages]


def readme_blocks(*languages: str) -> list[str]:
    """The README's fenced code blocks in these languages, in order."""
    text = README.read_text(encoding="utf-8")
    return [code for language, code in FENCE.findall(text) if language in languages]


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (``google.adk`` without any ``google``: no)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> str | None:
    """A fresh Postgres database as a plain postgresql:// URL, or None when none is set."""
    if not os.environ.get("DURABLE_SESSIONS_TEST_POSTGRES_URL"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DURABLE_SESSIONS_TEST_POSTGRES_URL must be set when CI=true")
        return None
    make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
    return make_url(make()).set(drivername="postgresql").render_as_string(hide_password=False)


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# -- Python examples -------------------------------------------------------------------------


def test_the_docs_and_readme_have_examples() -> None:
    blocks = all_blocks("python", "py")
    assert any(b.path == README for b in blocks)
    assert len([b for b in blocks if b.path != README]) >= 10
    assert readme_blocks("sh")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in all_blocks("python", "py")])
def test_every_python_example_runs_twice_as_written(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    code = block.code
    for need in block.needs:
        assert need in NEEDS_MODULES, f"{block.name}: unknown need {need!r}"
        if not _installed(NEEDS_MODULES[need]):
            pytest.skip(f"{NEEDS_MODULES[need]} is not installed (the {need!r} extra)")
    if "postgres" in block.needs:
        assert PG_PLACEHOLDER in code, f"{block.name}: a Postgres example names {PG_PLACEHOLDER}"
        url = request.getfixturevalue("postgres_url")
        if url is None:
            pytest.skip("no Postgres: DURABLE_SESSIONS_TEST_POSTGRES_URL is not set")
        code = code.replace(PG_PLACEHOLDER, url)
    else:
        assert PG_PLACEHOLDER not in code, f"{block.name} names Postgres without # needs: postgres"
    # Every example runs twice in one directory: a reader runs one again.
    for attempt in ("first", "second"):
        done = _run_python(code, tmp_path)
        assert done.returncode == 0, f"{block.name}, {attempt} run:\n{done.stderr}"


def test_the_usage_example_counts_one_message_once(tmp_path: Path) -> None:
    usage = next(code for code in readme_blocks("python", "py") if "manager.touch" in code)
    assert "assert (session.message_count, session.token_total) == (1, 120)" in usage
    done = _run_python(usage, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "My order is late 1 120" in done.stdout


def test_the_first_example_prints_what_its_comment_says(tmp_path: Path) -> None:
    first = next(b for b in parse_blocks(DOCS / "index.md") if b.language == "python")
    done = _run_python(first.code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["triage", "fr", "1"]


# -- what the pages name ---------------------------------------------------------------------

TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_test_the_docs_name_exists() -> None:
    """The guarantees page names the test that checks each guarantee: each must exist."""
    named = [
        (page, path, name)
        for page in sorted(DOCS.rglob("*.md"))
        for path, name in TEST_REFERENCE.findall(page.read_text(encoding="utf-8"))
    ]
    assert len(named) >= 40
    for page, path, name in named:
        source = ROOT / path
        assert source.is_file(), f"{page.name} names {path}, which does not exist"
        text = source.read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {name}\(", text, re.M), f"{page.name}: {path}::{name}"


def test_every_test_the_readme_names_exists() -> None:
    names = set(re.findall(r"`(test_[a-z0-9_]+)`", README.read_text(encoding="utf-8")))
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    missing = [n for n in sorted(names) if not re.search(rf"def {n}\(", sources)]
    assert not missing


# -- the README's shell blocks ---------------------------------------------------------------


def test_every_shell_block_is_run_or_checked() -> None:
    """A new shell block needs a decision here: run it below, check it, or say why not."""
    for code in readme_blocks("sh", "bash", "shell", "console"):
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


def test_ci_builds_the_docs() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ".venv/bin/nox -s docs" in script.splitlines()


def test_published_installs_are_marked_as_such() -> None:
    """No index serves durable-sessions yet: an install from the index is said to be one."""
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        for found in re.finditer(r'pip install "durable-sessions\[', text):
            before = text[max(0, found.start() - 60) : found.start()]
            assert "published" in before.lower(), f"{path.name}: {text[found.start() - 60 :]}"


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


@pytest.mark.slow
def test_the_commands_lines_run_as_pasted_twice_in_a_row(
    tmp_path: Path, postgres_url: str | None
) -> None:
    """Each line of "The command", in order, in an empty directory, exits 0; and all of
    them again, in the same directory and on the same Postgres database.

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
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for _ in ("first", "second"):
        session_id = _run_lines(lines, work, env, postgres_url)
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


def _run_lines(lines: list[str], work: Path, env: dict[str, str], postgres_url: str | None) -> str:
    """Run the command lines in order in ``work``; return the SESSION_ID the demo named."""
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
    return session_id
