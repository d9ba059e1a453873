"""A drop-in Google ADK session service over any durable-sessions ``Store``.

Switch an ADK app over by handing the Runner this service instead of one of ADK's::

    from durable_sessions import SQLStore
    from durable_sessions.adk import DurableSessionService

    store = SQLStore(engine)  # a migrated database: await store.migrate() once
    runner = Runner(agent=agent, app_name="my_app",
                    session_service=DurableSessionService(store, org_id="acme"))

Without ``org_id`` each call works in the organisation bound in its context
(``current_org_id()``), so one service can serve every tenant.

Session ids follow ADK: an id is unique within its (app, user), so two users may both have
a session ``"main"``. The ADK session ``(app, user, id)`` is the durable session whose id is
``durable_session_id(app, user, id)``, ``"app/user/id"`` (``%``, ``/`` and ``#`` in a part
written ``%25``, ``%2F``, ``%23``; past 255 characters or 512 bytes of UTF-8,
``"#<hash of app and user>/id"``), with ``app_name`` and ``user_id`` as given: find it with
``durable-sessions show my_app/alice/main`` or ``list --app my_app --user alice``.

ADK's ``Event`` is stored whole, as the JSON of ``model_dump(mode="json",
exclude_none=True)``, in the stored event's ``content`` (never pickled) and read back as
``Event.model_validate`` would (see ``_adk_models``); its ``actions.state_delta`` is the
stored event's ``state_delta``, applied by scope (``app:``, ``user:``, private; ``temp:``
never stored). ``last_update_time`` is the newest event's timestamp (at microseconds, as
ADK's database keeps it), or the session's ``updated_at`` before its first event and in
``list_sessions``. Nothing of the adapter's own is kept in the session's state.
``get_user_state`` reads a user's ``user:`` state whether or not they have a session
(``Store.get_shared_state``); ``import_adk`` (module ``adk_import``) copies a database
written by ADK's ``DatabaseSessionService``.

Requires the ``adk`` extra: ``pip install "durable-sessions[adk]"``.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
from datetime import datetime, timedelta, timezone
from typing import Any

from google.adk import errors as adk_errors
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as AdkSessionNotFoundError,
)
from google.adk.events.event import Event as AdkEvent
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession
from google.genai import types
from pydantic_core import SchemaValidator, ValidationError

from ...context import current_org_id
from ...errors import (
    InvalidArgumentError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
)
from ...jsoncodec import from_json
from ...model import Event, Filter, Session, new_id
from ...prepare import OwnerState, check_limit, event_from_array
from ...state import (
    APP_PREFIX,
    TEMP_PREFIX,
    USER_PREFIX,
    validate_id,
)
from ...store import Store
from ._models import construct, constructor, rebuild, transcript_validator
from .records import (
    MARKER_PREFIX,
    adk_session_id,
    durable_session_id,
    escape,
    marker,
    to_json,
    to_record,
)

__all__ = ["DurableSessionService"]

_STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
# ADK's StaleSessionError (a ValueError) exists since google-adk 2.x; before, ADK raised ValueError.
_STALE_ERROR: type[ValueError] = getattr(adk_errors, "StaleSessionError", ValueError)
_ONE_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _not_found(session_id: str) -> AdkSessionNotFoundError:
    return AdkSessionNotFoundError(f"Session {session_id} not found.")


def _from_record(record: Event) -> AdkEvent:
    """Return the ADK event a durable event holds.

    An event another writer appended (e.g. ``SessionService``) becomes a text event, even
    one whose content has ``actions`` and ``id`` but is not an ADK event's.
    """
    content = record.content
    if isinstance(content, dict) and "actions" in content and "id" in content:
        with contextlib.suppress(ValidationError):
            return rebuild(AdkEvent, content)
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return AdkEvent(
        id=record.id,
        invocation_id=record.invocation_id,
        author=record.author,
        timestamp=record.timestamp.timestamp(),
        content=None
        if content is None
        else types.Content(
            role="user" if record.author == "user" else "model", parts=[types.Part(text=text)]
        ),
        actions=EventActions(state_delta=dict(record.state_delta)),
    )


_ADK_EVENT_KEYS = frozenset({"actions", "id"})
_transcript: SchemaValidator | None = None


def _events_from_json(text: str) -> tuple[list[AdkEvent], int | None]:
    """The ADK events of ``get_with_events_json``'s text, and the newest one's timestamp
    (microseconds), or None without events.

    Events this adapter wrote are validated straight from the text, all at once
    (``transcript_validator``); if any does not validate so, or is not an ADK event's dump
    (a content without ``actions`` and ``id``, as another writer appends), the text is
    decoded and each event read as ``_from_record`` reads it.
    """
    global _transcript
    if _transcript is None:
        _transcript = transcript_validator(AdkEvent)
    try:
        items = _transcript.validate_json(text)
    except ValidationError:
        items = None
    if items is not None and all(item[4].model_fields_set >= _ADK_EVENT_KEYS for item in items):
        return [item[4] for item in items], items[-1][-1] if items else None
    records = [event_from_array(item) for item in from_json(text)]
    newest = (records[-1].timestamp - _EPOCH) // _ONE_MICROSECOND if records else None
    return [_from_record(record) for record in records], newest


def _strip_id(session_id: str | None) -> str | None:
    """Normalise a session id as ADK's in-memory service does: padding stripped."""
    return session_id.strip() if session_id else session_id


