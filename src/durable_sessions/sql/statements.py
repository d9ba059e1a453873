"""The statements both dialects run, defined once in Core, and the building blocks of the rest.

Each dialect's own statements are in ``sql/sqlite.py`` and ``sql/postgres.py``; everything is
compiled once, for its dialect only."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ColumnElement, Executable

from ..state import MAX_INT64
from .compiled import Compiled, compile_statement
from .dialect import DialectOps
from .schema import JSONValue, UTCDateTime, app_state, events, keys, sessions, user_state

__all__ = [
    "EVENTS_KEY",
    "EVENT_COLUMNS",
    "LATER",
    "META",
    "NOW",
    "OWNED",
    "SESSION_KEY",
    "Statements",
]

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
LATER = case((S.c.updated_at > NOW, S.c.updated_at), else_=NOW)
"""A write's new ``updated_at``: the time of its call, unless the row holds a later one. The
time is taken before the write waits (for a connection, a row lock, SQLite's write lock),
so a write that waited could carry an earlier time than one that committed meanwhile; a
session's ``updated_at`` never goes back (a listing's cursor stays ahead of it)."""
INCARNATION = bindparam("v_incarnation", type_=Text)
# A write guarded by the incarnation the caller holds (None: any incarnation of the id).
SAME_LIFE = or_(INCARNATION.is_(None), S.c.incarnation == INCARNATION)
SEALED_WITH = bindparam("k_key", type_=Text)
# An encrypted store's write of a session row: the user's data key it sealed with is still in
# the key table (None: it sealed nothing with one). Another process's ``delete_user`` may
# have destroyed a key this process holds, and what is sealed with it never opens again.
KEY_HELD = or_(
    SEALED_WITH.is_(None),
    exists().where(keys.c.org_id == bindparam("k_org"), keys.c.key_id == SEALED_WITH),
)
# An encrypted store's write of a session row, in one test: the user's data key it sealed with
# is still in the key table (``KEY_HELD``), and it is the key of the row's user, while the row
# is the app's it sealed for. The id may have been deleted and made again for another owner
# since this process learnt its owner.
SEALED_FOR = or_(
    SEALED_WITH.is_(None),
    exists().where(
        keys.c.org_id == bindparam("k_org"),
        keys.c.key_id == SEALED_WITH,
        keys.c.owner == S.c.user_id,
        S.c.app_name == bindparam("k_sealed_app", type_=Text),
    ),
)
# A delete of a session of this app and user only (None: of any).
_OWNER_APP = bindparam("k_app", type_=Text)
_OWNER_USER = bindparam("k_user", type_=Text)
OWNED = and_(
    or_(_OWNER_APP.is_(None), S.c.app_name == _OWNER_APP),
    or_(_OWNER_USER.is_(None), S.c.user_id == _OWNER_USER),
)


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


BATCH = 500
"""Sessions deleted per transaction by purge and delete_user."""


def _as_text(aggregate: Any) -> Any:
    """A shared-state aggregate (a scalar subquery) as its JSON text, ``{}`` when there is
    no key: decoded once per distinct text by ``sessions_with_state``, not once per row."""
    return func.coalesce(cast(aggregate, Text), literal("{}", Text))


class Retention(NamedTuple):
    """The statements of a batched delete (purge, delete_user)."""

    pick: Compiled
    drop_events: Compiled
    drop_sessions: Compiled
    remaining: Compiled


class Statements:
    """The compiled statements of one dialect; dynamic shapes are compiled on first use.

    This base holds what both dialects run; ``SQLiteStatements`` and ``PostgresStatements``
    add their own.
    """

    def __init__(self, ops: DialectOps, dialect: Dialect, *, sealed: bool = False) -> None:
        self.ops = ops
        self.dialect = dialect
        # An encrypted store's: its writes that seal with a user's data key check that the
        # key is still there (``KEY_HELD``, ``k_key``).
        self.sealed = sealed
        self._shapes: dict[Hashable, Compiled] = {}
        c = self.compile

        self.get = c(select(*META, *self.state_columns()).where(SESSION_KEY))
        # delete: the session row, of the owner asked for; its events go with it (ON DELETE
        # CASCADE, since the first revision; the store turns SQLite's foreign_keys on for
        # every connection), so one statement, atomic by itself, on every dialect.
        self.delete_session = c(delete(S).where(SESSION_KEY, OWNED))
        self.shared = c(
            select(
                self._user_agg(bindparam("k_org"), bindparam("k_app"), bindparam("k_user")),
                self._app_agg(bindparam("k_org"), bindparam("k_app")),
            )
        )
        self.exists = c(select(S.c.version).where(SESSION_KEY))
        self.meta = c(select(*META).where(SESSION_KEY))
        # A save that deletes shared keys reads (and on Postgres locks) their values first.
        self.user_values = c(
            self.locked(
                select(user_state.c.key, user_state.c.value).where(
                    user_state.c.org_id == bindparam("k_org"),
                    user_state.c.app_name == bindparam("k_app"),
                    user_state.c.user_id == bindparam("k_user"),
                    ops.in_list(user_state.c.key, "k_keys"),
                )
            )
        )
        self.app_values = c(
            self.locked(
                select(app_state.c.key, app_state.c.value).where(
                    app_state.c.org_id == bindparam("k_org"),
                    app_state.c.app_name == bindparam("k_app"),
                    ops.in_list(app_state.c.key, "k_keys"),
                )
            )
        )
        self.touch = c(self.touch_statement())
        self.drop_user_state = c(
            delete(user_state).where(
                user_state.c.org_id == bindparam("k_org"),
                user_state.c.user_id == bindparam("k_user"),
            )
        )
        self.count_user_state = c(
            select(func.count().label("n")).where(
                user_state.c.org_id == bindparam("k_org"),
                user_state.c.user_id == bindparam("k_user"),
            )
        )

    def touch_statement(self) -> Any:
        """Add to a session's counters and title it if untitled, returning its ``META``."""
        return (
            update(S)
            .where(SESSION_KEY, SAME_LIFE, TOUCH_ROOM, *self.key_held())
            .values(
                message_count=S.c.message_count + bindparam("v_messages"),
                token_total=S.c.token_total + bindparam("v_tokens"),
                title=case((S.c.title == "", bindparam("v_title")), else_=S.c.title),
                updated_at=LATER,
                version=S.c.version + 1,
            )
            .returning(*META)
        )

    def locked(self, query: Select[Any]) -> Select[Any]:
        """``query`` locking the rows it reads until the transaction ends, where the
        dialect has row locks (Postgres); SQLite's writers hold the whole database."""
        return query

    def whole_org(self) -> ColumnElement[bool]:
        """The organisation filter of what reads sessions across an organisation, in
        ``(updated_at, id)`` order: ``ix_ds_sessions_org_updated``'s condition (listings
        that are not one user's, purge)."""
        return S.c.org_id == bindparam("k_org")

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
        """A session row's private state and its shared state, as columns of one select
        whose sessions are filtered on ``org_id = :k_org``.

        The shared-state subqueries take the organisation from that bound parameter, not
        from the session row: every table of the statement is then filtered on the same
        bound value, which is what lets Citus route it to the one shard holding that
        organisation (a correlation on ``ds_sessions.org_id`` sends it to every shard). On
        one Postgres the plans are the same (``tests/sql/test_distributed.py`` compares them).
        """
        org: Any = bindparam("k_org")
        return [
            S.c.state,
            self._user_agg(org, S.c.app_name, S.c.user_id),
            self._app_agg(org, S.c.app_name),
        ]

    def events_query(self, has_after: bool, has_limit: bool, has_after_seq: bool = False) -> Any:
        """A session's events (newest first when limited), by (org, session, seq).

        With ``has_after_seq``, the events after ``k_after_seq``, oldest first (the oldest
        ``k_limit`` when limited): a forward range of the same key.
        """
        query = select(*EVENT_COLUMNS).where(EVENTS_KEY)
        if has_after:
            query = query.where(events.c.timestamp > bindparam("k_after", type_=UTCDateTime))
        if has_after_seq:
            query = query.where(events.c.seq > bindparam("k_after_seq", type_=BigInteger))
            query = query.order_by(events.c.seq)
            return query.limit(bindparam("k_limit")) if has_limit else query
        if has_limit:
            # Newest first along the (org, session, seq) key; callers put them back in order.
            return query.order_by(events.c.seq.desc()).limit(bindparam("k_limit"))
        return query.order_by(events.c.seq)

    def events_json_query(self, has_after: bool, has_limit: bool) -> Any:
        """``events_query`` with each event's content and delta as their JSON text."""
        return self.events_query(has_after, has_limit).with_only_columns(
            *[
                cast(col, Text).label(col.name) if col.name in ("content", "state_delta") else col
                for col in EVENT_COLUMNS
            ]
        )

    def list_query(
        self,
        user: bool,
        app: bool,
        parent: bool,
        limit: bool,
        with_state: bool,
        after: bool = False,
    ) -> Any:
        """``list``: one organisation's sessions, newest first, narrowed by what is given.

        With ``after``, only the sessions past the position (``k_after_at``, ``k_after_id``)
        in that order: a page of ``list_page``, which starts there along the index (a
        range, never an offset).
        """
        # With state, the private state comes as its JSON text: decoded by
        # sessions_with_state without the driver's per-value wrapping.
        columns = [*META, cast(S.c.state, Text).label("state")] if with_state else META
        query = self.listing(columns, user, app, parent, limit, after)
        if not with_state:
            return query
        if user and app:  # one owner: its shared state is read once, by the bound names
            org: Any = bindparam("k_org")
            user_agg = self._user_agg(org, bindparam("k_app"), bindparam("k_user"))
            app_agg = self._app_agg(org, bindparam("k_app"))
            return query.add_columns(
                _as_text(user_agg.element).label("user_state"),
                _as_text(app_agg.element).label("app_state"),
            )
        return self.with_owner_state(query.subquery("listed"), fixed_app=app)

    def listing(
        self,
        columns: list[Any],
        user: bool,
        app: bool,
        parent: bool,
        limit: bool,
        after: bool = False,
    ) -> Select[Any]:
        """``columns`` of one organisation's sessions in ``list``'s order (newest first),
        narrowed by the filter's parameters that are given (see ``list_query``).

        One user's sessions are a range of ``ix_ds_sessions_user_org_updated``; the others
        are filtered by ``whole_org`` (``ix_ds_sessions_org_updated``'s own condition)."""
        in_org = S.c.org_id == bindparam("k_org") if user else self.whole_org()
        query = select(*columns).where(in_org)
        if after:
            query = query.where(self.before_position())
        if user:
            query = query.where(S.c.user_id == bindparam("k_user"))
        if app:
            query = query.where(S.c.app_name == bindparam("k_app"))
        if parent:
            query = query.where(S.c.parent_id == bindparam("k_parent"))
        query = query.order_by(S.c.updated_at.desc(), S.c.id.desc())
        return query.limit(bindparam("k_limit")) if limit else query

    def before_position(self) -> ColumnElement[bool]:
        """The sessions before the position (``k_after_at``, ``k_after_id``) in ``list``'s
        order, as one row comparison (a range of the listing index)."""
        at = bindparam("k_after_at", type_=UTCDateTime)
        position = tuple_(at, bindparam("k_after_id", type_=S.c.id.type))
        return tuple_(S.c.updated_at, S.c.id) < position

    def states_json_query(self, user: bool, app: bool, parent: bool, limit: bool) -> Any:
        """``Store.list_states_json``: the listing as the text of one JSON object (one
        column, ``listing``), each owner's shared state read once.

        The owners (and apps) are those of the same listing, read apart (no CTE, which
        distributed mode does not run): its first row when the filter names the owner
        (or the app), else its distinct values.
        """
        columns = [S.c.id, S.c.user_id, S.c.app_name, S.c.updated_at, S.c.version]
        columns += [S.c.incarnation, S.c.state]

        def listed(name: str) -> Any:
            return self.listing(columns, user, app, parent, limit).subquery(name)

        org: Any = bindparam("k_org")
        listed_owners = listed("listed_owners")
        owners = select(listed_owners.c.app_name, listed_owners.c.user_id)
        owners = owners.limit(1) if user and app else owners.distinct()
        owners_sub = owners.subquery("owners")
        listed_apps = listed("listed_apps")
        apps = select(listed_apps.c.app_name)
        apps_sub = (apps.limit(1) if app else apps.distinct()).subquery("apps")
        return self.json_listing(
            listed("listed"),
            owners_sub,
            self._user_agg(org, owners_sub.c.app_name, owners_sub.c.user_id).element,
            apps_sub,
            self._app_agg(org, apps_sub.c.app_name).element,
        )

    def json_listing(self, listed: Any, owners: Any, user_agg: Any, apps: Any, app_agg: Any) -> Any:
        """The dialect's JSON of ``states_json_query`` from its parts."""
        raise NotImplementedError

    def with_owner_state(self, listed: Any, org: Any = None, *, fixed_app: bool = False) -> Any:
        """The sessions of ``listed`` (a subquery of ``META`` and ``state``, as JSON text) in
        ``list``'s order, with their shared state read once per owner, not once per session.

        ``user_state`` is set on one row of each (app, user) of the listing and
        ``app_state`` on one row of each app, as JSON text (``{}`` when there is none);
        both are NULL on the others, whose owner's state another row carries
        (``sessions_with_state``). The numbering is over the listed rows only, after the
        limit, so a page still reads only its own range of the index. With ``fixed_app``
        (the listing is of the app ``:k_app``) the app's state is read once by that name and
        set on every row. ``org`` is the organisation the shared-state subqueries are
        filtered on (``:k_org``; see ``state_columns``).
        """
        org = bindparam("k_org") if org is None else org
        owner = func.row_number().over(partition_by=[listed.c.app_name, listed.c.user_id])
        user_agg = self._user_agg(org, listed.c.app_name, listed.c.user_id).element
        user_state = case((owner == 1, _as_text(user_agg)))
        if fixed_app:
            app_state = _as_text(self._app_agg(org, bindparam("k_app")).element)
        else:
            app = func.row_number().over(partition_by=[listed.c.app_name])
            app_agg = self._app_agg(org, listed.c.app_name).element
            app_state = case((app == 1, _as_text(app_agg)))
        return select(
            *[listed.c[col.name] for col in META],
            listed.c.state,
            user_state.label("user_state"),
            app_state.label("app_state"),
        ).order_by(listed.c.updated_at.desc(), listed.c.id.desc())

    def retention(self, kind: str) -> Retention:
        """The statements of a batched delete: ``purge`` (by age) or ``delete_user``."""
        if kind == "purge":
            where = and_(
                self.whole_org(), S.c.updated_at < bindparam("k_cutoff", type_=UTCDateTime)
            )
        else:
            where = and_(S.c.org_id == bindparam("k_org"), S.c.user_id == bindparam("k_user"))
        # In index order, (updated_at, id) for purge and delete_user alike, so that batches
        # stop early and two of them lock the sessions they share in the same order. Sessions
        # that writers hold are waited for, never skipped; once free, each row is checked
        # against ``where`` again.
        pick = select(S.c.id).where(where).order_by(S.c.updated_at, S.c.id).limit(BATCH)
        return Retention(
            self.shape((kind, "pick"), lambda: self.locked(pick)),
            self.shape(
                "drop_events",
                lambda: delete(events).where(
                    events.c.org_id == bindparam("k_org"),
                    self.ops.in_list(events.c.session_id, "k_ids"),
                ),
            ),
            self.shape(
                "drop_sessions",
                lambda: delete(S).where(
                    S.c.org_id == bindparam("k_org"), self.ops.in_list(S.c.id, "k_ids")
                ),
            ),
            self.shape((kind, "count"), lambda: select(func.count().label("n")).where(where)),
        )

    def contents_statement(self, has_limit: bool, *, as_rows: bool = False) -> Compiled:
        """``event_contents`` compiled (once); with ``as_rows``, ``event_contents_rows``,
        whose rows decode to their texts alone."""
        key = ("contents", has_limit, as_rows)
        found = self._shapes.get(key)
        if found is None:
            if as_rows:
                rows = self.compile(self.event_contents_rows(has_limit))
                found = dataclasses.replace(rows, scalar=True)
            else:
                found = self.compile(self.event_contents(has_limit))
            self._shapes[key] = found
        return found

    def event_contents(self, has_limit: bool) -> Any:
        """A session's event contents, oldest first (the newest ``k_limit`` with
        ``has_limit``), as ONE JSON array text in one row (``contents``): ``[]`` or NULL
        when there are none."""
        raise NotImplementedError

    def event_contents_rows(self, has_limit: bool) -> Any:
        """The same contents as one row each, oldest first, each its JSON text: for a
        transcript whose one text would pass what the database can build (Postgres: 1 GB)."""
        rows = self.chosen_contents(has_limit)
        text = func.coalesce(cast(rows.c.content, Text), literal("null", Text))
        return select(text.label("contents")).order_by(rows.c.seq)

    @staticmethod
    def chosen_contents(has_limit: bool) -> Any:
        """The (seq, content) rows ``event_contents`` joins."""
        chosen = select(events.c.seq, events.c.content).where(EVENTS_KEY)
        if has_limit:
            chosen = chosen.order_by(events.c.seq.desc()).limit(bindparam("k_limit"))
        return chosen.subquery("chosen")

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

    def key_held(self) -> list[Any]:
        """What a write that seals with a user's data key adds to its guard of the session
        row: on an encrypted store, that the key ``k_key`` is still in the key table, and
        that the row is the user's (the key's owner) and app's (``k_sealed_app``) it sealed
        for."""
        return [SEALED_FOR] if self.sealed else []

    def new_session_row(self, insert: Any, fields: dict[str, Any]) -> Any:
        """``insert`` of a session row of ``fields``; on an encrypted store, made only while
        the user's data key ``k_key`` is there (``KEY_HELD``)."""
        if self.sealed:
            return insert.from_select(list(fields), select(*fields.values()).where(KEY_HELD))
        return insert.values(fields)

    def key_found(self) -> Compiled:
        """The id of the data key ``k_key`` of the organisation, if it is in the key table
        (why an encrypted store's write found no session row to write: ``KEY_HELD``)."""
        return self.shape(
            "key_found",
            lambda: select(keys.c.key_id).where(
                keys.c.org_id == bindparam("k_org"), keys.c.key_id == SEALED_WITH
            ),
        )

    def _update(self) -> Any:
        return (
            update(S)
            .where(SESSION_KEY, S.c.version == bindparam("v_expected"), SAME_LIFE, *self.key_held())
            .values(
                title=bindparam("v_title"),
                state=bindparam("v_state", type_=JSONValue),
                updated_at=LATER,
                version=S.c.version + 1,
            )
        )

    def _append(self, *, merge: bool) -> Any:
        values: dict[str, Any] = {
            "event_seq": S.c.event_seq + 1,
            "message_count": S.c.message_count + 1,
            "token_total": S.c.token_total + bindparam("v_tokens"),
            "updated_at": LATER,
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
        guard = (SESSION_KEY, when, SAME_LIFE, APPEND_ROOM, *self.key_held())
        return update(S).where(*guard).values(values)

    @staticmethod
    def _append_returning() -> list[Any]:
        return [S.c.event_seq, S.c.app_name, S.c.user_id]

    def append_many(self, *, merge: bool) -> Any:
        """Move a session on by a batch of ``v_count`` events carrying ``v_tokens`` tokens,
        titled ``v_title`` if it has no title (``""`` leaves it as it is).

        Returns the last seq of the batch (the batch's seqs end there), and the owner. No
        row: no session, a stale ``v_expected``, another incarnation, or no room left.
        """
        count = bindparam("v_count", type_=BigInteger)
        tokens = bindparam("v_tokens", type_=BigInteger)
        values: dict[str, Any] = {
            "event_seq": S.c.event_seq + count,
            "message_count": S.c.message_count + count,
            "token_total": S.c.token_total + tokens,
            "title": case((S.c.title == "", bindparam("v_title")), else_=S.c.title),
            "updated_at": LATER,
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
        top = literal(MAX_INT64, BigInteger)
        room = and_(  # compared without computing the sum, which could overflow
            S.c.event_seq <= top - count,
            S.c.message_count <= top - count,
            S.c.token_total <= top - tokens,
            S.c.version < top,
        )
        return (
            update(S)
            .where(
                SESSION_KEY,
                or_(expected.is_(None), S.c.version == expected),
                SAME_LIFE,
                room,
                *self.key_held(),
            )
            .values(values)
            .returning(S.c.event_seq, S.c.app_name, S.c.user_id)
        )

    def truncation_steps(self) -> tuple[Compiled, Compiled]:
        """A truncation as two steps, its events read as rows: delete the events after
        ``k_after_seq``, returning them; then take ``v_count`` events and ``v_tokens``
        tokens off the session's counters and its seq back to ``k_after_seq`` (never
        forward), returning its version (no row: the guard failed). Compiled on first use."""
        after = bindparam("k_after_seq", type_=BigInteger)
        removed = self.shape(
            ("truncate", "removed"),
            lambda: (
                delete(events).where(EVENTS_KEY, events.c.seq > after).returning(*EVENT_COLUMNS)
            ),
        )
        return removed, self.shape(("truncate", "session"), self._truncate_session)

    def discard_steps(self) -> tuple[Compiled, Compiled, Compiled, Compiled]:
        """A truncation that reads no event: lock the session row (where rows are locked),
        count the events after ``k_after_seq`` and sum their tokens (``n``, ``tokens``),
        delete them, and take those off the counters (``truncation_steps``' second step).
        Compiled on first use."""
        after = bindparam("k_after_seq", type_=BigInteger)
        doomed = and_(EVENTS_KEY, events.c.seq > after)
        lock = self.shape(
            ("discard", "lock"), lambda: self.locked(select(S.c.version).where(SESSION_KEY))
        )
        tally = self.shape(
            ("discard", "tally"),
            lambda: select(
                func.count().label("n"),
                func.coalesce(func.sum(events.c.tokens), 0).label("tokens"),
            ).where(doomed),
        )
        drop = self.shape(("discard", "drop"), lambda: delete(events).where(doomed))
        return lock, tally, drop, self.shape(("truncate", "session"), self._truncate_session)

    def _truncate_session(self) -> Any:
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
                updated_at=LATER,
                version=S.c.version + 1,
            )
            .returning(S.c.version)
        )

    @staticmethod
    def truncate_guard() -> Any:
        expected = bindparam("v_expected", type_=BigInteger)
        top = literal(MAX_INT64, BigInteger)
        return and_(
            SESSION_KEY, or_(expected.is_(None), S.c.version == expected), SAME_LIFE,
            S.c.version < top,
        )  # fmt: skip
