"""Session identity across delete and re-create, and deletes of shared keys by stale copies.

A copy of a session read before the session was deleted must never write into a later
session created under the same id (its version restarts at 1, so versions alone cannot tell
them apart): every write from it (save, touch, append) raises ``StaleSessionError`` and
writes nothing, on every store. And a copy that deletes a ``user:``/``app:`` key removes it
only while the key still holds the value this copy read; otherwise the save raises
``StaleSessionError`` and writes nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from durable_sessions import (
    Event,
    Filter,
    Manager,
    SessionNotFoundError,
    StaleSessionError,
    Store,
)
from reliability.figures import Figures


async def observe(store: Store, org: str, sid: str) -> dict[str, Any]:
    """What a reader sees of one session: metadata, merged state and transcript."""
    session = await store.get_with_events(org, sid)
    return {
        "user_id": session.user_id,
        "title": session.title,
        "state": session.state,
        "message_count": session.message_count,
        "token_total": session.token_total,
        "version": session.version,
        "events": [(e.seq, e.author, e.content) for e in session.events],
    }


async def test_an_old_copy_never_writes_into_a_recreated_id(
    store: Store, backend: str, figures: Figures
) -> None:
    alice = Manager(store, app_name="chat")
    old = await alice.create("org", "alice", id="main", state={"secret": "alice's"})
    old_twin = old.clone()
    other_twin = old.clone()
    await alice.delete("org", "main")
    bob = await alice.create("org", "bob", id="main", state={"mine": "bob's"})
    assert bob.version == old.version == 1  # the versions alone are the same
    before = await observe(store, "org", "main")
    user_before = (await alice.create("org", "alice", state={})).state

    old.set("secret", "overwritten")
    old.set("user:plan", "alice's plan")
    refused = 0
    with pytest.raises(StaleSessionError, match="deleted and created again"):
        await alice.save(old)
    refused += 1
    with pytest.raises(StaleSessionError, match="deleted and created again"):
        await alice.touch(old_twin, messages=5, tokens=7, first_message="hijack")
    refused += 1
    with pytest.raises(StaleSessionError, match="deleted and created again"):
        await alice.append_event(
            other_twin, Event("alice", {"text": "leak"}, state_delta={"user:k": 1})
        )
    refused += 1
    # The same through the store directly, with the incarnation the copy carries.
    with pytest.raises(StaleSessionError):
        await store.append_event("org", "main", Event("x"), incarnation=old.incarnation)
    refused += 1
    with pytest.raises(StaleSessionError):
        await store.touch("org", "main", messages=1, incarnation=old.incarnation)
    refused += 1

    after = await observe(store, "org", "main")
    assert after == before, "bob's session changed"
    assert (await alice.create("org", "alice", state={})).state == user_before
    assert (await alice.create("org", "bob", state={})).state == {}, "bob's user state"
    figures.record(
        "stale copy of a deleted id writes into its re-creation",
        backend,
        operations=refused,
        expected=1,
        found=int(after == before),
        errors=refused,
    )

    # A copy of the live incarnation still writes.
    fresh = await alice.get("org", "main")
    fresh.set("mine", "bob's too")
    await alice.save(fresh)
    await alice.touch(fresh, messages=1)
    await alice.append_event(fresh, Event("bob", {"text": "hi"}))
    assert (await alice.get("org", "main")).state["mine"] == "bob's too"


async def test_a_deleted_copy_writes_nothing_and_says_so(store: Store) -> None:
    manager = Manager(store)
    session = await manager.create("org", "u", id="gone")
    await manager.delete("org", "gone")
    session.set("k", 1)
    with pytest.raises(SessionNotFoundError):
        await manager.save(session)
    with pytest.raises(SessionNotFoundError):
        await manager.touch(session)
    with pytest.raises(SessionNotFoundError):
        await manager.append_event(session, Event("u"))
    assert await store.list(Filter(org_id="org")) == []


async def test_a_deleted_sessions_transcript_goes_with_it(store: Store, backend: str) -> None:
    """Its events go in the same delete: none is left in storage, none shows up under a new
    session of the same id, whose seqs start at 1; a fork of it keeps its own copy."""
    manager = Manager(store)
    session = await manager.create("org", "u", id="gone")
    for n in range(3):
        await manager.append_event(session, Event("u", {"text": f"old words {n}"}))
    kept = await manager.fork("org", "gone", with_events=True)
    await manager.delete("org", "gone")
    if backend != "memory":
        async with store.engine.connect() as conn:  # type: ignore[attr-defined]
            left = await conn.execute(
                text("SELECT count(*) FROM ds_events WHERE org_id = 'org' AND session_id = 'gone'")
            )
            assert left.scalar_one() == 0
            if backend == "sqlite":  # nor any entry of the search index (its triggers ran)
                indexed = await conn.execute(
                    text("SELECT count(*) FROM ds_events_fts_rowid WHERE session_id = 'gone'")
                )
                assert indexed.scalar_one() == 0
                await conn.execute(
                    text("INSERT INTO ds_events_fts (ds_events_fts) VALUES ('integrity-check')")
                )
    # Searched, its events are gone too; the fork's copies are still found.
    assert {hit.session_id for hit in await store.search("org", "old words")} == {kept.id}
    again = await manager.create("org", "u", id="gone")
    assert await store.list_events("org", "gone") == []
    stored = await manager.append_event(again, Event("u", {"text": "new"}))
    assert stored.seq == 1
    assert [e.content for e in await store.list_events("org", "gone")] == [{"text": "new"}]
    assert len(await store.list_events("org", kept.id)) == 3


async def test_forks_and_listed_copies_carry_their_incarnation(store: Store) -> None:
    manager = Manager(store)
    parent = await manager.create("org", "u", id="p")
    child = await manager.fork("org", "p")
    assert parent.incarnation
    assert child.incarnation
    assert parent.incarnation != child.incarnation
    listed = {s.id: s for s in await manager.list(Filter(org_id="org"))}
    assert listed["p"].incarnation == parent.incarnation
    assert (await manager.get("org", child.id)).incarnation == child.incarnation
    # A listed copy is as good as a read one for guarded writes.
    await manager.touch(listed["p"], messages=1)
    await manager.delete("org", "p")
    await manager.create("org", "u", id="p")
    with pytest.raises(StaleSessionError):
        await manager.touch(parent)


@pytest.mark.parametrize("scope", ["user:", "app:"])
async def test_a_stale_copy_cannot_delete_a_newer_shared_value(
    store: Store, backend: str, scope: str, figures: Figures
) -> None:
    manager = Manager(store, app_name="chat")
    reader = await manager.create("org", "u", id="a", state={f"{scope}plan": "free"})
    writer = await manager.create("org", "u", id="b")
    assert writer.state[f"{scope}plan"] == "free"
    writer.set(f"{scope}plan", "paid")
    await manager.save(writer)

    reader.delete(f"{scope}plan")
    reader.set("private", "from the stale copy")
    version = reader.version
    with pytest.raises(StaleSessionError, match=f"cannot delete '{scope}plan'"):
        await manager.save(reader)
    stored = await manager.get("org", "a")
    assert stored.state[f"{scope}plan"] == "paid"
    assert "private" not in stored.state, "the failed save wrote its private change"
    assert stored.version == version
    figures.record(
        f"stale copy deletes a newer {scope} value",
        backend,
        operations=1,
        expected=1,
        found=int(stored.state[f"{scope}plan"] == "paid"),
        errors=1,
    )

    # Reloaded, the copy holds what is stored and may delete it.
    fresh = await manager.get("org", "a")
    fresh.delete(f"{scope}plan")
    await manager.save(fresh)
    assert f"{scope}plan" not in (await manager.get("org", "b")).state

    # A key someone else already deleted is no conflict: the delete is done either way.
    again = await manager.create("org", "u", id="c", state={f"{scope}k": [1, {"x": 1.0}]})
    other = await manager.get("org", "b")
    other.delete(f"{scope}k")
    await manager.save(other)
    again.delete(f"{scope}k")
    await manager.save(again)
    assert f"{scope}k" not in (await manager.get("org", "c")).state


async def test_the_shared_delete_check_is_strict_about_json_types(store: Store) -> None:
    # 1, 1.0 and true are three values: a copy that read 1 may not delete a stored 1.0.
    manager = Manager(store)
    reader = await manager.create("org", "u", id="a", state={"user:n": 1})
    writer = await manager.get("org", "a")
    writer.set("user:n", 1.0)
    await manager.save(writer)
    reader.delete("user:n")
    reader.version = writer.version  # only the shared key is stale here
    with pytest.raises(StaleSessionError):
        await manager.save(reader)
    assert (await manager.get("org", "a")).state["user:n"] == 1.0


async def test_concurrent_shared_deletes_and_sets_leave_a_read_value(
    store: Store, backend: str
) -> None:
    # Many copies race: some set user:k to their own value, some delete the value they read.
    # Whatever the interleaving, a delete never removes a value it did not read.
    manager = Manager(store)
    await manager.create("org", "u", id="s0", state={"user:k": "v0"})
    sids = [f"s{i}" for i in range(1, 9)]
    for sid in sids:
        await manager.create("org", "u", id=sid)
    copies = [await manager.get("org", sid) for sid in sids]
    results: list[str] = []

    async def act(i: int, copy: Any) -> None:
        if i % 2:
            copy.set("user:k", f"v{i}")
        else:
            copy.delete("user:k")
        try:
            await manager.save(copy)
            results.append("set" if i % 2 else "deleted")
        except StaleSessionError:
            results.append("refused")

    await asyncio.gather(*(act(i, c) for i, c in enumerate(copies)))
    final = (await manager.get("org", "s0")).state.get("user:k")
    assert results.count("set") == 4, results  # sets are last-writer-wins, never refused
    # A delete succeeds only while the key holds v0 (what every deleting copy read) or is
    # gone. Had a delete landed after any set, it would have removed a value it never read;
    # so, with four sets done, the value left is one of theirs, whatever the interleaving.
    assert final in {"v1", "v3", "v5", "v7"}, (final, results)
