"""Envelope encryption for the stores: data keys, sealed values and blind index words.

A *data key* (256 random bits) protects one scope's data in one organisation: a user's
(``"user"``: sessions, private state, titles, events, ``user:`` state), an app's (``"app"``:
``app:`` state), or the organisation's search index (``"index"``: the key of its blind
index). A store keeps its data keys in a key table, each *wrapped* by the keyring
(``crypto.Keyring``), and unwraps each when it needs it (again every
``Sealer.KEEP_SECONDS``).

A *sealed* value is the text ``dse1:<key id>:<base64(nonce + ciphertext + tag)>`` of
AES-256-GCM over the value's JSON, with associated data that names the row it belongs to
(kind, organisation, session and key or event id): the same ciphertext anywhere else does
not decrypt. An event is sealed whole, as one value: ``dse2:<key id>:<base64>`` of the JSON
``[content, state_delta]``, stored as its content (its stored state delta is empty), so a
read decrypts one value per event. The nonce is synthetic (HMAC-SHA256 of the associated
data and the plaintext, under a key of its own): the same value in the same place seals to
the same text, which lets SQL compare a stored value with an expected one, and reveals only
that a row holds the same value as before.

The blind index replaces each word of an event's text by a keyed hash of it
(HMAC-SHA256 under the organisation's index key, as 16 letters), so that whole-word search
works over the hashes as it did over the words.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ._tasks import to_the_end
from .crypto import Keyring  # without the crypto extra, its ImportError names the extra
from .errors import DecryptionError, InvalidArgumentError
from .fulltext import event_text, words
from .jsoncodec import from_json, to_json
from .memories import memory_terms
from .model import Event, Memory, Session, utcnow
from .state import APP_PREFIX, USER_PREFIX, ScopedDelta

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        'encryption at rest needs the optional "crypto" extra: '
        'pip install "durable-sessions[crypto]"'
    ) from exc

__all__ = [
    "APP",
    "EVENT_PREFIX",
    "INDEX",
    "INDEX_KEY_ID",
    "PREFIX",
    "USER",
    "DataKey",
    "Envelope",
    "KeyNeeded",
    "KeyRecord",
    "KeyTable",
    "MemoryKeyTable",
    "OpenedValues",
    "SealedEvent",
    "SealedMemory",
    "Sealer",
    "event_pair",
    "is_sealed",
    "key_id_of",
    "row_aad",
]

PREFIX = "dse1:"
"""What every sealed value but an event starts with (format 1)."""
EVENT_PREFIX = "dse2:"
"""What a sealed event starts with (format 2): its content and state delta, sealed as one
value. Events in format 1 have their content and each delta value sealed apart."""
_PREFIXES = (PREFIX, EVENT_PREFIX)
USER = "user"
"""The kind of data key of a user's sessions, private state, events and ``user:`` state."""
APP = "app"
"""The kind of data key of an app's ``app:`` state."""
INDEX = "index"
"""The kind of data key of an organisation's blind index."""
INDEX_KEY_ID = "index"
"""The id of every organisation's blind index key: one id, so that stores racing to make
an organisation's first index key insert one row (the first wins) and all hash with it."""

_CACHE_LIMIT = 100_000
T = TypeVar("T")

_clock = time.monotonic
"""The clock that times what a ``Sealer`` keeps (``KEEP_SECONDS``)."""


@dataclass(frozen=True)
class KeyRecord:
    """One wrapped data key, as the key table stores it."""

    org_id: str
    key_id: str
    kind: str
    owner: str
    master_id: str
    wrapped: bytes
    created_at: datetime


class KeyTable(Protocol):
    """Where a store keeps its wrapped data keys (a dict in memory, ``ds_keys`` in SQL)."""

    async def newest(self, org_id: str, kind: str, owner: str) -> KeyRecord | None:
        """Return the newest data key of a scope, None when it has none."""
        ...

    async def find(self, org_id: str, key_id: str) -> KeyRecord | None:
        """Return a data key by id, None when it is not there (or was destroyed)."""
        ...

    async def scope(self, org_id: str, kind: str, owner: str) -> list[KeyRecord]:
        """Return every data key of a scope."""
        ...

    async def add(self, record: KeyRecord) -> None:
        """Store a new data key."""
        ...

    async def add_if_absent(self, record: KeyRecord) -> None:
        """Store a data key unless its id is taken in its organisation (keep the other)."""
        ...

    async def drop(self, org_id: str, kind: str, owner: str) -> None:
        """Delete every data key of a scope."""
        ...

    async def stale(self, master_id: str, limit: int) -> list[KeyRecord]:
        """Return up to ``limit`` data keys wrapped by another master key than ``master_id``."""
        ...

    async def rewrap(self, record: KeyRecord, master_id: str, wrapped: bytes) -> None:
        """Replace a data key's wrapping (its key id and what it decrypts stay)."""
        ...


@dataclass
class SealedEvent(Event):
    """An event as an encrypted store writes it: sealed, with its blind index text (the
    terms of its words, which the full-text index reads instead of the sealed content)."""

    search_terms: str | None = None


@dataclass
class SealedMemory(Memory):
    """A memory as an encrypted store writes it: text, content and metadata values sealed,
    with its blind index terms (the keyed hashes of its terms, space-separated)."""

    search_terms: str = ""


