"""Postgres: its own statements (whole operations as one statement) and its writes."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Select,
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
    literal_column,
    select,
    true,
    update,
)
from sqlalchemy import table as table_clause
from sqlalchemy.dialects.postgresql import JSON, JSONB, TSVECTOR, aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import CTE

from ....errors import SessionExistsError, SessionNotFoundError
from ....model import Event, Session
from ....prepare import FORKED_FROM, micros
from ....state import ScopedDelta
from ...compiled import Compiled
from ...dialect import DialectOps
from ...programs import (
    Job,
    Programs,
    event_from_array,
    session_with_state,
    shared_items,
    shared_params,
    unwritten,
)
from ...runner import Program, Query
from ...schema import JSONDocument, JSONValue, UTCDateTime, app_state, events, user_state
from ...search import indexed_vector
from ...statements import (
    APP_KEY,
    EVENT_COLUMNS,
    EVENTS_KEY,
    LATER,
    META,
    NOW,
    SESSION_KEY,
    USER_KEY,
    S,
    Statements,
)

__all__ = ["PostgresPrograms", "PostgresReads", "PostgresShapes", "PostgresStatements"]

VECTOR = "search_vector"
"""``ds_events``'s search vector column (Postgres; Alembic's, not in the metadata)."""
EVENTS_WITH_VECTOR = table_clause(
    events.name, *[column(col.name, col.type) for col in events.c], column(VECTOR, TSVECTOR)
)
"""``ds_events`` with its search vector column, for the inserts that send one."""
SENT_VECTOR = cast(bindparam("e_search_vector", type_=Text), TSVECTOR)
"""An appended event's vector, sent as text (``fulltext.search_vector``)."""
STORED_VECTOR = literal_column(f"{events.name}.{VECTOR}", type_=TSVECTOR)
"""A stored event's vector (copied by a fork)."""

_LAST_MICROS = micros(datetime.max.replace(tzinfo=timezone.utc))
_FIRST_MICROS = micros(datetime.min.replace(tzinfo=timezone.utc))


def _epoch_micros(moment: Any) -> Any:
    """A timestamptz column in microseconds since 1970 UTC, as a bigint.

    ``infinity`` and ``-infinity`` (which only a hand-written statement can store: every
    write refuses the ends of the range) read as ``datetime.max`` and ``datetime.min`` in
    UTC, as asyncpg reads them in a plain column, so one such row never fails a read.
    """
    finite = cast(extract("epoch", moment) * 1_000_000, BigInteger)
    infinity: Any = literal_column("'infinity'::timestamptz")
    return case(
        (func.isfinite(moment), finite),
        (moment == infinity, literal(_LAST_MICROS, BigInteger)),
        else_=literal(_FIRST_MICROS, BigInteger),
    )


Scopes = tuple[bool, bool, bool, bool]
"""Which shared writes a statement makes: user keys set, app keys set, user keys deleted,
app keys deleted."""


