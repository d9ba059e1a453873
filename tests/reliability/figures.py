"""The figures table: every reliability scenario records what it tried and what survived.

One row per (scenario, backend):

- ``operations``: the writes (or migrations, or refused inputs) the scenario attempted;
- ``expected``: the items (keys, events, counter increments, sessions, tables) that must be
  stored afterwards;
- ``found``: how many of those items are stored, read back after the run;
- ``lost``: ``expected - found``; any loss fails the scenario;
- ``errors``: the operations that raised, each checked by the scenario to be the typed error
  it should be (a ``StaleSessionError`` for the losing stale copy, an ``InvalidStateError``
  for refused input, a ``StoreUnavailableError`` for a killed connection).

The rows are printed as one aligned table at the end of the pytest run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import pytest

__all__ = ["FIGURES_KEY", "Figures", "Row", "render"]


@dataclass(frozen=True)
class Row:
    """One line of the figures table."""

    scenario: str
    backend: str
    operations: int
    expected: int
    found: int
    lost: int
    errors: int
    cancelled: int = 0


FIGURES_KEY = pytest.StashKey[list[Row]]()
"""Where the rows of this run are kept, on the pytest ``Config``."""


class Figures:
    """Collects the rows of the figures table for one pytest run."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def record(
        self,
        scenario: str,
        backend: str,
        *,
        operations: int,
        expected: int,
        found: int,
        errors: int = 0,
        cancelled: int = 0,
    ) -> Row:
        """Record a row, then fail the calling scenario if anything expected was lost.

        The row is recorded first, so a loss shows in the table as well as in the failure.
        """
        row = Row(
            scenario, backend, operations, expected, found, expected - found, errors, cancelled
        )
        self.rows.append(row)
        assert row.lost == 0, f"{scenario} on {backend}: lost {row.lost} of {expected}: {row}"
        return row


def render(rows: Sequence[Row]) -> list[str]:
    """Return the rows as an aligned text table, a header and a rule first."""
    names = [f.name for f in fields(Row)]
    cells = [names, *([str(getattr(row, name)) for name in names] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
    numeric = [name not in ("scenario", "backend") for name in names]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(names), line(["-" * w for w in widths])]
    out.extend(line(values) for values in cells[1:])
    total_lost = sum(row.lost for row in rows)
    out.append(f"{len(rows)} rows, {total_lost} lost")
    return out
