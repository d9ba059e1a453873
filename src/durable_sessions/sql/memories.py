"""Long-term memory on SQL: the statements and programs of ``SQLStore``'s memory methods.

The full-text index belongs to Alembic (revision 0010): on Postgres the generated column
``ds_memories.search_vector`` (a ``tsvector`` of the ``terms`` column) under a GIN index; on
SQLite the FTS5 table ``ds_memories_fts`` over ``terms``, keyed through
``ds_memories_fts_rowid``. Every memory is indexed under its owner's token as well
(``memories.owner_token``), so that the index alone finds one user's memories holding a
term, and counts them, however many other users and organisations share the term. MySQL
has no such index: a search reads the user's memories, a range of the primary key.

``ds_memory_terms`` counts, per user, the memories holding each term (``""``: all of
them); every write of memories keeps it, under a row lock on the user's ``""`` row (taken
first, so that concurrent writes of one user's memories run one after the other). A search
is two statements: the counts of the query's terms (primary-key lookups; the weights,
computed here by ``memories.weight``); then the memories holding the rarest terms (or any
term, see ``search_program``), each scored by the sum of the weights of the terms it holds,
best first. When every memory holding a term is ranked (a query without a rare enough
term, such as a long message), SQLite and Postgres score the memories term by term from the
index instead (``MemoryStatements.ranked_all``; distributed mode keeps the one form). Every
statement is filtered on ``org_id = :k_org`` (one shard on Citus) and writes are
single-table statements.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Integer,
    String,
    Text,
    bindparam,
    cast,
    column,
    delete,
    func,
    literal,
    literal_column,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, TSQUERY, TSVECTOR

from ..memories import (
    CANDIDATES,
    ENOUGH,
    Memory,
    owner_token,
    prefix_terms,
    stored_terms,
    weight,
)
from .compiled import Compiled
from .runner import Program, Query
from .schema import JSONValue, memories, memory_terms
from .statements import Statements

__all__ = [
    "MemoryStatements",
    "add_program",
    "count_program",
    "forget_program",
    "forget_user_program",
    "memory_from_row",
    "memory_row",
    "reindex_program",
    "search_program",
]

M = memories
T = memory_terms
COLUMNS = [
    M.c.id, M.c.author, M.c.timestamp, M.c.text, M.c.content, M.c.metadata,
    M.c.session_id, M.c.seq,
]  # fmt: skip
_FTS = table("ds_memories_fts", column("rowid", Integer), column("terms", Text))
_KEYS = table(
    "ds_memories_fts_rowid",
    column("rid", Integer),
    column("org_id", String),
    column("app_name", String),
    column("user_id", String),
    column("id", String),
)


def _owner_of(table: Any) -> Any:
    return (
        (table.c.org_id == bindparam("k_org"))
        & (table.c.app_name == bindparam("k_app"))
        & (table.c.user_id == bindparam("k_user"))
    )


def _owner() -> Any:
    return _owner_of(M)


def _quote(term: str) -> str:
    """A term as a quoted lexeme or phrase: it holds only word characters and the index's
    own token characters, never a quote, so it is data in either query language."""
    return f'"{term}"'


_NAMES = ", ".join(f"m.{c.name}" for c in COLUMNS)
"""The memory columns of the alias ``m``, in ``COLUMNS``' order (text statements)."""
_LEAST = "least(score) AS (SELECT score FROM hits ORDER BY score DESC LIMIT 1 OFFSET :k_limit - 1) "
"""The ``limit``-th best score of the scored ``hits``: only the memories scoring as much are
joined and ordered further."""


def _scored(sql: str, *binds: Any) -> Any:
    """A text statement returning the memory columns and ``score``, ``k_limit`` bound."""
    return (
        text(sql)
        .bindparams(*binds, bindparam("k_limit", type_=BigInteger))
        .columns(*[column(c.name, c.type) for c in COLUMNS], column("score", BigInteger))
    )