class PostgresShapes(Statements):
    """What Postgres runs in either mode (one statement per operation, or distributed):
    row locks, a session read with its transcript in one statement, ``lock_timeout``."""

    def __init__(self, ops: DialectOps, dialect: Dialect, *, sealed: bool = False) -> None:
        super().__init__(ops, dialect, sealed=sealed)
        c = self.compile
        self.pg_lock_session = c(select(S.c.version).where(SESSION_KEY).with_for_update())
        self.lock_timeout = c(
            select(
                func.set_config(literal("lock_timeout"), bindparam("v_wait", type_=Text), true())
            )
        )

    def locked(self, query: Select[Any]) -> Select[Any]:
        """``query ... FOR UPDATE``."""
        return query.with_for_update()

    def whole_org(self) -> ColumnElement[bool]:
        """``org_id`` compared under "POSIX", the collation ``ix_ds_sessions_org_updated``
        indexes it under (revision 0005): the same rows as ``org_id = :k_org`` (the byte
        order of the column's "C"), and the only condition that index serves, so that no
        lookup by key can take it whatever the statistics."""
        return S.c.org_id.collate("POSIX") == bindparam("k_org")

    def pg_get_with_events(self, has_after: bool, has_limit: bool, as_text: bool = False) -> Any:
        """Postgres: a session, its shared state and its events in one statement.

        The events come as one json array of ``[seq, id, author, invocation_id, content,
        state_delta, tokens, epoch microseconds]`` rows, oldest first (``as_text``: as its
        JSON text, which the driver does not decode; see ``events_json``).
        """
        chosen = self.events_query(has_after, has_limit).subquery("chosen")
        whole: Any = self.events_json(chosen)
        if as_text:
            whole = cast(whole, Text)
        transcript = select(whole).scalar_subquery().label("events")
        return select(*META, *self.state_columns(), transcript).where(SESSION_KEY)

    @staticmethod
    def events_json(rows: Any) -> Any:
        """The json array of the events ``rows`` holds (a subquery or CTE with the event
        columns), oldest first, each ``[seq, id, author, invocation_id, content,
        state_delta, tokens, epoch microseconds]``; NULL without rows.

        ``json``, not ``jsonb``: ``json_build_array`` and ``json_agg`` only append each
        value's text, while their jsonb twins convert every content and state delta into a
        new jsonb tree and then back to text, which took about half of a transcript read's
        time (20 events of 1,000: 0.63 ms against 0.32 ms per execution, ``pgbench -M
        prepared``). A json text can also reach 1 GB, where a jsonb value stops at 256 MB.
        """
        item = func.json_build_array(
            *[rows.c[col.name] for col in EVENT_COLUMNS if col.name != "timestamp"],
            _epoch_micros(rows.c.timestamp),
        )
        return func.json_agg(aggregate_order_by(item, rows.c.seq))

    def json_listing(self, listed: Any, owners: Any, user_agg: Any, apps: Any, app_agg: Any) -> Any:
        """Postgres: ``json_build_object`` of three ``json_agg``; jsonb state embedded as is."""
        empty_list = cast(literal("[]", Text), JSON)
        empty_object = cast(literal("{}", Text), JSONB)
        item = func.json_build_array(
            listed.c.id, listed.c.user_id, listed.c.app_name, _epoch_micros(listed.c.updated_at),
            listed.c.version,
            listed.c.incarnation, listed.c.state,
        )  # fmt: skip
        newest = aggregate_order_by(item, listed.c.updated_at.desc(), listed.c.id.desc())
        sessions = select(func.coalesce(func.json_agg(newest), empty_list)).scalar_subquery()
        owner = func.json_build_array(
            owners.c.app_name, owners.c.user_id, func.coalesce(user_agg, empty_object)
        )
        users = select(func.coalesce(func.json_agg(owner), empty_list)).scalar_subquery()
        app = func.json_build_array(apps.c.app_name, func.coalesce(app_agg, empty_object))
        every_app = select(func.coalesce(func.json_agg(app), empty_list)).scalar_subquery()
        whole = func.json_build_object(
            literal("sessions", Text), sessions, literal("users", Text), users,
            literal("apps", Text), every_app,
        )  # fmt: skip
        return select(cast(whole, Text).label("listing"))

    def event_contents(self, has_limit: bool) -> Any:
        """A session's event contents, oldest first, as ONE JSON array text in one row.

        ``string_agg`` over the contents in the primary key's order (a subquery ordered by
        seq, as SQLite's ``group_concat``; no ``ORDER BY`` in the aggregate, which would sort
        its input on Postgres before 16). A content is ``json`` (revision 0007): its text is
        joined as stored, nothing is parsed. One row rather than one row per event: the
        client makes one driver record, not one per event, and a thousand records that a
        read holds while its rows arrive were what moved concurrent reads' garbage into
        Python's oldest generation (full collections then took most of the client's time
        with 16 concurrent 1,000-item reads). Past 1 GB the text cannot be built:
        ``event_contents_rows`` reads the transcript instead (``SQLStore.list_event_contents``).
        """
        rows = self.chosen_contents(has_limit)
        text = func.coalesce(cast(rows.c.content, Text), literal("null", Text))
        ordered = select(text.label("c")).order_by(rows.c.seq).subquery("ordered")
        joined = func.string_agg(ordered.c.c, literal(",", Text))
        return select((literal("[", Text) + joined + literal("]", Text)).label("contents"))


