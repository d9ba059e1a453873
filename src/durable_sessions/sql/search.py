"""The statements of ``search``: the full-text index of each dialect, read in one statement.

The index itself belongs to Alembic (revision 0003): the generated column
``ds_events.search_vector`` under a GIN index on Postgres, the FTS5 table ``ds_events_fts``
(kept in step by triggers, keyed through ``ds_events_fts_rowid``) on SQLite. Neither is in
the SQLAlchemy metadata, so they are named here as lightweight tables and columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Boolean,
    Integer,
    Text,
    any_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal_column,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSQUERY, TSVECTOR

from ..fulltext import query_words, search_vector, search_vector_of
from ..model import Event
from .dialects.mysql.programs import word_rows
from .schema import events, sessions
from .statements import EVENT_COLUMNS

if TYPE_CHECKING:
    from .dialect import DialectOps

__all__ = [
    "EVENTS_WITH_TERMS",
    "EventIndex",
    "event_index",
    "fts_match",
    "indexed_vector",
    "mysql_search_query",
    "search_query",
]

E = events
S = sessions
_FTS = table("ds_events_fts", column("rowid", Integer), column("body", Text))
_KEYS = table(
    "ds_events_fts_rowid",
    column("rid", Integer),
    column("org_id", Text),
    column("session_id", Text),
    column("seq", Integer),
)


@dataclass(frozen=True)
class EventIndex:
    """Where a dialect keeps an encrypted store's blind index terms of an event (its
    content's words, each a keyed hash: ``DataKey.blind``), for the writes that set them
    outside ``append`` (a sealed fork, ``reencrypt``, an encrypted import):

    - ``"terms"`` (SQLite): the row's ``search_terms``, which the full-text index reads
      instead of the sealed content where it is set;
    - ``"vector"`` (Postgres): the row's ``search_vector``, made of the terms;
    - ``"words"`` (MySQL): the event's rows of ``ds_event_words``, one per distinct term.
    """

    kind: str
    """``"terms"``, ``"vector"`` or ``"words"``."""

    @property
    def in_words(self) -> bool:
        """Whether the terms are rows of ``ds_event_words`` (``word_rows``), not a column
        of the event's row (``column``, ``value``)."""
        return self.kind == "words"

    @property
    def column(self) -> str:
        """The event row's column that holds the terms (none on MySQL)."""
        if self.kind == "words":
            raise ValueError("MySQL keeps an event's blind index terms in ds_event_words rows")
        return "search_vector" if self.kind == "vector" else "search_terms"

    def target(self) -> Any:
        """``ds_events`` with ``column``, for a write that sets it (``ds_events`` on MySQL)."""
        if self.kind == "words":
            return E
        kind = TSVECTOR if self.kind == "vector" else Text
        return table(E.name, *[column(c.name, c.type) for c in E.c], column(self.column, kind))

    def bound(self, name: str) -> dict[str, Any]:
        """``column`` given the parameter ``name`` (a ``value``), for ``target``'s
        ``values``: nothing on MySQL."""
        if self.kind == "words":
            return {}
        param = bindparam(name, type_=Text)
        return {self.column: cast(param, TSVECTOR) if self.kind == "vector" else param}

    def value(self, terms: str) -> str:
        """What ``column`` holds for an event whose blind index terms are ``terms``."""
        return search_vector_of(terms.split()) if self.kind == "vector" else terms

    @staticmethod
    def word_rows(org_id: str, session_id: str, seq: int, terms: str) -> list[dict[str, Any]]:
        """An event's rows of ``ds_event_words`` for its blind index ``terms`` (MySQL)."""
        return word_rows(org_id, session_id, seq, None, terms)


def event_index(ops: DialectOps) -> EventIndex:
    """The dialect's ``EventIndex``."""
    return EventIndex("vector" if ops.is_postgres else "words" if ops.is_mysql else "terms")


_VECTOR = EventIndex("vector")

EVENTS_WITH_TERMS = EventIndex("terms").target()
"""SQLite's ``ds_events`` with ``search_terms`` (revision 0012), outside the metadata as the
rest of search: an encrypted store's blind index text, which the full-text index reads
instead of the (sealed) content where it is not NULL."""


def indexed_vector(event: Event) -> str:
    """The search vector a write sends for an event (Postgres): of its content's words, or,
    for an encrypted store's sealed event, of its blind index terms (``search_terms``)."""
    terms = getattr(event, "search_terms", None)
    return search_vector(event.content) if terms is None else _VECTOR.value(terms)


def fts_match(text: str) -> str:
    """An FTS5 query of every word of ``text``, each a quoted string: operators, column
    filters, ``*`` and keywords in the text stay data (a word holds no quote)."""
    return " ".join(f'"{word}"' for word in query_words(text))