class MemoryStatements:
    """The memory statements of one store's dialect, compiled once each (by its
    ``Statements``' ``shape`` cache)."""

    def __init__(self, q: Statements, postgres: bool, distributed: bool = False) -> None:
        self.q = q
        self.postgres = postgres
        self.mysql = q.ops.is_mysql
        self.distributed = distributed

    def _shape(self, key: Hashable, build: Any) -> Compiled:
        return self.q.shape(("memories", key), build)

    @property
    def existing(self) -> Compiled:
        """The ids among ``k_ids`` the owner has."""
        return self._shape(
            "existing",
            lambda: select(M.c.id).where(_owner(), self.q.ops.in_list(M.c.id, "k_ids")),
        )

    @property
    def insert(self) -> Compiled:
        """Insert one memory unless its key is taken (executed for many)."""

        def build() -> Any:
            values = {c.name: bindparam(f"v_{c.name}", type_=c.type) for c in M.c}
            values["org_id"] = bindparam("k_org", type_=M.c.org_id.type)
            if self.mysql:  # the ids were looked for first (add_program)
                return self.q.ops.insert(M).values(values)
            return self.q.ops.insert_if_absent(M).values(values)

        return self._shape("insert", build)

    @property
    def count_user(self) -> Compiled:
        """How many memories a user has in every app of the organisation."""
        return self._shape(
            "count_user",
            lambda: select(func.count().label("n")).where(
                M.c.org_id == bindparam("k_org"), M.c.user_id == bindparam("k_user")
            ),
        )

    @property
    def stats(self) -> Compiled:
        """The counts of the owner's memories holding each of ``k_terms`` (``""``: all)."""
        return self._shape(
            "stats",
            lambda: select(T.c.term, T.c.n).where(
                T.c.org_id == bindparam("k_org"),
                T.c.app_name == bindparam("k_app"),
                T.c.user_id == bindparam("k_user"),
                self.q.ops.in_list(T.c.term, "k_terms"),
            ),
        )

    @property
    def count_terms(self) -> Compiled:
        """Add ``v_n`` to the count of the owner's term ``v_term`` (executed for many; with
        ``v_n`` 0 on the term ``""``, it takes the owner's row lock)."""

        def build() -> Any:
            stmt = self.q.ops.insert(T).values(
                org_id=bindparam("k_org", type_=T.c.org_id.type),
                app_name=bindparam("k_app", type_=T.c.app_name.type),
                user_id=bindparam("k_user", type_=T.c.user_id.type),
                term=bindparam("v_term", type_=T.c.term.type),
                n=bindparam("v_n", type_=T.c.n.type),
            )
            if self.mysql:  # the key of ON DUPLICATE KEY is the primary key
                return stmt.on_duplicate_key_update(  # type: ignore[attr-defined]
                    n=T.c.n + stmt.inserted.n  # type: ignore[attr-defined]
                )
            return stmt.on_conflict_do_update(  # type: ignore[attr-defined]
                index_elements=["org_id", "app_name", "user_id", "term"],
                set_={"n": T.c.n + stmt.excluded.n},  # type: ignore[attr-defined]
            )

        return self._shape("count_terms", build)

    @property
    def uncount_terms(self) -> Compiled:
        """Take ``v_n`` off the count of the owner's term ``v_term`` (executed for many)."""
        return self._shape(
            "uncount_terms",
            lambda: (
                update(T)
                .where(_owner_of(T), T.c.term == bindparam("v_term"))
                .values(n=T.c.n - bindparam("v_n", type_=T.c.n.type))
            ),
        )

    @property
    def drop_uncounted(self) -> Compiled:
        """Delete the owner's terms no memory holds any more."""
        return self._shape("drop_uncounted", lambda: delete(T).where(_owner_of(T), T.c.n <= 0))

    @property
    def forget_one(self) -> Compiled:
        """Delete the owner's memory ``k_id``, returning its terms (on MySQL, which has no
        ``DELETE ... RETURNING``, returning nothing: ``terms_of`` reads them first)."""

        def build() -> Any:
            stmt = delete(M).where(_owner(), M.c.id == bindparam("k_id"))
            return stmt if self.mysql else stmt.returning(M.c.terms)

        return self._shape("forget_one", build)

    @property
    def terms_of(self) -> Compiled:
        """The terms of the owner's memory ``k_id`` (none if it has no such memory)."""
        return self._shape(
            "terms_of", lambda: select(M.c.terms).where(_owner(), M.c.id == bindparam("k_id"))
        )

    def forget_all(self, table: Any) -> Compiled:
        """Delete every row of the owner in ``table`` (memories, or their term counts)."""
        return self._shape(
            ("forget_all", table.name), lambda: delete(table).where(_owner_of(table))
        )

    def forget_user(self, table: Any) -> Compiled:
        """Delete every row of a user in ``table``, in every app of the organisation."""
        return self._shape(
            ("forget_user", table.name),
            lambda: delete(table).where(
                table.c.org_id == bindparam("k_org"), table.c.user_id == bindparam("k_user")
            ),
        )

    @property
    def ranked(self) -> Compiled:
        """The owner's memories holding a weighted term, best first, at most ``k_limit``."""
        if self.mysql:
            return self._shape("ranked", self._mysql_ranked)
        return self._shape("ranked", self._pg_ranked if self.postgres else self._sqlite_ranked)

    @property
    def ranked_all(self) -> Compiled:
        """SQLite and Postgres: the owner's memories holding any of the query's terms, best
        first, at most ``k_limit``. Each term's memories come from the index (the owner's
        token and the term) and a memory's score is the sum over the terms that found it, so
        the work grows with the hits, not with the hits times the query's terms."""
        return self._shape(
            "ranked_all", self._pg_ranked_all if self.postgres else self._sqlite_ranked_all
        )

    # -- MySQL ---------------------------------------------------------------------------------
    # No index of the terms: the owner's memories are a range of the primary key, and each
    # memory's terms are matched as whole space-separated items.

    _OWNER_SQL = "m.org_id = :k_org AND m.app_name = :k_app AND m.user_id = :k_user"
    _HOLDS = "INSTR(CONCAT(' ', m.terms, ' '), CONCAT(' ', {0}.term, ' ')) > 0"
    _TERM = "term VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

    def _mysql_ranked(self) -> Any:
        # k_weights: a JSON array of [term, weight, matching] triples; a memory is ranked
        # when it holds a term whose ``matching`` is 1, scored by every term it holds.
        weights = (
            f"JSON_TABLE(:k_weights, '$[*]' COLUMNS ({self._TERM} PATH '$[0]', "
            "weight BIGINT PATH '$[1]', matching INT PATH '$[2]')) AS w"
        )
        return _scored(
            f"SELECT {_NAMES}, SUM(w.weight) AS score FROM ds_memories AS m "
            f"JOIN {weights} ON {self._HOLDS.format('w')} WHERE {self._OWNER_SQL} "
            "GROUP BY m.org_id, m.app_name, m.user_id, m.id HAVING MAX(w.matching) > 0 "
            "ORDER BY score DESC, m.timestamp DESC, m.id DESC LIMIT :k_limit",
            bindparam("k_weights", type_=JSONValue),
        )

    # -- Postgres ----------------------------------------------------------------------------

    @staticmethod
    def _vector() -> Any:
        return literal_column("ds_memories.search_vector", type_=TSVECTOR)

    def _score(self, weights: Any, term: Any) -> Any:
        """The sum of the weights of the terms a memory's ``terms`` holds (each term is
        a whole space-separated item of it)."""
        padded = literal(" ", Text) + M.c.terms + literal(" ", Text)
        wanted = literal(" ", Text) + term + literal(" ", Text)
        found = func.instr(padded, wanted) if not self.postgres else func.strpos(padded, wanted)
        return (
            select(func.coalesce(func.sum(weights.c.weight), 0))
            .select_from(weights)
            # The outer row's org_id, bound again: a subquery reading only the outer row
            # still names its organisation (Citus routes by every reference).
            .where(found > 0, M.c.org_id == bindparam("k_org"))
            .correlate(M)
            .scalar_subquery()
        )

    def _pg_ranked(self) -> Any:
        weights = (
            func.unnest(
                bindparam("k_wterms", type_=ARRAY(Text)),
                bindparam("k_weights", type_=ARRAY(BigInteger)),
            )
            .table_valued(column("term", Text), column("weight", BigInteger))
            .render_derived("w")
        )
        score = self._score(weights, weights.c.term)
        any_term = cast(bindparam("k_any", type_=Text), TSQUERY)
        return (
            select(*COLUMNS, score.label("score"))
            .where(_owner(), self._vector().op("@@")(any_term))
            .order_by(
                literal_column("score").desc(),
                M.c.timestamp.desc(),
                M.c.id.collate("C").desc(),
            )
            .limit(bindparam("k_limit", type_=BigInteger))
        )

    def _pg_ranked_all(self) -> Any:
        # k_token: the owner's token as a tsquery; k_wterms, k_weights: the terms and their
        # weights, in step.
        return _scored(
            "WITH w(term, weight) AS (SELECT * FROM unnest(CAST(:k_wterms AS text[]), "
            "CAST(:k_weights AS bigint[]))), "
            "hits(id, score) AS (SELECT m.id, SUM(w.weight) FROM w JOIN ds_memories AS m "
            "ON m.search_vector @@ (CAST(:k_token AS tsquery) "
            "&& CAST(quote_literal(w.term) AS tsquery)) "
            f"WHERE {self._OWNER_SQL} GROUP BY m.id), {_LEAST}"
            f"SELECT {_NAMES}, hits.score AS score FROM hits JOIN ds_memories AS m "
            f"ON {self._OWNER_SQL} AND m.id = hits.id "
            "WHERE hits.score >= coalesce((SELECT score FROM least), 0) "
            'ORDER BY score DESC, m.timestamp DESC, m.id COLLATE "C" DESC LIMIT :k_limit',
            bindparam("k_wterms", type_=ARRAY(Text)),
            bindparam("k_weights", type_=ARRAY(BigInteger)),
        )

    # -- SQLite ------------------------------------------------------------------------------

    @staticmethod
    def _matching(match: Any) -> Any:
        """The owner's memories (their keys) whose terms match the FTS5 query ``match``."""
        return (
            _FTS.join(_KEYS, _KEYS.c.rid == _FTS.c.rowid),
            literal_column("ds_memories_fts").op("MATCH")(match),
            (_KEYS.c.org_id == bindparam("k_org"))
            & (_KEYS.c.app_name == bindparam("k_app"))
            & (_KEYS.c.user_id == bindparam("k_user")),
        )

    def _sqlite_ranked(self) -> Any:
        # k_weights: a JSON object of each term and its weight.
        weights = func.json_each(bindparam("k_weights", type_=JSON)).table_valued(
            column("key", Text), column("value", BigInteger)
        )
        weights = weights.alias("w")
        score = (
            select(func.coalesce(func.sum(weights.c.value), 0))
            .select_from(weights)
            .where(
                func.instr(
                    literal(" ", Text) + M.c.terms + literal(" ", Text),
                    literal(" ", Text) + weights.c.key + literal(" ", Text),
                )
                > 0
            )
            .scalar_subquery()
        )
        joined, match, owned = self._matching(bindparam("k_match", type_=Text))
        return (
            select(*COLUMNS, score.label("score"))
            .select_from(
                joined.join(
                    M,
                    (M.c.org_id == _KEYS.c.org_id)
                    & (M.c.app_name == _KEYS.c.app_name)
                    & (M.c.user_id == _KEYS.c.user_id)
                    & (M.c.id == _KEYS.c.id),
                )
            )
            .where(match, owned, _owner())
            .order_by(literal_column("score").desc(), M.c.timestamp.desc(), M.c.id.desc())
            .limit(bindparam("k_limit", type_=BigInteger))
        )

    def _sqlite_ranked_all(self) -> Any:
        # k_token: the owner's token, quoted; k_weights: a JSON object of each term and its
        # weight.
        key = " AND ".join(f"m.{c} = k.{c}" for c in ("org_id", "app_name", "user_id", "id"))
        return _scored(
            "WITH hits(rid, score) AS (SELECT f.rowid, SUM(w.value) "
            "FROM json_each(:k_weights) AS w JOIN ds_memories_fts AS f "
            "ON f.ds_memories_fts MATCH (:k_token || ' AND \"' || w.key || '\"') "
            f"GROUP BY f.rowid), {_LEAST}"
            f"SELECT {_NAMES}, hits.score AS score FROM hits "
            "JOIN ds_memories_fts_rowid AS k ON k.rid = hits.rid "
            f"JOIN ds_memories AS m ON {key} "
            "WHERE hits.score >= coalesce((SELECT score FROM least), 0) "
            "AND k.org_id = :k_org AND k.app_name = :k_app AND k.user_id = :k_user "
            f"AND {self._OWNER_SQL} "
            "ORDER BY score DESC, m.timestamp DESC, m.id DESC LIMIT :k_limit",
            bindparam("k_weights", type_=JSONValue),
        )


