"""A private, throwaway MariaDB server that a test may stop and restart at will.

The shared server other tests (and other programs) use is never touched: this one has a data
directory of its own in a temporary directory, listens on a free port of 127.0.0.1 with no
password for ``root``, reads no configuration file (``--no-defaults``), and is stopped and
deleted by ``close()``. As root, it runs as ``root`` (``--user=root``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from reliability.pgcluster import SYSTEM_BIN, ClusterUnavailable

__all__ = ["PrivateMariaDB", "find_mariadb"]

_SETTINGS = (
    "--innodb-buffer-pool-size=32M",  # small: a few sessions, on a machine shared with others
    "--character-set-server=utf8mb4",
    "--performance-schema=OFF",
    "--skip-log-bin",
    "--skip-name-resolve",
)


def find_mariadb() -> tuple[str, str] | None:
    """Return the paths of the server (``mariadbd``) and of ``mariadb-install-db``, or None."""
    path = os.pathsep.join((os.environ.get("PATH", ""), SYSTEM_BIN))
    server = shutil.which("mariadbd", path=path)
    install = shutil.which("mariadb-install-db", path=path)
    return (server, install) if server and install else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateMariaDB:
    """A MariaDB server of this test run alone: ``start``, ``restart``, ``close``."""

    def __init__(self) -> None:
        found = find_mariadb()
        if found is None:
            raise ClusterUnavailable("no MariaDB server binaries (mariadbd, mariadb-install-db)")
        self.server, self.install = found
        self.root = Path(tempfile.mkdtemp(prefix="ds-private-mariadb-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.user = "root" if os.geteuid() == 0 else ""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the server's ``ds`` database."""
        return f"mysql+asyncmy://root@127.0.0.1:{self.port}/ds"

    def _user(self) -> list[str]:
        return [f"--user={self.user}"] if self.user else []

    def start(self) -> None:
        """Create the data directory (``root`` without a password, a ``ds`` database) and
        start the server."""
        done = subprocess.run(
            [
                self.install, "--no-defaults", f"--datadir={self.data}",
                "--auth-root-authentication-method=normal", "--skip-test-db",
                *self._user(), *_SETTINGS,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {done.stdout}\n{done.stderr}")
        (self.data / "ds").mkdir()  # the database: a directory of the data directory
        self._launch()

    def _launch(self, offset: int = 0) -> None:
        """Start the server; wait for its "ready" line, written past ``offset`` of the log."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    self.server, "--no-defaults", f"--datadir={self.data}",
                    f"--port={self.port}", "--bind-address=127.0.0.1",
                    f"--socket={self.root / 'server.sock'}",
                    f"--pid-file={self.root / 'server.pid'}", *self._user(), *_SETTINGS,
                ],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {self.log.read_text(errors='replace')}")
            with self.log.open("rb") as log:
                log.seek(offset)
                if b"ready for connections" in log.read():
                    return
            time.sleep(0.05)
        raise RuntimeError("mariadbd did not start within 60 s")

    def _stop(self, sig: int) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Restart the server (a normal shutdown): every open connection is dropped."""
        self._stop(signal.SIGTERM)
        self._launch(self.log.stat().st_size)

    def close(self) -> None:
        """Stop the server if it runs and delete its directory."""
        try:
            self._stop(signal.SIGKILL)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
