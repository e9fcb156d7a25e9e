"""The capacity search's decisions, as pure functions of measured levels (bench/run/search.py
runs the cells they ask for).

A level's SLO quantile: the agents' wall times (postfork plus inline rewriting) of the level's
measured continuations, failed ones counted as misses, ranked above every complete one (a
failed task gave the agent nothing, so a level where continuations fail never looks better
than one where they finish slowly; the plan does the same, plan/capacity.py):
- point: the Harrell-Davis q-quantile of the complete times at the rank that makes it the
  q-quantile of all of them; infinite when failures alone exceed the share 1 - q;
- interval: the distribution-free order-statistic interval of the q-quantile of all times
  (failures infinite): ranks l < u with P(l <= B < u) >= confidence for B ~ Binomial(n, q),
  exact coverage whatever the distribution; an end with no order statistic is 0 or infinite.
A level *holds* when its point is at most the limit; the verdict is *clear* when the interval
lies wholly on the verdict's side of the limit, and *uncertain* (it straddles) otherwise.

The search (`next_step`): probe 1, 2, 4, ... up to the maximum level while levels hold; bisect
between the largest level that held below the smallest one that failed; then confirm the two
levels of the boundary (lo, lo + 1) with more continuations, as their cells' next pass. Every
decision is taken from the latest pass of each level, so a confirmation that reverses a verdict
moves the boundary and the search goes on from there: down (bisecting below) or up (bisecting
or probing above). A level is probed at most once and confirmed at most once, so the search ends
after at most twice as many cells as there are levels up to the maximum. Noise that makes the
measured curve non-monotone cannot inflate the answer: the boundary is always below the
*smallest* failed level, whatever held above it.

The answer (`capacity`): the lower level of a confirmed boundary (0: not even one agent), or
"unbounded up to" the maximum level when it held there, confirmed (never a number). Its
interval runs from the largest level at or below it whose verdict was clear, to one below the
smallest level above it that failed clearly: the levels in between are those whose interval
straddles the limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import bdtr

from compaction_bench.common.resampling import quantile as hd_quantile

StepKind = Literal["probe", "bisect", "confirm", "done"]


@dataclass(frozen=True)
class Measure:
    """One level's SLO quantile from one pass of its cell (module docstring)."""

    n: int  # complete measured continuations
    failed: int  # failed measured continuations (misses)
    point_s: float  # inf: failures alone put it past any limit
    low_s: float  # the interval's ends (0 / inf where no order statistic bounds it)
    high_s: float

    @property
    def n_all(self) -> int:
        return self.n + self.failed


