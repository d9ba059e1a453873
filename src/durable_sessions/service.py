"""SessionService: the ADK-style service whose sessions carry their events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .errors import SessionNotFoundError
from .model import Event, Filter, Session, new_id
from .state import validate_id
from .store import Store

__all__ = ["SessionService"]


class SessionService:
    """Sessions addressed by (app name, user id, session id), as in the ADK sessions chapter.

    All sessions live in one organisation, ``org_id``; run one service per tenant (or use
    ``Manager``) to keep tenants apart. Works unchanged on any ``Store``.
    """

    def __init__(self, store: Store, *, org_id: str = "default") -> None:
        self.store = store
        self.org_id = validate_id("org_id", org_id)

    async def create(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session, with a generated id when none is given.

        Raises:
            SessionExistsError: ``session_id`` is taken.
            InvalidStateError: ``state`` holds something that cannot be stored.
        """
        session = Session(
            id=new_id() if session_id is None else session_id,
            org_id=self.org_id,
            user_id=user_id,
            app_name=app_name,
            state=dict(state or {}),
        )
        return await self.store.create(session)

    async def _owned(self, app_name: str, user_id: str, session_id: str) -> Session:
        session = await self.store.get(self.org_id, session_id)
        if session.app_name != app_name or session.user_id != user_id:
            raise SessionNotFoundError(self.org_id, session_id)
        return session

    async def get(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None = None,
        after: datetime | None = None,
    ) -> Session:
        """Return a session with ``events`` loaded: the newest ``num_recent_events``, and
        only those strictly later than ``after`` when given.

        Raises:
            SessionNotFoundError: no such session for this app and user.
        """
        session = await self.store.get_with_events(
            self.org_id, session_id, limit=num_recent_events, after=after
        )
        if session.app_name != app_name or session.user_id != user_id:
            raise SessionNotFoundError(self.org_id, session_id)
        return session

    async def list(self, *, app_name: str, user_id: str) -> list[Session]:
        """Return a user's sessions of an app, most recently updated first, without state."""
        return await self.store.list(Filter(self.org_id, user_id=user_id, app_name=app_name))

    async def delete(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session and its events.

        Raises:
            SessionNotFoundError: no such session for this app and user.
        """
        await self._owned(app_name, user_id, session_id)
        await self.store.delete(self.org_id, session_id)

    async def append_event(self, session: Session | str, event: Event) -> Event:
        """Append an event to a session (given by object or id) and apply its state delta.

        Given a ``Session`` object, it is updated in place: the event joins ``events`` and
        the delta joins ``state`` (``temp:`` keys included, but never stored).
        """
        if not isinstance(session, Session):
            return await self.store.append_event(self.org_id, session, event)
        stored = await self.store.append_event(
            self.org_id, session.id, event, incarnation=session.incarnation
        )
        session.events.append(stored)
        session.apply_appended(event)
        return stored
