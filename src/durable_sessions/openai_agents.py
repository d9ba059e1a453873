"""The OpenAI Agents SDK's ``Session`` over any durable-sessions ``Store``.

Give the SDK's Runner a ``DurableSession`` where it takes a session::

    from durable_sessions import SQLStore
    from durable_sessions.openai_agents import DurableSession

    store = SQLStore(engine)  # a migrated database: await store.migrate() once
    session = DurableSession("conversation-123", store, org_id="acme", user_id="alice")
    result = await Runner.run(agent, "Hello", session=session)

Each SDK item is one event of the durable session, its JSON kept as the event's
``content`` (read back equal, numbers with their types and objects with their keys in the
order given; on Postgres, items stored before revision 0007 come back with their keys in
jsonb's order). The session is created on its first write, titled from its
first user message, with the library's counters (``message_count`` counts items), tenants,
listing (``Manager.list``), forks, rewinds and retention. Beyond the SDK's protocol:
``fork`` (a branch of the conversation), ``rewind`` (keep the first N items),
``store_run_usage`` (a run's tokens into ``token_total``) and ``info`` (title and counters).

Requires the ``openai-agents`` extra: ``pip install "durable-sessions[openai-agents]"``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from itertools import repeat
from typing import Any

try:
    from agents.items import TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "durable_sessions.openai_agents needs the OpenAI Agents SDK, which is not installed: "
        f'pip install "durable-sessions[openai-agents]" ({exc})'
    ) from exc

from .context import current_org_id
from .errors import InvalidArgumentError, SessionExistsError, SessionNotFoundError
from .model import Event, Session, derive_title
from .prepare import MAX_INCREMENT
from .state import MAX_ID_BYTES, MAX_ID_LENGTH, validate_id
from .store import Store, check_after_seq

__all__ = ["DurableSession"]

_ITEM = "item"
"""The author of an item that has neither a role nor a type."""


_ASCII_AUTHOR = min(MAX_ID_LENGTH, MAX_ID_BYTES)
"""The longest ASCII role or type that is an author as it is (one byte a character)."""


def _author(item: Mapping[str, Any]) -> str:
    """The event author of an item: its role (messages), else its type, where that is a
    valid author (else ``"item"``: a role with a NUL is refused with the item's content)."""
    for key in ("role", "type"):
        value = item.get(key)
        if (
            type(value) is str
            and value.isascii()
            and 0 < len(value) <= _ASCII_AUTHOR
            and "\x00" not in value
        ):
            return value  # the usual case, under both limits at once
        if isinstance(value, str) and value:
            try:
                return validate_id("author", value)
            except InvalidArgumentError:
                continue
    return _ITEM


def _tokens(item: Mapping[str, Any]) -> int:
    """The tokens an item reports in a ``usage`` of its own (at most ``MAX_INCREMENT``, the
    most one event counts), else 0."""
    usage = item.get("usage")
    if usage is not None and isinstance(usage, Mapping):
        total = usage.get("total_tokens")
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return min(total, MAX_INCREMENT)
    return 0


def _user_text(item: Mapping[str, Any]) -> str:
    """The text of a user message item, or "" for any other item."""
    if item.get("role") != "user":
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def _title(items: list[TResponseInputItem]) -> str:
    """A title from the first user message with text among ``items``, or ""."""
    for item in items:
        text = _user_text(item) if isinstance(item, Mapping) else ""
        if text.strip():
            return derive_title(text)
    return ""


def _to_event(item: TResponseInputItem) -> Event:
    """The durable event that stores an item, as its JSON."""
    if type(item) is not dict and not isinstance(item, Mapping):
        raise TypeError(f"session items are JSON objects (dicts), not {type(item).__name__}")
    return Event(author=_author(item), content=item, tokens=_tokens(item))


def _to_item(event: Event) -> TResponseInputItem:
    """The item an event holds; another writer's event becomes a message."""
    content = event.content
    if isinstance(content, dict):
        return content  # type: ignore[return-value]
    return _foreign_item(content, "user" if event.author == "user" else "assistant")


def _foreign_item(content: Any, role: str = "assistant") -> TResponseInputItem:
    """A message holding the content of an event another writer appended (not an item)."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return {"role": role, "content": text}  # type: ignore[return-value,misc]


class DurableSession(SessionABC):
    """The SDK's ``Session`` protocol on a durable-sessions ``Store``.

    Every operation is one store call, atomic on every store: ``get_items`` is one read,
    ``add_items`` appends its whole batch with consecutive positions (concurrent calls
    never interleave inside a batch and never lose an item), ``pop_item`` finds and removes
    the newest item in one atomic step (never an item appended meanwhile in its place),
    ``clear_session`` empties the transcript and keeps the session (its title, counters'
    history and state).

    Args:
        session_id: The conversation id: the durable session's id.
        store: Where sessions live: ``InMemoryStore``, ``SQLStore`` or any ``Store``.
        org_id: The organisation. When None, each call uses the organisation bound in its
            context (``current_org_id()``), so one object can serve many tenants.
        app_name: Stamped on the session when it is created (listing, ``app:`` state).
        user_id: Stamped on the session when it is created (listing, ``user:`` state).
        session_settings: The SDK's settings; ``limit`` is the default of ``get_items``.

    Raises:
        InvalidArgumentError: an id is empty or malformed.
    """

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        org_id: str | None = "default",
        app_name: str = "openai-agents",
        user_id: str = "default",
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = validate_id("session_id", session_id)
        self.store = store
        self._org_id = None if org_id is None else validate_id("org_id", org_id)
        self.app_name = validate_id("app_name", app_name, allow_empty=True)
        self.user_id = validate_id("user_id", user_id)
        self.session_settings = session_settings or SessionSettings()

    def _org(self) -> str:
        """The organisation of this call.

        Raises:
            MissingScopeError: no org id was given and none is bound in the context.
        """
        return self._org_id if self._org_id is not None else current_org_id()

    # -- the SDK's Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the conversation's items, oldest first; with ``limit``, the newest ``limit``.

        Without ``limit``, ``session_settings.limit`` applies. One read of the store.

        Raises:
            InvalidArgumentError: ``limit`` is negative.
        """
        limit = resolve_session_limit(limit, self.session_settings)
        try:
            contents = await self.store.list_event_contents(
                self._org(), self.session_id, limit=limit
            )
        except SessionNotFoundError:
            return []
        if all(map(isinstance, contents, repeat(dict))):  # items only, as this adapter stores
            return contents
        # Another writer's events among them: read the events, whose authors say the role
        # of each one's message (as pop_item and rewind map them).
        try:
            events = await self.store.list_events(self._org(), self.session_id, limit=limit)
        except SessionNotFoundError:
            return []
        return [_to_item(event) for event in events]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items, all or nothing, in order and next to each other.

        The first write creates the durable session. A session without a title (its first
        items held no user message) is titled from the first user message added later, by
        whichever object adds it, in the same write.

        Raises:
            InvalidStateError: an item cannot be stored (e.g. NUL characters, or larger
                than the store's ``max_value_bytes``); nothing is written.
        """
        if not items:
            return
        org_id = self._org()
        events = [_to_event(item) for item in items]
        title = _title(items)
        try:
            await self.store.append_events(org_id, self.session_id, events, title=title)
        except SessionNotFoundError:
            await self._create(org_id, title)
            await self.store.append_events(org_id, self.session_id, events, title=title)

    async def _create(self, org_id: str, title: str) -> None:
        record = Session(
            id=self.session_id,
            org_id=org_id,
            user_id=self.user_id,
            app_name=self.app_name,
            title=title,
        )
        with contextlib.suppress(SessionExistsError):  # another writer's first write came first
            await self.store.create(record)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or None when there is none.

        One store call (``Store.pop_event``): the newest item is found and removed in the
        same atomic operation, so a concurrent append is never removed in its place, and
        two concurrent pops each remove an item of their own.
        """
        try:
            removed = await self.store.pop_event(self._org(), self.session_id)
        except SessionNotFoundError:
            return None
        return None if removed is None else _to_item(removed)

    async def clear_session(self) -> None:
        """Remove every item; the durable session (title, state, id) stays."""
        with contextlib.suppress(SessionNotFoundError):
            await self.store.truncate_events(self._org(), self.session_id, after_seq=0)

    # -- beyond the SDK ------------------------------------------------------------------------

    async def rewind(self, keep: int) -> list[TResponseInputItem]:
        """Keep the first ``keep`` items; remove the later ones and return them, oldest first.

        Item ``n`` (1-based, as ``get_items()`` lists them) is the transcript's event
        ``seq == n``, so ``rewind(len(items) - 2)`` undoes the last two items and the next
        item added takes position ``keep + 1``.

        Raises:
            InvalidArgumentError: ``keep`` is negative (the store says ``after_seq``).
        """
        check_after_seq(keep)
        try:
            removed = await self.store.truncate_events(self._org(), self.session_id, after_seq=keep)
        except SessionNotFoundError:
            return []
        return [_to_item(event) for event in removed]

    async def fork(self, new_session_id: str | None = None) -> DurableSession:
        """Branch the conversation: a new session holding a copy of the items so far.

        The branch records this session as its parent (``parent_id``); the two go on
        independently. It keeps this object's organisation, app, user and settings.

        Raises:
            SessionNotFoundError: this session has not been written yet.
            SessionExistsError: ``new_session_id`` is taken.
        """
        child = await self.store.fork(
            self._org(), self.session_id, new_session_id=new_session_id, with_events=True
        )
        return DurableSession(
            child.id,
            self.store,
            org_id=self._org_id,
            app_name=child.app_name,
            user_id=child.user_id,
            session_settings=self.session_settings,
        )

    async def info(self) -> Session | None:
        """Return the durable session (title, counters, parent, state), or None before the
        first write."""
        try:
            return await self.store.get(self._org(), self.session_id)
        except SessionNotFoundError:
            return None

    async def store_run_usage(self, result: Any) -> None:
        """Add a run's tokens (``result.context_wrapper.usage.total_tokens``) to the
        session's ``token_total``, as the SDK's ``AdvancedSQLiteSession`` records usage.

        Takes a ``RunResult`` or a ``Usage``. These tokens belong to no item, so a rewind
        does not take them off again. Does nothing before the session's first write.
        """
        usage = getattr(getattr(result, "context_wrapper", None), "usage", result)
        tokens = int(getattr(usage, "total_tokens", 0) or 0)
        if tokens <= 0:
            return
        with contextlib.suppress(SessionNotFoundError):
            await self.store.touch(self._org(), self.session_id, tokens=tokens)
