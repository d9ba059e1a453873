"""Core statements compiled once per dialect, with their bind and result conversions."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.base import Executable

from ._private import returning_columns

__all__ = ["Compiled", "compile_statement"]

Processor = Callable[[Any], Any]


@dataclass(frozen=True, eq=False)
class Compiled:
    """One statement as the driver sees it: SQL text, positional binds, row decoding.

    The statement itself stays defined in SQLAlchemy Core; this is only its compiled form,
    made once, so that running it costs no compilation, cache lookup or type dispatch.
    """

    sql: str
    names: tuple[str, ...]
    constants: tuple[Any, ...]
    binders: tuple[Processor | None, ...]
    decoders: tuple[tuple[int, Processor], ...]
    row: Callable[..., Any] | None
    returns_rows: bool
    scalar: bool = False
    """Rows decode to the value of their one column, not to named tuples (``scalars``)."""

    def bind(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """Return the positional parameters for ``params``, converted for the driver."""
        out = []
        for name, constant, binder in zip(self.names, self.constants, self.binders, strict=True):
            value = params[name] if constant is _NO_VALUE else constant
            out.append(value if binder is None else binder(value))
        return tuple(out)

    def decode(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """Convert raw driver rows into named tuples of Python values (with ``scalar``,
        into the value of their one column)."""
        if self.row is None:
            return []
        make, decoders = self.row, self.decoders
        if self.scalar:
            if not decoders:
                return [r[0] for r in rows]
            ((_, decoder),) = decoders  # its one column's
            return [None if r[0] is None else decoder(r[0]) for r in rows]
        if not decoders:
            return [make(*r) for r in rows]
        out = []
        for raw in rows:
            values = list(raw)
            for index, decoder in decoders:
                if values[index] is not None:
                    values[index] = decoder(values[index])
            out.append(make(*values))
        return out


class _NoValue:
    def __repr__(self) -> str:
        return "<no value>"


_NO_VALUE: Any = _NoValue()


def compile_statement(statement: Executable, dialect: Dialect) -> Compiled:
    """Compile a Core statement for ``dialect`` into a ``Compiled``."""
    assert isinstance(statement, ClauseElement)
    compiled: Any = statement.compile(dialect=dialect)
    names = tuple(compiled.positiontup or ())
    constants: list[Any] = []
    binders: list[Processor | None] = []
    for name in names:
        bind = compiled.binds[name]
        # A literal (e.g. ``title == ""``) carries its value; a bindparam() waits for one.
        constants.append(_NO_VALUE if bind.value is None and not bind.callable else bind.value)
        binders.append(bind.type.dialect_impl(dialect).bind_processor(dialect))
    columns = list(getattr(statement, "selected_columns", None) or ())
    if not columns and returning_columns(statement):
        columns = list(getattr(statement, "exported_columns"))  # noqa: B009
    decoders: list[tuple[int, Processor]] = []
    for index, column in enumerate(columns):
        processor = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if processor is not None:
            decoders.append((index, processor))
    keys = [
        getattr(c, "key", None) or getattr(c, "name", None) or f"c{i}"
        for i, c in enumerate(columns)
    ]
    row = namedtuple("Row", keys, rename=True) if columns else None
    return Compiled(
        sql=compiled.string,
        names=names,
        constants=tuple(constants),
        binders=tuple(binders),
        decoders=tuple(decoders),
        row=row,
        returns_rows=bool(columns),
    )