class MemoryKeyTable:
    """A key table in a dict: the in-memory store's."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], KeyRecord] = {}

    async def newest(self, org_id: str, kind: str, owner: str) -> KeyRecord | None:
        """Return the newest data key of a scope, None when it has none."""
        found = [
            r for r in self._keys.values()
            if r.org_id == org_id and r.kind == kind and r.owner == owner
        ]  # fmt: skip
        return max(found, key=lambda r: (r.created_at, r.key_id), default=None)

    async def find(self, org_id: str, key_id: str) -> KeyRecord | None:
        """Return a data key by id, None when it is not there."""
        return self._keys.get((org_id, key_id))

    async def scope(self, org_id: str, kind: str, owner: str) -> list[KeyRecord]:
        """Return every data key of a scope."""
        return [
            r for r in self._keys.values()
            if r.org_id == org_id and r.kind == kind and r.owner == owner
        ]  # fmt: skip

    async def add(self, record: KeyRecord) -> None:
        """Store a new data key."""
        self._keys[(record.org_id, record.key_id)] = record

    async def add_if_absent(self, record: KeyRecord) -> None:
        """Store a data key unless its id is taken in its organisation."""
        self._keys.setdefault((record.org_id, record.key_id), record)

    async def drop(self, org_id: str, kind: str, owner: str) -> None:
        """Delete every data key of a scope."""
        for key, r in list(self._keys.items()):
            if r.org_id == org_id and r.kind == kind and r.owner == owner:
                del self._keys[key]

    async def stale(self, master_id: str, limit: int) -> list[KeyRecord]:
        """Return up to ``limit`` data keys wrapped by another master key."""
        return [r for r in self._keys.values() if r.master_id != master_id][:limit]

    async def rewrap(self, record: KeyRecord, master_id: str, wrapped: bytes) -> None:
        """Replace a data key's wrapping."""
        key = (record.org_id, record.key_id)
        if key in self._keys:
            self._keys[key] = replace(self._keys[key], master_id=master_id, wrapped=wrapped)


def is_sealed(value: Any) -> bool:
    """Whether a stored value is sealed (not plaintext written without a keyring)."""
    return isinstance(value, str) and value.startswith(_PREFIXES)


def row_aad(*parts: str) -> bytes:
    """The associated data naming a row: its parts, each length-prefixed."""
    return b"dse1" + b"".join([_aad_part(part) for part in parts])


@functools.lru_cache(maxsize=4096)
def _aad_part(part: str) -> bytes:
    # Cached: a read opens many values of one organisation and session, with few field names.
    data = part.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(4, "big") + data


_EVENT_AAD = row_aad("event")
_STATE_AAD = row_aad("state")
_USER_AAD = row_aad("user")
_APP_AAD = row_aad("app")


def _scope(org_id: str, kind: str, owner: str) -> str:
    return json.dumps([org_id, kind, owner], ensure_ascii=False, separators=(",", ":"))


_MISS: Any = object()
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})

_KeptEvent = tuple[str, str]
"""A kept event: its id, and the JSON text of its ``[content, state_delta]``."""


class OpenedValues:
    """Values a store's data keys sealed or opened lately, by sealed text and associated data
    (and their sealed texts, by data key, associated data and JSON text).

    An agent's turn reads back mostly what the last turn read or wrote; each of those values
    is then decoded from its kept JSON text instead of decrypted again, and a value written
    again unchanged (a save writes a session's whole private state) is not sealed again:
    sealing is deterministic, so the kept sealed text is what sealing would give. Each entry
    is keyed by the whole sealed text and the associated data naming its row, so an altered
    value, or one moved to another row, is not found here and fails to decrypt as before (a
    row's associated data names its organisation, so no other organisation finds it).
    Bounded: a value over ``KEEP_VALUE_CHARS`` is not kept, and past ``KEEP_CHARS`` of kept
    text or ``KEEP_VALUES`` values all is dropped. ``Sealer.forget`` (``delete_user``) drops
    all, as does every ``Sealer.KEEP_SECONDS``.
    """

    KEEP_VALUE_CHARS = 16_384
    """The longest JSON text of one value that is kept (of an event, its sealed texts)."""
    KEEP_CHARS = 16 * 1024 * 1024
    """How much sealed and JSON text is kept at most, in characters."""
    KEEP_VALUES = 100_000
    """How many values are kept at most."""

    __slots__ = ("_chars", "_entries", "_event_count", "_events", "_sealed")

    def __init__(self) -> None:
        # (data key, associated data, JSON text) -> the sealed text: sealing is deterministic
        # (the nonce is synthetic), so a value sealed again for its row is found here.
        self._sealed: dict[tuple[DataKey, bytes, str], str] = {}
        # (sealed text, associated data) -> (the data key, the value or its JSON text, whether
        # it is the text)
        self._entries: dict[tuple[str, bytes], tuple[DataKey, Any, bool]] = {}
        # (organisation, session) -> sealed event -> the event kept (``_KeptEvent``)
        self._events: dict[tuple[str, str], dict[str, _KeptEvent]] = {}
        self._event_count = 0
        self._chars = 0

    def get(self, key: DataKey, token: str, aad: bytes) -> Any:
        """The value ``key`` kept for ``token`` in the row ``aad`` names, or ``_MISS``."""
        hit = self._entries.get((token, aad))
        if hit is None or hit[0] is not key:
            return _MISS
        return from_json(hit[1]) if hit[2] else hit[1]

    def find(self, token: str, aad: bytes) -> Any:
        """The value kept for ``token`` in the row ``aad`` names, by whichever data key, or
        ``_MISS``: for associated data that names the organisation (``row_aad``'s rows)."""
        hit = self._entries.get((token, aad))
        if hit is None:
            return _MISS
        return from_json(hit[1]) if hit[2] else hit[1]

    def opener(self, slow: Callable[[Any, bytes], Any]) -> Callable[[Any, bytes], Any]:
        """``find`` as one function of (stored value, associated data) for a read's many
        values: what is not kept (or not sealed) goes to ``slow``."""
        get = self._entries.get

        def open_(value: Any, aad: bytes) -> Any:
            if type(value) is str:
                hit = get((value, aad))
                if hit is not None:
                    return from_json(hit[1]) if hit[2] else hit[1]
            return slow(value, aad)

        return open_

    def keep(self, key: DataKey, token: str, aad: bytes, text: str, value: Any) -> None:
        """Keep a value: ``value`` itself when it is a str, number, bool or None; its JSON
        ``text`` otherwise (decoded afresh for each reader, who may change it)."""
        if len(text) > self.KEEP_VALUE_CHARS:
            return
        if self._chars > self.KEEP_CHARS or len(self._entries) >= self.KEEP_VALUES:
            self.clear()
        immutable = type(value) in _IMMUTABLE
        self._entries[(token, aad)] = (key, value if immutable else text, not immutable)
        self._sealed[(key, aad, text)] = token
        self._chars += len(token) + 2 * len(text)

    def keep_events(
        self, org_id: str, session_id: str, events: dict[str, _KeptEvent], size: int
    ) -> None:
        """Keep events of a session (``_KeptEvent``), by sealed event; ``size`` is the
        length of their sealed texts, each event's at most ``KEEP_VALUE_CHARS`` (the caller
        leaves out longer ones). ``events`` then finds each in one lookup. Past ``KEEP_CHARS``
        or ``KEEP_VALUES`` all is dropped first; more than those at once is not kept."""
        if len(events) > self.KEEP_VALUES or 2 * size > self.KEEP_CHARS:
            return
        if (
            self._chars + 2 * size > self.KEEP_CHARS
            or self._event_count + len(events) > self.KEEP_VALUES
        ):
            self.clear()
        kept = self._events.get((org_id, session_id))
        if kept is None:
            kept = self._events[(org_id, session_id)] = {}
        before = len(kept)
        kept.update(events)
        self._event_count += len(kept) - before
        self._chars += 2 * size  # the sealed texts, and at most as much opened

    def events(self, org_id: str, session_id: str) -> dict[str, _KeptEvent]:
        """The events of a session kept (``keep_events``), by sealed event: a hit is the
        event when its id is the one kept."""
        return self._events.get((org_id, session_id)) or {}

    def clear(self) -> None:
        """Drop every kept value."""
        self._entries.clear()
        self._events.clear()
        self._event_count = 0
        self._sealed.clear()
        self._chars = 0

    def sealed(self, key: DataKey, aad: bytes, text: str) -> str | None:
        """The sealed text ``key`` made of the JSON ``text`` for the row ``aad`` names, if
        kept."""
        return self._sealed.get((key, aad, text))

    def __len__(self) -> int:
        return len(self._entries)


