"""Long-term memory: the ``Memory`` record, its searchable terms and the ranking rule.

A memory belongs to one (organisation, app, user) and outlives the session it came from.
Its *terms* are what a search matches: the words of its text as ``Store.search`` reads
words (``fulltext.words``: runs of letters, digits and marks, case folded, after Unicode
NFC normalisation), except that a run of characters of a script written without spaces
(Chinese, Japanese) gives each pair of neighbouring characters (a lone character gives
itself), so that any two or more characters a query shares with the text find it.

Ranking, the same on every store: a memory's score is the sum, over the query's distinct
terms it holds, of the term's weight ``round(1e6 * idf ** 2)`` with BM25's inverse document
frequency ``idf = ln(1 + (N - n + 0.5) / (n + 0.5))``, where ``N`` is the number of the
user's memories (in that app) and ``n`` the number of them holding the term. Squared, as
each shared term weighs in the dot product of the query's and the memory's tf-idf vectors,
so that a rare word outweighs several common ones ("my", "what", "the"); each shared term
counts once (memories are short: term frequency and length add little). Best first; equal
scores newest first (by the memory's timestamp), then by id (descending, code point order).
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from .errors import InvalidArgumentError
from .fulltext import MAX_TEXT, words
from .jsoncodec import copy_json
from .model import Memory, new_id, utcnow
from .prepare import MAX_LIMIT, check_timestamp
from .state import check_text, checked_copy, validate_id

__all__ = [
    "CANDIDATES",
    "ENOUGH",
    "MAX_QUERY_TERMS",
    "MAX_TERM_BYTES",
    "Memory",
    "MemoryBook",
    "check_memory_search",
    "check_owner",
    "memory_terms",
    "owner_token",
    "prefix_terms",
    "prepare_memories",
    "query_terms",
    "stored_terms",
    "weight",
]

MAX_QUERY_TERMS = 64
"""The most distinct terms of a query searched for: the first ones, in the query's order
(a whole user message works; the words past this are ignored)."""
MAX_QUERY_SCAN = 20_000
"""Characters of a query read for its terms."""
CANDIDATES = (2_000, 20_000)
"""How many memories a search ranks at most in its wider tries (those holding its rarer
terms), before it ranks every memory holding one of its terms."""
ENOUGH = 4
"""A search's first try ranks the memories of its rarest terms until it has this many
times the results it wants."""
MAX_TERM_BYTES = 400_000
"""The most bytes of terms indexed for one memory (a Postgres tsvector holds 1 MB)."""

_SPACELESS = re.compile(
    "[\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c\u3041-\u309f\u30a0-\u30ff"
    "\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003134f]+"
)
"""Runs of Han, Hiragana and Katakana: scripts written without spaces between words."""


def _split(word: str) -> Iterator[str]:
    """A word's terms: itself, or around runs of spaceless scripts, their character pairs."""
    if word.isascii() or not _SPACELESS.search(word):
        yield word
        return
    start = 0
    for run in _SPACELESS.finditer(word):
        if run.start() > start:
            yield word[start : run.start()]
        found = run.group()
        if len(found) == 1:
            yield found
        else:
            yield from (found[i : i + 2] for i in range(len(found) - 1))
        start = run.end()
    if start < len(word):
        yield word[start:]


_OWNER_SHAPED = re.compile("ds[0-9a-f]{30}")
"""What an owner's token looks like: never a term of a text, so that the index holds each
owner's token for that owner's memories alone."""


def memory_terms(text: str) -> list[str]:
    """The distinct terms of a memory's text, in order of first appearance (see the module),
    at most ``MAX_TERM_BYTES`` of them (as UTF-8, with a separator each). A word shaped like
    an owner's token (``owner_token``) is not one of them."""
    if not text.isascii():
        text = unicodedata.normalize("NFC", text[:MAX_TEXT])
    found: dict[str, None] = {}
    size = 0
    for word in words(text[:MAX_TEXT]):
        for term in _split(word):
            if term not in found and not _OWNER_SHAPED.fullmatch(term):
                size += len(term.encode("utf-8")) + 1
                if size > MAX_TERM_BYTES:
                    return list(found)
                found[term] = None
    return list(found)


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query, the first ``MAX_QUERY_TERMS`` of them (any length of
    text works; its first ``MAX_QUERY_SCAN`` characters are read)."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, not {type(text).__name__}")
    cut = text[:MAX_QUERY_SCAN]
    if not cut.isascii():
        cut = unicodedata.normalize("NFC", cut)
    found: dict[str, None] = {}
    for word in words(cut):
        for term in _split(word):
            found[term] = None
            if len(found) == MAX_QUERY_TERMS:
                return list(found)
    return list(found)


