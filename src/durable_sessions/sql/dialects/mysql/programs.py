"""MySQL: its own statements and the shape of its writes.

MySQL has no ``UPDATE ... RETURNING`` (MariaDB neither), so a write does not guard its
UPDATE in SQL as the other dialects do: it locks the session row first (``SELECT ... FOR
UPDATE``), checks the guards on what it read (no session, another life of the id, another
version, a counter that would overflow), and writes the row's new values, computed here.
The lock keeps event seqs gapless and versions in order under concurrent writers; locks
are taken in one order everywhere: the session row, then ``user:`` keys, then ``app:`` keys,
each in sorted order. A deadlock (1213) or a lock wait timeout (1205) rolls the write back
and runs it again (``retried``), up to ``ATTEMPTS`` times; after that the error is raised
(``StoreError``, as on the other dialects).
"""

from __future__ import annotations

import builtins
import math
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Integer,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects import mysql

from ....errors import SessionExistsError, SessionNotFoundError, StaleSessionError
from ....fulltext import event_text, words
from ....model import Event, Session
from ....prepare import (
    RECREATED,
    check_counters,
    fork_state,
    merge_state,
)
from ....state import MAX_INT64, ScopedDelta
from ...compiled import Compiled
from ...programs import (
    Job,
    KeyDestroyed,
    Programs,
    _increments,
    check_owner,
    session_from_row,
    shared_items,
    unwritten,
)
from ...runner import RESTART, Program, Query
from ...schema import ID, JSONValue, UTCDateTime, _Bytes, app_state, events, user_state
from ...statements import (
    APP_KEY,
    EVENT_COLUMNS,
    EVENTS_KEY,
    KEY_HELD,
    META,
    SESSION_KEY,
    USER_KEY,
    Retention,
    S,
    Statements,
)
from ...stepwise import bound_row, fork_row, write_shared
from ...translate import mysql_errno

__all__ = [
    "ATTEMPTS",
    "DUPLICATE",
    "WORDS",
    "MySQLPrograms",
    "MySQLStatements",
    "retried",
    "word_rows",
    "words_insert",
]

T = TypeVar("T")

ATTEMPTS = 5
"""Times a write runs when it keeps losing a deadlock or a lock wait."""

_RETRIED = (1213, 1205)  # deadlock; lock wait timeout
DUPLICATE = 1062
"""MySQL's error number of a row whose unique key is taken."""

WORDS = table(
    "ds_event_words",
    column("org_id", ID),
    column("word", _Bytes(1020)),
    column("session_id", ID),
    column("seq", BigInteger),
    column("n", Integer),
)
"""MySQL's full-text index (revision 0003): each event's distinct words, with their count."""

_UTF8 = mysql.CHAR(charset="utf8mb4")
_SAVED_WAIT = "@durable_sessions_lock_wait"
"""The user variable that holds the connection's own ``innodb_lock_wait_timeout`` while a
batched delete runs with a shorter one."""


def _quoted(value: Any) -> Any:
    """A binary string column as a JSON string."""
    return func.json_quote(cast(value, _UTF8))


def retried(make: Callable[[], Program[T]]) -> Program[T]:
    """Run the program ``make`` gives; after a deadlock or a lock wait timeout, have the
    runner roll the transaction back and begin it again (``RESTART``), and run a new one."""
    for attempt in range(ATTEMPTS):
        try:
            return (yield from make())
        except Exception as exc:
            if mysql_errno(exc) not in _RETRIED or attempt == ATTEMPTS - 1:
                raise
        yield Query(RESTART)
    raise AssertionError("unreachable")  # pragma: no cover


def _is_duplicate(exc: BaseException) -> bool:
    return mysql_errno(exc) == DUPLICATE


def word_rows(
    org_id: str, session_id: str, seq: int, content: Any, terms: str | None = None
) -> list[dict[str, Any]]:
    """The rows of ``ds_event_words`` of one event: its distinct words, with their count;
    or, for an encrypted store's event, of its blind index ``terms`` (``DataKey.blind``)."""
    counts = Counter(words(event_text(content)) if terms is None else terms.split())
    return [
        {"k_org": org_id, "word": word, "session_id": session_id, "seq": seq, "n": n}
        for word, n in counts.items()
    ]


