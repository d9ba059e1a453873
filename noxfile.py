"""Developer sessions: lint, typecheck, tests, migrations, wheel. One runner for all of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.options.sessions = ["lint", "typecheck", "tests", "wheel"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

PYPROJECT = nox.project.load_toml("pyproject.toml")
SOURCES = ["src", "tests", "migrations", "benchmarks", "noxfile.py"]


def install_group(session: nox.Session, group: str) -> None:
    """Install a PEP 735 dependency group from pyproject.toml."""
    session.install(*nox.project.dependency_groups(PYPROJECT, group))


RANGE_EXTRAS = ["sqlite", "postgres", "cli"]
"""The extras whose dependencies the lowest/newest sessions move to the ends of their ranges."""


def declared_floors() -> list[str]:
    """``name==X`` for every ``name>=X`` the package declares (dependencies and extras)."""
    project = PYPROJECT["project"]
    declared = list(project["dependencies"])
    for extra in RANGE_EXTRAS:
        declared += project["optional-dependencies"][extra]
    floors: dict[str, str] = {}
    for text in declared:
        requirement = Requirement(text)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                floors[requirement.name.lower()] = f"{requirement.name}=={spec.version}"
    return sorted(floors.values())


def show_versions(session: nox.Session) -> None:
    """Print the versions of the dependencies whose ranges are under test."""
    session.run(
        "python",
        "-c",
        "from importlib.metadata import version as v; "
        "print(*(f'{d} {v(d)}' for d in "
        "('SQLAlchemy', 'alembic', 'aiosqlite', 'asyncpg', 'rich', 'greenlet')), sep=', ')",
    )


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff's linter and formatter check."""
    session.install("ruff")
    session.run("ruff", "check", *SOURCES)
    session.run("ruff", "format", "--check", *SOURCES)


@nox.session
def typecheck(session: nox.Session) -> None:
    """Run mypy --strict on the package."""
    session.install("-e", ".[sqlite,postgres,cli,adk,testing,openai-agents]", "mypy")
    session.run("mypy", "--strict", "src")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the whole test suite: memory, SQLite, and Postgres when its URL is set."""
    session.install("-e", ".[sqlite,postgres]")
    install_group(session, "test")
    session.run("pytest", *session.posargs)


@nox.session
def lowest(session: nox.Session) -> None:
    """Run the whole suite on the lowest versions the package declares.

    SQLAlchemy, Alembic, aiosqlite, asyncpg and rich are pinned to the floors in
    pyproject.toml. google-adk (which needs a newer aiosqlite) is left out, and so are the
    tests of the ADK adapter.
    """
    constraints = Path(session.create_tmp()) / "lowest.txt"
    constraints.write_text("\n".join(declared_floors()) + "\n", encoding="utf-8")
    tools = [r for r in nox.project.dependency_groups(PYPROJECT, "test") if "google-adk" not in r]
    session.install("-c", str(constraints), "-e", f".[{','.join(RANGE_EXTRAS)}]", *tools)
    show_versions(session)
    session.run("pytest", "--ignore=tests/adapters/test_adk.py", *session.posargs)


@nox.session
def newest(session: nox.Session) -> None:
    """Run the whole suite on the newest versions of every dependency (within the bounds)."""
    session.install(
        "--upgrade",
        "--upgrade-strategy",
        "eager",
        "-e",
        f".[{','.join(RANGE_EXTRAS)}]",
        *nox.project.dependency_groups(PYPROJECT, "test"),
    )
    show_versions(session)
    session.run("pytest", *session.posargs)


@nox.session
def migrations(session: nox.Session) -> None:
    """Run the migration tests alone (upgrade/downgrade, drift, concurrent migrate)."""
    session.install("-e", ".[sqlite,postgres]")
    install_group(session, "test")
    session.run("pytest", "tests/sql/test_migrations.py", *session.posargs)


@nox.session
def reliability(session: nox.Session) -> None:
    """Run the reliability suite on memory, SQLite and Postgres; print its figures table."""
    session.install("-e", ".[sqlite,postgres]")
    install_group(session, "test")
    session.run("pytest", "tests/reliability", "-p", "no:randomly", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: durable-sessions, Google ADK and the raw driver side by side.

    Postgres is the server named by DURABLE_SESSIONS_BENCH_POSTGRES_URL (an admin URL:
    fresh databases are created and dropped), by default the local one. Arguments go to
    ``python -m benchmarks``, e.g. ``nox -s bench -- --backend sqlite --duration 1`` or
    ``nox -s bench -- --scaling --sizes 1000,100000,1000000``.
    """
    session.install("-e", ".[sqlite,postgres]")
    install_group(session, "bench")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def wheel(session: nox.Session) -> None:
    """Build the wheel, install it in a fresh venv and migrate a SQLite file outside the repo."""
    dist = Path(session.create_tmp()) / "wheel-dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), ".")
    wheels = sorted(dist.glob("durable_sessions-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    session.run("python", "tests/support/wheel_check.py", str(wheels[0]))
