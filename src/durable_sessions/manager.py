"""Manager: create, resolve, save and bind sessions for an application."""

from __future__ import annotations

import builtins
from collections.abc import Generator
from contextvars import Token
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from .context import Binding, bind_session, reset_binding
from .errors import SessionExistsError, SessionNotFoundError
from .model import Event, Filter, Page, Session, derive_title, new_id, utcnow
from .state import validate_id
from .store import Store

__all__ = ["Manager", "Resume"]

_GET_OR_CREATE_ATTEMPTS = 5
"""Reads and creates ``get_or_create`` tries while other callers delete and create the id."""


class Resume:
    """The result of ``Manager.resume``: await it, or use it as an ``async with`` block.

    ``session = await manager.resume(org, id)`` binds the session in the calling task's
    context until the task ends or something else is bound. ``async with manager.resume(org,
    id) as session:`` binds it for the block only and restores the outer binding on exit.
    """

    def __init__(self, manager: Manager, org_id: str, session_id: str) -> None:
        self._manager = manager
        self._org_id = org_id
        self._session_id = session_id
        self._tokens: tuple[Token[str | None], Token[str | None]] | None = None

    async def _resume(self) -> Session:
        session = await self._manager.get(self._org_id, self._session_id)
        bind_session(session)
        return session

    def __await__(self) -> Generator[Any, None, Session]:
        return self._resume().__await__()

    async def __aenter__(self) -> Session:
        session = await self._manager.get(self._org_id, self._session_id)
        self._tokens = bind_session(session)
        return session

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tokens, self._tokens = self._tokens, None
        if tokens is not None:
            reset_binding(tokens)


