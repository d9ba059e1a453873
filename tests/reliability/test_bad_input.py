"""Bad input, on memory, SQLite and Postgres with the same outcome.

Every input here is either refused with the same typed error class on every store (the exact
class, not just a base class) while nothing observable changes, or stored literally and
read back unchanged. "Nothing changes" is checked after each refused write: on SQL stores
with ``snapshot()`` of every table, on the memory store through ``list``/``get``/
``list_events`` of every organisation involved.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    Session,
    SessionError,
    SessionNotFoundError,
    SQLStore,
    StaleSessionError,
    Store,
    new_id,
)
from durable_sessions.sql.transfer import dumps, import_jsonl
from durable_sessions.state import DEFAULT_MAX_VALUE_BYTES, MAX_ID_BYTES, MAX_KEY_BYTES
from reliability.figures import Figures
from reliability.helpers import canonical, count_present, observe_org
from support.sql import snapshot

pytestmark = pytest.mark.usefixtures("backend")

ORG, OTHER_ORG = "org", "org-b"
BASELINE: dict[str, Any] = {"k": 1, "user:u": 1, "app:a": 1}

Attempt = Callable[[], Awaitable[Any]]


@dataclass
class Scene:
    """A store holding a known baseline, and the bookkeeping of refused writes."""

    store: Store
    engine: AsyncEngine | None
    session_id: str
    attempted: int = 0
    refused: int = 0

    async def observe(self) -> Any:
        """Everything stored: every table on SQL stores, every org's API view in memory."""
        if self.engine is not None:
            return await snapshot(self.engine)
        return [await observe_org(self.store, org) for org in (ORG, OTHER_ORG)]

    async def refuse(self, error: type[SessionError], attempt: Attempt) -> None:
        """The attempt raises exactly ``error`` and changes nothing stored."""
        before = await self.observe()
        self.attempted += 1
        with pytest.raises(SessionError) as caught:
            await attempt()
        assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
        self.refused += 1
        assert await self.observe() == before

    async def copy(self) -> Session:
        """A fresh copy of the baseline session."""
        return await self.store.get(ORG, self.session_id)

    def new_session(self, state: dict[str, Any], **fields: Any) -> Session:
        """A session object not stored yet (its fields may be bad on purpose)."""
        values: dict[str, Any] = {"id": new_id(), "org_id": ORG, "user_id": "alice"}
        values["app_name"] = "app"
        values.update(fields)
        return Session(state=state, **values)

    def value_attempts(self, key: Any, value: Any) -> list[Attempt]:
        """Write ``key = value`` through create, save and append_event's state delta."""

        async def create() -> None:
            await self.store.create(self.new_session({key: value}))

        async def save() -> None:
            copy = await self.copy()
            copy.state[key] = value  # past Session.set, which would refuse it earlier
            await self.store.update(copy)

        async def append() -> None:
            await self.store.append_event(
                ORG, self.session_id, Event("u", state_delta={key: value})
            )

        return [create, save, append]

    async def baseline_found(self) -> tuple[int, int]:
        """(expected, found) of the baseline: its keys and its one event."""
        state = (await self.copy()).state
        events = await self.store.list_events(ORG, self.session_id)
        expected = len(BASELINE) + 1
        found = count_present(BASELINE, state) + sum(1 for e in events if e.content == "hello")
        return expected, found


async def make_scene(store: Store, engine: AsyncEngine | None) -> Scene:
    """Store the baseline: a session of every scope with one event, and another org's."""
    manager = Manager(store, app_name="app")
    session = await manager.create(ORG, "alice", state=dict(BASELINE))
    await store.append_event(ORG, session.id, Event("user", content="hello"))
    await Manager(store, app_name="app").create(OTHER_ORG, "bob", state={"user:b": 1})
    return Scene(store, engine, session.id)


@pytest.fixture
async def scene(store_factory: Callable[..., Store], engine_or_none: AsyncEngine | None) -> Scene:
    """A store with the default options, holding the baseline."""
    return await make_scene(store_factory(), engine_or_none)


