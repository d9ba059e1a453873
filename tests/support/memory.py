"""Peak memory of work run in a child process (Linux: ``/proc/self/status``).

A test runs a script with ``run_measured(script, *argv)``; the script imports this module
(``from support.memory import restart_peak, peak_kib``), loads and warms up what it needs,
calls ``restart_peak()`` (its RSS then), does the work, and prints ``peak_kib()``: the
growth is what the work added at its peak, whatever the parent process held.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
"""The tests directory, put on the child's path so that it can import ``support``."""


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB: ``VmRSS`` (now) or ``VmHWM`` (the peak).

    VmHWM is this process's own peak: ru_maxrss would also count the parent's RSS, which
    Linux carries over a fork and exec.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def restart_peak() -> int:
    """Start the peak (VmHWM) again from the current RSS, and return that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


def peak_kib() -> int:
    """The peak RSS since the last ``restart_peak``, in KiB."""
    return status_kib("VmHWM")


def run_measured(script: str, *argv: str, timeout: float = 600) -> str:
    """Run ``python -c script *argv`` with the tests directory on its path; return its
    stdout (raises if it fails)."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
