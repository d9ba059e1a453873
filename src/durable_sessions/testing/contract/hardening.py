"""Hardening: stale deltas, unguarded writes racing a re-create, the datetime range, titles."""

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
    StaleSessionError,
    Store,
)

from ._common import ORG, OTHER_APP, OTHER_USER, USER, ContractBase, is_utc

__all__ = ["HardeningContract"]


class HardeningContract(ContractBase):
    """Cases a hostile probe broke once: each guards its fix on every store."""

    # == hardening: lost or refused writes, poisoned data =====================================
    # One block, kept apart from the cases above: each case guards what a hostile probe broke.

    RACE_CYCLES = 40
    """Delete and re-create cycles a race case runs."""

    # -- unguarded writes never claim staleness -----------------------------------------------

    async def test_unguarded_writes_racing_a_delete_and_create_never_claim_staleness(
        self, store: Store
    ) -> None:
        def fresh() -> Session:
            return Session(id="churned", org_id=ORG, user_id=USER)

        await store.create(fresh())
        await store.append_event(ORG, "churned", Event("user", content="seed"))
        finished = asyncio.Event()

        async def churn() -> None:
            try:
                for _ in range(self.RACE_CYCLES):
                    await store.delete(ORG, "churned")
                    await store.create(fresh())
                    await store.append_event(ORG, "churned", Event("user", content="seed"))
                    await asyncio.sleep(0)  # let the writers in between
            finally:
                finished.set()

        writes: dict[str, Callable[[], Awaitable[Any]]] = {
            "append_event": lambda: store.append_event(ORG, "churned", Event("user")),
            "append_events": lambda: store.append_events(ORG, "churned", [Event("user")]),
            "touch": lambda: store.touch(ORG, "churned", messages=1),
            "pop_event": lambda: store.pop_event(ORG, "churned"),
            "truncate_events": lambda: store.truncate_events(ORG, "churned", after_seq=0),
        }
        churning = asyncio.create_task(churn())

        async def keep_writing(write: Callable[[], Awaitable[Any]]) -> set[str]:
            outcomes: set[str] = set()
            while not finished.is_set():
                try:
                    await write()
                except SessionNotFoundError:
                    outcomes.add("not found")
                else:
                    outcomes.add("written")
                await asyncio.sleep(0)
            return outcomes

        found = await asyncio.gather(*(keep_writing(w) for w in writes.values()))
        await churning
        for name, outcomes in zip(writes, found, strict=True):
            assert "written" in outcomes, name

    # -- a stale copy's state delta never wins ------------------------------------------------

    async def test_manager_append_event_with_a_delta_needs_a_current_copy(
        self, manager: Manager, store: Store
    ) -> None:
        held = await manager.create(ORG, USER, state={"turns": 0})
        other = await manager.get(ORG, held.id)
        other.set("turns", 5)
        await manager.save(other)

        with pytest.raises(StaleSessionError):
            await manager.append_event(held, Event("agent", state_delta={"turns": 1}))
        stored = await manager.get(ORG, held.id)
        assert stored.state["turns"] == 5
        assert await store.list_events(ORG, held.id) == []
        assert (stored.version, stored.message_count) == (other.version, 0)

        # Without a delta there is nothing stale to write: any copy appends.
        await manager.append_event(held, Event("agent", content="hi"))
        assert [e.content for e in await store.list_events(ORG, held.id)] == ["hi"]

        fresh = await manager.get(ORG, held.id)
        await manager.append_event(fresh, Event("agent", state_delta={"turns": 6}))
        assert (await manager.get(ORG, held.id)).state["turns"] == 6
        # The held copy moved on with its append: a second delta from it still applies.
        await manager.append_event(fresh, Event("agent", state_delta={"turns": 7}))
        assert (await manager.get(ORG, held.id)).state["turns"] == 7

    async def test_reload_and_retry_increments_through_append_event_lose_nothing(
        self, manager: Manager, store: Store
    ) -> None:
        await manager.create(ORG, USER, id="counter")
        stale = 0

        async def turn() -> None:
            nonlocal stale
            while True:
                session = await manager.get_or_create(ORG, USER, "counter")
                turns = session.get("turns", 0) + 1
                await asyncio.sleep(0)  # another turn reads the same state meanwhile
                try:
                    await manager.append_event(
                        session, Event("agent", state_delta={"turns": turns})
                    )
                    return
                except StaleSessionError:
                    stale += 1

        await asyncio.gather(*(turn() for _ in range(12)))
        stored = await manager.get(ORG, "counter")
        assert stored.state["turns"] == 12
        assert stored.message_count == 12
        assert stale > 0  # the turns did conflict, and each conflict was retried

    async def test_get_or_create_returns_the_one_session_racing_creators_made(
        self, manager: Manager
    ) -> None:
        found = await asyncio.gather(
            *(manager.get_or_create(ORG, USER, "once", state={"n": i}) for i in range(8))
        )
        assert len({s.incarnation for s in found}) == 1
        stored = await manager.get(ORG, "once")
        assert stored.incarnation == found[0].incarnation
        assert stored.state == found[0].state
        assert [s.id for s in await manager.list(Filter(ORG))] == ["once"]

        again = await manager.get_or_create(ORG, USER, "once", state={"n": 99}, title="t")
        assert (again.incarnation, again.state, again.title) == (
            stored.incarnation,
            stored.state,
            "",
        )
        with pytest.raises(SessionExistsError):
            await manager.get_or_create(ORG, OTHER_USER, "once")
        with pytest.raises(SessionExistsError):
            await Manager(manager.store, app_name=OTHER_APP).get_or_create(ORG, USER, "once")

    # -- the ends of the datetime range -------------------------------------------------------

    async def test_event_timestamps_past_the_stored_range_are_refused_alike(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER)
        utc = timezone.utc
        day = timedelta(days=1)
        earliest = datetime.min.replace(tzinfo=utc) + day
        latest = datetime.max.replace(tzinfo=utc) - day
        refused = [
            datetime.min.replace(tzinfo=utc),
            datetime.max.replace(tzinfo=utc),
            earliest - timedelta(microseconds=1),
            latest + timedelta(microseconds=1),
            datetime(1, 1, 2, 10, 0, tzinfo=timezone(timedelta(hours=14))),  # 01-01 20:00Z
        ]
        for moment in refused:
            with pytest.raises(InvalidArgumentError, match="event timestamp"):
                await store.append_event(ORG, s.id, Event("user", timestamp=moment))
            with pytest.raises(InvalidArgumentError, match="event timestamp"):
                await store.append_events(ORG, s.id, [Event("user", timestamp=moment)])
            with pytest.raises(InvalidArgumentError, match="event timestamp"):
                await manager.append_event(s, Event("user", timestamp=moment))
        with pytest.raises(InvalidArgumentError, match="event timestamp"):
            await store.append_event(ORG, s.id, Event("user", timestamp=datetime(2024, 1, 1)))
        assert await store.list_events(ORG, s.id) == []
        assert (await store.get(ORG, s.id)).message_count == 0

        # The ends themselves are stored and read back exactly, by every read.
        east = timezone(timedelta(hours=14))
        for moment in (earliest, latest, earliest.astimezone(east)):
            await store.append_event(ORG, s.id, Event("user", timestamp=moment))
        expected = [earliest, latest, earliest]
        assert [e.timestamp for e in await store.list_events(ORG, s.id)] == expected
        got = await store.get_with_events(ORG, s.id)
        assert [e.timestamp for e in got.events] == expected
        assert all(is_utc(e.timestamp) for e in got.events)
        later = await store.list_events(ORG, s.id, after=earliest)
        assert [e.timestamp for e in later] == [latest]

    # -- titles have a byte limit -------------------------------------------------------------

    async def test_titles_longer_than_1024_utf8_bytes_are_refused_alike(
        self, manager: Manager, store: Store
    ) -> None:
        fits = "é" * 512  # 1,024 bytes in 512 characters
        too_long = [fits + "a", "x" * 1025, "🙂" * 257]
        s = await manager.create(ORG, USER, id="titled", title=fits)
        assert (await manager.get(ORG, "titled")).title == fits
        for title in too_long:
            with pytest.raises(InvalidArgumentError, match="title"):
                await manager.create(ORG, USER, title=title)
            copy = await manager.get(ORG, "titled")
            copy.title = title
            with pytest.raises(InvalidArgumentError, match="title"):
                await manager.save(copy)
            with pytest.raises(InvalidArgumentError, match="title"):
                await store.touch(ORG, "titled", messages=1, title=title)
            with pytest.raises(InvalidArgumentError, match="title"):
                await store.append_events(ORG, "titled", [Event("user")], title=title)
        stored = await manager.get(ORG, "titled")
        assert (stored.title, stored.version, stored.message_count) == (fits, s.version, 0)
        assert [x.id for x in await manager.list(Filter(ORG))] == ["titled"]