def order_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) of the order statistics bounding the q-quantile of n values with
    at least `confidence` coverage; l = 0 means no lower bound, u = n + 1 no upper bound."""
    alpha = (1.0 - confidence) / 2
    # lower: the largest l with P(B <= l - 1) <= alpha; upper: the smallest u with
    # P(B >= u) <= alpha, i.e. P(B <= u - 1) >= 1 - alpha
    ks = np.arange(n + 1)
    cdf = bdtr(ks, n, q)
    below = [k + 1 for k in ks if cdf[k] <= alpha]
    low = int(max(below)) if below else 0
    above = [k + 1 for k in ks if cdf[k] >= 1.0 - alpha]
    high = int(min(above)) if above else n + 1
    return low, high


def measure(times_s: Sequence[float], failed: int, q: float, confidence: float) -> Measure:
    """The q-quantile of a level's measured continuations: complete wall times and a count of
    failed ones (module docstring)."""
    done = np.sort(np.asarray(times_s, dtype=float))
    n, n_all = len(done), len(done) + failed
    if n_all == 0:
        raise ValueError("a level without measured continuations has no quantile")
    if n == 0 or failed > (1.0 - q) * n_all + 1e-9:
        point = math.inf
    else:
        # exact up to 1, as the plan's (plan.capacity Level.rank): the n / (n + 1) clamp read
        # p87.9 for p90 where the failed share neared 1 - q, so search and plan disagreed
        rank = min(1.0, q * n_all / max(n_all - failed, 1))
        point = float(hd_quantile(done, rank))
    everything = np.concatenate([done, np.full(failed, math.inf)])
    lo_rank, hi_rank = order_ranks(n_all, q, confidence)
    low = float(everything[lo_rank - 1]) if lo_rank >= 1 else 0.0
    high = float(everything[hi_rank - 1]) if hi_rank <= n_all else math.inf
    return Measure(n=n, failed=failed, point_s=point, low_s=low, high_s=high)


@dataclass(frozen=True)
class Verdict:
    held: bool
    clear: bool
    why: str


def verdict(m: Measure, limit_s: float, label: str) -> Verdict:
    """Whether a level holds under the limit, and whether its interval says so clearly."""
    held = m.point_s <= limit_s
    clear = m.high_s <= limit_s if held else m.low_s > limit_s
    if math.isinf(m.point_s):
        why = (f"{m.failed} of {m.n_all} continuations failed: a failure is a miss, so the "
               f"{label} is past any limit")
    else:
        why = (f"{label} {m.point_s:.3g} s {'<=' if held else '>'} limit {limit_s:.3g} s, "
               f"interval [{m.low_s:.3g}, {m.high_s:.3g}] s "
               + ("clear of it" if clear else "straddles it")
               + (f"; {m.failed} failed" if m.failed else ""))
    return Verdict(held=held, clear=clear, why=why)


@dataclass(frozen=True)
class Step:
    kind: StepKind
    level: int = 0


def next_step(held: Mapping[int, bool], confirmed: set[int], max_level: int) -> Step:
    """The search's next cell from each tested level's latest verdict (module docstring)."""
    failed = [n for n, ok in held.items() if not ok]
    hi = min(failed) if failed else None
    below = [n for n, ok in held.items() if ok and (hi is None or n < hi)]
    lo = max(below, default=0)
    if hi is None:
        if lo < max_level:
            return Step("probe", min(max(1, 2 * lo), max_level))
        return Step("done") if lo in confirmed else Step("confirm", lo)
    if hi - lo > 1:
        return Step("bisect", (lo + hi) // 2)
    for level in (lo, hi):
        if level >= 1 and level not in confirmed:
            return Step("confirm", level)
    return Step("done")


@dataclass(frozen=True)
class Capacity:
    """One arm's answer: `agents` meet the SLO (0: not even one); `unbounded`: it still held at
    the maximum level, so `agents` is that level and no capacity was found; the interval
    (`low`, `high`), `high` None where no level above failed clearly."""

    agents: int
    unbounded: bool
    low: int
    high: int | None

    @property
    def text(self) -> str:
        if self.unbounded:
            return f"unbounded up to {self.agents} agents (the SLO still held there)"
        span = (f"{self.low}-{self.high}" if self.high is not None else f">= {self.low}")
        return f"{self.agents} agents (interval {span})"

    def to_json(self) -> dict[str, object]:
        return {"agents": None if self.unbounded else self.agents,
                "unbounded_up_to": self.agents if self.unbounded else None,
                "interval": [self.low, self.high], "text": self.text}


def capacity(verdicts: Mapping[int, Verdict], max_level: int) -> Capacity:
    """The answer once `next_step` is done (module docstring)."""
    failed = [n for n, v in verdicts.items() if not v.held]
    hi = min(failed) if failed else None
    agents = max((n for n, v in verdicts.items() if v.held and (hi is None or n < hi)),
                 default=0)
    low = max((n for n, v in verdicts.items() if n <= agents and v.held and v.clear),
              default=0)
    clear_fail = [n for n, v in verdicts.items() if n > agents and not v.held and v.clear]
    high = min(clear_fail) - 1 if clear_fail else None
    return Capacity(agents=agents, unbounded=hi is None and agents >= max_level, low=low,
                    high=high)
