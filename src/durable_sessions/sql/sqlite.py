"""SQLite: its own statements and the shape of its writes (one transaction of steps each)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Text,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Dialect

from ..errors import SessionExistsError, SessionNotFoundError, StaleSessionError
from ..model import Event, Session
from ..prepare import fork_state, merge_state
from ..state import ScopedDelta
from .dialect import DialectOps
from .programs import Job, Programs, event_from_row, session_from_row, shared_items
from .runner import Program, Query
from .schema import app_state, events, user_state
from .statements import (
    APP_KEY,
    EVENT_COLUMNS,
    EVENTS_KEY,
    META,
    NOW,
    SESSION_KEY,
    USER_KEY,
    S,
    Statements,
)

__all__ = ["SQLitePrograms", "SQLiteStatements"]


class SQLiteStatements(Statements):
    """SQLite's statements: the steps of its multi-statement write transactions."""

    def __init__(self, ops: DialectOps, dialect: Dialect) -> None:
        super().__init__(ops, dialect)
        c = self.compile
        self.insert_session = c(ops.insert_if_absent(S).returning(S.c.id))
        self.upsert_user = c(ops.upsert(user_state, USER_KEY, ["value", "updated_at"]))
        self.upsert_app = c(ops.upsert(app_state, APP_KEY, ["value", "updated_at"]))
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
        self.append_private = c(self._append(merge=True).returning(*self._append_returning()))
        self.insert_event = c(insert(events))
        self.delete_events = c(delete(events).where(EVENTS_KEY))
        self.delete_session = c(delete(S).where(SESSION_KEY))
        # fork: the write lock taken up front holds off appends while the transcript is copied.
        self.parent = c(select(*META, S.c.state, S.c.event_seq).where(SESSION_KEY))
        copied = select(events.c.org_id, bindparam("k_child"), *EVENT_COLUMNS).where(EVENTS_KEY)
        self.copy_events = c(
            insert(events).from_select(
                ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], copied
            )
        )
        self.append_many_plain = c(self.append_many(merge=False))
        self.append_many_private = c(self.append_many(merge=True))
        after = bindparam("k_after_seq", type_=BigInteger)
        # truncate: delete the events after k_after_seq, returning them...
        self.truncate_removed = c(
            delete(events).where(EVENTS_KEY, events.c.seq > after).returning(*EVENT_COLUMNS)
        )
        # ...then take what they added off the counters (see _truncate_session).
        self.truncate_session = c(self._truncate_session())

    def event_contents(self, has_limit: bool) -> Any:
        """A session's event contents, oldest first, as ONE JSON array in one text value."""
        rows = self.chosen_contents(has_limit)
        # Contents are stored as JSON text: joined as they are, nothing is parsed. SQLite
        # aggregates in the order its input comes: the rows, ordered by seq.
        text = func.coalesce(cast(rows.c.content, Text), literal("null", Text))
        ordered = select(text.label("c")).order_by(rows.c.seq).subquery("ordered")
        joined = literal("[", Text) + func.group_concat(ordered.c.c, ",") + literal("]", Text)
        return select(joined.label("contents"))

    def _truncate_session(self) -> Any:
        """SQLite: take ``v_count`` events and ``v_tokens`` tokens off a session's counters
        and its seq back to ``k_after_seq`` (never forward). No row: the guard failed."""
        after = bindparam("k_after_seq", type_=BigInteger)
        count = bindparam("v_count", type_=BigInteger)
        tokens = bindparam("v_tokens", type_=BigInteger)
        zero = literal(0, BigInteger)
        return (
            update(S)
            .where(self.truncate_guard())
            .values(
                event_seq=case((S.c.event_seq > after, after), else_=S.c.event_seq),
                message_count=case(
                    (S.c.message_count > count, S.c.message_count - count), else_=zero
                ),
                token_total=case((S.c.token_total > tokens, S.c.token_total - tokens), else_=zero),
                updated_at=NOW,
                version=S.c.version + 1,
            )
            .returning(S.c.version)
        )


