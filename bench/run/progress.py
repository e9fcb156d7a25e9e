"""One status line on the terminal while a run goes: blocks done, arms running, requests waiting
on the server, elapsed and estimated remaining time."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints


def waiting_requests(url: str) -> float | None:
    try:
        with ServerEndpoints(url, timeout_s=2.0) as server:
            return server.metrics()["num_requests_waiting"]
    except EndpointError:
        return None


class Progress:
    """Prints a status line every `every_s` seconds from a thread; `update` is thread-safe."""

    def __init__(self, *, total_blocks: int, url: str, every_s: float = 5.0,
                 stream: TextIO = sys.stderr) -> None:
        self.total = total_blocks
        self.url = url
        self.every_s = every_s
        self.stream = stream
        self.done = 0
        self.running: set[str] = set()
        self.block_times: list[float] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="progress")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the line; safe when it never started (a run that failed before its first
        block must end with its own error, not this one's)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def arm_started(self, arm: str) -> None:
        with self._lock:
            self.running.add(arm)

    def arm_finished(self, arm: str) -> None:
        with self._lock:
            self.running.discard(arm)

    def block_finished(self, seconds: float) -> None:
        with self._lock:
            self.done += 1
            self.block_times.append(seconds)

    def line(self) -> str:
        with self._lock:
            elapsed = time.monotonic() - self._start
            left = self.total - self.done
            eta = (f"~{_fmt(left * sum(self.block_times) / len(self.block_times))} left"
                   if self.block_times else "remaining: after the first block")
            running = ", ".join(sorted(self.running)) or "-"
            done = self.done
        waiting = waiting_requests(self.url)
        shown = "?" if waiting is None else f"{waiting:.0f}"
        return (f"[bench] blocks {done}/{self.total} | arms running: {running} | "
                f"waiting on server: {shown} | elapsed {_fmt(elapsed)} | {eta}")

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.line(), file=self.stream, flush=True)


def _fmt(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
