"""DurableSessionService: ADK's session-service behaviour on memory, SQLite and Postgres.

Every behaviour ADK's own session-service suite checks (google-adk's
tests/unittests/sessions/test_session_service.py), written here against the adapter, except
those of ADK's database internals (engine options, read-only factories, lazy table
creation, its per-app state rows and its row locks); then the adapter's own: ids per
(app, user) and how the core API finds them, ``get_user_state`` on every store, nothing of
the adapter's in the stored state, refused values leaving nothing behind, models rebuilt
exactly as ``model_validate`` builds them, and an ADK ``Runner`` driving an ``LlmAgent``
with a scripted model through several turns, resumed by a second Runner over a new store
object.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

import pydantic
from google.adk import errors as adk_errors
from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
from google.adk.sessions.session import Session as AdkSession
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import Field
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event as DurableEvent
from durable_sessions import (
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    MissingScopeError,
    Session,
    SQLStore,
    Store,
    StoreUnavailableError,
)
from durable_sessions.adapters.adk._models import (
    construct,
    constructor,
    rebuild,
    transcript_validator,
)
from durable_sessions.adk import DurableSessionService, durable_session_id
from durable_sessions.state import validate_id
from durable_sessions.testing.contract._common import past
from support.collector import HOSTS, watched_collector
from support.sql import STORE_SQL_BACKENDS, data_statements, statements

# ADK's StaleSessionError (a ValueError); older google-adk raised a plain ValueError.
StaleSessionError: type[ValueError] = getattr(adk_errors, "StaleSessionError", ValueError)
APP = "my_app"
ORG = "acme"


@pytest.fixture
def service(store: Store) -> DurableSessionService:
    return DurableSessionService(store, org_id=ORG)


def user_event(invocation_id: str = "inv", **kwargs: Any) -> Event:
    return Event(invocation_id=invocation_id, author="user", **kwargs)


def delta_event(delta: dict[str, Any], invocation_id: str = "inv", **kwargs: Any) -> Event:
    return user_event(invocation_id, actions=EventActions(state_delta=delta), **kwargs)


async def reload(service: DurableSessionService, session: AdkSession) -> AdkSession:
    got = await service.get_session(
        app_name=session.app_name, user_id=session.user_id, session_id=session.id
    )
    assert got is not None
    return got


def durable(session: AdkSession) -> str:
    return durable_session_id(session.app_name, session.user_id, session.id)


def stored_time(timestamp: float) -> float:
    """A timestamp as ADK's database (and durable-sessions) keeps it: to the microsecond."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).timestamp()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# -- the optional extra ---------------------------------------------------------------------

BLOCKED_IMPORT = """
import sys

class HideGoogle:
    def find_spec(self, name, path=None, target=None):
        if name == "google" or name.startswith("google."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, HideGoogle())
import durable_sessions  # the core never needs ADK
try:
    import durable_sessions.adk
except ImportError as exc:
    print(exc)
else:
    print("IMPORTED")
"""


def test_import_without_google_adk_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "durable-sessions[adk]"' in done.stdout
    assert "IMPORTED" not in done.stdout


# -- create, get, list, delete (ADK's suite) ------------------------------------------------


async def test_get_missing_session_returns_none(service: DurableSessionService) -> None:
    for missing in ("123", "", "   ", "x" * 300):
        assert await service.get_session(app_name=APP, user_id="u", session_id=missing) is None
        await service.delete_session(app_name=APP, user_id="u", session_id=missing)


async def test_create_get_delete(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", state={"key": "value"})
    assert session.app_name == APP
    assert session.user_id == "u"
    assert session.id
    assert session.state == {"key": "value"}
    assert session.events == []
    assert session.last_update_time <= time.time()

    got = await reload(service, session)
    assert got == session
    assert got.last_update_time <= time.time()

    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
    assert await service.get_session(app_name=APP, user_id="u", session_id=session.id) is None
    # Deleting what is not there is not an error, as in ADK.
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)


async def test_given_ids_are_kept_and_padding_is_stripped(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="  s1  ")
    assert session.id == "s1"
    padded = await service.get_session(app_name=APP, user_id="u", session_id=" s1 ")
    assert padded is not None
    assert padded.id == "s1"
    blank = await service.create_session(app_name=APP, user_id="u", session_id="   ")
    assert blank.id.strip()
    assert blank.id != "s1"
    await service.delete_session(app_name=APP, user_id="u", session_id=" s1 ")
    assert await service.get_session(app_name=APP, user_id="u", session_id="s1") is None


async def test_generated_ids_are_new_uuids(service: DurableSessionService) -> None:
    made = [await service.create_session(app_name=APP, user_id="u") for _ in range(3)]
    ids = [session.id for session in made]
    assert len(set(ids)) == 3
    for session_id in ids:
        assert len(session_id) == 36
        assert session_id[14] == "7"  # UUIDv7, time-ordered
    assert ids == sorted(ids)


