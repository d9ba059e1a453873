"""State: scopes, and saves that write deltas optimistically."""

from __future__ import annotations

import pytest

from durable_sessions import (
    Event,
    Filter,
    Manager,
    StaleSessionError,
    Store,
)

from ._common import (
    ORG,
    OTHER_APP,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
    shared_state_of,
)

__all__ = ["StateContract"]


class StateContract(ContractBase):
    """Scoped state and optimistic saves."""

    # -- state scoping ----------------------------------------------------------------------------

    async def test_private_state_belongs_to_one_session(self, manager: Manager) -> None:
        first = await manager.create(ORG, USER)
        second = await manager.create(ORG, USER)
        first.set("draft", "hello")
        await manager.save(first)

        assert "draft" not in (await manager.get(ORG, second.id)).state
        assert (await manager.get(ORG, first.id)).state["draft"] == "hello"

    async def test_user_state_is_shared_by_one_users_sessions_of_one_app(
        self, manager: Manager, store: Store
    ) -> None:
        first = await manager.create(ORG, USER)
        second = await manager.create(ORG, USER)
        first.set("user:lang", "pt")
        await manager.save(first)

        assert (await manager.get(ORG, second.id)).state["user:lang"] == "pt"
        assert (await manager.create(ORG, USER)).state["user:lang"] == "pt"
        assert await shared_state_of(manager, ORG, OTHER_USER) == {}
        assert await shared_state_of(Manager(store, app_name=OTHER_APP), ORG, USER) == {}
        assert await shared_state_of(manager, OTHER_ORG, USER) == {}

    async def test_app_state_is_shared_by_one_apps_sessions_in_one_org(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        session.set("app:model", "small")
        await manager.save(session)

        assert await shared_state_of(manager, ORG, OTHER_USER) == {"app:model": "small"}
        assert await shared_state_of(Manager(store, app_name=OTHER_APP), ORG, USER) == {}
        assert await shared_state_of(manager, OTHER_ORG, USER) == {}

    async def test_temp_state_is_visible_on_the_object_but_never_stored(
        self, manager: Manager
    ) -> None:
        session = await manager.create(ORG, USER, state={"temp:a": 1, "kept": 1})
        session.set("temp:b", 2)
        await manager.save(session)

        assert session.get("temp:a") == 1
        assert session.get("temp:b") == 2
        assert (await manager.get(ORG, session.id)).state == {"kept": 1}

    # -- saving writes deltas, optimistically -----------------------------------------------------

    async def test_a_stale_copy_never_overwrites_a_newer_shared_value(
        self, manager: Manager
    ) -> None:
        first = await manager.create(ORG, USER, state={"user:x": "old"})
        second = await manager.create(ORG, USER)
        b = await manager.get(ORG, second.id)  # loaded now: holds user:x == "old"
        a = await manager.get(ORG, first.id)
        a.set("user:x", "new")
        await manager.save(a)

        b.set("note", "unrelated")
        await manager.save(b)

        assert (await manager.get(ORG, second.id)).state == {"user:x": "new", "note": "unrelated"}
        assert (await manager.get(ORG, first.id)).state["user:x"] == "new"

    async def test_shared_and_private_keys_can_be_deleted(self, manager: Manager) -> None:
        first = await manager.create(ORG, USER, state={"user:x": 1, "app:y": 2, "p": 3})
        other = await manager.get(ORG, (await manager.create(ORG, USER)).id)
        other.delete("user:x")
        other.delete("app:y")
        await manager.save(other)
        first = await manager.get(ORG, first.id)
        first.delete("p")
        await manager.save(first)

        assert (await manager.get(ORG, first.id)).state == {}
        assert await shared_state_of(manager, ORG, USER) == {}

    async def test_the_first_save_wins_and_the_stale_save_writes_nothing(
        self, manager: Manager
    ) -> None:
        session = await manager.create(ORG, USER)
        a = await manager.get(ORG, session.id)
        b = await manager.get(ORG, session.id)
        a.set("from_a", 1)
        await manager.save(a)

        b.set("from_b", 2)
        b.set("user:from_b", 2)
        b.set("app:from_b", 2)
        with pytest.raises(StaleSessionError):
            await manager.save(b)

        got = await manager.get(ORG, session.id)
        assert (got.state, got.version) == ({"from_a": 1}, 2)
        assert await shared_state_of(manager, ORG, USER) == {}

    async def test_saving_the_same_object_again_works(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        session.set("a", 1)
        await manager.save(session)
        session.set("b", 2)
        await manager.save(session)
        session.delete("a")
        await manager.save(session)

        got = await manager.get(ORG, session.id)
        assert (got.state, got.version) == ({"b": 2}, 4)
        assert session.version == 4

    async def test_a_copy_naming_another_owner_saves_where_its_session_belongs(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(
            ORG, USER, state={"p": 1, "user:u": 1, "user:gone": 1, "app:a": 1}
        )
        copy = await manager.get(ORG, session.id)
        copy.user_id, copy.app_name = OTHER_USER, OTHER_APP  # edited: not what is stored
        copy.set("p", 2)
        copy.set("user:u", 2)
        copy.set("app:a", 2)
        copy.delete("user:gone")
        copy.title = "Renamed"
        await manager.save(copy)

        got = await manager.get(ORG, session.id)
        assert (got.user_id, got.app_name) == (USER, session.app_name)
        assert (got.state, got.title) == ({"p": 2, "user:u": 2, "app:a": 2}, "Renamed")
        assert await shared_state_of(manager, ORG, OTHER_USER) == {"app:a": 2}
        assert await shared_state_of(Manager(store, app_name=OTHER_APP), ORG, OTHER_USER) == {}

    async def test_a_copy_read_before_its_id_was_made_again_saves_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        first = await manager.create(ORG, USER, state={"p": 1, "user:u": 1})
        copy = await manager.get(ORG, first.id)
        await store.delete(ORG, first.id)
        again = await manager.create(ORG, OTHER_USER, id=first.id, state={"p": "new"})
        copy.set("p", 2)
        copy.set("user:u", 2)
        copy.title = "Renamed"
        with pytest.raises(StaleSessionError):
            await manager.save(copy)

        got = await manager.get(ORG, first.id)
        assert (got.user_id, got.state, got.title) == (OTHER_USER, {"p": "new"}, "")
        assert got.version == again.version
        assert await shared_state_of(manager, ORG, USER) == {"user:u": 1}
        assert await shared_state_of(manager, ORG, OTHER_USER) == {}

    async def test_save_writes_the_title(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        session.title = "Renamed"
        await manager.save(session)
        assert (await manager.get(ORG, session.id)).title == "Renamed"

    async def test_returned_sessions_are_copies(self, manager: Manager, store: Store) -> None:
        created = await manager.create(ORG, USER, state={"nested": {"items": [1]}, "user:u": [1]})
        created.state["nested"]["items"].append(2)
        created.title = "changed"
        got = await manager.get(ORG, created.id)
        got.state["nested"]["items"].append(3)
        got.state["user:u"].append(3)
        got.state["extra"] = 1
        (listed,) = await manager.list(Filter(ORG))
        listed.title = "changed too"
        await store.append_event(ORG, created.id, Event(author="user", content={"text": ["hi"]}))
        (event,) = await store.list_events(ORG, created.id)
        event.content["text"].append("changed")

        fresh = await manager.get(ORG, created.id)
        assert fresh.state == {"nested": {"items": [1]}, "user:u": [1]}
        assert fresh.title == ""
        assert (await store.list_events(ORG, created.id))[0].content == {"text": ["hi"]}
