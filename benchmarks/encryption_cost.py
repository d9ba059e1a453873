"""What encryption at rest costs: the hot paths with and without a keyring.

Two stores on one database, one plain and one with a ``LocalKeyring``, each with a session of
its own (private, ``user:`` and ``app:`` state, a transcript of ``--events`` events). Each of
``--rounds`` rounds runs every operation ``--ops`` times on each store, one call on one store
then one on the other (which goes first alternating from call to call), so that both meet the
same moments of a busy machine; each call is timed on its own:

- ``get``: a session with its merged state;
- ``load``: ``get_with_events`` with the newest 20 events (what an agent turn reads);
- ``cold``: ``load`` with nothing kept: the encrypted store first drops the values it
  keeps opened (``sealing.OpenedValues``), so every value is decrypted, as in a process's
  first read of a session;
- ``append``: ``append_event`` with a state delta (with a keyring, its statement also
  checks that the user's data key is still in the key table);
- ``create``: a new session with a private, a ``user:`` and an ``app:`` value (with a
  keyring, its insert also checks that the user's data key is still in the key table:
  another process may have erased the user);
- ``save``: ``update`` of one private and one ``user:`` key;
- ``search``: a two-word search over the organisation's events.

The median of the rounds' ratios (encrypted over plain, in time per operation) is printed
for each operation; the issue's budget is 1.15 (at most 15% slower). A last line gives the
floor of ``cold``: the events it opens, each decrypted alone with its data key (one
call per value, nothing decoded or kept), in each round as a share of the plain ``load``.

    python -m benchmarks run encryption [--backend sqlite|postgres|mysql]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Manager, SQLStore

from .common import Database, command_line, new_tmpdir, run_meta, write_results

OPERATIONS = ("get", "load", "cold", "append", "save", "create", "search")
TEXT = "the customer asked about the refund for order {n} and the delivery date in march"


async def _setup(store: SQLStore, events: int) -> tuple[Callable[[str], Awaitable[Any]], str]:
    """A session with state and a transcript; return what runs one operation of each kind,
    and the session's id."""
    manager = Manager(store, app_name="bench")
    session = await manager.create(
        "org", "user", state={"plan": "pro", "user:lang": "en", "app:motd": "hello"}
    )
    batch = [Event("user", {"text": TEXT.format(n=n)}, state_delta={"n": n}) for n in range(events)]
    await store.append_events("org", session.id, batch)
    counter = [0]

    async def one(operation: str) -> Any:
        counter[0] += 1
        if operation == "get":
            return await store.get("org", session.id)
        if operation == "load":
            return await store.get_with_events("org", session.id, limit=20)
        if operation == "cold":
            if store._env is not None:
                store._env.sealer.opened.clear()
            return await store.get_with_events("org", session.id, limit=20)
        if operation == "append":
            event = Event("agent", {"text": TEXT.format(n=counter[0])}, state_delta={"k": 1})
            return await store.append_event("org", session.id, event)
        if operation == "save":
            current = await store.get("org", session.id)
            current.set("plan", f"p{counter[0]}")
            current.set("user:lang", f"l{counter[0]}")
            return await store.update(current)
        if operation == "create":
            state = {"plan": "pro", "user:lang": "en", "app:motd": "hello"}
            return await manager.create("org", "user", state=state)
        return await store.search("org", "refund delivery", limit=10)

    return one, session.id


async def _sealed_values(
    plain: SQLStore, encrypted: SQLStore, session_id: str
) -> list[tuple[Any, str, bytes]]:
    """The sealed values of the events ``load`` reads from the encrypted store's session
    (read as stored, through the plain store), each with its data key and associated data."""
    from durable_sessions.sealing import EVENT_PREFIX, key_id_of, row_aad

    assert encrypted._env is not None
    sealer = encrypted._env.sealer
    read = await plain.get_with_events("org", session_id, limit=20)
    found = []
    for event in read.events:
        kind = "event" if event.content.startswith(EVENT_PREFIX) else "content"
        values = [(event.content, row_aad(kind, "org", session_id, event.id))]
        values += [
            (v, row_aad("delta", "org", session_id, event.id, k))
            for k, v in event.state_delta.items()
        ]
        for token, aad in values:
            found.append((await sealer.key_by_id("org", key_id_of(token)), token, aad))
    return found