def _terms(org_id: str, app_name: str, user_id: str, memory: Memory) -> str:
    """The terms column: of the text, or (an encrypted store's ``SealedMemory``) the owner's
    token and the blind index terms."""
    blind = getattr(memory, "search_terms", None)
    if blind is None:
        return stored_terms(org_id, app_name, user_id, memory.text)
    return " ".join([owner_token(org_id, app_name, user_id), *blind.split()])


def memory_row(org_id: str, app_name: str, user_id: str, memory: Memory) -> dict[str, Any]:
    """The insert parameters of a prepared memory."""
    return {
        "k_org": org_id,
        "v_app_name": app_name,
        "v_user_id": user_id,
        "v_id": memory.id,
        "v_author": memory.author,
        "v_timestamp": memory.timestamp,
        "v_text": memory.text,
        "v_content": memory.content,
        "v_metadata": memory.metadata,
        "v_session_id": memory.session_id,
        "v_seq": memory.seq,
        "v_terms": _terms(org_id, app_name, user_id, memory),
    }


def memory_from_row(row: Any) -> Memory:
    """A memory from a row of ``COLUMNS``."""
    return Memory(
        row.text,
        content=row.content,
        author=row.author,
        timestamp=row.timestamp,
        id=row.id,
        metadata=row.metadata,
        session_id=row.session_id,
        seq=row.seq,
    )


