"""How the CLI prints (docs/cli.md): one console for standard output and one for errors, the colour
of each status, and listings that never cut an id a user must copy.

Piped output (not a terminal) is not wrapped at all, unless COLUMNS asks for a width: a script or
`grep` reads whole lines, not Rich's default of 80 columns. On a terminal, a listing whose ids do not
fit its width is printed as one block per item instead of a table that would cut them."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Column, Table

# Wide enough for any line the CLI prints; Rich pads nothing to the console's width in a table
# that does not expand, so the number costs nothing.
UNWRAPPED = 1 << 16
# A column that is not an id is given at least this many characters (or its own width, when less)
# before the table is judged too wide; below it the table is printed as blocks.
MIN_TEXT_WIDTH = 8

STATUS_STYLE = {
    "succeeded": "green",
    "processed": "green",
    "failed": "red",
    "error": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "queued": "blue",
}


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNWRAPPED)


out = _console(stderr=False)
err = _console(stderr=True)


def status_text(status: str) -> str:
    """A job's, fine-tune's or file's status in its colour (one palette for every command)."""
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def listing(*headers: str, ids: tuple[str, ...] = ("id",), title: str | None = None) -> Table:
    """A table whose ``ids`` columns are never wrapped nor cut; the others fold when they must."""
    columns = [Column(h, no_wrap=True) if h in ids else Column(h, overflow="fold") for h in headers]
    return Table(*columns, title=title, title_justify="left")


def _width(column: Column) -> int:
    return max(out.measure(cell).maximum for cell in (column.header, *column.cells))


def fits(table: Table, width: int) -> bool:
    """Whether ``table`` fits ``width`` with its unwrapped columns whole and the others readable."""
    borders = 3 * len(table.columns) + 1  # a border and two spaces of padding per column, one edge
    needed = sum(_width(c) if c.no_wrap else min(_width(c), MIN_TEXT_WIDTH) for c in table.columns)
    return needed + borders <= width


def show(table: Table) -> None:
    """``table`` as a table where it fits the console, else as one block per row: its first column
    as the heading, then each other non-empty cell under its header."""
    if fits(table, out.width):
        out.print(table)
        return
    if table.title:
        out.print(table.title)
    columns = [(str(c.header), [str(cell) for cell in c.cells]) for c in table.columns]
    label = max(len(header) for header, _ in columns[1:]) if len(columns) > 1 else 0
    for row in range(table.row_count):
        out.print(f"[bold]{columns[0][1][row]}[/]", soft_wrap=True, highlight=False)
        for header, cells in columns[1:]:
            if cells[row]:
                out.print(f"  {header:<{label}}  {cells[row]}", soft_wrap=True, highlight=False)