def _decrypt_all(values: list[tuple[Any, str, bytes]]) -> float:
    """Seconds to decrypt every one of ``values`` once, alone."""
    start = time.perf_counter()
    for key, token, aad in values:
        key.open_text(token, aad)
    return time.perf_counter() - start


async def measure(
    url: str, keyring_path: Path, ops: int, rounds: int, events: int
) -> dict[str, dict[str, list[float]]]:
    """Every round's seconds per operation, of each store, by operation."""
    from durable_sessions.crypto import LocalKeyring

    engine = create_async_engine(url)
    stores = {
        "plain": SQLStore(engine),
        "encrypted": SQLStore(engine, keyring=LocalKeyring(keyring_path)),
    }
    await stores["plain"].migrate()
    made = {name: await _setup(store, events) for name, store in stores.items()}
    runners = {name: runner for name, (runner, _) in made.items()}
    found: dict[str, dict[str, list[float]]] = {
        name: {op: [] for op in OPERATIONS} for name in stores
    }
    found["floor"] = {"cold": []}
    sealed = await _sealed_values(stores["plain"], stores["encrypted"], made["encrypted"][1])

    names = list(stores)
    orders = (names, names[::-1])

    async def loop(operation: str, record: bool) -> None:
        spent = dict.fromkeys(names, 0.0)
        for n in range(ops):
            for name in orders[n % 2]:
                start = time.perf_counter()
                await runners[name](operation)
                spent[name] += time.perf_counter() - start
        if record:
            for name in names:
                found[name][operation].append(spent[name] / ops)

    try:
        for operation in OPERATIONS:  # warm-up: caches, prepared statements, unwrapped keys
            await loop(operation, record=False)
        for _ in range(rounds):
            for operation in OPERATIONS:
                await loop(operation, record=True)
            found["floor"]["cold"].append(sum(_decrypt_all(sealed) for _ in range(ops)) / ops)
    finally:
        await engine.dispose()
    return found


def summarize(found: dict[str, dict[str, list[float]]]) -> list[str]:
    """Each operation's best time per store and the median of the rounds' ratios."""
    lines = []
    for operation in OPERATIONS:
        plain, sealed = found["plain"][operation], found["encrypted"][operation]
        ratios = sorted(s / p for s, p in zip(sealed, plain, strict=True))
        lines.append(
            f"{operation:7} plain {min(plain) * 1e6:8.0f} us  encrypted {min(sealed) * 1e6:8.0f} us"
            f"  ratio median {statistics.median(ratios):.2f}x"
            f" (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
        )
    floor = found.get("floor", {}).get("cold")
    if floor:
        shares = sorted(f / p for f, p in zip(floor, found["plain"]["load"], strict=True))
        lines.append(
            f"floor   cold's values decrypted alone {min(floor) * 1e6:5.0f} us:"
            f" {statistics.median(shares):.2f}x the plain load"
            f" (rounds {shares[0]:.2f}-{shares[-1]:.2f}x)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print each operation's times with and without a keyring, and their ratio."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks run encryption")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "mysql"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300, help="operations of each kind per round")
    parser.add_argument("--events", type=int, default=200, help="events in each transcript")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    tmpdir = new_tmpdir()
    database = Database(args.backend, "encryption", tmpdir)

    async def run() -> dict[str, dict[str, list[float]]]:
        await database.create()
        try:
            keyring = tmpdir / "keys.json"
            return await measure(database.url, keyring, args.ops, args.rounds, args.events)
        finally:
            await database.drop()

    try:
        found = asyncio.run(run())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    lines = summarize(found)
    print("\n".join(lines))
    data = {"meta": run_meta(args, command_line()), "backend": args.backend, "rounds": found}
    title = f"Encryption at rest on {args.backend}: with a keyring against without"
    write_results(args.out, f"encryption_{args.backend}", title, lines, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