class DataKey:
    """An unwrapped data key: its cipher, its nonce key and (index keys) its hash key.

    With ``opened`` (a store's ``OpenedValues``), the values it seals and opens are kept
    there, and opening one kept is decoding its JSON text (or nothing, for a scalar).
    """

    __slots__ = (
        "_aead", "_index_mac", "_nonce_mac", "_opened", "_terms", "decrypt", "event_head",
        "key_id", "kind", "owner", "sealed_head",
    )  # fmt: skip

    TERMS_KEPT = 65_536
    """How many words' blind index terms an index key keeps computed (then starts again)."""

    def __init__(
        self,
        key_id: str,
        kind: str,
        owner: str,
        material: bytes,
        opened: OpenedValues | None = None,
    ) -> None:
        derived = HKDF(
            algorithm=hashes.SHA256(), length=96, salt=None, info=b"durable-sessions data key"
        ).derive(material)
        self.key_id = key_id
        self.sealed_head = f"{PREFIX}{key_id}:"
        """What every value this key sealed begins with, but events."""
        self.event_head = f"{EVENT_PREFIX}{key_id}:"
        """What every event this key sealed begins with (as long as ``sealed_head``)."""
        self.kind = kind
        self.owner = owner
        self._aead = AESGCM(derived[:32])
        self.decrypt: Callable[[bytes, bytes, bytes], bytes] = self._aead.decrypt
        """AES-GCM decryption under this key: ``decrypt(nonce, data, associated data)``."""
        # HMAC-SHA256 under the nonce key and under the index key, each keyed once here and
        # copied for each value or word.
        self._nonce_mac = hmac.new(derived[32:64], digestmod=hashlib.sha256)
        self._opened = opened
        self._terms: dict[str, str] = {}
        self._index_mac = hmac.new(derived[64:], digestmod=hashlib.sha256)

    @property
    def opened(self) -> OpenedValues | None:
        """Where the values this key seals and opens are kept; None when they are not."""
        return self._opened

    def seal(self, value: Any, aad: bytes) -> str:
        """Encrypt a JSON value for the row ``aad`` names."""
        text = to_json(value)
        opened = self._opened
        if opened is not None:
            kept = opened.sealed(self, aad, text)
            if kept is not None:
                return kept
        token = self.seal_text(text, aad)
        if opened is not None:
            opened.keep(self, token, aad, text, value)
        return token

    def seal_text(self, text: str, aad: bytes, *, event: bool = False) -> str:
        """Encrypt a value's JSON text for the row ``aad`` names (nothing kept); with
        ``event``, as a sealed event (``EVENT_PREFIX``)."""
        plain = text.encode("utf-8", "surrogatepass")
        mac = self._nonce_mac.copy()
        mac.update(aad + b"\x00" + plain)
        nonce = mac.digest()[:12]
        sealed = nonce + self._aead.encrypt(nonce, plain, aad)
        head = self.event_head if event else self.sealed_head
        return head + binascii.b2a_base64(sealed, newline=False).decode()

    def open(self, token: str, aad: bytes) -> Any:
        """Decrypt a value this key sealed for the row ``aad`` names."""
        opened = self._opened
        if opened is not None:
            value = opened.get(self, token, aad)
            if value is not _MISS:
                return value
        return self.open_new(token, aad)

    def open_new(self, token: str, aad: bytes) -> Any:
        """``open`` for a value not kept: decrypted, and kept."""
        text = self.open_text(token, aad)
        value = from_json(text)
        opened = self._opened
        if opened is not None:
            opened.keep(self, token, aad, text, value)
        return value

    def open_text(self, token: str, aad: bytes) -> str:
        """Decrypt a value (or event) this key sealed for the row ``aad`` names, to its
        JSON text (nothing kept)."""
        try:
            raw = binascii.a2b_base64(token[len(self.sealed_head) :])
            plain = self._aead.decrypt(raw[:12], raw[12:], aad)
        except (InvalidTag, ValueError, binascii.Error):
            raise DecryptionError(
                f"a stored value does not decrypt with data key {self.key_id!r}: it was "
                "altered, or moved from another row"
            ) from None
        return plain.decode("utf-8", "surrogatepass")

    def blind(self, content: Any) -> str:
        """An event content's blind index text: the terms of its words, in order."""
        if content is None:
            return ""
        kept, term = self._terms, self.term
        return " ".join([kept.get(word) or term(word) for word in words(event_text(content))])

    def term(self, word: str) -> str:
        """A word's blind index term: 16 letters (a-p) of its keyed hash (kept: words
        recur, and each is hashed once while kept)."""
        kept = self._terms.get(word)
        if kept is not None:
            return kept
        mac = self._index_mac.copy()
        mac.update(word.encode("utf-8", "surrogatepass"))
        digest = mac.digest()
        found = digest[:8].hex().translate(_LETTERS)
        if len(self._terms) >= self.TERMS_KEPT:
            self._terms.clear()
        self._terms[word] = found
        return found


