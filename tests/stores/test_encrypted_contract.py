"""The Store contract over encrypted stores: with a keyring, every answer is the same."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, InMemoryStore, Manager, SQLStore, Store
from durable_sessions.crypto import LocalKeyring
from durable_sessions.jsoncodec import to_json
from durable_sessions.sql.transfer import export_jsonl, import_jsonl
from durable_sessions.state import DEFAULT_MAX_VALUE_BYTES
from durable_sessions.testing import StoreContract
from reliability.helpers import reset_tables
from stores.test_limits import (  # noqa: F401 - collected here, over encrypted stores
    test_ids_and_keys_at_the_byte_limits_are_stored_by_every_path,
    test_one_byte_more_is_refused_alike_and_writes_nothing,
)
from support.sql import MYSQL, SQL_BACKENDS

ENCRYPTED_BACKENDS = [pytest.param("memory", marks=pytest.mark.memory), *SQL_BACKENDS, MYSQL]
"""Every store but distributed mode, which refuses a keyring (its search index cannot read
a blind index)."""


@pytest.fixture(params=ENCRYPTED_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test runs against, each with a keyring."""
    return str(request.param)


@pytest.fixture
def store(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Store:
    """An empty store of every kind, encrypting with a keyring of its own."""
    keyring = LocalKeyring(tmp_path / "keys.json")
    if backend == "memory":
        return InMemoryStore(keyring=keyring)
    return SQLStore(request.getfixturevalue("engine"), keyring=keyring)


class TestEncryptedStoreContract(StoreContract):
    """The shipped contract suite, over encrypted stores."""


# -- limits: the widest ids, keys and values, sealed -------------------------------------


def widest_value(size: int, word: str) -> str:
    """A string of exactly ``size`` bytes as JSON: ``word``, then 4-byte characters and
    control characters, which JSON escapes in six bytes."""
    head = f"{word} "
    room = size - 2 - len(head)  # the quotes
    unit = "\U0001f600\x01"  # 4 + 6 bytes as JSON
    text = head + unit * (room // 10)
    text += "e" * (size - len(to_json(text).encode()))
    assert len(to_json(text).encode()) == size
    return text


async def test_values_at_the_limit_in_the_widest_encoding_read_back_sealed(
    store: Store, engine_or_none: AsyncEngine | None
) -> None:
    """A value of each scope, an event's content and its delta value, each exactly at the
    store's ``max_value_bytes`` and as wide as JSON writes a character, are sealed and read
    back the same; the event is found by a word it begins with, through an export and an
    import as well (SQL stores); ``delete_user`` leaves nothing."""
    limit = DEFAULT_MAX_VALUE_BYTES
    state = {key: widest_value(limit, f"w{n}") for n, key in enumerate(("k", "user:k", "app:k"))}
    manager = Manager(store, app_name="app")
    session = await manager.create("org", "alice", state=state)
    content, delta = widest_value(limit, "needle"), widest_value(limit, "delta")
    await store.append_event("org", session.id, Event("user", content, state_delta={"d": delta}))

    async def check() -> None:
        read = await store.get_with_events("org", session.id)
        assert read.state == {**state, "d": delta}
        assert [(e.content, e.state_delta) for e in read.events] == [(content, {"d": delta})]
        [hit] = await store.search("org", "needle", limit=5)
        assert (hit.session_id, hit.event.content) == (session.id, content)

    await check()
    if isinstance(store, SQLStore):
        assert engine_or_none is not None
        out = io.BytesIO()
        await export_jsonl(store, out)
        await reset_tables(engine_or_none)
        await import_jsonl(store, io.BytesIO(out.getvalue()))
        await check()
    assert await store.delete_user("org", "alice") == 1
    assert await store.search("org", "needle", limit=5) == []
