"""Citus's router rules, as a check of SQLAlchemy Core statements.

Citus sends a statement to the one worker holding an organisation, and commits it there
without two-phase commit, only when every distributed table it reads or writes is filtered
on its distribution column (``org_id``) equal to one value; and it never routes a
data-modifying CTE containing an INSERT. ``violations`` says how a statement breaks these
rules, walking its Core tree the way SQLAlchemy compiles it:

- it references no table but the schema's own;
- every table in the FROM of every SELECT (subqueries and CTEs included, a correlated
  subquery's outer tables excluded as SQLAlchemy excludes them), and the target of every
  UPDATE and DELETE, is filtered by a top-level ``<table>.org_id = :k_org`` conjunct of its
  own WHERE: never through another table's ``org_id``;
- an INSERT's ``org_id`` is ``:k_org`` itself, or (INSERT ... SELECT) the ``org_id`` of a
  table of its SELECT, which is filtered so;
- no CTE modifies data (no INSERT, UPDATE or DELETE inside WITH);
- no UPDATE ... FROM or DELETE ... USING (a join of two tables in one write).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Table
from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.elements import BinaryExpression, BindParameter, BooleanClauseList
from sqlalchemy.sql.schema import Column
from sqlalchemy.sql.selectable import CTE, Join, Select

from durable_sessions.sql.dialects.citus.programs import DistributedStatements
from durable_sessions.sql.schema import metadata
from durable_sessions.sql.statements import Statements

TABLES = {table.name for table in metadata.sorted_tables}
ORG = "k_org"


def violations(statement: Any) -> list[str]:
    """How ``statement`` breaks Citus's router rules (empty: it is routed to one worker)."""
    found: list[str] = []
    _visit(statement, frozenset(), found)
    return sorted(set(found))


def _conjuncts(where: Any) -> list[Any]:
    if where is None:
        return []
    if isinstance(where, BooleanClauseList) and where.operator is operators.and_:
        return [part for clause in where.clauses for part in _conjuncts(clause)]
    return [where]


def _is_org_bound(clause: Any, table: Table) -> bool:
    """``table.org_id = :k_org`` (either way round)."""
    if not isinstance(clause, BinaryExpression) or clause.operator is not operators.eq:
        return False
    for column, value in ((clause.left, clause.right), (clause.right, clause.left)):
        if (
            isinstance(column, Column)
            and column.table is table
            and column.name == "org_id"
            and isinstance(value, BindParameter)
            and value.key == ORG
        ):
            return True
    return False


def _check_filtered(table: Table, where: Any, what: str, found: list[str]) -> None:
    if not any(_is_org_bound(clause, table) for clause in _conjuncts(where)):
        found.append(f"{what} {table.name} is not filtered on {table.name}.org_id = :{ORG}")


def _tables(from_: Any) -> Iterator[Table]:
    if isinstance(from_, Table):
        yield from_
    elif isinstance(from_, Join):
        yield from _tables(from_.left)
        yield from _tables(from_.right)


def _visit(element: Any, outer: frozenset[Table], found: list[str]) -> None:
    own: frozenset[Table] = frozenset()
    if isinstance(element, Table):
        if element.name not in TABLES:
            found.append(f"references {element.name}, not a table of the schema")
        return
    if isinstance(element, CTE) and isinstance(element.element, (Insert, Update, Delete)):
        kind = type(element.element).__name__.upper()
        found.append(f"data-modifying CTE {element.name} ({kind})")
    if isinstance(element, Select):
        froms = {t for f in element.get_final_froms() for t in _tables(f)}
        own = frozenset(froms - outer) or frozenset(froms)  # SQLAlchemy's auto-correlation
        for table in own:
            _check_filtered(table, element.whereclause, "SELECT from", found)
    elif isinstance(element, (Update, Delete)):
        own = frozenset({element.table})  # type: ignore[arg-type]
        _check_filtered(element.table, element.whereclause, type(element).__name__, found)  # type: ignore[arg-type]
        if getattr(element, "_extra_froms", None):
            found.append(f"{type(element).__name__} of {element.table} joins another table")
    elif isinstance(element, Insert):
        own = frozenset({element.table})  # type: ignore[arg-type]
        _check_insert(element, found)
    for child in element.get_children():
        _visit(child, outer | own, found)


def _check_insert(insert: Insert, found: list[str]) -> None:
    name = insert.table.name  # type: ignore[attr-defined]
    source = insert.select
    if source is not None:
        names = list(getattr(insert, "_select_names", None) or [])
        org = list(source.selected_columns)[names.index("org_id")]
        froms = {t for f in source.get_final_froms() for t in _tables(f)}
        if isinstance(org, BindParameter) and org.key == ORG:
            return
        if isinstance(org, Column) and org.name == "org_id" and org.table in froms:
            return  # that table is checked as a SELECT from
        found.append(f"INSERT INTO {name} ... SELECT: org_id is neither :{ORG} nor a table's")
        return
    values = getattr(insert, "_values", None) or {}
    org = next((v for k, v in values.items() if getattr(k, "name", k) == "org_id"), None)
    if not (isinstance(org, BindParameter) and org.key == ORG):
        found.append(f"INSERT INTO {name} does not bind org_id to :{ORG}")


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every Core statement a ``DistributedStatements`` compiles inside the block, checked
    as it is compiled: a statement that breaks the rules fails the test there."""
    seen: list[Any] = []
    original = Statements.compile

    def compile(self: Statements, statement: Any) -> Any:
        if isinstance(self, DistributedStatements):
            seen.append(statement)
            broken = violations(statement)
            assert not broken, f"distributed mode compiled a statement Citus cannot route: {broken}"
        return original(self, statement)

    monkeypatch.setattr(Statements, "compile", compile)
    yield seen
