"""One micro-benchmark measurement: what was timed, the work it does, its samples, and how
close it came to the device's physical limits.

`fraction_of_roofline` is the attainable time over the measured median: the attainable time of
an operation doing F FLOPs and moving B bytes is max(F / peak FLOP/s, B / peak bytes/s), so a
fraction of 1 means the operation ran at whichever limit binds it; it equals the larger of the
two single fractions. Standard library and the stopwatch only (the device check imports it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from compaction_bench.common.markdown import percent
from compaction_bench.kernels.limits import DeviceLimits
from compaction_bench.kernels.stopwatch import Timing


@dataclass(frozen=True)
class Measurement:
    """One timed operation. `status` is 'ok', or 'unsupported' with a `reason` (fp8 on a CPU)."""

    bench: str  # bandwidth, matmul, peak_matmul, attention_prefill/decode, kv_gather, entropy
    name: str
    impl: str  # torch | triton
    dtype: str | None
    params: dict[str, Any]
    flops: float
    bytes: float
    timing: Timing | None = None
    limit_flops: float | None = None
    limit_bytes: float | None = None
    status: str = "ok"
    reason: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return self.timing.median_s if self.timing is not None else None

    def _rate(self, amount: float) -> float | None:
        median = self.median_s
        return amount / median if median and amount > 0 else None

    @property
    def flops_per_s(self) -> float | None:
        return self._rate(self.flops)

    @property
    def bytes_per_s(self) -> float | None:
        return self._rate(self.bytes)

    @property
    def fraction_flops(self) -> float | None:
        rate = self.flops_per_s
        return rate / self.limit_flops if rate is not None and self.limit_flops else None

    @property
    def fraction_bytes(self) -> float | None:
        rate = self.bytes_per_s
        return rate / self.limit_bytes if rate is not None and self.limit_bytes else None

    @property
    def fraction_of_roofline(self) -> float | None:
        parts = [f for f in (self.fraction_flops, self.fraction_bytes) if f is not None]
        return max(parts) if parts else None

    @property
    def bound(self) -> str | None:
        """Which limit binds at the roofline: 'flops' or 'bytes' (None without limits)."""
        flops, bytes_ = self.fraction_flops, self.fraction_bytes
        if flops is None and bytes_ is None:
            return None
        return "flops" if (flops or 0.0) >= (bytes_ or 0.0) else "bytes"

    def with_limits(self, limits: DeviceLimits | None) -> Measurement:
        """This measurement held against `limits` (FLOP/s of its dtype, memory bandwidth)."""
        if limits is None:
            return self
        flops_limit = limits.flops(self.dtype) if self.dtype and self.flops > 0 else None
        return dataclasses.replace(self, limit_flops=flops_limit,
                                   limit_bytes=limits.hbm_bytes_per_s if self.bytes > 0 else None)

    def to_json(self) -> dict[str, Any]:
        return {"bench": self.bench, "name": self.name, "impl": self.impl, "dtype": self.dtype,
                "params": dict(self.params), "flops": self.flops, "bytes": self.bytes,
                "status": self.status, "reason": self.reason,
                "timing": self.timing.to_json() if self.timing is not None else None,
                "flops_per_s": self.flops_per_s, "bytes_per_s": self.bytes_per_s,
                "limit_flops_per_s": self.limit_flops, "limit_bytes_per_s": self.limit_bytes,
                "fraction_flops": self.fraction_flops, "fraction_bytes": self.fraction_bytes,
                "fraction_of_roofline": self.fraction_of_roofline, "bound": self.bound,
                "notes": dict(self.notes)}


def _si(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _pct(value: float | None) -> str:
    return percent(value, 1, fraction=True)


# shown in the results file, left out of the table
_UNSHOWN = {"model", "heads", "kv_heads", "head_dim", "blocks"}
HEADER = (f"{'bench':<18} {'what':<44} {'dtype':<5} {'median':>9} {'spread':>7} "
          f"{'FLOP/s':>11} {'bytes/s':>11} {'%FLOP':>6} {'%BW':>6}")


def row(m: Measurement) -> str:
    """One table line: median time, relative spread (p90-p10)/median, rates and fractions."""
    shown = {k: v for k, v in m.params.items() if k not in _UNSHOWN}
    what = " ".join([m.name, *(f"{k}={v}" for k, v in shown.items())])
    if m.status != "ok":
        return f"{m.bench:<18} {what[:44]:<44} {m.dtype or '-':<5} {m.status}: {m.reason}"
    spread = f"{100.0 * m.timing.spread:.0f}%" if m.timing is not None else "-"
    return (f"{m.bench:<18} {what[:44]:<44} {m.dtype or '-':<5} {_duration(m.median_s):>9} "
            f"{spread:>7} {_si(m.flops_per_s, 'F'):>11} {_si(m.bytes_per_s, 'B'):>11} "
            f"{_pct(m.fraction_flops):>6} {_pct(m.fraction_bytes):>6}")
