"""ADK timestamps and JSON at their edges: NaN, infinities and times past the stored range,
from the adapter's append_event and from import_adk; JSON nested too deeply or malformed in
an ADK database. Each is InvalidArgumentError, in one line naming what it refuses."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import DatabaseSessionService
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import InvalidArgumentError, SQLStore, Store
from durable_sessions.adk import AdkImportError, DurableSessionService, import_adk
from durable_sessions.cli import main
from support.sql import STORE_SQL_BACKENDS, snapshot

ORG = "acme"
LAST_MICROSECOND = 253402300799.999999
"""9999-12-31T23:59:59.999999Z, datetime.max in UTC: Postgres's infinity."""
BAD_SECONDS = [
    float("nan"), float("inf"), float("-inf"), 1e20, -1e20, LAST_MICROSECOND, -62135596800.0,
]  # fmt: skip


@pytest.mark.parametrize("seconds", BAD_SECONDS)
async def test_append_event_refuses_a_timestamp_no_store_can_hold(
    store: Store, seconds: float
) -> None:
    service = DurableSessionService(store, org_id=ORG)
    session = await service.create_session(app_name="a", user_id="u", session_id="s")
    event = Event(
        author="user",
        invocation_id="i",
        timestamp=seconds,
        actions=EventActions(state_delta={"temp:t": 1, "k": 1}),
    )
    with pytest.raises(InvalidArgumentError, match="event timestamp") as caught:
        await service.append_event(session, event)
    assert "\n" not in str(caught.value)
    # Nothing written, and neither the session nor the event changed.
    assert session.state == {}
    assert event.actions.state_delta == {"temp:t": 1, "k": 1}
    stored = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert stored is not None
    assert (stored.events, stored.state) == ([], {})
    # The ends of the stored range are stored and read back.
    ends = [253402214399.0, -62135510400.0]  # 9999-12-30T23:59:59Z, 0001-01-02T00:00:00Z
    for edge in ends:
        fresh = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert fresh is not None
        await service.append_event(fresh, Event(author="user", timestamp=edge))
    again = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert again is not None
    assert [e.timestamp for e in again.events] == ends


# -- import_adk ------------------------------------------------------------------------------


async def adk_database(path: Path) -> str:
    """An ADK SQLite database written by ADK: session "s" of user "u" with two events."""
    url = f"sqlite+aiosqlite:///{path}"
    adk = DatabaseSessionService(db_url=url)
    try:
        session = await adk.create_session(app_name="a", user_id="u", session_id="s")
        for n in range(2):
            await adk.append_event(
                session, Event(id=f"e{n}", author="user", invocation_id=f"i{n}", timestamp=1e9 + n)
            )
    finally:
        await adk.close()
    return url


def set_event_data(path: Path, event_id: str, change: Any) -> None:
    with sqlite3.connect(path) as raw:
        (text,) = raw.execute("SELECT event_data FROM events WHERE id = ?", (event_id,)).fetchone()
        raw.execute(
            "UPDATE events SET event_data = ? WHERE id = ?", (change(json.loads(text)), event_id)
        )


NESTED = "[" * 3000 + "]" * 3000
"""3,000 levels of JSON in 6 KB."""

