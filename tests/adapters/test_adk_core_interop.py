"""ADK sessions seen from the core API and the command line (README, Google ADK: "From the
core API and the command line"), on memory, SQLite and Postgres.

Sessions made through ``DurableSessionService`` are the durable sessions
``durable_session_id(app, user, id)``; ``Manager.fork``, ``purge``, ``delete_user`` and
export/import work on them as on any other session, and their ``message_count`` and
``token_total`` count the stored events and the ``usage_metadata`` tokens of those events.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.events.event import Event as AdkEvent
from google.adk.events.event_actions import EventActions
from google.adk.sessions.session import Session as AdkSession
from google.genai import types
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    Filter,
    Manager,
    SessionNotFoundError,
    SQLStore,
    Store,
)
from durable_sessions.adk import DurableSessionService, durable_session_id
from durable_sessions.cli import main
from durable_sessions.testing.contract._common import past
from support.adk import view
from support.sql import STORE_SQL_BACKENDS

ORG = "acme"
BASE = 1_750_000_000.0
MEMORY = pytest.param("memory", marks=pytest.mark.memory)

every_store = pytest.mark.parametrize("backend", [MEMORY, *STORE_SQL_BACKENDS])


@pytest.fixture
def service(store: Store) -> DurableSessionService:
    return DurableSessionService(store, org_id=ORG)


def text(role: str, words: str) -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=words)])


def usage(total: int, prompt: int | None = None) -> types.GenerateContentResponseUsageMetadata:
    candidates = None if prompt is None else total - prompt
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt, candidates_token_count=candidates, total_token_count=total
    )


def event(n: int, author: str = "user", **kwargs: Any) -> AdkEvent:
    return AdkEvent(invocation_id=f"inv-{n}", author=author, timestamp=BASE + n, **kwargs)


async def converse(
    service: DurableSessionService, app_name: str, user_id: str, session_id: str, turns: int
) -> AdkSession:
    """A session with state in every scope and ``turns`` exchanges, each a user message and
    a model reply with usage_metadata (and a partial event, never stored)."""
    session = await service.create_session(
        app_name=app_name,
        user_id=user_id,
        session_id=session_id,
        state={
            "topic": f"{session_id} of {user_id}",
            "user:lang": f"{user_id}-lang",
            "app:tier": "gold",
            "temp:scratch": 1,
        },
    )
    for turn in range(turns):
        n = 10 * turn
        await service.append_event(session, event(n, content=text("user", f"question {turn}")))
        await service.append_event(session, event(n + 1, partial=True, content=text("model", "…")))
        await service.append_event(
            session,
            event(
                n + 2,
                "concierge",
                content=text("model", f"answer {turn}"),
                usage_metadata=usage(10 + turn, prompt=7),
                actions=EventActions(
                    state_delta={
                        "turns": turn + 1,
                        "user:last_topic": session_id,
                        "app:answers": {"n": turn},
                        "temp:t": turn,
                    }
                ),
            ),
        )
    return session


async def fill(service: DurableSessionService) -> dict[tuple[str, str, str], AdkSession]:
    """Sessions of two users in two apps; return them by (app, user, id)."""
    made = {}
    for app_name, user_id, session_id, turns in (
        ("trips", "alice", "main", 3),
        ("trips", "alice", "weekend", 1),
        ("trips", "bob", "main", 2),
        ("billing", "alice", "refund", 1),
    ):
        made[(app_name, user_id, session_id)] = await converse(
            service, app_name, user_id, session_id, turns
        )
    return made


async def everything(service: DurableSessionService, keys: list[tuple[str, str, str]]) -> Any:
    """Every answer the adapter gives about these sessions: each session, each listing,
    each user's state."""
    sessions = [
        view(await service.get_session(app_name=a, user_id=u, session_id=s)) for a, u, s in keys
    ]
    listings = []
    for app_name in sorted({a for a, _, _ in keys}):
        for user_id in [None, *sorted({u for _, u, _ in keys})]:
            listed = await service.list_sessions(app_name=app_name, user_id=user_id)
            listings.append([view(s) for s in listed.sessions])
    states = [
        await service.get_user_state(app_name=a, user_id=u)
        for a, u in sorted({k[:2] for k in keys})
    ]
    return sessions, listings, states