def words_insert() -> Any:
    """The insert of an event's ``ds_event_words`` rows (``word_rows``)."""
    return insert(WORDS).values(
        org_id=bindparam("k_org", type_=ID),
        word=bindparam("word", type_=_Bytes(1020)),
        session_id=bindparam("session_id", type_=ID),
        seq=bindparam("seq", type_=BigInteger),
        n=bindparam("n", type_=Integer),
    )


class MySQLStatements(Statements):
    """MySQL's statements: a locking read of the session row, and plain writes."""

    def __init__(self, *args: Any, sealed: bool = False) -> None:
        super().__init__(*args, sealed=sealed)
        c = self.compile
        ops = self.ops
        row = select(*META, S.c.state, S.c.event_seq)
        self.lock_row = c(self.locked(row.where(SESSION_KEY)))
        # An encrypted store's writes: the row, and whether the user's data key they sealed
        # with (``k_key``) is still in the key table, in one statement.
        keyed = row.add_columns(KEY_HELD.label("key_held")).where(SESSION_KEY)
        self.lock_keyed = c(self.locked(keyed))
        self.insert_session = c(self.new_session_row(insert(S), bound_row(S)))
        self.set_session = c(
            update(S)
            .where(SESSION_KEY)
            .values(
                title=bindparam("v_title", type_=S.c.title.type),
                state=bindparam("v_state", type_=JSONValue),
                updated_at=bindparam("v_updated", type_=UTCDateTime),
                message_count=bindparam("v_messages_now", type_=BigInteger),
                token_total=bindparam("v_tokens_now", type_=BigInteger),
                event_seq=bindparam("v_seq_now", type_=BigInteger),
                version=bindparam("v_version", type_=BigInteger),
            )
        )
        self.upsert_user = c(ops.upsert(user_state, USER_KEY, ["value", "updated_at"]).values(
            bound_row(user_state)))  # fmt: skip
        self.upsert_app = c(ops.upsert(app_state, APP_KEY, ["value", "updated_at"]).values(
            bound_row(app_state)))  # fmt: skip
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
        self.insert_event = c(insert(events).values(bound_row(events)))
        self.insert_words = c(words_insert())
        copied = select(events.c.org_id, bindparam("k_child", type_=ID), *EVENT_COLUMNS).where(
            EVENTS_KEY
        )
        self.copy_events = c(
            insert(events).from_select(
                ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]], copied
            )
        )
        words_of = select(
            WORDS.c.org_id, WORDS.c.word, bindparam("k_child", type_=ID), WORDS.c.seq, WORDS.c.n
        ).where(WORDS.c.org_id == bindparam("k_org"), WORDS.c.session_id == bindparam("k_id"))
        self.copy_words = c(
            insert(WORDS).from_select(["org_id", "word", "session_id", "seq", "n"], words_of)
        )
        self.newest_seq = c(
            select(events.c.seq).where(EVENTS_KEY).order_by(events.c.seq.desc()).limit(1)
        )
        after = bindparam("k_after_seq", type_=BigInteger)
        doomed = (EVENTS_KEY, events.c.seq > after)
        self.removed = c(select(*EVENT_COLUMNS).where(*doomed).order_by(events.c.seq))
        self.tally = c(
            select(
                func.count().label("n"),
                func.coalesce(func.sum(events.c.tokens), 0).label("tokens"),
            ).where(*doomed)
        )
        self.drop_after = c(delete(events).where(*doomed))
        self.max_packet = c(select(literal_column("@@max_allowed_packet", BigInteger).label("n")))
        # With the size of ds_sessions.title in bytes (NULL before the table exists).
        self.limits = c(
            text(
                "SELECT @@max_allowed_packet AS n, (SELECT CHARACTER_MAXIMUM_LENGTH FROM "
                "information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND "
                "TABLE_NAME = 'ds_sessions' AND COLUMN_NAME = 'title') AS title"
            ).columns(n=BigInteger, title=BigInteger)
        )
        # InnoDB's lock wait is a setting of the connection's session, not of a transaction:
        # a batched delete sets it for itself and puts back the value it found.
        self.set_lock_wait = c(
            text(
                f"SET {_SAVED_WAIT} = @@SESSION.innodb_lock_wait_timeout, "
                "SESSION innodb_lock_wait_timeout = :v_wait"
            ).bindparams(bindparam("v_wait", type_=Integer))
        )
        self.reset_lock_wait = c(text(f"SET SESSION innodb_lock_wait_timeout = {_SAVED_WAIT}"))

    def touch_statement(self) -> Any:
        """Unused on MySQL, whose touch locks the row and writes its values
        (``MySQLPrograms.touch``)."""
        return select(*META).where(SESSION_KEY)

    def before_position(self) -> Any:
        """Spelled out: MySQL makes no index range of a row comparison (it would read the
        organisation's index from its start), but does of this."""
        at = bindparam("k_after_at", type_=UTCDateTime)
        return or_(
            S.c.updated_at < at,
            and_(S.c.updated_at == at, S.c.id < bindparam("k_after_id", type_=ID)),
        )

    def listing(
        self,
        columns: builtins.list[Any],
        user: bool,
        app: bool,
        parent: bool,
        limit: bool,
        after: bool = False,
    ) -> Any:
        """The listing, reading its own index whatever the statistics say: MariaDB prices
        one user's sessions from sampled statistics and now and then reads the whole
        organisation's index instead of the user's, filtering each row. The index named is
        the best plan for the filter in every case (a range in ``list``'s order)."""
        query = super().listing(columns, user, app, parent, limit, after)
        index = "ix_ds_sessions_user_org_updated" if user else "ix_ds_sessions_org_updated"
        return query.with_hint(S, f"FORCE INDEX ({index})")

    def locked(self, query: Any) -> Any:
        """``query`` locking the rows it reads (``FOR UPDATE``) until the transaction ends."""
        return query.with_for_update()

    def contents_statement(self, has_limit: bool, *, as_rows: bool = False) -> Compiled:
        """Always as rows: one text per event, joined here (a ``GROUP_CONCAT`` of a long
        transcript would pass ``max_allowed_packet``)."""
        return super().contents_statement(has_limit, as_rows=True)

    def event_contents(self, has_limit: bool) -> Any:
        """Unused on MySQL (``contents_statement``)."""
        return self.event_contents_rows(has_limit)

    def json_listing(self, listed: Any, owners: Any, user_agg: Any, apps: Any, app_agg: Any) -> Any:
        """The JSON object of ``states_json_query`` written around three ``GROUP_CONCAT``,
        the sessions in the listing's order (stored JSON text embedded as is)."""
        micros = func.timestampdiff(
            literal_column("MICROSECOND"), literal("1970-01-01 00:00:00"), listed.c.updated_at
        )
        comma = literal(",", Text)
        item = func.concat(
            literal("[", Text), _quoted(listed.c.id), comma, _quoted(listed.c.user_id), comma,
            _quoted(listed.c.app_name), comma, micros, comma, listed.c.version, comma,
            _quoted(listed.c.incarnation), comma, listed.c.state, literal("]", Text),
        )  # fmt: skip
        order: Any = literal_column(f"{listed.name}.updated_at DESC, {listed.name}.id DESC")
        sessions = select(func.group_concat(item.op("ORDER BY")(order))).scalar_subquery()
        owner = func.concat(
            literal("[", Text), _quoted(owners.c.app_name), comma, _quoted(owners.c.user_id),
            comma, func.coalesce(user_agg, "{}"), literal("]", Text),
        )  # fmt: skip
        users = select(func.group_concat(owner)).scalar_subquery()
        app = func.concat(
            literal("[", Text), _quoted(apps.c.app_name), comma,
            func.coalesce(app_agg, "{}"), literal("]", Text),
        )  # fmt: skip
        every_app = select(func.group_concat(app)).scalar_subquery()

        def array(part: Any) -> Any:
            return func.concat(literal("[", Text), func.coalesce(part, ""), literal("]", Text))

        whole = func.concat(
            literal('{"sessions":', Text), array(sessions), literal(',"users":', Text),
            array(users), literal(',"apps":', Text), array(every_app), literal("}", Text),
        )  # fmt: skip
        return select(whole.label("listing"))


