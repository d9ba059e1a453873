"""What a ``LocalKeyring`` costs as its file grows: one secret per user.

A keyring file holds a secret per scope (organisation and user, or app); it is rewritten
whole when a scope gets its first data key (a new user's first write) and when a scope is
forgotten (``delete_user``), and read again by every process that shares it once it
changed. For each size in ``--scopes`` (a keyring of that many scopes, written at once),
each of ``--rounds`` rounds times:

- ``new``: ``wrap`` for a scope not in the keyring yet (the file is rewritten);
- ``forget``: ``forget`` of that scope (the file is rewritten);
- ``reread``: ``unwrap`` in a second keyring on the same file after the first changed it
  (the file is parsed again);
- ``known``: ``wrap`` for a scope already in the keyring (no file work): the reference.

The median over the rounds is printed per operation and size, in milliseconds and as a
multiple of ``known``. The file work runs in a worker thread; the calling task waits for
it, and the event loop too while the JSON is parsed or encoded (they hold the GIL).

    python -m benchmarks run keyring [-- --scopes 1000,10000,100000 --rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import shutil
import statistics
import time
from pathlib import Path

from .common import command_line, new_tmpdir, run_meta, write_results

OPERATIONS = ("new", "forget", "reread", "known")


def _fill(path: Path, scopes: int) -> None:
    """Give the keyring file at ``path`` ``scopes`` scopes with a secret each, at once."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for n in range(scopes):
        scope = json.dumps(["org", "user", f"user-{n}"], separators=(",", ":"))
        data["scopes"][scope] = base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    path.write_text(json.dumps(data), encoding="utf-8")


async def measure(path: Path, scopes: int, rounds: int) -> dict[str, list[float]]:
    """Every round's seconds per operation, on a keyring of ``scopes`` scopes."""
    from durable_sessions.crypto import LocalKeyring

    LocalKeyring(path)
    _fill(path, scopes)
    first, second = LocalKeyring(path), LocalKeyring(path)
    key = secrets.token_bytes(32)
    await first.wrap('["org","user","user-0"]', key)
    found: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    for n in range(rounds):
        scope = f'["org","user","new-{n}"]'
        start = time.perf_counter()
        wrapped = await first.wrap(scope, key)
        found["new"].append(time.perf_counter() - start)
        start = time.perf_counter()
        assert await second.unwrap(scope, *wrapped) == key
        found["reread"].append(time.perf_counter() - start)
        start = time.perf_counter()
        await first.forget(scope)
        found["forget"].append(time.perf_counter() - start)
        start = time.perf_counter()
        await first.wrap('["org","user","user-0"]', key)
        found["known"].append(time.perf_counter() - start)
    return found


def summarize(found: dict[int, dict[str, list[float]]]) -> list[str]:
    """Each size's median per operation, in ms and against ``known``."""
    lines = []
    for scopes, times in found.items():
        known = statistics.median(times["known"])
        parts = [
            f"{op} {statistics.median(times[op]) * 1e3:7.2f} ms"
            f" ({statistics.median(times[op]) / known:6.0f}x)"
            for op in OPERATIONS[:-1]
        ]
        lines.append(f"{scopes:>7} scopes: " + "  ".join(parts) + f"  known {known * 1e6:.0f} us")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print what a keyring's file work costs at each size."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks run keyring")
    parser.add_argument("--scopes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.scopes.split(",")]
    found: dict[int, dict[str, list[float]]] = {}
    for scopes in sizes:
        tmpdir = new_tmpdir()
        try:
            found[scopes] = asyncio.run(measure(tmpdir / "keys.json", scopes, args.rounds))
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
    lines = summarize(found)
    print("\n".join(lines))
    data = {"meta": run_meta(args, command_line()), "rounds": {str(k): v for k, v in found.items()}}
    write_results(args.out, "keyring", "A LocalKeyring's file work as it grows", lines, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