def tokens_of(events: list[AdkEvent]) -> int:
    return sum(e.usage_metadata.total_token_count or 0 for e in events if e.usage_metadata)


# -- the durable session of an ADK session ---------------------------------------------------


@every_store
async def test_an_adk_session_is_the_durable_session_of_its_id_with_its_counters(
    service: DurableSessionService, store: Store
) -> None:
    made = await fill(service)
    manager = Manager(store)
    for (app_name, user_id, session_id), session in made.items():
        got = await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert got is not None
        durable = await manager.get(ORG, durable_session_id(app_name, user_id, session_id))
        assert (durable.app_name, durable.user_id) == (app_name, user_id)
        # The same state in every scope (temp: keys never stored).
        assert durable.state == {k: v for k, v in got.state.items() if not k.startswith("temp:")}
        # One message per stored event (partial events are not stored), and their tokens.
        assert durable.message_count == len(got.events) == len(session.events)
        assert durable.token_total == tokens_of(got.events) > 0
        stored = await store.list_events(ORG, durable.id)
        assert [e.id for e in stored] == [e.id for e in got.events]
        assert [e.tokens for e in stored] == [
            e.usage_metadata.total_token_count if e.usage_metadata else 0 for e in got.events
        ]
    alice = await manager.get(ORG, "trips/alice/main")
    assert (alice.message_count, alice.token_total) == (6, 10 + 11 + 12)
    listed = await manager.list(Filter(ORG, app_name="trips", user_id="alice"))
    assert {s.id for s in listed} == {"trips/alice/main", "trips/alice/weekend"}


# -- fork --------------------------------------------------------------------------------------


@every_store
async def test_a_fork_of_an_adk_session_is_a_core_session_the_adapter_does_not_list(
    service: DurableSessionService, store: Store
) -> None:
    """``Manager.fork`` names the child with a new id, which is not of the ADK form
    ``app/user/id``: the README's "sessions the core API makes under other ids are not
    listed to ADK". The child holds the parent's private state, shared state and (with
    ``with_events``) its transcript and counters; the parent is unchanged and goes on."""
    made = await fill(service)
    keys = list(made)
    before = await everything(service, keys)
    manager = Manager(store)
    parent_id = durable_session_id("trips", "alice", "main")
    parent = await manager.get(ORG, parent_id)

    child = await manager.fork(ORG, parent_id, with_events=True)

    assert child.parent_id == parent_id
    assert not child.id.startswith("trips/alice/")
    assert (child.app_name, child.user_id) == ("trips", "alice")
    assert child.state == {**parent.state, "forked_from": parent_id}
    assert (child.message_count, child.token_total) == (parent.message_count, parent.token_total)
    parent_events = await store.list_events(ORG, parent_id)
    child_events = await store.list_events(ORG, child.id)
    assert [(e.id, e.content, e.tokens) for e in child_events] == [
        (e.id, e.content, e.tokens) for e in parent_events
    ]
    # The adapter answers exactly as before: the child is not one of alice's ADK sessions.
    assert await everything(service, keys) == before
    assert await service.get_session(app_name="trips", user_id="alice", session_id=child.id) is None
    # The core API lists it with the user's sessions, and as the parent's child.
    assert child.id in {s.id for s in await manager.list(Filter(ORG, user_id="alice"))}
    assert [s.id for s in await manager.list(Filter(ORG, parent_id=parent_id))] == [child.id]

    # The parent goes on through the adapter; the fork keeps its copy.
    session = await service.get_session(app_name="trips", user_id="alice", session_id="main")
    assert session is not None
    await service.append_event(session, event(99, content=text("user", "after the fork")))
    assert len(await store.list_events(ORG, parent_id)) == len(parent_events) + 1
    assert len(await store.list_events(ORG, child.id)) == len(parent_events)


# -- purge ------------------------------------------------------------------------------------


