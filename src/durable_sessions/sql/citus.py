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

from sqlalchemy import Text, and_, bindparam, column, exists, func, literal, select, table, true
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ColumnElement

from ..errors import InvalidArgumentError
from .compiled import Compiled, compile_statement
from .dialect import DialectOps
from .postgres import PostgresReads, PostgresShapes
from .runner import Program, Query
from .schema import metadata, sessions
from .stepwise import StepwisePrograms, StepwiseStatements

__all__ = [
    "SETTING",
    "DistributedPrograms",
    "DistributedStatements",
    "detect_distributed",
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
    return compile_statement(select(has_citus.label("citus"), setting.label("setting")), dialect)


def detect_distributed(dialect: Dialect) -> Program[bool]:
    """Whether a Postgres database wants distributed mode: the setting ``SETTING`` when it
    is set, else whether the ``citus`` extension is installed.

    Raises:
        InvalidArgumentError: the setting is neither on nor off.
    """
    row = (yield Query(_detect_statement(dialect))).first()
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


def distribution_sql() -> list[str]:
    """The statements that distribute a migrated schema on Citus, in the order to run them.

    Run them on the coordinator, once, after ``migrate`` has created the tables there (as
    local tables): ``ds_sessions`` first, distributed by ``org_id``, then every other table
    of the schema colocated with it (``ds_events`` references it). Alembic's version table
    (``durable_sessions_alembic_version``) stays a local table of the coordinator.
    """
    first = sessions.name
    others = sorted(t.name for t in metadata.sorted_tables if t.name != first)
    statements = [f"SELECT create_distributed_table('{first}', 'org_id');"]
    statements += [
        f"SELECT create_distributed_table('{name}', 'org_id', colocate_with => '{first}');"
        for name in others
    ]
    return statements
