"""SQLite: its own statements and the shape of its writes (one transaction of steps each,
``sql/stepwise.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Text, cast, column, func, insert, literal, select, text

from ...programs import Job
from ...runner import Program, Query
from ...search import EVENTS_WITH_TERMS
from ...stepwise import StepwisePrograms, StepwiseStatements, bound_row

__all__ = ["SQLitePrograms", "SQLiteStatements"]


class SQLiteStatements(StepwiseStatements):
    """SQLite's statements: the steps of its multi-statement write transactions."""

    def __init__(self, *args: Any, blind: bool = False) -> None:
        super().__init__(*args, sealed=blind)
        if blind:  # an encrypted store's events carry their blind index text (revision 0012)
            terms = insert(EVENTS_WITH_TERMS).values(bound_row(EVENTS_WITH_TERMS))
            self.insert_event = self.compile(terms)
        # FTS5 keeps a deleted row's words in its segments (a delete adds a tombstone):
        # merging every segment into one drops them.
        self.fts_optimize = self.compile(
            text("INSERT INTO ds_events_fts (ds_events_fts) VALUES ('optimize')")
        )
        self.memory_fts_optimize = self.compile(
            text("INSERT INTO ds_memories_fts (ds_memories_fts) VALUES ('optimize')")
        )
        # Copies every page of the write-ahead log into the database and empties the log.
        self.wal_checkpoint = self.compile(
            text("PRAGMA wal_checkpoint(TRUNCATE)").columns(
                column("busy", Integer), column("log", Integer), column("moved", Integer)
            )
        )

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

    def merge_search_index(self) -> Job[None]:
        """Merge the FTS5 index into one segment: the words of deleted events leave it."""
        return Job(self._one(self.q.fts_optimize), "write")

    def merge_memory_index(self) -> Job[None]:
        """Merge the memories' FTS5 index into one segment: deleted memories' terms leave it."""
        return Job(self._one(self.q.memory_fts_optimize), "write")

    def checkpoint(self) -> Job[bool]:
        """Copy the write-ahead log into the database file and truncate it to nothing;
        return whether it was emptied (False: a reader still uses a page of it)."""
        return Job(self._checkpoint(), "read")

    @staticmethod
    def _one(stmt: Any) -> Program[None]:
        yield Query(stmt, {})

    def _checkpoint(self) -> Program[bool]:
        row = (yield Query(self.q.wal_checkpoint, {})).first()
        return row is None or not row.busy