def owner_token(org_id: str, app_name: str, user_id: str) -> str:
    """The term every memory of one (organisation, app, user) is indexed under as well, so
    that the full-text index alone finds a user's memories holding a word. A query never
    searches for it (``check_memory_search`` drops it)."""
    key = "\x00".join((org_id, app_name, user_id)).encode("utf-8")
    return "ds" + hashlib.sha256(key).hexdigest()[:30]


def stored_terms(org_id: str, app_name: str, user_id: str, text: str) -> str:
    """The terms column of a memory: its owner's token, then its terms, space-separated."""
    return " ".join([owner_token(org_id, app_name, user_id), *memory_terms(text)])


def weight(total: int, having: int) -> int:
    """The weight of a term ``having`` of the user's ``total`` memories hold (the module's
    rule), as an integer, so that every store sums scores exactly alike."""
    idf = math.log(1 + (total - having + 0.5) / (having + 0.5))
    return round(1e6 * idf * idf)


def prefix_terms(
    weights: Mapping[str, int], held: Mapping[str, int], wanted: int, most: int
) -> list[str]:
    """The rarest terms (heaviest first) whose memories a search ranks first: the rarest
    one, then more while they hold fewer than ``wanted`` memories and together at most
    ``most``."""
    chosen: list[str] = []
    count = 0
    for term in sorted(weights, key=lambda t: (-weights[t], t)):
        if chosen and (count >= wanted or count + held[term] > most):
            break
        chosen.append(term)
        count += held[term]
    return chosen


def check_owner(org_id: str, app_name: str, user_id: str) -> None:
    """Check the ids that name a user's memories (``app_name`` may be empty)."""
    validate_id("org_id", org_id)
    validate_id("app_name", app_name, allow_empty=True)
    validate_id("user_id", user_id)