async def test_an_existing_id_is_refused(service: DurableSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u", session_id="dup", state={"k": 1})
    with pytest.raises(AlreadyExistsError, match="Session with id dup already exists"):
        await service.create_session(app_name=APP, user_id="u", session_id="dup", state={"k": 2})
    got = await service.get_session(app_name=APP, user_id="u", session_id="dup")
    assert got is not None
    assert got.state == {"k": 1}


async def test_concurrent_creates_in_a_new_store_all_succeed(
    service: DurableSessionService,
) -> None:
    made = await asyncio.gather(
        *(
            service.create_session(app_name=f"app_{i}", user_id="u", session_id=f"s_{i}")
            for i in range(5)
        )
    )
    assert [s.id for s in made] == [f"s_{i}" for i in range(5)]
    for i in range(5):
        got = await service.get_session(app_name=f"app_{i}", user_id="u", session_id=f"s_{i}")
        assert got is not None


async def test_list_sessions_of_a_user_with_state(service: DurableSessionService) -> None:
    ids = [f"session{i}" for i in range(5)]
    for sid in ids:
        await service.create_session(
            app_name=APP, user_id="u", session_id=sid, state={"key": "value" + sid}
        )
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert {s.id for s in listed} == set(ids)
    for session in listed:
        assert session.state == {"key": "value" + session.id}
        assert session.events == []


async def test_list_sessions_of_every_user(service: DurableSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="1a", state={"k": "1a"})
    await service.create_session(app_name=APP, user_id="u1", session_id="1b", state={"k": "1b"})
    await service.create_session(app_name=APP, user_id="u2", session_id="2a", state={"k": "2a"})
    await service.create_session(app_name="other", user_id="u1", session_id="x")
    by_user = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert {s.id: s.state for s in by_user} == {"1a": {"k": "1a"}, "1b": {"k": "1b"}}
    assert [s.id for s in (await service.list_sessions(app_name=APP, user_id="u2")).sessions] == [
        "2a"
    ]
    everyone = (await service.list_sessions(app_name=APP)).sessions
    assert {(s.user_id, s.id): s.state for s in everyone} == {
        ("u1", "1a"): {"k": "1a"},
        ("u1", "1b"): {"k": "1b"},
        ("u2", "2a"): {"k": "2a"},
    }
    assert (await service.list_sessions(app_name="nobody's")).sessions == []


async def test_list_sessions_is_least_recently_updated_first(
    service: DurableSessionService,
) -> None:
    for sid in ("a", "b", "c"):
        await service.create_session(app_name=APP, user_id="u", session_id=sid)
    session_a = await service.get_session(app_name=APP, user_id="u", session_id="a")
    session_c = await service.get_session(app_name=APP, user_id="u", session_id="c")
    assert session_a is not None
    assert session_c is not None
    # The append is stamped after c's creation (a float time: a millisecond to spare).
    await past(
        datetime.fromtimestamp(session_c.last_update_time, timezone.utc),
        by=timedelta(milliseconds=1),
    )
    await service.append_event(session_a, user_event())
    listed = await service.list_sessions(app_name=APP, user_id="u")
    assert isinstance(listed, ListSessionsResponse)
    assert [s.id for s in listed.sessions] == ["b", "c", "a"]
    times = [s.last_update_time for s in listed.sessions]
    assert times == sorted(times)


@pytest.mark.parametrize("host", list(HOSTS))
async def test_no_adapter_call_touches_the_garbage_collector(
    service: DurableSessionService, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """Every ADK call (a listing of many sessions and a long transcript read included) leaves
    Python's collector as the host set it up, and never runs a collection."""
    with watched_collector(host, monkeypatch) as watch:
        made = await service.create_session(app_name=APP, user_id="u", state={"k": 1})
        for n in range(200):
            await service.append_event(made, delta_event({f"k{n % 3}": n}))
        for n in range(100):
            await service.create_session(app_name=APP, user_id=f"u{n % 7}", state={"n": n})
        got = await service.get_session(app_name=APP, user_id="u", session_id=made.id)
        assert got is not None
        assert len(got.events) == 200
        recent = GetSessionConfig(num_recent_events=20)
        await service.get_session(app_name=APP, user_id="u", session_id=made.id, config=recent)
        after = GetSessionConfig(after_timestamp=got.events[100].timestamp)
        await service.get_session(app_name=APP, user_id="u", session_id=made.id, config=after)
        assert len((await service.list_sessions(app_name=APP)).sessions) == 101
        await service.list_sessions(app_name=APP, user_id="u")
        await service.get_user_state(app_name=APP, user_id="u")
        await service.delete_session(app_name=APP, user_id="u", session_id=made.id)
        assert watch.calls == []


async def test_listed_sessions_are_what_get_session_returns_without_events(
    service: DurableSessionService,
) -> None:
    odd = ["a%2F", "p/q", "h#1", "plain"]
    for user in ("u1", "u2"):
        for sid in odd:
            made = await service.create_session(
                app_name=APP,
                user_id=user,
                session_id=sid,
                state={"k": sid, "user:u": {"who": [user]}, "app:a": [1], "temp:t": 1},
            )
            await service.append_event(made, delta_event({"n": 1, "user:plain": user}))
    await service.create_session(app_name="other", user_id="u1", session_id="x")
    for user_id in ("u1", None):
        listed = (await service.list_sessions(app_name=APP, user_id=user_id)).sessions
        assert len(listed) == (4 if user_id else 8)
        keys = [(s.last_update_time, s.user_id, s.id) for s in listed]
        assert keys == sorted(keys)
        for session in listed:
            got = await service.get_session(
                app_name=APP,
                user_id=session.user_id,
                session_id=session.id,
                config=GetSessionConfig(num_recent_events=0),
            )
            assert got is not None
            # list_sessions reports the last write; get_session the newest event's time.
            assert session.last_update_time >= got.last_update_time
            got.last_update_time = session.last_update_time
            assert_same(session, got, "session")
            assert set(session.state) == {"k", "n", "user:u", "user:plain", "app:a"}
        # Each session's state is its own, nested shared values too.
        listed[0].state["user:u"]["who"].append("changed")
        listed[0].state["app:a"].append(2)
        assert all(s.state["app:a"] == [1] for s in listed[1:])
        # A listed session is current: it takes an append.
        await service.append_event(listed[-1], delta_event({"n": 2}))
        again = await reload(service, listed[-1])
        assert again.state["n"] == 2


# -- ids are per (app, user) ----------------------------------------------------------------


async def test_two_users_may_both_have_a_session_main(service: DurableSessionService) -> None:
    first = await service.create_session(
        app_name=APP, user_id="u1", session_id="main", state={"who": "u1"}
    )
    await service.append_event(first, user_event())
    second = await service.create_session(
        app_name=APP, user_id="u2", session_id="main", state={"who": "u2"}
    )
    assert second.id == "main"
    assert second.user_id == "u2"
    got = await service.get_session(app_name=APP, user_id="u2", session_id="main")
    assert got is not None
    assert got.user_id == "u2"
    assert got.events == []  # u2's own session, not u1's
    assert got.state == {"who": "u2"}
    elsewhere = await service.create_session(app_name="other", user_id="u1", session_id="main")
    assert elsewhere.state == {}
    listed = (await service.list_sessions(app_name=APP)).sessions
    assert sorted((s.user_id, s.id) for s in listed) == [("u1", "main"), ("u2", "main")]

    await service.delete_session(app_name=APP, user_id="u2", session_id="main")
    still = await service.get_session(app_name=APP, user_id="u1", session_id="main")
    assert still is not None
    assert len(still.events) == 1
    assert await service.get_session(app_name="other", user_id="u1", session_id="main")


async def test_a_user_never_reads_appends_to_or_deletes_another_users_session(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(session, user_event())
    assert await service.get_session(app_name=APP, user_id="u2", session_id="s1") is None
    assert await service.get_session(app_name="other", user_id="u1", session_id="s1") is None
    await service.delete_session(app_name=APP, user_id="u2", session_id="s1")
    await service.delete_session(app_name="other", user_id="u1", session_id="s1")
    for forged in ("my_app/u1/s1", "../u1/s1", "s1/"):
        assert await service.get_session(app_name=APP, user_id="u2", session_id=forged) is None
        await service.delete_session(app_name=APP, user_id="u2", session_id=forged)
    stranger = AdkSession(id="s1", app_name=APP, user_id="u2")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(stranger, user_event())
    still = await reload(service, session)
    assert len(still.events) == 1


def test_durable_ids_are_readable_and_unique_per_app_and_user() -> None:
    assert durable_session_id("my_app", "alice", "main") == "my_app/alice/main"
    assert durable_session_id("a/b", "c%d", "e#f") == "a%2Fb/c%25d/e%23f"
    # The parts can never run into each other.
    assert durable_session_id("a", "b/c", "d") != durable_session_id("a/b", "c", "d")
    assert durable_session_id("a", "b%2Fc", "d") != durable_session_id("a", "b/c", "d")
    long_app, long_user = "a" * 130, "u" * 130
    hashed = durable_session_id(long_app, long_user, "main")
    assert hashed.startswith("#")
    assert hashed.endswith("/main")
    assert len(hashed) <= 255
    assert hashed != durable_session_id(long_app, "v" * 130, "main")
    with pytest.raises(InvalidArgumentError, match="too long"):
        durable_session_id(APP, "u", "s" * 250)
    # Within 255 characters but past 512 bytes of UTF-8, the limit the core also checks.
    wide_app, wide_user = "\U0001f600" * 70, "\u00fc" * 120
    readable = f"{wide_app}/{wide_user}/main"
    assert len(readable) <= 255 < len(readable.encode())
    wide = durable_session_id(wide_app, wide_user, "main")
    assert wide.startswith("#")
    assert wide.endswith("/main")
    assert durable_session_id("\U0001f600" * 30, "u", "main") == "\U0001f600" * 30 + "/u/main"
    with pytest.raises(InvalidArgumentError, match="too long") as refused:
        durable_session_id(APP, "u", "\U0001f600" * 126)  # 538 bytes hashed
    with pytest.raises(InvalidArgumentError) as core:
        validate_id("session_id", "#" + "0" * 32 + "/" + "\U0001f600" * 126)
    assert type(refused.value) is type(core.value)


async def test_long_and_odd_ids_work_end_to_end(service: DurableSessionService) -> None:
    odd = [
        ("a" * 140, "u" * 140, "main"),
        ("app/x", "user%y", "id#z/../w"),
        (APP, "ü-ser", "sess ion ✓"),
    ]
    for app_name, user_id, session_id in odd:
        made = await service.create_session(
            app_name=app_name, user_id=user_id, session_id=session_id, state={"k": session_id}
        )
        assert made.id == session_id
        await service.append_event(made, delta_event({"n": 1}))
        got = await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert got is not None
        assert got.state == {"k": session_id, "n": 1}
        listed = (await service.list_sessions(app_name=app_name, user_id=user_id)).sessions
        assert [s.id for s in listed] == [session_id]
        await service.delete_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert (await service.list_sessions(app_name=app_name, user_id=user_id)).sessions == []
    with pytest.raises(InvalidArgumentError, match="too long"):
        await service.create_session(app_name=APP, user_id="u", session_id="s" * 250)


async def test_ids_past_512_bytes_of_utf8_work_or_are_refused_before_any_write(
    service: DurableSessionService, store: Store
) -> None:
    # Each part fits, and the readable "app/user/id" has under 255 characters but over
    # 512 bytes: the session lives under the hashed id, end to end.
    app_name, user_id, session_id = "\U0001f600" * 70, "\u00fc" * 120, "\U0001f680" * 20
    made = await service.create_session(
        app_name=app_name, user_id=user_id, session_id=session_id, state={"k": 1}
    )
    await service.append_event(made, delta_event({"n": 1}))
    got = await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
    assert got is not None
    assert (got.id, got.state, len(got.events)) == (session_id, {"k": 1, "n": 1}, 1)
    listed = (await service.list_sessions(app_name=app_name, user_id=user_id)).sessions
    assert [s.id for s in listed] == [session_id]
    await service.delete_session(app_name=app_name, user_id=user_id, session_id=session_id)
    assert await service.get_session(
        app_name=app_name, user_id=user_id, session_id=session_id
    ) is None  # fmt: skip
    # An id whose hashed form passes 512 bytes is refused as the core refuses such an id,
    # before anything is written; the other calls find no such session.
    too_wide = "\U0001f600" * 126
    with pytest.raises(InvalidArgumentError, match="too long"):
        await service.create_session(app_name=APP, user_id="u", session_id=too_wide)
    assert await service.get_session(app_name=APP, user_id="u", session_id=too_wide) is None
    await service.delete_session(app_name=APP, user_id="u", session_id=too_wide)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(AdkSession(id=too_wide, app_name=APP, user_id="u"), user_event())
    assert await store.list(Filter(ORG)) == []
    assert await service.get_user_state(app_name=APP, user_id="u") == {}


async def test_the_core_api_finds_an_adk_session_by_its_durable_id(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(
        app_name=APP, user_id="alice", session_id="main", state={"topic": "trip"}
    )
    await service.append_event(session, delta_event({"user:lang": "fr"}))
    stored = await store.get(ORG, "my_app/alice/main")
    assert (stored.app_name, stored.user_id) == (APP, "alice")
    assert stored.state == {"topic": "trip", "user:lang": "fr"}
    (found,) = await store.list(Filter(ORG, user_id="alice", app_name=APP))
    assert found.id == durable(session)
    (record,) = await store.list_events(ORG, "my_app/alice/main")
    assert record.id == session.events[0].id


async def test_sessions_the_core_api_made_under_other_ids_are_not_listed(
    service: DurableSessionService, store: Store
) -> None:
    await service.create_session(app_name=APP, user_id="u", session_id="adk")
    manager = Manager(store, app_name=APP)
    await manager.create(ORG, "u", id="plain-core-id")
    # An id of the ADK form, but for another user than the one the row names: not u2's.
    await store.create(Session(id="my_app/u2/taken", org_id=ORG, user_id="u", app_name=APP))
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert [s.id for s in listed] == ["adk"]
    assert await service.get_session(app_name=APP, user_id="u", session_id="plain-core-id") is None
    assert await service.get_session(app_name=APP, user_id="u2", session_id="taken") is None
    assert await service.get_session(app_name=APP, user_id="u", session_id="taken") is None


async def test_delete_session_deletes_only_what_get_session_returns(
    service: DurableSessionService, store: Store
) -> None:
    long_app, long_user = "a" * 140, "u" * 140
    hashed = durable_session_id(long_app, long_user, "main")
    # Core sessions under ids of the ADK form, stored for another app or user than the id
    # names: no ADK call names them.
    forged = {
        "my_app/u2/taken": ("u", APP),
        "my_app/u2/elsewhere": ("u2", "other"),
        hashed: ("u", APP),
    }
    for durable_id, (user_id, app_name) in forged.items():
        await store.create(
            Session(id=durable_id, org_id=ORG, user_id=user_id, app_name=app_name, state={"k": 1})
        )
        await store.append_event(ORG, durable_id, DurableEvent(author="user", content="x"))
    calls = [(APP, "u2", "taken"), (APP, "u2", "elsewhere"), (long_app, long_user, "main")]
    for app_name, user_id, session_id in calls:
        assert await service.get_session(
            app_name=app_name, user_id=user_id, session_id=session_id
        ) is None  # fmt: skip
        await service.delete_session(app_name=app_name, user_id=user_id, session_id=session_id)
    for durable_id, (user_id, app_name) in forged.items():
        kept = await store.get_with_events(ORG, durable_id)
        assert (kept.user_id, kept.app_name, kept.state) == (user_id, app_name, {"k": 1})
        assert len(kept.events) == 1
    # The one get_session returns is the one delete_session deletes.
    mine = await service.create_session(app_name=long_app, user_id="u", session_id="taken")
    await service.append_event(mine, user_event())
    await service.delete_session(app_name=long_app, user_id="u", session_id="taken")
    assert await service.get_session(app_name=long_app, user_id="u", session_id="taken") is None
    assert await store.list(Filter(ORG, app_name=long_app)) == []


async def test_the_command_line_shows_an_adk_session(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
    engine = create_async_engine(url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        service = DurableSessionService(store, org_id=ORG)
        session = await service.create_session(app_name=APP, user_id="alice", session_id="main")
        await service.append_event(session, delta_event({"user:lang": "fr"}, "inv-cli"))
    finally:
        await engine.dispose()

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "durable_sessions", "--url", url, *argv, "--org", ORG],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "my_app/alice/main" in run("list", "--app", APP, "--user", "alice")
    shown = run("show", "my_app/alice/main")
    assert "alice" in shown
    assert "lang" in shown


# -- state scoping (ADK's suite) ------------------------------------------------------------


async def test_app_state_is_shared_by_every_user_of_the_app(
    service: DurableSessionService,
) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1"}
    )
    await service.append_event(s1, delta_event({"app:k2": "v2"}))
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
    again = await reload(service, s1)
    assert again.state == {"app:k1": "v1", "app:k2": "v2"}
    elsewhere = await service.create_session(app_name="other", user_id="u1")
    assert elsewhere.state == {}


async def test_user_state_is_shared_by_the_users_sessions_only(
    service: DurableSessionService,
) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"user:k1": "v1"}
    )
    await service.append_event(s1, delta_event({"user:k2": "v2"}))
    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {"user:k1": "v1", "user:k2": "v2"}
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert s2.state == {}


async def test_session_state_is_private(service: DurableSessionService) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"sk1": "v1"}
    )
    await service.append_event(s1, delta_event({"sk2": "v2"}))
    again = await reload(service, s1)
    assert again.state == {"sk1": "v1", "sk2": "v2"}
    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {}


