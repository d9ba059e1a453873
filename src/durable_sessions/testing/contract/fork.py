"""Forks: a session copied into a new one."""

from __future__ import annotations

import pytest

from durable_sessions import (
    Event,
    Manager,
    SessionExistsError,
    SessionNotFoundError,
    Store,
)

from ._common import (
    APP,
    ORG,
    USER,
    ContractBase,
    parent_with_events,
    seqs,
)

__all__ = ["ForkContract"]


class ForkContract(ContractBase):
    """Forks."""

    async def test_fork_copies_private_state_and_records_the_parent(
        self, manager: Manager, store: Store
    ) -> None:
        parent = await parent_with_events(manager, store)

        child = await manager.fork(ORG, parent.id)

        assert child.id != parent.id
        assert child.parent_id == parent.id
        assert child.state == {"p": 1, "forked_from": parent.id, "user:u": 1, "app:a": 1}
        stored = await manager.get(ORG, child.id)
        assert (stored.parent_id, stored.state) == (parent.id, child.state)
        assert (stored.org_id, stored.user_id, stored.app_name) == (ORG, USER, APP)
        assert stored.version == 1
        assert await store.list_events(ORG, child.id) == []

    async def test_fork_leaves_the_parent_untouched(self, manager: Manager, store: Store) -> None:
        parent = await parent_with_events(manager, store)
        child = await manager.fork(ORG, parent.id, with_events=True)
        child.set("p", 2)
        child.set("child_only", True)
        await manager.save(child)
        await store.append_event(ORG, child.id, Event(author="user", content="child"))

        after = await manager.get(ORG, parent.id)
        assert after.state == parent.state
        assert (after.version, after.message_count, after.token_total) == (
            parent.version,
            parent.message_count,
            parent.token_total,
        )
        assert [e.content for e in await store.list_events(ORG, parent.id)] == ["m0", "m1", "m2"]

    async def test_fork_shares_user_and_app_state(self, manager: Manager, store: Store) -> None:
        parent = await parent_with_events(manager, store)
        child = await manager.fork(ORG, parent.id)

        parent.set("user:u", 2)
        parent.set("app:a", 2)
        await manager.save(parent)

        got = await manager.get(ORG, child.id)
        assert (got.state["user:u"], got.state["app:a"]) == (2, 2)

    async def test_fork_with_events_copies_the_transcript(
        self, manager: Manager, store: Store
    ) -> None:
        parent = await parent_with_events(manager, store)

        child = await manager.fork(ORG, parent.id, with_events=True)

        copied = await store.list_events(ORG, child.id)
        assert [(e.seq, e.content, e.author) for e in copied] == [
            (1, "m0", "user"),
            (2, "m1", "user"),
            (3, "m2", "user"),
        ]
        appended = await store.append_event(ORG, child.id, Event(author="user", content="next"))
        assert appended.seq == 4
        assert await seqs(store, ORG, parent.id) == [1, 2, 3]
        assert (await store.append_event(ORG, parent.id, Event(author="user"))).seq == 4

    async def test_fork_of_an_unknown_session_raises(self, manager: Manager) -> None:
        with pytest.raises(SessionNotFoundError):
            await manager.fork(ORG, "nope")

    async def test_fork_into_a_taken_id_raises_and_changes_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        parent = await parent_with_events(manager, store)
        taken = await manager.create(ORG, USER, state={"t": 1})
        with pytest.raises(SessionNotFoundError):  # another organisation's parent
            await store.fork("org-b", parent.id, new_session_id="fresh", with_events=True)
        with pytest.raises(SessionExistsError):
            await store.fork(ORG, parent.id, new_session_id=taken.id, with_events=True)

        got = await manager.get(ORG, taken.id)
        assert (got.state, got.version, got.parent_id) == (taken.state, 1, None)
        assert await store.list_events(ORG, taken.id) == []
        with pytest.raises(SessionNotFoundError):
            await manager.get("org-b", "fresh")
        assert len(await store.list_events(ORG, parent.id)) == 3
