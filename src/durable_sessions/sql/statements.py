"""Every statement the SQL store runs, defined once in Core and compiled once per dialect."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    extract,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable
from sqlalchemy.sql.selectable import CTE

from ..prepare import FORKED_FROM, MAX_INT64
from .compiled import Compiled, compile_statement
from .dialect import DialectOps
from .schema import JSONValue, UTCDateTime, app_state, events, sessions, user_state

__all__ = ["META", "Statements"]

S = sessions
META = [
    S.c.org_id,
    S.c.id,
    S.c.user_id,
    S.c.app_name,
    S.c.title,
    S.c.parent_id,
    S.c.created_at,
    S.c.updated_at,
    S.c.message_count,
    S.c.token_total,
    S.c.version,
    S.c.incarnation,
]
EVENT_COLUMNS = [
    events.c.seq,
    events.c.id,
    events.c.author,
    events.c.invocation_id,
    events.c.content,
    events.c.state_delta,
    events.c.tokens,
    events.c.timestamp,
]
SESSION_KEY = and_(S.c.org_id == bindparam("k_org"), S.c.id == bindparam("k_id"))
EVENTS_KEY = and_(events.c.org_id == bindparam("k_org"), events.c.session_id == bindparam("k_id"))
USER_KEY = ["org_id", "app_name", "user_id", "key"]
APP_KEY = ["org_id", "app_name", "key"]
NOW = bindparam("v_now", type_=UTCDateTime)
INCARNATION = bindparam("v_incarnation", type_=Text)
# A write guarded by the incarnation the caller holds (None: any incarnation of the id).
SAME_LIFE = or_(INCARNATION.is_(None), S.c.incarnation == INCARNATION)


def _room(counter: Any, increment: Any) -> Any:
    """``counter + increment`` stays within 64 bits (compared without computing the sum,
    which would overflow: an error on Postgres, a float on SQLite)."""
    return counter <= literal(MAX_INT64, BigInteger) - increment


# A write that would carry a counter or the version past 2**63 - 1 writes nothing; the
# store then tells why (check_counters).
TOUCH_ROOM = and_(
    _room(S.c.message_count, bindparam("v_messages")),
    _room(S.c.token_total, bindparam("v_tokens")),
    _room(S.c.version, 1),
)
APPEND_ROOM = and_(
    _room(S.c.event_seq, 1),
    _room(S.c.message_count, 1),
    _room(S.c.token_total, bindparam("v_tokens")),
    _room(S.c.version, 1),
)


class Statements:
    """The compiled statements of one dialect; dynamic shapes are compiled on first use."""

    def __init__(self, ops: DialectOps, dialect: Dialect) -> None:
        self.ops = ops
        self.dialect = dialect
        self._shapes: dict[Hashable, Compiled] = {}
        c = self.compile

        user_agg = self._user_agg(S.c.org_id, S.c.app_name, S.c.user_id)
        app_agg = self._app_agg(S.c.org_id, S.c.app_name)
        self.get = c(select(*META, S.c.state, user_agg, app_agg).where(SESSION_KEY))
        self.shared = c(
            select(
                self._user_agg(bindparam("k_org"), bindparam("k_app"), bindparam("k_user")),
                self._app_agg(bindparam("k_org"), bindparam("k_app")),
            )
        )
        self.exists = c(select(S.c.version).where(SESSION_KEY))
        self.meta = c(select(*META).where(SESSION_KEY))
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
        # A save that deletes shared keys reads (and on Postgres locks) their values first.
        user_values = select(user_state.c.key, user_state.c.value).where(
            user_state.c.org_id == bindparam("k_org"),
            user_state.c.app_name == bindparam("k_app"),
            user_state.c.user_id == bindparam("k_user"),
            ops.in_list(user_state.c.key, "k_keys"),
        )
        app_values = select(app_state.c.key, app_state.c.value).where(
            app_state.c.org_id == bindparam("k_org"),
            app_state.c.app_name == bindparam("k_app"),
            ops.in_list(app_state.c.key, "k_keys"),
        )
        if ops.is_postgres:
            user_values = user_values.with_for_update()
            app_values = app_values.with_for_update()
        self.user_values = c(user_values)
        self.app_values = c(app_values)
        self.delete_app_keys = c(
            delete(app_state).where(
                app_state.c.org_id == bindparam("k_org"),
                app_state.c.app_name == bindparam("k_app"),
                ops.in_list(app_state.c.key, "k_keys"),
            )
        )
        self.update = c(self._update().returning(S.c.version, S.c.app_name, S.c.user_id))
        self.touch = c(
            update(S)
            .where(SESSION_KEY, SAME_LIFE, TOUCH_ROOM)
            .values(
                message_count=S.c.message_count + bindparam("v_messages"),
                token_total=S.c.token_total + bindparam("v_tokens"),
                title=case((S.c.title == "", bindparam("v_title")), else_=S.c.title),
                updated_at=NOW,
                version=S.c.version + 1,
            )
            .returning(*META)
        )
        self.append = c(self._append(merge=False).returning(*self._append_returning()))
        self.private_state = c(select(S.c.state).where(SESSION_KEY))
        self.append_private = c(self._append(merge=True).returning(*self._append_returning()))
        self.insert_event = c(insert(events))
        self.delete_events = c(delete(events).where(EVENTS_KEY))
        self.delete_session = c(delete(S).where(SESSION_KEY))
        # SQLite's fork (Postgres forks in one statement: see _pg_fork); the write lock taken
        # up front holds off appends while the transcript is copied.
        self.parent = c(select(*META, S.c.state, S.c.event_seq).where(SESSION_KEY))
        copied = select(events.c.org_id, bindparam("k_child"), *EVENT_COLUMNS).where(EVENTS_KEY)
        self.copy_events = c(
            insert(events).from_select(
                ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], copied
            )
        )
        if ops.is_postgres:
            self._build_postgres_single_statements()

    def compile(self, statement: Executable) -> Compiled:
        """Compile a Core statement for this dialect."""
        return compile_statement(statement, self.dialect)

    def shape(self, key: Hashable, build: Callable[[], Executable]) -> Compiled:
        """Return the compiled statement of a dynamic shape, compiling it on first use."""
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = self.compile(build())
        return found

    def state_columns(self) -> list[Any]:
        """A session row's private state and its shared state, as columns of one select."""
        return [
            S.c.state,
            self._user_agg(S.c.org_id, S.c.app_name, S.c.user_id),
            self._app_agg(S.c.org_id, S.c.app_name),
        ]

    def events_query(self, has_after: bool, has_limit: bool) -> Any:
        """A session's events (newest first when limited), by (org, session, seq)."""
        query = select(*EVENT_COLUMNS).where(EVENTS_KEY)
        if has_after:
            query = query.where(events.c.timestamp > bindparam("k_after", type_=UTCDateTime))
        if has_limit:
            # Newest first along the (org, session, seq) key; callers put them back in order.
            return query.order_by(events.c.seq.desc()).limit(bindparam("k_limit"))
        return query.order_by(events.c.seq)

    def pg_get_with_events(self, has_after: bool, has_limit: bool) -> Any:
        """Postgres: a session, its shared state and its events in one statement.

        The events come as one jsonb array of ``[seq, id, author, invocation_id, content,
        state_delta, tokens, epoch microseconds]`` rows, oldest first.
        """
        chosen = self.events_query(has_after, has_limit).subquery("chosen")
        micros = cast(extract("epoch", chosen.c.timestamp) * 1_000_000, BigInteger)
        item = func.jsonb_build_array(
            *[chosen.c[col.name] for col in EVENT_COLUMNS if col.name != "timestamp"], micros
        )
        transcript = (
            select(func.jsonb_agg(aggregate_order_by(item, chosen.c.seq)))
            .scalar_subquery()
            .label("events")
        )
        user_agg = self._user_agg(S.c.org_id, S.c.app_name, S.c.user_id)
        app_agg = self._app_agg(S.c.org_id, S.c.app_name)
        return select(*META, S.c.state, user_agg, app_agg, transcript).where(SESSION_KEY)

    # -- building blocks ---------------------------------------------------------------------

    def _user_agg(self, org: Any, app: Any, user: Any) -> Any:
        return (
            select(self.ops.object_agg(user_state.c.key, user_state.c.value))
            .where(user_state.c.org_id == org, user_state.c.app_name == app)
            .where(user_state.c.user_id == user)
            .scalar_subquery()
            .label("user_state")
        )

    def _app_agg(self, org: Any, app: Any) -> Any:
        return (
            select(self.ops.object_agg(app_state.c.key, app_state.c.value))
            .where(app_state.c.org_id == org, app_state.c.app_name == app)
            .scalar_subquery()
            .label("app_state")
        )

    @staticmethod
    def _update() -> Any:
        return (
            update(S)
            .where(SESSION_KEY, S.c.version == bindparam("v_expected"), SAME_LIFE)
            .values(
                title=bindparam("v_title"),
                state=bindparam("v_state", type_=JSONValue),
                updated_at=NOW,
                version=S.c.version + 1,
            )
        )

    def _append(self, *, merge: bool) -> Any:
        values: dict[str, Any] = {
            "event_seq": S.c.event_seq + 1,
            "message_count": S.c.message_count + 1,
            "token_total": S.c.token_total + bindparam("v_tokens"),
            "updated_at": NOW,
            "version": S.c.version + 1,
        }
        if merge:
            merge_private = self.ops.merge_private
            values["state"] = (
                merge_private()
                if merge_private is not None
                else bindparam("v_private_state", type_=JSONValue)
            )
        # Appends may be conditional on the version the caller holds (None: unconditional).
        expected = bindparam("v_expected", type_=BigInteger)
        when = or_(expected.is_(None), S.c.version == expected)
        return update(S).where(SESSION_KEY, when, SAME_LIFE, APPEND_ROOM).values(values)

    @staticmethod
    def _append_returning() -> list[Any]:
        return [S.c.event_seq, S.c.app_name, S.c.user_id]

    # -- Postgres: whole operations as one statement ------------------------------------------

    def _shared_writes(self, driver: CTE, *, deletes: bool = True) -> list[CTE]:
        """Upserts and deletes of shared keys, done only when ``driver`` returned its row.

        ``driver`` is the CTE of the operation's own write (insert or update of the session
        row) returning ``app_name`` and ``user_id``: if it wrote nothing (a stale version,
        an existing id, an unknown session), neither do these.
        """
        ops = self.ops
        ctes: list[CTE] = []
        for table, name, keys, scope in (
            (user_state, "user", USER_KEY, [driver.c.app_name, driver.c.user_id]),
            (app_state, "app", APP_KEY, [driver.c.app_name]),
        ):
            pairs = func.jsonb_each(bindparam(f"v_{name}_set", type_=JSONValue)).table_valued(
                column("key", Text), column("value", JSONB)
            )
            rows = select(bindparam("k_org"), *scope, pairs.c.key, pairs.c.value, NOW)
            rows = rows.select_from(driver).join(pairs, true())
            upsert = ops.on_conflict_update(
                ops.insert(table).from_select([*keys, "value", "updated_at"], rows),
                keys,
                ["value", "updated_at"],
            )
            ctes.append(upsert.cte(f"{name}_set"))
            if not deletes:
                continue
            where = [table.c.org_id == bindparam("k_org")]
            where.append(table.c.app_name == select(driver.c.app_name).scalar_subquery())
            if name == "user":
                where.append(table.c.user_id == select(driver.c.user_id).scalar_subquery())
            where.append(ops.in_list(table.c.key, f"v_{name}_deleted"))
            # Only while the key holds the value the saved copy read (compared as jsonb's
            # canonical text): a key absent when the save checked it and set by another
            # writer since is that writer's newer value, not this delete's.
            expected = cast(bindparam(f"v_{name}_expected", type_=JSONValue), JSONB)
            read = expected.op("->", return_type=JSONB)(table.c.key)
            where.append(cast(table.c.value, Text) == cast(read, Text))
            ctes.append(delete(table).where(*where).cte(f"{name}_deleted"))
        return ctes

    def _build_postgres_single_statements(self) -> None:
        c = self.compile
        # save: the version-checked update of the session row and every shared change.
        saved = self._update().returning(S.c.version, S.c.app_name, S.c.user_id).cte("saved")
        self.pg_update = c(select(saved.c.version).add_cte(*self._shared_writes(saved)))

        # append_event: seq, counters and private merge, the event row, the shared delta.
        moved = self._append(merge=True).returning(*self._append_returning()).cte("moved")
        event_row = select(
            bindparam("k_org"),
            bindparam("k_id"),
            moved.c.event_seq,
            bindparam("e_id"),
            bindparam("e_author"),
            bindparam("e_invocation_id"),
            bindparam("e_content", type_=JSONValue),
            bindparam("e_state_delta", type_=JSONValue),
            bindparam("v_tokens"),
            bindparam("e_timestamp", type_=UTCDateTime),
        ).select_from(moved)
        added = insert(events).from_select(
            ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], event_row
        )
        # Event deltas only set keys, so the append needs no deletes.
        writes = self._shared_writes(moved, deletes=False)
        self.pg_append = c(select(moved.c.event_seq).add_cte(added.cte("added"), *writes))

        # create: the session row (unless the id is taken), its shared state, and the shared
        # state that already existed (the statement's snapshot predates its own writes).
        row = {col.name: bindparam(col.name, type_=col.type) for col in S.c}
        created = (
            self.ops.insert(S)
            .values(row)
            .on_conflict_do_nothing()  # type: ignore[attr-defined]
            .returning(S.c.app_name, S.c.user_id)
            .cte("created")
        )
        count = select(func.count()).select_from(created).scalar_subquery().label("created")
        self.pg_create = c(
            select(
                count,
                self._user_agg(bindparam("org_id"), bindparam("app_name"), bindparam("user_id")),
                self._app_agg(bindparam("org_id"), bindparam("app_name")),
            ).add_cte(*self._shared_writes(created, deletes=False))
        )
        # delete: the transcript and the session row together.
        gone = delete(events).where(EVENTS_KEY).cte("gone")
        self.pg_delete = c(delete(S).where(SESSION_KEY).returning(S.c.id).add_cte(gone))
        self.pg_fork = c(self._pg_fork())

    def _pg_fork(self) -> Any:
        """Postgres: fork as one statement. The child row is made from the parent's, the
        transcript copied when asked, and the child returned with its shared state. One
        statement sees one snapshot, so the copied events and ``event_seq`` agree without
        locking the parent. No row back: the parent is missing or the child id is taken."""
        with_events = bindparam("v_with_events", type_=Boolean)
        parent = select(S).where(SESSION_KEY).cte("parent")
        record = func.jsonb_build_object(literal(FORKED_FROM), bindparam("k_id", type_=Text))
        counted = [
            case((with_events, parent.c[name]), else_=literal(0, BigInteger))
            for name in ("message_count", "token_total", "event_seq")
        ]
        row = select(
            bindparam("k_org"),
            bindparam("k_child", type_=Text),
            parent.c.user_id,
            parent.c.app_name,
            parent.c.title,
            parent.c.state.op("||", return_type=JSONValue)(record),
            bindparam("k_id"),
            NOW,
            NOW,
            *counted,
            literal(1, BigInteger),
            bindparam("v_child_incarnation", type_=Text),
        ).select_from(parent)
        columns = [
            "org_id", "id", "user_id", "app_name", "title", "state", "parent_id", "created_at",
            "updated_at", "message_count", "token_total", "event_seq", "version", "incarnation",
        ]  # fmt: skip
        child = (
            self.ops.insert_if_absent(S)
            .from_select(columns, row)
            .returning(*META, S.c.state)
            .cte("child")
        )
        transcript = select(events.c.org_id, child.c.id, *EVENT_COLUMNS).where(
            EVENTS_KEY, with_events, events.c.org_id == child.c.org_id
        )
        copied = insert(events).from_select(
            ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], transcript
        )
        return select(
            *[child.c[col.name] for col in META],
            child.c.state,
            self._user_agg(child.c.org_id, child.c.app_name, child.c.user_id),
            self._app_agg(child.c.org_id, child.c.app_name),
        ).add_cte(copied.cte("copied"))

    # -- batch appends and truncation (built on first use: see ``shape``) ---------------------

    def append_many(self, *, merge: bool) -> Any:
        """Move a session on by a batch of ``v_count`` events carrying ``v_tokens`` tokens.

        Returns the last seq of the batch (the batch's seqs end there), and the owner. No
        row: no session, a stale ``v_expected``, another incarnation, or no room left.
        """
        count = bindparam("v_count", type_=BigInteger)
        tokens = bindparam("v_tokens", type_=BigInteger)
        values: dict[str, Any] = {
            "event_seq": S.c.event_seq + count,
            "message_count": S.c.message_count + count,
            "token_total": S.c.token_total + tokens,
            "updated_at": NOW,
            "version": S.c.version + 1,
        }
        if merge:
            merge_private = self.ops.merge_private
            values["state"] = (
                merge_private()
                if merge_private is not None
                else bindparam("v_private_state", type_=JSONValue)
            )
        expected = bindparam("v_expected", type_=BigInteger)
        top = literal(2**63 - 1, BigInteger)
        room = and_(  # compared without computing the sum, which could overflow
            S.c.event_seq <= top - count,
            S.c.message_count <= top - count,
            S.c.token_total <= top - tokens,
            S.c.version < top,
        )
        return (
            update(S)
            .where(SESSION_KEY, or_(expected.is_(None), S.c.version == expected), SAME_LIFE, room)
            .values(values)
            .returning(S.c.event_seq, S.c.app_name, S.c.user_id)
        )

    def pg_append_many(self) -> Any:
        """Postgres: a whole batch append as one statement.

        ``v_batch`` is a JSON array of events (``id``, ``author``, ``invocation_id``,
        ``content``, ``state_delta``, ``tokens``, ``timestamp`` as ISO text), stored in
        order with consecutive seqs ending at the session's new ``event_seq``.
        """
        moved = self.append_many(merge=True).cte("moved")
        batch = (
            func.jsonb_array_elements(bindparam("v_batch", type_=JSONValue))
            .table_valued(column("value", JSONB), with_ordinality="n")
            .render_derived()
        )
        item = batch.c.value

        def text(name: str) -> Any:
            return item.op("->>", return_type=Text)(literal(name, Text))

        def json(name: str) -> Any:
            return item.op("->", return_type=JSONValue)(literal(name, Text))

        rows = (
            select(
                bindparam("k_org"),
                bindparam("k_id"),
                moved.c.event_seq - bindparam("v_count", type_=BigInteger) + batch.c.n,
                text("id"),
                text("author"),
                text("invocation_id"),
                json("content"),
                json("state_delta"),
                cast(text("tokens"), BigInteger),
                cast(text("timestamp"), UTCDateTime),
            )
            .select_from(moved)
            .join(batch, true())
        )
        added = insert(events).from_select(
            ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], rows
        )
        writes = self._shared_writes(moved, deletes=False)
        return select(moved.c.event_seq).add_cte(added.cte("added"), *writes)

    @staticmethod
    def _truncate_guard() -> Any:
        expected = bindparam("v_expected", type_=BigInteger)
        top = literal(2**63 - 1, BigInteger)
        return and_(
            SESSION_KEY, or_(expected.is_(None), S.c.version == expected), SAME_LIFE,
            S.c.version < top,
        )  # fmt: skip

    def truncate_removed(self) -> Any:
        """SQLite: delete a session's events after ``k_after_seq``, returning them."""
        after = bindparam("k_after_seq", type_=BigInteger)
        return delete(events).where(EVENTS_KEY, events.c.seq > after).returning(*EVENT_COLUMNS)

    def truncate_session(self) -> Any:
        """SQLite: take ``v_count`` events and ``v_tokens`` tokens off a session's counters
        and its seq back to ``k_after_seq`` (never forward). No row: the guard failed."""
        after = bindparam("k_after_seq", type_=BigInteger)
        count = bindparam("v_count", type_=BigInteger)
        tokens = bindparam("v_tokens", type_=BigInteger)
        zero = literal(0, BigInteger)
        return (
            update(S)
            .where(self._truncate_guard())
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

    def pg_lock_session(self) -> Any:
        """Postgres: lock a session row for the rest of the transaction."""
        return select(S.c.version).where(SESSION_KEY).with_for_update()

    def pg_truncate(self) -> Any:
        """Postgres: a truncation as one statement; the removed events come back as one
        jsonb array (as ``pg_get_with_events`` returns them), oldest first.

        The statement reads the transcript in its snapshot, and updates the session row
        only if the row's version is still the one that snapshot saw (a concurrent writer
        that committed meanwhile moved it on): then the snapshot's events are the current
        ones, and the row lock held from then on keeps them so. No row back: no session,
        a failed guard, or such a race; run it again after ``pg_lock_session`` in one
        transaction, where it cannot lose the race.
        """
        after = bindparam("k_after_seq", type_=BigInteger)
        seen = select(S.c.version).where(SESSION_KEY).cte("seen").prefix_with("MATERIALIZED")
        doomed = and_(EVENTS_KEY, events.c.seq > after)
        count = select(func.count()).where(doomed).scalar_subquery()
        tokens = select(func.coalesce(func.sum(events.c.tokens), 0)).where(doomed)
        zero = literal(0, BigInteger)
        cut = (
            update(S)
            .where(self._truncate_guard(), S.c.version == seen.c.version)
            .values(
                event_seq=case((S.c.event_seq > after, after), else_=S.c.event_seq),
                message_count=func.greatest(S.c.message_count - count, zero),
                token_total=func.greatest(S.c.token_total - tokens.scalar_subquery(), zero),
                updated_at=NOW,
                version=S.c.version + 1,
            )
            .returning(S.c.version)
            .cte("cut")
        )
        removed = (
            delete(events)
            .where(doomed, select(cut.c.version).exists())
            .returning(*EVENT_COLUMNS)
            .cte("removed")
        )
        micros = cast(extract("epoch", removed.c.timestamp) * 1_000_000, BigInteger)
        item = func.jsonb_build_array(
            *[removed.c[col.name] for col in EVENT_COLUMNS if col.name != "timestamp"], micros
        )
        transcript = (
            select(func.jsonb_agg(aggregate_order_by(item, removed.c.seq)))
            .scalar_subquery()
            .label("events")
        )
        return select(cut.c.version, transcript)

    def event_contents(self, has_limit: bool) -> Any:
        """A session's event contents, oldest first, as ONE JSON array in one text value
        (the newest ``k_limit`` with ``has_limit``); ``[]`` or NULL when there are none."""
        chosen = select(events.c.seq, events.c.content).where(EVENTS_KEY)
        if has_limit:
            chosen = chosen.order_by(events.c.seq.desc()).limit(bindparam("k_limit"))
        rows = chosen.subquery("chosen")
        if self.ops.is_postgres:
            # json_agg of jsonb values: their canonical text, joined; no jsonb re-parse.
            whole = func.json_agg(aggregate_order_by(rows.c.content, rows.c.seq))
            return select(cast(whole, Text).label("contents"))
        # Contents are stored as JSON text: joined as they are, nothing is parsed. SQLite
        # aggregates in the order its input comes: the rows, ordered by seq.
        text = func.coalesce(cast(rows.c.content, Text), literal("null", Text))
        ordered = select(text.label("c")).order_by(rows.c.seq).subquery("ordered")
        joined = literal("[", Text) + func.group_concat(ordered.c.c, ",") + literal("]", Text)
        return select(joined.label("contents"))