@every_store
async def test_purge_removes_old_adk_sessions(service: DurableSessionService, store: Store) -> None:
    old = [("trips", "alice", "weekend"), ("trips", "bob", "main"), ("billing", "alice", "refund")]
    for app_name, user_id, session_id in old:
        await converse(service, app_name, user_id, session_id, 1)
    await converse(service, "trips", "alice", "main", 1)
    ids = [durable_session_id(*key) for key in [*old, ("trips", "alice", "main")]]
    last_old = max([(await store.get(ORG, session_id)).updated_at for session_id in ids])
    await past(last_old, by=timedelta(seconds=0.25))
    recent = await service.get_session(app_name="trips", user_id="alice", session_id="main")
    assert recent is not None
    await service.append_event(recent, event(50, content=text("user", "still here")))
    midway = last_old + ((await store.get(ORG, ids[-1])).updated_at - last_old) / 2
    manager = Manager(store)

    def cutoff() -> timedelta:
        # Taken now, the cutoff falls midway between the old writes and the append.
        return datetime.now(timezone.utc) - midway

    assert await manager.purge(ORG, older_than=cutoff(), dry_run=True) == 3
    assert await manager.purge(ORG, older_than=cutoff()) == 3

    for app_name, user_id, session_id in old:
        assert (
            await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
            is None
        )
        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, durable_session_id(app_name, user_id, session_id))
    listed = await service.list_sessions(app_name="trips")
    assert [(s.user_id, s.id) for s in listed.sessions] == [("alice", "main")]
    assert (await service.list_sessions(app_name="billing")).sessions == []
    kept = await service.get_session(app_name="trips", user_id="alice", session_id="main")
    assert kept is not None
    assert [e.invocation_id for e in kept.events] == ["inv-0", "inv-2", "inv-50"]
    # Purge removes sessions, not shared state: the users' user: state stays.
    assert await service.get_user_state(app_name="trips", user_id="bob") == {
        "lang": "bob-lang",
        "last_topic": "main",
    }


# -- delete_user ------------------------------------------------------------------------------


@every_store
async def test_delete_user_removes_their_adk_sessions_and_user_state(
    service: DurableSessionService, store: Store
) -> None:
    made = await fill(service)

    async def bob() -> Any:
        got = await service.get_session(app_name="trips", user_id="bob", session_id="main")
        listed = await service.list_sessions(app_name="trips", user_id="bob")
        state = await service.get_user_state(app_name="trips", user_id="bob")
        return view(got), [view(s) for s in listed.sessions], state

    bob_before = await bob()
    assert bob_before[0] is not None
    assert await service.get_user_state(app_name="billing", user_id="alice") != {}

    assert await Manager(store).delete_user(ORG, "alice") == 3

    for app_name, user_id, session_id in made:
        got = await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert (got is None) == (user_id == "alice")
    for app_name in ("trips", "billing"):
        assert (await service.list_sessions(app_name=app_name, user_id="alice")).sessions == []
        assert await service.get_user_state(app_name=app_name, user_id="alice") == {}
    assert await store.list(Filter(ORG, user_id="alice")) == []
    # Bob's sessions, his user: state and the apps' app: state are untouched.
    assert await bob() == bob_before
    (left,) = (await service.list_sessions(app_name="trips")).sessions
    assert (left.user_id, left.state["app:tier"]) == ("bob", "gold")


# -- export and import ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_exported_adk_sessions_import_into_a_fresh_database_and_read_back_equal(
    backend: str,
    service: DurableSessionService,
    store: Store,
    backend_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    made = await fill(service)
    keys = list(made)
    expected = await everything(service, keys)
    expected_counters = {}
    for key in keys:
        stored = await store.get(ORG, durable_session_id(*key))
        expected_counters[stored.id] = (stored.message_count, stored.token_total)
    if backend == "sqlite":
        fresh = f"sqlite+aiosqlite:///{tmp_path / 'restored.db'}"
    else:
        make: Callable[[], str] = request.getfixturevalue("fresh_pg_url")
        fresh = make()
    backup = tmp_path / "backup.jsonl"

    # As a user runs it: `durable-sessions export`, then `import` into a new database (the
    # command runs its own event loop: in a thread of its own, off this test's loop).
    assert await asyncio.to_thread(main, ["--url", backend_url, "export", "-o", str(backup)]) == 0
    assert await asyncio.to_thread(main, ["--url", fresh, "import", "-i", str(backup)]) == 0
    assert "Imported 4 sessions, 14 events" in capsys.readouterr().out

    engine = create_async_engine(fresh)
    try:
        restored_store = SQLStore(engine)
        restored = DurableSessionService(restored_store, org_id=ORG)
        assert await everything(restored, keys) == expected
        for durable_id, counters in expected_counters.items():
            got = await restored_store.get(ORG, durable_id)
            assert (got.message_count, got.token_total) == counters
        # The imported sessions go on through the adapter.
        session = await restored.get_session(app_name="trips", user_id="bob", session_id="main")
        assert session is not None
        await restored.append_event(
            session, event(70, "concierge", content=text("model", "hi"), usage_metadata=usage(5))
        )
        bob = await restored_store.get(ORG, "trips/bob/main")
        assert (bob.message_count, bob.token_total) == (5, 10 + 11 + 5)
    finally:
        await engine.dispose()


