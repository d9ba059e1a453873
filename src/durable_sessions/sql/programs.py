"""The store's operations as programs, and the rows they read shaped into sessions and events.

A program is a generator that yields queries and receives their results (see ``runner``);
the runner of the engine's driver drives it. ``Programs`` holds what both dialects run the
same way; ``SQLitePrograms`` and ``PostgresPrograms`` write the rest in each dialect's shape
(a transaction of steps on SQLite, one statement on Postgres), each returning a ``Job``: the
program and how the runner must run it.
"""

from __future__ import annotations

import builtins
import dataclasses
from datetime import datetime, timezone
from typing import Any, Generic, NamedTuple, TypeVar

from ..errors import DecryptionError, SessionError, SessionNotFoundError, StaleSessionError
from ..jsoncodec import copy_json, from_json
from ..model import Event, Session
from ..prepare import (
    RECREATED,
    OwnerState,
    check_counters,
    check_shared_deletes,
    event_from_array,
    event_json,
    merge_state,
)
from ..state import (
    APP_PREFIX,
    USER_PREFIX,
    ScopedDelta,
)
from .compiled import Compiled
from .runner import Mode, Program, Query
from .statements import Retention, Statements

__all__ = [
    "Job",
    "KeyDestroyed",
    "OwnerChanged",
    "Programs",
    "event_from_array",
    "event_from_row",
    "session_from_row",
    "session_with_state",
    "sessions_with_state",
    "shared_items",
    "unwritten",
]

T = TypeVar("T")


class Job(NamedTuple, Generic[T]):
    """A program and the mode the runner drives it in (see ``runner.Mode``)."""

    program: Program[T]
    mode: Mode


# -- result shaping ---------------------------------------------------------------------------


def shared_items(user: dict[str, Any] | None, app: dict[str, Any] | None) -> tuple[Any, Any]:
    """The (key, value) pairs of aggregated user and app state (None when there are none)."""
    return (user or {}).items(), (app or {}).items()


def _utc(moment: datetime) -> datetime:
    """A stored time as read, timezone-aware: asyncpg reads a timestamptz of ``infinity``
    or ``-infinity`` (stored by hand: every write refuses the ends of the range) as a naive
    ``datetime.max`` or ``datetime.min``, which is that moment in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def session_from_row(
    row: Any, state: dict[str, Any] | None = None, persisted: dict[str, Any] | None = None
) -> Session:
    """A session from a row of ``META`` columns, with ``state`` as read (or none).

    ``persisted``, when given, is the snapshot of ``state`` as stored (a copy that shares
    no mutable value with ``state``); otherwise one is made."""
    session = Session(
        id=row.id,
        org_id=row.org_id,
        user_id=row.user_id,
        app_name=row.app_name,
        title=row.title,
        state=state or {},
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
        message_count=row.message_count,
        token_total=row.token_total,
        version=row.version,
        parent_id=row.parent_id,
        incarnation=row.incarnation,
    )
    if persisted is not None:
        session._persisted = persisted
    elif state is not None:
        session.mark_persisted()
    return session


def session_with_state(row: Any) -> Session:
    """A session from a row of ``META``, its private state and aggregated shared state."""
    return session_from_row(
        row, merge_state(row.state, *shared_items(row.user_state, row.app_state))
    )


def sessions_with_state(rows: builtins.list[Any]) -> builtins.list[Session]:
    """Sessions from the rows of a ``list_query`` with state: each row's private state
    (JSON text), and its owner's shared state, given as JSON text by the row that carries
    it (or by every row, when the listing has one owner) and decoded once per distinct
    text."""
    decoded: dict[tuple[str, str], OwnerState] = {}

    def shared(prefix: str, text: str) -> OwnerState:
        found = decoded.get((prefix, text))
        if found is None:
            found = decoded[(prefix, text)] = OwnerState(prefix, from_json(text))
        return found

    users: dict[tuple[str, str], OwnerState] = {}
    apps: dict[str, OwnerState] = {}
    for row in rows:
        owner = (row.app_name, row.user_id)
        if owner not in users and row.user_state is not None:
            users[owner] = shared(USER_PREFIX, row.user_state)
        if row.app_name not in apps and row.app_state is not None:
            apps[row.app_name] = shared(APP_PREFIX, row.app_state)
    found = []
    for row in rows:
        state: dict[str, Any] = from_json(row.state)  # this row's alone: its own
        persisted = copy_json(state)
        for owners in (users[(row.app_name, row.user_id)], apps[row.app_name]):
            if owners.items:
                state.update(owners.fresh())
                persisted.update(owners.snapshot)
        found.append(session_from_row(row, state, persisted))
    return found


def event_from_row(row: Any) -> Event:
    """An event from a row of ``EVENT_COLUMNS``."""
    return Event(
        author=row.author,
        content=row.content,
        invocation_id=row.invocation_id,
        state_delta=row.state_delta,
        tokens=row.tokens,
        id=row.id,
        timestamp=_utc(row.timestamp),
        seq=row.seq,
    )


def shared_params(delta: ScopedDelta) -> dict[str, Any]:
    """The shared part of a delta as the parameters of a single-statement write."""
    return {
        "v_user_set": delta.user_set,
        "v_user_deleted": sorted(delta.user_deleted),
        "v_app_set": delta.app_set,
        "v_app_deleted": sorted(delta.app_deleted),
        "v_user_expected": delta.user_expected,
        "v_app_expected": delta.app_expected,
    }


_ATTEMPTS = 3
"""Times a write is run when it wrote nothing and nothing explains why (``guarded``)."""


def _increments(params: dict[str, Any]) -> tuple[int, int]:
    """The messages and tokens a write's parameters add to a session's counters: a batch's
    ``v_count`` or a touch's ``v_messages``, else one per appended event (``v_tokens``)."""
    tokens = int(params.get("v_tokens", 0))
    if "v_count" in params:
        return int(params["v_count"]), tokens
    if "v_messages" in params:
        return int(params["v_messages"]), tokens
    return (1 if "v_tokens" in params else 0), tokens


