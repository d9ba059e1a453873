"""State values: every JSON value is stored unchanged; anything else is refused before a write."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_sessions import (
    Event,
    Filter,
    InvalidStateError,
    Manager,
    Session,
    SessionNotFoundError,
    Store,
    new_id,
)

ORG = "org-1"
USER = "user-1"
APP = "app-1"

# -- every JSON value round-trips --------------------------------------------------------------

storable_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4)
    ),
    max_leaves=12,
)


def assert_same_json(got: Any, expected: Any) -> None:
    """Equal, and of the same JSON types all the way down (``1``, ``1.0``, ``True`` differ)."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert_same_json(got[key], value)
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for item, value in zip(got, expected, strict=True):
            assert_same_json(item, value)
    else:
        assert got == expected


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=json_values)
async def test_any_json_value_is_accepted_and_round_trips(store: Store, value: Any) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    for key in ("k", "user:k", "app:k"):
        session.set(key, value)
    await manager.save(session)

    loaded = await manager.get(ORG, session.id)
    for key in ("k", "user:k", "app:k"):
        assert_same_json(loaded.state[key], value)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(content=json_values, delta_value=json_values)
async def test_any_json_value_round_trips_through_an_event(
    store: Store, content: Any, delta_value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    await store.append_event(
        ORG, session.id, Event(author="user", content=content, state_delta={"k": delta_value})
    )

    (event,) = await store.list_events(ORG, session.id)
    assert_same_json(event.content, content)
    assert_same_json(event.state_delta, {"k": delta_value})
    assert_same_json((await manager.get(ORG, session.id)).state["k"], delta_value)


def key_orders(value: Any) -> Any:
    """Every object's keys in order, at any depth (what ``==`` on dicts ignores)."""
    if isinstance(value, dict):
        return [(k, key_orders(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [key_orders(v) for v in value]
    return value


async def test_an_event_content_keeps_its_key_order_on_every_read(store: Store) -> None:
    """Stored as written: an item's keys come back in the order the caller gave them (not
    sorted, not by length as jsonb orders them), from a single append and from a batch."""
    contents = [
        {"type": "message", "role": "assistant", "id": "m1", "a": 1, "content": [
            {"type": "output_text", "text": "hi", "annotations": [], "logprobs": None}]},
        {"zz": {"yy": 1, "b": 2, "aaa": 3}, "call_id": "c", "output": "x", "type": "fn"},
    ]  # fmt: skip
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    await store.append_event(ORG, session.id, Event("user", content=contents[0]))
    await store.append_events(ORG, session.id, [Event("user", content=c) for c in contents])

    written = [key_orders(c) for c in [contents[0], *contents]]
    assert [key_orders(e.content) for e in await store.list_events(ORG, session.id)] == written
    read = await store.list_event_contents(ORG, session.id)
    assert [key_orders(c) for c in read] == written
    with_events = await store.get_with_events(ORG, session.id)
    assert [key_orders(e.content) for e in with_events.events] == written
    newest = await store.list_events(ORG, session.id, limit=2)
    assert [key_orders(e.content) for e in newest] == written[1:]


@pytest.mark.parametrize(
    "value",
    [0.0, 1.0, -2.0, 1e16, 1.5e300, 2**63, 2**70, -(2**70), 5e-324],
    ids=repr,
)
async def test_numbers_keep_their_value_and_type_in_every_scope(store: Store, value: Any) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    for key in ("k", "user:k", "app:k"):
        session.set(key, value)
    await manager.save(session)
    await store.append_event(
        ORG, session.id, Event(author="user", content=value, state_delta={"e": value})
    )

    loaded = await manager.get(ORG, session.id)
    for key in ("k", "user:k", "app:k", "e"):
        assert_same_json(loaded.state[key], value)
    (event,) = await store.list_events(ORG, session.id)
    assert_same_json(event.content, value)


# -- anything else is refused, naming the key, and nothing is written ---------------------------


class _Thing:
    pass


BAD_VALUES = [
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="-inf"),
    pytest.param([1, {"deep": math.nan}], id="nested-nan"),
    pytest.param({1: "one"}, id="int-dict-key"),
    pytest.param({"ok": {None: 1}}, id="nested-none-dict-key"),
    pytest.param("a\x00b", id="nul-in-value"),
    pytest.param({"a\x00": 1}, id="nul-in-nested-key"),
    pytest.param(["\x00"], id="nul-in-nested-value"),
    pytest.param("\ud800", id="surrogate-value"),
    pytest.param({"\ud800": 1}, id="surrogate-nested-key"),
    pytest.param({1, 2}, id="set"),
    pytest.param((1, 2), id="tuple"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(datetime(2024, 1, 1, tzinfo=timezone.utc), id="datetime"),
    pytest.param(_Thing(), id="object"),
]
BAD_KEYS = [
    pytest.param("", id="empty-key"),
    pytest.param("user:", id="bare-user-prefix"),
    pytest.param("app:", id="bare-app-prefix"),
    pytest.param("temp:", id="bare-temp-prefix"),
    pytest.param("k\x00", id="nul-in-key"),
    pytest.param("\ud800", id="surrogate-key"),
]
# (key, value) pairs: bad values under private and shared keys, and bad keys with a good value.
BAD_ENTRIES = [
    *(pytest.param("k", *p.values, id=str(p.id)) for p in BAD_VALUES),
    pytest.param("user:k", math.nan, id="nan-user-scope"),
    pytest.param("app:k", {1: 2}, id="int-dict-key-app-scope"),
    *(pytest.param(*p.values, 1, id=str(p.id)) for p in BAD_KEYS),
]


async def _snapshot(manager: Manager, session_id: str) -> tuple[dict[str, Any], int]:
    stored = await manager.get(ORG, session_id)
    return stored.state, stored.version


async def _shared_state_seen_by_a_new_session(manager: Manager) -> dict[str, Any]:
    fresh = await manager.create(ORG, USER)
    return {k: v for k, v in fresh.state.items() if k.startswith(("user:", "app:"))}


@pytest.mark.parametrize(("key", "value"), BAD_ENTRIES)
async def test_session_set_refuses_and_nothing_is_written(
    store: Store, key: str, value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER, state={"kept": 1})
    session.set("good", 2)

    with pytest.raises(InvalidStateError) as raised:
        session.set(key, value)

    assert raised.value.key == key
    assert session.state == {"kept": 1, "good": 2}
    await manager.save(session)
    state, _ = await _snapshot(manager, session.id)
    assert state == {"kept": 1, "good": 2}


@pytest.mark.parametrize(("key", "value"), BAD_ENTRIES)
async def test_manager_create_refuses_and_nothing_is_written(
    store: Store, key: str, value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session_id = new_id()

    with pytest.raises(InvalidStateError) as raised:
        await manager.create(
            ORG, USER, id=session_id, state={"user:good": 1, "app:good": 2, key: value}
        )

    assert raised.value.key == key
    with pytest.raises(SessionNotFoundError):
        await manager.get(ORG, session_id)
    assert await manager.list(Filter(ORG)) == []
    assert await _shared_state_seen_by_a_new_session(manager) == {}


@pytest.mark.parametrize(("key", "value"), BAD_ENTRIES)
async def test_store_update_refuses_a_mutated_state_and_nothing_is_written(
    store: Store, key: str, value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER, state={"kept": 1})
    before = await _snapshot(manager, session.id)
    session.state["good"] = 2
    session.state["user:good"] = 3
    session.state[key] = value

    with pytest.raises(InvalidStateError) as raised:
        await store.update(session)

    assert raised.value.key == key
    assert await _snapshot(manager, session.id) == before
    assert await _shared_state_seen_by_a_new_session(manager) == {}


async def test_store_update_refuses_a_non_string_top_level_key(store: Store) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    before = await _snapshot(manager, session.id)
    session.state[1] = "one"  # type: ignore[index]

    with pytest.raises(InvalidStateError):
        await store.update(session)

    assert await _snapshot(manager, session.id) == before


@pytest.mark.parametrize("value", BAD_VALUES)
async def test_append_event_refuses_bad_content_and_nothing_is_written(
    store: Store, value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    before = await _snapshot(manager, session.id)

    with pytest.raises(InvalidStateError):
        await store.append_event(
            ORG, session.id, Event(author="user", content=value, state_delta={"good": 1})
        )

    assert await store.list_events(ORG, session.id) == []
    assert await _snapshot(manager, session.id) == before


@pytest.mark.parametrize(("key", "value"), BAD_ENTRIES)
async def test_append_event_refuses_a_bad_state_delta_and_nothing_is_written(
    store: Store, key: str, value: Any
) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    before = await _snapshot(manager, session.id)
    event = Event(author="user", content="hi", state_delta={"good": 1, "user:good": 2, key: value})

    with pytest.raises(InvalidStateError) as raised:
        await store.append_event(ORG, session.id, event)

    assert raised.value.key == key
    assert await store.list_events(ORG, session.id) == []
    assert await _snapshot(manager, session.id) == before
    assert (await manager.get(ORG, session.id)).message_count == 0
    assert await _shared_state_seen_by_a_new_session(manager) == {}


async def test_a_refused_session_can_still_be_saved_once_corrected(store: Store) -> None:
    manager = Manager(store, app_name=APP)
    session = await manager.create(ORG, USER)
    session.state["bad"] = math.nan
    with pytest.raises(InvalidStateError):
        await manager.save(session)

    session.set("bad", 0.5)
    await manager.save(session)

    assert (await manager.get(ORG, session.id)).state == {"bad": 0.5}


async def test_an_integer_too_long_for_json_is_refused_as_invalid_state(store: Store) -> None:
    # Python's json refuses integers over 4,300 digits; that must surface as InvalidStateError,
    # the error every other unstorable value raises, and write nothing.
    huge = 10**5000
    manager = Manager(store, app_name=APP)
    with pytest.raises(InvalidStateError):
        await manager.create(ORG, USER, state={"k": huge})
    assert await manager.list(Filter(ORG)) == []

    session = await manager.create(ORG, USER)
    session.state["k"] = huge
    with pytest.raises(InvalidStateError):
        await manager.save(session)
    assert (await manager.get(ORG, session.id)).state == {}


def test_session_set_stores_a_copy_of_the_value() -> None:
    session = Session(id=new_id(), org_id=ORG, user_id=USER)
    value = {"items": [1, 2]}
    session.set("k", value)
    value["items"].append(3)
    assert session.get("k") == {"items": [1, 2]}
