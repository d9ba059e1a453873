"""How an ADK session and event are kept as durable ones: the id scheme and the event record.

Shared by the session service and the importer of ADK's own databases.
"""

from __future__ import annotations

import hashlib
from typing import Any

from google.adk.events.event import Event as AdkEvent
from pydantic_core import to_jsonable_python

from ...errors import InvalidArgumentError, InvalidStateError
from ...model import Event
from ...prepare import timestamp_from_seconds
from ...state import MAX_ID_BYTES, MAX_ID_LENGTH

__all__ = [
    "MARKER_PREFIX",
    "adk_session_id",
    "durable_session_id",
    "escape",
    "fits",
    "marker",
    "to_json",
    "to_record",
    "utf8_size",
]

MARKER_PREFIX = "durable-sessions:v"
"""How a session's revision marker starts when this package loaded it."""

_HASHED = "#"


def escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F").replace("#", "%23")


def _unescape(part: str) -> str:
    # Every "%" of an escaped part starts an escape, so these cannot overlap.
    return part.replace("%2F", "/").replace("%23", "#").replace("%25", "%")


def durable_session_id(app_name: str, user_id: str, session_id: str) -> str:
    """Return the durable-sessions id of the ADK session ``session_id`` of (app, user).

    ``"app/user/id"``, each part with ``%``, ``/`` and ``#`` escaped as ``%25``, ``%2F``
    and ``%23``, so that every (app, user, id) has its own id. When that is longer than
    an id may be (255 characters, 512 bytes as UTF-8: ``MAX_ID_LENGTH``,
    ``MAX_ID_BYTES``), the app and user are replaced by a hash: ``"#<32 hex digits>/id"``.

    Raises:
        InvalidArgumentError: a part is not a string, or even the hashed form is too long
            (an ADK id of more than about 220 characters, or 478 bytes as UTF-8), as the
            core refuses an id over either limit; nothing is written.
    """
    for name, part in (("app_name", app_name), ("user_id", user_id), ("session_id", session_id)):
        if not isinstance(part, str):
            raise InvalidArgumentError(f"{name} must be a string, not {type(part).__name__}")
    readable = f"{escape(app_name)}/{escape(user_id)}/{escape(session_id)}"
    if fits(readable):
        return readable
    owner = f"{app_name}\x00{user_id}".encode("utf-8", "surrogatepass")
    hashed = f"{_HASHED}{hashlib.sha256(owner).hexdigest()[:32]}/{escape(session_id)}"
    if not fits(hashed):
        raise InvalidArgumentError(
            f"session_id is too long ({len(session_id)} characters, "
            f"{utf8_size(session_id)} bytes as UTF-8): its durable id {hashed[:40]!r}... "
            f"would pass the limit of {MAX_ID_LENGTH} characters and {MAX_ID_BYTES} bytes"
        )
    return hashed


def utf8_size(text: str) -> int:
    """The length of ``text`` in UTF-8 bytes (a lone surrogate counted as its 3 bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def fits(durable_id: str) -> bool:
    """Whether a durable id is within both limits the core puts on ids: characters and
    UTF-8 bytes (``validate_id``)."""
    return len(durable_id) <= MAX_ID_LENGTH and utf8_size(durable_id) <= MAX_ID_BYTES


def adk_session_id(
    durable_id: str, app_name: str, user_id: str, prefixes: dict[tuple[str, str], str]
) -> str | None:
    """Return the ADK id of a stored session, or None if it is not an ADK session's.

    ``prefixes`` caches each (app, user)'s ``"app/user/"`` across the sessions of a list.
    """
    owner = (app_name, user_id)
    prefix = prefixes.get(owner)
    if prefix is None:
        prefix = prefixes[owner] = f"{escape(app_name)}/{escape(user_id)}/"
    if durable_id.startswith(prefix):
        escaped = durable_id[len(prefix) :]
        if "%" not in escaped:  # nothing escaped: most ids
            plain = escaped and "/" not in escaped and "#" not in escaped
            return escaped if plain else None
        session_id = _unescape(escaped)
        # The readable form names one (app, user, id): only if it is the canonical escape.
        return session_id if escape(session_id) == escaped else None
    if not durable_id.startswith(_HASHED):
        return None
    session_id = _unescape(durable_id.rpartition("/")[2])
    try:
        expected = durable_session_id(app_name, user_id, session_id)
    except InvalidArgumentError:
        return None
    return session_id if expected == durable_id else None


def marker(org_id: str, version: int, incarnation: str) -> str:
    """The revision marker of a session this service loaded: its version, the life of its
    id (a session deleted and created again under the same id is another) and organisation."""
    return f"{MARKER_PREFIX}{version}:{incarnation}:{org_id}"


def to_json(value: Any, key: str) -> Any:
    """Convert a value to JSON as ADK's database service does: unknown types become text.

    Raises:
        InvalidStateError: the value cannot be converted (nested too deeply, say).
    """
    try:
        return to_jsonable_python(value, serialize_unknown=True)
    except (ValueError, RecursionError) as exc:
        raise InvalidStateError(key, f"cannot be stored as JSON ({exc})") from None


def to_record(event: AdkEvent) -> Event:
    """Return the durable event that stores an ADK event exactly, as JSON.

    Raises:
        InvalidArgumentError: the event's timestamp is not a finite number of seconds in the
            stored range (``prepare.check_timestamp``).
        InvalidStateError: a value of the event cannot be stored as JSON.
    """
    timestamp = timestamp_from_seconds("event timestamp", event.timestamp)
    try:
        data: dict[str, Any] = event.model_dump(
            mode="json", exclude_none=True, fallback=lambda v: to_json(v, "<event>")
        )
    except (ValueError, RecursionError):
        # Name the state key at fault if there is one; else the event as a whole.
        for key, value in (event.actions.state_delta or {}).items():
            to_json(value, key)
        raise InvalidStateError("<event>", "the event cannot be stored as JSON") from None
    usage = event.usage_metadata
    return Event(
        author=event.author,
        content=data,
        invocation_id=event.invocation_id,
        state_delta=dict(data.get("actions", {}).get("state_delta") or {}),
        tokens=max(0, (usage.total_token_count or 0) if usage else 0),
        id=event.id,
        timestamp=timestamp,
    )
