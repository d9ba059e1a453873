"""A drop-in Google ADK session service over any durable-sessions ``Store``.

Switch an ADK app over by handing the Runner this service instead of one of ADK's::

    from durable_sessions import SQLStore
    from durable_sessions.adk import DurableSessionService

    store = SQLStore(engine)  # a migrated database: await store.migrate() once
    runner = Runner(agent=agent, app_name="my_app",
                    session_service=DurableSessionService(store, org_id="acme"))

Without ``org_id`` each call works in the organisation bound in its context
(``current_org_id()``), so one service can serve every tenant.

ADK's ``Event`` is stored whole, as the JSON of ``model_dump(mode="json",
exclude_none=True)``, in the stored event's ``content`` (never pickled) and read back with
``Event.model_validate``; its ``actions.state_delta`` is the stored event's ``state_delta``,
applied by scope (``app:``, ``user:``, private; ``temp:`` never stored). ADK sessions get the
library's counters, tenants, forks and retention; ``session.id`` is the durable session id.

Differences from ADK's own services:

* Session ids are unique within an organisation, not within an (app, user): an explicit id
  already taken by another user or app of the organisation is refused with
  ``AlreadyExistsError``, and the other user neither reads nor deletes that session.
* ``last_update_time`` is the timestamp of the session's newest event (creation time
  before the first), as ADK's database service records it.

Requires the ``adk`` extra: ``pip install "durable-sessions[adk]"``.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta, timezone
from typing import Any

try:
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
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "durable_sessions.adk needs Google ADK, which is not installed: "
        f'pip install "durable-sessions[adk]" ({exc})'
    ) from exc

from .context import current_org_id
from .errors import (
    InvalidArgumentError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
)
from .model import Event, Filter, Session, new_id
from .prepare import check_limit
from .state import TEMP_PREFIX, validate_id
from .store import Store

__all__ = ["DurableSessionService"]

_STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
_MARKER_PREFIX = "durable-sessions:v"
# A private state key holding the newest appended event's ADK timestamp (ADK's session
# update time), so that listing needs no read per session. ADK never sees it.
_UPDATE_TIME_KEY = "__adk_last_update_time__"
# ADK's StaleSessionError (a ValueError) exists since google-adk 2.x; before, ADK raised ValueError.
_STALE_ERROR: type[ValueError] = getattr(adk_errors, "StaleSessionError", ValueError)
_ONE_MICROSECOND = timedelta(microseconds=1)


def _marker(org_id: str, version: int) -> str:
    """The revision marker of a session this service loaded: its version and organisation."""
    return f"{_MARKER_PREFIX}{version}:{org_id}"


def _not_found(session_id: str) -> AdkSessionNotFoundError:
    return AdkSessionNotFoundError(f"Session {session_id} not found.")


def _to_json(value: Any) -> Any:
    """Convert a value to JSON as ADK's database service does: unknown types become text."""
    return to_jsonable_python(value, serialize_unknown=True)


def _to_record(event: AdkEvent) -> Event:
    """Return the durable event that stores an ADK event exactly, as JSON."""
    data: dict[str, Any] = event.model_dump(mode="json", exclude_none=True, fallback=_to_json)
    usage = event.usage_metadata
    return Event(
        author=event.author,
        content=data,
        invocation_id=event.invocation_id,
        # The adapter's own bookkeeping rides along: the session's ADK update time.
        state_delta={
            **(data.get("actions", {}).get("state_delta") or {}),
            _UPDATE_TIME_KEY: event.timestamp,
        },
        tokens=max(0, (usage.total_token_count or 0) if usage else 0),
        id=event.id,
        timestamp=datetime.fromtimestamp(event.timestamp, tz=timezone.utc),
    )


def _from_record(record: Event) -> AdkEvent:
    """Return the ADK event a durable event holds.

    An event another writer appended (e.g. ``SessionService``) becomes a text event.
    """
    content = record.content
    if isinstance(content, dict) and "actions" in content and "id" in content:
        return AdkEvent.model_validate(content)
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