async def finish(scene: Scene, figures: Figures, scenario: str, backend: str) -> None:
    """Record the row of a refusal scenario: every attempt refused, the baseline whole."""
    expected, found = await scene.baseline_found()
    figures.record(
        scenario,
        backend,
        operations=scene.attempted,
        expected=expected,
        found=found,
        errors=scene.refused,
    )
    assert scene.refused == scene.attempted


class Opaque:
    """Some object that is not a JSON value."""


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


NOT_JSON: dict[str, Any] = {
    "object": Opaque(),
    "set": {1, 2},
    "tuple": (1, 2),
    "bytes": b"raw",
    "datetime": datetime(2024, 1, 1, tzinfo=timezone.utc),
    "Decimal": Decimal("1.5"),
    "complex": 1j,
    "non-string nested key": {"a": {1: "x"}},
    "None nested key": {None: 1},
    "nested too deep": nested(80),
}
NON_FINITE: dict[str, Any] = {
    "NaN": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "NaN in a list": [1, math.nan],
    "inf in an object": {"x": {"y": math.inf}},
}
NUL: dict[str, Any] = {
    "NUL in a string": "a\x00b",
    "NUL in a nested string": ["ok", {"x": "\x00"}],
    "NUL in a nested key": {"a\x00": 1},
}
SURROGATES: dict[str, Any] = {
    "lone high surrogate": "\ud800",
    "lone low surrogate": "x\udfff",
    "surrogate in a nested key": {"\udc80": 1},
}
SCOPED_KEYS = ("k", "user:k", "app:k")


async def refuse_values(scene: Scene, values: dict[str, Any]) -> None:
    """Each value is refused with InvalidStateError in every scope and as event content."""
    for value in values.values():
        for key in SCOPED_KEYS:
            for attempt in scene.value_attempts(key, value):
                await scene.refuse(InvalidStateError, attempt)

        async def content(value: Any = value) -> None:
            await scene.store.append_event(ORG, scene.session_id, Event("u", content=value))

        await scene.refuse(InvalidStateError, content)


async def test_non_json_values_are_refused(scene: Scene, backend: str, figures: Figures) -> None:
    await refuse_values(scene, NOT_JSON)
    await finish(scene, figures, "bad input: non-JSON values refused", backend)


async def test_nan_and_infinities_are_refused(scene: Scene, backend: str, figures: Figures) -> None:
    await refuse_values(scene, NON_FINITE)
    await finish(scene, figures, "bad input: NaN/inf refused", backend)


async def test_nul_is_refused_in_keys_values_content_and_ids(
    scene: Scene, backend: str, figures: Figures
) -> None:
    await refuse_values(scene, NUL)
    for key in ("nul\x00", "user:nul\x00", "app:\x00", "temp:\x00"):
        for attempt in scene.value_attempts(key, 1):
            await scene.refuse(InvalidStateError, attempt)
    await refuse_bad_text_in_ids(scene, "a\x00b")
    await finish(scene, figures, "bad input: \\u0000 refused", backend)


async def test_lone_surrogates_are_refused(scene: Scene, backend: str, figures: Figures) -> None:
    await refuse_values(scene, SURROGATES)
    for key in ("\ud800", "user:\udc00", "app:x\udfff"):
        for attempt in scene.value_attempts(key, 1):
            await scene.refuse(InvalidStateError, attempt)
    await refuse_bad_text_in_ids(scene, "x\ud800")
    await finish(scene, figures, "bad input: lone surrogates refused", backend)


