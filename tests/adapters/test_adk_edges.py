"""The ADK adapter and import_adk at their edges: cancellation, event fields the store
refuses, another writer's events, and ADK databases holding values ADK itself could not
read back (or written by ADK's SqliteSessionService)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event as DurableEvent
from durable_sessions import Filter, InvalidArgumentError, SQLStore, Store
from durable_sessions.adapters.adk import importer as importing
from durable_sessions.adk import (
    AdkImportError,
    DurableSessionService,
    durable_session_id,
    import_adk,
)
from support.adk import view
from support.sql import STORE_SQL_BACKENDS, snapshot

# SQLAlchemy 2.0 strands a new connection whose connect events are cancelled
# (sqlalchemy/sqlalchemy#13548); its unclosed driver connection is reported when collected.
NEEDS_SQLALCHEMY_2_1 = pytest.mark.skipif(
    tuple(int(p) for p in sqlalchemy.__version__.split(".")[:2]) < (2, 1),
    reason="SQLAlchemy 2.0 strands a connection whose connect is cancelled (sqlalchemy#13548)",
)


ORG = "acme"


def delta_event(delta: dict[str, Any], invocation_id: str) -> Event:
    return Event(
        invocation_id=invocation_id, author="user", actions=EventActions(state_delta=delta)
    )


async def cancel_after(call: Coroutine[Any, Any, Any], steps: int) -> None:
    """Run ``call`` for ``steps`` turns of the loop, then cancel it (if not done)."""
    task = asyncio.ensure_future(call)
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@NEEDS_SQLALCHEMY_2_1
async def test_a_cancelled_append_is_all_or_nothing(store: Store) -> None:
    service = DurableSessionService(store, org_id=ORG)
    for steps in range(40):
        app = f"app{steps}"
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        delta = {"k": steps, "user:u": steps, "app:a": steps, "temp:t": steps}
        await cancel_after(service.append_event(session, delta_event(delta, "inv")), steps)
        got = await service.get_session(app_name=app, user_id="u", session_id="s")
        assert got is not None
        stored = bool(got.events)
        assert got.state == ({"k": steps, "user:u": steps, "app:a": steps} if stored else {})
        user = await service.get_user_state(app_name=app, user_id="u")
        assert user == ({"u": steps} if stored else {})
        await service.append_event(got, delta_event({"then": 1}, "then"))  # works on


# -- import_adk -----------------------------------------------------------------------------


async def adk_database(path: Path) -> str:
    url = f"sqlite+aiosqlite:///{path}"
    adk = DatabaseSessionService(db_url=url)
    try:
        for user in ("u", "v"):
            session = await adk.create_session(
                app_name="a", user_id=user, session_id="s", state={"x": 1, "user:é": 1}
            )
            for n in range(3):
                await adk.append_event(session, delta_event({"n": n, "app:z": n}, f"i{n}"))
    finally:
        await adk.close()
    return url


# Values ADK's own service cannot read back either (it fails on them with a TypeError,
# AttributeError or JSON error), and app names durable-sessions cannot store: import_adk
# must refuse them as AdkImportError, in one line, with nothing written, as it documents,
# not let the raw Python error out, nor write them into SQLite (which takes anything).
ODD_SOURCES = {
    "session state a JSON string": "UPDATE sessions SET state = '\"abc\"' WHERE user_id = 'v'",
    "session state a JSON number": "UPDATE sessions SET state = '5' WHERE user_id = 'v'",
    "session state a list of pairs": (
        "UPDATE sessions SET state = '[[\"k\", 1]]' WHERE user_id = 'v'"
    ),
    "session state not JSON": "UPDATE sessions SET state = 'not json' WHERE user_id = 'v'",
    "event data a JSON list": "UPDATE events SET event_data = '[1]' WHERE user_id = 'v'",
    "event data a JSON string": "UPDATE events SET event_data = '\"x\"' WHERE user_id = 'v'",
    "event data not JSON": "UPDATE events SET event_data = '{' WHERE user_id = 'v'",
    "event timestamp not a time": "UPDATE events SET timestamp = 'garbage' WHERE user_id = 'v'",
    "session time not a time": "UPDATE sessions SET create_time = 'garbage' WHERE user_id = 'v'",
    "app state a JSON list": "UPDATE app_states SET state = '[1]'",
    "user state a JSON string": "UPDATE user_states SET state = '\"zz\"' WHERE user_id = 'v'",
    "user state not JSON": "UPDATE user_states SET state = '{x' WHERE user_id = 'v'",
    # App names the core refuses everywhere (validate_id), in the state tables only.
    "app state of an app name with NUL": (
        "INSERT INTO app_states VALUES ('b' || char(0), '{\"k\": 1}', '2025-01-01 00:00:00')"
    ),
    "app state of an app name past 255 characters": (
        f"INSERT INTO app_states VALUES ('{'b' * 300}', '{{\"k\": 1}}', '2025-01-01 00:00:00')"
    ),
    "user state of an app name past 255 characters": (
        f"INSERT INTO user_states VALUES ('{'b' * 300}', 'u', '{{\"k\": 1}}', "
        "'2025-01-01 00:00:00')"
    ),
}


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
@pytest.mark.parametrize("odd", list(ODD_SOURCES))
async def test_an_unreadable_value_in_the_adk_database_is_one_import_error(
    tmp_path: Path, store: Store, engine: AsyncEngine, odd: str
) -> None:
    url = await adk_database(tmp_path / "adk.db")
    with sqlite3.connect(tmp_path / "adk.db") as raw:
        raw.execute(ODD_SOURCES[odd])
    before = await snapshot(engine)
    assert isinstance(store, SQLStore)
    with pytest.raises(AdkImportError) as caught:
        await import_adk(url, store, org_id=ORG)
    assert "\n" not in str(caught.value)
    assert await snapshot(engine) == before


@NEEDS_SQLALCHEMY_2_1
@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_a_cancelled_import_leaves_nothing_and_runs_again(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importing, "PAGE_SIZE", 1)  # many statements to cancel between
    monkeypatch.setattr(importing, "BATCH_SIZE", 2)
    url = await adk_database(tmp_path / "adk.db")
    assert isinstance(store, SQLStore)
    for steps in range(0, 300, 9):
        org = f"org{steps}"
        await cancel_after(import_adk(url, store, org_id=org), steps)
        if await store.list(Filter(org)):  # the import finished before the cancel
            continue
        assert await store.get_shared_state(org, "a", "u") == {}
        counts = await import_adk(url, store, org_id=org)
        assert (counts.sessions, counts.events, counts.user_state) == (2, 6, 2)


# An event whose author, invocation id or id the store cannot keep (NUL, a lone surrogate,
# past 255 characters) is the event's fault: the session exists. ADK's SessionNotFoundError
# ("Session ... not found.") sent the caller after the wrong thing; and, as for a value that
# cannot be stored, nothing may change: not storage, not the session, not the event.
BAD_EVENT_FIELDS = {
    "author with NUL": {"author": "bot\x00"},
    "author with a lone surrogate": {"author": "bot\ud800"},
    "invocation id past 255 characters": {"invocation_id": "i" * 300},
    "event id with NUL": {"id": "e\x00"},
}


@pytest.mark.parametrize("field", list(BAD_EVENT_FIELDS))
async def test_an_event_field_the_store_refuses_is_not_a_missing_session(
    store: Store, field: str
) -> None:
    service = DurableSessionService(store, org_id=ORG)
    session = await service.create_session(app_name="a", user_id="u", session_id="s")
    delta = {"k": 1, "temp:t": 1}
    event = Event(
        **{"author": "user", "invocation_id": "inv", **BAD_EVENT_FIELDS[field]},
        actions=EventActions(state_delta=dict(delta)),
    )
    with pytest.raises(InvalidArgumentError):
        await service.append_event(session, event)
    assert event.actions.state_delta == delta
    assert session.state == {}
    assert session.events == []
    got = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert got is not None
    assert (got.events, got.state) == ([], {})
    await service.append_event(session, delta_event({"k": 2}, "then"))  # still current


# ADK's SqliteSessionService (what `adk web` and sqlite:// URLs use) writes the same tables
# without adk_internal_metadata, with REAL (epoch) times. ADK's DatabaseSessionService reads
# such a file as its current schema (no metadata and events with event_data: the latest
# version; PreciseTimestamp reads a number as epoch seconds): so must import_adk.
@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_a_file_of_adks_sqlite_session_service_imports_as_adk_reads_it(
    tmp_path: Path, store: Store
) -> None:
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    path = tmp_path / "adk.db"
    written = SqliteSessionService(db_path=str(path))
    session = await written.create_session(
        app_name="a", user_id="u", session_id="s", state={"x": 1, "user:l": "fr", "app:t": 1}
    )
    for n in range(3):
        stamp = 1_750_000_000.123456 + n
        event = delta_event({"n": n}, f"i{n}")
        event.timestamp = stamp
        await written.append_event(session, event)
    assert isinstance(store, SQLStore)
    counts = await import_adk(f"sqlite:///{path}", store, org_id=ORG)
    assert (counts.sessions, counts.events, counts.user_state, counts.app_state) == (1, 3, 1, 1)
    # What ADK reads back from the file: its own SqliteSessionService, and (on the
    # SQLAlchemy versions whose SQLite DATETIME reads a number) its DatabaseSessionService.
    expected = await written.get_session(app_name="a", user_id="u", session_id="s")
    ours = DurableSessionService(store, org_id=ORG)
    got = await ours.get_session(app_name="a", user_id="u", session_id="s")
    assert expected is not None
    assert got is not None
    assert view(got) == view(expected)
    adk = DatabaseSessionService(db_url=f"sqlite+aiosqlite:///{path}")
    try:
        read = await adk.get_session(app_name="a", user_id="u", session_id="s")
    except TypeError:  # SQLAlchemy before 2.0.3x: fromisoformat given a number
        read = None
    finally:
        await adk.close()
    if read is not None:
        assert view(got) == view(read)


# A core-API event whose content is a dict that merely has "id" and "actions" keys is not an
# ADK event: like any other writer's event it must read as a text event, not make every
# get_session of the ADK session raise pydantic's ValidationError (a session ADK can no
# longer open: the Runner fails on it for good).
@pytest.mark.parametrize("content", [{"id": 7, "actions": ["x"]}, {"id": "e", "actions": 5}])
async def test_another_writers_dict_with_id_and_actions_reads_as_text(
    store: Store, content: dict[str, Any]
) -> None:
    service = DurableSessionService(store, org_id=ORG)
    session = await service.create_session(app_name="a", user_id="u", session_id="s")
    await service.append_event(session, delta_event({"k": 1}, "adk"))
    durable_id = durable_session_id("a", "u", "s")
    await store.append_event(ORG, durable_id, DurableEvent(author="tool", content=content))
    for config in (None, GetSessionConfig(after_timestamp=0.5)):
        got = await service.get_session(app_name="a", user_id="u", session_id="s", config=config)
        assert got is not None
        assert got.events[0] == session.events[0]
        other = got.events[1]
        assert other.author == "tool"
        assert other.content is not None
        assert other.content.parts is not None
        assert json.loads(other.content.parts[0].text or "") == content
