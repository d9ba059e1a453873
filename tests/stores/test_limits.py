"""Size limits on every store: state values and event content, ids and keys in UTF-8 bytes."""

from __future__ import annotations

import io
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import (
    Event,
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    Session,
    SessionError,
    SQLStore,
    Store,
    new_id,
)
from durable_sessions.sql.transfer import export_jsonl, import_jsonl
from durable_sessions.state import MAX_ID_BYTES, MAX_ID_LENGTH, MAX_KEY_BYTES, MAX_KEY_LENGTH
from reliability.helpers import observe_org, reset_tables
from support.sql import snapshot


@pytest.fixture
def make_store(request: pytest.FixtureRequest, backend: str) -> Callable[[int | None], Store]:
    """Make a store of ``backend`` with a given ``max_value_bytes``."""
    if backend == "memory":
        return lambda limit: InMemoryStore(max_value_bytes=limit)
    engine = request.getfixturevalue("engine")
    return lambda limit: SQLStore(engine, max_value_bytes=limit)


async def test_values_over_the_limit_are_refused(
    make_store: Callable[[int | None], Store],
) -> None:
    store = make_store(100)
    manager = Manager(store, app_name="app")
    fits = "x" * 98  # 100 bytes as JSON, quotes included
    session = await manager.create("org", "alice", state={"k": fits})
    for key in ("big", "user:big", "app:big"):
        with pytest.raises(InvalidStateError, match="max_value_bytes"):
            await manager.create("org", "alice", state={key: fits + "y"})
        session.set(key, {"nested": [fits]})
        with pytest.raises(InvalidStateError, match="max_value_bytes"):
            await manager.save(session)
        session.delete(key)
    with pytest.raises(InvalidStateError, match="max_value_bytes"):
        await store.append_event("org", session.id, Event("user", content=fits + "é"))
    with pytest.raises(InvalidStateError, match="max_value_bytes"):
        await store.append_event("org", session.id, Event("user", state_delta={"k": fits * 2}))
    stored = await store.get("org", session.id)
    assert stored.state == {"k": fits}
    assert stored.version == 1
    assert await store.list_events("org", session.id) == []


async def test_the_limit_can_be_lifted(make_store: Callable[[int | None], Store]) -> None:
    store = make_store(None)
    big = "z" * (2 << 20)
    session = await Manager(store).create("org", "alice", state={"big": big})
    assert (await store.get("org", session.id)).state["big"] == big


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_nonsense_limit_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        InMemoryStore(max_value_bytes=bad)  # type: ignore[arg-type]


# -- ids and keys: limits in UTF-8 bytes that every index of every backend holds -------------

RNG = random.Random(12)