class SQLitePrograms(Programs):
    """SQLite's writes: each one write transaction of steps (``BEGIN IMMEDIATE``: the write
    lock is taken up front, so the steps see and change the database alone)."""

    q: SQLiteStatements

    def _write_shared(
        self, org_id: str, app_name: str, user_id: str, delta: ScopedDelta, now: datetime
    ) -> Program[None]:
        """Write shared keys, in sorted order (so concurrent writers never deadlock)."""
        q = self.q
        if delta.user_set:
            rows = [
                {"org_id": org_id, "app_name": app_name, "user_id": user_id, "key": k,
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
                {"org_id": org_id, "app_name": app_name, "key": k, "value": delta.app_set[k],
                 "updated_at": now}
                for k in sorted(delta.app_set)
            ]  # fmt: skip
            yield Query(q.upsert_app, rows, many=True)
        if delta.app_deleted:
            yield Query(
                q.delete_app_keys,
                {"k_org": org_id, "k_app": app_name, "k_keys": sorted(delta.app_deleted)},
            )

    def create(self, row: dict[str, Any], delta: ScopedDelta) -> Job[tuple[Any, Any]]:
        return Job(self._create(row, delta), "write")

    def _create(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        org, app_name, user_id = row["org_id"], row["app_name"], row["user_id"]
        if (yield Query(self.q.insert_session, row)).first() is None:
            raise SessionExistsError(org, row["id"])
        yield from self._write_shared(org, app_name, user_id, delta, row["created_at"])
        shared = (
            yield Query(self.q.shared, {"k_org": org, "k_app": app_name, "k_user": user_id})
        ).first()
        return shared_items(shared.user_state, shared.app_state)

    def get_with_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        stmt = self.q.shape(("events", *shape), lambda: self.q.events_query(*shape))
        return Job(self._get_with_events(stmt, params, newest_first=shape[1]), "read")

    def _get_with_events(
        self, stmt: Any, params: dict[str, Any], newest_first: bool
    ) -> Program[Session]:
        session = yield from self.get(params["k_org"], params["k_id"])
        session.events = [event_from_row(row) for row in (yield Query(stmt, params)).rows]
        if newest_first:
            session.events.reverse()
        return session

    def update(self, params: dict[str, Any], delta: ScopedDelta) -> Job[int]:
        return Job(self._update(params, delta), "write")

    def _update(self, params: dict[str, Any], delta: ScopedDelta) -> Program[int]:
        done = (yield Query(self.q.update, params)).first()
        if done is None:
            yield from self.stale(params)
        if delta.user_deleted or delta.app_deleted:
            yield from self.check_shared_deletes(params, delta)
        # The stored owner, not the copy's: a copy whose user_id or app_name was edited
        # still writes its shared keys where they belong.
        yield from self._write_shared(
            params["k_org"], done.app_name, done.user_id, delta, params["v_now"]
        )
        return int(done.version)

    def delete(self, org_id: str, session_id: str) -> Job[None]:
        return Job(self._delete({"k_org": org_id, "k_id": session_id}), "write")

    def _delete(self, key: dict[str, Any]) -> Program[None]:
        yield Query(self.q.delete_events, key)
        if not (yield Query(self.q.delete_session, key)).rowcount:
            raise SessionNotFoundError(key["k_org"], key["k_id"])

    def append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Job[int]:
        return Job(self._append(params, stored, delta), "write")

    def _append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        q = self.q
        if delta.private_set:
            current = (yield Query(q.private_state, params)).first()
            if current is None:
                raise SessionNotFoundError(org_id, session_id)
            params["v_private_state"] = {**current.state, **delta.private_set}
            row = (yield Query(q.append_private, params)).first()
        else:
            row = (yield Query(q.append, params)).first()
        if row is None:
            yield from self.stale(params)
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
            current = (yield Query(q.private_state, params)).first()
            if current is None:
                raise SessionNotFoundError(org_id, session_id)
            params["v_private_state"] = {**current.state, **delta.private_set}
            stmt = q.append_many_private
        row = (yield Query(stmt, params)).first()
        if row is None:
            yield from self.stale(params)
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
        with_events, now = params["v_with_events"], params["v_now"]
        parent = (yield Query(q.parent, {"k_org": org_id, "k_id": parent_id})).first()
        if parent is None:
            raise SessionNotFoundError(org_id, parent_id)
        private = fork_state(parent.state, parent_id)
        row = {
            "org_id": org_id, "id": child_id, "user_id": parent.user_id,
            "app_name": parent.app_name, "title": parent.title, "state": private,
            "parent_id": parent_id, "created_at": now, "updated_at": now,
            "message_count": parent.message_count if with_events else 0,
            "token_total": parent.token_total if with_events else 0,
            "event_seq": parent.event_seq if with_events else 0, "version": 1,
            "incarnation": params["v_child_incarnation"],
        }  # fmt: skip
        if (yield Query(q.insert_session, row)).first() is None:
            raise SessionExistsError(org_id, child_id)
        if with_events:
            yield Query(q.copy_events, {"k_org": org_id, "k_id": parent_id, "k_child": child_id})
        shared = (
            yield Query(
                q.shared, {"k_org": org_id, "k_app": parent.app_name, "k_user": parent.user_id}
            )
        ).first()
        child = (yield Query(q.meta, {"k_org": org_id, "k_id": child_id})).first()
        return session_from_row(
            child, merge_state(private, *shared_items(shared.user_state, shared.app_state))
        )

    def truncate(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        return [Job(self._truncate(params), "write")]

    def _truncate(self, params: dict[str, Any]) -> Program[builtins.list[Event] | None]:
        q = self.q
        rows = (yield Query(q.truncate_removed, params)).rows
        removed = sorted((event_from_row(row) for row in rows), key=lambda e: e.seq)
        params.update(v_count=len(removed), v_tokens=sum(e.tokens for e in removed))
        if (yield Query(q.truncate_session, params)).first() is None:  # rolled back
            yield from self.check_guard({**params, "v_count": 0, "v_tokens": 0})
            raise StaleSessionError(params["k_org"], params["k_id"], params["v_expected"] or 0)
        return removed


def _event_row(org_id: str, session_id: str, seq: int, event: Event) -> dict[str, Any]:
    return {
        "org_id": org_id, "session_id": session_id, "seq": seq, "id": event.id,
        "author": event.author, "invocation_id": event.invocation_id, "content": event.content,
        "state_delta": event.state_delta, "tokens": event.tokens, "timestamp": event.timestamp,
    }  # fmt: skip
