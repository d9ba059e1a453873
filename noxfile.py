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


RANGE_EXTRAS = ["sqlite", "postgres", "mysql", "cli"]
"""The extras whose dependencies the lowest/newest sessions move to the ends of their ranges."""


ADK_EXTRAS = ["adk"]
"""The extras the lowest session moves to their floors in a second step, with the ADK tests:
google-adk needs a newer aiosqlite than the sqlite extra's floor."""

ADK_TESTS = ["tests/adapters", "tests/unit/test_private_api.py"]
"""The tests of the ADK adapter and of the private names it relies on (pydantic's)."""


def declared_floors(extras: list[str] = RANGE_EXTRAS) -> list[str]:
    """``name==X`` for every ``name>=X`` the package declares (dependencies and extras)."""
    project = PYPROJECT["project"]
    declared = list(project["dependencies"])
    for extra in extras:
        declared += project["optional-dependencies"][extra]
    floors: dict[str, str] = {}
    for text in declared:
        requirement = Requirement(text)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                floors[requirement.name.lower()] = f"{requirement.name}=={spec.version}"
    return sorted(floors.values())


VERSIONS_SHOWN = (
    "SQLAlchemy, alembic, aiosqlite, asyncpg, asyncmy, rich, greenlet, pydantic, pydantic-core, "
    "google-adk"
)

_SHOW_VERSIONS = """
from importlib import metadata
shown = []
for name in {names!r}.split(", "):
    try:
        shown.append(f"{{name}} {{metadata.version(name)}}")
    except metadata.PackageNotFoundError:
        pass
print(*shown, sep=", ")
"""


def show_versions(session: nox.Session) -> None:
    """Print the installed versions of the dependencies whose ranges are under test."""
    session.run("python", "-c", _SHOW_VERSIONS.format(names=VERSIONS_SHOWN))


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff's linter and formatter check."""
    session.install("ruff")
    session.run("ruff", "check", *SOURCES)
    session.run("ruff", "format", "--check", *SOURCES)


@nox.session
def typecheck(session: nox.Session) -> None:
    """Run mypy --strict on the package."""
    session.install(
        "-e", ".[sqlite,postgres,mysql,cli,adk,testing,openai-agents,web,crypto]", "mypy"
    )
    session.run("mypy", "--strict", "src")


PYTEST_WORKERS = ["--numprocesses", "auto", "--maxprocesses", "4"]
"""pytest-xdist: one worker per core, at most four (each migrates its own template databases;
more would mostly add lock waits on one database server)."""


@nox.session
def tests(session: nox.Session) -> None:
    """Run the whole test suite: memory, SQLite, and Postgres when its URL is set."""
    session.install("-e", ".[sqlite,postgres,mysql,web]")
    install_group(session, "test")
    session.run("pytest", *PYTEST_WORKERS, *session.posargs)


@nox.session
def lowest(session: nox.Session) -> None:
    """Run the whole suite on the lowest versions the package declares.

    First SQLAlchemy, Alembic, aiosqlite, asyncpg and rich at the floors in pyproject.toml,
    without google-adk (which needs a newer aiosqlite than the sqlite extra's floor) and the
    ADK adapter's tests. Then the ``adk`` extra at its floors (pydantic, whose private names
    the adapter uses, and google-adk), aiosqlite moved up only as far as google-adk asks,
    and the ADK tests run.
    """
    constraints = Path(session.create_tmp()) / "lowest.txt"
    constraints.write_text("\n".join(declared_floors()) + "\n", encoding="utf-8")
    tools = [r for r in nox.project.dependency_groups(PYPROJECT, "test") if "google-adk" not in r]
    session.install("-c", str(constraints), "-e", f".[{','.join(RANGE_EXTRAS)}]", *tools)
    show_versions(session)
    # The ADK tests (and the check of pydantic's private names, which imports the adapter)
    # run in the second step, with google-adk.
    session.run(
        "pytest",
        *PYTEST_WORKERS,
        "--ignore=tests/adapters/test_adk.py",
        "--ignore=tests/unit/test_private_api.py",
        *session.posargs,
    )

    extras = [*RANGE_EXTRAS, *ADK_EXTRAS]
    floors = [f for f in declared_floors(extras) if not f.lower().startswith("aiosqlite==")]
    constraints.write_text("\n".join(floors) + "\n", encoding="utf-8")
    session.install("-c", str(constraints), "-e", f".[{','.join(extras)}]")
    show_versions(session)
    session.run("pytest", *PYTEST_WORKERS, *ADK_TESTS, *session.posargs)


@nox.session
def newest(session: nox.Session) -> None:
    """Run the whole suite on the newest versions of every dependency (within the bounds),
    pydantic's included (the ``adk`` extra)."""
    session.install(
        "--upgrade",
        "--upgrade-strategy",
        "eager",
        "-e",
        f".[{','.join([*RANGE_EXTRAS, *ADK_EXTRAS])}]",
        *nox.project.dependency_groups(PYPROJECT, "test"),
    )
    show_versions(session)
    session.run("pytest", *PYTEST_WORKERS, *session.posargs)


@nox.session
def migrations(session: nox.Session) -> None:
    """Run the migration tests alone (upgrade/downgrade, drift, concurrent migrate, online
    upgrades) on SQLite, Postgres and MySQL."""
    session.install("-e", ".[sqlite,postgres,mysql]")
    install_group(session, "test")
    session.run(
        "pytest",
        "tests/sql/test_migrations.py",
        "tests/sql/test_online_migrations.py",
        *session.posargs,
    )


@nox.session
def reliability(session: nox.Session) -> None:
    """Run the reliability suite on memory, SQLite, Postgres and MySQL; print its figures
    table."""
    session.install("-e", ".[sqlite,postgres,mysql]")
    install_group(session, "test")
    session.run("pytest", "tests/reliability", "-p", "no:randomly", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: durable-sessions, Google ADK and the raw driver side by side.

    Postgres is the server named by DURABLE_SESSIONS_BENCH_POSTGRES_URL (an admin URL:
    fresh databases are created and dropped), by default the local one. Arguments go to
    ``python -m benchmarks`` (the side-by-side suite without any), e.g.
    ``nox -s bench -- list``, ``nox -s bench -- run adk --quick`` or
    ``nox -s bench -- run scaling -- --sizes 1000,100000,1000000``.
    """
    session.install("-e", ".[sqlite,postgres]")
    install_group(session, "bench")
    session.run("python", "-m", "benchmarks", *(session.posargs or ["run", "side-by-side"]))


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with ``mkdocs build --strict``.

    Fails on a broken link, a page missing from the navigation or a public name missing from
    the API reference (``docs/hooks.py``). ``nox -s docs -- serve`` serves it instead.
    """
    session.install("-e", ".[sqlite,postgres,cli,adk,openai-agents,testing,crypto]")
    install_group(session, "docs")
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its successor
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:])
        return
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), *session.posargs)


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
