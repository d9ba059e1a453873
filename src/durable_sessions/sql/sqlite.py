"""SQLite: its own statements and the shape of its writes (one transaction of steps each,
``sql/stepwise.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, cast, func, literal, select

from .stepwise import StepwisePrograms, StepwiseStatements

__all__ = ["SQLitePrograms", "SQLiteStatements"]


class SQLiteStatements(StepwiseStatements):
    """SQLite's statements: the steps of its multi-statement write transactions."""

    def event_contents(self, has_limit: bool) -> Any:
        """A session's event contents, oldest first, as ONE JSON array in one text value."""
        rows = self.chosen_contents(has_limit)
        # Contents are stored as JSON text: joined as they are, nothing is parsed. SQLite
        # aggregates in the order its input comes: the rows, ordered by seq.
        text = func.coalesce(cast(rows.c.content, Text), literal("null", Text))
        ordered = select(text.label("c")).order_by(rows.c.seq).subquery("ordered")
        joined = literal("[", Text) + func.group_concat(ordered.c.c, ",") + literal("]", Text)
        return select(joined.label("contents"))


class SQLitePrograms(StepwisePrograms):
    """SQLite's writes: each one write transaction of steps (``BEGIN IMMEDIATE``: the write
    lock is taken up front, so the steps see and change the database alone)."""

    q: SQLiteStatements
