"""Sessions: create and get, ids, owners and organisations, list, touch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    Manager,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SessionService,
    Store,
    derive_title,
)

from ._common import (
    APP,
    ORG,
    OTHER_APP,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
    is_utc,
    past,
    shared_state_of,
    twins,
)

__all__ = ["SessionsContract"]

EMPTY_ORG_CALLS: dict[str, Callable[[Store], Awaitable[Any]]] = {
    "store.create": lambda store: store.create(Session(id="s", org_id="", user_id=USER)),
    "store.get": lambda store: store.get("", "s"),
    "store.update": lambda store: store.update(Session(id="s", org_id="", user_id=USER)),
    "store.delete": lambda store: store.delete("", "s"),
    "store.append_event": lambda store: store.append_event("", "s", Event(author="user")),
    "store.list_events": lambda store: store.list_events("", "s"),
    "store.touch": lambda store: store.touch("", "s", messages=1),
    "store.fork": lambda store: store.fork("", "s"),
    "store.purge": lambda store: store.purge("", older_than=timedelta(0)),
    "store.delete_user": lambda store: store.delete_user("", USER),
    "manager.create": lambda store: Manager(store).create("", USER),
}


class SessionsContract(ContractBase):
    """Creation and ids, tenancy, listing and touches."""

    # -- create and get ---------------------------------------------------------------------------

    async def test_create_then_get_round_trips_a_session(self, manager: Manager) -> None:
        created = await manager.create(ORG, USER, state={"step": 1}, title="Lisbon trip")
        got = await manager.get(ORG, created.id)

        assert (got.id, got.org_id, got.user_id, got.app_name) == (created.id, ORG, USER, APP)
        assert got.title == "Lisbon trip"
        assert got.state == {"step": 1}
        assert (got.version, got.message_count, got.token_total) == (1, 0, 0)
        assert got.parent_id is None
        assert is_utc(got.created_at)
        assert is_utc(got.updated_at)
        assert got.created_at == created.created_at
        assert got.updated_at == created.updated_at
        assert abs(datetime.now(timezone.utc) - got.created_at) < timedelta(minutes=1)

    async def test_create_starts_counters_at_zero_whatever_the_object_says(
        self, store: Store
    ) -> None:
        given = Session(id="s", org_id=ORG, user_id=USER, message_count=5, token_total=7)
        created = await store.create(given)
        got = await store.get(ORG, "s")
        assert (created.message_count, created.token_total) == (0, 0)
        assert (got.message_count, got.token_total, got.version) == (0, 0, 1)

    async def test_create_uses_the_given_id(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER, id="my-own-id")
        assert session.id == "my-own-id"
        assert (await manager.get(ORG, "my-own-id")).user_id == USER

    async def test_create_with_a_taken_id_raises_and_keeps_the_original(
        self, manager: Manager
    ) -> None:
        original = await manager.create(ORG, USER, id="s1", state={"step": 1}, title="first")

        with pytest.raises(SessionExistsError):
            await manager.create(ORG, OTHER_USER, id="s1", state={"step": 2, "user:x": 1})

        got = await manager.get(ORG, "s1")
        assert (got.user_id, got.title, got.state, got.version) == (USER, "first", {"step": 1}, 1)
        assert got.created_at == original.created_at
        assert await shared_state_of(manager, ORG, OTHER_USER) == {}

    async def test_get_of_an_unknown_id_raises(self, manager: Manager) -> None:
        with pytest.raises(SessionNotFoundError):
            await manager.get(ORG, "nope")

    async def test_delete_of_an_unknown_id_raises(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        await manager.delete(ORG, session.id)
        with pytest.raises(SessionNotFoundError):
            await manager.delete(ORG, session.id)
        with pytest.raises(SessionNotFoundError):
            await manager.delete(ORG, "never-existed")

    async def test_a_delete_for_another_owner_deletes_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, id="owned", state={"p": 1})
        await store.append_event(ORG, session.id, Event(author="user", content="kept"))
        for owner in (
            {"user_id": OTHER_USER},
            {"app_name": OTHER_APP},
            {"app_name": OTHER_APP, "user_id": USER},
            {"app_name": "", "user_id": USER},
            {"app_name": APP, "user_id": OTHER_USER},
        ):
            with pytest.raises(SessionNotFoundError):
                await store.delete(ORG, session.id, **owner)
        with pytest.raises(InvalidArgumentError):
            await store.delete(ORG, session.id, user_id="")
        got = await store.get_with_events(ORG, session.id)
        assert (got.state, got.version) == ({"p": 1}, session.version + 1)
        assert [e.content for e in got.events] == ["kept"]
        with pytest.raises(SessionNotFoundError):  # the owner's id, in another organisation
            await store.delete(OTHER_ORG, session.id, app_name=APP, user_id=USER)
        await store.delete(ORG, session.id, app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await manager.get(ORG, session.id)
        with pytest.raises(SessionNotFoundError):
            await store.delete(ORG, session.id, app_name=APP, user_id=USER)
        again = await manager.create(ORG, USER, id="owned")  # the transcript went too
        assert await store.list_events(ORG, again.id) == []
        # Either one alone narrows too.
        for owner in ({"user_id": USER}, {"app_name": APP}):
            other = await manager.create(ORG, USER)
            await store.delete(ORG, other.id, **owner)
            with pytest.raises(SessionNotFoundError):
                await manager.get(ORG, other.id)

    async def test_save_of_a_deleted_session_raises(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        await manager.delete(ORG, session.id)
        session.set("k", 1)
        with pytest.raises(SessionNotFoundError):
            await manager.save(session)

    async def test_the_same_id_in_two_orgs_is_two_independent_sessions(
        self, manager: Manager
    ) -> None:
        await twins(manager)
        a = await manager.get(ORG, "twin")
        a.set("p", "a2")
        a.set("user:u", "a2")
        a.set("app:x", "a2")
        await manager.save(a)

        b = await manager.get(OTHER_ORG, "twin")
        assert (b.title, b.state) == ("B", {"p": "b", "user:u": "b", "app:x": "b"})
        assert (await manager.get(ORG, "twin")).state == {"p": "a2", "user:u": "a2", "app:x": "a2"}

    async def test_events_never_cross_orgs(self, manager: Manager, store: Store) -> None:
        await twins(manager)
        await store.append_event(ORG, "twin", Event(author="user", content="a"))

        assert await store.list_events(OTHER_ORG, "twin") == []
        appended = await store.append_event(OTHER_ORG, "twin", Event(author="user", content="b"))
        assert appended.seq == 1
        assert [e.content for e in await store.list_events(ORG, "twin")] == ["a"]

    async def test_list_and_delete_never_cross_orgs(self, manager: Manager) -> None:
        await twins(manager)
        assert [s.title for s in await manager.list(Filter(ORG))] == ["A"]

        await manager.delete(ORG, "twin")

        assert (await manager.get(OTHER_ORG, "twin")).state["p"] == "b"
        assert [s.title for s in await manager.list(Filter(OTHER_ORG))] == ["B"]

    async def test_purge_and_delete_user_never_cross_orgs(self, manager: Manager) -> None:
        await twins(manager)
        await past((await manager.get(ORG, "twin")).updated_at)

        assert await manager.purge(ORG, older_than=timedelta(0)) == 1
        assert await manager.delete_user(ORG, USER) == 0

        b = await manager.get(OTHER_ORG, "twin")
        assert b.state == {"p": "b", "user:u": "b", "app:x": "b"}

    @pytest.mark.parametrize("call", sorted(EMPTY_ORG_CALLS))
    async def test_an_empty_org_id_is_refused(self, store: Store, call: str) -> None:
        with pytest.raises(InvalidArgumentError):
            await EMPTY_ORG_CALLS[call](store)

    async def test_an_empty_org_id_in_a_filter_or_service_is_refused(self, store: Store) -> None:
        with pytest.raises(InvalidArgumentError):
            Filter(org_id="")
        with pytest.raises(InvalidArgumentError):
            SessionService(store, org_id="")

    async def test_an_empty_org_id_scans_nothing(self, manager: Manager) -> None:
        await manager.create(ORG, USER)
        with pytest.raises(InvalidArgumentError):
            await manager.purge("", older_than=timedelta(0))
        assert len(await manager.list(Filter(ORG))) == 1

    # -- list -------------------------------------------------------------------------------------

    async def test_list_is_newest_updated_first(self, manager: Manager) -> None:
        ids = []
        for _ in range(3):
            ids.append((await manager.create(ORG, USER)).id)
            await past((await manager.get(ORG, ids[-1])).updated_at)
        assert [s.id for s in await manager.list(Filter(ORG))] == ids[::-1]

        await manager.touch(await manager.get(ORG, ids[0]))

        assert [s.id for s in await manager.list(Filter(ORG))] == [ids[0], ids[2], ids[1]]

    async def test_list_returns_metadata_only(self, manager: Manager, store: Store) -> None:
        session = await manager.create(
            ORG, USER, state={"p": 1, "user:u": 2, "app:a": 3}, title="T"
        )
        await store.append_event(ORG, session.id, Event(author="user", content="hi", tokens=7))

        (listed,) = await manager.list(Filter(ORG))

        assert listed.state == {}
        assert listed.events == []
        assert (listed.id, listed.user_id, listed.app_name, listed.title) == (
            session.id,
            USER,
            APP,
            "T",
        )
        assert (listed.message_count, listed.token_total) == (1, 7)

    async def test_list_honours_limit_and_zero_means_all(self, manager: Manager) -> None:
        ids = []
        for _ in range(5):
            ids.append((await manager.create(ORG, USER)).id)
            await past((await manager.get(ORG, ids[-1])).updated_at)

        assert [s.id for s in await manager.list(Filter(ORG, limit=2))] == ids[:2:-1]
        assert len(await manager.list(Filter(ORG, limit=0))) == 5
        assert len(await manager.list(Filter(ORG, limit=50))) == 5

    async def test_list_filters_by_user_app_and_parent(
        self, manager: Manager, store: Store
    ) -> None:
        mine = await manager.create(ORG, USER)
        theirs = await manager.create(ORG, OTHER_USER)
        other_app = await Manager(store, app_name=OTHER_APP).create(ORG, USER)
        child = await manager.fork(ORG, mine.id)

        def ids(sessions: list[Session]) -> set[str]:
            return {s.id for s in sessions}

        assert ids(await manager.list(Filter(ORG, user_id=USER))) == {
            mine.id,
            other_app.id,
            child.id,
        }
        assert ids(await manager.list(Filter(ORG, user_id=OTHER_USER))) == {theirs.id}
        assert ids(await manager.list(Filter(ORG, app_name=OTHER_APP))) == {other_app.id}
        assert ids(await manager.list(Filter(ORG, app_name=APP))) == {mine.id, theirs.id, child.id}
        assert ids(await manager.list(Filter(ORG, user_id=OTHER_USER, app_name=OTHER_APP))) == set()
        assert ids(await manager.list(Filter(ORG, parent_id=mine.id))) == {child.id}
        assert ids(await manager.list(Filter(ORG))) == {mine.id, theirs.id, other_app.id, child.id}

    # -- touch ------------------------------------------------------------------------------------

    async def test_touch_adds_to_the_counters(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        await manager.touch(session, messages=2, tokens=10)
        await manager.touch(session, messages=1, tokens=5)

        got = await manager.get(ORG, session.id)
        assert (got.message_count, got.token_total) == (3, 15)
        assert (session.message_count, session.token_total) == (3, 15)

    async def test_touch_titles_an_untitled_session_from_the_first_message(
        self, manager: Manager
    ) -> None:
        message = "Please help me plan a two week trip through Portugal and Spain in late spring"
        session = await manager.create(ORG, USER)

        await manager.touch(session, first_message=message)

        assert session.title == derive_title(message)
        assert (await manager.get(ORG, session.id)).title == derive_title(message)
        assert [s.title for s in await manager.list(Filter(ORG))] == [derive_title(message)]

    async def test_touch_never_retitles_a_titled_session(self, manager: Manager) -> None:
        titled = await manager.create(ORG, USER, title="Mine")
        await manager.touch(titled, first_message="Something else entirely")
        assert (await manager.get(ORG, titled.id)).title == "Mine"

        untitled = await manager.create(ORG, USER)
        a = await manager.get(ORG, untitled.id)
        b = await manager.get(ORG, untitled.id)  # also untitled when loaded
        await manager.touch(a, first_message="First question")
        await manager.touch(b, first_message="Second question")

        assert (await manager.get(ORG, untitled.id)).title == "First question"
        assert b.title == "First question"

    async def test_touch_keeps_a_title_set_on_the_object(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        session.title = "Chosen"

        await manager.touch(session, first_message="Something else")
        await manager.save(session)

        assert session.title == "Chosen"
        assert (await manager.get(ORG, session.id)).title == "Chosen"

    async def test_touch_moves_version_and_updated_at_and_a_later_save_works(
        self,
        manager: Manager,
    ) -> None:
        session = await manager.create(ORG, USER)
        before = await manager.get(ORG, session.id)
        await past(before.updated_at)

        await manager.touch(session, messages=1, tokens=1, first_message="hello")

        after = await manager.get(ORG, session.id)
        assert after.version == before.version + 1
        assert after.updated_at > before.updated_at
        session.set("k", 1)
        await manager.save(session)
        assert (await manager.get(ORG, session.id)).state == {"k": 1}

    async def test_touch_of_an_unknown_session_raises(self, manager: Manager, store: Store) -> None:
        with pytest.raises(SessionNotFoundError):
            await store.touch(ORG, "nope", messages=1)

    async def test_concurrent_touches_lose_no_increment(self, manager: Manager) -> None:
        session = await manager.create(ORG, USER)
        copies = [await manager.get(ORG, session.id) for _ in range(20)]

        await asyncio.gather(*(manager.touch(c, messages=1, tokens=3) for c in copies))

        got = await manager.get(ORG, session.id)
        assert (got.message_count, got.token_total, got.version) == (20, 60, 21)
