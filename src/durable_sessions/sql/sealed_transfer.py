"""Export and import of an encrypted store: records opened for a decrypted export, and the
blind index of the sealed events and memories an import brings.

An export of an encrypted store carries its wrapped data keys (``key`` records, first) and
its values sealed as stored; it carries no blind index (each dialect keeps it in its own
form), which an import computes again: it opens each sealed event content and memory text
with the store's keyring and hashes its words with the organisation's index key, in the
import's transaction. Requires the ``crypto`` extra (imported only for an encrypted store).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import bindparam, select, update

from ..errors import DecryptionError
from ..memories import memory_terms, owner_token
from ..sealing import (
    EVENT_PREFIX,
    INDEX,
    INDEX_KEY_ID,
    DataKey,
    Envelope,
    KeyRecord,
    event_pair,
    is_sealed,
    key_id_of,
    row_aad,
)
from .dialect import dialect_ops
from .dialects.mysql.programs import words_insert
from .schema import keys
from .search import event_index
from .transactions import TransactionConnection

__all__ = ["BlindIndexer", "key_record", "key_row", "open_record"]

_UNREADABLE = object()
"""What ``BlindIndexer`` opens of a value sealed by a data key that did not unwrap."""

_CACHED_KEYS = 10_000
"""Data keys an import keeps unwrapped, at most (others are read again from the database)."""


async def open_record(env: Envelope, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """Open the sealed values of an export record (as ``_record`` decodes it), in place.

    Raises:
        DecryptionError: A value does not decrypt with the store's keyring.
    """
    org = data["org_id"]
    if kind == "session":
        data["title"] = await env.open_title(org, data["id"], data["title"])
        data["state"] = await env.open_private(org, data["id"], data["state"])
    elif kind == "event":
        sid, eid = data["session_id"], data["id"]
        data["content"], data["state_delta"] = await env.open_event_values(
            org, sid, eid, data["content"], data["state_delta"]
        )
    elif kind == "user_state":
        items = [(data["key"], data["value"])]
        opened = await env.open_user(org, data["app_name"], data["user_id"], items)
        data["value"] = opened[data["key"]]
    elif kind == "app_state":
        opened = await env.open_app(org, data["app_name"], [(data["key"], data["value"])])
        data["value"] = opened[data["key"]]
    elif kind == "memory":
        open_ = env.sealer.open
        owner = (org, data["app_name"], data["user_id"], str(data["id"]))
        data["text"] = await open_(org, data["text"], row_aad("memory", *owner, "text"))
        if not isinstance(data["text"], str):
            raise DecryptionError(f"the text of memory {data['id']!r} is not a sealed text")
        data["content"] = await open_(org, data["content"], row_aad("memory", *owner, "content"))
        data["metadata"] = {
            k: await open_(org, v, row_aad("memory", *owner, "metadata", k))
            for k, v in (data["metadata"] or {}).items()
        }
    return data


def key_record(row: dict[str, Any]) -> KeyRecord:
    """A ``key`` record's row (``ds_keys``'s columns) as the key it holds."""
    return KeyRecord(
        org_id=row["org_id"], key_id=row["key_id"], kind=row["kind"], owner=row["owner"],
        master_id=row["master_id"], wrapped=base64.b64decode(row["wrapped"]),
        created_at=row["created_at"],
    )  # fmt: skip


def key_row(record: KeyRecord) -> dict[str, Any]:
    """A data key as a row of ``ds_keys``."""
    return {
        "org_id": record.org_id, "key_id": record.key_id, "kind": record.kind,
        "owner": record.owner, "master_id": record.master_id,
        "wrapped": base64.b64encode(record.wrapped).decode("ascii"),
        "created_at": record.created_at,
    }  # fmt: skip


class BlindIndexer:
    """Computes, in an import's transaction, the blind index of the sealed rows it loads.

    Args:
        conn: The import's connection, in its transaction.
        env: The importing store's envelope (its keyring).
        flush: Inserts the rows the import holds back (so that its keys can be read).
    """

    def __init__(
        self, conn: TransactionConnection, env: Envelope, flush: Callable[[], Awaitable[None]]
    ) -> None:
        self.conn = conn
        self.env = env
        self.flush = flush
        self.ops = dialect_ops(conn.dialect.name, conn.dialect.driver)
        self._keys: dict[tuple[str, str], DataKey] = {}
        self._index: dict[str, DataKey] = {}
        self._pending: list[dict[str, Any]] = []
        self._failed: tuple[int, KeyRecord, str] | None = None
        self.unwrapped = 0
        self.unreadable: set[tuple[str, str]] = set()
        """The export's data keys that did not unwrap (organisation, key id)."""
        self.keys_held = False
        """Whether key rows were given to the import since it last flushed."""
        self.index = event_index(self.ops)
        if self.index.in_words:  # rows of ds_event_words (``write``)
            self._update: Any = words_insert()
            return
        target = self.index.target()
        self._update = (
            update(target)
            .where(
                target.c.org_id == bindparam("b_org"),
                target.c.session_id == bindparam("b_session"),
                target.c.seq == bindparam("b_seq"),
            )
            .values(self.index.bound("b_terms"))
        )

    async def check_key(self, line: int, row: dict[str, Any]) -> None:
        """Unwrap a ``key`` record's data key now. One that does not unwrap is loaded all
        the same (an erased user's, whose secret the keyring destroyed: their rows stay
        unreadable, as in any copy of the database), and counted in ``unreadable``;
        ``end_of_keys`` fails the import when none does (the wrong keyring)."""
        record = key_record(row)
        try:
            key = await self.env.sealer.unwrap(record)
        except DecryptionError as exc:
            self.unreadable.add((record.org_id, record.key_id))
            if self._failed is None:
                self._failed = (line, record, str(exc))
            return
        self.unwrapped += 1
        if record.kind != INDEX:
            self._remember((record.org_id, record.key_id), key)

    def end_of_keys(self) -> None:
        """Fail when the export's keys were all unreadable: the keyring is not the one they
        were wrapped with.

        Raises:
            DecryptionError: No data key of the export unwraps with the store's keyring.
        """
        if self._failed is not None and not self.unwrapped:
            line, record, why = self._failed
            raise DecryptionError(
                f"line {line}: data key {record.key_id!r} of organisation {record.org_id!r} "
                f"does not unwrap with this keyring ({why}), nor does any other of the "
                "export's; nothing was imported"
            )

    def _remember(self, name: tuple[str, str], key: DataKey) -> None:
        if len(self._keys) >= _CACHED_KEYS:
            self._keys.clear()
        self._keys[name] = key

    async def add_index_key(self, row: dict[str, Any]) -> None:
        """Store an organisation's blind index key unless the database has one already (the
        import's events are then indexed with that one)."""
        await self.conn.execute(self.ops.insert_if_absent(keys).values(row))

    async def _stored(self, org_id: str, key_id: str) -> KeyRecord | None:
        if self.keys_held:
            await self.flush()
            self.keys_held = False
        query = select(keys).where(keys.c.org_id == org_id, keys.c.key_id == key_id)
        found = (await self.conn.execute(query)).first()
        return None if found is None else key_record(dict(found._mapping))

    async def _open(self, line: int, org_id: str, value: Any, aad: bytes) -> Any:
        """The value opened; ``_UNREADABLE`` for one sealed by a key that did not unwrap."""
        if not is_sealed(value):
            return value
        key_id = key_id_of(value)
        if (org_id, key_id) in self.unreadable:
            return _UNREADABLE
        key = self._keys.get((org_id, key_id))
        if key is None:
            record = await self._stored(org_id, key_id)
            if record is None:
                raise DecryptionError(
                    f"line {line}: data key {key_id!r} of organisation {org_id!r} is neither "
                    "in the export nor in the database; nothing was imported"
                )
            key = await self.env.sealer.unwrap(record)
            self._remember((org_id, key_id), key)
        return key.open(value, aad)

    async def _index_key(self, org_id: str) -> DataKey:
        key = self._index.get(org_id)
        if key is not None:
            return key
        record = await self._stored(org_id, INDEX_KEY_ID)
        if record is None:  # an export of an organisation that had no index key yet
            await self.add_index_key(key_row(await self.env.sealer.offer_index_key(org_id)))
            record = await self._stored(org_id, INDEX_KEY_ID)
            assert record is not None
        if len(self._index) >= _CACHED_KEYS:
            self._index.clear()
        key = self._index[org_id] = await self.env.sealer.unwrap(record)
        return key

    async def event(self, line: int, row: dict[str, Any]) -> None:
        """Index a sealed event's content (after its row is inserted, in a batch)."""
        org, sid = row["org_id"], row["session_id"]
        if not is_sealed(row["content"]):
            return
        content = row["content"]
        if content.startswith(EVENT_PREFIX):  # sealed whole: [content, state_delta]
            pair = await self._open(line, org, content, row_aad("event", org, sid, row["id"]))
            content = pair if pair is _UNREADABLE else event_pair(pair)[0]
        else:
            content = await self._open(line, org, content, row_aad("content", org, sid, row["id"]))
        # An unreadable event is indexed under no word (its sealed text is no words).
        terms = "" if content is _UNREADABLE else (await self._index_key(org)).blind(content)
        if self.index.in_words:
            self._pending += self.index.word_rows(org, sid, row["seq"], terms)
            return
        at = {"b_org": org, "b_session": sid, "b_seq": row["seq"]}
        self._pending.append({**at, "b_terms": self.index.value(terms)})

    async def memory_terms(self, line: int, row: dict[str, Any]) -> str | None:
        """The terms column of a sealed memory (its owner's token and blind terms), or None
        for a memory in plaintext."""
        if not is_sealed(row["text"]):
            return None
        org, app, user = row["org_id"], row["app_name"], row["user_id"]
        aad = row_aad("memory", org, app, user, str(row["id"]), "text")
        text = await self._open(line, org, row["text"], aad)
        if text is _UNREADABLE:
            return owner_token(org, app, user)
        if not isinstance(text, str):
            raise DecryptionError(f"line {line}: the text of memory {row['id']!r} is not a text")
        index = await self._index_key(org)
        return " ".join([owner_token(org, app, user), *(index.term(t) for t in memory_terms(text))])

    @property
    def pending(self) -> int:
        """How many index rows wait (``write`` them once their events are inserted): one
        per event, on MySQL one per distinct word of it."""
        return len(self._pending)

    async def write(self) -> None:
        """Write the index of the events held, once their rows are inserted."""
        if self._pending:
            await self.conn.execute(self._update, self._pending)
            self._pending.clear()
