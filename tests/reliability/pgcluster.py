"""A private, throwaway Postgres cluster that a test may stop and restart at will.

The shared server other tests use is never touched: the cluster lives in a temporary
directory, listens on a free port of 127.0.0.1 with trust authentication, and is stopped
and deleted by ``close()``. As root, the server binaries run as the ``postgres`` user
(Postgres refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ClusterUnavailable", "PrivateCluster", "find_pg_bindir", "find_runuser"]

SYSTEM_BIN = os.pathsep.join(("/usr/sbin", "/sbin", "/usr/bin", "/bin"))
"""Where Debian keeps ``runuser``: not on a normal user's PATH."""


class ClusterUnavailable(Exception):
    """This machine cannot run a private cluster; the message says why."""


def find_runuser() -> str | None:
    """Return the path of ``runuser``, on PATH or in the system's sbin directories."""
    return shutil.which("runuser") or shutil.which("runuser", path=SYSTEM_BIN)


def find_pg_bindir() -> str | None:
    """Return the directory holding ``initdb`` and ``pg_ctl``, or None if there is none."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if done.returncode == 0:
            candidates.append(done.stdout.strip())
    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for folder in candidates:
        if all(os.access(Path(folder) / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """A Postgres cluster of this test run alone: ``start``, ``restart``, ``close``."""

    def __init__(self, bindir: str) -> None:
        self.bindir = Path(bindir)
        self.root = Path(tempfile.mkdtemp(prefix="ds-private-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            runuser = find_runuser()
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                owner = None
            if runuser is None or owner is None:
                shutil.rmtree(self.root, ignore_errors=True)
                missing = "runuser" if runuser is None else "a 'postgres' user"
                raise ClusterUnavailable(
                    "as root, the Postgres server must run as 'postgres', "
                    f"and there is no {missing}"
                )
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as_postgres = [runuser, "-u", "postgres", "--"]
        self.running = False

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the cluster's ``postgres`` database."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as_postgres, str(self.bindir / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed: {done.stdout}\n{done.stderr}\n{log}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), *extra, action
        )

    def start(self) -> None:
        """Create the cluster (trust authentication, superuser ``postgres``) and start it."""
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self._pg_ctl("start", "-w")
        self.running = True

    def restart(self) -> None:
        """Restart the server (fast shutdown): every open connection is dropped."""
        self._pg_ctl("restart", "-w", "-m", "fast")

    def close(self) -> None:
        """Stop the server if it runs and delete the cluster's directory."""
        try:
            if self.running:
                self._pg_ctl("stop", "-w", "-m", "immediate")
                self.running = False
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