async def refuse_bad_text_in_ids(scene: Scene, bad: str) -> None:
    """Ids, titles and event fields holding ``bad`` are refused with InvalidArgumentError."""
    store, sid = scene.store, scene.session_id
    attempts: list[Attempt] = [
        lambda: store.create(scene.new_session({}, id=bad)),
        lambda: store.create(scene.new_session({}, user_id=bad)),
        lambda: store.create(scene.new_session({}, app_name=bad)),
        lambda: store.create(scene.new_session({}, title=bad)),
        lambda: store.get(ORG, bad),
        lambda: store.append_event(ORG, sid, Event(bad)),
        lambda: store.append_event(ORG, sid, Event("u", invocation_id=bad)),
        lambda: store.append_event(ORG, sid, Event("u", id=bad)),
        lambda: store.touch(ORG, sid, title=bad),
        lambda: store.fork(ORG, sid, new_session_id=bad),
        lambda: store.list(Filter(ORG, user_id=bad)),
        lambda: store.delete_user(ORG, bad),
    ]

    async def retitle() -> None:
        copy = await scene.copy()
        copy.title = bad
        await store.update(copy)

    attempts.append(retitle)
    for attempt in attempts:
        await scene.refuse(InvalidArgumentError, attempt)


async def test_empty_keys_and_bare_prefixes_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    for key in ("", "user:", "app:", "temp:", 1, None, ("t",), "k" * 1025):
        for attempt in scene.value_attempts(key, 1):
            await scene.refuse(InvalidStateError, attempt)

    async def delete_bare_prefix() -> None:
        copy = await scene.copy()
        copy.state.pop("user:u")
        copy._persisted["user:"] = 1  # a stored key "user:" that the copy deletes
        await scene.store.update(copy)

    await scene.refuse(InvalidStateError, delete_bare_prefix)
    await finish(scene, figures, "bad input: empty keys, bare prefixes refused", backend)


