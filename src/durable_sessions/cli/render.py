"""How the command line shows sessions, events and the demo: rich tables and text for people.

This module imports rich (the ``cli`` extra) when it is imported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.table import Table

from ..state import scope_of

__all__ = [
    "CELL_CHARS",
    "TerminalOutput",
    "cut",
    "describe_state",
    "draw_table",
    "make_console",
    "text",
    "when",
]

CELL_CHARS = 2000
"""The most characters of one value the command shows (a table cell, a fact of ``show``);
a longer value is cut (``cut``): rich lays a cell out in time that grows with its length
(seconds for a few megabytes), so what it gets stays bounded whatever is stored."""

DEMO_USER = "ada"
"""The demo's user, whose messages are drawn in their own colour."""


def make_console(stream: IO[str]) -> Console:
    """Return a console on ``stream``: styles only on a terminal, no wrapping in a pipe."""
    width = None if stream.isatty() else 1000
    return Console(file=stream, width=width, markup=False, emoji=False, highlight=False)


def draw_table(
    console: Console,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    header: bool = True,
) -> None:
    """Print a table with a header rule and no borders; number columns align right; each
    value longer than ``CELL_CHARS`` is cut.

    Without ``header``, only the rows (the next part of a table printed as it streams in).
    """
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, show_header=header)
    for name in columns:
        numeric = name in ("#", "messages", "tokens")
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*map(cut, row))
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:  # cells are padded to the column: trim line ends
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


class TerminalOutput:
    """Renders the demo with rich: bold headings and coloured authors on a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def heading(self, text: str) -> None:
        """Start a section after a blank line."""
        self.console.print()
        self.console.print(text, style="bold")

    def line(self, text: str = "") -> None:
        """Write a line of narration."""
        self.console.print(text)

    def say(self, author: str, text: str) -> None:
        """Write a chat message, wrapped beside its author's name."""
        grid = Table.grid(padding=(0, 2))
        grid.add_column(width=10, style="green" if author == DEMO_USER else "cyan")
        grid.add_column(overflow="fold")
        grid.add_row(author, text)
        self.console.print(grid)

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Write a table."""
        draw_table(self.console, columns, rows)


def describe_state(state: Mapping[str, Any]) -> list[list[str]]:
    """Rows of (scope, key, value) for a session's state, grouped by scope."""
    order = {"private": 0, "user": 1, "app": 2, "temp": 3}
    keys = sorted(state, key=lambda key: (order[scope_of(key)], key))
    return [[scope_of(key), key, json.dumps(state[key], ensure_ascii=False)] for key in keys]


def when(moment: datetime) -> str:
    """Format a timestamp for people: UTC, to the second."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def text(value: Any) -> str:
    """Format a JSON value for people: strings as they are, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def cut(value: str, limit: int = CELL_CHARS) -> str:
    """Return ``value`` whole when it has at most ``limit`` characters; else its first
    ``limit``, and how many more there are."""
    if len(value) <= limit:
        return value
    more = len(value) - limit
    return f"{value[:limit]}… ({more:,} more character{'' if more == 1 else 's'})"