def _no_decrypt(nonce: bytes, data: bytes, aad: bytes) -> bytes:
    raise AssertionError("no data key chosen yet")  # pragma: no cover


_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")


class KeyNeeded(Exception):
    """``Sealer.open_now`` met a value whose data key is not unwrapped yet."""

    def __init__(self, key_id: str) -> None:
        super().__init__(key_id)
        self.key_id = key_id


def key_id_of(token: str) -> str:
    """The data key id a sealed value (or event) names."""
    end = token.find(":", len(PREFIX))
    if end < 0:
        raise DecryptionError("a stored value is not a sealed value")
    return token[len(PREFIX) : end]


class Sealer:
    """A store's data keys: created, unwrapped (and kept, for ``KEEP_SECONDS``), destroyed
    and re-wrapped.

    Args:
        keyring: Wraps and unwraps the data keys.
        table: Where the wrapped data keys are kept.
    """

    KEEP_SECONDS = 900.0
    """How long this process keeps the data keys it unwrapped, and the values they opened,
    before it drops them all and unwraps keys again through the keyring when next needed:
    an erasure made by another process (``delete_user``), or a master key removed, reaches
    this process within that time, even for a copy of the database made before it."""

    def __init__(self, keyring: Keyring, table: KeyTable) -> None:
        if not isinstance(keyring, Keyring):
            raise InvalidArgumentError(
                f"keyring must implement durable_sessions.crypto.Keyring, not "
                f"{type(keyring).__name__}"
            )
        self.keyring = keyring
        self.table = table
        self._by_id: dict[tuple[str, str], DataKey] = {}
        self._current: dict[tuple[str, str, str], DataKey] = {}
        self.opened = OpenedValues()
        self._kept_until = _clock() + self.KEEP_SECONDS
        # Held while a scope's key is looked for and made: concurrent first uses of a scope
        # (its first writes) share one key instead of each making its own.
        self._making = asyncio.Lock()

    def _drop_all(self) -> None:
        self._by_id.clear()
        self._current.clear()
        self.opened.clear()

    def _expire(self) -> None:
        """Drop every key and value kept once ``KEEP_SECONDS`` have passed."""
        now = _clock()
        if now >= self._kept_until:
            self._drop_all()
            self._kept_until = now + self.KEEP_SECONDS

    def _remember(self, org_id: str, key: DataKey, *, current: bool) -> DataKey:
        if len(self._by_id) > _CACHE_LIMIT:
            self._drop_all()
        self._by_id[(org_id, key.key_id)] = key
        if current:
            self._current[(org_id, key.kind, key.owner)] = key
        return key

    async def unwrap(self, record: KeyRecord) -> DataKey:
        """Unwrap a stored data key with the keyring (without remembering it)."""
        scope = _scope(record.org_id, record.kind, record.owner)
        material = await self.keyring.unwrap(scope, record.master_id, record.wrapped)
        return DataKey(record.key_id, record.kind, record.owner, material, self.opened)

    async def key(self, org_id: str, kind: str, owner: str, *, verify: bool = False) -> DataKey:
        """Return the scope's current data key, made (and stored wrapped) if it has none.

        With ``verify``, a key this process holds is looked up in the key table first:
        another process's ``delete_user`` may have destroyed it, and what is sealed with a
        destroyed key never opens again. A key found gone is forgotten here, and the
        scope's current key is found (or made) instead.
        """
        self._expire()
        known = self._current.get((org_id, kind, owner))
        if known is not None:
            if not verify or await self.table.find(org_id, known.key_id) is not None:
                return known
            if self._current.get((org_id, kind, owner)) is known:  # destroyed elsewhere
                self._drop_scope(org_id, kind, owner)
        async with self._making:
            known = self._current.get((org_id, kind, owner))
            if known is not None:
                return known
            if kind == INDEX:
                return await self._index_key(org_id)
            record = await self.table.newest(org_id, kind, owner)
            if record is None:
                return await self.new_key(org_id, kind, owner)
            return self._remember(org_id, await self.unwrap(record), current=True)

    async def _index_key(self, org_id: str) -> DataKey:
        # One key per organisation across processes: a user key made twice by racing
        # processes leaves two keys that each open what they sealed, but two index keys
        # would hash the same word two ways, and a search would miss the other's rows. So
        # the index key has one id: each store offers its own, the first row stays, and
        # every store reads back that one.
        record = await self.table.find(org_id, INDEX_KEY_ID)
        if record is None:
            await self.table.add_if_absent(await self.offer_index_key(org_id))
            record = await self.table.find(org_id, INDEX_KEY_ID)
            if record is None:
                raise DecryptionError(
                    f"the blind index key of organisation {org_id!r} vanished as it was made"
                )
        return self._remember(org_id, await self.unwrap(record), current=True)

    async def offer_index_key(self, org_id: str) -> KeyRecord:
        """Make a blind index key for the organisation, wrapped, to be stored unless it has
        one already (``KeyTable.add_if_absent``)."""
        master_id, wrapped = await self.keyring.wrap(
            _scope(org_id, INDEX, ""), secrets.token_bytes(32)
        )
        return KeyRecord(org_id, INDEX_KEY_ID, INDEX, "", master_id, wrapped, utcnow())

    async def new_key(self, org_id: str, kind: str, owner: str) -> DataKey:
        """Make a new data key for the scope, store it wrapped and make it current (not for
        the index kind, whose one key ``key`` makes)."""
        if kind == INDEX:
            raise InvalidArgumentError("an organisation has one blind index key, never a new one")
        material = secrets.token_bytes(32)
        master_id, wrapped = await self.keyring.wrap(_scope(org_id, kind, owner), material)
        key_id = "k" + secrets.token_hex(8)
        record = KeyRecord(org_id, key_id, kind, owner, master_id, wrapped, utcnow())
        await self.table.add(record)
        key = DataKey(key_id, kind, owner, material, self.opened)
        return self._remember(org_id, key, current=True)

    async def key_by_id(self, org_id: str, key_id: str) -> DataKey:
        """Return the data key a sealed value names.

        Raises:
            DecryptionError: the key is not in the key table (destroyed by ``delete_user``,
                or never in this database) or the keyring cannot unwrap it.
        """
        self._expire()
        known = self._by_id.get((org_id, key_id))
        if known is not None:
            return known
        record = await self.table.find(org_id, key_id)
        if record is None:
            raise DecryptionError(
                f"data key {key_id!r} of organisation {org_id!r} is not in this store "
                "(its user was erased, the value was copied from another database, or it is "
                "a string written without a keyring that begins like a sealed value)"
            )
        return self._remember(org_id, await self.unwrap(record), current=False)

    async def keys_for(self, org_id: str, values: Iterable[Any]) -> dict[str, DataKey]:
        """Return the data keys the sealed values among ``values`` name, by key id."""
        found: dict[str, DataKey] = {}
        for value in values:
            if is_sealed(value):
                key_id = key_id_of(value)
                if key_id not in found:
                    found[key_id] = await self.key_by_id(org_id, key_id)
        return found

    async def scope_keys(self, org_id: str, kind: str, owner: str) -> dict[str, DataKey]:
        """Return every data key of a scope by id (to open values in a step that must not
        suspend), the current one among them."""
        self._expire()
        records = await self.table.scope(org_id, kind, owner)
        held = self._current.get((org_id, kind, owner))
        if held is not None and all(r.key_id != held.key_id for r in records):
            self._drop_scope(org_id, kind, owner)  # destroyed by another process
        found = {}
        for record in records:
            known = self._by_id.get((org_id, record.key_id))
            if known is None:
                known = self._remember(org_id, await self.unwrap(record), current=False)
            found[record.key_id] = known
        current = await self.key(org_id, kind, owner)
        found[current.key_id] = current
        return found

    @staticmethod
    def open_with(keys: dict[str, DataKey], value: Any, aad: bytes) -> Any:
        """Decrypt a stored value with one of ``keys`` (``scope_keys``), without suspending.

        Raises:
            DecryptionError: the value names a key not among ``keys``.
        """
        if not is_sealed(value):
            return value
        key_id = key_id_of(value)
        key = keys.get(key_id)
        if key is None:
            raise DecryptionError(f"data key {key_id!r} is not one of this scope's keys")
        return key.open(value, aad)

    def open_row(self, org_id: str, value: Any, aad: bytes) -> Any:
        """``open_now`` for a value whose associated data names its organisation (every row
        ``Envelope`` opens): a value kept (``OpenedValues``) is found without its key."""
        if type(value) is str:
            kept = self.opened.find(value, aad)
            if kept is not _MISS:
                return kept
        return self.open_missed(org_id, value, aad)

    def open_missed(self, org_id: str, value: Any, aad: bytes) -> Any:
        """``open_now`` for a value found not kept (``OpenedValues.find``)."""
        if not (type(value) is str and value.startswith(_PREFIXES)):
            return value
        return self.unwrapped(org_id, key_id_of(value)).open_new(value, aad)

    def open_now(self, org_id: str, value: Any, aad: bytes) -> Any:
        """Decrypt a stored value with a data key this process has unwrapped already
        (plaintext, written without a keyring, passes through), without suspending.

        Raises:
            KeyNeeded: the value's data key is not unwrapped yet (``key_by_id`` fetches it).
        """
        if not (isinstance(value, str) and value.startswith(_PREFIXES)):
            return value
        return self.unwrapped(org_id, key_id_of(value)).open(value, aad)

    def unwrapped(self, org_id: str, key_id: str) -> DataKey:
        """A data key this process has unwrapped already, without suspending.

        Raises:
            KeyNeeded: it is not unwrapped yet (``key_by_id`` fetches it).
        """
        key = self._by_id.get((org_id, key_id))
        if key is None:
            raise KeyNeeded(key_id)
        return key

    async def open(self, org_id: str, value: Any, aad: bytes) -> Any:
        """Decrypt a stored value (plaintext, written without a keyring, passes through)."""
        return await self.opening(org_id, self.open_now, org_id, value, aad)

    async def opening(self, org_id: str, step: Callable[..., T], *args: Any) -> T:
        """Run ``step(*args)``, which opens values of ``org_id`` with ``open_now``: again
        after fetching each data key it needs (one suspension per key not unwrapped yet)."""
        self._expire()
        while True:
            try:
                return step(*args)
            except KeyNeeded as need:
                await self.key_by_id(org_id, need.key_id)

    async def index_key(self, org_id: str) -> DataKey:
        """Return the organisation's blind index key."""
        return await self.key(org_id, INDEX, "")

    async def blind_text(self, org_id: str, content: Any) -> str:
        """The blind index text of an event's content: its words' terms, in order."""
        if content is None:
            return ""
        return (await self.index_key(org_id)).blind(content)

    async def forget(self, org_id: str, kind: str, owner: str) -> None:
        """Destroy a scope's data keys: in the keyring first, then in the key table.

        Once begun, the destruction runs to its end even if the caller is cancelled (which
        is raised afterwards): a key table that still listed keys the keyring can no longer
        unwrap would refuse the scope's next writes, and a key this process held would seal
        values that never open again.
        """
        self._drop_scope(org_id, kind, owner)

        async def destroy() -> None:
            await self.keyring.forget(_scope(org_id, kind, owner))
            await self.table.drop(org_id, kind, owner)

        try:
            await to_the_end(destroy())
        finally:
            self._drop_scope(org_id, kind, owner)  # a key fetched meanwhile

    def destroyed(self, org_id: str, key_id: str) -> None:
        """Forget a data key found gone from the key table (another process destroyed it),
        with its scope's other keys: the scope's current key is looked for again."""
        known = self._by_id.get((org_id, key_id))
        if known is not None:
            self._drop_scope(org_id, known.kind, known.owner)

    def _drop_scope(self, org_id: str, kind: str, owner: str) -> None:
        """Forget a scope's keys, and every value kept (some may be the scope's)."""
        self._current.pop((org_id, kind, owner), None)
        self.opened.clear()
        for cached in [k for k, v in self._by_id.items() if k[0] == org_id and v.kind == kind]:
            if self._by_id[cached].owner == owner:
                del self._by_id[cached]

    async def rotate(self, *, batch: int = 500) -> int:
        """Re-wrap every data key under the keyring's current master key; return how many.

        Only the key table changes: no sealed value is rewritten.
        """
        done = 0
        while True:
            current = self.keyring.current_master()
            stale = await self.table.stale(current, batch)
            if not stale:
                return done
            for record in stale:
                scope = _scope(record.org_id, record.kind, record.owner)
                material = await self.keyring.unwrap(scope, record.master_id, record.wrapped)
                master_id, wrapped = await self.keyring.wrap(scope, material)
                await self.table.rewrap(record, master_id, wrapped)
                done += 1


