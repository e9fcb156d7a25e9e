"""Markdown tables, written one way: report.md, plan.md and the fault table all use `table`.

A cell is escaped so that it cannot break its row: a `|` becomes `\\|` and a line break `<br>`
(GitHub-flavoured Markdown renders both inside a cell).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(text: str) -> str:
    """`text` safe inside one table cell."""
    return text.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a table: the header, the `|---|` rule, one line per row (cells escaped)."""
    out = [_row(header), "|" + "---|" * len(header)]
    out += [_row(row) for row in rows]
    return out


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell(c) for c in cells) + " |"