# -- the command line ------------------------------------------------------------------------


def command(url: str, *argv: str) -> str:
    """Run ``durable-sessions --url URL ...`` in a child process; return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SESSIONS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "durable_sessions", "--url", url, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def row(output: str, *cells: str) -> bool:
    """Whether a line of a table holds these cells, in this order, separated by spaces."""
    pattern = r"\s+".join(re.escape(cell) for cell in cells)
    return any(re.search(rf"(^|\s){pattern}(\s|$)", line) for line in output.splitlines())


@pytest.mark.sqlite
async def test_the_command_shows_lists_forks_and_erases_adk_sessions(tmp_path: Path) -> None:
    """The README's commands on a SQLite file an ADK app wrote through the adapter:
    ``show trips/alice/main --org acme`` (state by scope, events, counters) and
    ``list --app trips --user alice``; then ``fork`` and ``delete-user``."""
    path = tmp_path / "adk-sessions.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        store = SQLStore(engine)
        await store.migrate()
        await fill(DurableSessionService(store, org_id=ORG))
    finally:
        await engine.dispose()
    url = f"sqlite:///{path}"  # as the README writes it

    shown = command(url, "show", "trips/alice/main", "--org", ORG)
    assert row(shown, "id", "trips/alice/main")
    assert row(shown, "organisation", ORG)
    assert row(shown, "user", "alice")
    assert row(shown, "app", "trips")
    assert row(shown, "messages", "6")
    assert row(shown, "tokens", "33")
    # The state by scope: private, user: and app: keys, temp: keys never stored.
    assert row(shown, "private", "topic", '"main of alice"')
    assert row(shown, "private", "turns", "3")
    assert row(shown, "user", "user:lang", '"alice-lang"')
    assert row(shown, "user", "user:last_topic", '"weekend"')  # her latest write
    assert row(shown, "app", "app:tier", '"gold"')
    assert row(shown, "app", "app:answers", '{"n": 1}')  # bob's, the app's latest
    assert "temp:" not in shown
    # The events: the newest 10 of 6, with their authors and usage_metadata tokens.
    assert "Last 6 of 6 events" in shown
    authors = re.findall(r"^\s*\d+\s+\S+ \S+\s+(user|concierge)\s+(\d+)\s", shown, re.M)
    assert authors == [
        ("user", "0"), ("concierge", "10"), ("user", "0"), ("concierge", "11"),
        ("user", "0"), ("concierge", "12"),
    ]  # fmt: skip
    assert "answer 2" in shown

    listed = command(url, "list", "--app", "trips", "--user", "alice", "--org", ORG)
    assert row(listed, "trips/alice/main")
    assert row(listed, "trips/alice/weekend")
    assert "bob" not in listed
    assert "billing" not in listed
    (main_row,) = [line for line in listed.splitlines() if "trips/alice/main" in line]
    assert main_row.split()[-2:] == ["6", "33"]  # messages, tokens

    forked = command(url, "fork", "trips/alice/main", "--with-events", "--org", ORG)
    child = re.fullmatch(r"Forked trips/alice/main into (\S+) with its 6 events\.\n", forked)
    assert child is not None, forked
    assert row(command(url, "show", child[1], "--org", ORG), "forked from", "trips/alice/main")

    erased = command(url, "delete-user", "alice", "--yes", "--org", ORG)
    assert "Deleted 4 sessions" in erased  # her 3 ADK sessions and the fork
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        service = DurableSessionService(SQLStore(engine), org_id=ORG)
        for app_name in ("trips", "billing"):
            assert (await service.list_sessions(app_name=app_name, user_id="alice")).sessions == []
            assert await service.get_user_state(app_name=app_name, user_id="alice") == {}
        (bob,) = (await service.list_sessions(app_name="trips")).sessions
        assert bob.user_id == "bob"
    finally:
        await engine.dispose()