class Envelope:
    """What a store seals and opens, row by row: one place for the associated data.

    Sealing takes the data key the caller fetched first (``user_key``, ``app_key``), so a
    store can fetch every key it needs before the step that must not suspend; opening
    fetches the keys the values name.

    The associated data of each kind of row:

    - private state value: ``("state", org, session, key)``;
    - ``user:`` value: ``("user", org, app, user, key)``; ``app:`` value:
      ``("app", org, app, key)``;
    - title: ``("title", org, session)``;
    - event (its content and state delta, sealed as one value):
      ``("event", org, session, event id)``; an event in format 1 (read, not written), its
      content alone: ``("content", org, session, event id)``, and each value of its state
      delta: ``("delta", org, session, event id, key)``.
    """

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    async def user_key(self, org_id: str, user_id: str, *, verify: bool = False) -> DataKey:
        """Return the data key of a user's sessions, events and ``user:`` state; with
        ``verify``, one this process holds is looked up in the key table first (``Sealer.key``:
        another process may have erased the user)."""
        return await self.sealer.key(org_id, USER, user_id, verify=verify)

    async def app_key(self, org_id: str, app_name: str) -> DataKey:
        """Return the data key of an app's ``app:`` state."""
        return await self.sealer.key(org_id, APP, app_name)

    # -- sealing (no suspension) -----------------------------------------------------------

    @staticmethod
    def seal_private(
        key: DataKey, org_id: str, session_id: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        """Seal a session's private state values (keys stay clear)."""
        return {k: key.seal(v, row_aad("state", org_id, session_id, k)) for k, v in state.items()}

    @staticmethod
    def seal_user(
        key: DataKey, org_id: str, app_name: str, user_id: str, items: dict[str, Any]
    ) -> dict[str, Any]:
        """Seal ``user:`` values (keys without their prefix)."""
        return {
            k: key.seal(v, row_aad("user", org_id, app_name, user_id, k)) for k, v in items.items()
        }

    @staticmethod
    def seal_app(key: DataKey, org_id: str, app_name: str, items: dict[str, Any]) -> dict[str, Any]:
        """Seal ``app:`` values (keys without their prefix)."""
        return {k: key.seal(v, row_aad("app", org_id, app_name, k)) for k, v in items.items()}

    @staticmethod
    def seal_title(key: DataKey, org_id: str, session_id: str, title: str) -> str:
        """Seal a title; the empty title (untitled) stays empty."""
        return key.seal(title, row_aad("title", org_id, session_id)) if title else ""

    @staticmethod
    def seal_event_values(
        key: DataKey, org_id: str, session_id: str, event_id: str, content: Any, delta: Any
    ) -> tuple[Any, dict[str, Any]]:
        """An event's content and state delta as stored: sealed as one value (the stored
        content; the stored delta is empty), or None and ``{}`` for an event with neither."""
        sealed = _sealed_pair(key, org_id, session_id, event_id, content, delta)
        return None if sealed is None else sealed[0], {}

    # -- opening ---------------------------------------------------------------------------
    # Each opens with the data keys unwrapped already (``Sealer.open_now``), fetching a
    # missing one and starting again (``Sealer.opening``): one suspension per key, none
    # per value.

    def _private_now(self, org_id: str, session_id: str, state: dict[str, Any]) -> dict[str, Any]:
        open_ = self.sealer.open_row
        return {
            k: open_(org_id, v, row_aad("state", org_id, session_id, k)) for k, v in state.items()
        }

    async def open_private(
        self, org_id: str, session_id: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        """Open a session's private state values."""
        return await self.sealer.opening(org_id, self._private_now, org_id, session_id, state)

    def _user_now(
        self, org_id: str, app_name: str, user_id: str, items: list[tuple[str, Any]]
    ) -> dict[str, Any]:
        open_ = self.sealer.open_row
        return {
            k: open_(org_id, v, row_aad("user", org_id, app_name, user_id, k)) for k, v in items
        }

    async def open_user(
        self, org_id: str, app_name: str, user_id: str, items: Iterable[tuple[str, Any]]
    ) -> dict[str, Any]:
        """Open ``user:`` values (keys without their prefix)."""
        return await self.sealer.opening(
            org_id, self._user_now, org_id, app_name, user_id, list(items)
        )

    def _app_now(self, org_id: str, app_name: str, items: list[tuple[str, Any]]) -> dict[str, Any]:
        open_ = self.sealer.open_row
        return {k: open_(org_id, v, row_aad("app", org_id, app_name, k)) for k, v in items}

    async def open_app(
        self, org_id: str, app_name: str, items: Iterable[tuple[str, Any]]
    ) -> dict[str, Any]:
        """Open ``app:`` values (keys without their prefix)."""
        return await self.sealer.opening(org_id, self._app_now, org_id, app_name, list(items))

    def _title_now(self, org_id: str, session_id: str, title: str) -> str:
        if not title:  # untitled
            return title
        opened = self.sealer.open_row(org_id, title, row_aad("title", org_id, session_id))
        if not isinstance(opened, str):
            raise DecryptionError(f"the title of session {session_id!r} is not a sealed title")
        return opened

    async def open_title(self, org_id: str, session_id: str, title: str) -> str:
        """Open a title."""
        return await self.sealer.opening(org_id, self._title_now, org_id, session_id, title)

    def _stored_event_now(
        self, org_id: str, session_id: str, event_id: str, content: Any, delta: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        return Envelope.open_stored_event(
            functools.partial(self.sealer.open_row, org_id),
            org_id, session_id, event_id, content, delta,
        )  # fmt: skip

    async def open_event_values(
        self, org_id: str, session_id: str, event_id: str, content: Any, delta: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """An event's content and state delta, opened from their stored values."""
        return await self.sealer.opening(
            org_id, self._stored_event_now, org_id, session_id, event_id, content, delta
        )

    @staticmethod
    def open_stored_event(
        open_: Callable[[Any, bytes], Any],
        org_id: str,
        session_id: str,
        event_id: str,
        content: Any,
        delta: dict[str, Any],
    ) -> tuple[Any, dict[str, Any]]:
        """An event's content and state delta opened from their stored values with
        ``open_(value, associated data)``: a sealed event, an event in format 1 (its content
        and each delta value sealed alone), or plaintext."""
        if type(content) is str and content.startswith(EVENT_PREFIX):
            return event_pair(open_(content, row_aad("event", org_id, session_id, event_id)))
        head = row_aad("delta", org_id, session_id, event_id)
        return (
            open_(content, row_aad("content", org_id, session_id, event_id)),
            {k: open_(v, head + _aad_part(k)) for k, v in delta.items()},
        )

    # -- whole rows ------------------------------------------------------------------------

    def seal_changes(
        self,
        user_key: DataKey,
        app_key: DataKey | None,
        org_id: str,
        session_id: str,
        app_name: str,
        user_id: str,
        delta: ScopedDelta,
    ) -> ScopedDelta:
        """A delta with its set values sealed (deletes and expected values as they were)."""
        app_set = delta.app_set
        if app_set:
            assert app_key is not None
            app_set = self.seal_app(app_key, org_id, app_name, app_set)
        return ScopedDelta(
            self.seal_private(user_key, org_id, session_id, delta.private_set),
            delta.private_deleted,
            self.seal_user(user_key, org_id, app_name, user_id, delta.user_set),
            delta.user_deleted,
            app_set,
            delta.app_deleted,
            delta.user_expected,
            delta.app_expected,
        )

    def seal_event(
        self,
        key: DataKey,
        org_id: str,
        session_id: str,
        event: Event,
        search_terms: str | None = None,
    ) -> SealedEvent:
        """A copy of an event with its content and state delta sealed as one value
        (``seal_event_values``), kept as well, and its blind index text
        (``Sealer.blind_text``)."""
        content: str | None = None
        sealed = _sealed_pair(key, org_id, session_id, event.id, event.content, event.state_delta)
        if sealed is not None:
            content, text = sealed
            opened = key.opened
            if opened is not None and len(content) <= opened.KEEP_VALUE_CHARS:
                opened.keep_events(org_id, session_id, {content: (event.id, text)}, len(content))
        return SealedEvent(
            author=event.author,
            content=content,
            invocation_id=event.invocation_id,
            state_delta={},
            tokens=event.tokens,
            id=event.id,
            timestamp=event.timestamp,
            seq=event.seq,
            search_terms=search_terms,
        )

    def seal_memory(
        self, key: DataKey, index: DataKey, org_id: str, app_name: str, user_id: str, memory: Memory
    ) -> SealedMemory:
        """A memory with its text, content and metadata values sealed (its associated data
        names the owner, the memory id and the field), and its blind index terms."""
        assert memory.id is not None

        def aad(*field: str) -> bytes:
            return row_aad("memory", org_id, app_name, user_id, str(memory.id), *field)

        content = memory.content
        return SealedMemory(
            text=key.seal(memory.text, aad("text")),
            content=None if content is None else key.seal(content, aad("content")),
            author=memory.author,
            timestamp=memory.timestamp,
            id=memory.id,
            metadata={
                k: key.seal(v, aad("metadata", k)) for k, v in (memory.metadata or {}).items()
            },
            session_id=memory.session_id,
            seq=memory.seq,
            search_terms=" ".join(index.term(term) for term in memory_terms(memory.text)),
        )

    def _memory_now(self, org_id: str, app_name: str, user_id: str, memory: Memory) -> Memory:
        open_ = self.sealer.open_row

        def aad(*field: str) -> bytes:
            return row_aad("memory", org_id, app_name, user_id, str(memory.id), *field)

        text = open_(org_id, memory.text, aad("text"))
        if not isinstance(text, str):
            raise DecryptionError(f"the text of memory {memory.id!r} is not a sealed text")
        return Memory(
            text,
            content=open_(org_id, memory.content, aad("content")),
            author=memory.author,
            timestamp=memory.timestamp,
            id=memory.id,
            metadata={
                k: open_(org_id, v, aad("metadata", k)) for k, v in (memory.metadata or {}).items()
            },
            session_id=memory.session_id,
            seq=memory.seq,
        )

    async def open_memory(self, org_id: str, app_name: str, user_id: str, memory: Memory) -> Memory:
        """Return a memory with its text, content and metadata opened (a plain ``Memory``)."""
        return await self.sealer.opening(
            org_id, self._memory_now, org_id, app_name, user_id, memory
        )

    async def open_memories(
        self, org_id: str, app_name: str, user_id: str, memories: list[Memory]
    ) -> list[Memory]:
        """Return memories opened (``open_memory``), in order."""
        now = self._memory_now
        return await self.sealer.opening(
            org_id, lambda: [now(org_id, app_name, user_id, m) for m in memories]
        )

    def _state_now(
        self, org_id: str, session_id: str, app_name: str, user_id: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        open_ = self.sealer.opened.opener(functools.partial(self.sealer.open_missed, org_id))
        # row_aad's parts: each scope's head, then the key (without its prefix).
        org = _aad_part(org_id)
        user = _USER_AAD + org + _aad_part(app_name) + _aad_part(user_id)
        app = _APP_AAD + org + _aad_part(app_name)
        private = _STATE_AAD + org + _aad_part(session_id)
        out: dict[str, Any] = {}
        for k, v in state.items():
            if k.startswith(USER_PREFIX):
                aad = user + _aad_part(k[len(USER_PREFIX) :])
            elif k.startswith(APP_PREFIX):
                aad = app + _aad_part(k[len(APP_PREFIX) :])
            else:
                aad = private + _aad_part(k)
            out[k] = open_(v, aad)
        return out

    async def open_state(
        self, org_id: str, session_id: str, app_name: str, user_id: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        """Open a merged state (private, ``user:`` and ``app:`` keys, told by their prefix)."""
        return await self.sealer.opening(
            org_id, self._state_now, org_id, session_id, app_name, user_id, state
        )

    def _session_now(self, session: Session) -> tuple[str, dict[str, Any]]:
        org, sid = session.org_id, session.id
        title = self._title_now(org, sid, session.title)
        if not session.state:
            return title, session.state
        state = self._state_now(org, sid, session.app_name, session.user_id, session.state)
        return title, state

    async def open_session(self, session: Session) -> Session:
        """Open a session's title and state, in place; return it."""
        opened = await self.sealer.opening(session.org_id, self._session_now, session)
        session.title, session.state = opened
        return session

    def _events_values(self, org_id: str, session_id: str, events: list[Event]) -> list[Any]:
        """Each event's opened ``[content, state_delta]``, in order."""
        # row_aad("event", org, session, event id), from a head that holds the first three.
        head = _EVENT_AAD + _aad_part(org_id) + _aad_part(session_id)
        sealer = self.sealer
        opened, unwrapped, part = sealer.opened, sealer.unwrapped, _aad_part
        kept = opened.events(org_id, session_id)
        # The head of the events the last data key used sealed, and its decryption.
        sealed_by = "\x00"
        decrypt: Callable[[bytes, bytes, bytes], bytes] = _no_decrypt
        a2b, start = binascii.a2b_base64, 0
        # Events opened here, to keep, and their sealed texts' length.
        to_keep: dict[str, _KeptEvent] = {}
        to_keep_size, longest = 0, opened.KEEP_VALUE_CHARS
        # The JSON texts of the events sealed whole, decoded together at the end, and where
        # each goes in ``out``.
        texts: list[str] = []
        slots: list[int] = []
        out: list[Any] = []
        for event in events:
            content = event.content
            if type(content) is not str or not content.startswith(EVENT_PREFIX):
                # Plaintext (written without a keyring), or sealed value by value.
                open_ = functools.partial(sealer.open_row, org_id)
                delta = event.state_delta or {}
                out.append(
                    self.open_stored_event(open_, org_id, session_id, event.id, content, delta)
                )
                continue
            if event.state_delta:
                raise DecryptionError(
                    f"event {event.id!r} of session {session_id!r} was altered: a sealed event "
                    "stores its state delta in its sealed value"
                )
            found = kept.get(content)
            if found is not None and found[0] == event.id:
                text = found[1]
            else:
                if not content.startswith(sealed_by):
                    key = unwrapped(org_id, key_id_of(content))
                    sealed_by, decrypt = key.event_head, key.decrypt
                    start = len(sealed_by)
                try:  # DataKey.open_text, inline: a read opens many events
                    raw = a2b(content[start:])
                    plain = decrypt(raw[:12], raw[12:], head + part(event.id))
                except (InvalidTag, ValueError, binascii.Error):
                    raise DecryptionError(
                        f"event {event.id!r} of session {session_id!r} does not decrypt: it "
                        "was altered, or moved from another row"
                    ) from None
                text = plain.decode("utf-8", "surrogatepass")
                if len(content) <= longest:
                    to_keep[content] = (event.id, text)
                    to_keep_size += len(content)
            slots.append(len(out))
            out.append(None)
            texts.append(text)
        if to_keep:
            opened.keep_events(org_id, session_id, to_keep, to_keep_size)
        if texts:
            for slot, pair in zip(slots, from_json(f"[{','.join(texts)}]"), strict=True):
                out[slot] = pair
        return out

    def _event_now(self, org_id: str, session_id: str, event: Event) -> Event:
        ((content, delta),) = self._events_values(org_id, session_id, [event])
        return _plain_event(event, content, delta)

    async def open_event(self, org_id: str, session_id: str, event: Event) -> Event:
        """Return an event with its content and state delta opened (a plain ``Event``)."""
        return await self.sealer.opening(org_id, self._event_now, org_id, session_id, event)

    def _events_now(self, org_id: str, session_id: str, events: list[Event]) -> list[Event]:
        opened = self._events_values(org_id, session_id, events)
        # Changed only once all are open: a retry (KeyNeeded) reads the stored values again.
        # A stored kind of event (SealedEvent) is given back as a plain Event.
        out = []
        for event, (content, delta) in zip(events, opened, strict=True):
            if type(event) is Event:
                event.content, event.state_delta = content, delta
                out.append(event)
            else:
                out.append(_plain_event(event, content, delta))
        return out

    async def open_events(self, org_id: str, session_id: str, events: list[Event]) -> list[Event]:
        """Return events opened (``open_event``), in order: each plain ``Event`` the caller
        owns (read from the database, or a copy) is opened in place."""
        return await self.sealer.opening(org_id, self._events_now, org_id, session_id, events)


def _sealed_pair(
    key: DataKey, org_id: str, session_id: str, event_id: str, content: Any, delta: Any
) -> tuple[str, str] | None:
    """An event's content and state delta sealed as one value, with the JSON text sealed;
    None for an event with neither."""
    if content is None and not delta:
        return None
    text = to_json([content, delta])
    aad = _EVENT_AAD + _aad_part(org_id) + _aad_part(session_id) + _aad_part(event_id)
    return key.seal_text(text, aad, event=True), text


def event_pair(opened: Any) -> tuple[Any, dict[str, Any]]:
    """A sealed event's opened value as its content and state delta."""
    if type(opened) is not list or len(opened) != 2 or type(opened[1]) is not dict:
        raise DecryptionError("a sealed event does not hold a content and a state delta")
    return opened[0], opened[1]


def _plain_event(event: Event, content: Any, delta: dict[str, Any]) -> Event:
    """A plain ``Event`` with ``event``'s fields, and ``content`` and ``delta`` opened."""
    return Event(
        author=event.author,
        content=content,
        invocation_id=event.invocation_id,
        state_delta=delta,
        tokens=event.tokens,
        id=event.id,
        timestamp=event.timestamp,
        seq=event.seq,
    )