def unwritten(params: dict[str, Any]) -> SessionError:
    """The error of a write that wrote nothing though, read again, nothing forbids it.

    A guarded write (``v_expected`` or ``v_incarnation`` given) is stale: the session moved
    on while it ran. An unguarded one targets whatever session has the id, and found none
    each time it ran (deleted, and created again each time before the next look): it never
    claims staleness, which only a guard can detect.
    """
    org_id, session_id = params["k_org"], params["k_id"]
    expected = params.get("v_expected")
    if expected is None and params.get("v_incarnation") is None:
        return SessionNotFoundError(org_id, session_id)
    return StaleSessionError(org_id, session_id, expected or 0)


class KeyDestroyed(DecryptionError):
    """An encrypted store's write found the user's data key it sealed with gone from the
    key table (another process's ``delete_user`` destroyed it) and wrote nothing; the store
    seals again with the user's current key."""

    def __init__(self, org_id: str, key_id: str) -> None:
        super().__init__(
            f"data key {key_id!r} of organisation {org_id!r} was destroyed (its user erased) "
            "while a write sealed with it"
        )
        self.org_id = org_id
        self.key_id = key_id


def check_owner(params: dict[str, Any], row: Any) -> None:
    """Raise ``OwnerChanged`` when an encrypted store's write sealed (``k_key``) for
    another user or app than the session row's."""
    if params.get("k_key") is not None and (row.user_id, row.app_name) != (
        params["k_sealed_user"], params["k_sealed_app"],
    ):  # fmt: skip
        raise OwnerChanged(params["k_org"], params["k_id"])


class OwnerChanged(StaleSessionError):
    """An encrypted store's write sealed for the user and app it knew as the session's
    owners, and found the id made again for others since: it wrote nothing, and the store
    learns the owner again and seals anew (a guarded write is stale, ``RECREATED``)."""

    def __init__(self, org_id: str, session_id: str) -> None:
        super().__init__(org_id, session_id, 0, RECREATED)


def _first_count(row: Any) -> int:
    return int(row.n)