def _strip_id(session_id: str | None) -> str | None:
    """Normalise a session id as ADK's in-memory service does: padding stripped."""
    return session_id.strip() if session_id else session_id


class DurableSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` over a durable-sessions ``Store``.

    Every method keeps ADK's semantics: ``get_session`` returns None for a missing session,
    ``delete_session`` ignores one, ``append_event`` skips partial events, applies ``temp:``
    keys to the in-memory session only and raises ADK's ``StaleSessionError`` when the
    session object is older than storage.

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

    async def _owned(
        self,
        org_id: str,
        app_name: str,
        user_id: str,
        session_id: str,
        *,
        events: int | bool = False,
    ) -> Session | None:
        """Return the stored session if it belongs to this app and user, else None.

        With ``events`` (True for all, or a number for the newest ones), its events are
        read in the same store call.
        """
        limit = None if events is True or events is False else int(events)
        check_limit(limit)  # a bad limit is the caller's error, not a missing session
        try:
            validate_id("session_id", session_id)  # a blank or overlong id names no session
            if events is False:
                stored = await self.store.get(org_id, session_id)
            else:
                stored = await self.store.get_with_events(org_id, session_id, limit=limit)
        except (SessionNotFoundError, InvalidArgumentError):
            return None
        if stored.app_name != app_name or stored.user_id != user_id:
            return None
        return stored

    @staticmethod
    def _update_time(stored: Session) -> float:
        """The newest appended event's timestamp, or the creation time without events."""
        value = stored.state.get(_UPDATE_TIME_KEY)
        return float(value) if isinstance(value, (int, float)) else stored.created_at.timestamp()

    @staticmethod
    def _to_adk(stored: Session, events: list[AdkEvent], last_update_time: float) -> AdkSession:
        session = AdkSession(
            id=stored.id,
            app_name=stored.app_name,
            user_id=stored.user_id,
            state={k: v for k, v in stored.state.items() if k != _UPDATE_TIME_KEY},
            events=events,
            last_update_time=last_update_time,
        )
        session._storage_update_marker = _marker(stored.org_id, stored.version)
        return session

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
            AlreadyExistsError: the id is taken in the organisation.
            MissingScopeError: no organisation was given or bound.
        """
        org_id = self._org()
        session_id = _strip_id(session_id) or new_id()
        initial = {k: v for k, v in (state or {}).items() if not k.startswith(TEMP_PREFIX)}
        record = Session(
            id=session_id,
            org_id=org_id,
            user_id=user_id,
            app_name=app_name,
            state=_to_json(initial),
        )
        try:
            created = await self.store.create(record)
        except SessionExistsError:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        return self._to_adk(created, [], created.created_at.timestamp())

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
        if after is None and limit != 0:
            # The common case: the session and its (newest) events in one store read.
            loaded = await self._owned(
                org_id, app_name, user_id, _strip_id(session_id) or "", events=limit or True
            )
            if loaded is None:
                return None
            events = [_from_record(record) for record in loaded.events]
            loaded.events = []
            last = events[-1].timestamp if events else self._update_time(loaded)
            return self._to_adk(loaded, events, last)
        stored = await self._owned(org_id, app_name, user_id, _strip_id(session_id) or "")
        if stored is None:
            return None
        events = [] if limit == 0 else await self._events(org_id, stored.id, limit, after)
        if events and after is None:
            last_update_time = events[-1].timestamp  # the newest stored event was read
        else:
            last_update_time = self._update_time(stored)
        return self._to_adk(stored, events, last_update_time)

    async def _events(
        self, org_id: str, session_id: str, limit: int | None, after: float | None
    ) -> list[AdkEvent]:
        """Read events: the newest ``limit`` of those at or after ``after`` (exactly)."""
        if after is None:
            return [
                _from_record(r)
                for r in await self.store.list_events(org_id, session_id, limit=limit)
            ]
        # Stored timestamps have microsecond precision: read a superset, then filter exactly.
        bound = datetime.fromtimestamp(after, tz=timezone.utc) - _ONE_MICROSECOND
        records = await self.store.list_events(org_id, session_id, limit=limit, after=bound)
        events = [e for e in map(_from_record, records) if e.timestamp >= after]
        if limit is not None and len(events) < len(records) == limit:
            records = await self.store.list_events(org_id, session_id, after=bound)
            events = [e for e in map(_from_record, records) if e.timestamp >= after][-limit:]
        return events

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Return an app's sessions, least recently updated first, with state, without events.

        With ``user_id`` only that user's sessions; without it every user's.
        """
        org_id = self._org()
        found = await self.store.list(
            Filter(org_id, user_id=user_id, app_name=app_name, with_state=True)
        )
        sessions = [self._to_adk(stored, [], self._update_time(stored)) for stored in found]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session and its events; a missing session is ignored, as in ADK."""
        org_id = self._org()
        stored = await self._owned(org_id, app_name, user_id, _strip_id(session_id) or "")
        if stored is None:
            return
        with contextlib.suppress(SessionNotFoundError):  # deleted meanwhile
            await self.store.delete(org_id, stored.id)

    async def append_event(self, session: AdkSession, event: AdkEvent) -> AdkEvent:
        """Store an event and apply it to the session object in place, as ADK expects.

        Partial events are returned untouched. ``temp:`` keys of ``event.actions.state_delta``
        are applied to ``session.state`` and then removed from the event, so they are never
        stored; the other keys are stored by scope and applied to ``session.state``.

        Raises:
            StaleSessionError: (ADK's) storage changed since ``session`` was loaded;
                nothing is written.
            SessionNotFoundError: (ADK's) no such session for this app and user.
        """
        if event.partial:
            return event
        delta = event.actions.state_delta if event.actions else None
        if delta:
            for key, value in delta.items():
                if key.startswith(TEMP_PREFIX):
                    session.state[key] = value
            event.actions.state_delta = {
                k: v for k, v in delta.items() if not k.startswith(TEMP_PREFIX)
            }
        org_id = self._org()
        record = _to_record(event)
        version = await self._check_current(org_id, session)
        try:
            # The store checks the version in the same statement as the append, so a writer
            # in another process holding the same revision cannot slip in between.
            await self.store.append_event(org_id, session.id, record, expected_version=version)
        except SessionNotFoundError:
            raise _not_found(session.id) from None
        except StaleSessionError:
            raise _STALE_ERROR(_STALE_MESSAGE) from None
        session._storage_update_marker = _marker(org_id, version + 1)
        session.last_update_time = event.timestamp
        if event.actions and event.actions.state_delta:
            session.state.update(event.actions.state_delta)
        session.events.append(event)
        return event

    async def _check_current(self, org_id: str, session: AdkSession) -> int:
        """Return the version ``session`` was loaded at, or raise if it is not current.

        A session this service loaded carries its version: the store checks it when
        appending, with no read first. Any other session object is checked against storage.
        """
        marker = session._storage_update_marker or ""
        ours = marker.startswith(_MARKER_PREFIX)
        if ours:
            version, _, marked_org = marker[len(_MARKER_PREFIX) :].partition(":")
            if marked_org != org_id:
                raise _not_found(session.id)  # loaded in another organisation
            return int(version)
        stored = await self._owned(org_id, session.app_name, session.user_id, session.id)
        if stored is None:
            raise _not_found(session.id)
        # A session object this service did not load: current if it ends with the newest
        # stored event (or both have none), as ADK's database service checks.
        last = await self.store.list_events(org_id, session.id, limit=1)
        known = session.events[-1].id if session.events else None
        if (last[0].id if last else None) != known:
            raise _STALE_ERROR(_STALE_MESSAGE)
        return stored.version