def json_of_size(size: int, char: str = "x") -> str:
    """A string whose JSON encoding (quotes included) is ``size`` bytes of UTF-8."""
    width = len(char.encode())
    assert (size - 2) % width == 0
    return char * ((size - 2) // width)


async def check_size_limit(scene: Scene, limit: int, char: str) -> int:
    """Values of exactly ``limit`` bytes are stored whole; one byte more is refused."""
    fits, over = json_of_size(limit, char), json_of_size(limit, char) + "x"
    for key in SCOPED_KEYS:
        for attempt in scene.value_attempts(key, over):
            await scene.refuse(InvalidStateError, attempt)
    for content in (over, {"nested": [over]}):

        async def append(content: Any = content) -> None:
            await scene.store.append_event(ORG, scene.session_id, Event("u", content=content))

        await scene.refuse(InvalidStateError, append)
    # Exactly at the limit: stored and read back literally, in every scope.
    copy = await scene.copy()
    for key in SCOPED_KEYS:
        copy.set(key, fits)
    await scene.store.update(copy)
    stored = (await scene.copy()).state
    assert all(stored[key] == fits for key in SCOPED_KEYS)
    event = await scene.store.append_event(ORG, scene.session_id, Event("u", content=fits))
    (read,) = await scene.store.list_events(ORG, scene.session_id, limit=1)
    assert read.content == event.content == fits
    return len(SCOPED_KEYS) + 1


async def test_huge_values_default_limit(scene: Scene, backend: str, figures: Figures) -> None:
    """The default limit (1 MiB as UTF-8 JSON): at the limit stored, one byte over refused."""
    stored = await check_size_limit(scene, DEFAULT_MAX_VALUE_BYTES, "x")
    figures.record(
        "bad input: values over 1 MiB refused",
        backend,
        operations=scene.attempted + stored,
        expected=stored,
        found=stored,
        errors=scene.refused,
    )
    assert scene.refused == scene.attempted


async def test_huge_values_configured_limit(
    store_factory: Callable[..., Store],
    engine_or_none: AsyncEngine | None,
    backend: str,
    figures: Figures,
) -> None:
    """A configured limit of 4096 bytes, counted in UTF-8 bytes (``é`` is two)."""
    scene = await make_scene(store_factory(max_value_bytes=4096), engine_or_none)
    stored = await check_size_limit(scene, 4096, "é")
    figures.record(
        "bad input: values over a configured limit refused",
        backend,
        operations=scene.attempted + stored,
        expected=stored,
        found=stored,
        errors=scene.refused,
    )
    assert scene.refused == scene.attempted


INJECTIONS = [
    "'; DROP TABLE ds_sessions; --",
    '"; DROP TABLE ds_events; --',
    "Robert'); DELETE FROM ds_user_state;--",
    "1' OR '1'='1",
    "%",
    "_",
    "\\",
    "$1",
    ":k_org",
    "?",
    "ds_sessions.org_id",
]


async def test_sql_looking_ids_and_keys_are_stored_literally(
    store_factory: Callable[..., Store],
    engine_or_none: AsyncEngine | None,
    backend: str,
    figures: Figures,
) -> None:
    """Ids, names, keys, values, titles and event fields that look like SQL are data."""
    store = store_factory()
    writes = expected = found = 0
    for text in INJECTIONS:
        manager = Manager(store, app_name=text)
        state = {text: text, f"user:{text}": text, f"app:{text}": text}
        await manager.create(text, text, id=text, state=state, title=text)
        event = Event(
            text, content={text: text}, invocation_id=text, id=text, state_delta={"e": text}
        )
        await store.append_event(text, text, event)
        await store.fork(text, text, new_session_id=f"{text}-fork")
        writes += 3
        stored = await store.get(text, text)
        fields = (stored.org_id, stored.id, stored.user_id, stored.app_name, stored.title)
        want = {**state, "e": text}
        expected += len(want) + len(fields) + 1
        found += count_present(want, stored.state) + sum(1 for f in fields if f == text)
        (read,) = await store.list_events(text, text)
        same = (read.author, read.id, read.invocation_id, read.content) == (
            text,
            text,
            text,
            {text: text},
        )
        found += int(same)
        listed = await store.list(Filter(text, user_id=text, app_name=text))
        assert {s.id for s in listed} == {text, f"{text}-fork"}
    # LIKE wildcards and quotes match only themselves: each org lists its own two sessions.
    for text in INJECTIONS:
        assert {s.org_id for s in await store.list(Filter(text))} == {text}
        assert {s.user_id for s in await store.list(Filter(text, user_id=text))} == {text}
    if engine_or_none is not None:  # every table is still there, with every row
        tables = await snapshot(engine_or_none)
        assert len(tables["ds_sessions"]) == 2 * len(INJECTIONS)
        assert len(tables["ds_events"]) == len(INJECTIONS)  # forks copy no transcript
    figures.record(
        "bad input: SQL-looking ids/keys stored literally",
        backend,
        operations=writes,
        expected=expected,
        found=found,
    )


async def test_empty_none_and_wrong_org_ids(scene: Scene, backend: str, figures: Figures) -> None:
    """An empty, None, non-string or unstorable org id is refused everywhere; another
    organisation's id finds nothing and changes nothing."""
    store, sid = scene.store, scene.session_id

    def calls(org: Any) -> list[Attempt]:
        async def update() -> None:
            copy = await scene.copy()
            copy.org_id = org
            copy.set("k", 2)
            await store.update(copy)

        return [
            lambda: store.create(scene.new_session({}, org_id=org)),
            lambda: store.get(org, sid),
            update,
            lambda: store.delete(org, sid),
            lambda: store.list(Filter(org)),
            lambda: store.append_event(org, sid, Event("u")),
            lambda: store.list_events(org, sid),
            lambda: store.touch(org, sid, messages=1),
            lambda: store.fork(org, sid),
            lambda: store.purge(org, older_than=timedelta(0)),
            lambda: store.delete_user(org, "alice"),
        ]

    for org in ("", None, 123, b"org", "a\x00", "x" * 256):
        for attempt in calls(org):
            await scene.refuse(InvalidArgumentError, attempt)
    for attempt in calls(OTHER_ORG)[1:4] + calls(OTHER_ORG)[5:9]:
        await scene.refuse(SessionNotFoundError, attempt)
    before = await scene.observe()
    assert [s.org_id for s in await store.list(Filter(OTHER_ORG))] == [OTHER_ORG]
    assert await store.delete_user(OTHER_ORG, "alice") == 0
    assert await store.purge("org-without-sessions", older_than=timedelta(0)) == 0
    assert await scene.observe() == before
    await finish(scene, figures, "bad input: empty/None/wrong org_id", backend)


async def test_naive_and_non_datetimes_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    store, sid = scene.store, scene.session_id
    naive = datetime(2024, 1, 1, 12, 0)
    for bad in (naive, datetime.now(), date(2024, 1, 1), "2024-01-01T00:00:00+00:00", 0):

        async def after(bad: Any = bad) -> None:
            await store.list_events(ORG, sid, after=bad)

        async def stamp(bad: Any = bad) -> None:
            await store.append_event(ORG, sid, Event("u", content="late", timestamp=bad))

        await scene.refuse(InvalidArgumentError, after)
        await scene.refuse(InvalidArgumentError, stamp)
    # An aware datetime in any zone is fine, and compared in UTC.
    plus2 = timezone(timedelta(hours=2))
    await store.append_event(
        ORG, sid, Event("u", content="x", timestamp=datetime(2030, 1, 1, tzinfo=plus2))
    )
    later = await store.list_events(
        ORG, sid, after=datetime(2029, 12, 31, 21, 59, tzinfo=timezone.utc)
    )
    assert [e.content for e in later] == ["x"]
    assert later[0].timestamp == datetime(2029, 12, 31, 22, 0, tzinfo=timezone.utc)
    await finish(scene, figures, "bad input: naive datetimes refused", backend)


async def test_bad_numbers_are_refused(scene: Scene, backend: str, figures: Figures) -> None:
    store, sid = scene.store, scene.session_id
    attempts: list[Attempt] = [
        lambda: store.list_events(ORG, sid, limit=-1),
        lambda: store.list_events(ORG, sid, limit=True),
        lambda: store.list_events(ORG, sid, limit=1.5),  # type: ignore[arg-type]
        lambda: store.list(Filter(ORG, limit=-1)),
        lambda: store.touch(ORG, sid, messages=-1),
        lambda: store.touch(ORG, sid, tokens=1.5),  # type: ignore[arg-type]
        lambda: store.touch(ORG, sid, tokens=True),
        lambda: store.append_event(ORG, sid, Event("u", tokens=-1)),
        lambda: store.append_event(ORG, sid, Event("u", tokens="1")),  # type: ignore[arg-type]
        lambda: store.append_event(ORG, sid, Event("u", state_delta=[("k", 1)])),  # type: ignore[arg-type]
        lambda: store.append_event(ORG, sid, "not an event"),  # type: ignore[arg-type]
        lambda: store.purge(ORG, older_than=timedelta(days=-1)),
        lambda: store.purge(ORG, older_than=30),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        await scene.refuse(InvalidArgumentError, attempt)
    await finish(scene, figures, "bad input: bad counts, limits, periods", backend)


# -- edge cases that once differed between stores ---------------------------------------------

NUMBERS = [0.5, 3.0, 1e16, -2.5e17, 1.7976931348623157e308, 1e22, 5e-324, 2**70, -(2**63), True]


async def test_numbers_round_trip_with_their_type(store: Store) -> None:
    """Floats with an integral value or an exponent stay floats, big ints stay exact ints."""
    state = {"f": NUMBERS, "user:f": NUMBERS, "app:top": 1e16, "top": 2**70}
    session = await Manager(store).create(ORG, "alice", state=state)
    await store.append_event(ORG, session.id, Event("u", content=NUMBERS))
    stored = await store.get(ORG, session.id)
    (event,) = await store.list_events(ORG, session.id)
    assert canonical(stored.state) == canonical(state)
    assert canonical(event.content) == canonical(NUMBERS)


async def test_negative_zero_reads_back_as_zero_everywhere(store: Store) -> None:
    state = {"z": -0.0, "user:z": [-0.0], "app:z": {"x": -0.0}}
    session = await Manager(store).create(ORG, "alice", state=state)
    await store.append_event(ORG, session.id, Event("u", content=-0.0, state_delta={"d": -0.0}))
    stored = await store.get(ORG, session.id)
    (event,) = await store.list_events(ORG, session.id)
    found = [stored.state["z"], stored.state["user:z"][0], stored.state["app:z"]["x"]]
    found += [stored.state["d"], event.content]
    assert [math.copysign(1.0, f) for f in found] == [1.0] * len(found)


async def test_counts_beyond_int64_are_invalid_arguments(store: Store) -> None:
    session = await Manager(store).create(ORG, "alice")
    huge = 2**63
    attempts: list[Attempt] = [
        lambda: store.append_event(ORG, session.id, Event("u", tokens=huge)),
        lambda: store.touch(ORG, session.id, messages=huge),
        lambda: store.touch(ORG, session.id, tokens=huge),
        lambda: store.list_events(ORG, session.id, limit=huge),
        lambda: store.list(Filter(ORG, limit=huge)),
    ]
    outcomes = []
    for attempt in attempts:
        try:
            await attempt()
            outcomes.append("accepted")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes == ["InvalidArgumentError"] * len(attempts)
    stored = await store.get(ORG, session.id)
    assert (stored.message_count, stored.token_total, stored.version) == (0, 0, 1)


async def test_counter_overflow_never_corrupts_the_counter(store: Store) -> None:
    """Increments that overflow a 64-bit counter are refused with a typed error (nothing
    written) or kept exactly; the stored counter is always the int sum of what was kept."""
    session = await Manager(store).create(ORG, "alice")
    kept = 0
    for _ in range(2):
        try:
            await store.touch(ORG, session.id, tokens=2**62)
            kept += 2**62
        except SessionError:
            pass
    total = (await store.get(ORG, session.id)).token_total
    assert type(total) is int
    assert total == kept


async def test_a_call_with_two_faults_raises_the_same_class_everywhere(store: Store) -> None:
    attempts: list[Attempt] = [
        lambda: store.append_event("", "s", Event("u", content=math.nan)),
        lambda: store.fork(ORG, "missing", new_session_id="\x00"),
    ]
    for attempt in attempts:
        with pytest.raises(SessionError) as caught:
            await attempt()
        assert type(caught.value) is InvalidArgumentError


async def test_datetimes_out_of_range_in_utc_are_invalid_arguments(store: Store) -> None:
    session = await Manager(store).create(ORG, "alice")
    early = datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))
    late = datetime(9999, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-1)))
    for moment in (early, late):
        with pytest.raises(InvalidArgumentError):
            await store.append_event(ORG, session.id, Event("u", timestamp=moment))
        with pytest.raises(InvalidArgumentError):
            await store.list_events(ORG, session.id, after=moment)


