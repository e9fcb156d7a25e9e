"""GPU time and energy per continuation where no sweep says how many agents shared the GPU.

In a regime run the arms share the server with each other and with background users, so a
continuation's share of the GPU is attributed from the request records: at every instant the
engine's time (and, with NVML, its power) is split equally among the requests in flight, from
every source (arms, their compressors, background), and a continuation is charged the share of
its own requests and its compressor's. Time with no request in flight (tools, validation) is
charged to nobody: the GPU is idle then, and a full fleet would fill it. This is processor
sharing, an approximation: a long prefill and a decode step are not equal work. Evaluated on a
grid of `STEP_S` seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from compaction_bench.transport.request import RequestRecord

STEP_S = 0.05


@dataclass(frozen=True)
class Share:
    """What one continuation's requests were charged: GPU-seconds (per GPU of the replica:
    multiply by its GPUs for GPU-seconds of the whole replica) and joules (None without
    power samples)."""

    gpu_s: float
    joules: float | None


class Attribution:
    """The in-flight count (and power) on a grid over a run's requests (module docstring)."""

    def __init__(self, requests: Iterable[RequestRecord],
                 power: Sequence[tuple[float, float]] | None = None, step_s: float = STEP_S
                 ) -> None:
        spans = [(r.sent_s, r.end_s) for r in requests if r.end_s is not None
                 and r.end_s > r.sent_s]
        self.step_s = step_s
        self.start = min((s for s, _ in spans), default=0.0)
        end = max((e for _, e in spans), default=0.0)
        cells = max(1, int(np.ceil((end - self.start) / step_s)) + 1)
        change = np.zeros(cells + 1)
        for s, e in spans:  # +1 where a request starts, -1 where it ends (grid cells)
            change[self._cell(s)] += 1
            change[self._cell(e)] -= 1
        self.in_flight = np.cumsum(change)[:cells]
        self.power: np.ndarray | None = None
        if power:
            times = self.start + step_s * (np.arange(cells) + 0.5)
            t, w = zip(*power, strict=True)
            self.power = np.interp(times, np.asarray(t), np.asarray(w))

    def _cell(self, t: float) -> int:
        return max(0, int((t - self.start) / self.step_s))

    def share(self, requests: Iterable[RequestRecord]) -> Share:
        """The share of `requests` (one continuation's, its compressor's included)."""
        gpu_s, joules = 0.0, 0.0
        for r in requests:
            if r.end_s is None or r.end_s <= r.sent_s:
                continue
            lo, hi = self._cell(r.sent_s), self._cell(r.end_s)
            count = np.maximum(self.in_flight[lo:hi], 1.0)
            gpu_s += float(np.sum(self.step_s / count))
            if self.power is not None:
                joules += float(np.sum(self.power[lo:hi] * self.step_s / count))
        return Share(gpu_s=gpu_s, joules=joules if self.power is not None else None)


RequestKey = tuple[str, int, str, int, str]


def request_key(record: RequestRecord) -> RequestKey | None:
    """(regime, block, arm, pass, attempt) of an experimental request (a compressor request
    counts as its arm's), None for background and probe requests."""
    if record.block is None or record.source in ("background", "probe", ""):
        return None
    return (record.regime, record.block, record.source.split("/", 1)[0],
            int(record.labels.get("block_pass") or 1),
            str(record.labels.get("attempt") or "original"))


def continuation_requests(requests: Iterable[RequestRecord]
                          ) -> dict[RequestKey, list[RequestRecord]]:
    """Experimental requests by `request_key`."""
    out: dict[RequestKey, list[RequestRecord]] = {}
    for r in requests:
        key = request_key(r)
        if key is not None:
            out.setdefault(key, []).append(r)
    return out
