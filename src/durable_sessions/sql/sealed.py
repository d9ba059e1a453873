"""The writes of an encrypted store that open values and seal them again for other rows.

A fork copies its parent's private state, title and transcript; sealed, each value names
its row (``sealing.Envelope``), so the child's copies are opened and sealed again for the
child, in the same write transaction as the plain fork: the parent read (and locked on
Postgres and MySQL), the child inserted, its events written with their blind index (its
search terms on SQLite, search vector on Postgres, ``ds_event_words`` rows on MySQL). The
data keys it needs are fetched before (``Sealer.scope_keys``): a program does not suspend
between its statements.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Dialect

from ..errors import DecryptionError, SessionExistsError, SessionNotFoundError
from ..model import Session
from ..prepare import fork_state, merge_state
from ..sealing import DataKey, Envelope, Sealer, row_aad
from .compiled import Compiled
from .dialect import DialectOps
from .dialects.mysql.programs import DUPLICATE, retried
from .programs import Job, event_from_row, session_from_row, shared_items
from .runner import Program, Query
from .schema import events
from .search import EventIndex, event_index
from .statements import Statements
from .stepwise import StepwiseStatements, bound_row, fork_row
from .translate import mysql_errno

__all__ = ["ForkStatements", "sealed_fork", "sealed_fork_statements"]


@dataclass(frozen=True)
class ForkStatements:
    """The statements of a sealed fork, and how its events carry their blind index."""

    q: Any
    """The dialect's steps: ``StepwiseStatements`` (SQLite, Postgres) or ``MySQLStatements``."""
    events: Compiled
    insert_event: Compiled
    """The insert of an event row, with its blind index terms in ``index``'s column (on
    MySQL without: they are rows of ``ds_event_words``)."""
    index: EventIndex
    mysql: bool
    """Whether the dialect is MySQL: the parent locked ``FOR UPDATE``, a taken child id told
    by its duplicate key error, the fork begun again after a deadlock."""


def sealed_fork_statements(
    ops: DialectOps, dialect: Dialect, own: Statements | None
) -> ForkStatements:
    """The statements of a sealed fork: the store's own (``own``: SQLite's or MySQL's), or
    Postgres's steps."""
    q: Any = own if own is not None else StepwiseStatements(ops, dialect)
    every_event = q.compile(q.events_query(False, False))
    index = event_index(ops)
    if own is not None:  # SQLite's insert sets search_terms; MySQL's words are rows
        return ForkStatements(q, every_event, q.insert_event, index, ops.is_mysql)
    values = {**bound_row(events), **index.bound(index.column)}
    insert_event = q.compile(insert(index.target()).values(values))
    return ForkStatements(q, every_event, insert_event, index, mysql=False)


def sealed_fork(
    statements: ForkStatements,
    params: dict[str, Any],
    keys: dict[str, DataKey],
    current: DataKey,
    index: DataKey,
) -> Job[Session]:
    """Fork a session of an encrypted store (the parameters of ``SQLStore.fork``).

    ``keys`` are the data keys of the parent's user (by id), ``current`` the one to seal
    with, ``index`` the organisation's blind index key.
    Returns the child with its state (and shared state) sealed as stored: the caller
    opens it.
    """
    if statements.mysql:  # begun again after a deadlock
        return Job(retried(lambda: _fork(statements, params, keys, current, index)), "write")
    return Job(_fork(statements, params, keys, current, index), "write")


def _insert_child(statements: ForkStatements, row: dict[str, Any]) -> Program[bool]:
    """Insert the child's row; False when its id is taken."""
    q = statements.q
    if not statements.mysql:
        return (yield Query(q.insert_session, row)).first() is not None
    try:  # MySQL: no insert that skips a taken key and says so
        yield Query(q.insert_session, row)
    except Exception as exc:
        if mysql_errno(exc) == DUPLICATE:
            return False
        raise
    return True


def _fork(
    statements: ForkStatements,
    params: dict[str, Any],
    keys: dict[str, DataKey],
    current: DataKey,
    index: DataKey,
) -> Program[Session]:
    q = statements.q
    org_id, parent_id, child_id = params["k_org"], params["k_id"], params["k_child"]
    with_events = params["v_with_events"]
    locked = q.lock_row if statements.mysql else q.parent
    parent = (yield Query(locked, {"k_org": org_id, "k_id": parent_id})).first()
    if parent is None:
        raise SessionNotFoundError(org_id, parent_id)
    if parent.user_id != current.owner:
        raise DecryptionError(f"session {parent_id!r} changed owner while it was forked")
    open_ = Sealer.open_with
    private = {
        k: open_(keys, v, row_aad("state", org_id, parent_id, k)) for k, v in parent.state.items()
    }
    title = open_(keys, parent.title, row_aad("title", org_id, parent_id)) if parent.title else ""
    sealed_private = Envelope.seal_private(
        current, org_id, child_id, fork_state(private, parent_id)
    )
    sealed_title = Envelope.seal_title(current, org_id, child_id, title)
    row = fork_row(params, parent, sealed_title, sealed_private)
    # The user's keys were read from the key table for this fork (``Sealer.scope_keys``):
    # the insert checks none (``k_key``).
    if not (yield from _insert_child(statements, {**row, "k_org": org_id, "k_key": None})):
        raise SessionExistsError(org_id, child_id)
    if with_events:
        found = (yield Query(statements.events, {"k_org": org_id, "k_id": parent_id})).rows
        rows = []
        words: list[dict[str, Any]] = []
        for event in (event_from_row(r) for r in found):
            content, delta = Envelope.open_stored_event(
                functools.partial(open_, keys), org_id, parent_id, event.id,
                event.content, event.state_delta,
            )  # fmt: skip
            stored, stored_delta = Envelope.seal_event_values(
                current, org_id, child_id, event.id, content, delta
            )
            rows.append(
                {
                    "k_org": org_id, "session_id": child_id, "seq": event.seq, "id": event.id,
                    "author": event.author, "invocation_id": event.invocation_id,
                    "content": stored, "state_delta": stored_delta,
                    "tokens": event.tokens, "timestamp": event.timestamp,
                }
            )  # fmt: skip
            blind, carrier = index.blind(content), statements.index
            if carrier.in_words:
                words += carrier.word_rows(org_id, child_id, event.seq, blind)
            else:
                rows[-1][carrier.column] = carrier.value(blind)
        if rows:
            yield Query(statements.insert_event, rows, many=True)
        if words:
            yield Query(q.insert_words, words, many=True)
    owner = {"k_org": org_id, "k_app": parent.app_name, "k_user": parent.user_id}
    shared = (yield Query(q.shared, owner)).first()
    state = merge_state(sealed_private, *shared_items(shared.user_state, shared.app_state))
    return session_from_row(SimpleNamespace(**row), state)
