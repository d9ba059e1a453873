"""What every section of the contract shares: the tenants, the helpers, the fixtures."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    Manager,
    Session,
    SessionService,
    Store,
)

__all__ = [
    "APP",
    "ORG",
    "OTHER_APP",
    "OTHER_ORG",
    "OTHER_USER",
    "USER",
    "ContractBase",
    "five_events",
    "is_utc",
    "parent_with_events",
    "past",
    "seqs",
    "shared_state_of",
    "twins",
]

ORG = "org-a"
OTHER_ORG = "org-b"
USER = "alice"
OTHER_USER = "bob"
APP = "travel"
OTHER_APP = "billing"


def is_utc(moment: datetime) -> bool:
    """Whether ``moment`` is timezone-aware and at UTC's offset."""
    return moment.tzinfo is not None and moment.utcoffset() == timedelta(0)


async def past(moment: datetime, by: timedelta = timedelta(0)) -> None:
    """Wait until the clock has passed ``moment + by``, ``moment`` being a time a store
    wrote: what the store writes next is stamped later (by ``by`` at least).

    A store stamps sessions itself, from the clock this process reads: a test cannot hand
    it a time, so it waits for the clock instead (microseconds, unless ``by`` asks more).
    """
    until = moment + by
    deadline = time.monotonic() + by.total_seconds() + 10
    while (now := datetime.now(timezone.utc)) <= until:
        if time.monotonic() > deadline:
            raise AssertionError(f"the clock never passed {until}, a time the store wrote")
        await asyncio.sleep(min((until - now).total_seconds(), 0.05))


async def shared_state_of(manager: Manager, org_id: str, user_id: str) -> dict[str, Any]:
    """The user: and app: state a brand-new session of this user sees."""
    fresh = await manager.create(org_id, user_id)
    return {k: v for k, v in fresh.state.items() if k.startswith(("user:", "app:"))}


async def seqs(store: Store, org_id: str, session_id: str, **kwargs: Any) -> list[int]:
    """The seqs of a session's events, as ``list_events`` with ``kwargs`` returns them."""
    return [e.seq for e in await store.list_events(org_id, session_id, **kwargs)]


# -- tenancy ----------------------------------------------------------------------------------


async def twins(manager: Manager) -> tuple[Session, Session]:
    """The same session id, user and app in two organisations, with different state."""
    a = await manager.create(
        ORG, USER, id="twin", state={"p": "a", "user:u": "a", "app:x": "a"}, title="A"
    )
    b = await manager.create(
        OTHER_ORG, USER, id="twin", state={"p": "b", "user:u": "b", "app:x": "b"}, title="B"
    )
    return a, b


async def five_events(store: Store, session_id: str) -> list[datetime]:
    """Append five events a second apart from 2024-05-01 12:00 UTC; return their times."""
    base = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    stamps = [base + timedelta(seconds=i) for i in range(5)]
    for i, stamp in enumerate(stamps):
        await store.append_event(
            ORG, session_id, Event(author="user", content=f"m{i}", timestamp=stamp)
        )
    return stamps


# -- fork -------------------------------------------------------------------------------------


async def parent_with_events(manager: Manager, store: Store) -> Session:
    """A session with state in every scope and three events: the parent of a fork."""
    parent = await manager.create(ORG, USER, state={"p": 1, "user:u": 1, "app:a": 1})
    for i in range(3):
        await store.append_event(ORG, parent.id, Event(author="user", content=f"m{i}", tokens=2))
    return await manager.get(ORG, parent.id)


class ContractBase:
    """The fixtures every section of the contract takes, beside the ``store`` under test."""

    pytestmark = pytest.mark.asyncio

    @pytest.fixture
    def manager(self, store: Store) -> Manager:
        """A Manager of the app under test, over the store under test."""
        return Manager(store, app_name=APP)

    @pytest.fixture
    def service(self, store: Store) -> SessionService:
        """An ADK-style SessionService over the store under test."""
        return SessionService(store)
