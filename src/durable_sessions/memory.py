"""InMemoryStore: the whole Store contract in one process's memory."""

from __future__ import annotations

import builtins
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from .errors import SessionExistsError, SessionNotFoundError, StaleSessionError
from .fulltext import term_count
from .model import Event, Filter, Page, SearchHit, Session, new_id, utcnow
from .prepare import (
    RECREATED,
    check_counters,
    check_delete,
    check_delete_user,
    check_events_read,
    check_expected,
    check_fork,
    check_list_events,
    check_list_page,
    check_max_bytes,
    check_purge,
    check_search,
    check_session,
    check_shared_deletes,
    check_title,
    check_touch,
    events_json,
    fork_state,
    make_page,
    merge_state,
    micros,
    page_fetch,
    prepare_create,
    prepare_event,
    prepare_update,
)
from .state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, copy_json, to_json, validate_id
from .store import check_after_seq

__all__ = ["InMemoryStore"]


class _Record:
    """What the store keeps for one session: metadata, private state and transcript."""

    __slots__ = ("events", "meta", "private")

    def __init__(self, meta: Session, private: dict[str, Any]) -> None:
        self.meta = meta
        self.private = private
        self.events: list[Event] = []


class InMemoryStore:
    """A session store that keeps everything in this process's memory.

    Suitable for tests, local development and single-process services. Each instance is
    independent. Every method completes without suspending, so concurrent asyncio tasks
    see each operation as atomic, exactly as they would a database transaction. Sessions
    and events handed out are copies; the store's own data is never exposed.
    """

    def __init__(self, *, max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self._sessions: dict[tuple[str, str], _Record] = {}
        self._user: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._app: dict[tuple[str, str], dict[str, Any]] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _record(self, org_id: str, session_id: str) -> _Record:
        try:
            return self._sessions[(org_id, session_id)]
        except KeyError:
            raise SessionNotFoundError(org_id, session_id) from None

    def _live(self, org_id: str, session_id: str, incarnation: str | None, version: int) -> _Record:
        """The session's record, if the caller's copy is of this incarnation of the id."""
        record = self._record(org_id, session_id)
        if incarnation is not None and record.meta.incarnation != incarnation:
            raise StaleSessionError(org_id, session_id, version, RECREATED)
        return record

    def _apply_shared(self, meta: Session, delta: ScopedDelta) -> None:
        if delta.user_set or delta.user_deleted:
            user = self._user.setdefault((meta.org_id, meta.app_name, meta.user_id), {})
            user.update(delta.user_set)
            for key in delta.user_deleted:
                user.pop(key, None)
        if delta.app_set or delta.app_deleted:
            app = self._app.setdefault((meta.org_id, meta.app_name), {})
            app.update(delta.app_set)
            for key in delta.app_deleted:
                app.pop(key, None)

    def _view(self, record: _Record, *, with_state: bool = True) -> Session:
        meta = record.meta
        session = replace(meta, state={}, events=[])
        if with_state:
            session.state = copy_json(
                merge_state(
                    record.private,
                    self._user.get((meta.org_id, meta.app_name, meta.user_id), {}).items(),
                    self._app.get((meta.org_id, meta.app_name), {}).items(),
                )
            )
            session.mark_persisted()
        return session

    @staticmethod
    def _copy_event(event: Event) -> Event:
        return replace(
            event, content=copy_json(event.content), state_delta=copy_json(event.state_delta)
        )

    # -- Store -----------------------------------------------------------------------------

    async def create(self, session: Session) -> Session:
        """Store a new session and its initial state."""
        delta = prepare_create(session, self.max_value_bytes)
        key = (session.org_id, session.id)
        if key in self._sessions:
            raise SessionExistsError(session.org_id, session.id)
        now = utcnow()
        meta = replace(
            session,
            state={},
            events=[],
            created_at=now,
            updated_at=now,
            version=1,
            message_count=0,  # a new session starts at zero, as in SQL
            token_total=0,
            incarnation=new_id(),
        )
        self._sessions[key] = _Record(meta, delta.private_set)
        self._apply_shared(meta, delta)
        view = self._view(self._sessions[key])
        temp = {k: v for k, v in session.state.items() if k.startswith("temp:")}
        session.state = {**view.state, **temp}
        session.created_at = session.updated_at = now
        session.message_count = session.token_total = 0
        session.version = 1
        session.incarnation = meta.incarnation
        session.mark_persisted()
        return session

    async def get(self, org_id: str, session_id: str) -> Session:
        """Return a copy of a session with its state merged."""
        check_session(org_id, session_id)
        return self._view(self._record(org_id, session_id))

    async def get_with_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> Session:
        """Return a copy of a session with its state merged and its events loaded."""
        after = check_events_read(org_id, session_id, limit, after)
        record = self._record(org_id, session_id)
        session = self._view(record)
        session.events = self._events(record, limit, after)
        return session

    async def get_with_events_json(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
    ) -> tuple[Session, str]:
        """Return a copy of a session, and its events as JSON text (see ``Store``)."""
        after = check_events_read(org_id, session_id, limit, after)
        record = self._record(org_id, session_id)
        return self._view(record), events_json(self._events(record, limit, after))

    async def update(self, session: Session) -> Session:
        """Write what changed in the session, if nobody changed it since it was read."""
        delta = prepare_update(session, self.max_value_bytes)
        record = self._live(session.org_id, session.id, session.incarnation, session.version)
        if record.meta.version != session.version:
            raise StaleSessionError(session.org_id, session.id, session.version)
        meta = record.meta
        user = self._user.get((meta.org_id, meta.app_name, meta.user_id), {})
        app = self._app.get((meta.org_id, meta.app_name), {})
        check_shared_deletes(
            session.org_id,
            session.id,
            session.version,
            [*(("user", k, v) for k, v in user.items()), *(("app", k, v) for k, v in app.items())],
            delta,
        )
        now = utcnow()
        for key in delta.private_deleted:
            record.private.pop(key, None)
        record.private.update(delta.private_set)
        self._apply_shared(record.meta, delta)
        record.meta.title = session.title
        record.meta.updated_at = session.updated_at = max(record.meta.updated_at, now)
        record.meta.version = session.version = session.version + 1
        session.mark_persisted()
        return session

    async def delete(
        self,
        org_id: str,
        session_id: str,
        *,
        app_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        """Delete a session with its private state and events (of that app and user only,
        when given)."""
        check_delete(org_id, session_id, app_name, user_id)
        meta = self._record(org_id, session_id).meta
        if (app_name is not None and meta.app_name != app_name) or (
            user_id is not None and meta.user_id != user_id
        ):
            raise SessionNotFoundError(org_id, session_id)
        del self._sessions[(org_id, session_id)]

    async def list(self, filter: Filter) -> builtins.list[Session]:
        """Return matching sessions, most recently updated first (state only on request)."""
        found = self._matching(filter, None)
        if filter.limit:
            found = found[: filter.limit]
        return [self._view(r, with_state=filter.with_state) for r in found]

    async def list_states_json(self, filter: Filter) -> str:
        """Return the listing of ``list(filter)`` with state as one JSON text (see ``Store``)."""
        found = self._matching(filter, None)
        if filter.limit:
            found = found[: filter.limit]
        org = filter.org_id
        owners = {(r.meta.app_name, r.meta.user_id): None for r in found}
        apps = {app: None for app, _ in owners}
        listing = {
            "sessions": [
                [
                    r.meta.id, r.meta.user_id, r.meta.app_name, micros(r.meta.updated_at),
                    r.meta.version, r.meta.incarnation, r.private,
                ]
                for r in found
            ],
            "users": [[a, u, self._user.get((org, a, u), {})] for a, u in owners],
            "apps": [[a, self._app.get((org, a), {})] for a in apps],
        }  # fmt: skip
        return to_json(listing)

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Page:
        """Return one page of ``list`` after ``cursor`` (see ``Store``)."""
        size, position = check_list_page(filter, cursor)
        found = self._matching(filter, position)[: page_fetch(size)]
        return make_page(filter, [self._view(r, with_state=filter.with_state) for r in found], size)

    def _matching(
        self, filter: Filter, after: tuple[datetime, str] | None
    ) -> builtins.list[_Record]:
        """The sessions ``filter`` selects, newest first, after the position ``after``."""
        found = [
            r
            for (org, _), r in self._sessions.items()
            if org == filter.org_id
            and (filter.user_id is None or r.meta.user_id == filter.user_id)
            and (filter.app_name is None or r.meta.app_name == filter.app_name)
            and (filter.parent_id is None or r.meta.parent_id == filter.parent_id)
            and (after is None or (r.meta.updated_at, r.meta.id) < after)
        ]
        found.sort(key=lambda r: (r.meta.updated_at, r.meta.id), reverse=True)
        return found

    async def append_event(
        self,
        org_id: str,
        session_id: str,
        event: Event,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event:
        """Append an event and apply its state delta atomically (see ``Store``)."""
        check_session(org_id, session_id)
        check_expected(expected_version, incarnation)
        stored, delta = prepare_event(event, self.max_value_bytes)
        record = self._live(org_id, session_id, incarnation, expected_version or 0)
        if expected_version is not None and record.meta.version != expected_version:
            raise StaleSessionError(org_id, session_id, expected_version)
        meta = record.meta
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, 1, stored.tokens)
        stored.seq = record.events[-1].seq + 1 if record.events else 1
        record.events.append(stored)
        for key in delta.private_deleted:
            record.private.pop(key, None)
        record.private.update(delta.private_set)
        self._apply_shared(meta, delta)
        meta.message_count += 1
        meta.token_total += stored.tokens
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return self._copy_event(stored)

    async def list_events(
        self,
        org_id: str,
        session_id: str,
        *,
        limit: int | None = None,
        after: datetime | None = None,
        after_seq: int | None = None,
    ) -> builtins.list[Event]:
        """Return a session's events, oldest first (see ``Store``)."""
        after = check_list_events(org_id, session_id, limit, after, after_seq)
        return self._events(self._record(org_id, session_id), limit, after, after_seq)

    def _events(
        self,
        record: _Record,
        limit: int | None,
        after: datetime | None,
        after_seq: int | None = None,
    ) -> builtins.list[Event]:
        events = record.events
        if after is not None:
            events = [e for e in events if e.timestamp > after]
        if after_seq is not None:
            events = [e for e in events if e.seq > after_seq]
            if limit is not None:
                events = events[:limit]
        elif limit is not None:
            events = events[-limit:] if limit else []
        return [self._copy_event(e) for e in events]

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
        """Add to the counters and title an untitled session."""
        check_touch(org_id, session_id, messages, tokens, title)
        check_expected(None, incarnation)
        meta = self._live(org_id, session_id, incarnation, 0).meta
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, messages, tokens)
        meta.message_count += messages
        meta.token_total += tokens
        if not meta.title:
            meta.title = title
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return replace(meta, state={}, events=[])

    async def fork(
        self,
        org_id: str,
        session_id: str,
        *,
        new_session_id: str | None = None,
        with_events: bool = False,
    ) -> Session:
        """Create a child session from a parent's private state (and transcript)."""
        child_id = check_fork(org_id, session_id, new_session_id)
        parent = self._record(org_id, session_id)
        if (org_id, child_id) in self._sessions:
            raise SessionExistsError(org_id, child_id)
        now = utcnow()
        meta = replace(
            parent.meta,
            id=child_id,
            parent_id=session_id,
            created_at=now,
            updated_at=now,
            version=1,
            incarnation=new_id(),
            message_count=parent.meta.message_count if with_events else 0,
            token_total=parent.meta.token_total if with_events else 0,
        )
        record = _Record(meta, fork_state(parent.private, session_id))
        if with_events:
            record.events = [self._copy_event(e) for e in parent.events]
        self._sessions[(org_id, child_id)] = record
        return self._view(record)

    async def purge(self, org_id: str, *, older_than: timedelta, dry_run: bool = False) -> int:
        """Delete the sessions of an organisation not updated within ``older_than``.

        Raises:
            InvalidArgumentError: ``older_than`` is negative, or reaches back before the year 1.
        """
        cutoff = check_purge(org_id, older_than, utcnow())
        doomed = [
            key
            for key, r in self._sessions.items()
            if key[0] == org_id and r.meta.updated_at < cutoff
        ]
        if not dry_run:
            for key in doomed:
                del self._sessions[key]
        return len(doomed)

    async def delete_user(self, org_id: str, user_id: str) -> int:
        """Erase a user's sessions, events and user state in one organisation."""
        check_delete_user(org_id, user_id)
        doomed = [
            key
            for key, r in self._sessions.items()
            if key[0] == org_id and r.meta.user_id == user_id
        ]
        for key in doomed:
            del self._sessions[key]
        for user_key in [k for k in self._user if k[0] == org_id and k[2] == user_id]:
            del self._user[user_key]
        return len(doomed)

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` and ``app:`` state of (app, user), prefixed (see ``Store``)."""
        validate_id("org_id", org_id)
        validate_id("app_name", app_name, allow_empty=True)
        validate_id("user_id", user_id)
        user = self._user.get((org_id, app_name, user_id), {})
        app = self._app.get((org_id, app_name), {})
        shared: dict[str, Any] = copy_json(merge_state({}, user.items(), app.items()))
        return shared

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
        """Append a batch of events, all or nothing, with consecutive seqs (see ``Store``)."""
        check_session(org_id, session_id)
        check_expected(expected_version, incarnation)
        check_title(title)
        prepared = [prepare_event(event, self.max_value_bytes) for event in events]
        record = self._live(org_id, session_id, incarnation, expected_version or 0)
        if expected_version is not None and record.meta.version != expected_version:
            raise StaleSessionError(org_id, session_id, expected_version)
        if not prepared:
            return []
        meta = record.meta
        tokens = sum(stored.tokens for stored, _ in prepared)
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, len(prepared), tokens)
        seq = record.events[-1].seq if record.events else 0
        for stored, delta in prepared:
            seq += 1
            stored.seq = seq
            record.events.append(stored)
            record.private.update(delta.private_set)
            self._apply_shared(meta, delta)
        meta.message_count += len(prepared)
        meta.token_total += tokens
        if not meta.title:
            meta.title = title
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return [self._copy_event(stored) for stored, _ in prepared]

    async def truncate_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> builtins.list[Event]:
        """Remove the events after ``after_seq`` and return them, oldest first (see ``Store``)."""
        check_session(org_id, session_id)
        check_after_seq(after_seq)
        check_expected(expected_version, incarnation)
        record = self._live(org_id, session_id, incarnation, expected_version or 0)
        if expected_version is not None and record.meta.version != expected_version:
            raise StaleSessionError(org_id, session_id, expected_version)
        meta = record.meta
        check_counters(org_id, session_id, (0, 0, meta.version), 0, 0)
        kept = [e for e in record.events if e.seq <= after_seq]
        removed = record.events[len(kept) :]
        record.events = kept
        meta.message_count = max(0, meta.message_count - len(removed))
        meta.token_total = max(0, meta.token_total - sum(e.tokens for e in removed))
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return [self._copy_event(e) for e in removed]

    async def pop_event(
        self,
        org_id: str,
        session_id: str,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event | None:
        """Remove the newest event and return it; None when there is none (see ``Store``)."""
        check_session(org_id, session_id)
        check_expected(expected_version, incarnation)
        record = self._live(org_id, session_id, incarnation, expected_version or 0)
        if expected_version is not None and record.meta.version != expected_version:
            raise StaleSessionError(org_id, session_id, expected_version)
        check_counters(org_id, session_id, (0, 0, record.meta.version), 0, 0)
        if not record.events:
            return None
        # No await in between: the same atomic step as the read of the newest event.
        after_seq = record.events[-1].seq - 1
        (removed,) = await self.truncate_events(
            org_id,
            session_id,
            after_seq=after_seq,
            expected_version=expected_version,
            incarnation=incarnation,
        )
        return removed

    async def list_event_contents(
        self, org_id: str, session_id: str, *, limit: int | None = None
    ) -> builtins.list[Any]:
        """Return the contents of a session's events, oldest first (see ``Store``)."""
        check_events_read(org_id, session_id, limit, None)
        events = self._record(org_id, session_id).events
        if limit is not None:
            events = events[-limit:] if limit else []
        return [copy_json(e.content) for e in events]

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
        """Return the events holding every word of ``text``, best first: a plain scan of
        the organisation's transcripts by the rules of ``fulltext`` (see ``Store``)."""
        wanted = set(check_search(org_id, text, user_id, app_name, session_id, limit))
        ranked: builtins.list[tuple[int, datetime, str, int, Event]] = []
        for (org, sid), record in self._sessions.items():
            meta = record.meta
            if (
                org != org_id
                or (user_id is not None and meta.user_id != user_id)
                or (app_name is not None and meta.app_name != app_name)
                or (session_id is not None and sid != session_id)
            ):
                continue
            for event in record.events:
                count = term_count(event.content, wanted)
                if count:
                    ranked.append((count, event.timestamp, sid, event.seq, event))
        ranked.sort(key=lambda hit: hit[:4], reverse=True)
        return [SearchHit(sid, self._copy_event(event)) for _, _, sid, _, event in ranked[:limit]]
