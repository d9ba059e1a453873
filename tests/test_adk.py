"""DurableSessionService: ADK's session-service behaviour on memory, SQLite and Postgres.

The behaviours of ADK's own session-service suite, written against the adapter, and an ADK
``Runner`` driving an ``LlmAgent`` with a scripted model through several turns, resumed by a
second Runner over a new store object.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.adk import errors as adk_errors
from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session as AdkSession
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import Field
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    InMemoryStore,
    Manager,
    MissingScopeError,
    Session,
    SQLStore,
    Store,
)
from durable_sessions.adk import DurableSessionService
from sqlhelpers import SQL_BACKENDS, data_statements, statements

# ADK's StaleSessionError (a ValueError); older google-adk raised a plain ValueError.
StaleSessionError: type[ValueError] = getattr(adk_errors, "StaleSessionError", ValueError)
APP = "my_app"
ORG = "acme"


def without_bookkeeping(delta: dict[str, Any]) -> dict[str, Any]:
    """A stored state delta without the adapter's update-time key."""
    return {k: v for k, v in delta.items() if k != "__adk_last_update_time__"}


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


# -- create, get, list, delete --------------------------------------------------------------


async def test_get_missing_session_returns_none(service: DurableSessionService) -> None:
    for missing in ("123", "", "x" * 300):
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