@pytest.mark.parametrize(
    "delta",
    [
        None,
        {"session_key": "v"},
        {"app:key": "v"},
        {"user:key": "v"},
        {"app:a": "1", "user:b": "2", "sk": "3"},
    ],
    ids=["none", "session", "app", "user", "all_scopes"],
)
async def test_a_delta_of_any_scope_is_stored_where_it_belongs(
    service: DurableSessionService, delta: dict[str, Any] | None
) -> None:
    session = await service.create_session(app_name=APP, user_id="user", session_id="s1")
    event = user_event() if delta is None else delta_event(delta)
    await service.append_event(session, event)
    expected = delta or {}
    assert (await reload(service, session)).state == expected
    sibling = await service.create_session(app_name=APP, user_id="user", session_id="s2")
    assert sibling.state == {k: v for k, v in expected.items() if ":" in k}


async def test_deltas_replace_values_store_null_and_keep_types(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(
        app_name=APP,
        user_id="u1",
        state={"profile": {"name": "ada", "role": "admin"}, "flag": False, "app:cfg": {"a": 1}},
    )
    await service.append_event(
        session,
        delta_event({"profile": {"name": "bob"}, "gone": None, "app:cfg": {"b": 2}, "n": 1.0}),
    )
    for state in (session.state, (await reload(service, session)).state):
        assert state["profile"] == {"name": "bob"}  # replaced, not deep-merged
        assert "gone" in state
        assert state["gone"] is None  # None is stored, not a deletion
        assert state["flag"] is False
        assert state["app:cfg"] == {"b": 2}
        assert state["n"] == 1.0
        assert isinstance(state["n"], float)


async def test_temp_state_lives_only_in_the_session_object(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"temp:boot": 1, "kept": 1}
    )
    assert "temp:boot" not in session.state
    event = delta_event({"temp:k1": "v1", "sk": "v2"}, "inv1")
    await service.append_event(session, event)
    # Visible for the rest of the invocation, stripped from the event, never stored.
    assert session.state["temp:k1"] == "v1"
    assert session.state["sk"] == "v2"
    assert event.actions.state_delta == {"sk": "v2"}
    got = await reload(service, session)
    assert "temp:k1" not in got.state
    assert got.state["sk"] == "v2"
    assert got.events[0].actions.state_delta == {"sk": "v2"}
    (record,) = await store.list_events(ORG, durable(session))
    assert record.state_delta == {"sk": "v2"}
    assert "temp:k1" not in json.dumps(record.content)


