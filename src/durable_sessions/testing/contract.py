"""The Store contract, shipped: one suite that any ``Store`` implementation can run."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    Page,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SessionService,
    StaleSessionError,
    Store,
    derive_title,
)

__all__ = ["StoreContract"]

ORG = "org-a"
OTHER_ORG = "org-b"
USER = "alice"
OTHER_USER = "bob"
APP = "travel"
OTHER_APP = "billing"


def is_utc(moment: datetime) -> bool:
    return moment.tzinfo is not None and moment.utcoffset() == timedelta(0)


async def shared_state_of(manager: Manager, org_id: str, user_id: str) -> dict[str, Any]:
    """The user: and app: state a brand-new session of this user sees."""
    fresh = await manager.create(org_id, user_id)
    return {k: v for k, v in fresh.state.items() if k.startswith(("user:", "app:"))}


async def seqs(store: Store, org_id: str, session_id: str, **kwargs: Any) -> list[int]:
    return [e.seq for e in await store.list_events(org_id, session_id, **kwargs)]


# -- tenancy ----------------------------------------------------------------------------------


async def _twins(manager: Manager) -> tuple[Session, Session]:
    """The same session id, user and app in two organisations, with different state."""
    a = await manager.create(
        ORG, USER, id="twin", state={"p": "a", "user:u": "a", "app:x": "a"}, title="A"
    )
    b = await manager.create(
        OTHER_ORG, USER, id="twin", state={"p": "b", "user:u": "b", "app:x": "b"}, title="B"
    )
    return a, b


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


async def _five_events(store: Store, session_id: str) -> list[datetime]:
    base = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    stamps = [base + timedelta(seconds=i) for i in range(5)]
    for i, stamp in enumerate(stamps):
        await store.append_event(
            ORG, session_id, Event(author="user", content=f"m{i}", timestamp=stamp)
        )
    return stamps


# -- fork -------------------------------------------------------------------------------------


async def _parent(manager: Manager, store: Store) -> Session:
    parent = await manager.create(ORG, USER, state={"p": 1, "user:u": 1, "app:a": 1})
    for i in range(3):
        await store.append_event(ORG, parent.id, Event(author="user", content=f"m{i}", tokens=2))
    return await manager.get(ORG, parent.id)


class StoreContract:
    """The ``Store`` contract as a pytest test class: subclass it and give it a ``store``.

    Every test takes a fixture named ``store`` returning an empty store of the kind under
    test (a fresh one per test) and checks what every ``Store`` must do: creation and ids,
    tenancy, optimistic saves and conflicts, scoped state, counters, transcripts and their
    reads, forks, retention and the refusals of bad input. The in-memory and SQL stores of
    this package run through it unchanged; so can yours::

        import pytest
        from durable_sessions.testing import StoreContract

        class TestMyStore(StoreContract):
            @pytest.fixture
            def store(self) -> MyStore:
                return MyStore()

    The tests are coroutines: run them with pytest-asyncio (``asyncio_mode = "auto"``, or
    the ``asyncio`` mark, which this class carries). Install the ``testing`` extra.
    """

    pytestmark = pytest.mark.asyncio

    @pytest.fixture
    def manager(self, store: Store) -> Manager:
        """A Manager of the app under test, over the store under test."""
        return Manager(store, app_name=APP)

    @pytest.fixture
    def service(self, store: Store) -> SessionService:
        """An ADK-style SessionService over the store under test."""
        return SessionService(store)

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
        await _twins(manager)
        a = await manager.get(ORG, "twin")
        a.set("p", "a2")
        a.set("user:u", "a2")
        a.set("app:x", "a2")
        await manager.save(a)

        b = await manager.get(OTHER_ORG, "twin")
        assert (b.title, b.state) == ("B", {"p": "b", "user:u": "b", "app:x": "b"})
        assert (await manager.get(ORG, "twin")).state == {"p": "a2", "user:u": "a2", "app:x": "a2"}

    async def test_events_never_cross_orgs(self, manager: Manager, store: Store) -> None:
        await _twins(manager)
        await store.append_event(ORG, "twin", Event(author="user", content="a"))

        assert await store.list_events(OTHER_ORG, "twin") == []
        appended = await store.append_event(OTHER_ORG, "twin", Event(author="user", content="b"))
        assert appended.seq == 1
        assert [e.content for e in await store.list_events(ORG, "twin")] == ["a"]

    async def test_list_and_delete_never_cross_orgs(self, manager: Manager) -> None:
        await _twins(manager)
        assert [s.title for s in await manager.list(Filter(ORG))] == ["A"]

        await manager.delete(ORG, "twin")

        assert (await manager.get(OTHER_ORG, "twin")).state["p"] == "b"
        assert [s.title for s in await manager.list(Filter(OTHER_ORG))] == ["B"]

    async def test_purge_and_delete_user_never_cross_orgs(self, manager: Manager) -> None:
        await _twins(manager)
        await asyncio.sleep(0.002)

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

    # -- list -------------------------------------------------------------------------------------

    async def test_list_is_newest_updated_first(self, manager: Manager) -> None:
        ids = []
        for _ in range(3):
            ids.append((await manager.create(ORG, USER)).id)
            await asyncio.sleep(0.002)
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
            await asyncio.sleep(0.002)

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
        await asyncio.sleep(0.002)

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

    # -- events -----------------------------------------------------------------------------------

    async def test_append_event_assigns_seqs_and_returns_the_stored_event(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        sent = Event(
            author="agent",
            content={"text": "hi"},
            invocation_id="inv-1",
            state_delta={"p": 1, "temp:scratch": 2},
            tokens=5,
        )

        first = await store.append_event(ORG, session.id, sent)
        second = await store.append_event(ORG, session.id, Event(author="user"))
        third = await store.append_event(ORG, session.id, Event(author="user"))

        assert [first.seq, second.seq, third.seq] == [1, 2, 3]
        assert (first.id, first.author, first.invocation_id) == (sent.id, "agent", "inv-1")
        assert (first.content, first.tokens, first.timestamp) == ({"text": "hi"}, 5, sent.timestamp)
        assert first.state_delta == {"p": 1}
        assert await seqs(store, ORG, session.id) == [1, 2, 3]

    async def test_append_event_applies_the_delta_by_scope(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        delta = {"p": 1, "user:u": 2, "app:a": 3, "temp:t": 4}

        await store.append_event(ORG, session.id, Event(author="agent", state_delta=delta))

        assert (await manager.get(ORG, session.id)).state == {"p": 1, "user:u": 2, "app:a": 3}
        assert await shared_state_of(manager, ORG, USER) == {"user:u": 2, "app:a": 3}
        assert await shared_state_of(manager, ORG, OTHER_USER) == {"app:a": 3}
        (stored,) = await store.list_events(ORG, session.id)
        assert stored.state_delta == {"p": 1, "user:u": 2, "app:a": 3}

    async def test_append_event_counts_messages_and_tokens_and_moves_version(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for tokens in (3, 0, 10):
            before = await manager.get(ORG, session.id)
            await store.append_event(ORG, session.id, Event(author="user", tokens=tokens))
            after = await manager.get(ORG, session.id)
            assert after.message_count == before.message_count + 1
            assert after.token_total == before.token_total + tokens
            assert after.version > before.version

        # A copy loaded before the appends is now stale.
        session.set("k", 1)
        with pytest.raises(StaleSessionError):
            await manager.save(session)

    async def test_list_events_is_oldest_first_and_limit_keeps_the_newest(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await _five_events(store, session.id)

        events = await store.list_events(ORG, session.id)
        assert [e.content for e in events] == ["m0", "m1", "m2", "m3", "m4"]
        assert await seqs(store, ORG, session.id, limit=2) == [4, 5]
        assert await seqs(store, ORG, session.id, limit=9) == [1, 2, 3, 4, 5]
        assert await store.list_events(ORG, session.id, limit=0) == []

    async def test_list_events_after_keeps_strictly_later_events(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        stamps = await _five_events(store, session.id)

        assert await seqs(store, ORG, session.id, after=stamps[2]) == [4, 5]
        assert await seqs(store, ORG, session.id, after=stamps[2] - timedelta(microseconds=1)) == [
            3,
            4,
            5,
        ]
        plus_two = timezone(timedelta(hours=2))
        assert await seqs(store, ORG, session.id, after=stamps[3].astimezone(plus_two)) == [5]
        assert await seqs(store, ORG, session.id, after=stamps[1], limit=1) == [5]
        assert await store.list_events(ORG, session.id, after=stamps[4]) == []

    async def test_list_events_refuses_a_naive_after(self, manager: Manager, store: Store) -> None:
        session = await manager.create(ORG, USER)
        with pytest.raises(InvalidArgumentError):
            await store.list_events(ORG, session.id, after=datetime(2024, 1, 1))

    async def test_list_events_of_an_unknown_session_raises(self, store: Store) -> None:
        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, "nope")

    async def test_append_event_to_an_unknown_session_raises(self, store: Store) -> None:
        with pytest.raises(SessionNotFoundError):
            await store.append_event(ORG, "nope", Event(author="user"))

    @pytest.mark.parametrize(
        "content",
        [
            None,
            True,
            0,
            -7,
            2.5,
            "plain text, ünïcödé 🌍",
            "",
            [],
            {},
            [1, "two", None, 3.5, False],
            {
                "role": "model",
                "parts": [{"text": "hi"}, {"function_call": {"name": "f", "args": {}}}],
            },
        ],
    )
    async def test_event_content_of_any_json_value_round_trips(
        self, manager: Manager, store: Store, content: Any
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_event(ORG, session.id, Event(author="user", content=content))

        (event,) = await store.list_events(ORG, session.id)
        assert event.content == content
        assert type(event.content) is type(content)

    @pytest.mark.parametrize("incarnation", [5, b"x", "a\x00b", "\ud800", "i" * 300])
    async def test_a_malformed_incarnation_is_refused_alike_and_writes_nothing(
        self, manager: Manager, store: Store, incarnation: Any
    ) -> None:
        session = await manager.create(ORG, USER)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.append_event(ORG, session.id, Event("u"), incarnation=incarnation),
            lambda: store.append_events(ORG, session.id, [Event("u")], incarnation=incarnation),
            lambda: store.touch(ORG, session.id, messages=1, incarnation=incarnation),
            lambda: store.truncate_events(ORG, session.id, after_seq=0, incarnation=incarnation),
            lambda: store.pop_event(ORG, session.id, incarnation=incarnation),
        ]
        for call in calls:
            with pytest.raises(InvalidArgumentError, match="incarnation"):
                await call()
        got = await manager.get(ORG, session.id)
        assert (got.version, got.message_count) == (1, 0)
        assert await store.list_events(ORG, session.id) == []

    async def test_subclasses_of_str_int_and_float_come_back_as_plain_values(
        self, manager: Manager, store: Store
    ) -> None:
        # Enums and other subclasses are stored as their values, and every store reads
        # back plain str, int and float, as SQL does, in contents, deltas and state.
        class Color(str, enum.Enum):
            RED = "red"

        class Level(enum.IntEnum):
            HIGH = 3

        class Ratio(float):
            pass

        given = {Color.RED: [Color.RED, Level.HIGH, Ratio(0.5), True], "n": {"k": Level.HIGH}}
        plain = {"red": ["red", 3, 0.5, True], "n": {"k": 3}}

        def types(value: Any) -> Any:
            if isinstance(value, dict):
                return {type(k).__name__ + k: types(v) for k, v in value.items()}
            if isinstance(value, list):
                return [types(v) for v in value]
            return type(value).__name__

        session = await manager.create(ORG, USER, state={"s": given})
        await store.append_event(
            ORG, session.id, Event(author="user", content=given, state_delta={"d": given})
        )
        await store.append_events(ORG, session.id, [Event(author="user", content=given)])
        (popped,) = await store.truncate_events(ORG, session.id, after_seq=1)
        (event,) = await store.list_events(ORG, session.id)
        got = await manager.get(ORG, session.id)
        read = [
            event.content, event.state_delta["d"], popped.content, got.state["s"],
            got.state["d"], *(await store.list_event_contents(ORG, session.id)),
        ]  # fmt: skip
        assert read == [plain] * 6
        assert [types(value) for value in read] == [types(plain)] * 6

    @pytest.mark.parametrize("hours", [0, 2, -5, 5.5])
    async def test_event_timestamps_come_back_equal_and_in_utc(
        self, manager: Manager, store: Store, hours: float
    ) -> None:
        session = await manager.create(ORG, USER)
        given = datetime(2024, 3, 9, 23, 30, 15, 123456, tzinfo=timezone(timedelta(hours=hours)))
        await store.append_event(ORG, session.id, Event(author="user", timestamp=given))
        await store.append_event(ORG, session.id, Event(author="user"))

        stored, defaulted = await store.list_events(ORG, session.id)
        assert stored.timestamp == given
        assert is_utc(stored.timestamp)
        assert is_utc(defaulted.timestamp)

    async def test_a_refused_event_writes_nothing(self, manager: Manager, store: Store) -> None:
        session = await manager.create(ORG, USER)
        with pytest.raises(InvalidStateError):
            await store.append_event(
                ORG,
                session.id,
                Event(author="user", content=float("nan"), state_delta={"p": 1}, tokens=5),
            )

        got = await manager.get(ORG, session.id)
        assert (got.message_count, got.token_total, got.version, got.state) == (0, 0, 1, {})
        assert await store.list_events(ORG, session.id) == []
        assert (await store.append_event(ORG, session.id, Event(author="user"))).seq == 1

    async def test_concurrent_appends_get_gapless_seqs_and_keep_every_key(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)

        async def writer(task: int) -> None:
            for i in range(25):
                event = Event(author=f"task-{task}", state_delta={f"k{task}-{i}": i}, tokens=1)
                await store.append_event(ORG, session.id, event)

        await asyncio.gather(*(writer(t) for t in range(8)))

        assert await seqs(store, ORG, session.id) == list(range(1, 201))
        got = await manager.get(ORG, session.id)
        assert got.state == {f"k{t}-{i}": i for t in range(8) for i in range(25)}
        assert (got.message_count, got.token_total) == (200, 200)

    # -- SessionService (ADK style) ---------------------------------------------------------------

    async def test_service_create_with_and_without_an_id(self, service: SessionService) -> None:
        generated = await service.create(app_name=APP, user_id=USER, state={"p": 1, "user:u": 2})
        chosen = await service.create(app_name=APP, user_id=USER, session_id="chosen")

        assert generated.id
        assert generated.id != chosen.id
        assert chosen.id == "chosen"
        got = await service.get(app_name=APP, user_id=USER, session_id=generated.id)
        assert got.state == {"p": 1, "user:u": 2}
        assert (await service.get(app_name=APP, user_id=USER, session_id="chosen")).state == {
            "user:u": 2
        }
        with pytest.raises(SessionExistsError):
            await service.create(app_name=APP, user_id=USER, session_id="chosen")

    async def test_service_get_loads_events(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        base = datetime(2024, 5, 1, tzinfo=timezone.utc)
        for i in range(4):
            event = Event(author="user", content=i, timestamp=base + timedelta(minutes=i))
            await service.append_event(session.id, event)

        def contents(s: Session) -> list[Any]:
            return [e.content for e in s.events]

        full = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        recent = await service.get(
            app_name=APP, user_id=USER, session_id=session.id, num_recent_events=2
        )
        later = await service.get(
            app_name=APP, user_id=USER, session_id=session.id, after=base + timedelta(minutes=1)
        )
        both = await service.get(
            app_name=APP,
            user_id=USER,
            session_id=session.id,
            num_recent_events=1,
            after=base,
        )
        assert contents(full) == [0, 1, 2, 3]
        assert contents(recent) == [2, 3]
        assert contents(later) == [2, 3]
        assert contents(both) == [3]
        assert full.message_count == 4

    async def test_service_get_with_the_wrong_app_or_user_raises(
        self, service: SessionService
    ) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=OTHER_APP, user_id=USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=OTHER_USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=USER, session_id="nope")

    async def test_service_list_is_by_app_and_user(self, service: SessionService) -> None:
        mine = [(await service.create(app_name=APP, user_id=USER)).id for _ in range(2)]
        await service.create(app_name=APP, user_id=OTHER_USER)
        await service.create(app_name=OTHER_APP, user_id=USER)

        listed = await service.list(app_name=APP, user_id=USER)
        assert {s.id for s in listed} == set(mine)
        assert await service.list(app_name=OTHER_APP, user_id=OTHER_USER) == []

    async def test_service_delete(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        with pytest.raises(SessionNotFoundError):
            await service.delete(app_name=APP, user_id=OTHER_USER, session_id=session.id)
        assert (
            await service.get(app_name=APP, user_id=USER, session_id=session.id)
        ).id == session.id

        await service.delete(app_name=APP, user_id=USER, session_id=session.id)

        with pytest.raises(SessionNotFoundError):
            await service.get(app_name=APP, user_id=USER, session_id=session.id)

    async def test_service_append_event_by_id(self, service: SessionService) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        stored = await service.append_event(session.id, Event(author="user", state_delta={"p": 1}))

        assert stored.seq == 1
        got = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        assert got.state == {"p": 1}
        assert [e.id for e in got.events] == [stored.id]

    async def test_service_append_event_updates_the_session_object_in_place(
        self, service: SessionService, store: Store
    ) -> None:
        session = await service.create(app_name=APP, user_id=USER)
        created_at, updated_at = session.created_at, session.updated_at
        yesterday = datetime.now(timezone.utc) - timedelta(days=1)  # e.g. an imported transcript
        event = Event(
            author="agent", state_delta={"p": 1, "temp:t": 2}, tokens=4, timestamp=yesterday
        )

        stored = await service.append_event(session, event)

        assert session.events == [stored]
        assert session.state == {"p": 1, "temp:t": 2}
        assert (session.message_count, session.token_total) == (1, 4)
        assert session.created_at == created_at
        assert session.updated_at >= updated_at
        session.set("q", 2)
        await store.update(session)  # the object's version kept up with the store's
        got = await service.get(app_name=APP, user_id=USER, session_id=session.id)
        assert got.state == {"p": 1, "q": 2}

    async def test_fork_copies_private_state_and_records_the_parent(
        self, manager: Manager, store: Store
    ) -> None:
        parent = await _parent(manager, store)

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
        parent = await _parent(manager, store)
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
        parent = await _parent(manager, store)
        child = await manager.fork(ORG, parent.id)

        parent.set("user:u", 2)
        parent.set("app:a", 2)
        await manager.save(parent)

        got = await manager.get(ORG, child.id)
        assert (got.state["user:u"], got.state["app:a"]) == (2, 2)

    async def test_fork_with_events_copies_the_transcript(
        self, manager: Manager, store: Store
    ) -> None:
        parent = await _parent(manager, store)

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
        parent = await _parent(manager, store)
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

    # -- delete, purge, delete_user ---------------------------------------------------------------

    async def test_delete_removes_the_events_and_a_recreated_session_starts_afresh(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, id="again", state={"p": 1, "user:u": 1})
        for _ in range(3):
            await store.append_event(ORG, "again", Event(author="user"))

        await manager.delete(ORG, "again")

        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, "again")
        with pytest.raises(SessionNotFoundError):
            await manager.get(ORG, session.id)
        recreated = await manager.create(ORG, USER, id="again")
        assert recreated.state == {"user:u": 1}  # shared state outlives one session
        assert await store.list_events(ORG, "again") == []
        assert (await store.append_event(ORG, "again", Event(author="user"))).seq == 1
        assert (await manager.get(ORG, "again")).message_count == 1

    async def test_purge_removes_only_sessions_idle_since_the_cutoff(
        self, manager: Manager, store: Store
    ) -> None:
        old = [(await manager.create(ORG, USER)).id for _ in range(2)]
        kept = await manager.create(ORG, USER)
        other_org = await manager.create(OTHER_ORG, USER)
        await store.append_event(ORG, old[0], Event(author="user"))
        await asyncio.sleep(1.5)
        await manager.touch(kept)
        # Wide margins: a loaded machine may take most of a second between touch and purge.
        cutoff = timedelta(seconds=1)

        assert await manager.purge(ORG, older_than=cutoff, dry_run=True) == 2
        assert len(await manager.list(Filter(ORG))) == 3

        assert await manager.purge(ORG, older_than=cutoff) == 2

        assert [s.id for s in await manager.list(Filter(ORG))] == [kept.id]
        for session_id in old:
            with pytest.raises(SessionNotFoundError):
                await store.list_events(ORG, session_id)
        assert (await manager.get(OTHER_ORG, other_org.id)).id == other_org.id
        assert await manager.purge(ORG, older_than=cutoff) == 0

    async def test_delete_user_erases_sessions_events_and_user_state(
        self, manager: Manager, store: Store
    ) -> None:
        other_app = Manager(store, app_name=OTHER_APP)
        doomed = [
            await manager.create(ORG, USER, state={"user:u": 1, "app:a": 1}),
            await manager.create(ORG, USER),
            await other_app.create(ORG, USER, state={"user:u": 1}),
        ]
        await store.append_event(ORG, doomed[1].id, Event(author="user"))
        bystander = await manager.create(ORG, OTHER_USER, state={"user:b": 1})
        elsewhere = await manager.create(OTHER_ORG, USER, state={"user:u": 1})

        assert await manager.delete_user(ORG, USER) == 3

        for session in doomed:
            with pytest.raises(SessionNotFoundError):
                await manager.get(ORG, session.id)
            with pytest.raises(SessionNotFoundError):
                await store.list_events(ORG, session.id)
        assert await shared_state_of(manager, ORG, USER) == {"app:a": 1}
        assert await shared_state_of(other_app, ORG, USER) == {}
        assert (await manager.get(ORG, bystander.id)).state == {"user:b": 1, "app:a": 1}
        assert (await manager.get(OTHER_ORG, elsewhere.id)).state == {"user:u": 1}
        assert await manager.delete_user(ORG, USER) == 2  # the two made by shared_state_of

    # -- conditional appends ----------------------------------------------------------------------

    async def test_an_append_can_require_the_version_the_caller_holds(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, state={"k": 0})
        first = await store.append_event(
            ORG, session.id, Event("user", content="one"), expected_version=session.version
        )
        assert first.seq == 1
        assert (await store.get(ORG, session.id)).version == session.version + 1

        with pytest.raises(StaleSessionError):
            await store.append_event(
                ORG,
                session.id,
                Event("user", content="two", state_delta={"k": 1, "user:u": 1}, tokens=5),
                expected_version=session.version,  # one behind now
            )
        after = await store.get(ORG, session.id)
        assert [e.content for e in await store.list_events(ORG, session.id)] == ["one"]
        assert (after.message_count, after.token_total, after.version) == (
            1,
            0,
            session.version + 1,
        )
        assert after.state == {"k": 0}

        with pytest.raises(SessionNotFoundError):
            await store.append_event(ORG, "missing", Event("user"), expected_version=1)

    async def test_of_two_appends_expecting_one_version_exactly_one_lands(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        results = await asyncio.gather(
            *(
                store.append_event(
                    ORG, session.id, Event("user", content=n), expected_version=session.version
                )
                for n in range(2)
            ),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["Event", "StaleSessionError"]
        assert len(await store.list_events(ORG, session.id)) == 1

    # -- a session with its transcript in one read ------------------------------------------------

    async def test_get_with_events_reads_state_and_transcript_together(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, state={"k": 1, "user:u": 2, "app:a": 3})
        assert (await store.get_with_events(ORG, session.id)).events == []
        start = datetime(2026, 1, 2, 3, 4, 5, 600001, tzinfo=timezone(timedelta(hours=2)))
        appended = [
            await store.append_event(
                ORG,
                session.id,
                Event("user", content={"n": n, "f": 1e16}, timestamp=start + timedelta(seconds=n)),
            )
            for n in range(5)
        ]
        loaded = await store.get_with_events(ORG, session.id)
        assert loaded.state == {"k": 1, "user:u": 2, "app:a": 3}
        assert loaded.events == appended
        assert all(is_utc(e.timestamp) for e in loaded.events)
        assert type(loaded.events[0].content["f"]) is float

        newest = await store.get_with_events(ORG, session.id, limit=2)
        assert [e.seq for e in newest.events] == [4, 5]
        later = await store.get_with_events(ORG, session.id, after=appended[2].timestamp, limit=9)
        assert [e.seq for e in later.events] == [4, 5]
        assert (await store.get_with_events(ORG, session.id, limit=0)).events == []
        with pytest.raises(SessionNotFoundError):
            await store.get_with_events(ORG, "missing")
        with pytest.raises(SessionNotFoundError):
            await store.get_with_events(OTHER_ORG, session.id)
        with pytest.raises(InvalidArgumentError):
            await store.get_with_events(ORG, session.id, after=datetime(2026, 1, 1))

    async def test_get_with_events_json_is_get_with_events_as_json_text(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, state={"k": 1, "user:u": 2, "app:a": 3})
        got, text = await store.get_with_events_json(ORG, session.id)
        assert (got.state, got.events, json.loads(text)) == (session.state, [], [])
        start = datetime(1969, 12, 31, 23, 59, 58, 999999, tzinfo=timezone.utc)
        contents: list[Any] = [
            {"n": 1, "f": 1e16, "g": 1.0, "nested": [None, True, {"é": '\u2603\n"q"'}]},
            "plain text",
            None,
            [1, 2.5, "x"],
            {},
            7,
        ]
        for n, content in enumerate(contents):
            await store.append_event(
                ORG,
                session.id,
                Event(
                    f'author "{n}" ✓',
                    content=content,
                    invocation_id=f"inv\\{n}",
                    state_delta={"k": n, "user:u": [n]},
                    tokens=n,
                    timestamp=start + timedelta(seconds=n, microseconds=n),
                ),
            )
        reads: list[dict[str, Any]] = [
            {},
            {"limit": 2},
            {"limit": 0},
            {"after": start + timedelta(seconds=2)},
            {"after": start + timedelta(seconds=1), "limit": 3},
        ]
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        for read in reads:
            expected = await store.get_with_events(ORG, session.id, **read)
            got, text = await store.get_with_events_json(ORG, session.id, **read)
            assert got.events == []
            got.events = expected.events
            assert got == expected
            assert got.state == expected.state
            items = json.loads(text)
            assert items == [
                [
                    e.seq, e.id, e.author, e.invocation_id, e.content, e.state_delta, e.tokens,
                    (e.timestamp - epoch) // timedelta(microseconds=1),
                ]
                for e in expected.events
            ], read  # fmt: skip
            floats = [
                item[4]["f"] for item in items if isinstance(item[4], dict) and "f" in item[4]
            ]
            assert all(type(f) is float for f in floats)
        with pytest.raises(SessionNotFoundError):
            await store.get_with_events_json(ORG, "missing")
        with pytest.raises(SessionNotFoundError):
            await store.get_with_events_json(OTHER_ORG, session.id)
        with pytest.raises(InvalidArgumentError):
            await store.get_with_events_json(ORG, session.id, after=datetime(2026, 1, 1))
        with pytest.raises(InvalidArgumentError):
            await store.get_with_events_json(ORG, session.id, limit=-1)

    async def test_list_with_state_returns_what_get_returns(
        self, manager: Manager, store: Store
    ) -> None:
        made = [
            await manager.create(ORG, USER, state={"n": n, "user:u": "shared", "app:a": [n]})
            for n in range(3)
        ]
        await manager.create(ORG, OTHER_USER, state={"other": True})
        listed = await store.list(Filter(ORG, user_id=USER, with_state=True))
        assert [s.id for s in listed] == [s.id for s in reversed(made)]
        for session in listed:
            assert session.state == (await store.get(ORG, session.id)).state
        assert all(s.state == {} for s in await store.list(Filter(ORG, user_id=USER)))

    async def test_list_with_state_gives_every_session_of_many_owners_its_own_state(
        self, manager: Manager, store: Store
    ) -> None:
        other_app = Manager(store, app_name=OTHER_APP)
        for app in (manager, other_app):
            for user in (USER, OTHER_USER):
                for n in range(2):
                    state = {"n": n, "user:u": {"who": [user]}, "app:a": app.app_name}
                    await app.create(ORG, user, state=state)
        await manager.create(ORG, "nobody-shares")  # an owner with no shared state
        await other_app.create(OTHER_ORG, USER, state={"user:u": "elsewhere", "app:a": 0})
        filters = [
            Filter(ORG, with_state=True),
            Filter(ORG, user_id=USER, with_state=True),
            Filter(ORG, app_name=APP, with_state=True),
            Filter(ORG, user_id=USER, app_name=APP, with_state=True),
            Filter(ORG, limit=3, with_state=True),
            Filter(ORG, app_name=OTHER_APP, limit=1, with_state=True),
        ]
        for filter in filters:
            listed = await store.list(filter)
            assert listed
            for session in listed:
                assert session.state == (await store.get(ORG, session.id)).state
            # A session's state is its own: a nested value changed in one is in no other.
            shared = [s for s in listed if "user:u" in s.state]
            if shared:
                shared[0].state["user:u"]["who"].append("changed")
                assert all("changed" not in s.state["user:u"]["who"] for s in shared[1:])
        # A listed copy saves what changed in it, a nested shared value changed in place too.
        first, second = await store.list(Filter(ORG, user_id=USER, app_name=APP, with_state=True))
        first.state["user:u"]["who"].append("saved")
        first.set("n", 99)
        await manager.save(first)
        await manager.save(second)  # nothing changed in it: writes nothing of the first's
        got = await manager.get(ORG, second.id)
        assert got.state["user:u"] == {"who": [USER, "saved"]}
        assert (await manager.get(ORG, first.id)).state["n"] == 99

    async def test_list_states_json_is_list_with_state_as_json_text(
        self, manager: Manager, store: Store
    ) -> None:
        other_app = Manager(store, app_name=OTHER_APP)
        for app in (manager, other_app):
            for user in (USER, OTHER_USER):
                for n in range(2):
                    state = {"n": n, "f": 1.0, "user:u": {"who": [user]}, "app:a": app.app_name}
                    await app.create(ORG, user, state=state)
        await manager.create(ORG, "nobody-shares", state={"big": 1e16})
        forked = await manager.fork(ORG, (await manager.create(ORG, USER, state={"p": 1})).id)
        await other_app.create(OTHER_ORG, USER, state={"user:u": "elsewhere"})
        epoch, microsecond = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(microseconds=1)
        filters = [
            Filter(ORG),
            Filter(ORG, user_id=USER),
            Filter(ORG, app_name=APP),
            Filter(ORG, user_id=USER, app_name=APP, with_state=True),
            Filter(ORG, limit=3),
            Filter(ORG, parent_id=forked.parent_id),
            Filter(ORG, user_id="no-one"),
        ]
        for filter in filters:
            listed = await store.list(replace(filter, with_state=True))
            listing = json.loads(await store.list_states_json(filter))
            assert set(listing) == {"sessions", "users", "apps"}
            users = {(a, u): state for a, u, state in listing["users"]}
            apps = {a: state for a, state in listing["apps"]}
            assert set(users) == {(s.app_name, s.user_id) for s in listed}
            assert set(apps) == {s.app_name for s in listed}
            assert len(users) == len(listing["users"])
            assert len(apps) == len(listing["apps"])
            rebuilt = []
            for sid, user, app, updated, version, incarnation, private in listing["sessions"]:
                state = dict(private)
                state.update({f"user:{k}": v for k, v in users[(app, user)].items()})
                state.update({f"app:{k}": v for k, v in apps[app].items()})
                rebuilt.append((sid, user, app, updated, version, incarnation, state))
            assert rebuilt == [
                (
                    s.id, s.user_id, s.app_name, (s.updated_at - epoch) // microsecond,
                    s.version, s.incarnation, s.state,
                )
                for s in listed
            ], filter  # fmt: skip
            assert all(list(r[-1]) == list(s.state) for r, s in zip(rebuilt, listed, strict=True))
            floats = [r[-1][k] for r in rebuilt for k in ("f", "big") if k in r[-1]]
            assert all(type(f) is float for f in floats)
        assert json.loads(await store.list_states_json(Filter(ORG, user_id="no-one"))) == {
            "sessions": [], "users": [], "apps": [],
        }  # fmt: skip

    # -- transcript edits: truncate_events --------------------------------------------------------

    async def test_truncate_events_removes_the_tail_and_returns_it_oldest_first(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        appended = [
            await store.append_event(
                ORG, session.id, Event("user", content={"n": n}, state_delta={"k": n}, tokens=n)
            )
            for n in range(1, 6)
        ]
        before = await store.get(ORG, session.id)

        removed = await store.truncate_events(ORG, session.id, after_seq=2)

        assert removed == appended[2:]
        assert await seqs(store, ORG, session.id) == [1, 2]
        after = await store.get(ORG, session.id)
        assert (after.message_count, after.token_total) == (2, 1 + 2)
        assert after.version == before.version + 1
        assert after.updated_at >= before.updated_at
        assert after.state == {"k": 5}  # applied deltas stay applied
        nxt = await store.append_event(ORG, session.id, Event("user", content="again", tokens=4))
        assert nxt.seq == 3
        assert await seqs(store, ORG, session.id) == [1, 2, 3]
        assert (await store.get(ORG, session.id)).token_total == 7

    async def test_truncate_events_after_zero_clears_the_transcript_and_keeps_the_session(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, state={"p": 1}, title="Kept")
        for n in range(3):
            await store.append_event(ORG, session.id, Event("user", content=n, tokens=2))
        removed = await store.truncate_events(ORG, session.id, after_seq=0)
        assert [e.seq for e in removed] == [1, 2, 3]
        assert await store.list_events(ORG, session.id) == []
        kept = await store.get(ORG, session.id)
        assert (kept.title, kept.state, kept.message_count, kept.token_total) == (
            "Kept",
            {"p": 1},
            0,
            0,
        )
        assert (await store.append_event(ORG, session.id, Event("user"))).seq == 1
        assert await store.truncate_events(ORG, session.id, after_seq=0) != []
        assert await store.truncate_events(ORG, session.id, after_seq=0) == []

    async def test_truncate_events_past_the_end_removes_nothing_and_keeps_seqs_gapless(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for n in range(3):
            await store.append_event(ORG, session.id, Event("user", content=n, tokens=1))
        version = (await store.get(ORG, session.id)).version
        assert await store.truncate_events(ORG, session.id, after_seq=3) == []
        assert await store.truncate_events(ORG, session.id, after_seq=2**63 - 1) == []
        after = await store.get(ORG, session.id)
        assert (after.message_count, after.token_total, after.version) == (3, 3, version + 2)
        assert (await store.append_event(ORG, session.id, Event("user"))).seq == 4

    @pytest.mark.parametrize("bad", [-1, 2**63, 1.0, True, "1", None])
    async def test_truncate_events_refuses_a_bad_after_seq_alike(
        self, manager: Manager, store: Store, bad: Any
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_event(ORG, session.id, Event("user"))
        with pytest.raises(InvalidArgumentError) as refused:
            await store.truncate_events(ORG, session.id, after_seq=bad)
        assert str(refused.value) == "after_seq must be an integer from 0 to 9223372036854775807"
        assert await seqs(store, ORG, session.id) == [1]

    async def test_truncate_events_of_a_missing_session_or_another_org_raises(
        self, manager: Manager, store: Store
    ) -> None:
        a, b = await _twins(manager)
        for session in (a, b):
            await store.append_event(session.org_id, session.id, Event("user", content="x"))
        with pytest.raises(SessionNotFoundError):
            await store.truncate_events(ORG, "missing", after_seq=0)
        with pytest.raises(SessionNotFoundError):
            await store.truncate_events("org-c", a.id, after_seq=0)
        assert len(await store.truncate_events(OTHER_ORG, b.id, after_seq=0)) == 1
        assert await seqs(store, ORG, a.id) == [1]  # the same id in ORG is untouched
        assert (await store.get(ORG, a.id)).message_count == 1
        with pytest.raises(InvalidArgumentError):
            await store.truncate_events("", a.id, after_seq=0)

    async def test_truncate_events_can_require_the_version_the_caller_holds(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for n in range(2):
            await store.append_event(ORG, session.id, Event("user", content=n))
        held = await store.get(ORG, session.id)
        await store.append_event(ORG, session.id, Event("user", content="meanwhile"))
        with pytest.raises(StaleSessionError):
            await store.truncate_events(ORG, session.id, after_seq=1, expected_version=held.version)
        assert await seqs(store, ORG, session.id) == [1, 2, 3]
        current = (await store.get(ORG, session.id)).version
        removed = await store.truncate_events(
            ORG, session.id, after_seq=2, expected_version=current
        )
        assert [e.content for e in removed] == ["meanwhile"]

    # -- transcript edits: pop_event ---------------------------------------------------------------

    async def test_pop_event_removes_the_newest_event_as_a_truncation_would(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, state={"p": 1})
        appended = [
            await store.append_event(
                ORG, session.id, Event("user", content={"n": n}, state_delta={"k": n}, tokens=n)
            )
            for n in range(1, 4)
        ]
        before = await store.get(ORG, session.id)

        popped = await store.pop_event(ORG, session.id)

        assert popped == appended[2]
        assert await seqs(store, ORG, session.id) == [1, 2]
        after = await store.get(ORG, session.id)
        assert (after.message_count, after.token_total) == (2, 1 + 2)
        assert after.version == before.version + 1
        assert after.updated_at >= before.updated_at
        assert after.state == {"p": 1, "k": 3}  # applied deltas stay applied
        assert await store.pop_event(ORG, session.id) == appended[1]
        nxt = await store.append_event(ORG, session.id, Event("user", content="again", tokens=4))
        assert nxt.seq == 2
        assert await store.pop_event(ORG, session.id) == nxt
        assert await store.pop_event(ORG, session.id) == appended[0]
        emptied = await store.get(ORG, session.id)
        assert (emptied.message_count, emptied.token_total) == (0, 0)
        assert (await store.append_event(ORG, session.id, Event("user"))).seq == 1

    async def test_pop_event_of_an_empty_transcript_returns_none_and_writes_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, title="Kept")
        assert await store.pop_event(ORG, session.id) is None
        await store.append_event(ORG, session.id, Event("user", content="x", tokens=2))
        assert (await store.pop_event(ORG, session.id)).content == "x"  # type: ignore[union-attr]
        held = await store.get(ORG, session.id)
        assert await store.pop_event(ORG, session.id) is None
        assert await store.pop_event(ORG, session.id, expected_version=held.version) is None
        after = await store.get(ORG, session.id)
        assert (after.version, after.updated_at, after.title) == (
            held.version,
            held.updated_at,
            "Kept",
        )

    async def test_pop_event_round_trips_the_event_exactly(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        content = {"n": 1, "f": 1.0, "e": 1e16, "big": 2**62, "text": 'ünï "q" 🚀', "z": None}
        stored = await store.append_event(
            ORG,
            session.id,
            Event("model", content=content, invocation_id="inv", state_delta={"a": [1]}),
        )
        popped = await store.pop_event(ORG, session.id)
        assert popped == stored
        assert popped is not None
        assert json.dumps(popped.content, sort_keys=True) == json.dumps(content, sort_keys=True)
        assert type(popped.content["e"]) is float

    async def test_pop_event_of_a_missing_session_or_another_org_raises(
        self, manager: Manager, store: Store
    ) -> None:
        a, b = await _twins(manager)
        for session in (a, b):
            await store.append_event(session.org_id, session.id, Event("user", content="x"))
        with pytest.raises(SessionNotFoundError):
            await store.pop_event(ORG, "missing")
        with pytest.raises(SessionNotFoundError):
            await store.pop_event("org-c", a.id)
        assert (await store.pop_event(OTHER_ORG, b.id)) is not None
        assert await seqs(store, ORG, a.id) == [1]  # the same id in ORG is untouched
        assert (await store.get(ORG, a.id)).message_count == 1
        with pytest.raises(InvalidArgumentError):
            await store.pop_event("", a.id)

    async def test_pop_event_can_require_the_version_and_life_the_caller_holds(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_event(ORG, session.id, Event("user", content="first"))
        held = await store.get(ORG, session.id)
        await store.append_event(ORG, session.id, Event("user", content="meanwhile"))
        with pytest.raises(StaleSessionError):
            await store.pop_event(ORG, session.id, expected_version=held.version)
        with pytest.raises(StaleSessionError):
            await store.pop_event(ORG, session.id, incarnation="another life")
        assert await seqs(store, ORG, session.id) == [1, 2]
        current = await store.get(ORG, session.id)
        popped = await store.pop_event(
            ORG, session.id, expected_version=current.version, incarnation=current.incarnation
        )
        assert popped is not None
        assert popped.content == "meanwhile"

    async def test_concurrent_pops_and_appends_lose_and_duplicate_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_events(
            ORG, session.id, [Event("user", content=["seed", n], tokens=1) for n in range(12)]
        )
        popped: list[Any] = []

        async def popper() -> None:
            for _ in range(5):
                event = await store.pop_event(ORG, session.id)
                if event is not None:
                    popped.append(event.content)

        async def appender(task: int) -> None:
            for i in range(4):
                await store.append_event(
                    ORG, session.id, Event("user", content=[task, i], tokens=1)
                )

        await asyncio.gather(*(popper() for _ in range(3)), *(appender(t) for t in range(2)))
        left = [e.content for e in await store.list_events(ORG, session.id)]
        everything = [["seed", n] for n in range(12)] + [[t, i] for t in range(2) for i in range(4)]
        assert sorted(map(json.dumps, popped + left)) == sorted(map(json.dumps, everything))
        events = await store.list_events(ORG, session.id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        stored = await store.get(ORG, session.id)
        assert (stored.message_count, stored.token_total) == (len(events), len(events))

    async def test_manager_truncate_events_keeps_the_held_session_current(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for n in range(4):
            await manager.append_event(session, Event("user", content=n, tokens=10))
        removed = await manager.truncate_events(session, 1)
        assert [e.content for e in removed] == [1, 2, 3]
        stored = await store.get(ORG, session.id)
        assert (
            (session.message_count, session.token_total, session.version)
            == (
                stored.message_count,
                stored.token_total,
                stored.version,
            )
            == (1, 10, stored.version)
        )
        session.set("after", True)
        await manager.save(session)  # the held copy is current: the save is not stale

    # -- batch appends: append_events -------------------------------------------------------------

    async def test_append_events_stores_a_batch_in_order_with_consecutive_seqs(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_event(ORG, session.id, Event("user", content="first"))
        version = (await store.get(ORG, session.id)).version
        batch = [
            Event("user", content={"n": 1, "f": 1.0}, state_delta={"k": 1, "user:u": 1}, tokens=3),
            Event("assistant", content=[None, "two"], invocation_id="inv", tokens=4),
            Event("tool", content=None, state_delta={"k": 3, "app:a": 3, "temp:t": 3}),
        ]
        stored = await store.append_events(ORG, session.id, batch)
        assert [e.seq for e in stored] == [2, 3, 4]
        assert [e.id for e in stored] == [e.id for e in batch]
        assert stored[2].state_delta == {"k": 3, "app:a": 3}
        listed = await store.list_events(ORG, session.id)
        assert listed[1:] == stored
        assert type(listed[1].content["f"]) is float
        after = await store.get(ORG, session.id)
        assert (after.message_count, after.token_total, after.version) == (4, 7, version + 1)
        assert after.state == {"k": 3, "user:u": 1, "app:a": 3}
        assert (await store.append_event(ORG, session.id, Event("user"))).seq == 5

    async def test_append_events_titles_an_untitled_session_in_the_same_write(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await store.append_events(ORG, session.id, [Event("model")], title="")
        assert (await manager.get(ORG, session.id)).title == ""  # "" leaves it untitled
        with pytest.raises(InvalidArgumentError, match="title"):
            await store.append_events(ORG, session.id, [Event("user")], title="a\x00b")
        await store.append_events(ORG, session.id, [Event("user")], title="First question")
        await store.append_events(ORG, session.id, [Event("user")], title="Second question")
        got = await manager.get(ORG, session.id)
        assert (got.title, got.message_count, got.version) == ("First question", 3, 4)
        listed = await manager.list(Filter(ORG, user_id=USER))
        assert [s.title for s in listed] == ["First question"]

    async def test_append_events_is_all_or_nothing(self, manager: Manager, store: Store) -> None:
        session = await manager.create(ORG, USER)
        batch = [Event("user", content="fine"), Event("user", content={"bad": float("nan")})]
        with pytest.raises(InvalidStateError):
            await store.append_events(ORG, session.id, batch)
        assert await store.list_events(ORG, session.id) == []
        with pytest.raises(SessionNotFoundError):
            await store.append_events(ORG, "missing", [Event("user")])
        with pytest.raises(SessionNotFoundError):
            await store.append_events(OTHER_ORG, session.id, [Event("user")])
        held = (await store.get(ORG, session.id)).version
        await store.append_event(ORG, session.id, Event("user"))
        with pytest.raises(StaleSessionError):
            await store.append_events(
                ORG, session.id, [Event("user"), Event("user")], expected_version=held
            )
        assert await seqs(store, ORG, session.id) == [1]
        unchanged = await store.get(ORG, session.id)
        assert (unchanged.message_count, unchanged.version) == (1, held + 1)
        assert await store.append_events(ORG, session.id, []) == []
        with pytest.raises(StaleSessionError):
            await store.append_events(ORG, session.id, [], expected_version=held)
        with pytest.raises(SessionNotFoundError):
            await store.append_events(ORG, "missing", [])
        assert (await store.get(ORG, session.id)).version == held + 1

    async def test_concurrent_batches_never_interleave(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        batches = [[Event("user", content=[b, i], tokens=1) for i in range(5)] for b in range(8)]
        await asyncio.gather(*(store.append_events(ORG, session.id, b) for b in batches))
        events = await store.list_events(ORG, session.id)
        assert [e.seq for e in events] == list(range(1, 41))
        for start in range(0, 40, 5):
            run = [e.content for e in events[start : start + 5]]
            assert run == [[run[0][0], i] for i in range(5)]  # one batch, in its order
        stored = await store.get(ORG, session.id)
        assert (stored.message_count, stored.token_total) == (40, 40)

    async def test_concurrent_appends_and_truncates_keep_seqs_and_counters_exact(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)

        async def appender(task: int) -> None:
            for i in range(6):
                await store.append_event(
                    ORG, session.id, Event("user", content=[task, i], tokens=3)
                )

        async def truncater() -> None:
            for keep in (4, 2, 6, 1):
                await store.truncate_events(ORG, session.id, after_seq=keep)

        await asyncio.gather(*(appender(t) for t in range(3)), truncater())
        events = await store.list_events(ORG, session.id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        stored = await store.get(ORG, session.id)
        assert (stored.message_count, stored.token_total) == (len(events), 3 * len(events))

    async def test_list_event_contents_is_list_events_contents(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        assert await store.list_event_contents(ORG, session.id) == []
        contents: list[Any] = [
            {"n": 1, "f": 1.0, "e": 1e16, "big": 2**62, "text": 'ünï "q" 🚀'},
            None,
            "plain",
            [1, 2.5, True, None],
            {"nested": {"deep": [{"x": -0.5}]}},
        ]
        await store.append_events(ORG, session.id, [Event("user", content=c) for c in contents])
        for limit in (None, 0, 1, 3, 5, 9):
            expected = [e.content for e in await store.list_events(ORG, session.id, limit=limit)]
            got = await store.list_event_contents(ORG, session.id, limit=limit)
            assert got == expected
            assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
        assert type((await store.list_event_contents(ORG, session.id))[0]["e"]) is float
        with pytest.raises(SessionNotFoundError):
            await store.list_event_contents(ORG, "missing")
        with pytest.raises(SessionNotFoundError):
            await store.list_event_contents(OTHER_ORG, session.id)
        with pytest.raises(InvalidArgumentError):
            await store.list_event_contents(ORG, session.id, limit=-1)

    # -- pages: list_page -------------------------------------------------------------------------

    async def test_list_page_walks_every_session_once_in_list_order(
        self, manager: Manager, store: Store
    ) -> None:
        for n in range(7):
            await manager.create(ORG, USER if n % 2 else OTHER_USER, title=f"s{n}")
        await manager.create(OTHER_ORG, USER)
        for filter in (Filter(ORG, limit=3), Filter(ORG, user_id=USER, limit=2)):
            pages = [await store.list_page(filter)]
            while pages[-1].next_cursor is not None:
                pages.append(await manager.list_page(filter, cursor=pages[-1].next_cursor))
            walked = [s.id for page in pages for s in page.sessions]
            everything = await store.list(replace(filter, limit=0))
            assert walked == [s.id for s in everything]
            assert all(len(page.sessions) == filter.limit for page in pages[:-1])
            assert 1 <= len(pages[-1].sessions) <= filter.limit
            assert all(s.state == {} for page in pages for s in page.sessions)

    async def test_list_page_a_full_last_page_has_no_cursor(
        self, manager: Manager, store: Store
    ) -> None:
        assert await store.list_page(Filter(ORG)) == Page([], None)
        for _ in range(4):
            await manager.create(ORG, USER)
        first = await store.list_page(Filter(ORG, limit=2))
        assert first.next_cursor is not None
        last = await store.list_page(Filter(ORG, limit=2), cursor=first.next_cursor)
        assert len(last.sessions) == 2
        assert last.next_cursor is None
        whole = await store.list_page(Filter(ORG, limit=4))
        assert len(whole.sessions) == 4
        assert whole.next_cursor is None

    async def test_list_page_holds_100_sessions_when_the_limit_is_0(
        self, manager: Manager, store: Store
    ) -> None:
        for _ in range(101):
            await manager.create(ORG, USER)
        first = await store.list_page(Filter(ORG))
        assert len(first.sessions) == 100
        rest = await store.list_page(Filter(ORG), cursor=first.next_cursor)
        assert len(rest.sessions) == 1
        assert rest.next_cursor is None
        # The page size may change between pages of one walk.
        small = await store.list_page(Filter(ORG, limit=1), cursor=first.next_cursor)
        assert [s.id for s in small.sessions] == [s.id for s in rest.sessions]

    async def test_list_page_with_state_returns_what_get_returns(
        self, manager: Manager, store: Store
    ) -> None:
        for n in range(3):
            await manager.create(ORG, USER, state={"n": n, "user:u": "shared", "app:a": [n]})
        cursor = None
        seen = 0
        while True:
            page = await store.list_page(Filter(ORG, limit=2, with_state=True), cursor=cursor)
            for session in page.sessions:
                assert session.state == (await store.get(ORG, session.id)).state
                seen += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == 3

    async def test_list_page_during_writes_never_repeats_and_misses_no_quiet_session(
        self, manager: Manager, store: Store
    ) -> None:
        quiet = [(await manager.create(ORG, USER)).id for _ in range(6)]
        written = [(await manager.create(ORG, USER)).id for _ in range(3)]
        walked: list[str] = []
        cursor = None
        step = 0
        while True:
            page = await store.list_page(Filter(ORG, limit=2), cursor=cursor)
            walked += [s.id for s in page.sessions]
            if step < len(written):  # between pages: a create and a write of an old session
                await manager.create(ORG, USER)
                await store.touch(ORG, written[step], messages=1)
            step += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(walked) == len(set(walked))
        assert all(walked.count(session_id) == 1 for session_id in quiet)

    async def test_list_page_refuses_altered_and_foreign_cursors_alike(
        self, manager: Manager, store: Store
    ) -> None:
        for _ in range(3):
            await manager.create(ORG, USER, state={"secret": 1})
        await manager.create(OTHER_ORG, USER)
        cursor = (await store.list_page(Filter(ORG, limit=1))).next_cursor
        assert isinstance(cursor, str)
        altered = cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1]
        for bad in (
            altered, cursor[:-4], cursor + "x", "", "not a cursor", "' OR 1=1 --",
            "eyJ1IjogMX0", "A" * 5000, 123, b"bytes",
        ):  # fmt: skip
            with pytest.raises(InvalidArgumentError):
                await store.list_page(Filter(ORG, limit=1), cursor=bad)  # type: ignore[arg-type]
        for foreign in (
            Filter(OTHER_ORG, limit=1),
            Filter(ORG, user_id=USER, limit=1),
            Filter(ORG, app_name=APP, limit=1),
            Filter(ORG, parent_id="p", limit=1),
        ):
            with pytest.raises(InvalidArgumentError, match="another listing"):
                await store.list_page(foreign, cursor=cursor)
        # Another page size or with_state is the same listing.
        page = await store.list_page(Filter(ORG, limit=5, with_state=True), cursor=cursor)
        assert len(page.sessions) == 2

    # -- forward reads: list_events(after_seq=...) ------------------------------------------------

    async def test_list_events_after_seq_reads_forward_page_by_page(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        stamps = await _five_events(store, session.id)
        await store.append_events(ORG, session.id, [Event("user", content=f"m{i}") for i in (5, 6)])
        assert await seqs(store, ORG, session.id, after_seq=0, limit=3) == [1, 2, 3]
        assert await seqs(store, ORG, session.id, after_seq=3, limit=3) == [4, 5, 6]
        assert await seqs(store, ORG, session.id, after_seq=6, limit=3) == [7]
        assert await seqs(store, ORG, session.id, after_seq=7, limit=3) == []
        assert await seqs(store, ORG, session.id, after_seq=2**63 - 1) == []
        assert await seqs(store, ORG, session.id, after_seq=4) == [5, 6, 7]
        assert await seqs(store, ORG, session.id, after_seq=1, limit=0) == []
        assert await seqs(store, ORG, session.id, after_seq=1, limit=2, after=stamps[2]) == [4, 5]
        read = await manager.list_events(ORG, session.id, after_seq=5, limit=1)
        assert [(e.seq, e.content) for e in read] == [(6, "m5")]
        # Without after_seq, limit still keeps the newest.
        assert await seqs(store, ORG, session.id, limit=2) == [6, 7]
        # Paging forward over a rewound transcript reads what is there now.
        await store.truncate_events(ORG, session.id, after_seq=3)
        await store.append_event(ORG, session.id, Event("user", content="again"))
        assert await seqs(store, ORG, session.id, after_seq=2, limit=5) == [3, 4]

    async def test_list_events_after_seq_refuses_bad_values_and_unknown_sessions_alike(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for bad in (-1, True, 1.5, "1", 2**63):
            with pytest.raises(InvalidArgumentError, match="after_seq must be an integer"):
                await store.list_events(ORG, session.id, after_seq=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.list_events(ORG, session.id, after_seq=0, limit=-1)
        assert await store.list_events(ORG, session.id, after_seq=0) == []
        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, "missing", after_seq=0, limit=5)
        with pytest.raises(SessionNotFoundError):
            await store.list_events(OTHER_ORG, session.id, after_seq=3)

    # -- search -----------------------------------------------------------------------------------

    async def _said(self, store: Store, session_id: str, *contents: Any, org: str = ORG) -> None:
        """Append one event per content, a second apart (oldest first), from 2024-05-01."""
        base = datetime(2024, 5, 1, tzinfo=timezone.utc)
        have = len(await store.list_events(org, session_id))
        for n, content in enumerate(contents, start=have):
            event = Event("user", content=content, timestamp=base + timedelta(seconds=n))
            await store.append_event(org, session_id, event)

    @staticmethod
    async def _found(store: Store, text: str, **kwargs: Any) -> list[tuple[str, int]]:
        return [(hit.session_id, hit.event.seq) for hit in await store.search(ORG, text, **kwargs)]

    async def test_search_finds_every_word_whole_in_string_values_at_any_depth(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            {"parts": [{"text": "Book a FLIGHT to Lisbon"}], "role": "user"},  # ADK's shape
            {"text": "flights are booked"},
            "a plain string: flight, Lisbon!",
            {"deep": [[{"x": ["the flight", 7]}]], "flight": 1, "n": 12},
            {"lisbon": "key only", "count": 42},
            None,
        )
        assert await self._found(store, "flight") == [("s", 4), ("s", 3), ("s", 1)]
        assert await self._found(store, "Lisbon flight") == [("s", 3), ("s", 1)]
        assert await self._found(store, "LISBON") == [("s", 3), ("s", 1)]  # not a key
        assert await self._found(store, "fli") == []  # whole words only
        assert await self._found(store, "flights booked") == [("s", 2)]
        assert await self._found(store, "42") == []  # numbers are not text
        assert await self._found(store, "user") == [("s", 1)]  # every string value
        assert await self._found(store, "flight nowhere") == []
        (hit,) = await store.search(ORG, "booked")
        assert hit.event == (await store.list_events(ORG, s.id))[1]

    async def test_search_ranks_by_occurrences_then_newest(
        self, manager: Manager, store: Store
    ) -> None:
        a = await manager.create(ORG, USER, id="a")
        b = await manager.create(ORG, USER, id="b")
        await self._said(store, a.id, "tea", "tea for two, tea for me", "tea time")
        await self._said(store, b.id, "TEA! tea, Tea", "coffee", "no tea")
        # b's events are 3 seconds newer, seq for seq: b1 (3 x), a2 (2 x), then one each.
        assert await self._found(store, "tea") == [
            ("b", 1), ("a", 2), ("b", 3), ("a", 3), ("a", 1),
        ]  # fmt: skip
        assert await self._found(store, "tea two") == [("a", 2)]
        assert await self._found(store, "tea", limit=2) == [("b", 1), ("a", 2)]
        assert await self._found(store, "tea tea TEA") == await self._found(store, "tea")

    async def test_search_narrows_by_user_app_and_session_and_never_crosses_tenants(
        self, manager: Manager, store: Store
    ) -> None:
        mine = await manager.create(ORG, USER, id="mine")
        theirs = await manager.create(ORG, OTHER_USER, id="theirs")
        other_app = await Manager(store, app_name=OTHER_APP).create(ORG, USER, id="billing")
        twin = await Manager(store, app_name=APP).create(OTHER_ORG, USER, id="mine")
        for session in (mine, theirs, other_app):
            await self._said(store, session.id, f"invoice of {session.id}")
        await self._said(store, twin.id, "invoice of the other org", org=OTHER_ORG)
        assert sorted(await self._found(store, "invoice")) == [
            ("billing", 1), ("mine", 1), ("theirs", 1),
        ]  # fmt: skip
        assert sorted(await self._found(store, "invoice", user_id=USER)) == [
            ("billing", 1), ("mine", 1),
        ]  # fmt: skip
        assert await self._found(store, "invoice", app_name=APP, user_id=USER) == [("mine", 1)]
        assert await self._found(store, "invoice", app_name=OTHER_APP) == [("billing", 1)]
        assert await self._found(store, "invoice", session_id="theirs") == [("theirs", 1)]
        assert await self._found(store, "invoice", session_id="nope") == []
        assert await self._found(store, "org") == []
        assert [h.event.content for h in await store.search(OTHER_ORG, "org")] == [
            "invoice of the other org"
        ]

    async def test_search_text_is_data_never_syntax(self, manager: Manager, store: Store) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            "hello world",
            "hello or world, not near",
            'she said "hello" (body:col) and NEAR(x y) ^start *',
            "drop table ds_events",
        )
        for text, expected in [
            ('"hello', [3, 2, 1]),  # an unbalanced quote
            ("hello OR world", [2]),  # OR is a word, not an operator
            ("NOT world", [2]),
            ("-world hello", [2, 1]),  # - is not "without"
            ("hello*", [3, 2, 1]),  # * is not a prefix
            ("hel*", []),
            ("body:col", [3]),  # no column filter
            ("NEAR(x y)", [3]),
            ("^start", [3]),
            ("'; DROP TABLE ds_events; --", [4]),
            ("hello AND", [3]),  # AND is a word too
            ("\\ ' \" % _ hello", [3, 2, 1]),
        ]:
            assert [seq for _, seq in await self._found(store, text)] == expected, text
        assert len(await store.list_events(ORG, s.id)) == 4

    async def test_search_follows_appends_rewinds_forks_and_deletions(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(store, s.id, "alpha one", "alpha two")
        await store.append_events(ORG, s.id, [Event("user", content=["alpha", "three"])])
        assert await self._found(store, "alpha") == [("s", 3), ("s", 2), ("s", 1)]
        await store.truncate_events(ORG, s.id, after_seq=1)
        assert await self._found(store, "alpha") == [("s", 1)]
        await store.append_event(ORG, s.id, Event("user", content="alpha again"))
        assert [h.event.content for h in await store.search(ORG, "again")] == ["alpha again"]
        child = await store.fork(ORG, s.id, new_session_id="child", with_events=True)
        assert sorted(await self._found(store, "again")) == [("child", 2), ("s", 2)]
        await store.fork(ORG, s.id, new_session_id="bare")
        assert sorted(await self._found(store, "one")) == [("child", 1), ("s", 1)]
        await store.delete(ORG, child.id)
        assert await self._found(store, "one") == [("s", 1)]
        await store.truncate_events(ORG, s.id, after_seq=0)
        assert await self._found(store, "alpha") == []
        other = await manager.create(ORG, OTHER_USER, id="o")
        await self._said(store, other.id, "omega")
        await store.delete_user(ORG, OTHER_USER)
        assert await self._found(store, "omega") == []
        late = await manager.create(ORG, USER, id="late")
        await self._said(store, late.id, "omega")
        await store.purge(ORG, older_than=timedelta(0))
        assert await self._found(store, "omega") == []

    async def test_search_words_are_unicode_letters_and_digits_without_case(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            "Café CRÈME",
            "cafe creme",
            "ΣΊΣΥΦΟΣ and Привет",
            "thanks🙏 see you",
            "日本語 テキスト",
            "order_id=A-1234; e-mail bob@example.com https://example.com/a/b?q=1",
            "x2 3.14 v1.2.3",
        )
        for text, expected in [
            ("café", [1]),  # accents are kept: café is not cafe
            ("CAFE", [2]),
            ("crème café", [1]),
            ("σίσυφος", [3]),  # final sigma folds like any sigma
            ("ПРИВЕТ", [3]),
            ("thanks", [4]),  # an emoji ends a word
            ("日本語", [5]),
            ("1234 order", [6]),  # _ - = ; @ . / ? : separate words
            ("example com", [6]),
            ("bob", [6]),
            ("https", [6]),
            ("3 14", [7]),
            ("x2", [7]),
            ("2", [7]),
        ]:
            assert [seq for _, seq in await self._found(store, text)] == expected, text

    async def test_search_refuses_bad_input_alike(self, manager: Manager, store: Store) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(store, s.id, "hello")
        for text in ("", "   ", "!!! ... ???", "🙏", "x" * 256, "hello " * 84, "a\x00b"):
            with pytest.raises(InvalidArgumentError):
                await store.search(ORG, text)
        assert await self._found(store, ("hello " * 83).strip()) == [("s", 1)]  # 497 characters
        for limit in (0, -1, True, 1.5, "5", 2**63):
            with pytest.raises(InvalidArgumentError, match="limit"):
                await store.search(ORG, "hello", limit=limit)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.search("", "hello")
        with pytest.raises(InvalidArgumentError):
            await store.search(ORG, 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.search(ORG, "hello", user_id="")