def emoji(size: int) -> str:
    """Random 4-byte characters (incompressible), padded with ASCII to ``size`` bytes."""
    return "".join(chr(RNG.randint(0x1F300, 0x1F64F)) for _ in range(size // 4)) + "e" * (size % 4)


def cjk(prefix: str, size: int) -> str:
    """``prefix`` and random 3-byte CJK characters, padded with ASCII to ``size`` bytes."""
    room = size - len(prefix.encode())
    wide = "".join(chr(RNG.randint(0x4E00, 0x9FFF)) for _ in range(room // 3))
    return prefix + wide + "k" * (room % 3)


def widest_ids() -> dict[str, str]:
    """Ids of exactly MAX_ID_BYTES, in 4-byte characters."""
    return {name: emoji(MAX_ID_BYTES) for name in ("org", "app", "user", "session", "fork")}


def widest_keys(tag: str) -> dict[str, str]:
    """A key of each stored scope of exactly MAX_KEY_BYTES, in 3-byte characters."""
    return {prefix: cjk(prefix + tag, MAX_KEY_BYTES) for prefix in ("", "user:", "app:")}


def test_the_widest_test_data_is_at_the_limits() -> None:
    ids, keys = widest_ids(), widest_keys("a")
    assert {len(v.encode()) for v in ids.values()} == {MAX_ID_BYTES}
    assert {len(v) for v in ids.values()} == {MAX_ID_BYTES // 4}
    assert MAX_ID_BYTES // 4 <= MAX_ID_LENGTH
    assert {len(k.encode()) for k in keys.values()} == {MAX_KEY_BYTES}
    assert all(len(k) <= MAX_KEY_LENGTH for k in keys.values())


async def observe(store: Store, engine: AsyncEngine | None, orgs: list[str]) -> Any:
    """Everything stored: every table on SQL stores, every org's API view in memory."""
    if engine is not None:
        return await snapshot(engine)
    return [await observe_org(store, org) for org in orgs]


async def test_ids_and_keys_at_the_byte_limits_are_stored_by_every_path(
    store: Store, engine_or_none: AsyncEngine | None
) -> None:
    """Four ids of 512 bytes of emoji and keys of 1,024 bytes of CJK in every scope go
    through create, save, append_event with a delta, fork, list and delete_user, and
    through export and import on SQL stores (Postgres' widest index entry, included)."""
    ids, first, second, third = widest_ids(), widest_keys("a"), widest_keys("b"), widest_keys("c")
    org, app, user = ids["org"], ids["app"], ids["user"]
    created = await store.create(
        Session(id=ids["session"], org_id=org, user_id=user, app_name=app,
                state={key: 1 for key in first.values()})
    )  # fmt: skip
    copy = await store.get(org, created.id)
    for key in second.values():
        copy.set(key, 2)
    await store.update(copy)
    event = Event(
        author=emoji(MAX_ID_BYTES), id=emoji(MAX_ID_BYTES), invocation_id=emoji(MAX_ID_BYTES),
        content={third[""]: "value"}, state_delta={key: 3 for key in third.values()},
    )  # fmt: skip
    await store.append_event(org, created.id, event)
    await store.fork(org, created.id, new_session_id=ids["fork"], with_events=True)
    expected = {key: n for n, keys in enumerate((first, second, third), 1) for key in keys.values()}
    stored = await store.get_with_events(org, ids["fork"])
    assert stored.state == {**expected, "forked_from": created.id}
    assert [(e.author, e.id, e.invocation_id) for e in stored.events] == [
        (event.author, event.id, event.invocation_id)
    ]
    listed = await store.list(Filter(org, user_id=user, app_name=app, parent_id=created.id))
    assert [s.id for s in listed] == [ids["fork"]]
    if isinstance(store, SQLStore):
        assert engine_or_none is not None
        out = io.BytesIO()
        await export_jsonl(store, out)
        await reset_tables(engine_or_none)
        counts = await import_jsonl(store, io.BytesIO(out.getvalue()))
        assert (counts.sessions, counts.events, counts.user_state, counts.app_state) == (2, 2, 3, 3)
        again = io.BytesIO()
        await export_jsonl(store, again)
        assert again.getvalue() == out.getvalue()
    assert await store.delete_user(org, user) == 2
    assert await store.list(Filter(org)) == []
    assert await store.get_shared_state(org, app, user) == {k: v for k, v in expected.items()
                                                            if k.startswith("app:")}  # fmt: skip


def over_id(name: str) -> tuple[str, str]:
    """An id one byte over the limit, and the message every store gives for it."""
    value = emoji(MAX_ID_BYTES) + "x"
    return value, (
        f"{name} is {MAX_ID_BYTES + 1} bytes as UTF-8, over the limit of {MAX_ID_BYTES} bytes "
        f"(ids have at most 255 characters and {MAX_ID_BYTES} bytes)"
    )


def over_key(prefix: str) -> tuple[str, str]:
    """A key one byte over the limit, and the message every store gives for it."""
    key = cjk(prefix, MAX_KEY_BYTES) + "x"
    return key, (
        f"invalid state key {key[:40] + '...'!r}: the key is {MAX_KEY_BYTES + 1} bytes as UTF-8, "
        f"over the limit of {MAX_KEY_BYTES} bytes (keys have at most 1024 characters and "
        f"{MAX_KEY_BYTES} bytes, scope prefix included)"
    )


async def test_one_byte_more_is_refused_alike_and_writes_nothing(
    store: Store, engine_or_none: AsyncEngine | None
) -> None:
    """An id or key one byte over its limit raises the same class with the same message
    on every store, from every path, and changes no table."""
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "alice", state={"k": 1, "user:u": 1, "app:a": 1})
    await store.append_event("org", session.id, Event("user", content="hello"))
    sid = session.id
    attempts: list[tuple[type[Exception], str, Callable[[], Awaitable[Any]]]] = []

    def refuse(error: type[Exception], message: str, call: Callable[[], Awaitable[Any]]) -> None:
        attempts.append((error, message, call))

    def new(**fields: Any) -> Session:
        return Session(**{"id": new_id(), "org_id": "org", "user_id": "alice", **fields})

    for field, name in (("org_id", "org_id"), ("id", "session_id"), ("user_id", "user_id"),
                        ("app_name", "app_name"), ("parent_id", "parent_id")):  # fmt: skip
        bad, message = over_id(name)
        refuse(InvalidArgumentError, message, lambda f=field, b=bad: store.create(new(**{f: b})))
    bad, message = over_id("org_id")
    refuse(InvalidArgumentError, message, lambda: store.get(bad, sid))
    refuse(InvalidArgumentError, message, lambda: store.list(Filter(bad)))
    refuse(InvalidArgumentError, message, lambda: store.delete_user(bad, "alice"))
    refuse(InvalidArgumentError, message, lambda: store.append_event(bad, sid, Event("u")))
    bad, message = over_id("session_id")
    refuse(InvalidArgumentError, message, lambda: store.append_event("org", bad, Event("u")))
    refuse(InvalidArgumentError, message, lambda: store.fork("org", bad))
    bad, message = over_id("user_id")
    refuse(InvalidArgumentError, message, lambda: store.list(Filter("org", user_id=bad)))
    refuse(InvalidArgumentError, message, lambda: store.delete_user("org", bad))
    bad, message = over_id("new_session_id")
    refuse(InvalidArgumentError, message, lambda: store.fork("org", sid, new_session_id=bad))
    for field, name in (("author", "event author"), ("id", "event id"),
                        ("invocation_id", "event invocation_id")):  # fmt: skip
        bad, message = over_id(name)
        event = Event(**{"author": "u", field: bad})
        refuse(InvalidArgumentError, message, lambda e=event: store.append_event("org", sid, e))
    for prefix in ("", "user:", "app:", "temp:"):
        key, message = over_key(prefix)
        refuse(InvalidStateError, message, lambda k=key: store.create(new(state={k: 1})))
        refuse(
            InvalidStateError, message,
            lambda k=key: store.append_event("org", sid, Event("u", state_delta={k: 1})),
        )  # fmt: skip

        async def save(key: str = key) -> None:
            copy = await store.get("org", sid)
            copy.state[key] = 1  # past Session.set, which refuses it earlier
            await store.update(copy)

        refuse(InvalidStateError, message, save)
    before = await observe(store, engine_or_none, ["org"])
    for error, message, call in attempts:
        with pytest.raises(SessionError) as caught:
            await call()
        assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
        assert str(caught.value) == message
    assert await observe(store, engine_or_none, ["org"]) == before