@pytest.mark.parametrize("field", ["user_id", "app_name"])
async def test_save_of_a_copy_with_another_owner_loses_nothing(store: Store, field: str) -> None:
    """Saving a copy whose user_id or app_name was changed either is refused or writes its
    shared keys where the session sees them; it never drops them without a word."""
    manager = Manager(store, app_name="app")
    session = await manager.create(ORG, "alice")
    await manager.create(ORG, "mallory")
    copy = await manager.get(ORG, session.id)
    setattr(copy, field, "mallory" if field == "user_id" else "other-app")
    copy.set("user:written", 1)
    copy.set("app:written", 1)
    try:
        await manager.save(copy)
    except InvalidArgumentError:
        stored = await manager.get(ORG, session.id)
        assert "user:written" not in stored.state
        assert stored.version == 1
        return
    stored = await manager.get(ORG, session.id)
    assert stored.state.get("user:written") == 1
    assert stored.state.get("app:written") == 1


# -- periods before the year 1, numbers past 64 bits --------------------------------------------

MAX_INT64 = 2**63 - 1


async def test_purge_periods_reaching_before_the_year_one_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    """A period longer than the time since the year 1 has no cutoff: InvalidArgumentError,
    not OverflowError; the longest period that has one purges nothing of a new session."""
    store = scene.store
    for period in (timedelta.max, timedelta(days=999_999), timedelta(days=800_000)):
        for dry_run in (True, False):

            async def purge(period: timedelta = period, dry_run: bool = dry_run) -> None:
                await store.purge(ORG, older_than=period, dry_run=dry_run)

            await scene.refuse(InvalidArgumentError, purge)
    assert await store.purge(ORG, older_than=timedelta(days=700_000)) == 0
    await finish(scene, figures, "bad input: purge periods before year 1 refused", backend)


