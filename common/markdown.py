"""Markdown tables, written one way: report.md, plan.md and the fault table all use `table`.

A cell is escaped so that it cannot break its row: a `|` becomes `\\|` and a line break `<br>`
(GitHub-flavoured Markdown renders both inside a cell). A figure is written by `number`,
`figure` (a plan's: thousands grouped, small money in significant digits) or `percent`, which
show a missing one (None or NaN) the same way everywhere: `MISSING`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

MISSING = "-"  # a figure that does not exist (not measured, not defined), in every table


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value: float | None, digits: int = 2) -> str:
    """`value` with `digits` decimals, or `MISSING`."""
    return MISSING if value is None or _missing(value) else f"{value:.{digits}f}"


def figure(value: float | None, digits: int = 2) -> str:
    """`value` as a plan shows it: like `number`, with thousands grouped and no decimals from
    1,000 up, an amount smaller than half the last decimal (money per task) in three
    significant digits rather than zeros, and an infinite one as `inf`; or `MISSING`."""
    if value is None or _missing(value):
        return MISSING
    if math.isinf(value):
        return "inf"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if 0 < abs(value) < 10 ** -digits * 5:
        return f"{value:.3g}"
    return f"{value:.{digits}f}"


def percent(value: float | None, digits: int = 1, *, fraction: bool = False,
            sign: bool = False) -> str:
    """`value` in percent (`fraction`: given as a fraction, 0.25 -> 25%; `sign`: +/-), or
    `MISSING`."""
    if value is None or _missing(value):
        return MISSING
    shown = 100.0 * value if fraction else value
    return f"{shown:{'+' if sign else ''}.{digits}f}%"


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
