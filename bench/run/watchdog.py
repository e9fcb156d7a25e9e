"""The watchdog: notices a server that still answers `/health` but no longer streams.

Per-request inactivity deadlines (STREAM_DEADLINE, COMPRESSOR_DEADLINE) end one stalled
request; the watchdog ends the run when the whole server has stalled, so a run does not spend
every remaining block failing arms one deadline at a time. Stalled means: requests of this
process are in flight, no data reached any of them, the server's own generation counter
(`vllm:generation_tokens_total` through the metrics sampler, where it exports one) has not moved,
both for `stall_s`, and `/health` still answers (a server that stopped answering is the
runner's other check, with its own message).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from compaction_bench.loadgen.metrics import MetricsSampler
from compaction_bench.transport.client import activity

CHECK_S = 1.0


class Watchdog:
    def __init__(self, url: str, stall_s: float, on_stall: Callable[[str], None], *,
                 healthy: Callable[[str], bool], sampler: MetricsSampler | None = None) -> None:
        self.url = url
        self.stall_s = stall_s
        self.on_stall = on_stall
        self.healthy = healthy
        self.sampler = sampler
        self._generated: float | None = None
        self._generated_t = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def _server_progress(self) -> float:
        """When the server's generation counter last moved (or when we started watching)."""
        latest = self.sampler.latest if self.sampler is not None else None
        value = latest.get("generation_tokens") if latest else None
        if value is not None and value != self._generated:
            self._generated, self._generated_t = value, time.monotonic()
        return self._generated_t

    def stalled(self) -> str | None:
        """The reason the server counts as stalled now, or None."""
        in_flight, last_data = activity()
        progress = max(last_data, self._server_progress())
        silent = time.monotonic() - progress
        if in_flight == 0 or silent < self.stall_s:
            return None
        if not self.healthy(self.url):
            return None
        return (f"the server at {self.url} answers /health but streamed nothing for "
                f"{silent:.0f} s with {in_flight} request(s) in flight (STALL_S={self.stall_s:g})"
                "; restart it (`make stop`, `make serve`)")

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            reason = self.stalled()
            if reason is not None:
                self.on_stall(reason)
                return

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
