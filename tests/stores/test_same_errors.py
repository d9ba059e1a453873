"""The same bad call gets the same error, with the same message, from every store.

Every operation checks its arguments in one shared function (``durable_sessions.prepare``)
before it touches anything; this feeds each operation the same bad arguments on memory,
SQLite and Postgres side by side and compares the class and the text of what they raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, InMemoryStore, Session, SessionError, SQLStore, Store

Call = Callable[[Store], Awaitable[Any]]
NAIVE = datetime(2026, 1, 1)
LONG = "x" * 300

BAD_CALLS: dict[str, Call] = {
    "get: empty org": lambda s: s.get("", "s"),
    "get: empty id": lambda s: s.get("o", ""),
    "get: id too long": lambda s: s.get("o", LONG),
    "get: org not a string": lambda s: s.get(1, "s"),  # type: ignore[arg-type]
    "delete: empty org": lambda s: s.delete("", "s"),
    "delete: empty id": lambda s: s.delete("o", ""),
    "list_events: empty org and a bad limit": lambda s: s.list_events("", "s", limit=-1),
    "list_events: bad limit": lambda s: s.list_events("o", "s", limit=-1),
    "list_events: bool limit": lambda s: s.list_events("o", "s", limit=True),
    "list_events: naive after": lambda s: s.list_events("o", "s", after=NAIVE),
    "list_events: bad limit and naive after": lambda s: s.list_events(
        "o", "s", limit=-1, after=NAIVE
    ),
    "get_with_events: empty org and a bad limit": lambda s: s.get_with_events("", "s", limit=-1),
    "get_with_events: naive after": lambda s: s.get_with_events("o", "s", after=NAIVE),
    "touch: empty org and bad messages": lambda s: s.touch("", "s", messages=-1),
    "touch: bad messages": lambda s: s.touch("o", "s", messages=-1),
    "touch: tokens too large": lambda s: s.touch("o", "s", tokens=2**40),
    "touch: bad title": lambda s: s.touch("o", "s", title="\x00"),
    "touch: bad messages and title": lambda s: s.touch("o", "s", messages=-1, title="\x00"),
    "fork: empty org and child id": lambda s: s.fork("", "s", new_session_id=""),
    "fork: empty child id": lambda s: s.fork("o", "s", new_session_id=""),
    "append_event: empty org, not an event": lambda s: s.append_event("", "s", "e"),  # type: ignore[arg-type]
    "append_event: not an event": lambda s: s.append_event("o", "s", "e"),  # type: ignore[arg-type]
    "append_event: bad expected_version": lambda s: s.append_event(
        "o",
        "s",
        Event("a"),
        expected_version="1",  # type: ignore[arg-type]
    ),
    "append_event: expected_version past 64 bits": lambda s: s.append_event(
        "o", "s", Event("a"), expected_version=2**70
    ),
    "append_event: NaN in the delta": lambda s: s.append_event(
        "o", "s", Event("a", state_delta={"k": float("nan")})
    ),
    "append_event: bad tokens": lambda s: s.append_event("o", "s", Event("a", tokens=-1)),
    "append_event: naive timestamp": lambda s: s.append_event(
        "o", "s", Event("a", timestamp=NAIVE)
    ),
    "pop_event: empty org": lambda s: s.pop_event("", "s"),
    "pop_event: id too long": lambda s: s.pop_event("o", LONG),
    "pop_event: bad expected_version": lambda s: s.pop_event(
        "o",
        "s",
        expected_version=-1,
    ),
    "pop_event: missing session": lambda s: s.pop_event("o", "missing"),
    "purge: empty org, negative period": lambda s: s.purge("", older_than=timedelta(-1)),
    "purge: negative period": lambda s: s.purge("o", older_than=timedelta(-1)),
    "purge: period too long": lambda s: s.purge("o", older_than=timedelta.max),
    "delete_user: empty org and user": lambda s: s.delete_user("", ""),
    "delete_user: empty user": lambda s: s.delete_user("o", ""),
    "create: empty ids": lambda s: s.create(Session(id="", org_id="", user_id="")),
    "create: a set in the state": lambda s: s.create(
        Session(id="s", org_id="o", user_id="u", state={"k": {1, 2}})
    ),
    "create: a bad title": lambda s: s.create(
        Session(id="s", org_id="o", user_id="u", title="\x00")
    ),
    "update: empty org": lambda s: s.update(Session(id="s", org_id="", user_id="u")),
}


@pytest.fixture
async def stores(migrated_sqlite_url: str, migrated_pg_url: str) -> AsyncIterator[dict[str, Store]]:
    """One store of each kind, side by side."""
    sqlite = create_async_engine(migrated_sqlite_url)
    postgres = create_async_engine(migrated_pg_url)
    yield {
        "memory": InMemoryStore(),
        "sqlite": SQLStore(sqlite),
        "postgres": SQLStore(postgres),
    }
    await asyncio.gather(sqlite.dispose(), postgres.dispose())


async def outcome(call: Call, store: Store) -> tuple[str, str]:
    try:
        await call(store)
    except SessionError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


@pytest.mark.postgres
@pytest.mark.parametrize("name", sorted(BAD_CALLS))
async def test_every_store_refuses_a_bad_call_alike(stores: dict[str, Store], name: str) -> None:
    got = {kind: await outcome(BAD_CALLS[name], store) for kind, store in stores.items()}
    assert got["memory"][0] != "no error", f"{name} was accepted"
    assert got["memory"][0] not in ("StoreError", "StoreUnavailableError"), got
    assert got["sqlite"] == got["memory"], got
    assert got["postgres"] == got["memory"], got


NAMED = {
    "append_event: naive timestamp": "event timestamp must be timezone-aware",
    "list_events: naive after": "after must be timezone-aware",
    "append_event: bad tokens": "event tokens",
    "touch: bad messages": "messages",
    "fork: empty child id": "new_session_id",
}
"""What the message of some bad calls starts with or holds: the argument that is wrong."""


@pytest.mark.parametrize("name", sorted(NAMED))
async def test_the_error_names_the_argument_that_is_wrong(name: str) -> None:
    kind, message = await outcome(BAD_CALLS[name], InMemoryStore())
    assert kind == "InvalidArgumentError", (kind, message)
    assert NAMED[name] in message, message
