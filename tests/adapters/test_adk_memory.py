"""DurableMemoryService: ADK's memory-service behaviour on memory, SQLite and Postgres.

The public contract that ADK's own in-memory memory-service suite checks (google-adk's
tests/unittests/memory/test_in_memory_memory_service.py), written here against the adapter
over every store: what is ingested and what is skipped, de-duplication by event id, search
by shared words without case, scoping by app and user, scripts without spaces, ranking, the
cap on results, and copies that callers' mutations do not reach. Not run here: the checks
of the in-memory service's private dictionaries (the stored memories are read back through
``search_memory`` instead) and its thread-safety test (several threads each running their
own event loop against one service), which a store bound to one engine and loop does not
offer. Where the ranking deliberately differs (equal scores go newest first, not in the
order added), the test says so. Then the adapter's own: ``add_memory``, ``delete_memory``,
``delete_memories``, metadata, organisations, and memories outliving their session.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime, timezone

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from durable_sessions import InvalidArgumentError, Manager, MissingScopeError, Store
from durable_sessions.adk import DurableMemoryService, DurableSessionService, durable_session_id

APP = "test-app"
USER = "test-user"
OTHER_USER = "another-user"


def said(event_id: str, text: str | None, *, author: str = "user", at: float = 1000.0) -> Event:
    content = None if text is None else types.Content(parts=[types.Part(text=text)])
    return Event(id=event_id, invocation_id="inv", author=author, timestamp=at, content=content)


def session(session_id: str, *events: Event, user: str = USER, app: str = APP) -> Session:
    return Session(app_name=app, user_id=user, id=session_id, events=list(events))


def texts(found: list[MemoryEntry]) -> list[str | None]:
    return [m.content.parts[0].text if m.content.parts else None for m in found]


@pytest.fixture
def memory(store: Store) -> DurableMemoryService:
    return DurableMemoryService(store, org_id="acme")


async def search(service: DurableMemoryService, query: str, user: str = USER) -> list[str | None]:
    found = await service.search_memory(app_name=APP, user_id=user, query=query)
    return texts(found.memories)


SESSION_1 = session(
    "session-1",
    said("event-1a", "The ADK is a great toolkit.", at=12345),
    said("event-1b", None, at=12346),  # no content: skipped
    said("event-1c", "I agree. The Agent Development Kit (ADK) rocks!", author="model", at=12347),
)
SESSION_2 = session("session-2", said("event-2a", "I like to code in Python.", at=54321))
OTHER = session("session-3", said("event-3a", "This is a secret.", at=60000), user=OTHER_USER)


def test_it_is_an_adk_memory_service_with_every_method() -> None:
    assert issubclass(DurableMemoryService, BaseMemoryService)
    for name in (
        "add_session_to_memory", "add_events_to_memory", "add_memory", "search_memory",
        "delete_memory", "delete_memories",
    ):  # fmt: skip
        assert getattr(DurableMemoryService, name) is not getattr(BaseMemoryService, name, None)


async def test_a_session_adds_its_events_with_text(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(SESSION_1)
    found = (await memory.search_memory(app_name=APP, user_id=USER, query="ADK")).memories
    assert {m.id for m in found} == {"event-1a", "event-1c"}
    (model,) = [m for m in found if m.id == "event-1c"]
    assert model.author == "model"
    assert model.content.parts[0].text == "I agree. The Agent Development Kit (ADK) rocks!"
    assert model.timestamp == datetime.fromtimestamp(12347, timezone.utc).isoformat()
    assert model.custom_metadata == {}


async def test_events_add_alone_with_or_without_a_session(memory: DurableMemoryService) -> None:
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, session_id="session-1", events=[SESSION_1.events[0]]
    )
    await memory.add_events_to_memory(app_name=APP, user_id=USER, events=[SESSION_2.events[0]])
    assert await search(memory, "toolkit python") == [
        "I like to code in Python.", "The ADK is a great toolkit.",
    ]  # fmt: skip


async def test_adding_again_adds_only_new_events_never_a_duplicate(
    memory: DurableMemoryService,
) -> None:
    await memory.add_session_to_memory(SESSION_1)
    await memory.add_session_to_memory(SESSION_1)
    newer = said("event-1d", "A new fact.", at=12348)
    duplicate = said("event-1a", "Updated duplicate text.", at=12349)
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, session_id="session-1", events=[newer, duplicate]
    )
    grown = session("session-1", *SESSION_1.events, newer)
    await memory.add_session_to_memory(grown)
    found = (await memory.search_memory(app_name=APP, user_id=USER, query="the fact")).memories
    assert sorted(m.id for m in found) == ["event-1a", "event-1c", "event-1d"]
    assert await search(memory, "updated duplicate") == []


async def test_a_session_without_events_adds_nothing(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(session("session-4"))
    await memory.add_session_to_memory(session("session-5", said("e", None), said("f", "")))
    assert await search(memory, "anything") == []


async def test_search_finds_shared_words_without_case(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(SESSION_1)
    await memory.add_session_to_memory(SESSION_2)
    found = (await memory.search_memory(app_name=APP, user_id=USER, query="Python")).memories
    assert texts(found) == ["I like to code in Python."]
    assert found[0].author == "user"
    assert await search(memory, "development") == [
        "I agree. The Agent Development Kit (ADK) rocks!"
    ]
    assert len(await search(memory, "How about ADK?")) == 2
    assert await search(memory, "nonexistent") == []


async def test_search_is_scoped_by_user_and_app(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(SESSION_1)
    await memory.add_session_to_memory(OTHER)
    assert await search(memory, "secret") == []
    assert await search(memory, "secret", user=OTHER_USER) == ["This is a secret."]
    slashed = session("s", said("slashed", "This is a secret."), app="app/other-user", user="user")
    await memory.add_session_to_memory(slashed)
    found = await memory.search_memory(app_name="app", user_id="other-user/user", query="secret")
    assert found.memories == []


@pytest.mark.parametrize(
    ("text", "query", "count"),
    [
        ("私の名前は太郎です", "太郎", 1),
        ("私の名前は太郎です", "天気", 0),
        ("我喜欢机器学习", "机器学习", 1),
        ("我喜欢机器学习", "天气预报", 0),
        ("제 이름은 민수입니다", "민수입니다", 1),
        ("Меня зовут Алексей", "Алексей", 1),
        ("太郎 works at ABC Corp", "太郎", 1),
        ("太郎 works at ABC Corp", "ABC", 1),
        ("私はPythonでADKを使っています", "Python", 1),
        ("私はPythonでADKを使っています", "adk", 1),
        ("我用Python写代码", "python", 1),
        ("私はPythonでADKを使っています", "使って", 1),
        ("私はPythonでADKを使っています", "Java", 0),
        ("I like to code in Python.", "thon", 0),
        ("私はPythonでADKを使っています", "thon", 0),
        (unicodedata.normalize("NFD", "私はCaféでADKを使っています"), "Café", 1),
        (unicodedata.normalize("NFD", "私はCaféでADKを使っています"), "café", 1),
        (unicodedata.normalize("NFD", "私はCaféでADKを使っています"), "Ruby", 0),
        (unicodedata.normalize("NFD", "Meet at the Café"), "Café", 1),
        ("Meet at the Café", unicodedata.normalize("NFD", "Café"), 1),
        (unicodedata.normalize("NFD", "プログラミングを学ぶ"), "プログラミング", 1),
        (unicodedata.normalize("NFD", "제 이름은 민수입니다"), "민수입니다", 1),
    ],
)
async def test_search_in_every_script(
    memory: DurableMemoryService, text: str, query: str, count: int
) -> None:
    await memory.add_session_to_memory(session("session-i18n", said("event-i18n", text)))
    assert len(await search(memory, query)) == count


async def test_more_shared_words_rank_first(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(
        session(
            "ranked",
            said("a", "The deploy is ready."),
            said("b", "Ready."),
            said("c", "The deploy status is ready."),
        )
    )
    assert await search(memory, "deploy status ready") == [
        "The deploy status is ready.", "The deploy is ready.", "Ready.",
    ]  # fmt: skip


async def test_at_most_max_results_the_best_first(store: Store) -> None:
    memory = DurableMemoryService(store, org_id="acme")
    events = [said(f"note-{i:02d}", f"note {i} about work") for i in range(20)]
    events.append(said("backlog", "the backlog note about work"))
    await memory.add_session_to_memory(session("many", *events))
    found = await search(memory, "work backlog note")
    # The rare word first. The rest tie (same words, same time): ADK's in-memory service
    # keeps them in the order added, this one orders equal scores newest first, then by id.
    assert found == ["the backlog note about work"] + [
        f"note {i} about work" for i in range(19, 10, -1)
    ]
    three = DurableMemoryService(store, org_id="acme", max_results=3)
    assert len(await search(three, "work")) == 3
    for bad in (0, -1, True, 2.0):
        with pytest.raises(InvalidArgumentError):
            DurableMemoryService(store, max_results=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("whole_session", [True, False])
async def test_memories_are_copies_both_ways(
    memory: DurableMemoryService, whole_session: bool
) -> None:
    event = said("event", "I prefer jasmine tea.", at=12345)
    if whole_session:
        await memory.add_session_to_memory(session("session", event))
    else:
        await memory.add_events_to_memory(
            app_name=APP, user_id=USER, session_id="session", events=[event]
        )
    event.author = "changed"
    assert event.content is not None
    assert event.content.parts is not None
    event.content.parts[0].text = "I prefer coffee."
    first = (await memory.search_memory(app_name=APP, user_id=USER, query="jasmine")).memories
    assert [(m.author, m.content.parts[0].text) for m in first] == [
        ("user", "I prefer jasmine tea.")
    ]
    first[0].content.parts.clear()
    assert await search(memory, "jasmine") == ["I prefer jasmine tea."]


async def test_add_memory_and_metadata(memory: DurableMemoryService) -> None:
    entry = MemoryEntry(
        id="fact-1",
        content=types.Content(role="user", parts=[types.Part(text="Allergic to peanuts")]),
        author="user",
        timestamp="2024-05-01T10:00:00+02:00",
        custom_metadata={"source": "intake"},
    )
    bare = MemoryEntry(content=types.Content(parts=[types.Part(text="Likes peanuts? no")]))
    await memory.add_memory(
        app_name=APP, user_id=USER, memories=[entry, bare], custom_metadata={"ttl": 30}
    )
    await memory.add_memory(app_name=APP, user_id=USER, memories=[entry])  # again: nothing
    found = (await memory.search_memory(app_name=APP, user_id=USER, query="peanuts")).memories
    assert len(found) == 2
    (fact,) = [m for m in found if m.id == "fact-1"]
    assert fact.content == entry.content
    assert fact.custom_metadata == {"ttl": 30, "source": "intake"}
    assert datetime.fromisoformat(fact.timestamp or "") == datetime(
        2024, 5, 1, 8, tzinfo=timezone.utc
    )
    (other,) = [m for m in found if m.id != "fact-1"]
    assert other.id
    assert other.timestamp
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, events=[said("e1", "peanut butter")],
        custom_metadata={"kind": "event"},
    )  # fmt: skip
    (butter,) = (await memory.search_memory(app_name=APP, user_id=USER, query="butter")).memories
    assert butter.custom_metadata == {"kind": "event"}
    with pytest.raises(InvalidArgumentError):
        await memory.add_memory(
            app_name=APP, user_id=USER,
            memories=[MemoryEntry(content=types.Content(parts=[]), timestamp="yesterday")],
        )  # fmt: skip


async def test_delete_one_memory_or_all_of_a_user(memory: DurableMemoryService) -> None:
    await memory.add_session_to_memory(SESSION_1)
    await memory.add_session_to_memory(OTHER)
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id="event-1a")
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id=None)  # nothing
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id="missing")
    assert await search(memory, "ADK") == ["I agree. The Agent Development Kit (ADK) rocks!"]
    await memory.delete_memories(app_name=APP, user_id=USER)
    assert await search(memory, "ADK") == []
    assert await search(memory, "secret", user=OTHER_USER) == ["This is a secret."]


async def test_organisations_never_share_memories(store: Store) -> None:
    acme = DurableMemoryService(store, org_id="acme")
    globex = DurableMemoryService(store, org_id="globex")
    await acme.add_session_to_memory(SESSION_2)
    assert await search(globex, "python") == []
    unbound = DurableMemoryService(store)
    with pytest.raises(MissingScopeError):
        await search(unbound, "python")
    manager = Manager(store)
    bound = await manager.create("acme", USER)
    with manager.bind(bound):
        assert await search(unbound, "python") == ["I like to code in Python."]


async def test_a_memory_outlives_its_session_until_the_user_is_erased(store: Store) -> None:
    sessions = DurableSessionService(store, org_id="acme")
    memory = DurableMemoryService(store, org_id="acme")
    created = await sessions.create_session(app_name=APP, user_id=USER, session_id="trip")
    await sessions.append_event(created, said("e1", "The hotel is in Porto."))
    stored = await sessions.get_session(app_name=APP, user_id=USER, session_id="trip")
    assert stored is not None
    await memory.add_session_to_memory(stored)
    (kept,) = await store.search_memories("acme", APP, USER, "porto")
    assert kept.session_id == durable_session_id(APP, USER, "trip")
    await sessions.delete_session(app_name=APP, user_id=USER, session_id="trip")
    assert await search(memory, "porto") == ["The hotel is in Porto."]
    await store.delete_user("acme", USER)
    assert await search(memory, "porto") == []
