"""``Store.discard_events`` (a truncation answering a count) and ``delete_user(dry_run=True)``,
alike on every store."""

from __future__ import annotations

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    Manager,
    SessionNotFoundError,
    StaleSessionError,
    Store,
)


async def test_discard_events_removes_as_truncate_does_and_returns_the_count(
    store: Store,
) -> None:
    manager = Manager(store)
    session = await manager.create("acme", "ada")
    events = [Event("ada", {"n": n}, tokens=n) for n in range(1, 6)]
    await store.append_events("acme", session.id, events)
    before = await store.get("acme", session.id)

    assert await store.discard_events("acme", session.id, after_seq=3) == 2
    after = await store.get("acme", session.id)
    assert [e.seq for e in await store.list_events("acme", session.id)] == [1, 2, 3]
    assert (after.message_count, after.token_total) == (3, 1 + 2 + 3)
    assert after.version == before.version + 1
    (next_one,) = await store.append_events("acme", session.id, [Event("ada", "again")])
    assert next_one.seq == 4  # seqs stay gapless

    assert await store.discard_events("acme", session.id, after_seq=0) == 4
    cleared = await store.get("acme", session.id)
    assert await store.list_events("acme", session.id) == []
    assert (cleared.message_count, cleared.token_total) == (0, 0)
    assert await store.discard_events("acme", session.id, after_seq=0) == 0
    assert await store.discard_events("acme", session.id, after_seq=99) == 0


async def test_discard_events_is_guarded_and_checks_its_arguments(store: Store) -> None:
    session = await Manager(store).create("acme", "ada")
    await store.append_events("acme", session.id, [Event("ada", "x"), Event("ada", "y")])
    current = await store.get("acme", session.id)
    with pytest.raises(StaleSessionError):
        await store.discard_events(
            "acme", session.id, after_seq=0, expected_version=current.version - 1
        )
    with pytest.raises(StaleSessionError):
        await store.discard_events("acme", session.id, after_seq=0, incarnation="another-life")
    with pytest.raises(SessionNotFoundError):
        await store.discard_events("acme", "missing", after_seq=0)
    with pytest.raises(InvalidArgumentError):
        await store.discard_events("acme", session.id, after_seq=-1)
    assert len(await store.list_events("acme", session.id)) == 2  # nothing was removed
    assert (
        await store.discard_events(
            "acme",
            session.id,
            after_seq=1,
            expected_version=current.version,
            incarnation=current.incarnation,
        )
        == 1
    )


async def test_delete_user_dry_run_counts_and_deletes_nothing(store: Store) -> None:
    manager = Manager(store)
    for _ in range(3):
        await manager.create("acme", "ada", state={"user:lang": "en"})
    await manager.create("acme", "bob")
    await manager.create("other", "ada")

    assert await store.delete_user("acme", "ada", dry_run=True) == 3
    assert await store.delete_user("acme", "nobody", dry_run=True) == 0
    assert len(await manager.list(Filter("acme", user_id="ada"))) == 3
    assert (await store.get_shared_state("acme", "", "ada")) == {"user:lang": "en"}
    assert await store.delete_user("acme", "ada") == 3
    assert await store.delete_user("acme", "ada", dry_run=True) == 0
    assert await store.get_shared_state("acme", "", "ada") == {}
    with pytest.raises(InvalidArgumentError):
        await store.delete_user("", "ada", dry_run=True)