def check_memory_search(
    org_id: str, app_name: str, user_id: str, text: str, limit: int
) -> list[str]:
    """Check a ``search_memories`` call; return the terms to search for (maybe none)."""
    check_owner(org_id, app_name, user_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    owner = owner_token(org_id, app_name, user_id)
    return [term for term in query_terms(text) if term != owner]


def prepare_memories(memories: Iterable[Memory], max_bytes: int | None = None) -> list[Memory]:
    """Check memories to add and return the copies to store, ids and timestamps filled in.

    Raises:
        InvalidArgumentError: an item is not a ``Memory``, or a field cannot be stored (an
            id, author or session id malformed, a naive or out-of-range timestamp, metadata
            that is not a dict, a ``seq`` that is not a non-negative 64-bit integer, a text
            holding NUL or a lone surrogate), or the same id is given twice.
        InvalidStateError: the content or metadata is not JSON that can be stored.
    """
    if isinstance(memories, (str, bytes, Memory, Mapping)):
        raise InvalidArgumentError("memories must be a list of Memory objects")
    out: list[Memory] = []
    seen: set[str] = set()
    now = utcnow()
    for memory in memories:
        if not isinstance(memory, Memory):
            raise InvalidArgumentError(f"expected a Memory, not {type(memory).__name__}")
        if not isinstance(memory.text, str):
            raise InvalidArgumentError(
                f"memory text must be a string, not {type(memory.text).__name__}"
            )
        problem = check_text(memory.text)
        if problem:
            raise InvalidArgumentError(f"memory text {problem}")
        memory_id = new_id() if memory.id is None else validate_id("memory id", memory.id)
        if memory_id in seen:
            raise InvalidArgumentError(f"memory id {memory_id!r} is given twice")
        seen.add(memory_id)
        if memory.author is not None:
            validate_id("memory author", memory.author, allow_empty=True)
        if memory.session_id is not None:
            validate_id("memory session_id", memory.session_id)
        seq = memory.seq
        if seq is not None and (
            isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_LIMIT
        ):
            raise InvalidArgumentError(f"memory seq must be an integer from 0 to {MAX_LIMIT}")
        stamp = (
            now
            if memory.timestamp is None
            else check_timestamp("memory timestamp", memory.timestamp)
        )
        metadata = {} if memory.metadata is None else memory.metadata
        if not isinstance(metadata, dict):
            raise InvalidArgumentError("memory metadata must be a dict")
        out.append(
            Memory(
                memory.text,
                content=checked_copy("<memory content>", memory.content, max_bytes),
                author=memory.author,
                timestamp=stamp,
                id=memory_id,
                metadata=checked_copy("<memory metadata>", metadata, max_bytes),
                session_id=memory.session_id,
                seq=seq,
            )
        )
    return out


def copy_memory(memory: Memory) -> Memory:
    """A copy that shares no mutable value with ``memory``."""
    return replace(memory, content=copy_json(memory.content), metadata=copy_json(memory.metadata))


class _Owner:
    """One user's memories in one app, with an inverted index of their terms."""

    __slots__ = ("index", "memories")

    def __init__(self) -> None:
        self.memories: dict[str, tuple[Memory, frozenset[str]]] = {}
        self.index: dict[str, set[str]] = {}


class MemoryBook:
    """Memories kept in this process (``InMemoryStore``'s), searched by the module's rule."""

    def __init__(self) -> None:
        self._owners: dict[tuple[str, str, str], _Owner] = {}

    def add(self, key: tuple[str, str, str], memories: list[Memory]) -> list[Memory]:
        """Store the prepared ``memories`` whose id the owner does not have; return them."""
        owner = self._owners.setdefault(key, _Owner())
        added = []
        for memory in memories:
            assert memory.id is not None
            if memory.id in owner.memories:
                continue
            # An encrypted store's memory carries its blind index terms (``sealing``).
            blind = getattr(memory, "search_terms", None)
            terms = frozenset(memory_terms(memory.text) if blind is None else blind.split())
            owner.memories[memory.id] = (copy_memory(memory), terms)
            for term in terms:
                owner.index.setdefault(term, set()).add(memory.id)
            added.append(copy_memory(memory))
        return added

    def search(self, key: tuple[str, str, str], terms: list[str], limit: int) -> list[Memory]:
        """The owner's best ``limit`` memories for ``terms`` (the module's ranking)."""
        owner = self._owners.get(key)
        if owner is None or not terms:
            return []
        total = len(owner.memories)
        scores: dict[str, int] = {}
        for term in terms:
            having = owner.index.get(term)
            if having:
                w = weight(total, len(having))
                for memory_id in having:
                    scores[memory_id] = scores.get(memory_id, 0) + w
        ranked = sorted(
            (
                (score, owner.memories[memory_id][0].timestamp, memory_id)
                for memory_id, score in scores.items()
            ),
            reverse=True,
        )
        return [copy_memory(owner.memories[memory_id][0]) for *_, memory_id in ranked[:limit]]

    def delete(self, key: tuple[str, str, str], memory_id: str | None) -> int:
        """Delete one of the owner's memories (or all of them); return how many went."""
        owner = self._owners.get(key)
        if owner is None:
            return 0
        if memory_id is None:
            del self._owners[key]
            return len(owner.memories)
        found = owner.memories.pop(memory_id, None)
        if found is None:
            return 0
        for term in found[1]:
            having = owner.index[term]
            having.discard(memory_id)
            if not having:
                del owner.index[term]
        return 1

    def delete_user(self, org_id: str, user_id: str, *, dry_run: bool = False) -> int:
        """Delete the user's memories in every app of the organisation; return how many."""
        keys = [k for k in self._owners if k[0] == org_id and k[2] == user_id]
        count = sum(len(self._owners[k].memories) for k in keys)
        if not dry_run:
            for key in keys:
                del self._owners[key]
        return count

    def owners(self) -> Iterator[tuple[tuple[str, str, str], _Owner]]:
        """Every (organisation, app, user) with memories, and its memories and index (an
        encrypted store's ``reencrypt`` seals them again in place)."""
        yield from self._owners.items()

    def items(self, org_id: str) -> Iterator[tuple[str, str, Memory]]:
        """Every memory of the organisation, as (app, user, memory) copies, by key."""
        for key in sorted(k for k in self._owners if k[0] == org_id):
            owner = self._owners[key]
            for memory_id in sorted(owner.memories):
                yield key[1], key[2], copy_memory(owner.memories[memory_id][0])