async def test_expected_versions_past_64_bits_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    """An expected_version outside the 64-bit signed range is InvalidArgumentError (not
    OverflowError or StoreError); one inside it that is not the stored version is stale."""
    store, sid = scene.store, scene.session_id
    for bad in (2**70, MAX_INT64 + 1, -MAX_INT64 - 2, -(2**80)):

        async def append(bad: int = bad) -> None:
            await store.append_event(ORG, sid, Event("u"), expected_version=bad)

        await scene.refuse(InvalidArgumentError, append)
    for other in (MAX_INT64, -MAX_INT64 - 1, 0):

        async def stale(other: int = other) -> None:
            await store.append_event(ORG, sid, Event("u"), expected_version=other)

        await scene.refuse(StaleSessionError, stale)
    await finish(scene, figures, "bad input: expected_version past 64 bits", backend)


NOT_INT64: list[Any] = ["1", 1.0, True, None, MAX_INT64 + 1, -MAX_INT64 - 2, 2**70]


async def test_bad_versions_and_counters_on_a_session_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    """A session whose version, message_count or token_total is not a 64-bit integer is
    refused by create and update alike; so is saving a copy at the last version."""
    for name in ("version", "message_count", "token_total"):
        for bad in NOT_INT64:

            async def save(name: str = name, bad: Any = bad) -> None:
                copy = await scene.copy()
                copy.set("k", 2)
                setattr(copy, name, bad)
                await scene.store.update(copy)

            async def create(name: str = name, bad: Any = bad) -> None:
                await scene.store.create(scene.new_session({"k": 1}, **{name: bad}))

            await scene.refuse(InvalidArgumentError, save)
            await scene.refuse(InvalidArgumentError, create)

    async def save_last_version() -> None:
        copy = await scene.copy()
        copy.version = MAX_INT64
        copy.set("k", 2)
        await scene.store.update(copy)

    await scene.refuse(InvalidArgumentError, save_last_version)
    await finish(scene, figures, "bad input: non-int64 version/counters", backend)