class Manager:
    """Creates and resolves sessions of one application, and binds them to the context.

    The organisation (``org_id``) is the isolation boundary: no call reads or writes across
    organisations, and an id is unique within one. ``app_name`` is not a boundary: it is
    stamped on the sessions this manager creates (and so scopes their ``app:`` state), but
    ``get``, ``resume``, ``save``, ``delete``, ``fork`` and the rest reach any session of
    the organisation by its id, whatever app created it, and ``list`` filters by app only
    when ``filter.app_name`` says so. Give tenants that must not see each other different
    organisations (see ``docs/concepts/tenancy.md``).

    Args:
        store: Where sessions live (``InMemoryStore``, ``SQLStore``, or your own ``Store``).
        app_name: The application; it scopes ``app:`` state and is stamped on new sessions.
    """

    def __init__(self, store: Store, *, app_name: str = "") -> None:
        self.store = store
        self.app_name = validate_id("app_name", app_name, allow_empty=True)

    async def create(
        self,
        org_id: str,
        user_id: str,
        *,
        state: dict[str, Any] | None = None,
        id: str | None = None,
        title: str = "",
    ) -> Session:
        """Create and store a new session for a user, with optional initial state.

        Raises:
            SessionExistsError: ``id`` is taken in the organisation.
            InvalidArgumentError: ``title`` is longer than 1,024 UTF-8 bytes
                (``prepare.MAX_TITLE_BYTES``).
            InvalidStateError: ``state`` holds something that cannot be stored.
        """
        session = Session(
            id=new_id() if id is None else id,
            org_id=org_id,
            user_id=user_id,
            app_name=self.app_name,
            title=title,
            state=dict(state or {}),
        )
        return await self.store.create(session)

    async def get(self, org_id: str, id: str) -> Session:
        """Return a stored session, without binding it.

        Raises:
            SessionNotFoundError: no such session in the organisation.
        """
        return await self.store.get(org_id, id)

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return sessions matching ``filter``, most recently updated first, without state."""
        return await self.store.list(filter)

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Page:
        """Return one page of ``list``: ``filter.limit`` sessions (100 when it is 0) after
        ``cursor``, and the ``next_cursor`` (None after the last page); see ``Store``.

        Raises:
            InvalidArgumentError: ``cursor`` is not a ``next_cursor`` of this listing.
        """
        return await self.store.list_page(filter, cursor=cursor)

    async def delete(self, org_id: str, id: str) -> None:
        """Delete a session with its private state and transcript.

        Raises:
            SessionNotFoundError: no such session in the organisation.
        """
        await self.store.delete(org_id, id)

    async def fork(self, org_id: str, id: str, *, with_events: bool = False) -> Session:
        """Start a new session from another's private state, leaving the parent untouched.

        The child records the parent in ``parent_id`` and ``state["forked_from"]``; ``user:``
        and ``app:`` state stay shared. With ``with_events`` the transcript is copied too.

        Raises:
            SessionNotFoundError: no such parent in the organisation.
        """
        return await self.store.fork(org_id, id, with_events=with_events)

    def resume(self, org_id: str, id: str) -> Resume:
        """Load a session and bind it: ``await`` it, or use it as an ``async with`` block.

        Raises:
            SessionNotFoundError: no such session in the organisation (when awaited/entered).
        """
        return Resume(self, org_id, id)

    async def save(self, session: Session) -> Session:
        """Write the session's title and the state it changed since it was read.

        Raises:
            StaleSessionError: the stored session changed since this copy was read, was
                deleted and created again, or a ``user:``/``app:`` key this copy deletes
                holds another value than the one read; nothing is written.
            InvalidStateError: a changed value cannot be stored; nothing is written.
        """
        return await self.store.update(session)

    async def touch(
        self,
        session: Session,
        messages: int = 1,
        tokens: int = 0,
        first_message: str = "",
    ) -> Session:
        """Record activity: add to the counters atomically and title an untitled session.

        The session object is updated in place with the stored counters and title. Its
        version moves on by one, so a save of this copy still detects anyone else's change.

        Raises:
            StaleSessionError: the session was deleted and its id created again since this
                copy was read; nothing is written.
            SessionNotFoundError: the session no longer exists.
        """
        title = derive_title(first_message) if first_message and not session.title else ""
        stored = await self.store.touch(
            session.org_id,
            session.id,
            messages=messages,
            tokens=tokens,
            title=title,
            incarnation=session.incarnation,
        )
        session.message_count = stored.message_count
        session.token_total = stored.token_total
        if not session.title:  # a title set on this object and not yet saved stays
            session.title = stored.title
        session.updated_at = stored.updated_at
        session.version += 1
        return session

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append an event to a session's transcript and apply its state delta.

        An event with a ``state_delta`` is appended only if ``session`` is current: the
        stored session has not changed since this copy was read (its version), as ``save``
        requires, so a delta computed from stale state never overwrites a newer change. An
        event without a delta changes no state and is appended from any copy of the same
        life of the id (counters are added in place, never lost).

        The session object is updated in place: counters, version and the delta (``temp:``
        keys included, visible until the object is dropped but never stored). When the
        delta is computed from the state, reload and retry on a conflict::

            while True:
                session = await manager.get_or_create(org_id, user_id, session_id)
                turns = session.get("turns", 0) + 1
                try:
                    await manager.append_event(
                        session, Event("agent", content=reply, state_delta={"turns": turns})
                    )
                    break
                except StaleSessionError:
                    continue  # another writer moved the session on: read it again

        Raises:
            StaleSessionError: the event has a ``state_delta`` and the stored session changed
                since this copy was read, or the session was deleted and its id created
                again since; nothing is written.
            SessionNotFoundError: the session no longer exists.
        """
        expected = session.version if event.state_delta else None
        stored = await self.store.append_event(
            session.org_id,
            session.id,
            event,
            expected_version=expected,
            incarnation=session.incarnation,
        )
        session.apply_appended(event)
        return stored

    async def get_or_create(
        self,
        org_id: str,
        user_id: str,
        id: str,
        *,
        state: dict[str, Any] | None = None,
        title: str = "",
    ) -> Session:
        """Return the session ``id``, creating it for ``user_id`` (with ``state`` and
        ``title``) when there is none.

        Creators that race on one id all get the one session that was created: a
        ``SessionExistsError`` of the losing ``create`` is never raised, the winner's
        session is read instead. ``state`` and ``title`` apply only to a session this call
        creates. The session found must be of ``user_id`` and of this manager's
        ``app_name``: another user's or app's session under that id is not returned.

        Raises:
            SessionExistsError: ``id`` names a session of another user or app in the
                organisation.
            SessionNotFoundError: other callers deleted the session each time it was
                created or read, five times in a row.
            InvalidStateError: ``state`` holds something that cannot be stored.
        """
        for _ in range(_GET_OR_CREATE_ATTEMPTS):
            try:
                found = await self.store.get(org_id, id)
            except SessionNotFoundError:
                try:
                    return await self.create(org_id, user_id, state=state, id=id, title=title)
                except SessionExistsError:
                    continue  # another creator won: read its session
            if (found.user_id, found.app_name) != (user_id, self.app_name):
                raise SessionExistsError(org_id, id)
            return found
        # Created and deleted again between each read and create: what is there now.
        return await self.store.get(org_id, id)

    async def list_events(
        self,
        org_id: str,
        id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
        after_seq: int | None = None,
    ) -> builtins.list[Event]:
        """Return a session's transcript, oldest first (the newest ``limit``, later than
        ``after``; with ``after_seq``, the oldest ``limit`` events after that seq).

        Raises:
            SessionNotFoundError: no such session in the organisation.
        """
        return await self.store.list_events(
            org_id, id, limit=limit, after=after, after_seq=after_seq
        )

    def bind(self, session: Session) -> Binding:
        """Bind a session's org and conversation ids for a ``with`` block."""
        return Binding(session)

    async def purge(self, org_id: str, *, older_than: timedelta, dry_run: bool = False) -> int:
        """Delete the organisation's sessions not updated within ``older_than``.

        Returns:
            How many sessions were deleted (with ``dry_run``, how many would be).
        """
        return await self.store.purge(org_id, older_than=older_than, dry_run=dry_run)

    async def delete_user(self, org_id: str, user_id: str, *, dry_run: bool = False) -> int:
        """Erase a user's sessions, transcripts and ``user:`` state; return the sessions
        deleted (with ``dry_run``, how many would be)."""
        return await self.store.delete_user(org_id, user_id, dry_run=dry_run)

    async def truncate_events(self, session: Session, after_seq: int) -> builtins.list[Event]:
        """Remove the session's events after ``after_seq``; return them, oldest first.

        A rewind: the next event appended gets ``after_seq + 1``. The session object is
        updated in place: counters go down by what the removed events added, and its version
        moves on by one. State the removed events set stays (append a reversing event to
        undo it). ``after_seq=0`` clears the transcript.

        Raises:
            StaleSessionError: the session was deleted and its id created again since this
                copy was read; nothing is removed.
            SessionNotFoundError: the session no longer exists.
            InvalidArgumentError: ``after_seq`` is not an integer from 0 to 2**63 - 1.
        """
        removed = await self.store.truncate_events(
            session.org_id, session.id, after_seq=after_seq, incarnation=session.incarnation
        )
        session.message_count = max(0, session.message_count - len(removed))
        session.token_total = max(0, session.token_total - sum(e.tokens for e in removed))
        session.updated_at = utcnow()
        session.version += 1
        return removed
