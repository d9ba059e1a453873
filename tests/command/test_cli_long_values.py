"""``list`` and ``show`` with values far longer than a screen: each is shown cut, so the
output stays small whatever is stored (a title from before titles had a limit, an imported
event of megabytes)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.cli.render import CELL_CHARS, cut
from durable_sessions.sql.schema import sessions
from support.sql import STORE_SQL_BACKENDS

TITLE = "t" * 200_000
MYSQL_TITLE = "t" * 1024
"""The longest title a MySQL database holds (``prepare.MAX_TITLE_BYTES``): no MySQL database
is older than the limit."""
CONTENT = "word " * 1_000_000  # 5 MB of text in one event
DELTA = {"k": "v" * 100_000}


def title_of(engine: AsyncEngine) -> str:
    """The title ``long_session`` writes."""
    return MYSQL_TITLE if engine.dialect.name in ("mysql", "mariadb") else TITLE


async def long_session(engine: AsyncEngine) -> None:
    store = SQLStore(engine, max_value_bytes=None)
    session = await Manager(store).create("default", "alice", id="long", state={"big": CONTENT})
    await store.append_event("default", "long", Event("user", CONTENT, state_delta=DELTA))
    async with engine.begin() as conn:  # written before titles had a limit
        long_title = update(sessions).where(sessions.c.id == session.id)
        await conn.execute(long_title.values(title=title_of(engine)))


def lines_of(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_list_and_show_cut_long_values(
    engine: AsyncEngine, backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await long_session(engine)
    for argv in (["list"], ["show", "long"]):
        # The command runs its own event loop: in a thread of its own, off this test's loop.
        code = await asyncio.to_thread(main, ["--url", backend_url, *argv])
        out, err = capsys.readouterr()
        assert (code, err) == (0, ""), argv
        # Every long value is there, cut: its head and how much more there is.
        # (A table folds a long cell over lines: count its characters.) On MySQL the
        # title is never longer than the cut, and is shown whole.
        title = title_of(engine)
        cut_title = len(title) > CELL_CHARS
        assert min(len(title), CELL_CHARS) <= out.count("t") < min(len(title), CELL_CHARS) + 200
        if cut_title:
            assert f"… ({len(title) - CELL_CHARS:,} more characters)" in out
        if argv[0] == "show":
            # the title, two state values, the content and the delta
            assert out.count("more characters)") == 4 + cut_title
            assert "word word" in out
        # Nothing of a value past the cut reaches the output.
        assert len(out) < 20 * CELL_CHARS, argv
        assert max(map(len, lines_of(out))) <= 1000, argv


def test_cut_keeps_short_values_whole_and_says_how_much_is_left() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcd", 3) == "abc… (1 more character)"
    assert cut("é" * 5000) == "é" * CELL_CHARS + f"… ({5000 - CELL_CHARS:,} more characters)"
