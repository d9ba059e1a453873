"""The keyring and the envelope: what a keyring file holds, wraps, rotates and forgets."""

from __future__ import annotations

import asyncio
import copy
import errno
import fcntl
import os
import stat
import threading
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from durable_sessions import DecryptionError, Event, InvalidArgumentError, StoreError
from durable_sessions.crypto import Keyring, LocalKeyring
from durable_sessions.jsoncodec import from_json, to_json
from durable_sessions.sealing import (
    EVENT_PREFIX,
    INDEX,
    USER,
    DataKey,
    Envelope,
    MemoryKeyTable,
    OpenedValues,
    Sealer,
    row_aad,
)

KEY = bytes(range(32))


def test_a_keyring_file_is_created_private_with_one_master_key(tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    assert isinstance(keyring, Keyring)
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json").st_mode) == 0o600
    assert keyring.master_ids() == [keyring.current_master()]


async def test_a_wrapped_key_unwraps_through_the_same_file_only(tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    master_id, wrapped = await keyring.wrap("scope", KEY)
    assert KEY not in wrapped
    again = LocalKeyring(tmp_path / "keys.json")
    assert await again.unwrap("scope", master_id, wrapped) == KEY
    other = LocalKeyring(tmp_path / "other.json")
    with pytest.raises(DecryptionError):
        await other.unwrap("scope", master_id, wrapped)
    with pytest.raises(DecryptionError):  # another scope's key does not unwrap as this one's
        await keyring.unwrap("another", master_id, wrapped)


async def test_a_scope_added_by_another_process_is_read_from_the_file(tmp_path: Path) -> None:
    first = LocalKeyring(tmp_path / "keys.json")
    second = LocalKeyring(tmp_path / "keys.json")
    master_id, wrapped = await second.wrap("scope", KEY)
    assert await first.unwrap("scope", master_id, wrapped) == KEY
    await first.wrap("other", KEY)  # a rewrite by one keeps the other's scope
    assert await LocalKeyring(tmp_path / "keys.json").unwrap("scope", master_id, wrapped) == KEY


async def test_rotation_keeps_old_keys_readable_until_the_old_master_is_removed(
    tmp_path: Path,
) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    old = keyring.current_master()
    old_id, old_wrapped = await keyring.wrap("scope", KEY)
    new = keyring.rotate()
    assert new != old
    assert keyring.current_master() == new
    assert keyring.master_ids() == [old, new]
    assert await keyring.unwrap("scope", old_id, old_wrapped) == KEY
    new_id, new_wrapped = await keyring.wrap("scope", KEY)
    assert new_id == new
    with pytest.raises(InvalidArgumentError):
        keyring.remove(new)
    keyring.remove(old)
    reopened = LocalKeyring(tmp_path / "keys.json")
    assert await reopened.unwrap("scope", new_id, new_wrapped) == KEY
    with pytest.raises(DecryptionError, match="not in this keyring"):
        await reopened.unwrap("scope", old_id, old_wrapped)


async def test_forgetting_a_scope_leaves_the_others_readable(tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    gone = await keyring.wrap("gone", KEY)
    kept = await keyring.wrap("kept", KEY)
    await keyring.forget("gone")
    await keyring.forget("gone")  # twice is no error
    for each in (keyring, LocalKeyring(tmp_path / "keys.json")):
        with pytest.raises(DecryptionError):
            await each.unwrap("gone", *gone)
        assert await each.unwrap("kept", *kept) == KEY


async def test_what_another_process_forgot_or_removed_no_longer_unwraps(tmp_path: Path) -> None:
    """An erasure reaches every process that shares the keyring file: one that read a scope's
    secret (or a master key) before another process forgot it (or removed it) refuses it
    too, so that a copy of the database made earlier stays unreadable there as well."""
    first, second = LocalKeyring(tmp_path / "keys.json"), LocalKeyring(tmp_path / "keys.json")
    gone, kept = await first.wrap("gone", KEY), await first.wrap("kept", KEY)
    assert await second.unwrap("gone", *gone) == KEY  # read while it was there
    await first.forget("gone")
    with pytest.raises(DecryptionError, match="erased"):
        await second.unwrap("gone", *gone)
    assert await second.unwrap("kept", *kept) == KEY
    old = first.current_master()
    first.rotate()
    first.remove(old)
    with pytest.raises(DecryptionError, match="not in this keyring"):
        await second.unwrap("kept", *kept)


async def test_a_change_the_file_did_not_take_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the keyring file that fails (a full disk) leaves the keyring as the file
    holds it: a scope's new secret is not used for a key the file cannot unwrap later, a
    forgotten scope still unwraps, a master key is neither added nor removed."""
    keyring = LocalKeyring(tmp_path / "keys.json")
    kept = await keyring.wrap("kept", KEY)
    old = keyring.current_master()
    keyring.rotate()

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        await keyring.wrap("new", KEY)
    with pytest.raises(OSError, match="No space"):
        await keyring.forget("kept")
    with pytest.raises(OSError, match="No space"):
        keyring.rotate()
    with pytest.raises(OSError, match="No space"):
        keyring.remove(old)
    monkeypatch.undo()
    assert len(keyring.master_ids()) == 2
    assert await keyring.unwrap("kept", *kept) == KEY
    new = await keyring.wrap("new", KEY)  # its secret written to the file this time
    assert await LocalKeyring(tmp_path / "keys.json").unwrap("new", *new) == KEY
    assert sorted(os.listdir(tmp_path)) == ["keys.json", "keys.json.lock"]  # no temporary file


@pytest.mark.parametrize("step", ["wrap a new scope", "forget", "unwrap a scope added since"])
async def test_the_event_loop_runs_on_while_the_keyring_file_is_locked(
    tmp_path: Path, step: str
) -> None:
    """The file work waits for the file's lock (held here as another process holds it while
    it writes) in a worker thread: the service's other tasks run meanwhile, and the step
    ends once the lock is free."""
    keyring = LocalKeyring(tmp_path / "keys.json")
    kept = await keyring.wrap("kept", KEY)
    added = await LocalKeyring(tmp_path / "keys.json").wrap("added", KEY)
    steps = {
        "wrap a new scope": lambda: keyring.wrap("new", KEY),
        "forget": lambda: keyring.forget("kept"),
        "unwrap a scope added since": lambda: keyring.unwrap("added", *added),
    }
    fd = os.open(f"{tmp_path / 'keys.json'}.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    loop_ran = threading.Event()

    def unlock() -> None:
        # Once the loop ran while the step waited; or, should the step hold the loop
        # itself, after a while, so that the test fails instead of hanging.
        loop_ran.wait(timeout=10)
        os.close(fd)

    unlocker = threading.Thread(target=unlock)
    unlocker.start()
    try:
        task = asyncio.create_task(steps[step]())
        for _ in range(3):
            await asyncio.sleep(0)
        waiting = not task.done()
        loop_ran.set()
        result = await task
    finally:
        loop_ran.set()
        unlocker.join()
    assert waiting, "the step held the event loop while it waited for the keyring's lock"
    if step == "forget":
        with pytest.raises(DecryptionError, match="erased"):
            await LocalKeyring(tmp_path / "keys.json").unwrap("kept", *kept)
    elif step == "unwrap a scope added since":
        assert result == KEY
    else:
        assert await LocalKeyring(tmp_path / "keys.json").unwrap("new", *result) == KEY


def test_a_path_that_is_not_a_keyring_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a regular file"):
        LocalKeyring(tmp_path)
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(InvalidArgumentError, match="not a durable-sessions keyring"):
        LocalKeyring(tmp_path / "other.json")
    assert (tmp_path / "other.json").read_text() == '{"a": 1}'


def test_a_keyring_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    LocalKeyring(tmp_path / "real.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    LocalKeyring(tmp_path / "link.json").rotate()
    assert (tmp_path / "link.json").is_symlink()
    assert len(LocalKeyring(tmp_path / "real.json").master_ids()) == 2


def test_decryption_error_is_a_store_error() -> None:
    assert issubclass(DecryptionError, StoreError)


def test_a_sealed_value_opens_only_in_its_own_row() -> None:
    key = DataKey("k1", USER, "u", KEY)
    here, there = row_aad("state", "org", "s1", "k"), row_aad("state", "org", "s2", "k")
    sealed = key.seal({"secret": "hunter2"}, here)
    assert "hunter2" not in sealed
    assert sealed.startswith("dse1:k1:")
    assert key.open(sealed, here) == {"secret": "hunter2"}
    assert key.seal({"secret": "hunter2"}, here) == sealed  # the same value, the same text
    with pytest.raises(DecryptionError, match="moved from another row"):
        key.open(sealed, there)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(DecryptionError):
        key.open(tampered, here)
    with pytest.raises(DecryptionError):
        DataKey("k1", USER, "u", bytes(32)).open(sealed, here)


def test_a_kept_value_still_opens_only_in_its_own_row() -> None:
    # With a store's OpenedValues, what was sealed or opened once is kept: the row binding,
    # the tamper check and the key check hold as without it.
    opened = OpenedValues()
    key = DataKey("k1", USER, "u", KEY, opened)
    here, there = row_aad("state", "org", "s1", "k"), row_aad("state", "org", "s2", "k")
    sealed = key.seal({"secret": ["hunter2"]}, here)
    assert len(opened) == 1
    assert key.seal({"secret": ["hunter2"]}, here) == sealed  # kept
    assert key.seal({"secret": ["hunter2"]}, there) != sealed
    assert DataKey("k1", USER, "u", bytes(32), opened).seal({"secret": ["hunter2"]}, here) != sealed
    first = key.open(sealed, here)
    assert first == {"secret": ["hunter2"]}
    first["secret"].append("changed by the reader")  # each reader gets its own copy
    assert key.open(sealed, here) == {"secret": ["hunter2"]}
    with pytest.raises(DecryptionError, match="moved from another row"):
        key.open(sealed, there)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(DecryptionError):
        key.open(tampered, here)
    with pytest.raises(DecryptionError):  # same key id, other key material, same kept values
        DataKey("k1", USER, "u", bytes(32), opened).open(sealed, here)


def test_kept_values_are_bounded() -> None:
    opened = OpenedValues()
    key = DataKey("k1", USER, "u", KEY, opened)
    aad = row_aad("state", "org", "s1", "k")
    key.seal("x" * OpenedValues.KEEP_VALUE_CHARS, aad)  # its JSON text is 2 longer
    assert len(opened) == 0
    big = "y" * (OpenedValues.KEEP_VALUE_CHARS - 2)
    count = OpenedValues.KEEP_CHARS // (2 * OpenedValues.KEEP_VALUE_CHARS) + 2
    for n in range(count):
        key.seal(big, row_aad("state", "org", "s1", str(n)))
    assert 0 < len(opened) < count  # dropped when full, then kept again
    opened.clear()
    for n in range(OpenedValues.KEEP_VALUES + 1):
        key.seal(n, aad)
    assert len(opened) == 1  # as many small values as it keeps, then one more


def _stored(event: Event, **changes: object) -> Event:
    """A sealed event as read back from a database: a plain Event of fresh values."""
    fields = {
        "content": event.content, "state_delta": dict(event.state_delta), "id": event.id,
    } | changes  # fmt: skip
    return Event("user", fields["content"], state_delta=fields["state_delta"], id=fields["id"])


async def test_an_event_sealed_value_by_value_still_opens(tmp_path: Path) -> None:
    # Events written sealed value by value (content and each delta value alone) open as
    # before, beside events sealed whole, and each value still only in its own row.
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    old = Event("user", None, state_delta={}, id="e1")
    old.content = key.seal({"text": "old"}, row_aad("content", "org", "s1", "e1"))
    old.state_delta = {"a": key.seal([1], row_aad("delta", "org", "s1", "e1", "a"))}
    new = env.seal_event(key, "org", "s1", Event("user", {"text": "new"}, state_delta={"b": 2}))
    plain = Event("user", {"text": "plain"}, state_delta={"c": 3})
    opened = await env.open_events("org", "s1", [_stored(old), _stored(new), _stored(plain)])
    assert [(e.content, e.state_delta) for e in opened] == [
        ({"text": "old"}, {"a": [1]}), ({"text": "new"}, {"b": 2}), ({"text": "plain"}, {"c": 3}),
    ]  # fmt: skip
    moved = {"a": old.state_delta["a"]}
    with pytest.raises(DecryptionError):  # a delta value moved to another event
        await env.open_events(
            "org", "s1", [_stored(new, content=old.content, id="e2", state_delta=moved)]
        )
    assert await env.open_event_values("org", "s1", "e1", old.content, old.state_delta) == (
        {"text": "old"}, {"a": [1]},
    )  # fmt: skip


async def test_a_kept_event_opens_only_as_itself(tmp_path: Path) -> None:
    # A sealed event is kept whole (one lookup opens it): its content and its delta still
    # open only in their own row, unaltered, and each reader gets its own copy.
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    one = Event("user", {"text": "my pin is 1234"}, state_delta={"a": 1, "b": {"x": [1]}})
    two = Event("user", {"text": "hello"}, state_delta={"a": 2, "b": {"x": [2]}})
    sealed = [env.seal_event(key, "org", "s1", event) for event in (one, two)]
    first = await env.open_events("org", "s1", [_stored(e) for e in sealed])
    assert [(e.content, e.state_delta) for e in first] == [
        (one.content, one.state_delta), (two.content, two.state_delta),
    ]  # fmt: skip
    first[0].content["text"] = "changed by the reader"
    first[0].state_delta["b"]["x"].append(9)
    (again,) = await env.open_events("org", "s1", [_stored(sealed[0])])
    assert (again.content, again.state_delta) == (one.content, one.state_delta)
    assert sealed[0].state_delta == {}  # the delta is sealed with the content, as one value
    assert sealed[0].content.startswith(f"{EVENT_PREFIX}{key.key_id}:")
    with pytest.raises(DecryptionError, match="altered"):  # a delta put beside it
        await env.open_events("org", "s1", [_stored(sealed[0], state_delta={"a": 5})])
    with pytest.raises(DecryptionError):  # another event's sealed value under this id
        await env.open_events("org", "s1", [_stored(sealed[1], id=sealed[0].id)])
    with pytest.raises(DecryptionError):  # the content under another event's id
        await env.open_events("org", "s1", [_stored(sealed[0], id=sealed[1].id)])
    with pytest.raises(DecryptionError):  # in another session
        await env.open_events("org", "s2", [_stored(sealed[0])])
    content = sealed[0].content
    tampered = content[:-4] + ("AAAA" if not content.endswith("AAAA") else "BBBB")
    with pytest.raises(DecryptionError):
        await env.open_events("org", "s1", [_stored(sealed[0], content=tampered)])


class _Tone(StrEnum):
    CALM = "calm"


@pytest.mark.parametrize(
    ("content", "delta"),
    [
        ({"text": "flat", "n": 1e16, "ok": True}, {"a": 1, "b": None}),
        ({"parts": [{"text": "nested"}], "role": "user"}, {"b": {"x": [1]}}),
        ("a plain text", {}),
        ({"tone": _Tone.CALM}, {"tone": _Tone.CALM}),
    ],
    ids=["flat", "nested", "text", "str-subclass"],
)
async def test_a_kept_event_is_its_own_copy_written_or_read(
    tmp_path: Path, content: Any, delta: dict[str, Any]
) -> None:
    # What every reader gets is the stored value, in plain JSON types, whether the event was
    # kept as it was written, as it was first read, or not at all: changing the written
    # event or what a read gave changes no later read.
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    stored = (from_json(to_json(content)), from_json(to_json(delta)))
    event = Event("user", copy.deepcopy(content), state_delta=copy.deepcopy(delta))
    sealed = env.seal_event(key, "org", "s1", event)
    if isinstance(event.content, dict):
        event.content.clear()
    event.state_delta["new"] = 1

    def shape(value: Any) -> str:
        return repr(value) + repr(type(value))

    for cold in (False, True):
        if cold:
            env.sealer.opened.clear()
        for _ in range(2):  # the first read of a cold key keeps it; the second finds it
            (read,) = await env.open_events("org", "s1", [_stored(sealed)])
            assert shape((read.content, read.state_delta)) == shape(stored)
            assert [type(v) for v in read.state_delta.values()] == [
                type(v) for v in stored[1].values()
            ]
            if isinstance(read.content, dict):
                read.content["x"] = "changed by the reader"
                for v in read.content.values():
                    if isinstance(v, list):
                        v.append("changed")
            read.state_delta["x"] = "changed by the reader"
            for v in read.state_delta.values():
                if isinstance(v, dict):
                    v.clear()


async def test_an_event_with_a_delta_value_in_clear_opens_as_stored(tmp_path: Path) -> None:
    # In an event sealed value by value, a delta value written without a keyring beside
    # sealed content passes through, each time it is read.
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    content = key.seal({"t": 1}, row_aad("content", "org", "s1", "e1"))
    sealed = key.seal(1, row_aad("delta", "org", "s1", "e1", "a"))
    mixed = Event("user", content, state_delta={"a": sealed, "clear": [1, 2]}, id="e1")
    env.sealer.opened.clear()
    for _ in range(2):
        (read,) = await env.open_events("org", "s1", [copy.deepcopy(mixed)])  # as read back
        assert (read.content, read.state_delta) == ({"t": 1}, {"a": 1, "clear": [1, 2]})
        read.state_delta["clear"].append(3)


async def test_an_event_too_long_to_keep_opens_each_time(tmp_path: Path) -> None:
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    big = {"text": "x" * OpenedValues.KEEP_VALUE_CHARS}
    sealed = env.seal_event(key, "org", "s1", Event("user", big))
    assert env.sealer.opened.events("org", "s1") == {}
    for _ in range(2):
        (read,) = await env.open_events("org", "s1", [_stored(sealed)])
        assert read.content == big
        assert env.sealer.opened.events("org", "s1") == {}


async def test_kept_events_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OpenedValues, "KEEP_VALUES", 10)
    env = Envelope(Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable()))
    key = await env.user_key("org", "alice")
    written = [Event("user", {"n": n}, state_delta={"n": n}) for n in range(25)]
    sealed = [env.seal_event(key, "org", "s1", event) for event in written]
    assert 0 < len(env.sealer.opened.events("org", "s1")) <= 10
    read = await env.open_events("org", "s1", [_stored(e) for e in sealed])  # 25 at once
    assert [(e.content, e.state_delta) for e in read] == [({"n": n}, {"n": n}) for n in range(25)]
    assert 0 < len(env.sealer.opened.events("org", "s1")) <= 10
    env.sealer.opened.clear()
    for start in range(0, 25, 5):
        page = await env.open_events("org", "s1", [_stored(e) for e in sealed[start : start + 5]])
        assert [e.content for e in page] == [{"n": n} for n in range(start, start + 5)]
        assert 0 < len(env.sealer.opened.events("org", "s1")) <= 10


async def test_forgetting_a_scope_drops_the_kept_values(tmp_path: Path) -> None:
    sealer = Sealer(LocalKeyring(tmp_path / "keys.json"), MemoryKeyTable())
    key = await sealer.key("org", USER, "alice")
    aad = row_aad("state", "org", "s1", "k")
    sealed = key.seal("secret", aad)
    assert await sealer.open("org", sealed, aad) == "secret"
    assert len(sealer.opened) == 1
    await sealer.forget("org", USER, "alice")
    assert len(sealer.opened) == 0
    with pytest.raises(DecryptionError):
        await sealer.open("org", sealed, aad)


def test_an_index_key_keeps_its_terms_bounded() -> None:
    key = DataKey("index", INDEX, "", KEY)
    first = key.term("hello")
    for n in range(DataKey.TERMS_KEPT + 1):
        key.term(f"w{n}")
    assert len(key._terms) <= DataKey.TERMS_KEPT
    assert key.term("hello") == first == DataKey("index", INDEX, "", KEY).term("hello")


def test_row_aad_parts_cannot_be_shifted() -> None:
    assert row_aad("ab", "c") != row_aad("a", "bc")


def test_blind_terms_are_letters_keyed_per_key() -> None:
    one, two = DataKey("k1", INDEX, "", KEY), DataKey("k2", INDEX, "", bytes(32))
    term = one.term("hello")
    assert term == one.term("hello")
    assert len(term) == 16
    assert set(term) <= set("abcdefghijklmnop")
    assert term != one.term("world")
    assert term != two.term("hello")


async def test_a_sealer_keeps_one_key_per_scope_and_forgets_it(tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    table = MemoryKeyTable()
    sealer = Sealer(keyring, table)
    key = await sealer.key("org", USER, "alice")
    assert await sealer.key("org", USER, "alice") is key
    other = await sealer.key("org", USER, "bob")
    aad = row_aad("x")
    sealed, kept = key.seal("a", aad), other.seal("b", aad)
    fresh = Sealer(LocalKeyring(tmp_path / "keys.json"), table)  # another process
    assert await fresh.open("org", sealed, aad) == "a"
    assert await fresh.open("org", "plain", aad) == "plain"  # written without a keyring
    await sealer.forget("org", USER, "alice")
    for each in (sealer, Sealer(LocalKeyring(tmp_path / "keys.json"), table)):
        with pytest.raises(DecryptionError):
            await each.open("org", sealed, aad)
        assert await each.open("org", kept, aad) == "b"
    with pytest.raises(DecryptionError):  # another organisation has no such key
        await sealer.open("other", kept, aad)


async def test_a_sealer_rotation_rewraps_without_changing_values(tmp_path: Path) -> None:
    keyring = LocalKeyring(tmp_path / "keys.json")
    table = MemoryKeyTable()
    sealer = Sealer(keyring, table)
    sealed = (await sealer.key("org", USER, "alice")).seal("v", row_aad("x"))
    old = keyring.current_master()
    keyring.rotate()
    assert await sealer.rotate() == 1
    assert await sealer.rotate() == 0
    keyring.remove(old)
    fresh = Sealer(LocalKeyring(tmp_path / "keys.json"), table)
    assert await fresh.open("org", sealed, row_aad("x")) == "v"


def test_a_sealer_needs_a_keyring() -> None:
    with pytest.raises(InvalidArgumentError, match="Keyring"):
        Sealer(object(), MemoryKeyTable())  # type: ignore[arg-type]