def _update_time(stored: Session, newest: Event | None) -> float:
    """ADK's ``last_update_time``: the newest event's time (at the microsecond, as ADK's
    database keeps it), or the last write's without events."""
    return (newest.timestamp if newest is not None else stored.updated_at).timestamp()


_make_session = constructor(
    AdkSession,
    ("id", "app_name", "user_id", "state", "events", "last_update_time"),
    "_storage_update_marker",
)


_LISTING_ORDER = operator.itemgetter(0, 1, 2)


class _Owner:
    """One (app, user) of a listing: its durable ids' prefix and its shared state."""

    __slots__ = ("app", "items", "prefix", "user")

    def __init__(self, app_name: str, user_id: str, user: OwnerState, app: OwnerState) -> None:
        self.prefix = f"{escape(app_name)}/{escape(user_id)}/"
        self.user, self.app = user, app
        # Both plain (no list or object to copy per session): one update of both.
        self.items = {**user.items, **app.items} if user.plain and app.plain else None

    def lay_over(self, state: dict[str, Any]) -> None:
        """Add the owner's ``user:`` then ``app:`` keys to a session's private state."""
        if self.items is not None:
            state.update(self.items)
            return
        state.update(self.user.fresh())
        state.update(self.app.fresh())


def _to_adk(stored: Session, session_id: str, events: list[AdkEvent], updated: float) -> AdkSession:
    return construct(
        AdkSession,
        {
            "id": session_id,
            "app_name": stored.app_name,
            "user_id": stored.user_id,
            "state": stored.state,
            "events": events,
            "last_update_time": updated,
        },
        _storage_update_marker=marker(stored.org_id, stored.version, stored.incarnation),
    )


class DurableSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` over a durable-sessions ``Store``.

    Every method keeps ADK's semantics: session ids are unique per (app, user), and each
    call sees only the sessions of the (app, user) it names; ``get_session`` returns None
    for a missing session, ``delete_session`` ignores one, ``append_event`` skips partial
    events, applies ``temp:`` keys to the in-memory session only and raises ADK's
    ``StaleSessionError`` when the session object is older than storage.

    Args:
        store: Where sessions live: ``InMemoryStore``, ``SQLStore`` or any ``Store``.
        org_id: The organisation every call works in. When None, each call uses the
            organisation bound in the calling context (``current_org_id()``), so one
            service can serve many tenants.

    Raises:
        InvalidArgumentError: ``org_id`` is empty or malformed.
    """

    def __init__(self, store: Store, *, org_id: str | None = None) -> None:
        self.store = store
        self._org_id = None if org_id is None else validate_id("org_id", org_id)

    def _org(self) -> str:
        """Return the organisation of this call.

        Raises:
            MissingScopeError: no org id was given and none is bound in the context.
        """
        return self._org_id if self._org_id is not None else current_org_id()

    async def _load(
        self, org_id: str, app_name: str, user_id: str, session_id: str, limit: int | None
    ) -> Session | None:
        """Return the stored session with its newest ``limit`` events (None: all), or None
        if (app, user) has no such session."""
        try:
            durable_id = durable_session_id(app_name, user_id, session_id)
            if not session_id:
                return None
            stored = await self.store.get_with_events(org_id, durable_id, limit=limit)
        except (SessionNotFoundError, InvalidArgumentError):
            return None
        # The id names (app, user): a session stored under it for another is not theirs.
        if stored.app_name != app_name or stored.user_id != user_id:
            return None
        return stored

    async def _load_json(
        self, org_id: str, app_name: str, user_id: str, session_id: str, limit: int | None
    ) -> tuple[Session, str] | None:
        """``_load``, with the events as JSON text (``Store.get_with_events_json``)."""
        try:
            durable_id = durable_session_id(app_name, user_id, session_id)
            if not session_id:
                return None
            stored, text = await self.store.get_with_events_json(org_id, durable_id, limit=limit)
        except (SessionNotFoundError, InvalidArgumentError):
            return None
        if stored.app_name != app_name or stored.user_id != user_id:
            return None
        return stored, text

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        """Create a session, with a generated id when none (or a blank one) is given.

        ``state`` is split by prefix: ``app:`` keys join the app's state, ``user:`` keys the
        user's, ``temp:`` keys are dropped and the rest are private to the session.

        Raises:
            AlreadyExistsError: (app, user) already has a session with this id.
            InvalidStateError: a state value cannot be stored; nothing is written.
            MissingScopeError: no organisation was given or bound.
        """
        org_id = self._org()
        session_id = _strip_id(session_id) or new_id()
        initial = {k: v for k, v in (state or {}).items() if not k.startswith(TEMP_PREFIX)}
        record = Session(
            id=durable_session_id(app_name, user_id, session_id),
            org_id=org_id,
            user_id=user_id,
            app_name=app_name,
            state={key: to_json(value, key) for key, value in initial.items()},
        )
        try:
            created = await self.store.create(record)
        except SessionExistsError:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        return _to_adk(created, session_id, [], _update_time(created, None))

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        """Return a session with its merged state and events, or None when it is missing.

        ``config.num_recent_events`` keeps the newest N events (0: none);
        ``config.after_timestamp`` keeps events whose timestamp is at or after it.
        """
        org_id = self._org()
        limit = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        check_limit(limit)  # a bad limit is the caller's error, not a missing session
        session_id = _strip_id(session_id) or ""
        # One store read: the session and its newest events (one, for the update time), as
        # JSON text that the events are validated from (_events_from_json).
        read = limit if after is None and limit != 0 else 1
        loaded = await self._load_json(org_id, app_name, user_id, session_id, read)
        if loaded is None:
            return None
        stored, text = loaded
        if after is None and limit != 0:
            events, newest = _events_from_json(text)
        else:
            items = from_json(text)
            newest = items[-1][-1] if items else None
            events = (
                []
                if limit == 0 or after is None
                else await self._events(org_id, stored.id, limit, after)
            )
        # ADK's last_update_time (_update_time): the newest event's, in microseconds.
        updated = stored.updated_at.timestamp() if newest is None else newest / 1_000_000
        return _to_adk(stored, session_id, events, updated)

    async def _events(
        self, org_id: str, durable_id: str, limit: int | None, after: float
    ) -> list[AdkEvent]:
        """Read events: the newest ``limit`` of those at or after ``after`` (exactly)."""
        # Stored timestamps have microsecond precision: read a superset, then filter exactly.
        bound: datetime | None
        try:
            bound = datetime.fromtimestamp(after, tz=timezone.utc) - _ONE_MICROSECOND
        except (ValueError, OverflowError, OSError):  # NaN, or past a datetime's range
            if math.isnan(after):
                raise InvalidArgumentError("after_timestamp must be a number, not NaN") from None
            if after > 0:
                return []  # after every time a datetime can hold
            bound = None
        records = await self.store.list_events(org_id, durable_id, limit=limit, after=bound)
        events = [e for e in map(_from_record, records) if e.timestamp >= after]
        if limit is not None and len(events) < len(records) == limit:
            records = await self.store.list_events(org_id, durable_id, after=bound)
            events = [e for e in map(_from_record, records) if e.timestamp >= after][-limit:]
        return events

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Return an app's sessions, least recently updated first, with state, without events.

        With ``user_id`` only that user's sessions; without it every user's. Sessions made
        through the core API under ids that are not ADK ids (see ``durable_session_id``)
        are left out: no ADK call could name them.
        """
        org_id = self._org()
        # One JSON text (Store.list_states_json): each owner's shared state once, every
        # session as a short array; nothing is built per session but its ADK session.
        text = await self.store.list_states_json(Filter(org_id, user_id=user_id, app_name=app_name))
        return self._listing(org_id, text)

    @staticmethod
    def _listing(org_id: str, text: str) -> ListSessionsResponse:
        """``list_sessions``' response, from ``Store.list_states_json``'s text."""
        listing = from_json(text)
        users = {(a, u): OwnerState(USER_PREFIX, state) for a, u, state in listing["users"]}
        apps = {a: OwnerState(APP_PREFIX, state) for a, state in listing["apps"]}
        owners: dict[tuple[str, str], _Owner] = {}
        prefixes: dict[tuple[str, str], str] = {}
        listed = []
        for durable_id, user, app, updated, version, incarnation, state in listing["sessions"]:
            owner = owners.get((app, user))
            if owner is None:
                owner = owners[(app, user)] = _Owner(app, user, users[(app, user)], apps[app])
            # _adk_session_id, its common case inline: "app/user/id", nothing escaped
            escaped = durable_id[len(owner.prefix) :]
            if not durable_id.startswith(owner.prefix) or "%" in escaped:
                session_id = adk_session_id(durable_id, app, user, prefixes)
                if session_id is None:
                    continue
            elif escaped and "/" not in escaped and "#" not in escaped:
                session_id = escaped
            else:
                continue
            owner.lay_over(state)
            marker = f"{MARKER_PREFIX}{version}:{incarnation}:{org_id}"  # _marker
            listed.append((updated, user, session_id, app, state, marker))
        listed.sort(key=_LISTING_ORDER)  # ADK's: least recently updated, then user and id
        make = _make_session
        sessions = [
            # last_update_time: the session's updated_at.timestamp(), as without events
            make((session_id, app, user, state, [], updated / 1_000_000), marker)
            for updated, user, session_id, app, state, marker in listed
        ]
        return construct(ListSessionsResponse, {"sessions": sessions})

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session and its events; a missing session is ignored, as in ADK.

        It deletes exactly the session ``get_session`` returns for the same arguments: one
        stored under the durable id of (app, user, id) whose app and user are these (a
        session the core API made under that id for another app or user is left alone).
        """
        org_id = self._org()
        session_id = _strip_id(session_id) or ""
        # One statement, no read first: the store deletes the row only if it is the owner's.
        with contextlib.suppress(SessionNotFoundError, InvalidArgumentError):
            if session_id:
                durable_id = durable_session_id(app_name, user_id, session_id)
                await self.store.delete(org_id, durable_id, app_name=app_name, user_id=user_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user's ``user:`` state in this app, keys without the prefix.

        It is there before the user's first session and after their last one is deleted;
        an empty dict when the user has none.
        """
        shared = await self.store.get_shared_state(self._org(), app_name, user_id)
        start = len(USER_PREFIX)
        return {k[start:]: v for k, v in shared.items() if k.startswith(USER_PREFIX)}

    async def append_event(self, session: AdkSession, event: AdkEvent) -> AdkEvent:
        """Store an event and apply it to the session object in place, as ADK expects.

        Partial events are returned untouched. ``temp:`` keys of ``event.actions.state_delta``
        are applied to ``session.state`` and then removed from the event, so they are never
        stored; the other keys are stored by scope and applied to ``session.state``.

        Raises:
            StaleSessionError: (ADK's) storage changed since ``session`` was loaded;
                nothing is written.
            SessionNotFoundError: (ADK's) no such session for this app and user.
            InvalidArgumentError: a field of the event cannot be stored (its author,
                invocation id or id: NUL, a lone surrogate, too long; its timestamp: NaN,
                infinite, or past the stored range, see ``prepare.check_timestamp``), or one
                of its values (``InvalidStateError``); nothing is written and neither the
                session nor the event is changed.
        """
        if event.partial:
            return event
        org_id = self._org()
        delta: dict[str, Any] = (event.actions.state_delta if event.actions else None) or {}
        temp = {k: v for k, v in delta.items() if k.startswith(TEMP_PREFIX)}
        before = {k: session.state[k] for k in temp if k in session.state}

        def undo() -> None:
            """Put the event and the session back as they were given."""
            if temp:
                event.actions.state_delta = delta
                for key in temp:
                    session.state.pop(key, None)
                session.state.update(before)

        if temp:
            event.actions.state_delta = {k: v for k, v in delta.items() if k not in temp}
        try:
            record = to_record(event)
        except InvalidArgumentError:  # a timestamp or value that cannot be stored
            undo()
            raise
        session.state.update(temp)  # for the rest of the invocation, as ADK does
        version, incarnation = await self._check_current(org_id, session)
        try:
            # Checked here, so that the store's InvalidArgumentError below is the event's.
            durable_id = validate_id(
                "session id", durable_session_id(session.app_name, session.user_id, session.id)
            )
        except InvalidArgumentError:
            raise _not_found(session.id) from None
        try:
            # The store checks the version in the same statement as the append, so a writer
            # in another process holding the same revision cannot slip in between.
            await self.store.append_event(
                org_id, durable_id, record, expected_version=version, incarnation=incarnation
            )
        except InvalidArgumentError:  # a field or value of the event the store refuses
            undo()
            raise
        except SessionNotFoundError:
            raise _not_found(session.id) from None
        except StaleSessionError:
            raise _STALE_ERROR(_STALE_MESSAGE) from None
        session._storage_update_marker = marker(org_id, version + 1, incarnation)
        session.last_update_time = record.timestamp.timestamp()
        if event.actions and event.actions.state_delta:
            session.state.update(event.actions.state_delta)
        session.events.append(event)
        return event

    async def _check_current(self, org_id: str, session: AdkSession) -> tuple[int, str]:
        """Return the version and incarnation ``session`` was loaded at, or raise if it is
        not current.

        A session this service loaded carries both: the store checks them when appending,
        with no read first. Any other session object is checked against storage.
        """
        marker = session._storage_update_marker or ""
        if marker.startswith(MARKER_PREFIX):
            version, incarnation, marked_org = marker[len(MARKER_PREFIX) :].split(":", 2)
            if marked_org != org_id:
                raise _not_found(session.id)  # loaded in another organisation
            return int(version), incarnation
        # A session object this service did not load: current if it ends with the newest
        # stored event (or both have none), as ADK's database service checks.
        stored = await self._load(org_id, session.app_name, session.user_id, session.id, 1)
        if stored is None:
            raise _not_found(session.id)
        newest = stored.events[-1].id if stored.events else None
        known = session.events[-1].id if session.events else None
        if newest != known:
            raise _STALE_ERROR(_STALE_MESSAGE)
        return stored.version, stored.incarnation
