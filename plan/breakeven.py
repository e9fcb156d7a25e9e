"""Break-even uses of one compacted history, as the study defines them (Appendix E.1).

A compacted history costs a one-time rewrite (time T_R, cost C_R) and then saves, on every
continuation from it, the matched difference against clean: n uses recover the rewrite when
n (T_C - T_K) > T_R, and its cost when n (C_C - C_K) > C_R. As in the study the per-use saving
is the mean of matched differences (pairs: the same block in a regime run; the same level,
agent and continuation number in a sweep, which share a sampling seed). T_K is the compact
arm's postfork time plus the rewriting it did during the continuation (`rewrite_s`, paid on every
use); T_R is the arm file's fork-prefix compaction (`fork_rewrite_s`).

The break-even is T_R / saving uses (continuous, the study's "threshold"), and the first whole
number of uses past it. Intervals come from a bootstrap over pairs; a resample whose saving is
not positive has no finite break-even, so the upper end may be infinite, and
P(saving <= 0) is the share of such resamples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from compaction_bench.common.resampling import MIN_UNITS_FOR_INTERVAL, interval, replicates
from compaction_bench.plan.observations import Continuation

AMORTIZED_USES = (1, 2, 3, 5, 10)


@dataclass(frozen=True)
class BreakEven:
    """One arm's break-even under one condition, in one quantity (time or cost)."""

    arm: str
    condition: str
    quantity: str  # time | cost
    unit: str  # s | USD | GPU-s
    n_pairs: int
    reference_mean: float | None
    arm_mean: float | None
    saving: float | None  # mean per-use saving
    saving_ci: tuple[float, float] | None
    p_no_saving: float | None
    one_time: float | None  # T_R or C_R; None: not recorded
    uses: float | None  # T_R / saving; inf: no finite break-even; None: T_R unknown
    uses_ci: tuple[float | None, float | None] | None
    uses_whole: int | None  # the first whole number of uses that recovers it
    serial: float | None  # T_K + T_R: one use paying the whole rewrite
    amortized: dict[int, float] = field(default_factory=dict)  # T_K + T_R / n
    note: str = ""
    curve: list[tuple[int, float, float, float]] = field(default_factory=list)
    # (uses, net saving n*s - T_R, interval low, high): the break-even plot

    @property
    def uses_per_unit(self) -> float | None:
        """Uses per unit of one-time cost (1 / saving): the break-even for any T_R."""
        return 1 / self.saving if self.saving and self.saving > 0 else None


def pairs(reference: Sequence[Continuation], arm: Sequence[Continuation]
          ) -> list[tuple[Continuation, Continuation]]:
    """Matched (reference, arm) continuations, both complete (module docstring)."""
    by_key = {c.pair_key: c for c in reference if c.complete}
    return [(by_key[c.pair_key], c) for c in arm if c.complete and c.pair_key in by_key]


def _one_time(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def break_even(arm: str, condition: str, quantity: str, unit: str,
               matched: list[tuple[float, float]], one_time: float | None, *, b: int,
               confidence: float, rng: np.random.Generator, note: str = "",
               max_uses: int = 10) -> BreakEven:
    """The break-even from matched (reference, arm) per-use values and the one-time cost."""
    n = len(matched)
    if n == 0:
        return BreakEven(arm, condition, quantity, unit, 0, None, None, None, None, None,
                         one_time, None, None, None, None, note=note or "no matched pairs")
    if n < MIN_UNITS_FOR_INTERVAL:  # a bootstrap of one or two pairs says nothing
        note = "; ".join(filter(None, [note, f"{n} pair(s): too few for an interval"]))
    ref = np.array([r for r, _ in matched])
    own = np.array([a for _, a in matched])
    diff = ref - own
    saving = float(diff.mean())
    reps = replicates(diff, rng, "mean", b)
    lo, hi = interval(reps, confidence)
    uses = uses_ci = whole = None
    if one_time is not None:
        uses = _uses(one_time, saving)
        u_lo, u_hi = interval([_uses(one_time, s) for s in reps], confidence)
        uses_ci = (u_lo, None if math.isinf(u_hi) else u_hi)
        whole = None if math.isinf(uses) else math.floor(uses) + 1
    serial = float(own.mean() + one_time) if one_time is not None else None
    amortized = ({k: float(own.mean() + one_time / k) for k in AMORTIZED_USES}
                 if one_time is not None else {})
    curve = []
    if one_time is not None:
        for k in range(0, max_uses + 1):
            c_lo, c_hi = interval(k * reps - one_time, confidence)
            curve.append((k, k * saving - one_time, c_lo, c_hi))
    if n < MIN_UNITS_FOR_INTERVAL:
        return BreakEven(arm, condition, quantity, unit, n, float(ref.mean()),
                         float(own.mean()), saving, None, None, one_time, uses, None, whole,
                         serial, amortized, note, [(k, v, v, v) for k, v, _, _ in curve])
    return BreakEven(arm, condition, quantity, unit, n, float(ref.mean()), float(own.mean()),
                     saving, (lo, hi), float(np.mean(reps <= 0)), one_time, uses, uses_ci,
                     whole, serial, amortized, note, curve)


def _uses(one_time: float, saving: float) -> float:
    if saving <= 0:
        return math.inf
    return one_time / saving


Cost = Callable[[Continuation], float | None]


def time_and_cost(arm: str, condition: str, reference: Sequence[Continuation],
                  compact: Sequence[Continuation], *, cost: Cost | None, one_time_cost: float
                  | None, cost_unit: str, cost_note: str, b: int, confidence: float,
                  rng: np.random.Generator) -> list[BreakEven]:
    """The time break-even, and the cost one where `cost` prices a continuation."""
    matched = pairs(reference, compact)
    rewrite = _one_time([c.fork_rewrite_s for c in compact])
    note = "" if rewrite is not None else (
        "the one-time rewrite time (T_R) was not recorded: the break-even for a rewrite of "
        "T_R seconds is T_R / saving uses")
    if any(c.rewrite_s is None for _, c in matched):
        note += ("; " if note else "") + ("rewriting during the continuation was not recorded: "
                                          "T_K is postfork time alone")
    found = [break_even(arm, condition, "time", "s", [(r.cycle_s, a.cycle_s) for r, a in matched],
                        rewrite, b=b, confidence=confidence, rng=rng, note=note)]
    if cost is None:
        found.append(break_even(arm, condition, "cost", cost_unit, [], None, b=b,
                                confidence=confidence, rng=rng, note=cost_note))
        return found
    priced = [(cost(r), cost(a)) for r, a in matched]
    known = [(r, a) for r, a in priced if r is not None and a is not None]
    if len(known) < len(priced):  # a subset would select the uses that needed no rewriting
        known = []
        cost_note = cost_note or "some uses could not be priced"
    found.append(break_even(arm, condition, "cost", cost_unit, known, one_time_cost, b=b,
                            confidence=confidence, rng=rng, note=cost_note))
    return found
