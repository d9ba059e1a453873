"""The configurable size limit on state values and event content, on every store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_sessions import (
    Event,
    InMemoryStore,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    SQLStore,
    Store,
)


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