async def test_temp_state_is_visible_to_the_next_agent(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s_seq")
    first = Event(
        invocation_id="inv1",
        author="agent1",
        actions=EventActions(state_delta={"temp:output": "result_from_a1"}),
    )
    await service.append_event(session, first)
    assert session.state.get("temp:output") == "result_from_a1"
    assert "temp:output" not in first.actions.state_delta


async def test_values_that_are_not_json_are_stored_as_adk_stores_them(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", state={"n": 1})
    await service.append_event(session, delta_event({"callback": lambda: 1, "ok": 2}))
    got = await reload(service, session)
    assert got.state["ok"] == 2
    assert isinstance(got.state["callback"], str)
    assert len(got.events) == 1


# -- get_user_state ----------------------------------------------------------------------------


async def test_get_user_state_is_empty_when_there_is_none(service: DurableSessionService) -> None:
    assert await service.get_user_state(app_name=APP, user_id="u1") == {}


async def test_get_user_state_returns_what_events_wrote(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(
        session,
        Event(
            author="system",
            actions=EventActions(
                state_delta={"user:profile": {"name": "Alice"}, "session_key": 1, "app:a": 1}
            ),
        ),
    )
    state = await service.get_user_state(app_name=APP, user_id="u1")
    assert state == {"profile": {"name": "Alice"}}


async def test_get_user_state_is_kept_apart_by_user_and_app(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(session, delta_event({"user:secret": "only-for-u1"}))
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other_app", user_id="u1") == {}
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"secret": "only-for-u1"}
    other_org = DurableSessionService(service.store, org_id="other-org")
    assert await other_org.get_user_state(app_name=APP, user_id="u1") == {}


async def test_get_user_state_works_without_any_session(service: DurableSessionService) -> None:
    first = await service.create_session(
        app_name=APP, user_id="u1", session_id="first", state={"user:ctx": {"v": 1}}
    )
    await service.append_event(first, delta_event({"user:seen": 1}))
    await service.delete_session(app_name=APP, user_id="u1", session_id="first")
    # The user has no session now: their state is still there for the next one.
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"ctx": {"v": 1}, "seen": 1}
    nxt = await service.create_session(app_name=APP, user_id="u1")
    assert nxt.state == {"user:ctx": {"v": 1}, "user:seen": 1}


async def test_get_user_state_reflects_the_latest_write(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(session, delta_event({"user:counter": 1}))
    await service.append_event(session, delta_event({"user:counter": 2}))
    assert (await service.get_user_state(app_name=APP, user_id="u1"))["counter"] == 2


async def test_the_store_reads_shared_state_without_a_session(store: Store) -> None:
    assert await store.get_shared_state(ORG, APP, "u1") == {}
    manager = Manager(store, app_name=APP)
    made = await manager.create(ORG, "u1", state={"user:a": 1, "app:b": [2], "private": 3})
    await manager.create(ORG, "u2", state={"user:a": "u2's"})
    await Manager(store, app_name="other").create(ORG, "u1", state={"user:a": "other's"})
    await manager.delete(ORG, made.id)
    assert await store.get_shared_state(ORG, APP, "u1") == {"user:a": 1, "app:b": [2]}
    assert await store.get_shared_state(ORG, APP, "nobody") == {"app:b": [2]}
    assert await store.get_shared_state("other-org", APP, "u1") == {}
    assert await store.get_shared_state(ORG, "", "u1") == {}
    for bad in (("", APP, "u1"), (ORG, APP, ""), (ORG, "x" * 300, "u1")):
        with pytest.raises(InvalidArgumentError):
            await store.get_shared_state(*bad)


# -- events (ADK's suite) ---------------------------------------------------------------------


async def test_get_session_with_config(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="user")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=i))

    async def events(**config: Any) -> list[float]:
        got = await service.get_session(
            app_name=APP, user_id="user", session_id=session.id, config=GetSessionConfig(**config)
        )
        assert got is not None
        assert got.last_update_time == 5.0  # whatever the filter, the newest event's
        return [e.timestamp for e in got.events]

    assert await events() == [1, 2, 3, 4, 5]
    assert await events(num_recent_events=0) == []
    assert await events(num_recent_events=3) == [3, 4, 5]
    assert await events(num_recent_events=7) == [1, 2, 3, 4, 5]
    assert await events(after_timestamp=4.0) == [4, 5]  # inclusive
    assert await events(after_timestamp=3.5) == [4, 5]
    assert await events(after_timestamp=50.0) == []
    assert await events(after_timestamp=4.0, num_recent_events=3) == [4, 5]
    assert await events(after_timestamp=1.0, num_recent_events=2) == [4, 5]


async def test_a_negative_num_recent_events_is_refused(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    with pytest.raises(ValueError, match="limit"):
        await service.get_session(
            app_name=APP,
            user_id="u",
            session_id=session.id,
            config=GetSessionConfig.model_construct(num_recent_events=-1),
        )


async def test_after_timestamp_is_exact_below_a_microsecond(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    stamp = 1_700_000_000.1234567  # finer than the stored microseconds
    await service.append_event(session, Event(author="user", timestamp=stamp - 2e-7))
    await service.append_event(session, Event(author="user", timestamp=stamp))
    for limit in (None, 1, 2):
        got = await service.get_session(
            app_name=APP,
            user_id="u",
            session_id=session.id,
            config=GetSessionConfig(after_timestamp=stamp, num_recent_events=limit),
        )
        assert got is not None
        assert [e.timestamp for e in got.events] == [stamp]


def rich_event() -> Event:
    call = types.FunctionCall(id="call-1", name="lookup", args={"city": "Paris", "n": [1, 2.5]})
    reply = types.FunctionResponse(id="call-1", name="lookup", response={"temp_c": 21.5})
    return Event(
        invocation_id="invocation",
        author="planner",
        branch="root.planner",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="Let me check."),
                types.Part(function_call=call),
                types.Part(function_response=reply),
                types.Part.from_bytes(data=b"\x00\x01image", mime_type="image/png"),
            ],
        ),
        turn_complete=True,
        partial=False,
        actions=EventActions(
            state_delta={"sk": {"nested": [1, "two", None]}, "user:lang": "fr"},
            artifact_delta={"file": 0},
            transfer_to_agent="agent",
            escalate=True,
        ),
        long_running_tool_ids={"tool2", "tool1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(
            web_search_queries=["query1"],
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob"),
        ),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=7, candidates_token_count=5, total_token_count=12
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1_700_000_000.123456,
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=True),
    )


