"""SQLite: its own statements and the shape of its writes (one transaction of steps each,
``sql/stepwise.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Text, cast, func, literal, select

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

    def json_listing(self, listed: Any, owners: Any, user_agg: Any, apps: Any, app_agg: Any) -> Any:
        """SQLite: the JSON object written around three ``json_group_array``, each read
        from the listing's rows as they were listed (stored JSON text embedded as is)."""
        stamp = listed.c.updated_at  # "YYYY-MM-DD HH:MM:SS.ffffff", UTC
        seconds = cast(func.strftime("%s", func.substr(stamp, 1, 19)), Integer)
        micros = seconds * 1_000_000 + cast(func.substr(stamp, 21, 6), Integer)
        item = func.json_array(
            listed.c.id, listed.c.user_id, listed.c.app_name, micros, listed.c.version,
            listed.c.incarnation, func.json(listed.c.state),
        )  # fmt: skip
        sessions = select(func.json_group_array(item)).scalar_subquery()
        owner = func.json_array(
            owners.c.app_name, owners.c.user_id, func.json(func.coalesce(user_agg, "{}"))
        )
        users = select(func.json_group_array(owner)).scalar_subquery()
        app = func.json_array(apps.c.app_name, func.json(func.coalesce(app_agg, "{}")))
        every_app = select(func.json_group_array(app)).scalar_subquery()
        whole = (
            literal('{"sessions":', Text) + sessions + literal(',"users":', Text) + users
            + literal(',"apps":', Text) + every_app + literal("}", Text)
        )  # fmt: skip
        return select(whole.label("listing"))


class SQLitePrograms(StepwisePrograms):
    """SQLite's writes: each one write transaction of steps (``BEGIN IMMEDIATE``: the write
    lock is taken up front, so the steps see and change the database alone)."""

    q: SQLiteStatements
