"""Check that a built wheel migrates a database on its own, away from the repository.

Creates a fresh virtual environment in a temporary directory, installs the wheel (not
editable) with its ``sqlite`` extra, and from inside that temporary directory runs code that
imports ``durable_sessions.sql.migrate`` from the installed package, upgrades a new SQLite file
and checks the result. A wheel without its bundled migrations, or one that still needs the
checkout, fails here; so does one without the repository's LICENSE (byte for byte) among its
licence files, or without the project's URLs in its metadata.

Usage::

    python tests/support/wheel_check.py dist/durable_sessions-0.1.0-py3-none-any.whl

Exits 0 when the wheel works, non-zero otherwise. Not collected by pytest (no ``test_``
prefix); the nox session ``wheel`` builds a wheel and runs this script on it.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

CHECK = r"""
import asyncio
import sys
from pathlib import Path

import durable_sessions
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions.sql.migrate import current, head, is_current, script_location, upgrade

TABLES = {
    "ds_sessions",
    "ds_user_state",
    "ds_app_state",
    "ds_events",
    "ds_keys",
    "ds_memories",
    "ds_memory_terms",
}
# SQLite's full-text indexes of events and memories: FTS5 tables and their shadow tables.
FTS = ("ds_events_fts", "ds_memories_fts")
VERSION_TABLE = "durable_sessions_alembic_version"

package = Path(durable_sessions.__file__).resolve().parent
assert "site-packages" in package.parts, f"imported from {package}, not the installed wheel"
migrations = Path(script_location())
assert migrations == package / "migrations", f"migrations found at {migrations}"
assert (migrations / "env.py").is_file(), "env.py missing from the wheel"
# The web viewer's templates and stylesheet, read from the package directory at run time.
for name in ("templates/base.html", "templates/session.html", "static/viewer.css"):
    assert (package / "web" / name).is_file(), f"web/{name} missing from the wheel"


async def main(db: str) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
    try:
        assert await is_current(engine) is False, "a new database claims to be at head"
        await upgrade(engine)
        assert await is_current(engine) is True, "not at head after upgrade()"
        assert await current(engine) == head()
        async with engine.connect() as conn:
            names = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        extra = names - TABLES - {VERSION_TABLE}
        assert TABLES | {VERSION_TABLE} <= names, f"missing tables: {sorted(names)}"
        assert set(FTS) <= extra, f"no full-text table: {sorted(names)}"
        assert all(n.startswith(FTS) for n in extra), f"unexpected tables: {sorted(names)}"
    finally:
        await engine.dispose()


asyncio.run(main(sys.argv[1]))
print(f"ok: durable_sessions {durable_sessions.__version__} from {package} migrated to {head()}")
"""


REPO_ROOT = Path(__file__).resolve().parents[2]


def temp_base() -> Path:
    """Return a temporary directory outside the checkout.

    nox points ``TMPDIR`` into ``.nox/`` inside the checkout; the check must run away from
    the repository, so fall back to the system default in that case.
    """
    base = Path(tempfile.gettempdir()).resolve()
    if not base.is_relative_to(REPO_ROOT):
        return base
    saved = {k: os.environ.pop(k) for k in ("TMPDIR", "TEMP", "TMP") if k in os.environ}
    tempfile.tempdir = None
    try:
        return Path(tempfile.gettempdir()).resolve()
    finally:
        os.environ.update(saved)
        tempfile.tempdir = None


def venv_python(env_dir: Path) -> Path:
    """Return the interpreter of the virtual environment in ``env_dir``."""
    if sys.platform == "win32":
        return env_dir / "Scripts" / "python.exe"
    return env_dir / "bin" / "python"


def check_licence(wheel: Path) -> str | None:
    """Return what is wrong with the wheel's licence and metadata, or None.

    The wheel must carry the repository's LICENSE, byte for byte, as a licence file of its
    metadata, and name it (``License-File``) beside the SPDX expression and the project's
    documentation, changelog and source URLs.
    """
    expected = (REPO_ROOT / "LICENSE").read_bytes()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licences = [n for n in names if ".dist-info/licenses/" in n]
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            return "no METADATA in the wheel"
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
        if [n.rsplit("/", 1)[1] for n in licences] != ["LICENSE"]:
            return f"licence files in the wheel: {licences}, expected one LICENSE"
        if archive.read(licences[0]) != expected:
            return "the wheel's LICENSE differs from the repository's"
    if metadata.get("License-Expression") != "Apache-2.0":
        return f"License-Expression is {metadata.get('License-Expression')!r}"
    if metadata.get_all("License-File") != ["LICENSE"]:
        return f"License-File is {metadata.get_all('License-File')!r}"
    urls = {u.split(",", 1)[0] for u in metadata.get_all("Project-URL") or []}
    if not {"Documentation", "Changelog", "Source"} <= urls:
        return f"Project-URL names {sorted(urls)}"
    return None


def check_wheel(wheel: Path) -> int:
    """Install ``wheel`` into a fresh venv and migrate a SQLite file with it.

    Args:
        wheel: The built ``.whl`` file.

    Returns:
        The exit status: 0 when the wheel carries its licence and the installed wheel
        migrated the database.
    """
    problem = check_licence(wheel)
    if problem is not None:
        print(f"FAILED: {problem}", file=sys.stderr)
        return 1
    print("licence and project URLs: ok", flush=True)
    with tempfile.TemporaryDirectory(prefix="ds-wheel-check-", dir=temp_base()) as tmp:
        workdir = Path(tmp)
        if workdir.is_relative_to(REPO_ROOT):
            print(f"FAILED: no temporary directory outside {REPO_ROOT}", file=sys.stderr)
            return 1
        env_dir = workdir / "venv"
        print(f"creating a virtual environment in {env_dir}", flush=True)
        venv.create(env_dir, with_pip=True, clear=True)
        python = venv_python(env_dir)

        # Nothing from the checkout or the calling environment may leak into the check.
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
        env["VIRTUAL_ENV"] = str(env_dir)
        env["PYTHONSAFEPATH"] = "1"

        install = [str(python), "-m", "pip", "install", "--quiet", f"{wheel}[sqlite]"]
        print("installing", wheel.name, "with the sqlite extra", flush=True)
        if subprocess.run(install, cwd=workdir, env=env, check=False).returncode != 0:
            print("FAILED: pip could not install the wheel", file=sys.stderr)
            return 1

        db = workdir / "check.db"
        result = subprocess.run(
            [str(python), "-c", CHECK, str(db)], cwd=workdir, env=env, check=False
        )
        if result.returncode != 0:
            print("FAILED: the installed wheel could not migrate a database", file=sys.stderr)
            return result.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and check the wheel it names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="path to the built durable-sessions wheel")
    args = parser.parse_args(argv)
    wheel: Path = args.wheel.resolve()
    if not wheel.is_file() or wheel.suffix != ".whl":
        parser.error(f"not a wheel file: {wheel}")
    return check_wheel(wheel)


if __name__ == "__main__":
    sys.exit(main())
