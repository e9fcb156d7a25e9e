"""One home for a sampler's heartbeat: a daemon thread calling `tick` at once and then every
`interval_s` of an injected clock, on a fixed grid (after a slow tick it skips ahead instead of
bursting). `stop()` is idempotent and returns after the last tick has finished."""

from __future__ import annotations

import threading
from collections.abc import Callable

from compaction_bench.common.timing import Clock


class Periodic:
    """The heartbeat of the telemetry samplers (module docstring)."""

    def __init__(self, tick: Callable[[], object], *, interval_s: float, clock: Clock,
                 name: str) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_due = self.clock()
        while not self._stop.is_set():
            self.tick()
            next_due = max(next_due + self.interval_s, self.clock())
            self._stop.wait(max(0.0, next_due - self.clock()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
