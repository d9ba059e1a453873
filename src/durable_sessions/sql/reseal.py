"""Re-encryption of a SQL store: every row moved to its scope's current data key.

``SQLStore.reencrypt`` walks each table by primary key in batches (a read, then one write
transaction per batch), opens each sealed value (plaintext, written before the store had a
keyring, is taken as it is) and seals it again with the current data key of its user (or
app); a row already sealed so is left alone (sealing is deterministic: it seals to the same
text). A row written meanwhile is not overwritten: the write of a session requires the
version it read, the write of a ``user:`` or ``app:`` value the ``updated_at`` it read
(events do not change once written). So it runs online, and a run that was stopped can be
run again: it rewrites only what is not under the current keys yet.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select, tuple_, update

from ..errors import DecryptionError
from ..memories import owner_token
from ..model import Memory
from ..sealing import USER, Envelope
from .compiled import Compiled
from .dialect import DialectOps
from .dialects.mysql.programs import WORDS, retried, words_insert
from .memories import MemoryStatements, reindex_program
from .runner import Mode, Program, Query
from .schema import app_state, events, memories, sessions, user_state
from .search import event_index

__all__ = ["Resealer"]

S, E, U, A, M = sessions, events, user_state, app_state, memories

Run = Callable[[Program[Any], Mode, str], Awaitable[Any]]
Shape = Callable[[str, Callable[[], Any]], Compiled]


def _after(*cols: Any, spelled_out: bool = False) -> Any:
    """``(cols) > (:a0, :a1, ...)``: the rows after the last one a batch read.

    ``spelled_out`` (MySQL): written column by column, ``c0 > :a0 OR (c0 = :a0 AND ...)``,
    which MySQL's range optimiser reads as a range of the key (a row comparison it scans).
    """
    bound: list[Any] = [bindparam(f"a{n}") for n in range(len(cols))]
    if not spelled_out:
        return tuple_(*cols) > tuple_(*bound)
    after = cols[-1] > bound[-1]
    for col, value in zip(reversed(cols[:-1]), reversed(bound[:-1]), strict=True):
        after = or_(col > value, and_(col == value, after))
    return after


def _read(stmt: Compiled, params: dict[str, Any]) -> Program[builtins.list[Any]]:
    return (yield Query(stmt, params)).rows


def _write(stmt: Compiled, rows: builtins.list[dict[str, Any]]) -> Program[None]:
    yield Query(stmt, rows, many=True)


def _words_delete() -> Any:
    return delete(WORDS).where(
        WORDS.c.org_id == bindparam("k_org"),
        WORDS.c.session_id == bindparam("k_id"),
        WORDS.c.seq == bindparam("k_seq"),
    )


class Resealer:
    """One run of ``reencrypt`` over a SQL store's tables.

    Args:
        env: The store's envelope (its data keys).
        shape: Compiles a statement once (``Statements.shape``).
        run: Runs a program in a mode (``Runner.run``).
        ops: The store's dialect (where its events carry their blind index terms,
            ``search.EventIndex``; MySQL's batches begun again after a deadlock).
        batch: Rows per batch.
        memory_q: The store's memory statements (a resealed memory's terms are recounted).
    """

    def __init__(
        self,
        env: Envelope,
        shape: Shape,
        run: Run,
        ops: DialectOps,
        batch: int,
        memory_q: MemoryStatements,
    ) -> None:
        self.memory_q = memory_q
        self.env = env
        self.shape = shape
        self.run = run
        self.index = event_index(ops)
        self.mysql = ops.is_mysql
        self.batch = batch

    def _after(self, *cols: Any) -> Any:
        return _after(*cols, spelled_out=self.mysql)

    async def scopes(self) -> tuple[builtins.list[tuple[str, str]], builtins.list[tuple[str, str]]]:
        """The (org, user) and (org, app) pairs that own data."""

        def owners() -> Any:
            return select(S.c.org_id, S.c.user_id).union(select(U.c.org_id, U.c.user_id))

        def apps_() -> Any:
            return select(A.c.org_id, A.c.app_name).distinct()

        users = await self.run(_read(self.shape("reseal:users", owners), {}), "read", "reencrypt")
        apps = await self.run(_read(self.shape("reseal:apps", apps_), {}), "read", "reencrypt")
        return [(r[0], r[1]) for r in users], [(r[0], r[1]) for r in apps]

    async def _walk(
        self,
        name: str,
        build: Callable[[], Any],
        start: tuple[Any, ...],
        reseal: Callable[[Any], Awaitable[dict[str, Any] | None]],
        write: Compiled,
        writes: Callable[[builtins.list[dict[str, Any]]], Program[None]] | None = None,
    ) -> int:
        """Walk one table's rows in key order from ``start`` (before every key: no org id
        is empty); write each batch's changed rows (with ``writes``, when given)."""
        stmt = self.shape(f"reseal:{name}", build)
        last = start
        done = 0
        while True:
            params: dict[str, Any] = {"k_limit": self.batch}
            params.update((f"a{n}", value) for n, value in enumerate(last))
            rows = await self.run(_read(stmt, params), "read", "reencrypt")
            if not rows:
                return done
            changed = []
            for row in rows:
                try:
                    found = await reseal(row)
                except DecryptionError as exc:
                    where = ", ".join(repr(part) for part in row[: len(start)])
                    raise DecryptionError(f"reencrypt: the {name} row ({where}): {exc}") from exc
                if found:
                    changed.append(found)
            if changed:
                program = _write(write, changed) if writes is None else writes(changed)
                await self.run(program, "write", "reencrypt")
                done += len(changed)
            last = tuple(rows[-1][: len(start)])

    async def sessions(self) -> int:
        """Reseal titles and private state."""
        env = self.env

        def build() -> Any:
            return (
                select(S.c.org_id, S.c.id, S.c.user_id, S.c.title, S.c.state, S.c.version)
                .where(self._after(S.c.org_id, S.c.id))
                .order_by(S.c.org_id, S.c.id)
                .limit(bindparam("k_limit"))
            )

        async def reseal(row: Any) -> dict[str, Any] | None:
            org, sid, user = row.org_id, row.id, row.user_id
            key = await env.user_key(org, user)
            title = env.seal_title(key, org, sid, await env.open_title(org, sid, row.title))
            state = env.seal_private(key, org, sid, await env.open_private(org, sid, row.state))
            if title == row.title and state == row.state:
                return None
            return {"k_org": org, "k_id": sid, "k_version": row.version, "v_title": title,
                    "v_state": state}  # fmt: skip

        write = self.shape(
            "reseal:sessions:write",
            lambda: (
                update(S)
                .where(
                    S.c.org_id == bindparam("k_org"),
                    S.c.id == bindparam("k_id"),
                    S.c.version == bindparam("k_version"),
                )
                .values(
                    title=bindparam("v_title"), state=bindparam("v_state", type_=S.c.state.type)
                )
            ),
        )
        return await self._walk("sessions", build, ("", ""), reseal, write)

    async def events(self) -> int:
        """Reseal event contents and deltas; index plaintext events blind."""
        env = self.env

        def build() -> Any:
            return (
                select(
                    E.c.org_id,
                    E.c.session_id,
                    E.c.seq,
                    E.c.id,
                    E.c.content,
                    E.c.state_delta,
                    S.c.user_id,
                )
                .join(S, (S.c.org_id == E.c.org_id) & (S.c.id == E.c.session_id))
                .where(self._after(E.c.org_id, E.c.session_id, E.c.seq))
                .order_by(E.c.org_id, E.c.session_id, E.c.seq)
                .limit(bindparam("k_limit"))
            )

        async def reseal(row: Any) -> dict[str, Any] | None:
            org, sid, eid = row.org_id, row.session_id, row.id
            key = await env.user_key(org, row.user_id)
            content, delta = await env.open_event_values(
                org, sid, eid, row.content, row.state_delta
            )
            sealed, sealed_delta = env.seal_event_values(key, org, sid, eid, content, delta)
            if sealed == row.content and sealed_delta == row.state_delta:
                return None
            blind = (await env.sealer.index_key(org)).blind(content)
            found = {"k_org": org, "k_id": sid, "k_seq": row.seq, "k_event": eid,
                     "v_content": sealed, "v_delta": sealed_delta}  # fmt: skip
            if index.in_words:
                found["v_words"] = index.word_rows(org, sid, row.seq, blind)
            else:
                found["v_index"] = index.value(blind)
            return found

        index = self.index
        target = index.target()

        def write_stmt() -> Any:
            return (
                update(target)
                .where(
                    target.c.org_id == bindparam("k_org"),
                    target.c.session_id == bindparam("k_id"),
                    target.c.seq == bindparam("k_seq"),
                    target.c.id == bindparam("k_event"),
                )
                .values(
                    content=bindparam("v_content", type_=E.c.content.type),
                    state_delta=bindparam("v_delta", type_=E.c.state_delta.type),
                    **index.bound("v_index"),
                )
            )

        write = self.shape("reseal:events:write", write_stmt)
        if not self.mysql:
            return await self._walk("events", build, ("", "", -1), reseal, write)
        forget = self.shape("reseal:words:delete", _words_delete)
        insert_words = self.shape("reseal:words:insert", words_insert)

        def each(rows: builtins.list[dict[str, Any]]) -> Program[None]:
            # MySQL: each event's words rows follow its content, in its transaction: a
            # plaintext event's words leave the index for its blind terms.
            for row in rows:
                if (yield Query(write, row)).rowcount:
                    yield Query(forget, row)
                    if row["v_words"]:
                        yield Query(insert_words, row["v_words"], many=True)

        def writes(rows: builtins.list[dict[str, Any]]) -> Program[None]:
            return retried(lambda: each(rows))  # begun again after a deadlock

        return await self._walk("events", build, ("", "", -1), reseal, write, writes)

    async def memories(self) -> int:
        """Reseal long-term memories (text, content, metadata); index plaintext ones blind."""
        env = self.env
        keys = [M.c.org_id, M.c.app_name, M.c.user_id, M.c.id]

        def build() -> Any:
            return (
                select(
                    *keys,
                    M.c.text,
                    M.c.content,
                    M.c.metadata,
                    M.c.author,
                    M.c.timestamp,
                    M.c.terms,
                )
                .where(self._after(*keys))
                .order_by(*keys)
                .limit(bindparam("k_limit"))
            )

        async def reseal(row: Any) -> dict[str, Any] | None:
            org, app, user = row.org_id, row.app_name, row.user_id
            stored = Memory(row.text, content=row.content, id=row.id, metadata=row.metadata)
            opened = await env.open_memory(org, app, user, stored)
            key = await env.user_key(org, user)
            index = await env.sealer.index_key(org)
            sealed = env.seal_memory(key, index, org, app, user, opened)
            if (sealed.text, sealed.content, sealed.metadata) == (
                row.text, row.content, row.metadata,
            ):  # fmt: skip
                return None
            terms = " ".join([owner_token(org, app, user), *sealed.search_terms.split()])
            return {"k_org": org, "k_app": app, "k_user": user, "k_id": row.id,
                    "k_text": row.text, "k_terms": row.terms, "v_text": sealed.text,
                    "v_content": sealed.content,
                    "v_metadata": sealed.metadata, "v_terms": terms}  # fmt: skip

        def write_stmt() -> Any:
            return (
                update(M)
                .where(
                    M.c.org_id == bindparam("k_org"),
                    M.c.app_name == bindparam("k_app"),
                    M.c.user_id == bindparam("k_user"),
                    M.c.id == bindparam("k_id"),
                    M.c.text == bindparam("k_text"),
                    M.c.terms == bindparam("k_terms"),
                )
                .values(
                    text=bindparam("v_text"),
                    content=bindparam("v_content", type_=M.c.content.type),
                    metadata=bindparam("v_metadata", type_=M.c.metadata.type),
                    terms=bindparam("v_terms"),
                )
            )

        write = self.shape("reseal:memories:write", write_stmt)

        def writes(rows: builtins.list[dict[str, Any]]) -> Program[None]:
            return reindex_program(self.memory_q, write, rows)

        return await self._walk("memories", build, ("",) * len(keys), reseal, write, writes)

    async def shared(self, scope: str) -> int:
        """Reseal ``user:`` (``scope`` "user") or ``app:`` values."""
        env = self.env
        t = U if scope == USER else A
        keys = [t.c.org_id, t.c.app_name, *([t.c.user_id] if scope == USER else []), t.c.key]

        def build() -> Any:
            return (
                select(*keys, t.c.value, t.c.updated_at)
                .where(self._after(*keys))
                .order_by(*keys)
                .limit(bindparam("k_limit"))
            )

        async def reseal(row: Any) -> dict[str, Any] | None:
            org, app = row.org_id, row.app_name
            if scope == USER:
                key = await env.user_key(org, row.user_id)
                opened = await env.open_user(org, app, row.user_id, [(row.key, row.value)])
                value = env.seal_user(key, org, app, row.user_id, opened)[row.key]
            else:
                key = await env.app_key(org, app)
                opened = await env.open_app(org, app, [(row.key, row.value)])
                value = env.seal_app(key, org, app, opened)[row.key]
            if value == row.value:
                return None
            found = {"k_org": org, "k_app": app, "k_key": row.key, "k_at": row.updated_at,
                     "v_value": value}  # fmt: skip
            if scope == USER:
                found["k_user"] = row.user_id
            return found

        def write_stmt() -> Any:
            where = [
                t.c.org_id == bindparam("k_org"),
                t.c.app_name == bindparam("k_app"),
                t.c.key == bindparam("k_key"),
                t.c.updated_at == bindparam("k_at", type_=t.c.updated_at.type),
            ]
            if scope == USER:
                where.append(t.c.user_id == bindparam("k_user"))
            return update(t).where(*where).values(value=bindparam("v_value", type_=t.c.value.type))

        write = self.shape(f"reseal:{scope}:write", write_stmt)
        return await self._walk(scope, build, ("",) * len(keys), reseal, write)