class Programs:
    """The programs both dialects run alike; a dialect's subclass adds the writes."""

    def __init__(self, q: Statements) -> None:
        self.q = q

    # -- reads -----------------------------------------------------------------------------

    def get(self, org_id: str, session_id: str) -> Program[Session]:
        """A session with its merged state."""
        row = (yield Query(self.q.get, {"k_org": org_id, "k_id": session_id})).first()
        if row is None:
            raise SessionNotFoundError(org_id, session_id)
        return session_with_state(row)

    @staticmethod
    def rows(stmt: Any, params: dict[str, Any], make: Any) -> Program[builtins.list[Any]]:
        """Every row of one statement, each passed through ``make``."""
        return [make(row) for row in (yield Query(stmt, params)).rows]

    @staticmethod
    def listing(
        stmt: Any, params: dict[str, Any], with_state: bool
    ) -> Program[builtins.list[Session]]:
        """The sessions of a ``list_query``: metadata only, or with their state."""
        rows = (yield Query(stmt, params)).rows
        if with_state:
            return sessions_with_state(rows)
        return [session_from_row(row) for row in rows]

    @staticmethod
    def listing_json(stmt: Any, params: dict[str, Any]) -> Program[str]:
        """The text of a ``states_json_query``."""
        return str((yield Query(stmt, params)).first().listing)

    def count(self, stmt: Any, params: dict[str, Any]) -> Program[int]:
        """The ``n`` of a counting statement."""
        (found,) = yield from self.rows(stmt, params, _first_count)
        return int(found)

    def require(self, org_id: str, session_id: str) -> Program[int]:
        """Raise ``SessionNotFoundError`` unless the session exists; return its version."""
        found = (yield Query(self.q.exists, {"k_org": org_id, "k_id": session_id})).first()
        if found is None:
            raise SessionNotFoundError(org_id, session_id)
        return int(found.version)

    def events(self, stmt: Any, params: dict[str, Any]) -> Program[builtins.list[Event]]:
        """A transcript read; a second statement only tells "no events" from "no session"."""
        rows = (yield Query(stmt, params)).rows
        if not rows:
            yield from self.require(params["k_org"], params["k_id"])
        return [event_from_row(row) for row in rows]

    def contents(
        self, stmt: Any, params: dict[str, Any], as_rows: bool = False
    ) -> Program[str | None]:
        """The contents of a transcript as the text of one JSON array
        (``Statements.contents_statement``: joined by the database, or here from one text
        per row with ``as_rows``); None when it has no events. The caller decodes it
        (``jsoncodec.loads_json``) where it returns it, in one pass: on SQLite not in the
        worker thread, so that the decoded document is not held in the event loop's queue
        while other tasks run."""
        result = yield Query(stmt, params)
        if as_rows:
            texts = result.rows
            whole = "[" + ",".join(texts) + "]" if texts else None
        else:
            whole = result.rows[0].contents if result.rows else None
        if whole is None:
            yield from self.require(params["k_org"], params["k_id"])
        return whole

    # -- guarded writes ----------------------------------------------------------------------

    def touch(self, params: dict[str, Any]) -> Program[Session]:
        """Add to the counters and title an untitled session: one statement everywhere."""
        row = yield from self.guarded(Query(self.q.touch, params), params)
        return session_from_row(row)

    def guarded(self, query: Query, params: dict[str, Any]) -> Program[Any]:
        """Run a guarded write of a session row; return its row, or raise why it wrote none.

        A statement that wrote nothing is asked why (``check_guard``). When nothing explains
        it, the session only became visible after the statement began (on Postgres, where
        a statement does not see a session committed meanwhile: created, or deleted and
        created again under the same id), and the write is tried again on it.
        """
        for _ in range(_ATTEMPTS):
            row = (yield query).first()
            if row is not None:
                return row
            yield from self.check_guard(params)
        raise unwritten(params)

    def stale(self, params: dict[str, Any]) -> Program[None]:
        """Raise why a guarded write wrote nothing: no session, another life of the id,
        another version, or a counter that would overflow (``check_guard``); when none of
        these holds now, ``unwritten``."""
        yield from self.check_guard(params)
        raise unwritten(params)

    def lock_session(self, lock: Compiled, params: dict[str, Any]) -> Program[None]:
        """Lock the session row (``lock``: a ``FOR UPDATE`` read of it) for the rest of the
        transaction, or raise why there is none to lock.

        A lock that finds no row holds nothing: the steps after it would run on a session
        created meanwhile without its lock. When the session is there on a second look, the
        lock is taken again.
        """
        for _ in range(_ATTEMPTS):
            if (yield Query(lock, params)).first() is not None:
                return
            yield from self.check_guard(params)
        raise unwritten(params)

    def check_guard(self, params: dict[str, Any]) -> Program[None]:
        """Raise what a guarded write of this session would raise now, if anything."""
        org_id, session_id = params["k_org"], params["k_id"]
        found = (yield Query(self.q.meta, {"k_org": org_id, "k_id": session_id})).first()
        if found is None:
            raise SessionNotFoundError(org_id, session_id)
        expected = params.get("v_expected")
        if params.get("v_incarnation") not in (None, found.incarnation):
            raise StaleSessionError(org_id, session_id, expected or 0, RECREATED)
        if expected is not None and expected != found.version:
            raise StaleSessionError(org_id, session_id, expected)
        counters = (found.message_count, found.token_total, found.version)
        check_counters(org_id, session_id, counters, *_increments(params))
        check_owner(params, found)
        yield from self.check_key(params)

    def check_key(self, params: dict[str, Any]) -> Program[None]:
        """Raise ``KeyDestroyed`` when the data key an encrypted store's write sealed with
        (``k_key``) is no longer in the key table."""
        key_id = params.get("k_key")
        if key_id is None:
            return
        found = yield Query(self.q.key_found(), {"k_org": params["k_org"], "k_key": key_id})
        if found.first() is None:
            raise KeyDestroyed(params["k_org"], key_id)

    def truncate_as_rows(
        self, params: dict[str, Any], lock: Compiled | None = None
    ) -> Program[builtins.list[Event]]:
        """A truncation in steps (``Statements.truncation_steps``), the removed events read
        as rows, after ``lock`` (the session row's, where rows are locked): SQLite's and
        distributed Postgres's, and Postgres's for removed events too large for the one
        statement's json text. Run in one write transaction."""
        if lock is not None:
            yield from self.lock_session(lock, params)
        removed_stmt, session_stmt = self.q.truncation_steps()
        rows = (yield Query(removed_stmt, params)).rows
        removed = sorted((event_from_row(row) for row in rows), key=lambda e: e.seq)
        params = {**params, "v_count": len(removed), "v_tokens": sum(e.tokens for e in removed)}
        if (yield Query(session_stmt, params)).first() is None:  # rolled back
            yield from self.stale({**params, "v_count": 0, "v_tokens": 0})
        return removed

    def discard(self, params: dict[str, Any]) -> Job[int]:
        """A truncation that returns how many events it removed, never the events: its
        memory does not grow with the transcript (``Statements.discard_steps``)."""
        return Job(self._discard(params), "write")

    def _discard(self, params: dict[str, Any]) -> Program[int]:
        lock, tally, drop, session_stmt = self.q.discard_steps()
        unchanged = {**params, "v_count": 0, "v_tokens": 0}
        if (yield Query(lock, params)).first() is None:
            yield from self.check_guard(unchanged)  # no such session: raises
        found = (yield Query(tally, params)).first()
        count, tokens = int(found.n), int(found.tokens)
        if count:
            yield Query(drop, params)
        cut = {**params, "v_count": count, "v_tokens": tokens}
        if (yield Query(session_stmt, cut)).first() is None:  # rolled back
            yield from self.check_guard(unchanged)
            raise StaleSessionError(params["k_org"], params["k_id"], params["v_expected"] or 0)
        return count

    def truncate_rows(self, params: dict[str, Any]) -> Job[builtins.list[Event]] | None:
        """``truncate_as_rows`` as a job, for a truncation whose one statement could not
        return its removed events (too large); None where ``truncate`` reads them as rows
        already."""
        return None

    def held_deletes(
        self, params: dict[str, Any], delta: ScopedDelta, owner: Any = None
    ) -> Program[ScopedDelta]:
        """Lock the shared keys a save deletes, check they hold what the copy read, and
        return ``delta`` deleting only the keys found (and so locked).

        A key that is gone when it is looked for is no conflict, and is not deleted: at READ
        COMMITTED nothing locks its absence, so another writer may set it again before this
        save's delete runs, and that value is newer than anything this copy read.

        Args:
            owner: The stored session's row (``app_name``, ``user_id``) when the caller has
                read it already; else it is read here.
        """
        org_id, session_id = params["k_org"], params["k_id"]
        if owner is None:
            owner = (yield Query(self.q.meta, {"k_org": org_id, "k_id": session_id})).first()
            if owner is None:
                raise SessionNotFoundError(org_id, session_id)
        stored: builtins.list[tuple[str, str, Any]] = []
        key = {"k_org": org_id, "k_app": owner.app_name, "k_user": owner.user_id}
        if delta.user_expected:
            found = yield Query(self.q.user_values, {**key, "k_keys": sorted(delta.user_expected)})
            stored += [("user", row.key, row.value) for row in found.rows]
        if delta.app_expected:
            found = yield Query(self.q.app_values, {**key, "k_keys": sorted(delta.app_expected)})
            stored += [("app", row.key, row.value) for row in found.rows]
        check_shared_deletes(org_id, session_id, params["v_expected"], stored, delta)
        held = {scope: {k for s, k, _ in stored if s == scope} for scope in ("user", "app")}
        return dataclasses.replace(
            delta,
            user_deleted=delta.user_deleted & held["user"],
            app_deleted=delta.app_deleted & held["app"],
        )

    # -- retention ---------------------------------------------------------------------------

    def lock_wait(self, wait: float) -> Program[None]:
        """Bound each row lock the rest of this transaction waits for (where there are any)."""
        return
        yield  # a program with no statements

    def delete_batch(
        self, batch: Retention, params: dict[str, Any], wait: float, last: Any
    ) -> Program[int]:
        """Delete up to ``BATCH`` matching sessions with their events; return how many.

        When none is left, run ``last`` (if any) in the same transaction.
        """
        yield from self.lock_wait(wait)
        ids = [row.id for row in (yield Query(batch.pick, params)).rows]
        if not ids:
            if last is not None:
                yield Query(last, params)
            return 0
        yield Query(batch.drop_events, {"k_org": params["k_org"], "k_ids": ids})
        yield Query(batch.drop_sessions, {"k_org": params["k_org"], "k_ids": ids})
        return len(ids)

    def session_then_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        """A session, then its events (``shape``: after?, limit?), as two statements: the
        stepwise ``get_with_events``, and Postgres's for a transcript too large for one
        json text (1 GB). The events are read as rows, so any transcript ``list_events`` can
        return comes back whole."""
        stmt = self.q.shape(("events", *shape), lambda: self.q.events_query(*shape))
        return Job(self._session_then_events(stmt, params, newest_first=shape[1]), "read")

    def session_then_events_json(
        self, shape: tuple[bool, bool], params: dict[str, Any]
    ) -> Job[tuple[Session, str]]:
        """``session_then_events``, with the events as JSON text (``get_with_events_json``)."""
        stmt = self.q.shape(("events:json", *shape), lambda: self.q.events_json_query(*shape))
        return Job(self._session_then_events_json(stmt, params, newest_first=shape[1]), "read")

    def _session_then_events_json(
        self, stmt: Any, params: dict[str, Any], newest_first: bool
    ) -> Program[tuple[Session, str]]:
        session = yield from self.get(params["k_org"], params["k_id"])
        rows = (yield Query(stmt, params)).rows
        if newest_first:
            rows.reverse()
        return session, "[" + ",".join(event_json(*row) for row in rows) + "]"

    def _session_then_events(
        self, stmt: Any, params: dict[str, Any], newest_first: bool
    ) -> Program[Session]:
        session = yield from self.get(params["k_org"], params["k_id"])
        session.events = [event_from_row(row) for row in (yield Query(stmt, params)).rows]
        if newest_first:
            session.events.reverse()
        return session

    # -- the writes each dialect shapes its own way --------------------------------------------

    def create(self, row: dict[str, Any], delta: ScopedDelta) -> Job[tuple[Any, Any]]:
        """Insert a session row and its shared state; return the shared state then held."""
        raise NotImplementedError

    def get_with_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        """A session with its state and the events ``shape`` (after?, limit?) selects."""
        raise NotImplementedError

    def get_with_events_json(
        self, shape: tuple[bool, bool], params: dict[str, Any]
    ) -> Job[tuple[Session, str]]:
        """``get_with_events``, with the events as JSON text."""
        raise NotImplementedError

    def update(self, params: dict[str, Any], delta: ScopedDelta) -> Job[int]:
        """A version-checked save of title, private state and shared delta; the new version."""
        raise NotImplementedError

    def delete(self, key: dict[str, Any]) -> Job[None]:
        """Delete a session and its transcript (``k_org``, ``k_id``; of the app ``k_app``
        and the user ``k_user`` only, where those are not None): one statement."""
        return Job(self._delete(key), "atomic")

    def _delete(self, key: dict[str, Any]) -> Program[None]:
        if not (yield Query(self.q.delete_session, key)).rowcount:
            raise SessionNotFoundError(key["k_org"], key["k_id"])

    def append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Job[int]:
        """Append one event and apply its delta; return its seq."""
        raise NotImplementedError

    def append_many(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Job[int]:
        """Append a batch of events; return the last seq."""
        raise NotImplementedError

    def fork(self, params: dict[str, Any]) -> Job[Session]:
        """Create a child from a parent (and copy its transcript when asked)."""
        raise NotImplementedError

    def truncate(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        """Remove the events after ``k_after_seq``: jobs to try in turn until one returns
        the removed events (a job that returns None lost a race and leaves the next)."""
        raise NotImplementedError

    def pop(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        """Remove the newest event: jobs to try in turn until one returns the removed events
        (``[]`` when there was none; a job that returns None lost a race and leaves the
        next)."""
        raise NotImplementedError