async def test_an_event_round_trips_exactly_as_json(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = rich_event()
    returned = await service.append_event(session, event)
    assert returned is event
    assert session.events == [event]
    assert session.last_update_time == pytest.approx(event.timestamp, abs=1e-6)

    got = await reload(service, session)
    assert got == session  # events, state, timestamp and revision alike
    assert got.events[0] == event
    assert got.events[0].content == event.content
    assert got.events[0].grounding_metadata == event.grounding_metadata

    (record,) = await store.list_events(ORG, durable(session))
    assert record.content == json.loads(
        json.dumps(event.model_dump(mode="json", exclude_none=True))
    )
    assert record.state_delta == {"sk": {"nested": [1, "two", None]}, "user:lang": "fr"}
    assert record.id == event.id
    assert record.author == "planner"
    assert record.invocation_id == "invocation"
    assert record.tokens == 12
    assert record.timestamp.timestamp() == pytest.approx(event.timestamp, abs=1e-6)
    stored = await store.get(ORG, durable(session))
    assert stored.message_count == 1
    assert stored.token_total == 12


async def test_an_event_with_bytes_round_trips(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="user")
    content = types.Content(
        role="user",
        parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")],
    )
    grounding = types.GroundingMetadata(
        search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
    )
    event = Event(
        invocation_id="invocation", author="user", content=content, grounding_metadata=grounding
    )
    await service.append_event(session, event)
    assert session.events[0].content == content
    (got,) = (await reload(service, session)).events
    assert got.content == content
    assert got.grounding_metadata == grounding


async def test_partial_events_are_not_persisted(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = Event(author="user", partial=True, actions=EventActions(state_delta={"k": 1}))
    assert await service.append_event(session, event) is event
    assert session.events == []
    assert "k" not in session.state
    got = await reload(service, session)
    assert got.events == []
    assert got == session


async def test_an_event_is_stored_once(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    loaded = await reload(service, session)
    await service.append_event(loaded, user_event("inv1"))
    assert len((await reload(service, session)).events) == 1
    assert len(loaded.events) == 1


async def test_last_update_time_follows_the_newest_event(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    created = session.last_update_time
    event = user_event(timestamp=created + 10)
    await service.append_event(session, event)
    assert session.last_update_time == pytest.approx(event.timestamp, abs=1e-6)
    assert session.last_update_time == stored_time(event.timestamp)  # as ADK's database
    got = await reload(service, session)
    assert got.last_update_time == pytest.approx(event.timestamp, abs=1e-6)
    assert got.last_update_time > created
    assert got == session


async def test_list_sessions_reports_the_last_write(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, user_event())
    (listed,) = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    stored = await store.get(ORG, durable(session))
    assert listed.last_update_time == stored.updated_at.timestamp()
    assert listed.last_update_time >= session.last_update_time
    assert listed.last_update_time - session.last_update_time < 5


async def test_the_adapter_keeps_nothing_of_its_own_in_stored_state(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", state={"a": 1})
    for i in range(3):
        await service.append_event(session, delta_event({"n": i, "user:u": i}))
    stored = await store.get(ORG, durable(session))
    assert stored.state == {"a": 1, "n": 2, "user:u": 2}
    for record in await store.list_events(ORG, durable(session)):
        assert set(record.state_delta) == {"n", "user:u"}
    assert (await reload(service, session)).state == stored.state


async def test_events_written_by_other_writers_read_as_text(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await store.append_event(ORG, durable(session), DurableEvent(author="user", content="hello"))
    (event,) = (await reload(service, session)).events
    assert event.author == "user"
    assert event.content == types.Content(role="user", parts=[types.Part(text="hello")])


async def test_durable_features_work_on_adk_sessions(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", state={"topic": "trip"})
    await service.append_event(session, rich_event())
    child = await store.fork(
        ORG,
        durable(session),
        new_session_id=durable_session_id(APP, "u", "branch"),
        with_events=True,
    )
    forked = await service.get_session(app_name=APP, user_id="u", session_id="branch")
    assert forked is not None
    assert forked.events == session.events
    assert forked.state == {**session.state, "forked_from": durable(session)}
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert {s.id for s in listed} == {session.id, "branch"}
    assert (await store.get(ORG, child.id)).token_total == 12


# -- values that cannot be stored ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [100, 2000])
async def test_state_nested_too_deep_is_refused_with_nothing_written(
    service: DurableSessionService, store: Store, depth: int
) -> None:
    with pytest.raises(InvalidStateError):
        await service.create_session(
            app_name=APP, user_id="u", session_id="deep", state={"deep": nested(depth)}
        )
    assert await service.get_session(app_name=APP, user_id="u", session_id="deep") is None
    assert await store.list(Filter(ORG)) == []

    session = await service.create_session(app_name=APP, user_id="u", state={"k": 1})
    session.state["temp:was"] = "before"
    delta = {"temp:was": "after", "temp:new": 1, "user:deep": nested(depth), "k": 2}
    event = delta_event(delta)
    with pytest.raises(InvalidStateError):
        await service.append_event(session, event)
    assert event.actions.state_delta == delta  # the event and session as they were
    assert session.state == {"k": 1, "temp:was": "before"}
    assert session.events == []
    got = await reload(service, session)
    assert got.state == {"k": 1}
    assert got.events == []
    assert await store.get_shared_state(ORG, APP, "u") == {}
    # The session works on.
    await service.append_event(session, delta_event({"k": 3}))
    assert (await reload(service, session)).state == {"k": 3}


# -- stale sessions and missing ones (ADK's suite) ------------------------------------------


async def test_appending_to_a_stale_session_is_refused(service: DurableSessionService) -> None:
    now = time.time()
    original = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(original, delta_event({"sk1": "v1"}, "inv1", timestamp=now + 1))
    updated = await reload(service, original)
    await service.append_event(updated, delta_event({"sk2": "v2"}, "inv2", timestamp=now + 2))
    assert original.last_update_time < updated.last_update_time
    assert len(original.events) == 1
    assert "sk2" not in original.state

    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(original, delta_event({"sk3": "v3"}, "inv3"))
    final = await reload(service, original)
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert final.state == {"sk1": "v1", "sk2": "v2"}
    assert isinstance(StaleSessionError(), ValueError)


async def test_of_two_copies_appending_at_once_one_wins(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(8):
        latest = await reload(service, session)
        copies = [latest.model_copy(deep=True) for _ in range(2)]
        results = await asyncio.gather(
            *(
                service.append_event(copy, delta_event({f"k{i}-{n}": n}, f"inv{i}-{n}"))
                for n, copy in enumerate(copies)
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1
        assert isinstance(errors[0], StaleSessionError)
        assert "modified in storage" in str(errors[0])
    final = await reload(service, session)
    assert len(final.events) == 8
    assert len(final.state) == 8


async def test_a_drifting_update_time_is_not_staleness(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="user", session_id="s1")
    first = user_event("inv1", timestamp=session.last_update_time + 10)
    await service.append_event(session, first)
    session.last_update_time -= 0.0001  # a float round trip, not a newer revision
    await service.append_event(session, user_event("inv2", timestamp=first.timestamp + 10))
    assert [e.invocation_id for e in (await reload(service, session)).events] == ["inv1", "inv2"]


async def test_a_session_without_a_marker_is_checked_by_its_events(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    first = user_event("inv1")
    await service.append_event(session, first)
    session._storage_update_marker = None
    session.last_update_time -= 0.0001
    await service.append_event(session, user_event("inv2"))
    current = AdkSession(id="s", app_name=APP, user_id="u", events=list(session.events))
    await service.append_event(current, user_event("inv3"))
    behind = AdkSession(id="s", app_name=APP, user_id="u", events=[first])
    with pytest.raises(StaleSessionError):
        await service.append_event(behind, user_event("inv4"))
    got = await reload(service, session)
    assert [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]


async def test_a_change_made_through_the_library_makes_the_session_stale(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await store.touch(ORG, durable(session), messages=1, title="Renamed elsewhere")
    with pytest.raises(StaleSessionError):
        await service.append_event(session, user_event())
    fresh = await reload(service, session)
    await service.append_event(fresh, user_event())


async def test_a_session_object_of_a_deleted_and_recreated_id_is_stale(
    service: DurableSessionService,
) -> None:
    old = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    await service.delete_session(app_name=APP, user_id="u", session_id="s1")
    await service.create_session(app_name=APP, user_id="u", session_id="s1", state={"new": 1})
    # Same id, same version number: another session all the same.
    with pytest.raises(StaleSessionError):
        await service.append_event(old, delta_event({"k": 1}))
    fresh = await service.get_session(app_name=APP, user_id="u", session_id="s1")
    assert fresh is not None
    assert fresh.events == []
    assert fresh.state == {"new": 1}
    await service.append_event(fresh, user_event())


async def test_appending_to_a_deleted_or_unknown_session_raises_not_found(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, user_event())
    never = AdkSession(id="never_created", app_name=APP, user_id="u")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(never, user_event())


class FailingStore:
    """A store whose next write fails before reaching the store under it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in ("create", "append_event", "delete"):
            return method

        async def maybe_fail(*args: Any, **kwargs: Any) -> Any:
            if self.fail:
                raise StoreUnavailableError("the database went away")
            return await method(*args, **kwargs)

        return maybe_fail


async def test_a_failed_write_leaves_nothing_and_the_service_works_on(store: Store) -> None:
    failing = FailingStore(store)
    service = DurableSessionService(failing, org_id=ORG)  # type: ignore[arg-type]
    session = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    await service.append_event(session, delta_event({"key1": "value1"}, "inv1"))
    failing.fail = True
    for _ in range(3):
        with pytest.raises(StoreUnavailableError):
            await service.create_session(app_name=APP, user_id="u", session_id="should_fail")
        with pytest.raises(StoreUnavailableError):
            await service.append_event(session, delta_event({"key2": "value2"}, "inv2"))
        with pytest.raises(StoreUnavailableError):
            await service.delete_session(app_name=APP, user_id="u", session_id="s1")
    failing.fail = False
    assert await service.get_session(app_name=APP, user_id="u", session_id="should_fail") is None
    got = await service.get_session(app_name=APP, user_id="u", session_id="s1")
    assert got is not None
    assert [e.invocation_id for e in got.events] == ["inv1"]
    assert got.state == {"key1": "value1"}
    recovered = await service.create_session(app_name=APP, user_id="u", session_id="recovered")
    assert recovered.id == "recovered"


# -- organisations ------------------------------------------------------------------------------


def bound(store: Store, org_id: str) -> Any:
    """Bind an organisation in the context, as a multi-tenant request handler would."""
    return Manager(store).bind(Session(id="request", org_id=org_id, user_id="-"))


async def test_organisations_are_kept_apart_through_the_bound_context(store: Store) -> None:
    service = DurableSessionService(store)
    with pytest.raises(MissingScopeError):
        await service.create_session(app_name=APP, user_id="u")
    with bound(store, "org-a"):
        a = await service.create_session(
            app_name=APP, user_id="u", session_id="same", state={"app:plan": "gold", "k": "a"}
        )
        await service.append_event(a, delta_event({"user:seen": True}))
    with bound(store, "org-b"):
        assert await service.get_session(app_name=APP, user_id="u", session_id="same") is None
        assert (await service.list_sessions(app_name=APP)).sessions == []
        assert await service.get_user_state(app_name=APP, user_id="u") == {}
        b = await service.create_session(app_name=APP, user_id="u", session_id="same")
        assert b.state == {}  # neither org-a's app: nor user: state
        with pytest.raises(SessionNotFoundError):
            await service.append_event(a, user_event())
        await service.delete_session(app_name=APP, user_id="u", session_id="same")
    with bound(store, "org-a"):
        got = await service.get_session(app_name=APP, user_id="u", session_id="same")
        assert got is not None
        assert got.state == {"app:plan": "gold", "k": "a", "user:seen": True}
        assert len(got.events) == 1
        assert await service.get_user_state(app_name=APP, user_id="u") == {"seen": True}
    fixed = DurableSessionService(store, org_id="org-a")
    assert await fixed.get_session(app_name=APP, user_id="u", session_id="same") == got


# -- models built as ADK builds them --------------------------------------------------------------


def assert_same(a: Any, b: Any, path: str = "event") -> None:
    """Assert two values are alike down to every type, field set and private attribute."""
    assert type(a) is type(b), f"{path}: {type(a)} is not {type(b)}"
    if isinstance(a, pydantic.BaseModel):
        assert a.model_fields_set == b.model_fields_set, path
        assert a.__pydantic_private__ == b.__pydantic_private__, path
        assert a.__pydantic_extra__ == b.__pydantic_extra__, path
        assert list(a.__dict__) == list(b.__dict__), path
        for key, value in a.__dict__.items():
            assert_same(value, b.__dict__[key], f"{path}.{key}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key, value in a.items():
            assert_same(value, b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def sample_events() -> list[Event]:
    confirmation = ToolConfirmation(hint="sure?", confirmed=True, payload={"x": [1, 2.5]})
    return [
        rich_event(),
        Event(
            author="user",
            invocation_id="inv-1",
            content=types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
            actions=EventActions(state_delta={"k": 1, "user:k0": 1, "app:k0": 1}),
        ),
        Event(author="agent", timestamp=5, content=types.Content(parts=[types.Part(text="x")])),
        Event(
            author="coder",
            invocation_id="inv-2",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="thinking", thought=True, thought_signature=b"\x01sig"),
                    types.Part(
                        executable_code=types.ExecutableCode(
                            code="print(1)", language=types.Language.PYTHON
                        )
                    ),
                    types.Part(
                        code_execution_result=types.CodeExecutionResult(
                            outcome=types.Outcome.OUTCOME_OK, output="1"
                        )
                    ),
                    types.Part(
                        file_data=types.FileData(file_uri="gs://b/f.pdf", mime_type="x/pdf"),
                        video_metadata=types.VideoMetadata(fps=2.5, start_offset="1s"),
                    ),
                ],
            ),
            finish_reason=types.FinishReason.STOP,
            avg_logprobs=-0.25,
            model_version="m-1",
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=3,
                total_token_count=5,
                prompt_tokens_details=[
                    types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=3)
                ],
            ),
            citation_metadata=types.CitationMetadata(
                citations=[types.Citation(start_index=0, end_index=3, uri="https://x")]
            ),
            actions=EventActions(
                skip_summarization=True,
                requested_tool_confirmations={"fc-1": confirmation},
                agent_state={"step": 2},
                end_of_agent=True,
                rewind_before_invocation_id="inv-0",
                compaction=EventCompaction(
                    start_timestamp=1.0,
                    end_timestamp=2.0,
                    compacted_content=types.Content(role="model", parts=[types.Part(text="s")]),
                ),
            ),
            output={"answer": [1, 2.5, None]},
            branch="a.b",
            long_running_tool_ids=set(),
        ),
    ]


def test_stored_events_are_rebuilt_exactly_as_model_validate_builds_them() -> None:
    for event in sample_events():
        data = json.loads(json.dumps(event.model_dump(mode="json", exclude_none=True)))
        expected = Event.model_validate(data)
        got = rebuild(Event, data)
        assert got == expected == event
        assert_same(got, expected)
    # Data the fast path does not take is validated: unknown keys, shortcuts, bad types.
    base = sample_events()[1].model_dump(mode="json", exclude_none=True)
    for data in (
        {**base, "not_a_field": 1},
        {**base, "state": {"via": "shortcut"}},
        {**base, "timestamp": "12.5"},
        {**base, "content": {"parts": [{"text": "x", "thoughtSignature": "AQ=="}]}},
    ):
        assert_same(rebuild(Event, data), Event.model_validate(data))
    with pytest.raises(pydantic.ValidationError):
        rebuild(Event, {**base, "author": ["not", "text"]})


def transcript_text(contents: list[Any]) -> str:
    """The text of ``Store.get_with_events_json`` for events of these contents."""
    items = [
        [n, f"e{n}", "a", "i", c, {"k": n}, 0, 1_700_000_000_000_000 + n]
        for n, c in enumerate(contents, 1)
    ]
    return json.dumps(items)


def model_classes(cls: type[pydantic.BaseModel], seen: set[type] | None = None) -> set[type]:
    """``cls`` and every model class its fields reach."""
    seen = set() if seen is None else seen
    seen.add(cls)
    for info in cls.model_fields.values():
        stack = [info.annotation]
        while stack:
            kind = stack.pop()
            stack += list(getattr(kind, "__args__", ()))
            if isinstance(kind, type) and issubclass(kind, pydantic.BaseModel) and kind not in seen:
                model_classes(kind, seen)
    return seen


def test_stored_events_are_validated_from_json_as_model_validate_builds_them() -> None:
    classes = model_classes(Event)
    before = {cls: dict(cls.__dict__) for cls in classes}
    validator = transcript_validator(Event)
    # No class is changed to build it: every attribute of every model class is as it was.
    assert {cls: dict(cls.__dict__) for cls in classes} == before
    dumps = [
        json.loads(json.dumps(event.model_dump(mode="json", exclude_none=True)))
        for event in sample_events()
    ]
    items = validator.validate_json(transcript_text(dumps))
    assert [item[0] for item in items] == list(range(1, len(dumps) + 1))
    for item, data in zip(items, dumps, strict=True):
        assert_same(item[4], Event.model_validate(data))
    base = dumps[1]
    assert_same(Event.model_validate(base), rebuild(Event, base))
    # What it does not take raises, so that callers validate the usual way: the shortcuts
    # ADK's Event routes (and any key Event does not declare), other types, bad values.
    for data in (
        {**base, "state": {"via": "shortcut"}},
        {**base, "message": "hi"},
        {**base, "not_a_field": 1},
        {**base, "author": ["not", "text"]},
        {**base, "content": {"parts": [{"text": "x", "unknown": 1}]}},
        "plain text",
        None,
    ):
        with pytest.raises(pydantic.ValidationError):
            validator.validate_json(transcript_text([data]))
    assert validator.validate_json("[]") == []


async def test_an_adk_shaped_event_of_another_writer_reads_as_model_validate_reads_it(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, delta_event({"a": 1}))
    dump = delta_event({"b": 2}).model_dump(mode="json", exclude_none=True)
    shortcut = {**dump, "id": "other", "state": {"via": "shortcut"}}
    await store.append_event(ORG, durable(session), DurableEvent(author="user", content=shortcut))
    await store.append_event(ORG, durable(session), DurableEvent(author="user", content="hi"))
    events = (await reload(service, session)).events
    assert events[0] == session.events[0]
    assert_same(events[1], Event.model_validate(shortcut))
    assert events[1].actions.state_delta == {"via": "shortcut"}
    assert events[2].content == types.Content(role="user", parts=[types.Part(text="hi")])
    newest = await service.get_session(
        app_name=APP,
        user_id="u",
        session_id=session.id,
        config=GetSessionConfig(num_recent_events=1),
    )
    assert newest is not None
    assert [e.content for e in newest.events] == [events[2].content]


def test_sessions_are_built_as_their_constructor_builds_them() -> None:
    events = sample_events()[:2]
    values = {
        "id": "s",
        "app_name": APP,
        "user_id": "u",
        "state": {"a": 1},
        "events": events,
        "last_update_time": 1.5,
    }
    expected = AdkSession(**values)
    expected._storage_update_marker = "m"
    got = construct(AdkSession, values, _storage_update_marker="m")
    assert got == expected
    assert_same(got, expected)
    names = ("id", "app_name", "user_id", "state", "events", "last_update_time")
    made = constructor(AdkSession, names, "_storage_update_marker")(
        tuple(values[name] for name in names), "m"
    )
    assert made == expected
    assert_same(made, expected)
    assert made._storage_update_marker == "m"
    assert made.model_fields_set is not got.model_fields_set  # each model its own set
    # Another shape than every field in order: built by construct, the same model.
    partial = constructor(AdkSession, ("id", "app_name", "user_id"), "_storage_update_marker")
    assert_same(
        partial(("s", APP, "u"), "m"),
        construct(
            AdkSession, {"id": "s", "app_name": APP, "user_id": "u"}, _storage_update_marker="m"
        ),
    )
    assert_same(
        construct(ListSessionsResponse, {"sessions": [got]}),
        ListSessionsResponse(sessions=[expected]),
    )


# -- an ADK Runner with a scripted model ----------------------------------------------------


class ScriptedLlm(BaseLlm):
    """A model that answers from a script and records every request it gets."""

    script: list[LlmResponse] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        self.requests.append(llm_request)
        yield self.script.pop(0)


def reply(*parts: types.Part, tokens: int = 10) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=list(parts)),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=tokens - 2, candidates_token_count=2, total_token_count=tokens
        ),
    )


def remember_city(city: str, tool_context: ToolContext) -> dict[str, str]:
    """Remember the city the user lives in."""
    tool_context.state["user:city"] = city
    tool_context.state["temp:scratch"] = "not stored"
    tool_context.state["visits"] = tool_context.state.get("visits", 0) + 1
    return {"status": "saved", "city": city}


def make_agent(model: ScriptedLlm) -> LlmAgent:
    return LlmAgent(
        name="concierge",
        model=model,
        instruction="Help the user. Their city: {user:city?}.",
        tools=[remember_city],
    )


async def run_turn(runner: Runner, session_id: str, text: str) -> list[Event]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner.run_async(
            user_id="alice", session_id=session_id, new_message=message
        )
    ]


def texts(request: LlmRequest) -> list[str]:
    return [p.text for c in request.contents for p in c.parts or [] if p.text]


# google-adk 2.0 announces an experimental feature it turns on when declaring tools.
@pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\] feature:UserWarning")
async def test_a_runner_drives_an_agent_and_a_second_runner_resumes(
    request: pytest.FixtureRequest, backend: str, store: Store
) -> None:
    call = types.FunctionCall(id="fc-1", name="remember_city", args={"city": "Paris"})
    model = ScriptedLlm(
        model="scripted",
        script=[
            reply(types.Part(function_call=call), tokens=12),
            reply(types.Part(text="Noted: Paris."), tokens=20),
            reply(types.Part(text="You live in Paris."), tokens=30),
        ],
    )
    service = DurableSessionService(store, org_id=ORG)
    runner = Runner(agent=make_agent(model), app_name="trips", session_service=service)
    session = await service.create_session(app_name="trips", user_id="alice", session_id="main")

    first = await run_turn(runner, session.id, "I live in Paris, remember it.")
    assert first[-1].content is not None
    assert first[-1].content.parts is not None
    assert first[-1].content.parts[0].text == "Noted: Paris."
    assert any(e.get_function_responses() for e in first)
    second = await run_turn(runner, session.id, "Where do I live?")
    assert second[-1].content is not None
    assert second[-1].content.parts is not None
    assert second[-1].content.parts[0].text == "You live in Paris."
    assert "Paris" in str(model.requests[-1].config.system_instruction)

    before = await service.get_session(app_name="trips", user_id="alice", session_id=session.id)
    assert before is not None
    for event, record in zip(
        before.events, await store.list_events(ORG, "trips/alice/main"), strict=True
    ):
        assert_same(event, Event.model_validate(record.content))

    # A second Runner, over a new store object on the same database, resumes the session.
    engine = None
    if backend == "memory":
        assert isinstance(store, InMemoryStore)
        store2: Store = store
    else:
        engine = create_async_engine(str(request.getfixturevalue("backend_url")))
        store2 = SQLStore(engine)
    try:
        model2 = ScriptedLlm(model="scripted", script=[reply(types.Part(text="Still Paris."))])
        service2 = DurableSessionService(store2, org_id=ORG)
        runner2 = Runner(agent=make_agent(model2), app_name="trips", session_service=service2)
        resumed = await service2.get_session(
            app_name="trips", user_id="alice", session_id=session.id
        )
        assert resumed is not None
        assert resumed.state == {"user:city": "Paris", "visits": 1}
        assert resumed == before  # the same history, state and revision from another store
        yielded = {e.id: e for e in [*first, *second]}
        assert [e for e in resumed.events if e.id in yielded] == list(yielded.values())
        authors = ["user", "concierge", "concierge", "concierge", "user", "concierge"]
        assert [e.author for e in resumed.events] == authors

        third = await run_turn(runner2, session.id, "And now?")
        assert third[-1].content is not None
        assert third[-1].content.parts is not None
        assert third[-1].content.parts[0].text == "Still Paris."
        seen = texts(model2.requests[0])
        assert seen[:2] == ["I live in Paris, remember it.", "Noted: Paris."]
        assert "You live in Paris." in seen
        assert seen[-1] == "And now?"
        assert "Paris" in str(model2.requests[0].config.system_instruction)
        history = [c.parts[0] for c in model2.requests[0].contents if c.parts]
        assert any(p.function_call and p.function_call.args == {"city": "Paris"} for p in history)
        assert any(
            p.function_response and p.function_response.name == "remember_city" for p in history
        )

        final = await service2.get_session(app_name="trips", user_id="alice", session_id="main")
        assert final is not None
        assert len(final.events) == 8
        assert "temp:scratch" not in final.state
        durable_copy = await store2.get(ORG, "trips/alice/main")
        assert durable_copy.message_count == 8
        assert durable_copy.token_total == 12 + 20 + 30 + 10
        assert await service2.get_user_state(app_name="trips", user_id="alice") == {"city": "Paris"}
        other = await service2.create_session(app_name="trips", user_id="alice")
        assert other.state == {"user:city": "Paris"}
    finally:
        if engine is not None:
            await engine.dispose()


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_each_call_is_one_statement(store: Store) -> None:
    service = DurableSessionService(store, org_id="acme")
    for n in range(20):
        made = await service.create_session(app_name=APP, user_id="u", state={"n": n})
        await service.append_event(made, Event(author="user", invocation_id=f"i{n}"))
    engine = store.engine  # type: ignore[attr-defined]
    with statements(engine) as seen:
        listed = await service.list_sessions(app_name=APP, user_id="u")
    assert len(data_statements(seen)) == 1
    assert sorted(s.state["n"] for s in listed.sessions) == list(range(20))
    session = listed.sessions[0]
    pg = engine.dialect.name == "postgresql"
    calls = {
        "get": service.get_session(app_name=APP, user_id="u", session_id=session.id),
        "get_user_state": service.get_user_state(app_name=APP, user_id="u"),
        "delete": service.delete_session(app_name=APP, user_id="u", session_id=session.id),
    }
    for name, call in calls.items():
        with statements(engine) as seen:
            await call
        # SQLite reads a session and its events in two statements.
        expected = 2 if name == "get" and not pg else 1
        assert len(data_statements(seen)) <= expected, (name, data_statements(seen))
