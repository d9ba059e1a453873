"""The bulk loaders' inserts on MySQL (export/import and the ADK importer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, insert, select, tuple_

from ....sealing import is_sealed
from ...transactions import TransactionConnection
from .programs import WORDS, word_rows

__all__ = ["insert_new"]


async def insert_new(
    conn: TransactionConnection, table: Table, rows: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """Insert ``rows`` into ``table`` unless a row's primary key is taken already; return
    the first such row (and insert nothing), or None.

    MySQL has no ``INSERT ... RETURNING`` of the rows an ``ON DUPLICATE KEY`` clause left
    out: the keys are looked for first, in the loader's transaction. Events go in with their
    words (``ds_event_words``, which search reads); a sealed event's are its blind index
    terms, which the import's ``BlindIndexer`` writes once it has opened the content.
    """
    pk = list(table.primary_key.columns)
    keys = [tuple(row[col.name] for col in pk) for row in rows]
    found = await conn.execute(select(*pk).where(tuple_(*pk).in_(keys)))
    taken = {tuple(row) for row in found}
    if taken:
        return next(row for row, key in zip(rows, keys, strict=True) if key in taken)
    await conn.execute(insert(table), list(rows))
    if table.name == "ds_events":
        words = [
            {"org_id": word.pop("k_org"), **word}
            for row in rows
            if not is_sealed(row["content"])
            for word in word_rows(row["org_id"], row["session_id"], row["seq"], row["content"])
        ]
        if words:
            await conn.execute(insert(WORDS), words)
    return None