async def session_at(scene: Scene, **counters: int) -> str:
    """A session of alice whose counters start at the given values: imported into SQL
    stores (the way such counters get there), set in place in memory, which has no import."""
    values = {"message_count": 0, "token_total": 0, "event_seq": 0, "version": 1, **counters}
    if scene.engine is None:
        session = await Manager(scene.store, app_name="app").create(ORG, "alice")
        meta = scene.store._sessions[(ORG, session.id)].meta  # type: ignore[attr-defined]
        for name in ("message_count", "token_total", "version"):
            setattr(meta, name, values[name])
        return session.id
    assert isinstance(scene.store, SQLStore)
    session_id, now = new_id(), "2025-01-02T03:04:05.000006Z"
    record = {
        "type": "session", "org_id": ORG, "id": session_id, "user_id": "alice",
        "app_name": "app", "title": "", "state": {}, "parent_id": None, "created_at": now,
        "updated_at": now, **values,
    }  # fmt: skip
    header = {"format": "durable-sessions", "type": "header", "version": 1}
    await import_jsonl(scene.store, [dumps(header).encode(), dumps(record).encode()])
    return session_id


async def test_counters_at_64_bits_refuse_to_overflow(
    scene: Scene, backend: str, figures: Figures
) -> None:
    """touch, append_event and update that would carry a counter or the version past
    2**63 - 1 raise InvalidArgumentError on every store and write nothing; a write that
    lands exactly on 2**63 - 1 is kept, as an int."""
    store = scene.store
    full_messages = await session_at(scene, message_count=MAX_INT64)
    near_tokens = await session_at(scene, token_total=MAX_INT64 - 5)
    last_version = await session_at(scene, version=MAX_INT64)

    async def save_last_version() -> None:
        copy = await store.get(ORG, last_version)
        copy.set("k", 1)
        await store.update(copy)

    attempts: list[Attempt] = [
        lambda: store.touch(ORG, full_messages, messages=1),
        lambda: store.append_event(ORG, full_messages, Event("u")),
        lambda: store.append_event(ORG, full_messages, Event("u", state_delta={"k": 1})),
        lambda: store.touch(ORG, near_tokens, tokens=6),
        lambda: store.append_event(ORG, near_tokens, Event("u", tokens=6)),
        lambda: store.append_event(ORG, near_tokens, Event("u", tokens=6, state_delta={"k": 1})),
        lambda: store.touch(ORG, last_version),
        lambda: store.append_event(ORG, last_version, Event("u")),
        lambda: store.append_event(ORG, last_version, Event("u"), expected_version=MAX_INT64),
        save_last_version,
    ]
    for attempt in attempts:
        await scene.refuse(InvalidArgumentError, attempt)
    # A stale expected version is still stale first, as without the overflow.
    await scene.refuse(
        StaleSessionError,
        lambda: store.append_event(ORG, last_version, Event("u"), expected_version=1),
    )
    touched = await store.touch(ORG, near_tokens, tokens=5)
    stored = await store.get(ORG, near_tokens)
    assert touched.token_total == stored.token_total == MAX_INT64
    assert type(stored.token_total) is int
    await finish(scene, figures, "bad input: counters past 2**63-1 refused", backend)