class PostgresStatements(PostgresShapes):
    """Postgres's statements: whole operations as one statement each (data-modifying CTEs).

    With ``vectors`` (``ds_events.search_vector`` is a plain column, revision 0008), the
    writes of events send each event's search vector (``e_search_vector``, and a batch's
    ``search_vector``; ``fulltext.search_vector``) and a fork copies the parent's; without
    (a generated column, revisions 0003 to 0007, or no column), Postgres computes them.
    """

    def __init__(
        self, ops: DialectOps, dialect: Dialect, *, vectors: bool = True, sealed: bool = False
    ) -> None:
        self.vectors = vectors
        super().__init__(ops, dialect, sealed=sealed)
        c = self.compile
        self.pg_fork = c(self._pg_fork())
        self.pg_truncate = c(self._pg_truncate())
        self.pg_pop = c(self._pg_truncate(pop=True))

    @property
    def _events(self) -> Any:
        """The table events are inserted into: with the search vector column, or without."""
        return EVENTS_WITH_VECTOR if self.vectors else events

    @property
    def _event_names(self) -> builtins.list[str]:
        """The columns an insert of events fills, in the order its rows give them."""
        names = ["org_id", "session_id", *[col.name for col in EVENT_COLUMNS]]
        return [*names, VECTOR] if self.vectors else names

    # -- writes with shared changes: one statement per set of scopes written ----------------

    def writing(self, name: str, delta: ScopedDelta) -> Compiled:
        """The statement ``name`` (``update``, ``append``, ``append_many``, ``create``) with
        the shared writes ``delta`` makes and no others.

        A data-modifying CTE costs every execution even when its input is empty: the
        executor opens and locks its table and indexes and sets up the upsert's conflict
        check. An append without shared keys (every one of the OpenAI Agents SDK adapter's,
        and ADK's without ``user:`` or ``app:`` keys) thus runs a statement with no
        shared-state CTE at all; each shape is compiled on first use (only then is its
        builder looked up).
        """
        scopes = (
            bool(delta.user_set), bool(delta.app_set),
            bool(delta.user_deleted), bool(delta.app_deleted),
        )  # fmt: skip
        builders: dict[str, Callable[[Scopes], Any]] = {
            "update": self._pg_update,
            "append": self._pg_append,
            "append_many": self._pg_append_many,
            "create": self._pg_create,
        }
        build = builders[name]
        return self.shape(("pg", name, scopes), lambda: build(scopes))

    def _pg_update(self, scopes: Scopes) -> Any:
        """save: the version-checked update of the session row and every shared change."""
        saved = self._update().returning(S.c.version, S.c.app_name, S.c.user_id).cte("saved")
        return select(saved.c.version).add_cte(*self._shared_writes(saved, scopes))

    def _pg_append(self, scopes: Scopes) -> Any:
        """append_event: seq, counters and private merge, the event row, the shared delta."""
        moved = self._append(merge=True).returning(*self._append_returning()).cte("moved")
        event_row = select(
            bindparam("k_org"),
            bindparam("k_id"),
            moved.c.event_seq,
            bindparam("e_id"),
            bindparam("e_author"),
            bindparam("e_invocation_id"),
            bindparam("e_content", type_=JSONDocument),
            bindparam("e_state_delta", type_=JSONValue),
            bindparam("v_tokens"),
            bindparam("e_timestamp", type_=UTCDateTime),
        ).select_from(moved)
        if self.vectors:
            event_row = event_row.add_columns(SENT_VECTOR)
        added = insert(self._events).from_select(self._event_names, event_row)
        # Event deltas only set keys, so the append needs no deletes.
        writes = self._shared_writes(moved, scopes, deletes=False)
        return select(moved.c.event_seq).add_cte(added.cte("added"), *writes)

    def _pg_create(self, scopes: Scopes) -> Any:
        """create: the session row (unless the id is taken), its shared state, and the
        shared state that already existed (the statement's snapshot predates its own
        writes)."""
        row = {col.name: bindparam(col.name, type_=col.type) for col in S.c}
        created = (
            self.new_session_row(self.ops.insert(S), row)
            .on_conflict_do_nothing()
            .returning(S.c.app_name, S.c.user_id)
            .cte("created")
        )
        count = select(func.count()).select_from(created).scalar_subquery().label("created")
        return select(
            count,
            self._user_agg(bindparam("org_id"), bindparam("app_name"), bindparam("user_id")),
            self._app_agg(bindparam("org_id"), bindparam("app_name")),
        ).add_cte(*self._shared_writes(created, scopes, deletes=False))

    def _shared_writes(self, driver: CTE, scopes: Scopes, *, deletes: bool = True) -> list[CTE]:
        """Upserts and deletes of shared keys, done only when ``driver`` returned its row.

        ``driver`` is the CTE of the operation's own write (insert or update of the session
        row) returning ``app_name`` and ``user_id``: if it wrote nothing (a stale version,
        an existing id, an unknown session), neither do these. ``scopes`` says which are
        written (``writing``); with ``deletes`` false, no deletes whatever they say.
        """
        ops = self.ops
        ctes: list[CTE] = []
        user_set, app_set, user_deleted, app_deleted = scopes
        for table, name, keys, scope, setting, deleting in (
            (user_state, "user", USER_KEY, [driver.c.app_name, driver.c.user_id], user_set,
             deletes and user_deleted),
            (app_state, "app", APP_KEY, [driver.c.app_name], app_set, deletes and app_deleted),
        ):  # fmt: skip
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
            if setting:
                ctes.append(upsert.cte(f"{name}_set"))
            if not deleting:
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
        if self.vectors:  # the parent's vectors, as they are
            transcript = transcript.add_columns(STORED_VECTOR)
        copied = insert(self._events).from_select(self._event_names, transcript)
        return select(
            *[child.c[col.name] for col in META],
            child.c.state,
            self._user_agg(bindparam("k_org"), child.c.app_name, child.c.user_id),
            self._app_agg(bindparam("k_org"), child.c.app_name),
        ).add_cte(copied.cte("copied"))

    def _pg_append_many(self, scopes: Scopes) -> Any:
        """Postgres: a whole batch append as one statement.

        ``v_batch`` is a JSON array of events (``n``, its place from 1, ``id``, ``author``,
        ``invocation_id``, ``content``, ``state_delta``, ``tokens``, ``timestamp`` as ISO
        text), stored in order with consecutive seqs ending at the session's new
        ``event_seq``.
        """
        moved = self.append_many(merge=True).cte("moved")
        # One parse of the batch into the columns' own types; a json column keeps its value's
        # text as the batch gives it, so a content is stored as written (as a single append).
        carried = [column(c.name, c.type) for c in EVENT_COLUMNS if c.name != "seq"]  # seq: n
        if self.vectors:
            carried.append(column(VECTOR, TSVECTOR))
        batch = (
            func.json_to_recordset(bindparam("v_batch", type_=JSONDocument))
            .table_valued(column("n", BigInteger), *carried)
            .render_derived(with_types=True)
        )
        rows = (
            select(
                bindparam("k_org"),
                bindparam("k_id"),
                moved.c.event_seq - bindparam("v_count", type_=BigInteger) + batch.c.n,
                *[batch.c[col.name] for col in carried],
            )
            .select_from(moved)
            .join(batch, true())
        )
        added = insert(self._events).from_select(self._event_names, rows)
        writes = self._shared_writes(moved, scopes, deletes=False)
        return select(moved.c.event_seq).add_cte(added.cte("added"), *writes)

    def _pg_truncate(self, *, pop: bool = False) -> Any:
        """Postgres: a truncation as one statement; the removed events come back as one
        json array (``events_json``, as ``pg_get_with_events`` returns them), oldest first.

        The statement reads the transcript in its snapshot, and updates the session row
        only if the row's version is still the one that snapshot saw (a concurrent writer
        that committed meanwhile moved it on): then the snapshot's events are the current
        ones, and the row lock held from then on keeps them so. No row back: no session,
        a failed guard, or such a race; run it again after ``pg_lock_session`` in one
        transaction, where it cannot lose the race.

        With ``pop``, ``k_after_seq`` is the snapshot's newest seq less one (the newest
        event goes), and nothing is written when there is none. The row then comes back
        whenever the snapshot has the session: ``version`` NULL when nothing was written,
        ``newest`` NULL when the transcript was empty.
        """
        seen_columns: list[Any] = [S.c.version]
        if pop:  # the snapshot's newest seq, read once
            newest = select(func.max(events.c.seq)).where(EVENTS_KEY).scalar_subquery()
            seen_columns.append(newest.label("newest"))
        seen = select(*seen_columns).where(SESSION_KEY).cte("seen").prefix_with("MATERIALIZED")
        after: Any = (
            select(seen.c.newest).scalar_subquery() - 1
            if pop
            else bindparam("k_after_seq", type_=BigInteger)
        )
        doomed = and_(EVENTS_KEY, events.c.seq > after)
        count = select(func.count()).where(doomed).scalar_subquery()
        tokens = select(func.coalesce(func.sum(events.c.tokens), 0)).where(doomed)
        zero = literal(0, BigInteger)
        guard = [self.truncate_guard(), S.c.version == seen.c.version]
        if pop:
            guard.append(seen.c.newest.is_not(None))
        cut = (
            update(S)
            .where(*guard)
            .values(
                event_seq=case((S.c.event_seq > after, after), else_=S.c.event_seq),
                message_count=func.greatest(S.c.message_count - count, zero),
                token_total=func.greatest(S.c.token_total - tokens.scalar_subquery(), zero),
                updated_at=LATER,
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
        transcript = select(self.events_json(removed)).scalar_subquery().label("events")
        if not pop:
            return select(cut.c.version, transcript)
        written = select(cut.c.version).scalar_subquery().label("version")
        return select(written, seen.c.newest, transcript).select_from(seen)


class PostgresReads(Programs):
    """What Postgres runs in either mode: a session with its transcript in one statement,
    and ``lock_timeout`` for batched deletes."""

    q: PostgresShapes

    def lock_wait(self, wait: float) -> Program[None]:
        yield Query(self.q.lock_timeout, {"v_wait": f"{max(1, int(wait * 1000))}ms"})

    def get_with_events(self, shape: tuple[bool, bool], params: dict[str, Any]) -> Job[Session]:
        stmt = self.q.shape(("get+events", *shape), lambda: self.q.pg_get_with_events(*shape))
        return Job(self._get_with_events(stmt, params), "read")

    def get_with_events_json(
        self, shape: tuple[bool, bool], params: dict[str, Any]
    ) -> Job[tuple[Session, str]]:
        key = ("get+events:json", *shape)
        stmt = self.q.shape(key, lambda: self.q.pg_get_with_events(*shape, as_text=True))
        return Job(self._get_with_events_json(stmt, params), "read")

    def _get_with_events_json(
        self, stmt: Any, params: dict[str, Any]
    ) -> Program[tuple[Session, str]]:
        row = (yield Query(stmt, params)).first()
        if row is None:
            raise SessionNotFoundError(params["k_org"], params["k_id"])
        return session_with_state(row), row.events or "[]"

    def _get_with_events(self, stmt: Any, params: dict[str, Any]) -> Program[Session]:
        row = (yield Query(stmt, params)).first()
        if row is None:
            raise SessionNotFoundError(params["k_org"], params["k_id"])
        session = session_with_state(row)
        session.events = [event_from_array(item) for item in row.events or ()]
        return session


class PostgresPrograms(PostgresReads):
    """Postgres's writes: one statement each (atomic by itself: no BEGIN/COMMIT round trips),
    but for the saves that delete shared keys and a truncation that lost a race."""

    q: PostgresStatements

    def create(self, row: dict[str, Any], delta: ScopedDelta) -> Job[tuple[Any, Any]]:
        return Job(self._create(row, delta), "atomic")

    def _create(self, row: dict[str, Any], delta: ScopedDelta) -> Program[tuple[Any, Any]]:
        params = {**row, "k_org": row["org_id"], "v_now": row["created_at"]}
        params.update(shared_params(delta))
        found = (yield Query(self.q.writing("create", delta), params)).first()
        if not found.created:
            yield from self.check_key(params)  # or the user's data key was destroyed
            raise SessionExistsError(row["org_id"], row["id"])
        # The statement's read predates its own writes: lay the new shared keys over it.
        return shared_items({**(found.user_state or {}), **delta.user_set},
                            {**(found.app_state or {}), **delta.app_set})  # fmt: skip

    def update(self, params: dict[str, Any], delta: ScopedDelta) -> Job[int]:
        # A delete of a shared key is checked against the value read, under a row lock taken
        # in the same transaction: that save needs a transaction of its own.
        guarded = bool(delta.user_deleted or delta.app_deleted)
        return Job(self._update(params, delta, guarded), "write" if guarded else "atomic")

    def _update(self, params: dict[str, Any], delta: ScopedDelta, guarded: bool) -> Program[int]:
        if guarded:
            delta = yield from self.held_deletes(params, delta)
        stmt = self.q.writing("update", delta)
        done = (yield Query(stmt, {**params, **shared_params(delta)})).first()
        if done is None:
            yield from self.stale(params)
        return int(done.version)

    def append(self, params: dict[str, Any], stored: Event, delta: ScopedDelta) -> Job[int]:
        params.update(shared_params(delta))
        params.update(
            v_private_delta=delta.private_set, e_id=stored.id, e_author=stored.author,
            e_invocation_id=stored.invocation_id, e_content=stored.content,
            e_state_delta=stored.state_delta, e_timestamp=stored.timestamp,
        )  # fmt: skip
        if self.q.vectors:
            params["e_search_vector"] = indexed_vector(stored)
        return Job(self._append(self.q.writing("append", delta), params), "atomic")

    def _append(self, stmt: Compiled, params: dict[str, Any]) -> Program[int]:
        row = yield from self.guarded(Query(stmt, params), params)
        return int(row.event_seq)

    def append_many(
        self, params: dict[str, Any], stored: builtins.list[Event], delta: ScopedDelta
    ) -> Job[int]:
        params.update(shared_params(delta))
        params["v_private_delta"] = delta.private_set
        batch = params["v_batch"] = [
            {"n": n, "id": e.id, "author": e.author, "invocation_id": e.invocation_id,
             "content": e.content, "state_delta": e.state_delta, "tokens": e.tokens,
             "timestamp": e.timestamp.isoformat()}
            for n, e in enumerate(stored, 1)
        ]  # fmt: skip
        if self.q.vectors:
            for row, event in zip(batch, stored, strict=True):
                row[VECTOR] = indexed_vector(event)
        return Job(self._append_many(self.q.writing("append_many", delta), params), "atomic")

    def _append_many(self, stmt: Compiled, params: dict[str, Any]) -> Program[int]:
        row = yield from self.guarded(Query(stmt, params), params)
        return int(row.event_seq)

    def fork(self, params: dict[str, Any]) -> Job[Session]:
        return Job(self._fork(params), "atomic")

    def _fork(self, params: dict[str, Any]) -> Program[Session]:
        child = (yield Query(self.q.pg_fork, params)).first()
        if child is None:
            yield from self.require(params["k_org"], params["k_id"])  # the parent is missing
            raise SessionExistsError(params["k_org"], params["k_child"])
        return session_with_state(child)

    def truncate(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        # One statement; a second, locked attempt only if a concurrent write landed while it
        # ran (see PostgresStatements._pg_truncate).
        return [
            Job(self._truncate(params, locked=False), "atomic"),
            Job(self._truncate(params, locked=True), "write"),
        ]

    def _truncate(
        self, params: dict[str, Any], *, locked: bool
    ) -> Program[builtins.list[Event] | None]:
        if locked:
            yield from self.lock_session(self.q.pg_lock_session, params)
        row = (yield Query(self.q.pg_truncate, params)).first()
        if row is None:
            yield from self.check_guard(params)
            if not locked:
                return None
            raise unwritten(params)  # the session was created after the lock found none
        return [event_from_array(item) for item in row.events or ()]

    def truncate_rows(self, params: dict[str, Any]) -> Job[builtins.list[Event]]:
        """A truncation whose removed events pass the one statement's 1 GB of json text:
        the session row locked, the events deleted and returned as rows, the counters
        (``truncate_as_rows``)."""
        return Job(self.truncate_as_rows(params, self.q.pg_lock_session), "write")

    def pop(self, params: dict[str, Any]) -> builtins.list[Job[builtins.list[Event] | None]]:
        # One statement; a second, locked attempt only if a concurrent write landed while it
        # ran, as for a truncation.
        return [
            Job(self._pop(params, locked=False), "atomic"),
            Job(self._pop(params, locked=True), "write"),
        ]

    def _pop(self, params: dict[str, Any], *, locked: bool) -> Program[builtins.list[Event] | None]:
        if locked:
            yield from self.lock_session(self.q.pg_lock_session, params)
        row = (yield Query(self.q.pg_pop, params)).first()
        if row is not None and row.version is not None:
            return [event_from_array(item) for item in row.events or ()]
        # Nothing written: no session, a failed guard, an empty transcript, or a race.
        yield from self.check_guard(params)
        if row is not None and row.newest is None:
            return []  # the transcript was empty in the statement's snapshot
        if not locked:
            return None
        raise unwritten(params)  # the session was created after the lock found none
