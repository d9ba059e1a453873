"""Writes as one transaction of single-table steps: SQLite always, Postgres in distributed mode.

Every step is one statement on one table, and every table it reads or writes is filtered on
the bound organisation (``k_org``); no step is a data-modifying CTE. That is the shape SQLite
needs (one statement per table) and the shape Citus routes to the one worker holding the
organisation, committing there with a plain COMMIT.

SQLite takes its write lock up front (``BEGIN IMMEDIATE``): the steps see and change the
database alone. Postgres runs them in one transaction at READ COMMITTED (``row_locks``), so
the steps that read and then write lock first: fork locks the parent before copying its
transcript, truncation locks the session row before deleting events, an append merges its
private delta in the UPDATE (``jsonb ||``) rather than reading it first, and a save's shared
deletes lock their rows (``Statements.locked``). Locks are taken in one order everywhere: the
session row, then ``user:`` keys, then ``app:`` keys, each in sorted order.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Table, bindparam, delete, insert, select
from sqlalchemy.engine import Dialect

from ..errors import SessionExistsError, SessionNotFoundError
from ..model import Event, Session
from ..prepare import fork_state, merge_state
from ..state import ScopedDelta
from .dialect import DialectOps
from .programs import Job, Programs, session_from_row, shared_items
from .runner import Program, Query
from .schema import app_state, events, user_state
from .statements import (
    APP_KEY,
    EVENT_COLUMNS,
    EVENTS_KEY,
    META,
    SESSION_KEY,
    USER_KEY,
    S,
    Statements,
)

__all__ = ["StepwisePrograms", "StepwiseStatements", "bound_row", "fork_row"]


def fork_row(params: dict[str, Any], parent: Any, title: str, state: Any) -> dict[str, Any]:
    """The row of a fork's child written step by step (distributed mode, MySQL, an encrypted
    store): the parent's owner, and its counters when the transcript comes along; ``title``
    and the private ``state`` as the caller stores them (sealed or not)."""
    with_events, now = params["v_with_events"], params["v_now"]
    return {
        "org_id": params["k_org"], "id": params["k_child"], "user_id": parent.user_id,
        "app_name": parent.app_name, "title": title, "state": state,
        "parent_id": params["k_id"], "created_at": now, "updated_at": now,
        "message_count": parent.message_count if with_events else 0,
        "token_total": parent.token_total if with_events else 0,
        "event_seq": parent.event_seq if with_events else 0, "version": 1,
        "incarnation": params["v_child_incarnation"],
    }  # fmt: skip


def bound_row(table: Any) -> dict[str, Any]:
    """The VALUES of a one-row insert into ``table``: ``org_id`` bound to ``k_org`` (as in
    every other statement), each other column to a parameter of its own name."""
    return {
        col.name: bindparam("k_org" if col.name == "org_id" else col.name, type_=col.type)
        for col in table.c
    }


class StepwiseStatements(Statements):
    """The single-table steps of the write transactions (``StepwisePrograms``)."""

    def __init__(self, ops: DialectOps, dialect: Dialect, *, sealed: bool = False) -> None:
        super().__init__(ops, dialect, sealed=sealed)
        c = self.compile
        new_row = self.new_session_row(ops.insert_if_absent(S), bound_row(S))
        self.insert_session = c(new_row.returning(S.c.id))
        self.upsert_user = c(self._upsert(user_state, USER_KEY))
        self.upsert_app = c(self._upsert(app_state, APP_KEY))
        self.delete_user_keys = c(
            delete(user_state).where(
                user_state.c.org_id == bindparam("k_org"),
                user_state.c.app_name == bindparam("k_app"),
                user_state.c.user_id == bindparam("k_user"),
                ops.in_list(user_state.c.key, "k_keys"),
            )
        )
        self.delete_app_keys = c(
            delete(app_state).where(
                app_state.c.org_id == bindparam("k_org"),
                app_state.c.app_name == bindparam("k_app"),
                ops.in_list(app_state.c.key, "k_keys"),
            )
        )
        self.update = c(self._update().returning(S.c.version, S.c.app_name, S.c.user_id))
        self.append = c(self._append(merge=False).returning(*self._append_returning()))
        self.private_state = c(select(S.c.state).where(SESSION_KEY))
        # Merges v_private_delta in SQL where the dialect can (Postgres), else writes
        # v_private_state, merged in Python under SQLite's write lock.
        self.append_private = c(self._append(merge=True).returning(*self._append_returning()))
        self.insert_event = c(insert(events).values(bound_row(events)))
        # fork: the parent, locked (Postgres) so that no append lands while its transcript
        # is copied; SQLite's write lock, taken up front, does the same.
        self.parent = c(self.locked(select(*META, S.c.state, S.c.event_seq).where(SESSION_KEY)))
        copied = select(events.c.org_id, bindparam("k_child"), *EVENT_COLUMNS).where(EVENTS_KEY)
        self.copy_events = c(
            insert(events).from_select(
                ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], copied
            )
        )
        self.append_many_plain = c(self.append_many(merge=False))
        self.append_many_private = c(self.append_many(merge=True))
        # truncate: lock the session row (Postgres), then Statements.truncation_steps.
        self.lock_session = c(self.locked(select(S.c.version).where(SESSION_KEY)))
        # pop: the newest event's seq (a backward range of the key), then a truncation.
        self.newest_seq = c(
            select(events.c.seq).where(EVENTS_KEY).order_by(events.c.seq.desc()).limit(1)
        )

    def _upsert(self, table: Table, keys: list[str]) -> Any:
        stmt = self.ops.insert(table).values(bound_row(table))
        return self.ops.on_conflict_update(stmt, keys, ["value", "updated_at"])


def write_shared(
    q: Any, org_id: str, app_name: str, user_id: str, delta: ScopedDelta, now: datetime
) -> Program[None]:
    """Write a delta's shared keys (``user:`` and ``app:``), each table in sorted key order,
    so that concurrent writers lock the rows alike and never deadlock.

    Args:
        q: The dialect's statements (``upsert_user``, ``delete_user_keys``, ``upsert_app``,
            ``delete_app_keys``).
    """
    if delta.user_set:
        rows = [
            {"k_org": org_id, "app_name": app_name, "user_id": user_id, "key": k,
             "value": delta.user_set[k], "updated_at": now}
            for k in sorted(delta.user_set)
        ]  # fmt: skip
        yield Query(q.upsert_user, rows, many=True)
    if delta.user_deleted:
        yield Query(
            q.delete_user_keys,
            {"k_org": org_id, "k_app": app_name, "k_user": user_id,
             "k_keys": sorted(delta.user_deleted)},
        )  # fmt: skip
    if delta.app_set:
        rows = [
            {"k_org": org_id, "app_name": app_name, "key": k, "value": delta.app_set[k],
             "updated_at": now}
            for k in sorted(delta.app_set)
        ]  # fmt: skip
        yield Query(q.upsert_app, rows, many=True)
    if delta.app_deleted:
        yield Query(
            q.delete_app_keys,
            {"k_org": org_id, "k_app": app_name, "k_keys": sorted(delta.app_deleted)},
        )


class StepwisePrograms(Programs):
    """Writes as one write transaction of single-table steps each (see the module)."""

    q: StepwiseStatements

    row_locks = False
    """Whether the steps run under row locks at READ COMMITTED (Postgres), where each
    statement sees what committed before it began, rather than alone (SQLite)."""

    def _write_shared(
        self, org_id: str, app_name: str, user_id: str, delta: ScopedDelta, now: datetime
    ) -> Program[None]:
        """Write shared keys, in sorted order (so concurrent writers never deadlock)."""
        yield from write_shared(self.q, org_id, app_name, user_id, delta, now)

    def create(self, row: dict[str, Any], delta: ScopedDelta) -> Job[tuple[Any, Any]]:
        return Job(self._create(row, delta), "write")

    def _create(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        org, app_name, user_id = row["org_id"], row["app_name"], row["user_id"]
        params = {**row, "k_org": org}
        if (yield Query(self.q.insert_session, params)).first() is None:
            yield from self.check_key(params)  # or the user's data key was destroyed
            raise SessionExistsError(org, row["id"])
        yield from self._write_shared(org, app_name, user_id, delta, row["created_at"])
        shared = (
            yield Query(self.q.shared, {"k_org": org, "k_app": app_name, "k_user": user_id})
        ).first()
        return shared_items(shared.user_state, shared.app_state)

    def get_with_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        return self.session_then_events(shape, params)

    def get_with_events_json(
        self, shape: tuple[bool, bool], params: dict[str, Any]
    ) -> Job[tuple[Session, str]]:
        return self.session_then_events_json(shape, params)

    def update(self, params: dict[str, Any], delta: ScopedDelta) -> Job[int]:
        return Job(self._update(params, delta), "write")

    def _update(self, params: dict[str, Any], delta: ScopedDelta) -> Program[int]:
        done = yield from self.guarded(Query(self.q.update, params), params)
        if delta.user_deleted or delta.app_deleted:
            delta = yield from self.held_deletes(params, delta, done)
        # The stored owner, not the copy's: a copy whose user_id or app_name was edited
        # still writes its shared keys where they belong.
        yield from self._write_shared(
            params["k_org"], done.app_name, done.user_id, delta, params["v_now"]
        )
        return int(done.version)

    def _private_merge(self, params: dict[str, Any], delta: ScopedDelta) -> Program[None]:
        """Pass an append's private delta: merged in the UPDATE where the dialect can
        (``jsonb ||``), else read and merged here, under SQLite's write lock."""
        if self.q.ops.merge_private is not None:
            params["v_private_delta"] = delta.private_set
            return
        current = (yield Query(self.q.private_state, params)).first()
        if current is None:
            raise SessionNotFoundError(params["k_org"], params["k_id"])
        params["v_private_state"] = {**current.state, **delta.private_set}

    def append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Job[int]:
        return Job(self._append(params, stored, delta), "write")

    def _append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        q = self.q
        stmt = q.append
        if delta.private_set:
            yield from self._private_merge(params, delta)
            stmt = q.append_private
        row = yield from self.guarded(Query(stmt, params), params)
        yield Query(q.insert_event, _event_row(org_id, session_id, row.event_seq, stored))
        yield from self._write_shared(org_id, row.app_name, row.user_id, delta, params["v_now"])
        return int(row.event_seq)

    def append_many(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Job[int]:
        return Job(self._append_many(params, stored, delta), "write")

    def _append_many(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        q = self.q
        stmt = q.append_many_plain
        if delta.private_set:
            yield from self._private_merge(params, delta)
            stmt = q.append_many_private
        row = yield from self.guarded(Query(stmt, params), params)
        first = int(row.event_seq) - len(stored) + 1
        rows = [
            _event_row(org_id, session_id, seq, event)
            for seq, event in enumerate(stored, start=first)
        ]
        yield Query(q.insert_event, rows, many=True)
        yield from self._write_shared(org_id, row.app_name, row.user_id, delta, params["v_now"])
        return int(row.event_seq)

    def fork(self, params: dict[str, Any]) -> Job[Session]:
        return Job(self._fork(params), "write")

    def _fork(self, params: dict[str, Any]) -> Program[Session]:
        q = self.q
        org_id, parent_id, child_id = params["k_org"], params["k_id"], params["k_child"]
        with_events = params["v_with_events"]
        parent = (yield Query(q.parent, {"k_org": org_id, "k_id": parent_id})).first()
        if parent is None:
            raise SessionNotFoundError(org_id, parent_id)
        private = fork_state(parent.state, parent_id)
        row = fork_row(params, parent, parent.title, private)
        if (yield Query(q.insert_session, {**row, "k_org": org_id})).first() is None:
            raise SessionExistsError(org_id, child_id)
        if with_events:
            yield Query(q.copy_events, {"k_org": org_id, "k_id": parent_id, "k_child": child_id})
        shared = (
            yield Query(
                q.shared, {"k_org": org_id, "k_app": parent.app_name, "k_user": parent.user_id}
            )
        ).first()
        # The child is the row just inserted: nothing else can have changed it yet.
        return session_from_row(
            SimpleNamespace(**row),
            merge_state(private, *shared_items(shared.user_state, shared.app_state)),
        )

    def truncate(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        return [Job(self._truncate(params), "write")]

    def _truncate(
        self, params: dict[str, Any], *, locked: bool = False
    ) -> Program[builtins.list[Event] | None]:
        # Row locks: no append may land between the delete and the counters.
        lock = self.q.lock_session if self.row_locks and not locked else None
        return (yield from self.truncate_as_rows(params, lock))

    def pop(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        return [Job(self._pop(params), "write")]

    def _pop(self, params: dict[str, Any]) -> Program[builtins.list[Event] | None]:
        if self.row_locks:  # the newest event stays the newest until the transaction ends
            yield from self.lock_session(self.q.lock_session, params)
        newest = (yield Query(self.q.newest_seq, params)).first()
        if newest is None:  # an empty transcript (or no session): nothing is written
            yield from self.check_guard(params)
            return []
        params["k_after_seq"] = int(newest.seq) - 1
        return (yield from self._truncate(params, locked=True))


def _event_row(org_id: str, session_id: str, seq: int, event: Event) -> dict[str, Any]:
    return {
        "k_org": org_id, "session_id": session_id, "seq": seq, "id": event.id,
        "author": event.author, "invocation_id": event.invocation_id, "content": event.content,
        "state_delta": event.state_delta, "tokens": event.tokens, "timestamp": event.timestamp,
        # An encrypted store's sealed event carries its blind index text (SQLite's index
        # reads it; Postgres's distributed mode, refused with a keyring, ignores it).
        "search_terms": getattr(event, "search_terms", None),
    }  # fmt: skip