class MySQLPrograms(Programs):
    """MySQL's writes: each one transaction that locks the session row before it writes."""

    q: MySQLStatements

    # -- building blocks ---------------------------------------------------------------------

    def _locked(self, params: dict[str, Any]) -> Program[Any]:
        """Lock the session row and check the write's guards on it; return the row."""
        org_id, session_id = params["k_org"], params["k_id"]
        key = {"k_org": org_id, "k_id": session_id}
        if self.q.sealed:
            key["k_key"] = params.get("k_key")
        row = (yield Query(self.q.lock_keyed if self.q.sealed else self.q.lock_row, key)).first()
        if row is None:
            raise SessionNotFoundError(org_id, session_id)
        expected = params.get("v_expected")
        if params.get("v_incarnation") not in (None, row.incarnation):
            raise StaleSessionError(org_id, session_id, expected or 0, RECREATED)
        if expected is not None and expected != row.version:
            raise StaleSessionError(org_id, session_id, expected)
        counters = (row.message_count, row.token_total, row.version)
        check_counters(org_id, session_id, counters, *_increments(params))
        check_owner(params, row)
        if self.q.sealed and not row.key_held:
            raise KeyDestroyed(org_id, params["k_key"])
        return row

    def _set(self, row: Any, params: dict[str, Any], **changes: Any) -> Program[None]:
        """Write the session row's new values: ``changes`` over what ``row`` holds, its
        version one more, ``updated_at`` the write's time unless the row has a later one."""
        now = params["v_now"]
        values = {
            "k_org": params["k_org"], "k_id": params["k_id"], "v_title": row.title,
            "v_state": row.state, "v_updated": max(row.updated_at, now),
            "v_messages_now": row.message_count, "v_tokens_now": row.token_total,
            "v_seq_now": row.event_seq, "v_version": row.version + 1,
        }  # fmt: skip
        values.update(changes)
        yield Query(self.q.set_session, values)

    def _write_shared(
        self, org_id: str, app_name: str, user_id: str, delta: ScopedDelta, now: Any
    ) -> Program[None]:
        """Write shared keys, in sorted order (so concurrent writers lock them alike)."""
        yield from write_shared(self.q, org_id, app_name, user_id, delta, now)

    def _insert_events(
        self, org_id: str, session_id: str, first: int, stored: builtins.list[Event]
    ) -> Program[None]:
        rows = [
            {
                "k_org": org_id, "session_id": session_id, "seq": seq, "id": event.id,
                "author": event.author, "invocation_id": event.invocation_id,
                "content": event.content, "state_delta": event.state_delta,
                "tokens": event.tokens, "timestamp": event.timestamp,
            }
            for seq, event in enumerate(stored, start=first)
        ]  # fmt: skip
        yield Query(self.q.insert_event, rows, many=True)
        found = [
            word
            for seq, event in enumerate(stored, start=first)
            for word in word_rows(
                org_id, session_id, seq, event.content, getattr(event, "search_terms", None)
            )
        ]
        if found:
            yield Query(self.q.insert_words, found, many=True)

    def _shared(self, org_id: str, app_name: str, user_id: str) -> Program[tuple[Any, Any]]:
        found = (
            yield Query(self.q.shared, {"k_org": org_id, "k_app": app_name, "k_user": user_id})
        ).first()
        return shared_items(found.user_state, found.app_state)

    @staticmethod
    def _write(make: Callable[[], Program[T]]) -> Job[T]:
        return Job(retried(make), "write")

    # -- writes --------------------------------------------------------------------------------

    def create(self, row: dict[str, Any], delta: ScopedDelta) -> Job[tuple[Any, Any]]:
        return self._write(lambda: self._create(row, delta))

    def _create(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        org, app_name, user_id = row["org_id"], row["app_name"], row["user_id"]
        try:
            done = yield Query(self.q.insert_session, {**row, "k_org": org})
        except Exception as exc:
            if _is_duplicate(exc):
                raise SessionExistsError(org, row["id"]) from None
            raise
        if not done.rowcount:  # an encrypted store's, whose user's data key is gone
            raise KeyDestroyed(org, row["k_key"])
        yield from self._write_shared(org, app_name, user_id, delta, row["created_at"])
        return (yield from self._shared(org, app_name, user_id))

    def get_with_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        return self.session_then_events(shape, params)

    def get_with_events_json(
        self, shape: tuple[bool, bool], params: dict[str, Any]
    ) -> Job[tuple[Session, str]]:
        return self.session_then_events_json(shape, params)

    def contents(
        self, stmt: Any, params: dict[str, Any], as_rows: bool = False
    ) -> Program[str | None]:
        """Always as rows (``MySQLStatements.contents_statement``)."""
        return super().contents(stmt, params, as_rows=True)

    def touch(self, params: dict[str, Any]) -> Program[Session]:
        return retried(lambda: self._touch(params))

    def _touch(self, params: dict[str, Any]) -> Program[Session]:
        row = yield from self._locked(params)
        changes = {
            "v_messages_now": row.message_count + params["v_messages"],
            "v_tokens_now": row.token_total + params["v_tokens"],
            "v_title": row.title or params["v_title"],
        }
        yield from self._set(row, params, **changes)
        return session_from_row(
            SimpleNamespace(
                **{**row._asdict(), "message_count": changes["v_messages_now"],
                   "token_total": changes["v_tokens_now"], "title": changes["v_title"],
                   "version": row.version + 1, "updated_at": max(row.updated_at, params["v_now"])}
            )
        )  # fmt: skip

    def update(self, params: dict[str, Any], delta: ScopedDelta) -> Job[int]:
        return self._write(lambda: self._update(params, delta))

    def _update(self, params: dict[str, Any], delta: ScopedDelta) -> Program[int]:
        row = yield from self._locked(params)
        if delta.user_deleted or delta.app_deleted:
            delta = yield from self.held_deletes(params, delta, row)
        yield from self._set(row, params, v_title=params["v_title"], v_state=params["v_state"])
        yield from self._write_shared(
            params["k_org"], row.app_name, row.user_id, delta, params["v_now"]
        )
        return int(row.version) + 1

    def append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Job[int]:
        return self._write(lambda: self._append_many(dict(params), [stored], delta, title=False))

    def append_many(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Job[int]:
        return self._write(lambda: self._append_many(dict(params), stored, delta, title=True))

    def _append_many(
        self,
        params: dict[str, Any],
        stored: builtins.list[Event],
        delta: ScopedDelta,
        *,
        title: bool,
    ) -> Program[int]:
        org_id, session_id = params["k_org"], params["k_id"]
        count = len(stored)
        row = yield from self._locked(params)
        if row.event_seq > MAX_INT64 - count:
            raise unwritten(params)
        tokens = sum(event.tokens for event in stored)
        changes: dict[str, Any] = {
            "v_messages_now": row.message_count + count,
            "v_tokens_now": row.token_total + tokens,
            "v_seq_now": row.event_seq + count,
        }
        if title:
            changes["v_title"] = row.title or params.get("v_title", "")
        if delta.private_set:
            changes["v_state"] = {**row.state, **delta.private_set}
        yield from self._set(row, params, **changes)
        yield from self._insert_events(org_id, session_id, row.event_seq + 1, stored)
        yield from self._write_shared(org_id, row.app_name, row.user_id, delta, params["v_now"])
        return int(row.event_seq) + count

    def fork(self, params: dict[str, Any]) -> Job[Session]:
        return self._write(lambda: self._fork(params))

    def _fork(self, params: dict[str, Any]) -> Program[Session]:
        q = self.q
        org_id, parent_id, child_id = params["k_org"], params["k_id"], params["k_child"]
        with_events = params["v_with_events"]
        parent = (yield Query(q.lock_row, {"k_org": org_id, "k_id": parent_id})).first()
        if parent is None:
            raise SessionNotFoundError(org_id, parent_id)
        private = fork_state(parent.state, parent_id)
        row = fork_row(params, parent, parent.title, private)
        try:
            yield Query(q.insert_session, {**row, "k_org": org_id})
        except Exception as exc:
            if _is_duplicate(exc):
                raise SessionExistsError(org_id, child_id) from None
            raise
        if with_events:
            copy = {"k_org": org_id, "k_id": parent_id, "k_child": child_id}
            yield Query(q.copy_events, copy)
            yield Query(q.copy_words, copy)
        user, app = yield from self._shared(org_id, parent.app_name, parent.user_id)
        return session_from_row(SimpleNamespace(**row), merge_state(private, user, app))

    def _cut(self, params: dict[str, Any], row: Any, count: int, tokens: int) -> Program[None]:
        after = params["k_after_seq"]
        yield from self._set(
            row,
            params,
            v_seq_now=min(row.event_seq, after),
            v_messages_now=max(row.message_count - count, 0),
            v_tokens_now=max(row.token_total - tokens, 0),
        )

    def truncate(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        return [self._write(lambda: self._truncate(dict(params)))]

    def _truncate(self, params: dict[str, Any]) -> Program[builtins.list[Event] | None]:
        row = yield from self._locked(params)
        return (yield from self._remove_after(params, row))

    def _remove_after(self, params: dict[str, Any], row: Any) -> Program[builtins.list[Event]]:
        from ...programs import event_from_row

        removed = [event_from_row(r) for r in (yield Query(self.q.removed, params)).rows]
        if removed:
            yield Query(self.q.drop_after, params)
        yield from self._cut(params, row, len(removed), sum(e.tokens for e in removed))
        return removed

    def pop(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        return [self._write(lambda: self._pop(dict(params)))]

    def _pop(self, params: dict[str, Any]) -> Program[builtins.list[Event] | None]:
        row = yield from self._locked(params)
        newest = (yield Query(self.q.newest_seq, params)).first()
        if newest is None:
            return []
        params["k_after_seq"] = int(newest.seq) - 1
        return (yield from self._remove_after(params, row))

    def discard(self, params: dict[str, Any]) -> Job[int]:
        return self._write(lambda: self._discard_mysql(dict(params)))

    def _discard_mysql(self, params: dict[str, Any]) -> Program[int]:
        row = yield from self._locked(params)
        found = (yield Query(self.q.tally, params)).first()
        count, tokens = int(found.n), int(found.tokens)
        if count:
            yield Query(self.q.drop_after, params)
        yield from self._cut(params, row, count, tokens)
        return count

    def delete_batch(
        self, batch: Retention, params: dict[str, Any], wait: float, last: Any
    ) -> Program[int]:
        """``Programs.delete_batch`` with each row lock waited for at most ``wait`` seconds
        (rounded up to whole seconds, InnoDB's unit), where InnoDB would wait its
        ``innodb_lock_wait_timeout`` (50 s by default): a wait that runs out raises error
        1205, which ``purge`` and ``delete_user`` count against their ``lock_timeout``. The
        connection's own setting is put back before the transaction ends, or the
        connection is terminated (a cancellation, a lost connection)."""
        yield Query(self.q.set_lock_wait, {"v_wait": max(1, math.ceil(wait))})
        try:
            deleted = yield from super().delete_batch(batch, params, wait, last)
        except Exception:
            yield Query(self.q.reset_lock_wait)
            raise
        yield Query(self.q.reset_lock_wait)
        return deleted

    def limits(self, title: bool) -> Program[tuple[int, int | None]]:
        """The server's ``max_allowed_packet`` in bytes and, with ``title``, the size of
        ``ds_sessions.title`` in bytes (else None, as before the table exists): one read."""
        found = (yield Query(self.q.limits if title else self.q.max_packet, {})).first()
        width = found.title if title else None
        return int(found.n), None if width is None else int(width)

    def delete(self, key: dict[str, Any]) -> Job[None]:
        return self._write(lambda: self._delete(key))
