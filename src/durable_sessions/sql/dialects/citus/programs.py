"""Postgres distributed by organisation (Citus): every operation on one worker.

Citus routes a statement to the one worker holding an organisation (a "router" query, with a
plain COMMIT there) only when every distributed table it reads or writes is filtered on
``org_id`` equal to the same value; and it never routes a data-modifying CTE that contains an
INSERT (Citus 12.x to 14.x), which it runs instead as subplans copied to every worker,
committed with two-phase commit. So in distributed mode:

- reads are the same single statements as on one Postgres (their shared-state subqueries
  filter on the bound organisation, ``Statements.state_columns``);
- writes are the stepwise programs (``sql/stepwise.py``): a transaction of single-table
  statements on one connection, each filtered on the bound organisation, with row locks
  where a step reads and then writes.

The mode is chosen once per store (``SQLStore(engine, distributed=None)``): on when the
database has the ``citus`` extension, unless the setting ``durable_sessions.distributed``
(``on``/``off``, e.g. ``ALTER DATABASE ... SET``) or the ``distributed`` argument says
otherwise. ``distribution_sql()`` returns the statements that distribute a migrated schema.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Text,
    and_,
    bindparam,
    column,
    exists,
    false,
    func,
    literal,
    select,
    table,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ColumnElement

from ....errors import InvalidArgumentError
from ....fulltext import fold
from ...compiled import Compiled, compile_statement
from ...dialect import DialectOps
from ...runner import Program, Query
from ...schema import metadata, sessions
from ...stepwise import StepwisePrograms, StepwiseStatements
from ..postgresql.programs import PostgresReads, PostgresShapes

__all__ = [
    "GENERATED_VECTOR",
    "SETTING",
    "DistributedPrograms",
    "DistributedStatements",
    "Schema",
    "detect_schema",
    "distribution_sql",
]

SETTING = "durable_sessions.distributed"
"""A Postgres setting that forces the mode of every store on a database (``on``/``off``)."""

_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")


class DistributedStatements(PostgresShapes, StepwiseStatements):
    """The statements of distributed mode: the shared reads, Postgres's one-statement reads
    and row locks, and the single-table steps of the writes. Nothing else is compiled."""

    def whole_org(self) -> ColumnElement[bool]:
        """``org_id = :k_org``, which routes the statement to the organisation's worker,
        and the same under "POSIX", which reaches ``ix_ds_sessions_org_updated`` there."""
        return and_(sessions.c.org_id == bindparam("k_org"), super().whole_org())


class DistributedPrograms(PostgresReads, StepwisePrograms):
    """Distributed mode's programs: reads as on one Postgres, writes stepwise under row
    locks, each write one transaction on one connection."""

    q: DistributedStatements

    row_locks = True


def _detect_statement(dialect: Dialect) -> Compiled:
    extension = table("pg_extension", column("extname", Text))
    has_citus = exists(
        select(literal(1)).select_from(extension).where(extension.c.extname == "citus")
    )
    setting = func.current_setting(literal(SETTING, Text), true(), type_=Text)
    # ds_events.search_vector: plain (revision 0008: writes send vectors), generated, or
    # NULL (no such table or column).
    attribute = table(
        "pg_attribute",
        column("attrelid"),
        column("attname", Text),
        column("attgenerated", Text),
        column("attisdropped", Boolean),
    )
    plain = (
        select(attribute.c.attgenerated == literal("", Text))
        .where(
            attribute.c.attrelid == func.to_regclass(literal("ds_events", Text)),
            attribute.c.attname == literal("search_vector", Text),
            attribute.c.attisdropped.is_(false()),
        )
        .scalar_subquery()
    )
    # The database folds case as fulltext.fold does (a UTF-8 locale; not "C", nor Turkish).
    folds = func.lower(literal(FOLD_PROBE, Text)) == literal(fold(FOLD_PROBE), Text)
    query = select(
        has_citus.label("citus"), setting.label("setting"), (plain & folds).label("vectors")
    )
    return compile_statement(query, dialect)


FOLD_PROBE = "I\u00c9\u03a3\u0130"
"""Capitals that a database's ``lower()`` folds as ``fulltext.fold`` only under a UTF-8
locale that is not Turkish: "C" leaves all but ``I`` as they are, Turkish makes ``I``
dotless."""


class Schema(NamedTuple):
    """What a Postgres database asks of a store (``detect_schema``)."""

    distributed: bool
    """Whether to run in distributed mode: the setting ``SETTING`` when it is set, else
    whether the ``citus`` extension is installed."""
    vectors: bool | None
    """Whether writes send each event's search vector: ``ds_events.search_vector`` is a
    plain column (revision 0008) and the database folds case as ``fulltext.fold`` does, so
    that a vector computed here matches the words ``ds_search_words`` makes of a search.
    False for a generated column, or another folding (the trigger computes the vectors
    then); None without the table or the column."""


def detect_schema(dialect: Dialect) -> Program[Schema]:
    """The mode a Postgres database wants and its kind of search vector, in one statement.

    Distributed mode: the setting ``SETTING`` when it is set, else whether the ``citus``
    extension is installed.

    Raises:
        InvalidArgumentError: the setting ``SETTING`` is neither on nor off.
    """
    row = (yield Query(_detect_statement(dialect))).first()
    return Schema(_wants_distributed(row), row.vectors)


def _wants_distributed(row: Any) -> bool:
    setting = (row.setting or "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    if setting:
        raise InvalidArgumentError(f"{SETTING} must be on or off, not {row.setting!r}")
    return bool(row.citus)


def make_distributed(ops: DialectOps, dialect: Dialect) -> DistributedPrograms:
    """The programs of distributed mode for a Postgres dialect."""
    return DistributedPrograms(DistributedStatements(ops, dialect))


GENERATED_VECTOR = [
    "DROP TRIGGER IF EXISTS ds_events_search_vector ON ds_events;",
    "ALTER TABLE ds_events DROP COLUMN search_vector;",
    "ALTER TABLE ds_events ADD COLUMN search_vector tsvector"
    " GENERATED ALWAYS AS (ds_search_vector(content)) STORED;",
    "CREATE INDEX ix_ds_events_search ON ds_events USING gin (search_vector);",
]
"""Make ``ds_events.search_vector`` a generated column: on one Postgres it is a plain column
that a trigger fills for the inserts that send no vector, and Citus runs no trigger on a
distributed table. Distributed mode's writes send no vector. It calls ``ds_search_vector``
of the ``json`` content, which reads its strings in stored order."""


def distribution_sql() -> list[str]:
    """The statements that distribute a migrated schema on Citus, in the order to run them.

    Run them on the coordinator, once, after ``migrate`` has created the tables there (as
    local tables): first ``GENERATED_VECTOR`` (the search vector computed by Postgres, not
    by a trigger), then ``ds_sessions``, distributed by ``org_id``, then every other table
    of the schema colocated with it (``ds_events`` references it). Alembic's version table
    (``durable_sessions_alembic_version``) stays a local table of the coordinator.
    """
    first = sessions.name
    others = sorted(t.name for t in metadata.sorted_tables if t.name != first)
    statements = [*GENERATED_VECTOR, f"SELECT create_distributed_table('{first}', 'org_id');"]
    statements += [
        f"SELECT create_distributed_table('{name}', 'org_id', colocate_with => '{first}');"
        for name in others
    ]
    return statements