# -- ids and keys past their limits in UTF-8 bytes ----------------------------------------------


def wide_text(size: int, char: str) -> str:
    """``char`` repeated, padded with ASCII to exactly ``size`` bytes of UTF-8."""
    width = len(char.encode())
    return char * (size // width) + "p" * (size % width)


async def test_ids_and_keys_past_their_byte_limits_are_refused(
    scene: Scene, backend: str, figures: Figures
) -> None:
    """Ids of 513 bytes (under 255 characters) and keys of 1,025 bytes (under 1,024) are
    refused everywhere, as Postgres could not index them; at 512 and 1,024 they are kept."""
    store, sid = scene.store, scene.session_id
    bad_id = wide_text(MAX_ID_BYTES + 1, "😀")
    attempts: list[Attempt] = [
        lambda: store.create(scene.new_session({}, id=bad_id)),
        lambda: store.create(scene.new_session({}, user_id=bad_id)),
        lambda: store.create(scene.new_session({}, app_name=bad_id)),
        lambda: store.create(scene.new_session({}, org_id=bad_id)),
        lambda: store.append_event(ORG, sid, Event(bad_id)),
        lambda: store.append_event(ORG, sid, Event("u", id=bad_id)),
        lambda: store.fork(ORG, sid, new_session_id=bad_id),
        lambda: store.list(Filter(ORG, user_id=bad_id)),
        lambda: store.delete_user(ORG, bad_id),
    ]
    for attempt in attempts:
        await scene.refuse(InvalidArgumentError, attempt)
    for prefix in ("", "user:", "app:", "temp:"):
        key = prefix + wide_text(MAX_KEY_BYTES + 1 - len(prefix), "語")
        for attempt in scene.value_attempts(key, 1):
            await scene.refuse(InvalidStateError, attempt)
    # At the limits: stored in every scope and read back.
    copy = await scene.copy()
    keys = [prefix + wide_text(MAX_KEY_BYTES - len(prefix), "語") for prefix in SCOPED_KEYS]
    for key in keys:
        copy.set(key, 1)
    await store.update(copy)
    stored = (await scene.copy()).state
    assert all(stored[key] == 1 for key in keys)
    widest = wide_text(MAX_ID_BYTES, "😀")
    await store.create(scene.new_session({}, id=widest, user_id=widest, app_name=widest))
    assert [s.id for s in await store.list(Filter(ORG, user_id=widest))] == [widest]
    await finish(scene, figures, "bad input: ids/keys past their UTF-8 byte limits", backend)
