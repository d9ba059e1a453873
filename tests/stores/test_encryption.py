"""Encryption at rest, on every store: what the stored bytes hold, and what a copy tells."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    DecryptionError,
    Event,
    InMemoryStore,
    InvalidArgumentError,
    Memory,
    Session,
    SessionNotFoundError,
    SQLStore,
    Store,
    sealing,
)
from durable_sessions.crypto import LocalKeyring
from durable_sessions.sealing import Sealer
from support.sql import MYSQL, SQL_BACKENDS
from support.vaults import open_vault

SECRETS = [
    "zanzibar",
    "quokkahat",
    "marzipanic",
    "umbrellic",
    "tangerinox",
    "vortexal",
    "gloxinian",
]
"""Words that occur nowhere else: each is looked for in the stored bytes."""

ORG = "org"


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.memory), *SQL_BACKENDS, MYSQL])
async def vault(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An encrypted store of each kind, with its keyring at ``tmp_path / 'keys.json'``."""
    async for made in open_vault(request, tmp_path):
        yield made


@pytest.fixture(params=[*SQL_BACKENDS, MYSQL])
async def sql_vault(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An encrypted SQL store of each kind (a database outlives a store without a keyring)."""
    async for made in open_vault(request, tmp_path):
        yield made


async def _fill(store: Store, user: str, word: str, session_id: str) -> Session:
    session = Session(
        id=session_id,
        org_id=ORG,
        user_id=user,
        app_name="app",
        title=f"title {word}",
        state={"private": f"p {word}", "user:pref": f"u {word}", "app:motd": f"a {word}"},
    )
    await store.create(session)
    event = Event(
        author="user", content={"text": f"hello {word} again"}, state_delta={"k": f"d {word}"}
    )
    await store.append_event(ORG, session_id, event)
    return session


async def test_nothing_users_said_is_stored_in_clear(vault: Any) -> None:
    store = vault.store
    await _fill(store, "alice", SECRETS[0], "s1")
    session = await store.get_with_events(ORG, "s1")
    assert session.title == f"title {SECRETS[0]}"
    assert session.state == {
        "private": f"p {SECRETS[0]}", "user:pref": f"u {SECRETS[0]}", "app:motd": f"a {SECRETS[0]}",
        "k": f"d {SECRETS[0]}",
    }  # fmt: skip
    assert session.events[0].content == {"text": f"hello {SECRETS[0]} again"}
    assert session.events[0].state_delta == {"k": f"d {SECRETS[0]}"}
    [hit] = await store.search(ORG, SECRETS[0].upper())  # the blind index: whole words
    assert hit.session_id == "s1"
    assert hit.event.content == {"text": f"hello {SECRETS[0]} again"}
    assert await store.search(ORG, SECRETS[0][:-1]) == []
    raw = await vault.raw()
    assert SECRETS[0].encode() not in raw
    assert b"hello" not in raw
    assert b"again" not in raw


async def test_a_value_moved_to_another_row_does_not_decrypt(vault: Any) -> None:
    store = vault.store
    await _fill(store, "alice", SECRETS[0], "s1")
    await _fill(store, "alice", SECRETS[1], "s2")
    # Read first: what the store keeps of what it read does not hide a change in the rows.
    await store.get_with_events(ORG, "s2")
    await vault.move_private_value(ORG, "s1", "s2", "private")
    with pytest.raises(DecryptionError):
        await store.get(ORG, "s2")
    await vault.move_content(ORG, "s1", "s2")
    with pytest.raises(DecryptionError):
        await store.list_events(ORG, "s2")
    assert (await store.get(ORG, "s1")).state["private"] == f"p {SECRETS[0]}"


async def test_another_keyring_gets_a_decryption_error_not_garbage(
    vault: Any, tmp_path: Path
) -> None:
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    stolen = await vault.snapshot()
    other = await vault.reopen(stolen, LocalKeyring(tmp_path / "other.json"))
    with pytest.raises(DecryptionError):
        await other.get(ORG, "s1")
    with pytest.raises(DecryptionError):
        await other.list_events(ORG, "s1")
    same = await vault.reopen(stolen, LocalKeyring(tmp_path / "keys.json"))
    assert (await same.get(ORG, "s1")).title == f"title {SECRETS[0]}"


async def test_delete_user_shreds_the_user_in_copies_taken_before(
    vault: Any, tmp_path: Path
) -> None:
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    await _fill(vault.store, "bob", SECRETS[1], "s2")
    backup = await vault.snapshot()
    assert await vault.store.delete_user(ORG, "alice") == 1
    restored = await vault.reopen(backup, LocalKeyring(tmp_path / "keys.json"))
    with pytest.raises(DecryptionError):
        await restored.get(ORG, "s1")
    with pytest.raises(DecryptionError):
        await restored.list_events(ORG, "s1")
    bob = await restored.get_with_events(ORG, "s2")
    assert bob.state["private"] == f"p {SECRETS[1]}"
    assert bob.events[0].content == {"text": f"hello {SECRETS[1]} again"}
    # The live store goes on: alice may come back, under a new key.
    await _fill(vault.store, "alice", SECRETS[2], "s3")
    assert (await vault.store.get(ORG, "s3")).state["user:pref"] == f"u {SECRETS[2]}"


async def test_an_erasure_cancelled_while_it_destroys_the_keys_still_destroys_them(
    vault: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delete_user`` cancelled once the keyring has forgotten the user's secret, while the
    key table's rows go, finishes destroying them: the user can come back, through this
    store and any other, under a new key that every store opens (not under the old key,
    whose secret is gone, nor refused for it)."""
    store = vault.store
    await _fill(store, "alice", SECRETS[0], "s1")
    await _fill(store, "bob", SECRETS[1], "s2")
    table = store._env.sealer.table
    drop = table.drop
    reached, go = asyncio.Event(), asyncio.Event()

    async def held_drop(*args: Any) -> None:
        reached.set()
        await go.wait()
        await drop(*args)

    monkeypatch.setattr(table, "drop", held_drop)
    erasing = asyncio.ensure_future(store.delete_user(ORG, "alice"))
    await reached.wait()
    erasing.cancel()
    await asyncio.sleep(0)
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await erasing
    monkeypatch.undo()
    with pytest.raises(SessionNotFoundError):
        await store.get(ORG, "s1")
    await _fill(store, "alice", SECRETS[2], "s3")  # alice is back, through this store
    other = await vault.another(LocalKeyring(tmp_path / "keys.json"))
    await _fill(other, "alice", SECRETS[3], "s4")  # and through another
    for reader in (store, other, await vault.another(LocalKeyring(tmp_path / "keys.json"))):
        for sid, word in (("s2", SECRETS[1]), ("s3", SECRETS[2]), ("s4", SECRETS[3])):
            session = await reader.get_with_events(ORG, sid)
            assert session.title == f"title {word}"
            assert session.events[0].content == {"text": f"hello {word} again"}


class Clock:
    """``sealing``'s clock, moved on by hand: what a store keeps ages without waiting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = sealing._clock
        monkeypatch.setattr(sealing, "_clock", lambda: real() + self.offset)

    def after(self, seconds: float) -> None:
        self.offset += seconds + 1.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


async def test_what_is_written_for_a_user_while_their_keys_are_destroyed_is_erased_too(
    vault: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session or memory written for the user after delete_user deleted their rows, but
    # before it destroyed their keys, is sealed with those keys: it is erased as well, not
    # left behind unreadable.
    store = vault.store
    await _fill(store, "alice", SECRETS[0], "s1")
    await _fill(store, "bob", SECRETS[1], "s2")
    sealer = store._env.sealer
    destroy = sealer.forget

    async def written_meanwhile(org_id: str, kind: str, owner: str) -> None:
        await _fill(store, "alice", SECRETS[2], "late")
        await store.add_memories(ORG, "app", "alice", [Memory(f"likes {SECRETS[2]}")])
        await destroy(org_id, kind, owner)

    monkeypatch.setattr(sealer, "forget", written_meanwhile)
    assert await store.delete_user(ORG, "alice") == 2
    for sid in ("s1", "late"):
        with pytest.raises(SessionNotFoundError):
            await store.get(ORG, sid)
    assert await store.count_user_memories(ORG, "alice") == 0
    assert (await store.get(ORG, "s2")).state["private"] == f"p {SECRETS[1]}"
    monkeypatch.undo()
    await _fill(store, "alice", SECRETS[3], "s3")  # alice may come back, under a new key
    assert (await store.get(ORG, "s3")).title == f"title {SECRETS[3]}"


async def test_a_user_erased_by_another_process_is_written_under_new_keys(
    vault: Any, tmp_path: Path
) -> None:
    """One process erases a user whose data key other processes hold; when the user comes
    back, what those write for them (an event, a batch of events, a title or a save to a
    session made elsewhere since, a session of their own, a fork, a memory) is sealed under
    keys in the key table, which every process opens, never under the destroyed one."""
    await _fill(vault.store, "alice", SECRETS[0], "s1")

    async def holding_alices_key() -> Store:
        store: Store = await vault.another(LocalKeyring(tmp_path / "keys.json"))
        session = await store.get(ORG, "s1")
        session.set("seen", True)
        await store.update(session)  # sealed with alice's key, which it keeps
        return store

    holders = [await holding_alices_key() for _ in range(7)]
    appender, saver, maker, memorizer, forker, batcher, titler = holders
    eraser = await vault.another(LocalKeyring(tmp_path / "keys.json"))
    assert await eraser.delete_user(ORG, "alice") == 1
    await _fill(eraser, "alice", SECRETS[1], "s2")  # alice is back, through the eraser
    for sid in ("s4", "s6", "s7"):
        await eraser.create(Session(id=sid, org_id=ORG, user_id="alice", app_name="app"))
    await appender.append_event(ORG, "s2", Event("user", {"text": f"more {SECRETS[1]}"}))
    saved = await saver.get(ORG, "s4")
    saved.set("note", f"n {SECRETS[4]}")
    await saver.update(saved)
    await _fill(maker, "alice", SECRETS[2], "s3")
    await memorizer.add_memories(ORG, "app", "alice", [Memory(f"likes {SECRETS[3]}")])
    await forker.fork(ORG, "s2", new_session_id="s5", with_events=True)
    batch = [Event("user", {"text": f"batch {SECRETS[5]}"}, state_delta={"b": SECRETS[5]})]
    await batcher.append_events(ORG, "s6", batch, title=f"t {SECRETS[5]}")
    await titler.touch(ORG, "s7", messages=1, title=f"t {SECRETS[6]}")
    fresh = await vault.another(LocalKeyring(tmp_path / "keys.json"))  # e.g. after a restart
    for sid, word in (("s2", SECRETS[1]), ("s3", SECRETS[2]), ("s5", SECRETS[1])):
        session = await fresh.get_with_events(ORG, sid)
        assert session.title == f"title {word}"
        assert session.state["private"] == f"p {word}"
        assert session.state["user:pref"] == f"u {SECRETS[2]}"  # alice's, written last
        assert session.events[0].content == {"text": f"hello {word} again"}
    assert (await fresh.list_events(ORG, "s2"))[1].content == {"text": f"more {SECRETS[1]}"}
    hits = await fresh.search(ORG, SECRETS[1], limit=10)
    assert sorted(hit.session_id for hit in hits) == ["s2", "s2", "s5", "s5"]
    assert (await fresh.get(ORG, "s4")).state["note"] == f"n {SECRETS[4]}"
    batched = await fresh.get_with_events(ORG, "s6")
    assert (batched.title, batched.state["b"]) == (f"t {SECRETS[5]}", SECRETS[5])
    assert batched.events[0].content == {"text": f"batch {SECRETS[5]}"}
    assert (await fresh.get(ORG, "s7")).title == f"t {SECRETS[6]}"
    [memory] = await fresh.search_memories(ORG, "app", "alice", SECRETS[3])
    assert memory.text == f"likes {SECRETS[3]}"


async def test_a_write_to_an_id_made_again_for_another_user_seals_with_that_users_key(
    vault: Any, tmp_path: Path
) -> None:
    """A process that wrote to a session of alice's writes, without an incarnation, to that
    id after another process deleted it and made it again for bob: what it writes is sealed
    with bob's key, so erasing alice later leaves bob's session whole."""
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    for sid in ("s2", "s3", "s4"):
        await vault.store.create(Session(id=sid, org_id=ORG, user_id="alice", app_name="app"))
    writer = await vault.another(LocalKeyring(tmp_path / "keys.json"))
    for sid in ("s1", "s2", "s3", "s4"):
        await writer.append_event(ORG, sid, Event("user", {"text": "first"}))  # alice's key
    other = await vault.another(LocalKeyring(tmp_path / "keys.json"))
    for sid in ("s1", "s2", "s3", "s4"):
        await other.delete(ORG, sid)
        await other.create(Session(id=sid, org_id=ORG, user_id="bob", app_name="app"))
    await writer.append_event(ORG, "s1", Event("user", {"text": f"bob {SECRETS[1]}"}))
    batch = [Event("user", {"text": f"bob {SECRETS[2]}"}, state_delta={"b": SECRETS[2]})]
    await writer.append_events(ORG, "s2", batch, title=f"t {SECRETS[2]}")
    await writer.touch(ORG, "s3", messages=1, title=f"t {SECRETS[3]}")
    saved = await writer.get(ORG, "s4")
    saved.set("note", SECRETS[4])
    await writer.update(saved)
    assert await other.delete_user(ORG, "alice") == 0
    fresh = await vault.another(LocalKeyring(tmp_path / "keys.json"))
    assert (await fresh.list_events(ORG, "s1"))[0].content == {"text": f"bob {SECRETS[1]}"}
    two = await fresh.get_with_events(ORG, "s2")
    assert (two.title, two.state["b"]) == (f"t {SECRETS[2]}", SECRETS[2])
    assert two.events[0].content == {"text": f"bob {SECRETS[2]}"}
    assert (await fresh.get(ORG, "s3")).title == f"t {SECRETS[3]}"
    assert (await fresh.get(ORG, "s4")).state["note"] == SECRETS[4]


async def test_an_erasure_by_another_process_reaches_what_this_one_keeps(
    vault: Any, tmp_path: Path, clock: Clock
) -> None:
    """A process that read a user before another process erased them opens that user's
    rows in an earlier copy no more, once ``Sealer.KEEP_SECONDS`` have passed: the keys it
    unwrapped and the values it opened are dropped, and the keyring unwraps no key of the
    user's again."""
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    await _fill(vault.store, "bob", SECRETS[1], "s2")
    backup = await vault.snapshot()
    reader = await vault.reopen(backup, LocalKeyring(tmp_path / "keys.json"))
    for sid in ("s1", "s2"):  # its keys unwrapped, its values opened and kept
        assert (await reader.get_with_events(ORG, sid)).events
    assert await vault.store.delete_user(ORG, "alice") == 1
    clock.after(Sealer.KEEP_SECONDS)
    with pytest.raises(DecryptionError):
        await reader.get(ORG, "s1")
    with pytest.raises(DecryptionError):
        await reader.list_events(ORG, "s1")
    bob = await reader.get_with_events(ORG, "s2")
    assert bob.events[0].content == {"text": f"hello {SECRETS[1]} again"}


async def test_rotation_then_removing_the_old_master_key_still_reads_everything(
    vault: Any, tmp_path: Path
) -> None:
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    await _fill(vault.store, "bob", SECRETS[1], "s2")
    keyring = vault.store.keyring
    old = keyring.current_master()
    keyring.rotate()
    assert await vault.store.rotate_keys() >= 4  # alice's, bob's, the app's, the index's
    assert await vault.store.rotate_keys() == 0
    keyring.remove(old)
    restored = await vault.reopen(await vault.snapshot(), LocalKeyring(tmp_path / "keys.json"))
    for user, word, sid in (("alice", SECRETS[0], "s1"), ("bob", SECRETS[1], "s2")):
        session = await restored.get_with_events(ORG, sid)
        assert session.state["private"] == f"p {word}"
        assert session.events[0].content == {"text": f"hello {word} again"}
        assert [h.session_id for h in await restored.search(ORG, word)] == [sid]
        assert (await restored.get_shared_state(ORG, "app", user))["user:pref"] == f"u {word}"


async def test_reencrypt_moves_every_row_to_new_keys_and_can_run_again(vault: Any) -> None:
    await _fill(vault.store, "alice", SECRETS[0], "s1")
    await vault.store.add_memories(ORG, "app", "alice", [Memory(f"likes {SECRETS[1]}")])
    before = await vault.raw()
    # a session row, an event, a user: value, an app: value and a memory
    assert await vault.store.reencrypt() == 5
    assert await vault.store.reencrypt(new_keys=False) == 0  # a second run finds nothing to do
    assert await vault.raw() != before
    session = await vault.store.get_with_events(ORG, "s1")
    assert session.title == f"title {SECRETS[0]}"
    assert session.state["app:motd"] == f"a {SECRETS[0]}"
    assert session.events[0].state_delta == {"k": f"d {SECRETS[0]}"}
    assert [h.session_id for h in await vault.store.search(ORG, SECRETS[0])] == ["s1"]
    [memory] = await vault.store.search_memories(ORG, "app", "alice", SECRETS[1])
    assert memory.text == f"likes {SECRETS[1]}"


async def test_reencrypt_encrypts_what_was_written_without_a_keyring(sql_vault: Any) -> None:
    plain = SQLStore(sql_vault.engine)
    await _fill(plain, "alice", SECRETS[3], "s1")
    await plain.add_memories(ORG, "app", "alice", [Memory(f"likes {SECRETS[5]}")])
    assert SECRETS[3].encode() in await sql_vault.raw()
    store = sql_vault.store  # the same database, with a keyring: reads what is there
    assert (await store.get(ORG, "s1")).state["user:pref"] == f"u {SECRETS[3]}"
    assert await store.reencrypt(new_keys=False) == 5
    await plain.close()
    raw = await sql_vault.raw()
    assert SECRETS[3].encode() not in raw
    session = await store.get_with_events(ORG, "s1")
    assert session.events[0].content == {"text": f"hello {SECRETS[3]} again"}
    assert [h.session_id for h in await store.search(ORG, SECRETS[3])] == ["s1"]
    [memory] = await store.search_memories(ORG, "app", "alice", SECRETS[5])
    assert memory.text == f"likes {SECRETS[5]}"
    assert SECRETS[5].encode() not in raw


async def test_reencrypt_names_the_row_of_a_value_it_cannot_open(sql_vault: Any) -> None:
    # Written without a keyring, a string that begins like a sealed value cannot be told
    # from one (the guide says so): reencrypt stops at it and names its row, so that it can
    # be found and corrected; then it runs to its end.
    plain = SQLStore(sql_vault.engine)
    await _fill(plain, "alice", SECRETS[3], "s1")
    await plain.create(
        Session(id="s2", org_id=ORG, user_id="mallory", app_name="app", state={"p": "dse1:k:A"})
    )
    store = sql_vault.store
    with pytest.raises(DecryptionError, match=r"the sessions row \('org', 's2'\)") as raised:
        await store.reencrypt(new_keys=False)
    assert "a string written without a keyring that begins like a sealed value" in str(raised.value)
    with pytest.raises(DecryptionError, match="begins like a sealed value"):
        await store.get(ORG, "s2")  # a read says so too

    found = await plain.get(ORG, "s2")
    found.set("p", "corrected")
    await plain.update(found)
    await store.reencrypt(new_keys=False)
    assert (await store.get(ORG, "s2")).state["p"] == "corrected"
    assert SECRETS[3].encode() not in await sql_vault.raw()
    await plain.close()


async def test_reencrypt_rewrites_events_sealed_value_by_value(sql_vault: Any) -> None:
    # An event stored in format 1 (content and each delta value sealed apart) reads as it
    # was written; reencrypt rewrites it as one sealed value, and finds nothing the next time.
    from sqlalchemy import select, update

    from durable_sessions.sealing import EVENT_PREFIX, row_aad
    from durable_sessions.sql.schema import events

    store = sql_vault.store
    await _fill(store, "alice", SECRETS[4], "s1")
    assert store._env is not None
    key = await store._env.user_key(ORG, "alice")
    [stored] = await store.list_events(ORG, "s1")
    content = key.seal(stored.content, row_aad("content", ORG, "s1", stored.id))
    delta = {"k": key.seal(f"d {SECRETS[4]}", row_aad("delta", ORG, "s1", stored.id, "k"))}
    where = (events.c.org_id == ORG, events.c.session_id == "s1", events.c.seq == 1)
    async with sql_vault.engine.begin() as conn:
        await conn.execute(update(events).where(*where).values(content=content, state_delta=delta))
    [read] = await store.list_events(ORG, "s1")
    assert (read.content, read.state_delta) == (stored.content, stored.state_delta)
    assert await store.reencrypt(new_keys=False) == 1
    assert await store.reencrypt(new_keys=False) == 0
    async with sql_vault.engine.connect() as conn:
        row = (
            await conn.execute(select(events.c.content, events.c.state_delta).where(*where))
        ).one()
    assert row.content.startswith(f"{EVENT_PREFIX}{key.key_id}:")
    assert row.state_delta == {}
    [again] = await store.list_events(ORG, "s1")
    assert (again.content, again.state_delta) == (stored.content, stored.state_delta)
    assert [h.session_id for h in await store.search(ORG, SECRETS[4])] == ["s1"]


async def test_key_operations_need_a_keyring() -> None:
    for operation in (InMemoryStore().rotate_keys(), InMemoryStore().reencrypt()):
        with pytest.raises(InvalidArgumentError, match="needs a store with a keyring"):
            await operation


async def test_a_keyring_is_refused_in_distributed_mode(tmp_path: Path) -> None:
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    with pytest.raises(InvalidArgumentError, match="distributed mode"):
        SQLStore(engine, distributed=True, keyring=LocalKeyring(tmp_path / "k.json"))
    await engine.dispose()


async def test_long_term_memories_are_sealed_searched_blind_and_shredded(
    vault: Any, tmp_path: Path
) -> None:
    store = vault.store
    word = SECRETS[4]
    [added] = await store.add_memories(
        ORG, "app", "alice", [Memory(f"alice likes {word}", metadata={"why": f"said {word}"})]
    )
    assert added.text == f"alice likes {word}"
    [found] = await store.search_memories(ORG, "app", "alice", word)
    assert (found.text, found.metadata) == (f"alice likes {word}", {"why": f"said {word}"})
    assert word.encode() not in await vault.raw()
    backup = await vault.snapshot()
    await store.delete_user(ORG, "alice")
    restored = await vault.reopen(backup, LocalKeyring(tmp_path / "keys.json"))
    with pytest.raises(DecryptionError):
        await restored.search_memories(ORG, "app", "alice", word)
