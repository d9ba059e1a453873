"""The ``Store`` protocol every session store implements."""

from __future__ import annotations

import builtins
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from .errors import InvalidArgumentError
from .model import Event, Filter, Memory, Page, SearchHit, Session
from .state import MAX_INT64

__all__ = ["Store", "check_after_seq"]


def check_after_seq(after_seq: int) -> int:
    """Check the ``after_seq`` of a transcript truncation: an integer from 0 to 2**63 - 1.

    Every store calls this, so the same bad value gets the same error everywhere.
    """
    if (
        isinstance(after_seq, bool)
        or not isinstance(after_seq, int)
        or not 0 <= after_seq <= MAX_INT64
    ):
        raise InvalidArgumentError(f"after_seq must be an integer from 0 to {MAX_INT64}")
    return after_seq


@runtime_checkable
class Store(Protocol):
    """Persists sessions, their scoped state and their transcripts.

    Every method takes the organisation id first and never reads or writes another
    organisation's data. Sessions returned are copies: changing them changes nothing stored
    until they are passed to ``update``. Stores keep no cross-process cache.
    """

    async def create(self, session: Session) -> Session:
        """Store a new session and its initial state; fill in its timestamps and version.

        Raises:
            SessionExistsError: the id is taken in that organisation.
            InvalidArgumentError: an id is malformed, or the title is longer than
                ``prepare.MAX_TITLE_BYTES`` (1,024) UTF-8 bytes.
            InvalidStateError: the state holds a key or value that cannot be stored.
        """
        ...

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a session with its private and shared state merged into ``state``.

        Raises:
            SessionNotFoundError: no such session in that organisation.
        """
        ...

    async def get_with_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> Session:
        """Return a session as ``get`` does, with its events in ``events``.

        The events are those ``list_events`` returns for ``limit`` and ``after``, read in the
        same operation (one statement on Postgres).

        Raises:
            SessionNotFoundError: no such session in that organisation.
            InvalidArgumentError: ``after`` is naive or ``limit`` is negative.
        """
        ...

    async def get_with_events_json(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> tuple[Session, str]:
        """Return what ``get_with_events`` returns, with the events as JSON text.

        The session comes as ``get`` returns it (``events`` empty), and its events (those
        of ``get_with_events`` for ``limit`` and ``after``, oldest first) as the text of one
        JSON array of ``[seq, id, author, invocation_id, content, state_delta, tokens,
        timestamp]`` arrays, ``timestamp`` in microseconds since 1970-01-01 UTC. Nothing
        is decoded: for adapters that validate their own event contents straight from the
        text (one statement on Postgres).

        Raises:
            SessionNotFoundError: no such session in that organisation.
            InvalidArgumentError: ``after`` is naive or ``limit`` is negative.
        """
        ...

    async def update(self, session: Session) -> Session:
        """Write the session's title and the state keys it set or deleted since it was read.

        On success the session's ``version`` and ``updated_at`` move on in place. The save
        applies only to the life of the id the copy was read from (``session.incarnation``),
        and a deleted ``user:``/``app:`` key is removed only if it still holds the value this
        copy read.

        Raises:
            StaleSessionError: the stored session changed since this copy was read, was
                deleted and created again, or a shared key it deletes changed since; nothing
                is written.
            SessionNotFoundError: the session no longer exists.
            InvalidArgumentError: the title is longer than ``prepare.MAX_TITLE_BYTES`` UTF-8
                bytes; nothing is written.
            InvalidStateError: a changed key or value cannot be stored; nothing is written.
        """
        ...

    async def delete(
        self,
        org_id: str,
        session_id: str,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        """Delete a session with its private state and events.

        With ``app_name`` and/or ``user_id``, only a session of that app and/or user is
        deleted, checked in the same operation as the delete (one statement on Postgres):
        a session of another app or user under that id is left as it is, as if missing.

        Raises:
            SessionNotFoundError: no such session in that organisation (or none of that
                app or user).
        """
        ...

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return the matching sessions, most recently updated first.

        Sessions come without state (metadata only) unless ``filter.with_state`` asks for it.
        """
        ...

    async def list_states_json(self, filter: Filter) -> str:
        """Return the sessions ``list(filter)`` returns, with their state, as JSON text.

        One JSON object (``filter.with_state`` is not needed: state is always there):
        ``"sessions"``, ``[id, user_id, app_name, updated_at, version, incarnation,
        private_state]`` for each session in ``list``'s order (``updated_at`` in
        microseconds since 1970-01-01 UTC, ``private_state`` its keys without a prefix);
        ``"users"``, ``[app_name, user_id, user_state]`` once for each (app, user) among
        them (keys without ``user:``, ``{}`` when none); ``"apps"``, ``[app_name,
        app_state]`` once for each app. A session's state is its private state, then its
        user's keys prefixed ``user:``, then its app's prefixed ``app:``. Nothing is decoded
        or built per session: for adapters that list many sessions with their state (one
        statement on SQL).
        """
        ...

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Page:
        """Return one page of ``list``: ``filter.limit`` sessions (100 when it is 0).

        Pages are read by position (after the last session of the previous page), never by
        offset: each costs the same at any depth. Walking every page from ``cursor=None``
        until ``next_cursor`` is None returns each session that exists for the whole walk
        and is not written during it exactly once; sessions created or written during the
        walk move to the front and never cause a duplicate. ``with_state`` works as in
        ``list``, and the page size may change from page to page.

        Raises:
            InvalidArgumentError: ``cursor`` is not a ``next_cursor`` this listing returned
                (malformed, altered, or from a filter with another org_id, user_id,
                app_name or parent_id).
        """
        ...

    async def append_event(
        self,
        org_id: str,
        session_id: str,
        event: Event,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event:
        """Append an event and apply its ``state_delta``, atomically.

        The stored event gets the session's next ``seq``; the session's ``message_count``
        grows by one, ``token_total`` by ``event.tokens``, and its version moves on. With
        ``expected_version``, the append happens only if the stored version is still that
        one (checked in the same transaction), so a writer holding a stale copy is told.
        With ``incarnation`` (a held copy's ``Session.incarnation``), it happens only if the
        id still names that session, not one created again under the same id. Without
        either, the append is for whatever session has the id when it runs: it lands on
        that session, or raises ``SessionNotFoundError``, never ``StaleSessionError`` (even
        racing a delete and re-create of the id); the same holds for ``touch``,
        ``append_events``, ``truncate_events`` and ``pop_event``.

        Returns:
            The stored copy of the event, with ``seq`` set and ``temp:`` keys removed.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``expected_version`` was given and the session moved on, or
                ``incarnation`` was given and the id names a later session; nothing is written.
            InvalidArgumentError: the event's timestamp is naive or outside
                ``prepare.EARLIEST`` to ``prepare.LATEST`` (0001-01-02 to 9999-12-30 UTC).
            InvalidStateError: the content or delta cannot be stored; nothing is written.
        """
        ...

    async def list_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
        after_seq: int | None = None,
    ) -> builtins.list[Event]:
        """Return a session's events, oldest first.

        Args:
            org_id: The organisation.
            session_id: The session.
            limit: Keep only the newest ``limit`` events; with ``after_seq``, the oldest
                ``limit`` events after it instead.
            after: Keep only events whose timestamp is strictly later (timezone-aware).
            after_seq: Keep only the events with ``seq > after_seq``: a cursor for reading a
                long transcript forward page by page (pass the last ``seq`` read). One
                indexed range read.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            InvalidArgumentError: ``after`` is naive, ``limit`` is negative, or
                ``after_seq`` is not an integer from 0 to 2**63 - 1.
        """
        ...

    async def touch(
        self,
        org_id: str,
        session_id: str,
        *,
        messages: int = 0,
        tokens: int = 0,
        title: str = "",
        incarnation: str | None = None,
    ) -> Session:
        """Add to a session's counters atomically, and set its title if it has none.

        With ``incarnation``, the change applies only to that life of the id (see
        ``append_event``).

        Returns:
            The session's metadata after the change, without state.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``incarnation`` was given and the id names a later session.
        """
        ...

    async def fork(
        self,
        org_id: str,
        session_id: str,
        *,
        new_session_id: str | None = None,
        with_events: bool = False,
    ) -> Session:
        """Create a child session holding a copy of the parent's private state.

        The child records its parent in ``parent_id`` and ``state["forked_from"]``; shared
        state stays shared. With ``with_events`` the transcript is copied too.

        Raises:
            SessionNotFoundError: no such parent in that organisation.
            SessionExistsError: ``new_session_id`` is taken.
        """
        ...

    async def purge(self, org_id: str, *, older_than: timedelta, dry_run: bool = False) -> int:
        """Delete the sessions not updated within ``older_than``; return how many (would) go.

        A session a concurrent writer holds is waited for, never skipped; one written
        meanwhile is new again and stays.

        Raises:
            InvalidArgumentError: ``older_than`` is negative or reaches back before the year 1.
            DeletionIncompleteError: writers held sessions past the store's lock timeout;
                what was deleted stays deleted, and the same call again finishes the purge.
        """
        ...

    async def delete_user(self, org_id: str, user_id: str, *, dry_run: bool = False) -> int:
        """Erase a user's sessions, events, ``user:`` state and long-term memories (in every
        app); return the sessions deleted.

        Everything of the user that exists when it starts is erased: sessions concurrent
        writers hold are waited for, never skipped, and sessions created meanwhile go too,
        until a pass finds none (only one created after that last pass remains). With
        ``dry_run``, nothing is deleted: the count is of the sessions it would delete now.

        Raises:
            DeletionIncompleteError: writers held, or kept creating, sessions of the user past
                the store's lock timeout; the same call again finishes the erasure.
        """
        ...

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` state of (app, user) and the ``app:`` state of the app.

        Keys carry their prefix, as in a session's ``state``. Shared state lives apart from
        sessions: it is there before the user's first session and after their last one is
        deleted. An empty dict when there is none.

        Raises:
            InvalidArgumentError: an id is empty (``app_name`` may be) or malformed.
        """
        ...

    async def append_events(
        self,
        org_id: str,
        session_id: str,
        events: builtins.list[Event],
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
        title: str = "",
    ) -> builtins.list[Event]:
        """Append a batch of events, all or nothing, and apply their state deltas in order.

        The events get consecutive ``seq`` values, in the order given, with no other
        writer's event between them; counters grow as ``append_event`` would grow them for
        each, and the version moves on by one (one write). ``expected_version`` and
        ``incarnation`` guard the whole batch as they guard ``append_event``. A ``title``
        titles the session if it has none yet (as ``touch`` does), in the same write. An
        empty batch writes nothing and returns ``[]`` once the session (and its version)
        is checked.

        Returns:
            The stored copies of the events, in order, with ``seq`` set.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``expected_version`` or ``incarnation`` does not match;
                nothing is written.
            InvalidStateError: an event cannot be stored; nothing is written.
        """
        ...

    async def truncate_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> builtins.list[Event]:
        """Remove the events with ``seq > after_seq``, atomically; return them oldest first.

        The next append gets ``after_seq + 1`` (or the old next seq, when ``after_seq`` is
        past the end): seqs stay gapless. ``message_count`` goes down by one and
        ``token_total`` by ``tokens`` for each removed event (never below 0); state deltas
        the removed events applied stay applied. The version and ``updated_at`` move on, as
        for any write. ``after_seq=0`` clears the transcript and keeps the session.
        ``expected_version`` and ``incarnation`` guard the write as in ``append_event``.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``expected_version`` or ``incarnation`` does not match;
                nothing is removed.
            InvalidArgumentError: ``after_seq`` is not an integer from 0 to 2**63 - 1.
        """
        ...

    async def discard_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> int:
        """Remove the events with ``seq > after_seq`` as ``truncate_events`` does; return
        how many were removed, never the events themselves.

        Everything ``truncate_events`` promises holds (seqs, counters, version, guards);
        only the answer differs, so that its memory does not grow with what it removes
        (``after_seq=0`` clears a transcript of any length).

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``expected_version`` or ``incarnation`` does not match;
                nothing is removed.
            InvalidArgumentError: ``after_seq`` is not an integer from 0 to 2**63 - 1.
        """
        ...

    async def pop_event(
        self,
        org_id: str,
        session_id: str,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event | None:
        """Remove the newest event, atomically, and return it; None when there is none.

        What ``truncate_events(after_seq=newest.seq - 1)`` does, with the newest event found
        in the same atomic operation: a concurrent append is never removed in its place, and
        each of two concurrent pops removes its own event. Counters, seq and version move as
        there. An empty transcript writes nothing (the guards are still checked).
        ``expected_version`` and ``incarnation`` guard the write as in ``append_event``.

        Raises:
            SessionNotFoundError: no such session in that organisation.
            StaleSessionError: ``expected_version`` or ``incarnation`` does not match;
                nothing is removed.
        """
        ...

    async def list_event_contents(
        self, org_id: str, session_id: str, *, limit: int | None = None
    ) -> builtins.list[Any]:
        """Return the ``content`` of each event ``list_events`` returns, in the same order.

        The same read without building ``Event`` objects: for adapters that keep their own
        items as event contents (one statement, one JSON document to decode, on SQL).

        Raises:
            SessionNotFoundError: no such session in that organisation.
            InvalidArgumentError: ``limit`` is negative.
        """
        ...

    async def search(
        self,
        org_id: str,
        text: str,
        *,
        user_id: str | None = None,
        app_name: str | None = None,
        session_id: str | None = None,
        limit: int = 20,
    ) -> builtins.list[SearchHit]:
        """Return the organisation's events whose content holds every word of ``text``.

        An event's text is the string values of its content at any depth (ADK's
        ``parts[].text``, a plain ``{"text": ...}``, a bare string), of which the first
        200,000 characters are searched. Words (runs of letters, digits and marks) match
        whole and without regard to case; the text is only ever words: quotes, operators
        and the like in it are separators, never syntax. Best first: the most occurrences
        of the words, then the newest event, then by session id and seq. Only sessions of
        ``user_id``, of ``app_name``, or the one ``session_id``, when given.

        Raises:
            InvalidArgumentError: ``text`` has no word, is longer than 500 characters or
                has a word longer than 255; ``limit`` is not from 1 to 2**63 - 1; an id is
                malformed.
        """
        ...

    async def add_memories(
        self, org_id: str, app_name: str, user_id: str, memories: builtins.list[Memory]
    ) -> builtins.list[Memory]:
        """Add long-term memories of a user (in one app), all or nothing.

        Each memory gets a new id when it has none, and the current time when it has no
        timestamp. A memory whose id the user already has in that app is not added again
        (adding the same event twice adds it once). Memories belong to the user, not to a
        session: deleting the session they came from keeps them; ``delete_memories`` and
        ``delete_user`` erase them.

        Returns:
            Copies of the memories added (those whose id was new), in the order given, with
            their ids and timestamps.

        Raises:
            InvalidArgumentError: an id is malformed, or a memory cannot be stored (see
                ``memories.prepare_memories``); nothing is written.
            InvalidStateError: a content or metadata is not JSON that can be stored.
        """
        ...

    async def search_memories(
        self, org_id: str, app_name: str, user_id: str, text: str, *, limit: int = 20
    ) -> builtins.list[Memory]:
        """Return the user's memories (in that app) sharing at least one word with ``text``.

        Words are ``Store.search``'s (whole, case-insensitive), and a run of Chinese or
        Japanese is found by any two neighbouring characters. Best first: the sum of the
        weights of the shared words, a word rare among the user's memories outweighing
        several common ones; equal scores newest first (see ``durable_sessions.memories``
        for the rule). ``text`` is data of any length (words past the 64th are ignored),
        never syntax; with no word, nothing is found.

        Raises:
            InvalidArgumentError: an id is malformed, ``text`` is not a string, or ``limit``
                is not from 1 to 2**63 - 1.
        """
        ...

    async def delete_memories(
        self, org_id: str, app_name: str, user_id: str, *, memory_id: str | None = None
    ) -> int:
        """Delete one memory of the user (``memory_id``), or all of them in that app.

        Returns:
            How many memories were deleted (0 when there was none).

        Raises:
            InvalidArgumentError: an id is malformed.
        """
        ...
