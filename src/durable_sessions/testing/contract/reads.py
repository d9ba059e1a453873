"""Reads of a session with its transcript, or of many with their state, in one go."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    Manager,
    SessionNotFoundError,
    Store,
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
)

__all__ = ["ReadsContract"]


class ReadsContract(ContractBase):
    """A session with its transcript, and sessions with their state."""

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
