"""Checks and preparation shared by every store, so they refuse the same input the same way."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from .cursor import decode_cursor, encode_cursor
from .errors import InvalidArgumentError, StaleSessionError
from .fulltext import MAX_QUERY, MAX_WORD, fold, query_words
from .jsoncodec import copy_json, json_equal, to_json
from .model import Event, Filter, Page, Session, new_id
from .state import (
    APP_PREFIX,
    MAX_INT64,
    USER_PREFIX,
    ScopedDelta,
    check_text,
    checked_copy,
    split_delta,
    validate_id,
)
from .store import check_after_seq

__all__ = [
    "EARLIEST",
    "FORKED_FROM",
    "LATEST",
    "MAX_INCREMENT",
    "MAX_INT64",
    "MAX_LIMIT",
    "MAX_TITLE_BYTES",
    "PAGE_SIZE",
    "RECREATED",
    "TIMESTAMP_RANGE",
    "OwnerState",
    "check_after",
    "check_count",
    "check_counters",
    "check_delete",
    "check_delete_user",
    "check_events_read",
    "check_expected",
    "check_fork",
    "check_limit",
    "check_list_events",
    "check_list_page",
    "check_max_bytes",
    "check_older_than",
    "check_purge",
    "check_search",
    "check_session",
    "check_shared_deletes",
    "check_timeout",
    "check_timestamp",
    "check_title",
    "check_touch",
    "cut_title",
    "event_from_array",
    "event_json",
    "events_json",
    "fork_state",
    "make_page",
    "merge_state",
    "micros",
    "page_fetch",
    "prepare_create",
    "prepare_event",
    "prepare_update",
    "purge_cutoff",
    "timestamp_from_seconds",
]

MAX_LIMIT = MAX_INT64
"""The largest limit accepted: a 64-bit signed integer."""
MAX_INCREMENT = 2**31 - 1
"""The largest counter increment accepted, so that 64-bit counters cannot overflow."""

EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc)
"""The earliest timestamp stored (events, and the times an import brings): a day after
``datetime.min``. Postgres takes ``datetime.min`` and ``datetime.max`` for ``-infinity`` and
``infinity``, which no read can give back; a day inside each end also keeps every stored
moment expressible in any time zone."""
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)
"""The latest timestamp stored: a day before ``datetime.max`` (see ``EARLIEST``)."""
TIMESTAMP_RANGE = "from 0001-01-02 to 9999-12-30T23:59:59.999999 UTC"
"""``EARLIEST`` to ``LATEST``, as error messages name them."""

MAX_TITLE_BYTES = 1024
"""The longest session title, in UTF-8 bytes."""

RECREATED = "was deleted and created again since this copy was read"
"""Why a write from a copy of an earlier life of a session id is refused."""

FORKED_FROM = "forked_from"
"""The private state key in which a forked session records its parent's id."""


def check_session(org_id: str, session_id: str) -> None:
    """Check an (org id, session id) pair."""
    validate_id("org_id", org_id)
    validate_id("session_id", session_id)


def check_delete(org_id: str, session_id: str, app_name: str | None, user_id: str | None) -> None:
    """Check a delete: the session, and the owner it must have when one is given."""
    check_session(org_id, session_id)
    if app_name is not None:
        validate_id("app_name", app_name, allow_empty=True)
    if user_id is not None:
        validate_id("user_id", user_id)


def check_max_bytes(max_value_bytes: int | None) -> int | None:
    """Check a store's value size limit (None means no limit)."""
    if max_value_bytes is not None and (
        isinstance(max_value_bytes, bool)
        or not isinstance(max_value_bytes, int)
        or max_value_bytes < 1
    ):
        raise InvalidArgumentError("max_value_bytes must be a positive integer or None")
    return max_value_bytes


def check_limit(limit: int | None) -> None:
    """Check an optional event limit."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT
    ):
        raise InvalidArgumentError(f"limit must be None or an integer from 0 to {MAX_LIMIT}")


def _int64(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int)
        and -MAX_INT64 - 1 <= value <= MAX_INT64
    )


def check_expected(expected_version: int | None, incarnation: str | None = None) -> None:
    """Check an optional expected version (a 64-bit signed integer, as stored) and an
    optional incarnation (an id: a string, as ids are)."""
    if expected_version is not None and not _int64(expected_version):
        raise InvalidArgumentError(
            "expected_version must be None or an integer in the 64-bit signed range"
        )
    if incarnation is not None:
        validate_id("incarnation", incarnation, allow_empty=True)  # "": made before 0002


NO_TRUNCATION: Any = object()
"""``check_guarded``'s ``after_seq`` for a write that truncates nothing."""