def mysql_search_query(user: bool, app: bool, session: bool) -> Any:
    """``search`` on MySQL: the events with a row in ``ds_event_words`` (revision 0003) for
    each of the ``k_count`` folded words ``k_words``, best first as on the other dialects;
    an event's rank is the sum of its counts of those words."""
    from .dialect import dialect_ops  # the words are compared as the key columns are
    from .dialects.mysql.programs import WORDS

    org: Any = bindparam("k_org")
    ops = dialect_ops("mysql", "asyncmy")
    hits = select(WORDS.c.session_id, WORDS.c.seq, func.sum(WORDS.c.n).label("rank")).where(
        WORDS.c.org_id == org, ops.in_list(WORDS.c.word, "k_words")
    )
    if session:
        hits = hits.where(WORDS.c.session_id == bindparam("k_session"))
    found = (
        hits.group_by(WORDS.c.session_id, WORDS.c.seq)
        .having(func.count() == bindparam("k_count", type_=Integer))
        .subquery("hits")
    )
    query = (
        select(E.c.session_id, *EVENT_COLUMNS, found.c.rank.label("rank"))
        .select_from(found)
        .join(
            E,
            (E.c.org_id == org) & (E.c.session_id == found.c.session_id) & (E.c.seq == found.c.seq),
        )
    )
    if user or app:
        query = query.join(S, (S.c.org_id == org) & (S.c.id == E.c.session_id))
        if user:
            query = query.where(S.c.user_id == bindparam("k_user"))
        if app:
            query = query.where(S.c.app_name == bindparam("k_app"))
    return query.order_by(
        literal_column("rank").desc(), E.c.timestamp.desc(), E.c.session_id.desc(), E.c.seq.desc()
    ).limit(bindparam("k_limit"))


def search_query(
    postgres: bool, user: bool, app: bool, session: bool, *, stored_order: bool = True
) -> Any:
    """``search``: one organisation's events holding every word of the text, best first.

    Best: the most occurrences of the words (each event's rank), then the newest, then
    by session id and seq (code point order), so that every store orders hits alike.
    Every table is filtered on ``org_id = :k_org`` (one shard on Citus).

    Postgres counts the words of an event whose vector has no positions from its text:
    ``ds_search_text`` of the ``json`` content, its strings in stored order (revision
    0009); without ``stored_order`` (a schema before 0009) of the content cast to
    ``jsonb``, as revisions 0003 to 0008 read it.
    """
    org: Any = bindparam("k_org")
    rank: Any
    session_order: Any
    if postgres:
        vector = literal_column("ds_events.search_vector", type_=TSVECTOR)
        text = bindparam("k_text", type_=Text)

        def wanted() -> Any:  # an InitPlan: computed once per search, not once per row
            words = select(func.ds_search_words(text, type_=ARRAY(Text))).scalar_subquery()
            return any_(cast(words, ARRAY(Text)))  # the cast: ANY(array), not ANY(subquery)

        # Each hit's occurrences of the words: from the positions in its vector, or (a vector
        # without them: past 16,382 words, or 255 of one) from its content's words.
        lexemes = (
            func.unnest(vector)
            .table_valued(column("lexeme", Text), column("positions", ARRAY(Integer)))
            .render_derived("lexemes")
        )
        positioned = (
            select(
                case(
                    (
                        func.bool_and(lexemes.c.positions.is_not(None)),
                        func.sum(func.cardinality(lexemes.c.positions)),
                    )
                )
            )
            .select_from(lexemes)
            .where(lexemes.c.lexeme == wanted())
            .scalar_subquery()
        )
        content = E.c.content if stored_order else cast(E.c.content, JSONB)
        found = (
            func.unnest(
                func.ds_search_words(func.ds_search_text(content, type_=Text), type_=ARRAY(Text))
            )
            .table_valued(column("word", Text))
            .render_derived("found")
        )
        counted = (
            select(func.count())
            .select_from(found)
            .where(found.c.word == wanted())
            .scalar_subquery()
        )
        rank = func.coalesce(positioned, counted)
        query = (
            select(E.c.session_id, *EVENT_COLUMNS, rank.label("rank"))
            .select_from(E)
            .where(
                E.c.org_id == org,
                vector.op("@@", return_type=Boolean)(
                    select(func.ds_search_query(text, type_=TSQUERY)).scalar_subquery()
                ),
            )
        )
        session_order = E.c.session_id.collate("C")
    else:
        # The count of highlighted instances: how much longer highlight() made the text.
        marked = func.highlight(literal_column("ds_events_fts"), 0, "[", "")
        rank = func.length(marked) - func.length(_FTS.c.body)
        query = (
            select(E.c.session_id, *EVENT_COLUMNS, rank.label("rank"))
            .select_from(_FTS)
            .join(_KEYS, _KEYS.c.rid == _FTS.c.rowid)
            .join(
                E,
                (E.c.org_id == _KEYS.c.org_id)
                & (E.c.session_id == _KEYS.c.session_id)
                & (E.c.seq == _KEYS.c.seq),
            )
            .where(
                literal_column("ds_events_fts").op("MATCH")(bindparam("k_match", type_=Text)),
                _KEYS.c.org_id == org,
                E.c.org_id == org,
            )
        )
        if session:
            query = query.where(_KEYS.c.session_id == bindparam("k_session"))
        session_order = E.c.session_id
    if session:
        query = query.where(E.c.session_id == bindparam("k_session"))
    if user or app:
        query = query.join(S, S.c.id == E.c.session_id).where(S.c.org_id == org)
        if user:
            query = query.where(S.c.user_id == bindparam("k_user"))
        if app:
            query = query.where(S.c.app_name == bindparam("k_app"))
    return query.order_by(
        literal_column("rank").desc(),
        E.c.timestamp.desc(),
        session_order.desc(),
        E.c.seq.desc(),
    ).limit(bindparam("k_limit"))
