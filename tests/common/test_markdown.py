"""Figures in every table: one way to write a number, a percentage and a missing figure."""

from __future__ import annotations

import math

from compaction_bench.common.markdown import MISSING, number, percent, table


def test_a_missing_figure_reads_the_same_in_every_table() -> None:
    for value in (None, math.nan):
        assert number(value) == percent(value) == percent(value, fraction=True) == MISSING
    assert number(2.345) == "2.35" and number(7, 0) == "7" and number(0.0, 1) == "0.0"


def test_percentages_from_percents_or_fractions_with_or_without_a_sign() -> None:
    assert percent(12.34) == "12.3%" and percent(0.25, 0, fraction=True) == "25%"
    assert percent(-3.0, 1, sign=True) == "-3.0%" and percent(3.0, 1, sign=True) == "+3.0%"
    assert percent(0.0, 0, fraction=True, sign=True) == "+0%"


def test_a_cell_cannot_break_its_row() -> None:
    assert table(["a"], [["x|y\nz"]]) == ["| a |", "|---|", "| x\\|y<br>z |"]
