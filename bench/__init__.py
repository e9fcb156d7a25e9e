"""Experiments on a serving stack and their analysis: blocks, regimes, records, reports."""