def _term_rows(counts: Counter[str]) -> builtins.list[dict[str, Any]]:
    """Term count parameters, in term order (so that writers lock rows in one order)."""
    return [{"v_term": term, "v_n": n} for term, n in sorted(counts.items())]


def _lock_owner(q: MemoryStatements, owner: dict[str, Any]) -> Program[None]:
    """Take the owner's row lock (their ``""`` count), made if it is not there yet."""
    yield Query(q.count_terms, {**owner, "v_term": "", "v_n": 0})


def _counts(term_lists: Iterable[builtins.list[str]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for terms in term_lists:
        counts.update(terms)
        counts[""] += 1
    return counts


def add_program(
    q: MemoryStatements, owner: dict[str, Any], prepared: builtins.list[Memory]
) -> Program[builtins.list[Memory]]:
    """Insert the memories whose id the owner does not have, and count their terms; return
    them."""
    yield from _lock_owner(q, owner)
    ids = [m.id for m in prepared]
    found = yield Query(q.existing, {**owner, "k_ids": ids})
    have = {row.id for row in found.rows}
    new = [m for m in prepared if m.id not in have]
    if new:
        org, app, user = owner["k_org"], owner["k_app"], owner["k_user"]
        rows = [memory_row(org, app, user, m) for m in new]
        yield Query(q.insert, rows, many=True)
        counts = _counts(row["v_terms"].split(" ")[1:] for row in rows)
        yield Query(q.count_terms, [{**owner, **r} for r in _term_rows(counts)], many=True)
    return new


def forget_program(
    q: MemoryStatements, owner: dict[str, Any], memory_id: str | None
) -> Program[int]:
    """Delete one of the owner's memories (uncounting its terms), or all of them."""
    if memory_id is None:
        result = yield Query(q.forget_all(M), owner)
        yield Query(q.forget_all(T), owner)
        return max(result.rowcount, 0)
    yield from _lock_owner(q, owner)
    params = {**owner, "k_id": memory_id}
    if q.mysql:  # the owner's lock keeps the memory as read until it is deleted
        gone = (yield Query(q.terms_of, params)).rows
        if gone:
            yield Query(q.forget_one, params)
    else:
        gone = (yield Query(q.forget_one, params)).rows
    if gone:
        counts = _counts(row.terms.split(" ")[1:] for row in gone)
        yield Query(q.uncount_terms, [{**owner, **r} for r in _term_rows(counts)], many=True)
        yield Query(q.drop_uncounted, owner)
    return len(gone)


def reindex_program(
    q: MemoryStatements, write: Compiled, rows: builtins.list[dict[str, Any]]
) -> Program[None]:
    """Rewrite memories whose terms may change (``write``: an update guarded by the old
    ``k_terms``), moving the owners' term counts from the old terms to the new ``v_terms``
    of each memory the update found, under the owner's row lock."""
    for row in rows:
        owner = {"k_org": row["k_org"], "k_app": row["k_app"], "k_user": row["k_user"]}
        yield from _lock_owner(q, owner)
        result = yield Query(write, row)
        if result.rowcount < 1 or row["k_terms"] == row["v_terms"]:
            continue
        old = _counts([row["k_terms"].split(" ")[1:]])
        new = _counts([row["v_terms"].split(" ")[1:]])
        yield Query(q.uncount_terms, [{**owner, **r} for r in _term_rows(old)], many=True)
        yield Query(q.count_terms, [{**owner, **r} for r in _term_rows(new)], many=True)
        yield Query(q.drop_uncounted, owner)


def forget_user_program(q: MemoryStatements, params: dict[str, Any]) -> Program[int]:
    """Delete a user's memories and term counts in every app; return how many memories."""
    result = yield Query(q.forget_user(M), params)
    yield Query(q.forget_user(T), params)
    return max(result.rowcount, 0)


def search_program(
    q: MemoryStatements, owner: dict[str, Any], terms: builtins.list[str], limit: int
) -> Program[builtins.list[Memory]]:
    """The owner's best ``limit`` memories for ``terms`` (``memories``' ranking).

    The memories holding the rarest terms (``memories.prefix_terms``) are ranked first;
    when the last of the best ``limit`` among them scores more than all the other terms
    together could give, no other memory can rank among them, and they are the answer.
    Otherwise the memories of more terms are tried (up to ``memories.CANDIDATES``), and
    in the end every memory holding a term is ranked."""
    token = owner_token(owner["k_org"], owner["k_app"], owner["k_user"])
    rows = (yield Query(q.stats, {**owner, "k_terms": ["", *terms]})).rows
    counted = {row.term: row.n for row in rows if row.n > 0}
    total = counted.pop("", 0)
    held = {term: counted[term] for term in terms if term in counted}
    if not held:
        return []
    weights = {term: weight(total, n) for term, n in held.items()}
    tried = 0
    for wanted, most in ((ENOUGH * limit, CANDIDATES[0]), *((m, m) for m in CANDIDATES)):
        first = prefix_terms(weights, held, wanted, most)
        if len(first) == len(weights):
            break
        if len(first) <= tried:
            continue
        tried = len(first)
        rest = sum(w for term, w in weights.items() if term not in first)
        found = yield from _ranked(q, owner, token, weights, first, limit)
        if len(found) == limit and found[-1].score > rest:
            return [memory_from_row(row) for row in found]
    found = yield from _ranked(q, owner, token, weights, list(weights), limit)
    return [memory_from_row(row) for row in found]


def _ranked(
    q: MemoryStatements,
    owner: dict[str, Any],
    token: str,
    weights: dict[str, int],
    matching: builtins.list[str],
    limit: int,
) -> Program[builtins.list[Any]]:
    """The best ``limit`` rows of the owner's memories holding a term of ``matching``,
    each scored by every term of ``weights``."""
    if q.mysql:
        chosen = set(matching)
        triples = [[t, w, int(t in chosen)] for t, w in weights.items()]
        params = {**owner, "k_weights": triples, "k_limit": limit}
        return (yield Query(q.ranked, params)).rows
    wanted = list(weights)
    if len(matching) == len(wanted) and not q.distributed:
        # Every memory holding a term: scored term by term from the index.
        if q.postgres:
            params = {
                **owner, "k_token": f"'{token}'", "k_wterms": wanted,
                "k_weights": [weights[t] for t in wanted], "k_limit": limit,
            }  # fmt: skip
        else:
            params = {**owner, "k_token": _quote(token), "k_weights": weights, "k_limit": limit}
        return (yield Query(q.ranked_all, params)).rows
    if q.postgres:
        any_term = " | ".join(f"'{term}'" for term in matching)
        params = {
            **owner, "k_any": f"'{token}' & ({any_term})", "k_wterms": wanted,
            "k_weights": [weights[t] for t in wanted], "k_limit": limit,
        }  # fmt: skip
    else:
        any_term = " OR ".join(_quote(term) for term in matching)
        params = {
            **owner, "k_match": f"{_quote(token)} AND ({any_term})", "k_weights": weights,
            "k_limit": limit,
        }  # fmt: skip
    return (yield Query(q.ranked, params)).rows


def count_program(stmt: Compiled, params: dict[str, Any]) -> Program[int]:
    """The ``n`` of a counting statement."""
    row = (yield Query(stmt, params)).first()
    return int(row.n)