async def test_an_existing_id_is_refused(service: DurableSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u", session_id="dup", state={"k": 1})
    with pytest.raises(AlreadyExistsError, match="Session with id dup already exists"):
        await service.create_session(app_name=APP, user_id="u", session_id="dup", state={"k": 2})
    got = await service.get_session(app_name=APP, user_id="u", session_id="dup")
    assert got is not None
    assert got.state == {"k": 1}


async def test_a_session_belongs_to_its_app_and_user(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(session, user_event())
    # Ids are unique per organisation: another user cannot take the id, see or delete it.
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    assert await service.get_session(app_name=APP, user_id="u2", session_id="s1") is None
    assert await service.get_session(app_name="other", user_id="u1", session_id="s1") is None
    await service.delete_session(app_name=APP, user_id="u2", session_id="s1")
    still = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert still is not None
    assert len(still.events) == 1
    stranger = AdkSession(id="s1", app_name=APP, user_id="u2")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(stranger, user_event())


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
    assert {s.id: s.state for s in everyone} == {
        "1a": {"k": "1a"},
        "1b": {"k": "1b"},
        "2a": {"k": "2a"},
    }
    assert (await service.list_sessions(app_name="nobody's")).sessions == []


async def test_list_sessions_is_least_recently_updated_first(
    service: DurableSessionService,
) -> None:
    for sid in ("a", "b", "c"):
        await service.create_session(app_name=APP, user_id="u", session_id=sid)
    session_a = await service.get_session(app_name=APP, user_id="u", session_id="a")
    assert session_a is not None
    await asyncio.sleep(0.01)
    await service.append_event(session_a, user_event())
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert [s.id for s in listed] == ["b", "c", "a"]


# -- state scoping --------------------------------------------------------------------------


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


async def test_temp_state_lives_only_in_the_session_object(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u1", state={"temp:boot": 1, "kept": 1}
    )
    assert "temp:boot" not in session.state
    event = delta_event({"temp:k1": "v1", "sk": "v2"})
    await service.append_event(session, event)
    # Visible for the rest of the invocation, stripped from the event, never stored.
    assert session.state["temp:k1"] == "v1"
    assert session.state["sk"] == "v2"
    assert event.actions.state_delta == {"sk": "v2"}
    got = await reload(service, session)
    assert "temp:k1" not in got.state
    assert got.state["sk"] == "v2"
    assert got.events[0].actions.state_delta == {"sk": "v2"}
    (record,) = await store.list_events(ORG, session.id)
    assert without_bookkeeping(record.state_delta) == {"sk": "v2"}
    assert "temp:k1" not in json.dumps(record.content)


async def test_temp_state_is_visible_to_the_next_agent(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    first = Event(
        invocation_id="inv1",
        author="agent1",
        actions=EventActions(state_delta={"temp:output": "from a1"}),
    )
    await service.append_event(session, first)
    assert session.state.get("temp:output") == "from a1"
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


# -- events ---------------------------------------------------------------------------------


async def test_get_session_with_config(service: DurableSessionService) -> None:
    base = float(int(time.time()))
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=base + i))

    async def events(**config: Any) -> list[float]:
        got = await service.get_session(
            app_name=APP, user_id="u", session_id=session.id, config=GetSessionConfig(**config)
        )
        assert got is not None
        assert got.last_update_time == base + 5  # whatever the filter, the newest event's
        return [e.timestamp - base for e in got.events]

    assert await events() == [1, 2, 3, 4, 5]
    assert await events(num_recent_events=3) == [3, 4, 5]
    assert await events(num_recent_events=0) == []
    assert await events(num_recent_events=7) == [1, 2, 3, 4, 5]
    assert await events(after_timestamp=base + 4) == [4, 5]  # inclusive
    assert await events(after_timestamp=base + 3.5) == [4, 5]
    assert await events(after_timestamp=base + 50) == []
    assert await events(after_timestamp=base + 4, num_recent_events=3) == [4, 5]
    assert await events(after_timestamp=base + 1, num_recent_events=2) == [4, 5]


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
        grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
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
    assert session.last_update_time == event.timestamp

    got = await reload(service, session)
    assert got == session  # events, state, timestamp and revision alike
    assert got.events[0] == event
    assert got.events[0].content is not None
    assert got.events[0].content.parts is not None
    assert got.events[0].content.parts[3].inline_data == event.content.parts[3].inline_data  # type: ignore[union-attr,index]

    (record,) = await store.list_events(ORG, session.id)
    assert record.content == json.loads(
        json.dumps(event.model_dump(mode="json", exclude_none=True))
    )
    assert without_bookkeeping(record.state_delta) == {
        "sk": {"nested": [1, "two", None]},
        "user:lang": "fr",
    }
    # The adapter keeps ADK's session update time beside the delta, as a private key.
    assert record.state_delta["__adk_last_update_time__"] == event.timestamp
    assert record.id == event.id
    assert record.author == "planner"
    assert record.invocation_id == "invocation"
    assert record.tokens == 12
    assert abs(record.timestamp.timestamp() - event.timestamp) < 1e-6
    stored = await store.get(ORG, session.id)
    assert stored.message_count == 1
    assert stored.token_total == 12


async def test_partial_events_are_not_persisted(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = Event(author="user", partial=True, actions=EventActions(state_delta={"k": 1}))
    assert await service.append_event(session, event) is event
    assert session.events == []
    assert "k" not in session.state
    got = await reload(service, session)
    assert got.events == []
    assert got == session


async def test_last_update_time_follows_the_newest_event(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    created = session.last_update_time
    await service.append_event(session, user_event(timestamp=created + 10))
    assert session.last_update_time == created + 10
    got = await reload(service, session)
    assert got.last_update_time == created + 10
    assert got == session


async def test_events_written_by_other_writers_read_as_text(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    from durable_sessions import Event as DurableEvent

    await store.append_event(ORG, session.id, DurableEvent(author="user", content="hello"))
    (event,) = (await reload(service, session)).events
    assert event.author == "user"
    assert event.content == types.Content(role="user", parts=[types.Part(text="hello")])


async def test_durable_features_work_on_adk_sessions(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", state={"topic": "trip"})
    await service.append_event(session, rich_event())
    child = await Manager(store, app_name=APP).fork(ORG, session.id, with_events=True)
    forked = await service.get_session(app_name=APP, user_id="u", session_id=child.id)
    assert forked is not None
    assert forked.events == session.events
    assert forked.state == {**session.state, "forked_from": session.id}
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert {s.id for s in listed} == {session.id, child.id}
    assert (await store.get(ORG, child.id)).token_total == 12


# -- stale sessions and missing ones --------------------------------------------------------


async def test_appending_to_a_stale_session_is_refused(service: DurableSessionService) -> None:
    now = time.time()
    original = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(original, delta_event({"sk1": "v1"}, "inv1", timestamp=now + 1))
    updated = await reload(service, original)
    await service.append_event(updated, delta_event({"sk2": "v2"}, "inv2", timestamp=now + 2))
    assert original.last_update_time < updated.last_update_time

    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(original, delta_event({"sk3": "v3"}, "inv3"))
    final = await reload(service, original)
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert final.state == {"sk1": "v1", "sk2": "v2"}
    assert isinstance(StaleSessionError(), ValueError)


async def test_of_two_copies_appending_at_once_one_wins(service: DurableSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(5):
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
    final = await reload(service, session)
    assert len(final.events) == 5
    assert len(final.state) == 5


async def test_a_change_made_through_the_library_makes_the_session_stale(
    service: DurableSessionService, store: Store
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await store.touch(ORG, session.id, messages=1, title="Renamed elsewhere")
    with pytest.raises(StaleSessionError):
        await service.append_event(session, user_event())
    fresh = await reload(service, session)
    await service.append_event(fresh, user_event())


async def test_a_session_object_made_elsewhere_is_checked_by_its_events(
    service: DurableSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    first = user_event("inv1")
    await service.append_event(session, first)
    current = AdkSession(id="s", app_name=APP, user_id="u", events=[first])
    await service.append_event(current, user_event("inv2"))
    behind = AdkSession(id="s", app_name=APP, user_id="u", events=[first])
    with pytest.raises(StaleSessionError):
        await service.append_event(behind, user_event("inv3"))


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


# -- organisations --------------------------------------------------------------------------


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
    fixed = DurableSessionService(store, org_id="org-a")
    assert await fixed.get_session(app_name=APP, user_id="u", session_id="same") == got


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
    session = await service.create_session(app_name="trips", user_id="alice")

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

        final = await service2.get_session(app_name="trips", user_id="alice", session_id=session.id)
        assert final is not None
        assert len(final.events) == 8
        assert "temp:scratch" not in final.state
        durable = await store2.get(ORG, session.id)
        assert durable.message_count == 8
        assert durable.token_total == 12 + 20 + 30 + 10
        other = await service2.create_session(app_name="trips", user_id="alice")
        assert other.state == {"user:city": "Paris"}
    finally:
        if engine is not None:
            await engine.dispose()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_listing_reads_every_session_in_one_statement(store: Store) -> None:
    service = DurableSessionService(store, org_id="acme")
    for n in range(20):
        made = await service.create_session(app_name=APP, user_id="u", state={"n": n})
        await service.append_event(made, Event(author="user", invocation_id=f"i{n}"))
    engine = store.engine  # type: ignore[attr-defined]
    with statements(engine) as seen:
        listed = await service.list_sessions(app_name=APP, user_id="u")
    assert len(data_statements(seen)) == 1
    assert sorted(s.state["n"] for s in listed.sessions) == list(range(20))
    assert all("__adk_last_update_time__" not in s.state for s in listed.sessions)