SOURCES: dict[str, tuple[str, str]] = {
    # name: (SQL on ADK's database, what the error names)
    "event data nested 3,000 levels": (
        f"UPDATE events SET event_data = '{{\"x\": {NESTED}}}' WHERE id = 'e1'",
        "event 'e1' of ADK session 's' of user 'u': its data is JSON nested too deeply",
    ),
    "session state nested 3,000 levels": (
        f"UPDATE sessions SET state = '{{\"k\": {NESTED}}}'",
        "ADK session 's' of user 'u' in app 'a': its state is JSON nested too deeply",
    ),
    "user state nested 3,000 levels": (
        f"UPDATE user_states SET state = '{{\"k\": {NESTED}}}'",
        "the user: state of app 'a': it is JSON nested too deeply",
    ),
    "event data malformed": (
        "UPDATE events SET event_data = '{\"author\": ' WHERE id = 'e1'",
        "event 'e1' of ADK session 's' of user 'u': its data is not valid JSON",
    ),
    "session time datetime.max": (
        "UPDATE sessions SET create_time = '9999-12-31 23:59:59.999999'",
        "ADK session 's' of user 'u' in app 'a': its create_time 9999-12-31T23:59:59.999999+00:00"
        " is out of range",
    ),
    "session time datetime.min": (
        "UPDATE sessions SET update_time = '0001-01-01 00:00:00.000000'",
        "ADK session 's' of user 'u' in app 'a': its update_time 0001-01-01T00:00:00+00:00 is "
        "out of range",
    ),
    "event time column seconds 1e20": (
        "UPDATE events SET timestamp = 1e20, event_data = json_remove(event_data, '$.timestamp')"
        " WHERE id = 'e1'",
        "event 'e1' of ADK session 's' of user 'u': its timestamp 1e+20 is not a time in range",
    ),
    "app state time datetime.max": (
        "UPDATE app_states SET state = '{\"k\": 1}', update_time = '9999-12-31 23:59:59.999999'",
        "the app: state of app 'a': its update_time 9999-12-31T23:59:59.999999+00:00 is out",
    ),
}
for _name, _value in [("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity"), ("1e20", "1e20")]:
    SOURCES[f"event data timestamp {_name}"] = (
        f"UPDATE events SET event_data = json_set(event_data, '$.timestamp', 0) WHERE id = 'e1';"
        f"UPDATE events SET event_data = replace(event_data, '\"timestamp\":0', "
        f"'\"timestamp\":{_value}') WHERE id = 'e1'",
        "event 'e1' of ADK session 's' of user 'u': event timestamp",
    )


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
@pytest.mark.parametrize("odd", list(SOURCES))
async def test_import_adk_refuses_the_row_in_one_line_naming_it(
    tmp_path: Path, store: Store, engine: AsyncEngine, odd: str
) -> None:
    path = tmp_path / "adk.db"
    url = await adk_database(path)
    sql, named = SOURCES[odd]
    with sqlite3.connect(path) as raw:
        raw.executescript(sql)
    before = await snapshot(engine)
    assert isinstance(store, SQLStore)
    with pytest.raises(AdkImportError) as caught:
        await import_adk(url, store, org_id=ORG)
    message = str(caught.value)
    assert isinstance(caught.value, InvalidArgumentError)
    assert "\n" not in message
    assert message.startswith(f"cannot import {named}"), message
    assert message.endswith("; nothing was imported")
    assert await snapshot(engine) == before


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_the_import_adk_command_says_deep_json_in_one_line(
    tmp_path: Path,
    engine: AsyncEngine,
    backend_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "adk.db"
    url = await adk_database(path)
    with sqlite3.connect(path) as raw:
        raw.execute(SOURCES["event data nested 3,000 levels"][0])
    argv = ["--url", backend_url, "import-adk", "--from", url, "--org", ORG]
    assert await asyncio.to_thread(main, argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert "event 'e1' of ADK session 's'" in err
    assert "nested too deeply" in err


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_get_session_reads_a_time_written_by_hand_past_the_range(
    engine: AsyncEngine,
) -> None:
    """An event and an update time set straight in SQL to Postgres's ``infinity`` (on
    SQLite, the year 1): the session still reads, in ADK's seconds."""
    store = SQLStore(engine)
    service = DurableSessionService(store, org_id=ORG)
    session = await service.create_session(app_name="a", user_id="u", session_id="s")
    for n in range(2):
        await service.append_event(session, Event(author="user", invocation_id=f"i{n}"))
    pg = engine.dialect.name == "postgresql"
    late = "'infinity'" if pg else "'0001-01-01 00:00:00.000000'"
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"UPDATE ds_events SET timestamp = {late} WHERE seq = 2")
        await conn.exec_driver_sql(f"UPDATE ds_sessions SET updated_at = {late}")
    stored = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert stored is not None
    assert [e.invocation_id for e in stored.events] == ["i0", "i1"]
    expected = 253402300800.0 if pg else -62135596800.0  # datetime.max / .min in UTC
    assert stored.last_update_time == expected
    listed = await service.list_sessions(app_name="a", user_id="u")
    assert [s.last_update_time for s in listed.sessions] == [expected]
