"""Timing one device operation: warm-up excluded, the device synchronized around the timer,
several repetitions kept with their spread.

Contract of `time_op(fn, device, ...)`:
- `warmup` calls run first and are never timed (first calls pay for allocation, kernel
  selection, JIT compilation, page faults).
- On CUDA each sample is bracketed by CUDA events on the current stream, with
  `torch.cuda.synchronize()` before the first event and after the last, so a sample is device
  time, not launch time. Before each sample an L2-sized buffer is overwritten (outside the
  events) when `flush_cache` is set, so a small weight matrix is read from HBM as it would be
  in a model whose weights do not fit in L2, not from the cache the previous call warmed.
- On the CPU each sample is `time.perf_counter()` around the call (PyTorch CPU operations
  return when done). No cache flush: the host's last-level cache is shared with other tenants
  and large (hundreds of MiB), and flushing it would cost more than most operations timed.
- A sample may cover `inner` back-to-back calls (divided out) so that operations of a few
  microseconds are not timed at the timer's resolution; `inner` is chosen from one calibration
  call so that a sample lasts about `target_sample_s`, and is recorded. With the cache flush
  on, `inner` stays 1 unless one call takes under 20 us (then the calls after the first in a
  sample find a warm L2: such an operation's figure is an L2 figure, and `inner` says so).

Every raw sample is kept: summaries (median, p10, p90) are computed from them afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

L2_FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 here (H100/H200 50 MB, B300 ~126 MB)


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = q * (len(sorted_values) - 1)
    low, high = math.floor(position), math.ceil(position)
    weight = position - low
    return sorted_values[low] * (1.0 - weight) + sorted_values[high] * weight


@dataclass(frozen=True)
class Timing:
    """Samples of one operation, seconds per call."""

    samples_s: tuple[float, ...]
    warmup: int
    inner: int
    timer: str  # "cuda-events" | "perf_counter"

    @property
    def median_s(self) -> float:
        return quantile(sorted(self.samples_s), 0.5)

    @property
    def p10_s(self) -> float:
        return quantile(sorted(self.samples_s), 0.1)

    @property
    def p90_s(self) -> float:
        return quantile(sorted(self.samples_s), 0.9)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread of the samples."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"samples_s": list(self.samples_s), "n": len(self.samples_s),
                "median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s,
                "spread": self.spread, "warmup": self.warmup, "inner": self.inner,
                "timer": self.timer}


class Stopwatch:
    """Times operations on one device (see the module docstring)."""

    def __init__(self, device: torch.device, *, warmup: int = 3, reps: int = 10,
                 target_sample_s: float = 0.002, flush_cache: bool = True) -> None:
        self.device = device
        self.warmup = warmup
        self.reps = reps
        self.target_sample_s = target_sample_s
        self.cuda = device.type == "cuda"
        self._flush: torch.Tensor | None = None
        if self.cuda and flush_cache:
            self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _one(self, fn: Callable[[], object], inner: int) -> float:
        if self.cuda:
            if self._flush is not None:
                self._flush.fill_(1.0)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0 / inner
        began = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - began) / inner

    def time(self, fn: Callable[[], object], *, reps: int | None = None,
             inner: int | None = None) -> Timing:
        """Time `fn` (see the module contract)."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        if inner is None:
            once = self._one(fn, 1)
            # a flushed cache makes repeated calls unrepresentative: one call per sample then,
            # unless the call is so short that event resolution (~1 us) would dominate
            wanted = self.target_sample_s / once if once > 0 else 1.0
            inner = 1 if (self._flush is not None and once > 20e-6) else max(
                1, min(1000, math.ceil(wanted)))
        samples = [self._one(fn, inner) for _ in range(reps or self.reps)]
        self.sync()
        return Timing(samples_s=tuple(samples), warmup=self.warmup, inner=inner,
                      timer="cuda-events" if self.cuda else "perf_counter")
