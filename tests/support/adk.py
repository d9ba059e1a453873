"""What an ADK app sees of a session: shared by the adapter's tests (needs google-adk)."""

from __future__ import annotations

from typing import Any


def view(session: Any) -> Any:
    """What an ADK app sees of a session (the storage marker aside)."""
    if session is None:
        return None
    return (
        session.id,
        session.app_name,
        session.user_id,
        session.state,
        session.events,
        session.last_update_time,
    )
