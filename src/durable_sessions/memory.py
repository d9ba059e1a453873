"""InMemoryStore: the whole Store contract in one process's memory."""

from __future__ import annotations

import builtins
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import (
    InvalidArgumentError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
)
from .fulltext import term_count
from .jsoncodec import copy_json, to_json
from .memories import Memory, MemoryBook, check_memory_search, check_owner, prepare_memories
from .model import Event, Filter, Page, SearchHit, Session, new_id, utcnow
from .prepare import (
    RECREATED,
    check_counters,
    check_delete,
    check_delete_user,
    check_events_read,
    check_expected,
    check_fork,
    check_guarded,
    check_list_events,
    check_list_page,
    check_max_bytes,
    check_purge,
    check_search,
    check_session,
    check_shared_deletes,
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
from .state import DEFAULT_MAX_VALUE_BYTES, ScopedDelta, validate_id

if TYPE_CHECKING:
    from .crypto import Keyring
    from .sealing import DataKey, Envelope

__all__ = ["InMemoryStore"]


class _Record:
    """What the store keeps for one session: metadata, private state and transcript."""

    __slots__ = ("events", "meta", "private", "terms")

    def __init__(self, meta: Session, private: dict[str, Any]) -> None:
        self.meta = meta
        self.private = private
        self.events: list[Event] = []
        # With a keyring: each event's blind index text, by seq (see ``sealing``).
        self.terms: dict[int, str] = {}


def _child_meta(parent: Session, child_id: str, with_events: bool) -> Session:
    """A fork's session row: the parent's, under the child's id, new at version 1 (with the
    parent's counters when the transcript is copied too)."""
    now = utcnow()
    return replace(
        parent,
        id=child_id,
        parent_id=parent.id,
        created_at=now,
        updated_at=now,
        version=1,
        incarnation=new_id(),
        message_count=parent.message_count if with_events else 0,
        token_total=parent.token_total if with_events else 0,
    )


class InMemoryStore:
    """A session store that keeps everything in this process's memory.

    Suitable for tests, local development and single-process services. Each instance is
    independent. Every method completes without suspending, so concurrent asyncio tasks
    see each operation as atomic, exactly as they would a database transaction. Sessions
    and events handed out are copies; the store's own data is never exposed.

    Args:
        max_value_bytes: The largest state value or event content accepted, as UTF-8 JSON;
            larger ones raise ``InvalidStateError``. None removes the limit.
        keyring: Encrypt titles, state values and events with data keys this keyring wraps
            (``durable_sessions.crypto``; see ``docs/guides/encryption.md``), as
            ``SQLStore`` does: the store then holds only sealed values. Keys are fetched
            before each operation's step that must not suspend, so a keyring over a remote
            KMS keeps operations atomic.
    """

    def __init__(
        self,
        *,
        max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES,
        keyring: Keyring | None = None,
    ) -> None:
        self.max_value_bytes = check_max_bytes(max_value_bytes)
        self._sessions: dict[tuple[str, str], _Record] = {}
        self._user: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._app: dict[tuple[str, str], dict[str, Any]] = {}
        self._memories = MemoryBook()
        self._env: Envelope | None = None
        if keyring is not None:
            from .sealing import Envelope, MemoryKeyTable, Sealer

            self._env = Envelope(Sealer(keyring, MemoryKeyTable()))

    @property
    def keyring(self) -> Keyring | None:
        """The keyring the store encrypts with; None when it stores plaintext."""
        return None if self._env is None else self._env.sealer.keyring

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

    def _guarded(
        self, org_id: str, session_id: str, expected_version: int | None, incarnation: str | None
    ) -> _Record:
        """The session's record, if the caller's copy is of this incarnation of the id and,
        when it names one, at this version."""
        record = self._live(org_id, session_id, incarnation, expected_version or 0)
        if expected_version is not None and record.meta.version != expected_version:
            raise StaleSessionError(org_id, session_id, expected_version)
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

    # -- encryption (a keyring given): sealed in, opened out --------------------------------

    async def _out(self, record: _Record, *, with_state: bool = True) -> Session:
        """A copy of a session, opened."""
        session = self._view(record, with_state=with_state)
        if self._env is not None:
            await self._env.open_session(session)
            session.mark_persisted()
        return session

    async def _out_meta(self, meta: Session) -> Session:
        """A copy of a session's metadata, its title opened."""
        session = replace(meta, state={}, events=[])
        if self._env is not None:
            session.title = await self._env.open_title(meta.org_id, meta.id, meta.title)
        return session

    async def _out_events(
        self, org_id: str, session_id: str, events: builtins.list[Event]
    ) -> builtins.list[Event]:
        """Copies of events (already copied by the caller), opened."""
        if self._env is None:
            return events
        return await self._env.open_events(org_id, session_id, events)

    async def _keys(
        self, org_id: str, user_id: str, app_name: str, with_app: bool
    ) -> tuple[DataKey | None, DataKey | None]:
        """The user's (and the app's) data keys, None without a keyring. The user's key is
        looked up in the key table first (``Sealer.key``'s ``verify``), as a SQL store's
        writes check it in their own statements: another store sharing the table (a
        process, in SQL) may have erased the user. Here the lookup is one dict's."""
        if self._env is None:
            return None, None
        user = await self._env.user_key(org_id, user_id, verify=True)
        app = await self._env.app_key(org_id, app_name) if with_app else None
        return user, app

    async def _session_keys(
        self, org_id: str, session_id: str, with_app: bool
    ) -> tuple[DataKey | None, DataKey | None]:
        """The data keys of a stored session's user (and app); None without a keyring."""
        if self._env is None:
            return None, None
        meta = self._record(org_id, session_id).meta
        return await self._keys(org_id, meta.user_id, meta.app_name, with_app)

    def _sealed(
        self, keys: tuple[DataKey | None, DataKey | None], meta: Session, delta: ScopedDelta
    ) -> ScopedDelta:
        """The delta to keep: its values sealed with the keys fetched for ``meta``'s owner."""
        user, app = keys
        if self._env is None:
            return delta
        assert user is not None
        if user.owner != meta.user_id or (app is not None and app.owner != meta.app_name):
            # The id was deleted and created again, for another owner, while keys were
            # fetched: the caller's copy is of a life that is gone.
            raise StaleSessionError(meta.org_id, meta.id, 0, RECREATED)
        return self._env.seal_changes(
            user, app, meta.org_id, meta.id, meta.app_name, meta.user_id, delta
        )

    def _seal_stored(
        self, keys: tuple[DataKey | None, DataKey | None], meta: Session, event: Event
    ) -> Event:
        """The event to keep: a sealed copy (with a keyring), or the event itself."""
        if self._env is None:
            return event
        assert keys[0] is not None
        return self._env.seal_event(keys[0], meta.org_id, meta.id, event)

    def _title(self, keys: tuple[DataKey | None, DataKey | None], meta: Session, title: str) -> str:
        """The title to keep: sealed (with a keyring), or as given."""
        if self._env is None:
            return title
        assert keys[0] is not None
        return self._env.seal_title(keys[0], meta.org_id, meta.id, title)

    async def _terms(self, org_id: str, events: builtins.list[Event]) -> builtins.list[str]:
        """The blind index texts of events' contents (empty without a keyring)."""
        if self._env is None:
            return ["" for _ in events]
        return [await self._env.sealer.blind_text(org_id, e.content) for e in events]

    async def _open_views(
        self, views: builtins.list[Session], with_state: bool
    ) -> builtins.list[Session]:
        """Open copies of sessions taken by ``_view``."""
        if self._env is not None:
            for view in views:
                await self._env.open_session(view)
                if with_state:
                    view.mark_persisted()
        return views

    async def _opened_shared(self, meta: Session, delta: ScopedDelta) -> dict[str, Any]:
        """With a keyring: the opened values of the shared keys a save deletes, by their
        sealed text (what ``check_shared_deletes`` compares)."""
        if self._env is None:
            return {}
        user = self._user.get((meta.org_id, meta.app_name, meta.user_id), {})
        app = self._app.get((meta.org_id, meta.app_name), {})
        opened: dict[str, Any] = {}
        for scope, stored, expected in (
            ("user", user, delta.user_expected),
            ("app", app, delta.app_expected),
        ):
            for key in expected:
                if key in stored:
                    items = [(key, stored[key])]
                    if scope == "user":
                        value = await self._env.open_user(
                            meta.org_id, meta.app_name, meta.user_id, items
                        )
                    else:
                        value = await self._env.open_app(meta.org_id, meta.app_name, items)
                    opened[stored[key]] = value[key]
        return opened

    # -- keys ------------------------------------------------------------------------------

    def _sealing(self, operation: str) -> Envelope:
        if self._env is None:
            raise InvalidArgumentError(
                f"{operation} needs a store with a keyring (encryption at rest)"
            )
        return self._env

    async def rotate_keys(self) -> int:
        """Re-wrap every data key under the keyring's current master key; return how many
        (see ``SQLStore.rotate_keys``).

        Raises:
            InvalidArgumentError: the store has no keyring.
        """
        return await self._sealing("rotate_keys").sealer.rotate()

    async def reencrypt(self, *, new_keys: bool = True, batch: int = 500) -> int:
        """Move every value to the current data key of its user (or app); return how many
        sessions, events and shared values were rewritten (see ``SQLStore.reencrypt``).

        Raises:
            InvalidArgumentError: the store has no keyring, or ``batch`` is not positive.
        """
        from .sealing import APP, USER

        env = self._sealing("reencrypt")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgumentError(f"batch must be a positive integer, not {batch!r}")
        if new_keys:
            users = {(o, r.meta.user_id) for (o, _), r in self._sessions.items()}
            users |= {(o, u) for o, _, u in self._user}
            for org_id, user_id in sorted(users):
                await env.sealer.new_key(org_id, USER, user_id)
            for org_id, app_name in sorted(self._app):
                await env.sealer.new_key(org_id, APP, app_name)
        moved = 0
        for (org, sid), record in list(self._sessions.items()):
            meta = record.meta
            key = await env.user_key(org, meta.user_id)
            title = env.seal_title(key, org, sid, await env.open_title(org, sid, meta.title))
            private = env.seal_private(
                key, org, sid, await env.open_private(org, sid, record.private)
            )
            events = []
            for event in record.events:
                opened = await env.open_event(org, sid, event)
                events.append((event, env.seal_event(key, org, sid, opened), opened.content))
            terms = [await env.sealer.blind_text(org, content) for _, _, content in events]
            if self._sessions.get((org, sid)) is not record:
                continue  # deleted meanwhile
            if title != meta.title or private != record.private:
                meta.title, record.private = title, private
                moved += 1
            for (old, new, _), text in zip(events, terms, strict=True):
                if new.content != old.content or new.state_delta != old.state_delta:
                    old.content, old.state_delta = new.content, new.state_delta
                    if text:
                        record.terms[old.seq] = text
                    moved += 1
        for (org, app, user), values in list(self._user.items()):
            key = await env.user_key(org, user)
            user_values = await env.open_user(org, app, user, values.items())
            for name, value in env.seal_user(key, org, app, user, user_values).items():
                if values.get(name, value) != value:
                    values[name] = value
                    moved += 1
        for (org, app), values in list(self._app.items()):
            key = await env.app_key(org, app)
            app_values = await env.open_app(org, app, values.items())
            for name, value in env.seal_app(key, org, app, app_values).items():
                if values.get(name, value) != value:
                    values[name] = value
                    moved += 1
        for (org, app, user), owner in list(self._memories.owners()):
            key = await env.user_key(org, user)
            index = await env.sealer.index_key(org)
            for memory_id, (kept, memory_terms) in list(owner.memories.items()):
                plain = await env.open_memory(org, app, user, kept)
                resealed = env.seal_memory(key, index, org, app, user, plain)
                if resealed.text != kept.text and memory_id in owner.memories:
                    owner.memories[memory_id] = (resealed, memory_terms)
                    moved += 1
        return moved

    # -- Store -----------------------------------------------------------------------------

    async def create(self, session: Session) -> Session:
        """Store a new session and its initial state."""
        delta = prepare_create(session, self.max_value_bytes)
        key = (session.org_id, session.id)
        keys = await self._keys(
            session.org_id, session.user_id, session.app_name, bool(delta.app_set)
        )
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
            title=self._title(keys, session, session.title),
        )
        stored = self._sealed(keys, meta, delta)
        self._sessions[key] = _Record(meta, stored.private_set)
        self._apply_shared(meta, stored)
        view = await self._out(self._sessions[key])
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
        return await self._out(self._record(org_id, session_id))

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
        events = self._events(record, limit, after)
        await self._open_views([session], True)
        session.events = await self._out_events(org_id, session_id, events)
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
        session, events = self._view(record), self._events(record, limit, after)
        await self._open_views([session], True)
        return session, events_json(await self._out_events(org_id, session_id, events))

    async def update(self, session: Session) -> Session:
        """Write what changed in the session, if nobody changed it since it was read."""
        delta = prepare_update(session, self.max_value_bytes)
        record = self._live(session.org_id, session.id, session.incarnation, session.version)
        if self._env is not None:  # fetch keys and open what is compared, then check again
            keys = await self._session_keys(session.org_id, session.id, bool(delta.app_set))
            opened = await self._opened_shared(record.meta, delta)
            record = self._live(session.org_id, session.id, session.incarnation, session.version)
        else:
            keys, opened = (None, None), {}
        if record.meta.version != session.version:
            raise StaleSessionError(session.org_id, session.id, session.version)
        meta = record.meta
        user = self._user.get((meta.org_id, meta.app_name, meta.user_id), {})
        app = self._app.get((meta.org_id, meta.app_name), {})
        stored_shared = [
            *(("user", k, v) for k, v in user.items()),
            *(("app", k, v) for k, v in app.items()),
        ]
        if self._env is not None:
            expected = {"user": delta.user_expected, "app": delta.app_expected}
            if any(k in expected[sc] and v not in opened for sc, k, v in stored_shared):
                # Written again while the values were opened: compare with the new value.
                return await self.update(session)
            stored_shared = [(sc, k, opened[v]) for sc, k, v in stored_shared if k in expected[sc]]
        check_shared_deletes(session.org_id, session.id, session.version, stored_shared, delta)
        now = utcnow()
        stored = self._sealed(keys, meta, delta)
        for key in stored.private_deleted:
            record.private.pop(key, None)
        record.private.update(stored.private_set)
        self._apply_shared(record.meta, stored)
        record.meta.title = self._title(keys, meta, session.title)
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
        views = [self._view(r, with_state=filter.with_state) for r in found]
        return await self._open_views(views, filter.with_state)

    async def list_states_json(self, filter: Filter) -> str:
        """Return the listing of ``list(filter)`` with state as one JSON text (see ``Store``)."""
        found = self._matching(filter, None)
        if filter.limit:
            found = found[: filter.limit]
        org = filter.org_id
        owners = {(r.meta.app_name, r.meta.user_id): None for r in found}
        apps = {app: None for app, _ in owners}
        listing: dict[str, builtins.list[builtins.list[Any]]] = {
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
        if self._env is not None:
            env = self._env
            for row in listing["sessions"]:
                row[6] = await env.open_private(org, row[0], row[6])
            for row in listing["users"]:
                row[2] = await env.open_user(org, row[0], row[1], row[2].items())
            for row in listing["apps"]:
                row[1] = await env.open_app(org, row[0], row[1].items())
        return to_json(listing)

    async def list_page(self, filter: Filter, *, cursor: str | None = None) -> Page:
        """Return one page of ``list`` after ``cursor`` (see ``Store``)."""
        size, position = check_list_page(filter, cursor)
        found = self._matching(filter, position)[: page_fetch(size)]
        views = [self._view(r, with_state=filter.with_state) for r in found]
        return make_page(filter, await self._open_views(views, filter.with_state), size)

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
        check_guarded(org_id, session_id, expected_version, incarnation)
        stored, delta = prepare_event(event, self.max_value_bytes)
        keys = await self._session_keys(org_id, session_id, bool(delta.app_set))
        (terms,) = await self._terms(org_id, [stored])
        record = self._guarded(org_id, session_id, expected_version, incarnation)
        meta = record.meta
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, 1, stored.tokens)
        sealed_delta = self._sealed(keys, meta, delta)
        kept = self._seal_stored(keys, meta, stored)
        kept.seq = stored.seq = record.events[-1].seq + 1 if record.events else 1
        record.events.append(kept)
        if terms:
            record.terms[kept.seq] = terms
        for key in sealed_delta.private_deleted:
            record.private.pop(key, None)
        record.private.update(sealed_delta.private_set)
        self._apply_shared(meta, sealed_delta)
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
        events = self._events(self._record(org_id, session_id), limit, after, after_seq)
        return await self._out_events(org_id, session_id, events)

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
        self._live(org_id, session_id, incarnation, 0)
        keys = await self._session_keys(org_id, session_id, False)
        meta = self._live(org_id, session_id, incarnation, 0).meta
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, messages, tokens)
        meta.message_count += messages
        meta.token_total += tokens
        if not meta.title:
            meta.title = self._title(keys, meta, title)
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return await self._out_meta(meta)

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
        if self._env is not None:
            return await self._fork_sealed(org_id, session_id, child_id, with_events)
        if (org_id, child_id) in self._sessions:
            raise SessionExistsError(org_id, child_id)
        meta = _child_meta(parent.meta, child_id, with_events)
        record = _Record(meta, fork_state(parent.private, session_id))
        if with_events:
            record.events = [self._copy_event(e) for e in parent.events]
        self._sessions[(org_id, child_id)] = record
        return self._view(record)

    async def _fork_sealed(
        self, org_id: str, session_id: str, child_id: str, with_events: bool
    ) -> Session:
        """A fork with a keyring: the parent's values opened, and sealed again for the
        child's rows (their associated data names the child)."""
        env = self._env
        assert env is not None
        while True:
            parent = self._record(org_id, session_id)
            version = (parent.meta.incarnation, parent.meta.version)
            private = await env.open_private(org_id, session_id, parent.private)
            title = await env.open_title(org_id, session_id, parent.meta.title)
            events = [self._copy_event(e) for e in parent.events] if with_events else []
            terms = dict(parent.terms) if with_events else {}
            events = await self._out_events(org_id, session_id, events)
            keys = await self._session_keys(org_id, session_id, False)
            parent = self._record(org_id, session_id)
            if (parent.meta.incarnation, parent.meta.version) == version:
                break  # nothing changed while the values were opened
        if (org_id, child_id) in self._sessions:
            raise SessionExistsError(org_id, child_id)
        meta = _child_meta(parent.meta, child_id, with_events)
        meta.title = self._title(keys, meta, title)
        delta = ScopedDelta(private_set=fork_state(private, session_id))
        record = _Record(meta, self._sealed(keys, meta, delta).private_set)
        record.events = [self._seal_stored(keys, meta, e) for e in events]
        record.terms = terms
        self._sessions[(org_id, child_id)] = record
        return await self._out(record)

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

    async def delete_user(self, org_id: str, user_id: str, *, dry_run: bool = False) -> int:
        """Erase a user's sessions, events and user state in one organisation."""
        check_delete_user(org_id, user_id)
        if dry_run:
            return len(self._user_sessions(org_id, user_id))
        deleted = self._delete_user_rows(org_id, user_id)
        if self._env is not None:  # crypto-shredding: any copy of the values is now noise
            from .sealing import USER

            await self._env.sealer.forget(org_id, USER, user_id)
            # Rows written for the user meanwhile were sealed with the keys just destroyed:
            # they go too, rather than stay unreadable.
            deleted += self._delete_user_rows(org_id, user_id)
        return deleted

    def _user_sessions(self, org_id: str, user_id: str) -> builtins.list[tuple[str, str]]:
        """The keys of a user's sessions in one organisation."""
        return [
            key
            for key, r in self._sessions.items()
            if key[0] == org_id and r.meta.user_id == user_id
        ]

    def _delete_user_rows(self, org_id: str, user_id: str) -> int:
        """Delete a user's sessions, user state and memories; return how many sessions."""
        doomed = self._user_sessions(org_id, user_id)
        for key in doomed:
            del self._sessions[key]
        for user_key in [k for k in self._user if k[0] == org_id and k[2] == user_id]:
            del self._user[user_key]
        self._memories.delete_user(org_id, user_id)
        return len(doomed)

    async def count_user_memories(self, org_id: str, user_id: str) -> int:
        """Return how many long-term memories the user has in the organisation, over every
        app: what ``delete_user`` erases beside the user's sessions."""
        check_delete_user(org_id, user_id)
        return self._memories.delete_user(org_id, user_id, dry_run=True)

    async def get_shared_state(self, org_id: str, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the ``user:`` and ``app:`` state of (app, user), prefixed (see ``Store``)."""
        validate_id("org_id", org_id)
        validate_id("app_name", app_name, allow_empty=True)
        validate_id("user_id", user_id)
        user = self._user.get((org_id, app_name, user_id), {})
        app = self._app.get((org_id, app_name), {})
        shared: dict[str, Any] = copy_json(merge_state({}, user.items(), app.items()))
        if self._env is not None:
            shared = await self._env.open_state(org_id, "", app_name, user_id, shared)
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
        check_guarded(org_id, session_id, expected_version, incarnation, title=title)
        prepared = [prepare_event(event, self.max_value_bytes) for event in events]
        record = self._guarded(org_id, session_id, expected_version, incarnation)
        if self._env is not None:
            with_app = any(delta.app_set for _, delta in prepared)
            keys = await self._session_keys(org_id, session_id, with_app)
            terms = await self._terms(org_id, [stored for stored, _ in prepared])
            record = self._guarded(org_id, session_id, expected_version, incarnation)
        else:
            keys, terms = (None, None), ["" for _ in prepared]
        if not prepared:
            return []
        meta = record.meta
        tokens = sum(stored.tokens for stored, _ in prepared)
        counters = (meta.message_count, meta.token_total, meta.version)
        check_counters(org_id, session_id, counters, len(prepared), tokens)
        seq = record.events[-1].seq if record.events else 0
        for (stored, delta), text in zip(prepared, terms, strict=True):
            seq += 1
            stored.seq = seq
            kept = self._seal_stored(keys, meta, stored)
            kept.seq = seq
            record.events.append(kept)
            if text:
                record.terms[seq] = text
            sealed_delta = self._sealed(keys, meta, delta)
            record.private.update(sealed_delta.private_set)
            self._apply_shared(meta, sealed_delta)
        meta.message_count += len(prepared)
        meta.token_total += tokens
        if not meta.title:
            meta.title = self._title(keys, meta, title)
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
        removed = self._cut(org_id, session_id, after_seq, expected_version, incarnation)
        return await self._out_events(org_id, session_id, [self._copy_event(e) for e in removed])

    async def discard_events(
        self,
        org_id: str,
        session_id: str,
        *,
        after_seq: int,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> int:
        """Remove the events after ``after_seq``; return how many (see ``Store``)."""
        return len(self._cut(org_id, session_id, after_seq, expected_version, incarnation))

    def _cut(
        self,
        org_id: str,
        session_id: str,
        after_seq: int,
        expected_version: int | None,
        incarnation: str | None,
    ) -> builtins.list[Event]:
        """Remove the events after ``after_seq`` and return the stored ones removed."""
        check_guarded(org_id, session_id, expected_version, incarnation, after_seq=after_seq)
        record = self._guarded(org_id, session_id, expected_version, incarnation)
        meta = record.meta
        check_counters(org_id, session_id, (0, 0, meta.version), 0, 0)
        kept = [e for e in record.events if e.seq <= after_seq]
        removed = record.events[len(kept) :]
        record.events = kept
        for event in removed:
            record.terms.pop(event.seq, None)
        meta.message_count = max(0, meta.message_count - len(removed))
        meta.token_total = max(0, meta.token_total - sum(e.tokens for e in removed))
        meta.updated_at = max(meta.updated_at, utcnow())  # never back
        meta.version += 1
        return removed

    async def pop_event(
        self,
        org_id: str,
        session_id: str,
        *,
        expected_version: int | None = None,
        incarnation: str | None = None,
    ) -> Event | None:
        """Remove the newest event and return it; None when there is none (see ``Store``)."""
        check_guarded(org_id, session_id, expected_version, incarnation)
        record = self._guarded(org_id, session_id, expected_version, incarnation)
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
        if self._env is not None:
            opened = await self._out_events(org_id, session_id, [replace(e) for e in events])
            return [e.content for e in opened]
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
        if self._env is not None:  # the blind index: the words' keyed hashes
            index = await self._env.sealer.index_key(org_id)
            wanted = {index.term(word) for word in wanted}
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
                if self._env is None:
                    count = term_count(event.content, wanted)
                else:
                    count = term_count(record.terms.get(event.seq, ""), wanted)
                if count:
                    ranked.append((count, event.timestamp, sid, event.seq, event))
        ranked.sort(key=lambda hit: hit[:4], reverse=True)
        hits = [(sid, self._copy_event(event)) for _, _, sid, _, event in ranked[:limit]]
        if self._env is not None:
            hits = [(sid, await self._env.open_event(org_id, sid, event)) for sid, event in hits]
        return [SearchHit(sid, event) for sid, event in hits]

    # -- long-term memory --------------------------------------------------------------------

    async def add_memories(
        self, org_id: str, app_name: str, user_id: str, memories: builtins.list[Memory]
    ) -> builtins.list[Memory]:
        """Add memories of a user; those whose id the user has are skipped (see ``Store``)."""
        check_owner(org_id, app_name, user_id)
        prepared = prepare_memories(memories, self.max_value_bytes)
        env = self._env
        if env is None:
            return self._memories.add((org_id, app_name, user_id), prepared)
        key = await env.user_key(org_id, user_id, verify=True)
        index = await env.sealer.index_key(org_id)
        sealed: builtins.list[Memory] = [
            env.seal_memory(key, index, org_id, app_name, user_id, m) for m in prepared
        ]
        added = {m.id for m in self._memories.add((org_id, app_name, user_id), sealed)}
        return [m for m in prepared if m.id in added]

    async def search_memories(
        self, org_id: str, app_name: str, user_id: str, text: str, *, limit: int = 20
    ) -> builtins.list[Memory]:
        """Return the user's memories sharing a word with ``text``, best first (see
        ``Store``): an inverted index of each user's terms, ranked by ``memories``' rule."""
        terms = check_memory_search(org_id, app_name, user_id, text, limit)
        env = self._env
        if env is None:
            return self._memories.search((org_id, app_name, user_id), terms, limit)
        index = await env.sealer.index_key(org_id)
        blind = [index.term(term) for term in terms]
        found = self._memories.search((org_id, app_name, user_id), blind, limit)
        return await env.open_memories(org_id, app_name, user_id, found)

    async def delete_memories(
        self, org_id: str, app_name: str, user_id: str, *, memory_id: str | None = None
    ) -> int:
        """Delete one memory of the user, or all of them in that app; return how many."""
        check_owner(org_id, app_name, user_id)
        if memory_id is not None:
            validate_id("memory_id", memory_id)
        return self._memories.delete((org_id, app_name, user_id), memory_id)