def check_guarded(
    org_id: str,
    session_id: str,
    expected_version: int | None,
    incarnation: str | None,
    *,
    after_seq: Any = NO_TRUNCATION,
    title: str = "",
) -> None:
    """Check a write to one session that a copy's version or incarnation may guard: the
    ids, the ``after_seq`` of a truncation, the guard, then a title it sets."""
    check_session(org_id, session_id)
    if after_seq is not NO_TRUNCATION:
        check_after_seq(after_seq)
    check_expected(expected_version, incarnation)
    check_title(title)


def check_count(name: str, value: int) -> None:
    """Check a counter increment (bounded, so that 64-bit counters never overflow)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INCREMENT:
        raise InvalidArgumentError(f"{name} must be an integer from 0 to {MAX_INCREMENT}")


def check_after(after: datetime | None, name: str = "after") -> datetime | None:
    """Check a moment (the argument ``name``: an ``after`` bound, an event's timestamp) and
    return it in UTC."""
    if after is None:
        return None
    if not isinstance(after, datetime):
        raise InvalidArgumentError(f"{name} must be a datetime, not {type(after).__name__}")
    if after.tzinfo is None or after.utcoffset() is None:
        raise InvalidArgumentError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc))"
        )
    try:
        return after.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidArgumentError(f"{name} is out of range in UTC (years 1 to 9999)") from None


def check_timestamp(name: str, moment: Any) -> datetime:
    """Check a timestamp to store and return it in UTC: a timezone-aware ``datetime`` from
    ``EARLIEST`` to ``LATEST``, alike on every store.

    Raises:
        InvalidArgumentError: it is not a datetime, is naive, or is out of that range
            (``name`` says which argument).
    """
    aware = isinstance(moment, datetime) and moment.utcoffset() is not None
    # Compared as aware datetimes (no conversion, which could overflow at the ends).
    if aware and not EARLIEST <= moment <= LATEST:
        raise InvalidArgumentError(
            f"{name} {moment.isoformat()} is out of range ({TIMESTAMP_RANGE})"
        )
    utc = check_after(moment, name)  # not a datetime, or naive: its error
    if utc is None:
        raise InvalidArgumentError(f"{name} must be a datetime, not None")
    return utc


def timestamp_from_seconds(name: str, seconds: Any) -> datetime:
    """Return a number of seconds since 1970-01-01 UTC (as ADK's ``Event.timestamp``) as a
    stored timestamp (``check_timestamp``).

    Raises:
        InvalidArgumentError: it is not a finite number, or is out of the stored range.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(
            f"{name} must be a number of seconds, not {type(seconds).__name__}"
        )
    try:
        moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (ValueError, OverflowError, OSError):  # NaN, infinities, past the year 9999
        raise InvalidArgumentError(
            f"{name} {seconds!r} is not a time in range ({TIMESTAMP_RANGE})"
        ) from None
    return check_timestamp(name, moment)


def check_counters(
    org_id: str,
    session_id: str,
    counters: tuple[int, int, int],
    messages: int,
    tokens: int,
) -> None:
    """Check that a write can add ``messages``, ``tokens`` and one version to a session.

    ``counters`` are the stored ``(message_count, token_total, version)``. Increments are
    bounded (``MAX_INCREMENT``), so only counters brought near 2**63 - 1 (by an import)
    can overflow; such a write is refused on every store, and nothing is written.
    """
    message_count, token_total, version = counters
    if (
        message_count > MAX_INT64 - messages
        or token_total > MAX_INT64 - tokens
        or version >= MAX_INT64
    ):
        raise InvalidArgumentError(
            f"session {session_id!r} in organisation {org_id!r}: this write would overflow "
            "its message_count, token_total or version past 2**63 - 1; nothing was written"
        )


def check_older_than(older_than: timedelta) -> timedelta:
    """Check a retention period."""
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidArgumentError("older_than must be a non-negative timedelta")
    return older_than


def purge_cutoff(older_than: timedelta, now: datetime) -> datetime:
    """Return the time before which ``purge`` deletes sessions: ``now - older_than``.

    Raises:
        InvalidArgumentError: ``older_than`` is not a non-negative timedelta, or it reaches
            back before the year 1 (no datetime can hold the cutoff), alike on every store.
    """
    check_older_than(older_than)
    try:
        return now - older_than
    except OverflowError:
        days = (now - datetime.min.replace(tzinfo=now.tzinfo)).days
        raise InvalidArgumentError(
            f"older_than reaches back before the year 1: at most {days} days"
        ) from None


def check_timeout(name: str, seconds: float) -> float:
    """Check a timeout: a positive, finite number of seconds."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 < seconds < 10**9  # also refuses NaN and infinity
    ):
        raise InvalidArgumentError(f"{name} must be a positive number of seconds")
    return float(seconds)


def check_title(title: str) -> str:
    """Check a session title and return it: a string of at most ``MAX_TITLE_BYTES`` UTF-8
    bytes that every store keeps as it is."""
    if not isinstance(title, str):
        raise InvalidArgumentError("title must be a string")
    problem = check_text(title)
    if problem:
        raise InvalidArgumentError(f"title {problem}")
    if len(title) > MAX_TITLE_BYTES // 4 and len(title.encode("utf-8")) > MAX_TITLE_BYTES:
        raise InvalidArgumentError(f"title is longer than {MAX_TITLE_BYTES} UTF-8 bytes")
    return title


def cut_title(title: str) -> str:
    """Return ``title`` cut to at most ``MAX_TITLE_BYTES`` UTF-8 bytes, at a character
    boundary (never inside a character's encoding): for titles an import brings."""
    if len(title) <= MAX_TITLE_BYTES // 4:
        return title
    return title.encode("utf-8")[:MAX_TITLE_BYTES].decode("utf-8", "ignore")


def _check_metadata(session: Session) -> None:
    check_session(session.org_id, session.id)
    for name in ("version", "message_count", "token_total"):
        if not _int64(getattr(session, name)):
            raise InvalidArgumentError(f"{name} must be an integer in the 64-bit signed range")
    validate_id("user_id", session.user_id)
    validate_id("app_name", session.app_name, allow_empty=True)
    check_title(session.title)


def prepare_create(session: Session, max_bytes: int | None = None) -> ScopedDelta:
    """Check a new session and return its whole state as a delta."""
    _check_metadata(session)
    if session.parent_id is not None:
        validate_id("parent_id", session.parent_id)
    return split_delta(session.state, (), max_bytes)


def prepare_update(session: Session, max_bytes: int | None = None) -> ScopedDelta:
    """Check a session about to be saved and return what changed since it was read."""
    _check_metadata(session)
    check_counters(session.org_id, session.id, (0, 0, session.version), 0, 0)
    changed, deleted = session.changes()
    delta = split_delta(changed, deleted, max_bytes)
    # A shared key is deleted only while it still holds what this copy read: a copy that
    # read user:plan="free" must not delete the "paid" another session wrote since.
    read = session._persisted
    delta.user_expected = {k: read[USER_PREFIX + k] for k in delta.user_deleted}
    delta.app_expected = {k: read[APP_PREFIX + k] for k in delta.app_deleted}
    return delta


def check_shared_deletes(
    org_id: str,
    session_id: str,
    version: int,
    stored: Iterable[tuple[str, str, Any]],
    delta: ScopedDelta,
) -> None:
    """Raise ``StaleSessionError`` if a shared key a save deletes changed since it was read.

    ``stored`` holds the current ``(scope, key, value)`` of those keys ("user" or "app",
    key without its prefix); a key that is gone already is no conflict.
    """
    expected = {"user": delta.user_expected, "app": delta.app_expected}
    for scope, key, value in stored:
        if key in expected[scope] and not json_equal(value, expected[scope][key]):
            prefix = USER_PREFIX if scope == "user" else APP_PREFIX
            raise StaleSessionError(
                org_id,
                session_id,
                version,
                f"cannot delete {prefix + key!r}: another writer changed it since this copy "
                "read it",
            )


def prepare_event(event: Event, max_bytes: int | None = None) -> tuple[Event, ScopedDelta]:
    """Check an event and return the copy to store (no ``temp:`` keys) and its delta."""
    if not isinstance(event, Event):
        raise InvalidArgumentError(f"expected an Event, not {type(event).__name__}")
    validate_id("event author", event.author, allow_empty=True)
    validate_id("event id", event.id)
    validate_id("event invocation_id", event.invocation_id, allow_empty=True)
    check_count("event tokens", event.tokens)
    stamp = check_timestamp("event timestamp", event.timestamp)
    content = checked_copy("<event content>", event.content, max_bytes)
    given = event.state_delta
    if not isinstance(given, Mapping):
        raise InvalidArgumentError("event state_delta must be a dict")
    if given:
        delta = split_delta(given, (), max_bytes)
        kept = {k: copy_json(v) for k, v in given.items() if not k.startswith("temp:")}
    else:  # most events change no state
        delta, kept = ScopedDelta(), {}
    if type(event) is not Event:  # a subclass: replace() keeps its type and its own fields
        return replace(event, content=content, state_delta=kept, timestamp=stamp), delta
    stored = Event(
        author=event.author,
        content=content,
        invocation_id=event.invocation_id,
        state_delta=kept,
        tokens=event.tokens,
        id=event.id,
        timestamp=stamp,
        seq=event.seq,
    )
    return stored, delta


def merge_state(
    private: Mapping[str, Any],
    user: Iterable[tuple[str, Any]],
    app: Iterable[tuple[str, Any]],
) -> dict[str, Any]:
    """Merge private state and shared rows into the flat namespace callers see."""
    state = dict(private)
    state.update((USER_PREFIX + key, value) for key, value in user)
    state.update((APP_PREFIX + key, value) for key, value in app)
    return state


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_quote = json.encoder.encode_basestring  # a str as JSON text (C), non-ASCII kept as is


def micros(moment: datetime) -> int:
    """A timezone-aware moment in microseconds since 1970-01-01 UTC, exactly."""
    return (moment - _EPOCH) // _MICROSECOND


def event_json(
    seq: int,
    event_id: str,
    author: str,
    invocation_id: str,
    content: str,
    state_delta: str,
    tokens: int,
    timestamp: datetime,
) -> str:
    """One event of ``Store.get_with_events_json``, its content and delta as JSON text:
    ``[seq, id, author, invocation_id, content, state_delta, tokens, micros]``."""
    return (
        f"[{seq},{_quote(event_id)},{_quote(author)},{_quote(invocation_id)},"
        f"{content},{state_delta},{tokens},{micros(timestamp)}]"
    )


def event_from_array(item: list[Any]) -> Event:
    """An event from its ``[seq, id, author, invocation_id, content, state_delta, tokens,
    epoch microseconds]`` array (Postgres's transcript, ``Store.get_with_events_json``)."""
    seq, event_id, author, invocation_id, content, state_delta, tokens, moment = item
    return Event(
        author=author,
        content=content,
        invocation_id=invocation_id,
        state_delta=state_delta,
        tokens=tokens,
        id=event_id,
        timestamp=_EPOCH + timedelta(microseconds=moment),
        seq=seq,
    )


def events_json(events: Iterable[Event]) -> str:
    """The events of ``Store.get_with_events_json`` as JSON text, from ``Event`` objects."""
    items = []
    for e in events:
        content, delta = to_json(e.content), to_json(e.state_delta)
        item = event_json(
            e.seq, e.id, e.author, e.invocation_id, content, delta, e.tokens, e.timestamp
        )
        items.append(item)
    return "[" + ",".join(items) + "]"


class OwnerState:
    """One owner's ``user:`` or ``app:`` state in a listing: prefixed once for all its
    sessions, and copied for each only where a value is mutable (a listing of sessions
    with state: ``sessions_with_state``, the ADK adapter's ``list_sessions``)."""

    __slots__ = ("items", "plain", "snapshot")

    def __init__(self, prefix: str, stored: dict[str, Any]) -> None:
        self.items = {prefix + key: value for key, value in stored.items()}
        # Strings, numbers, booleans and null can be shared by every session of the
        # listing; lists and objects are copied for each (a session's state is its own).
        self.plain = all(type(value) in _IMMUTABLE for value in self.items.values())
        # The stored snapshot (``Session._persisted``) is only ever read or replaced, never
        # changed in place: one copy serves every session of the owner.
        self.snapshot = self.items if self.plain else copy_json(self.items)

    def fresh(self) -> dict[str, Any]:
        """The items for one more session's state."""
        return self.items if self.plain else copy_json(self.items)


_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def fork_state(parent_private: Mapping[str, Any], parent_id: str) -> dict[str, Any]:
    """Return a fork's private state: the parent's, plus the record of the parent."""
    state: dict[str, Any] = copy_json(dict(parent_private))
    state[FORKED_FROM] = parent_id
    return state


# -- one check per operation: every store calls these first, so the same bad call gets the
# -- same error, with the same message, from every store.


def check_events_read(
    org_id: str, session_id: str, limit: int | None, after: datetime | None
) -> datetime | None:
    """Check a transcript read (``list_events``, ``get_with_events``); return ``after`` in UTC."""
    check_session(org_id, session_id)
    check_limit(limit)
    return check_after(after)


def check_list_events(
    org_id: str,
    session_id: str,
    limit: int | None,
    after: datetime | None,
    after_seq: int | None,
) -> datetime | None:
    """Check a ``list_events``; return ``after`` in UTC."""
    found = check_events_read(org_id, session_id, limit, after)
    if after_seq is not None:
        check_after_seq(after_seq)
    return found


def check_touch(org_id: str, session_id: str, messages: int, tokens: int, title: str) -> None:
    """Check a ``touch``."""
    check_session(org_id, session_id)
    check_count("messages", messages)
    check_count("tokens", tokens)
    check_title(title)


def check_fork(org_id: str, session_id: str, new_session_id: str | None) -> str:
    """Check a ``fork``; return the child's id (a new one when none is given)."""
    check_session(org_id, session_id)
    child_id = new_id() if new_session_id is None else new_session_id
    validate_id("new_session_id", child_id)
    return child_id


def check_purge(org_id: str, older_than: timedelta, now: datetime) -> datetime:
    """Check a ``purge``; return its cutoff (see ``purge_cutoff``)."""
    validate_id("org_id", org_id)
    return purge_cutoff(older_than, now)


def check_delete_user(org_id: str, user_id: str) -> None:
    """Check a ``delete_user``."""
    validate_id("org_id", org_id)
    validate_id("user_id", user_id)


# -- pages of a listing ----------------------------------------------------------------------

PAGE_SIZE = 100
"""Sessions per page of ``list_page`` when the filter's ``limit`` is 0."""


def check_list_page(filter: Filter, cursor: str | None) -> tuple[int, tuple[datetime, str] | None]:
    """Check a ``list_page``; return its page size and the position to start after (None:
    the first page)."""
    if not isinstance(filter, Filter):
        raise InvalidArgumentError(f"filter must be a Filter, not {type(filter).__name__}")
    position = None if cursor is None else decode_cursor(filter, cursor)
    return filter.limit or PAGE_SIZE, position


def page_fetch(size: int) -> int:
    """How many sessions a page of ``size`` reads: one more, to tell whether another
    page follows (never past the 64-bit limit)."""
    return min(size, MAX_INT64 - 1) + 1


def make_page(filter: Filter, found: Sequence[Session], size: int) -> Page:
    """The page of ``size`` from the ``page_fetch(size)`` sessions read after the position."""
    sessions = list(found[:size])
    more = len(found) > size
    return Page(sessions, encode_cursor(filter, sessions[-1]) if more else None)


# -- search -----------------------------------------------------------------------------------


def check_search(
    org_id: str,
    text: str,
    user_id: str | None,
    app_name: str | None,
    session_id: str | None,
    limit: int,
) -> list[str]:
    """Check a ``search``; return the (case-folded) words of ``text``, each once."""
    validate_id("org_id", org_id)
    if user_id is not None:
        validate_id("user_id", user_id)
    if app_name is not None:
        validate_id("app_name", app_name, allow_empty=True)
    if session_id is not None:
        validate_id("session_id", session_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, not {type(text).__name__}")
    problem = check_text(text)
    if problem:
        raise InvalidArgumentError(f"text {problem}")
    if len(text) > MAX_QUERY:
        raise InvalidArgumentError(f"text is longer than {MAX_QUERY} characters")
    found = query_words(text)
    if not found:
        raise InvalidArgumentError(
            "text has no word to search for (a word is a run of letters, digits and marks)"
        )
    if any(len(word) > MAX_WORD for word in found):
        raise InvalidArgumentError(f"text has a word longer than {MAX_WORD} characters")
    return [fold(word) for word in found]
