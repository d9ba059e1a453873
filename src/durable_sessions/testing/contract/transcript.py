"""Transcript edits: truncate_events and pop_event."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from durable_sessions import (
    Event,
    InvalidArgumentError,
    Manager,
    SessionNotFoundError,
    StaleSessionError,
    Store,
)

from ._common import (
    ORG,
    OTHER_ORG,
    USER,
    ContractBase,
    seqs,
    twins,
)

__all__ = ["TranscriptContract"]


class TranscriptContract(ContractBase):
    """Truncating a transcript and popping its newest event."""

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
        a, b = await twins(manager)
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
        a, b = await twins(manager)
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
