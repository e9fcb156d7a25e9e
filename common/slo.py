"""A latency target on an agent's time, as `make plan SLO=` and `make bench REGIME=search SLO=`
write it: `p<q>:<value>s` (the q-th percentile at most that many seconds, `p90:120s`; a bare
number is seconds) or `p<q>:<factor>x` (at most `factor` times the reference arm's q-th
percentile at its lowest measured level: "an agent in the fleet may take at most twice as long
as alone", `p90:2x`).

The grammar's one home: the bench (which must not import the plan) and the plan
(plan/settings.py, which raises its own error type) both read an SLO here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compaction_bench.common.errors import SuiteError

_SLO = re.compile(r"^p(\d+(?:\.\d+)?):(\d+(?:\.\d+)?)(s|x)?$")


class SloError(SuiteError, ValueError):
    """An SLO that is not a latency target; the message names the value and the fix."""


@dataclass(frozen=True)
class Slo:
    """A latency target: the `quantile` of the times at most `value` seconds, or `value` times
    the reference's quantile alone when `relative`."""

    quantile: float  # 0 < q < 1
    value: float
    relative: bool

    @property
    def label(self) -> str:
        q = f"p{100 * self.quantile:g}"
        return f"{q} ≤ {self.value:g}x alone" if self.relative else f"{q} ≤ {self.value:g} s"

    @property
    def text(self) -> str:
        return f"p{100 * self.quantile:g}:{self.value:g}{'x' if self.relative else 's'}"


def parse_slo(text: str, name: str = "SLO") -> Slo:
    """`p90:120s`, `p90:120` (seconds) or `p90:2x`; raises SloError naming the value."""
    found = _SLO.match(text.strip())
    if not found:
        raise SloError(f"{name}={text!r} is not a latency target; write "
                       f"p<percentile>:<seconds>s ({name}=p90:120s) or p<percentile>:<factor>x "
                       f"({name}=p90:2x: twice the time alone)")
    percentile, value, unit = float(found[1]), float(found[2]), found[3] or "s"
    if not 0 < percentile < 100:
        raise SloError(f"{name}={text!r}: the percentile must lie between 0 and 100 exclusive "
                       "(p50, p90, p99)")
    if value <= 0 or (unit == "x" and value < 1):
        raise SloError(f"{name}={text!r}: the target must be positive seconds, or a factor of "
                       "at least 1x")
    return Slo(quantile=percentile / 100, value=value, relative=unit == "x")
