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

A session belongs to the app and user that created it: a ``DurableSession`` of another app
or user naming the same id in the same organisation never reads, changes or clears it
(reads find nothing, ``add_items`` raises ``SessionExistsError``).

Requires the ``openai-agents`` extra: ``pip install "durable-sessions[openai-agents]"``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

try:
    from agents.items import TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "durable_sessions.openai_agents needs the OpenAI Agents SDK, which is not installed: "
        f'pip install "durable-sessions[openai-agents]" ({exc})'
    ) from exc

from ..context import current_org_id
from ..errors import (
    InvalidArgumentError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
)
from ..jsoncodec import loads_json
from ..model import Event, Session, derive_title
from ..prepare import MAX_INCREMENT
from ..state import MAX_ID_BYTES, MAX_ID_LENGTH, validate_id
from ..store import Store, check_after_seq

__all__ = ["DurableSession"]

T = TypeVar("T")

_ATTEMPTS = 3
"""How many lives of one id a write looks at before it gives up (each attempt follows a
delete and re-create of the id between this object's look and its write)."""

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
    return _to_item_of(event.author, event.content)


def _to_item_of(author: str, content: Any) -> TResponseInputItem:
    """The item of an event's author and content; another writer's event (its content not
    an object) becomes a message."""
    if isinstance(content, dict):
        return content  # type: ignore[return-value]
    return _foreign_item(content, "user" if author == "user" else "assistant")


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

    The session belongs to ``(app_name, user_id)``: the first write creates it for them.
    Session ids are unique per organisation, so another app or user naming the same id
    never reaches it: its reads find no items (``get_items`` is empty, ``info`` None,
    ``pop_item`` None, ``rewind`` and ``clear_session`` remove nothing) and its
    ``add_items`` raises ``SessionExistsError``. Writes carry the life of the session
    this object checked (``Session.incarnation``), so a session deleted and created again
    by someone else meanwhile is checked again, never written into; the first write of an
    object reads the session once to check it.

    Args:
        session_id: The conversation id: the durable session's id.
        store: Where sessions live: ``InMemoryStore``, ``SQLStore`` or any ``Store``.
        org_id: The organisation. When None, each call uses the organisation bound in its
            context (``current_org_id()``), so one object can serve many tenants.
        app_name: The app the session belongs to (listing, ``app:`` state).
        user_id: The user the session belongs to (listing, ``user:`` state).
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
        # The (organisation, incarnation) of the session last checked to be this owner's.
        self._checked: tuple[str, str] | None = None

    def _org(self) -> str:
        """The organisation of this call.

        Raises:
            MissingScopeError: no org id was given and none is bound in the context.
        """
        return self._org_id if self._org_id is not None else current_org_id()

    def _owns(self, stored: Session) -> bool:
        """Whether a stored session is this object's (app, user)'s; remember its life."""
        if stored.app_name != self.app_name or stored.user_id != self.user_id:
            return False
        self._checked = (stored.org_id, stored.incarnation)
        return True

    def _refused(self, org_id: str) -> SessionExistsError:
        return SessionExistsError(
            org_id,
            self.session_id,
            f"for another app or user, not user {self.user_id!r} of app {self.app_name!r} "
            "(session ids are unique per organisation: choose another id)",
        )

    async def _life(self, org_id: str, *, writing: bool = False) -> str | None:
        """The incarnation of this owner's session, or None when there is none (or, unless
        ``writing``, when it is another's).

        Raises:
            SessionExistsError: ``writing``, and the id is another app's or user's.
        """
        if self._checked is not None and self._checked[0] == org_id:
            return self._checked[1]
        try:
            stored = await self.store.get(org_id, self.session_id)
        except SessionNotFoundError:
            return None
        if self._owns(stored):
            return stored.incarnation
        if writing:
            raise self._refused(org_id)
        return None

    async def _on_own(self, write: Callable[[str, str], Awaitable[T]], missing: T) -> T:
        """Run ``write(org_id, incarnation)`` on this owner's session; ``missing`` when
        there is none, or it is another's."""
        org_id = self._org()
        for attempt in range(_ATTEMPTS):
            life = await self._life(org_id)
            if life is None:
                return missing
            try:
                return await write(org_id, life)
            except SessionNotFoundError:
                self._checked = None
                return missing
            except StaleSessionError:  # another life of the id: look at it
                self._checked = None
                if attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("the last attempt returns or raises")  # pragma: no cover

    # -- the SDK's Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the conversation's items, oldest first; with ``limit``, the newest ``limit``.

        Without ``limit``, ``session_settings.limit`` applies. One read of the store, which
        returns the session's owner with its items: another app's or user's session under
        this id reads as empty.

        Raises:
            InvalidArgumentError: ``limit`` is negative.
        """
        limit = resolve_session_limit(limit, self.session_settings)
        try:
            stored, text = await self.store.get_with_events_json(
                self._org(), self.session_id, limit=limit
            )
        except SessionNotFoundError:
            return []
        if not self._owns(stored):
            return []
        # [seq, id, author, invocation_id, content, ...]: an item is its event's content;
        # another writer's event (not an item) becomes a message of its author's role.
        items: list[Any] = [
            row[4] if type(row[4]) is dict else _to_item_of(row[2], row[4])
            for row in loads_json(text)
        ]
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items, all or nothing, in order and next to each other.

        The first write creates the durable session. A session without a title (its first
        items held no user message) is titled from the first user message added later, by
        whichever object adds it, in the same write.

        Raises:
            InvalidStateError: an item cannot be stored (e.g. NUL characters, or larger
                than the store's ``max_value_bytes``); nothing is written.
            SessionExistsError: the id is another app's or user's session; nothing is
                written.
        """
        if not items:
            return
        org_id = self._org()
        events = [_to_event(item) for item in items]
        title = _title(items)
        for attempt in range(_ATTEMPTS):
            life = await self._life(org_id, writing=True)
            if life is None:
                life = await self._create(org_id, title)
                if life is None:  # another writer's first write came first: look at it
                    continue
            try:
                await self.store.append_events(
                    org_id, self.session_id, events, title=title, incarnation=life
                )
                return
            except (SessionNotFoundError, StaleSessionError):
                # Deleted, or deleted and created again, since this object looked.
                self._checked = None
                if attempt == _ATTEMPTS - 1:
                    raise
        raise SessionNotFoundError(org_id, self.session_id)  # created and deleted each time

    async def _create(self, org_id: str, title: str) -> str | None:
        """Create the session for this owner; return its incarnation, or None when the id
        was taken meanwhile."""
        record = Session(
            id=self.session_id,
            org_id=org_id,
            user_id=self.user_id,
            app_name=self.app_name,
            title=title,
        )
        try:
            created = await self.store.create(record)
        except SessionExistsError:
            return None
        self._checked = (org_id, created.incarnation)
        return created.incarnation

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or None when there is none.

        One store call (``Store.pop_event``): the newest item is found and removed in the
        same atomic operation, so a concurrent append is never removed in its place, and
        two concurrent pops each remove an item of their own.
        """

        async def pop(org_id: str, life: str) -> Event | None:
            return await self.store.pop_event(org_id, self.session_id, incarnation=life)

        removed = await self._on_own(pop, None)
        return None if removed is None else _to_item(removed)

    async def clear_session(self) -> None:
        """Remove every item; the durable session (title, state, id) stays.

        The items are removed without being read (``Store.discard_events``): clearing a
        transcript of any length takes no memory in proportion to it.
        """

        async def clear(org_id: str, life: str) -> int:
            return await self.store.discard_events(
                org_id, self.session_id, after_seq=0, incarnation=life
            )

        await self._on_own(clear, 0)

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

        async def cut(org_id: str, life: str) -> list[Event]:
            return await self.store.truncate_events(
                org_id, self.session_id, after_seq=keep, incarnation=life
            )

        nothing: list[Event] = []
        return [_to_item(event) for event in await self._on_own(cut, nothing)]

    async def fork(self, new_session_id: str | None = None) -> DurableSession:
        """Branch the conversation: a new session holding a copy of the items so far.

        The branch records this session as its parent (``parent_id``); the two go on
        independently. It keeps this object's organisation, app, user and settings.

        Raises:
            SessionNotFoundError: this session has not been written yet (or is another
                app's or user's).
            SessionExistsError: ``new_session_id`` is taken.
        """
        org_id = self._org()
        if await self._life(org_id) is None:
            raise SessionNotFoundError(org_id, self.session_id)
        child = await self.store.fork(
            org_id, self.session_id, new_session_id=new_session_id, with_events=True
        )
        if child.app_name != self.app_name or child.user_id != self.user_id:
            # The id was deleted and taken by another owner between the look and the fork:
            # their copy is not this owner's to keep.
            self._checked = None
            with contextlib.suppress(SessionNotFoundError):
                await self.store.delete(org_id, child.id)
            raise SessionNotFoundError(org_id, self.session_id)
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
        first write (or when the id is another app's or user's)."""
        try:
            stored = await self.store.get(self._org(), self.session_id)
        except SessionNotFoundError:
            return None
        return stored if self._owns(stored) else None

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

        async def touch(org_id: str, life: str) -> Session:
            return await self.store.touch(org_id, self.session_id, tokens=tokens, incarnation=life)

        await self._on_own(touch, None)
