"""Rich tables whose figures stay whole at any terminal width from 80 columns up: rich shrinks the wrappable
columns of a table too wide for the terminal and folds or cuts what no longer fits ("3.7…", "1.4" / "20").

whole_words(table): every column wraps at spaces only, never inside a word: its min_width is its longest word (a
figure such as 1.420 or "[1.380," is one word; a name longer than LONGEST_FIGURE folds). Call it once the rows
are in."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text

# a word longer than this is a name or a path, not a figure: it may fold (else one run name widens the table past
# the terminal, which then cuts every row)
LONGEST_FIGURE = 16


def _words(cell) -> list[str]:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(cell).plain if isinstance(cell, str) else ""
    return text.split()


def whole_words(table: Table) -> Table:
    """`table` with each column wrapping at spaces and at least as wide as its longest word (returned)."""
    for column in table.columns:
        words = [w for cell in column.cells for w in _words(cell)] + _words(column.header)
        column.no_wrap = False
        column.overflow = "fold"
        column.min_width = max([len(w) for w in words if len(w) <= LONGEST_FIGURE], default=1)
    return table
