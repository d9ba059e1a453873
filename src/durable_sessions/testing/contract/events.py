"""Events: appends, conditional appends and batches."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    SessionNotFoundError,
    StaleSessionError,
    Store,
)

from ._common import (
    ORG,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
    five_events,
    is_utc,
    seqs,
    shared_state_of,
)

__all__ = ["EventsContract"]


class EventsContract(ContractBase):
    """Appending events, one, conditionally, or in batches."""

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
        await five_events(store, session.id)

        events = await store.list_events(ORG, session.id)
        assert [e.content for e in events] == ["m0", "m1", "m2", "m3", "m4"]
        assert await seqs(store, ORG, session.id, limit=2) == [4, 5]
        assert await seqs(store, ORG, session.id, limit=9) == [1, 2, 3, 4, 5]
        assert await store.list_events(ORG, session.id, limit=0) == []

    async def test_list_events_after_keeps_strictly_later_events(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        stamps = await five_events(store, session.id)

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
