"""A store is a guest in its host's process: no operation touches Python's garbage collector.

Every store operation (reads of long transcripts and listings included, where building many
objects is what a collector tuning would be tempting for) leaves the collector's switch and
thresholds as the application set them, and never runs a collection.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from durable_sessions import Event, Filter, Session, Store
from support.collector import HOSTS, CollectorWatch, watched_collector


@pytest.fixture(params=list(HOSTS))
def collector(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CollectorWatch]:
    """The collector as one kind of host leaves it, watched; found as it was at the end."""
    with watched_collector(request.param, monkeypatch) as watch:
        yield watch


async def every_operation(store: Store) -> None:
    """Each operation of the ``Store`` protocol at least once, on a transcript long enough
    to make thousands of objects when read."""
    org = "o"
    made = await store.create(
        Session(org_id=org, id="s", app_name="a", user_id="u", state={"k": 1})
    )
    await store.append_event(org, "s", Event("user", content={"n": -1}))
    await store.append_events(
        org, "s", [Event("user", content={"n": n, "l": [n, {"x": None}]}) for n in range(500)]
    )
    await store.get(org, "s")
    await store.get_with_events(org, "s")
    await store.get_with_events(org, "s", limit=20)
    await store.get_with_events_json(org, "s")
    await store.list_events(org, "s")
    await store.list_event_contents(org, "s")
    got = await store.get(org, "s")
    got.state["k"] = 2
    await store.update(got)
    await store.touch(org, "s", messages=1)
    await store.fork(org, "s", new_session_id="child", with_events=True)
    for n in range(50):
        await store.create(Session(org_id=org, id=f"other-{n}", app_name="a", user_id="u"))
    await store.list(Filter(org, with_state=True))
    await store.list_states_json(Filter(org))
    await store.list_page(Filter(org, limit=10))
    await store.get_shared_state(org, "a", "u")
    await store.search(org, "hello")
    await store.pop_event(org, "child")
    await store.truncate_events(org, "child", after_seq=10)
    await store.delete(org, "child")
    await store.purge(org, older_than=timedelta(days=1))
    await store.delete_user(org, "u")
    assert made.id == "s"


async def test_no_store_operation_touches_the_garbage_collector(
    store: Store, collector: CollectorWatch
) -> None:
    await every_operation(store)
    assert collector.calls == []
