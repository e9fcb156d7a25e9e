"""How a run stops early, whatever asks it to: a signal (Ctrl-C, SIGTERM, SIGHUP), the
watchdog (a server that answers but no longer streams), or records that cannot be written.

The first request wins and acts at once: the reason is kept, the writer stops taking arm and
block records (an attempt cut short is not a result; its block has no block record, so
`RESUME` runs it again in full), every request in flight in this process is aborted, and the
main thread gets `KeyboardInterrupt` out of whatever it waits on. The runner's cleanup then
stops the background load, the compressors and the server it started. Further signals during
that cleanup are answered with one line and otherwise ignored, so a second Ctrl-C cannot leave
a vLLM or locust process behind.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from compaction_bench.common.errors import ExitCode
from compaction_bench.transport.client import abort_all

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class StopReason:
    message: str
    exit_code: ExitCode  # INTERRUPTED for signals, FAILED for the rest


class RunStop:
    """One per run; `stop` is safe from any thread and acts once."""

    def __init__(self, on_stop: Callable[[], None] = lambda: None) -> None:
        self.on_stop = on_stop  # the writer's cancel
        self.reason: StopReason | None = None
        self._lock = threading.Lock()
        self._raised = False  # KeyboardInterrupt delivered to the main thread once

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def stop(self, message: str, exit_code: ExitCode = ExitCode.FAILED, *,
             interrupt_main: bool = True) -> bool:
        """Stop the run for `message`; False when it was already stopping."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = StopReason(message, exit_code)
        self.on_stop()
        abort_all(message)
        if interrupt_main and threading.current_thread() is not threading.main_thread():
            _thread.interrupt_main()
        return True

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        """A KeyboardInterrupt reached the run's code: stop as a signal does (a no-op when a
        handler already stopped it, which is how most of them arrive)."""
        self.stop(f"interrupted ({exc or 'Ctrl-C'})", ExitCode.INTERRUPTED, interrupt_main=False)

    @contextmanager
    def signals(self, stream: TextIO | None = None) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP stop the run (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        out = stream if stream is not None else sys.stderr
        # A child forked with Python code to run before its exec (subprocess's preexec_fn: the
        # agent's box sets its limits so) inherits these handlers, and a terminal's Ctrl-C
        # reaches it while it is still in the run's process group. There a handler would stop
        # a copy of the run and raise KeyboardInterrupt inside the child's fork hooks, which
        # Python prints as an "Exception ignored" traceback (CI, 2026-12-07: the fault table's
        # SIGINT row). The handlers act only in the process that installed them.
        owner = os.getpid()

        def handle(signum: int, frame: FrameType | None) -> None:
            if os.getpid() != owner:
                return
            # also reached through interrupt_main() when another thread stopped the run
            name = signal.Signals(signum).name
            self.stop(f"interrupted ({name})", ExitCode.INTERRUPTED, interrupt_main=False)
            if not self._raised:
                self._raised = True
                raise KeyboardInterrupt(name)
            print(f"[bench] {name}: already stopping; cleaning up the server and the load, "
                  "records are kept", file=out, flush=True)

        def already(signum: int, frame: FrameType | None) -> None:
            if os.getpid() != owner:
                return
            print(f"[bench] {signal.Signals(signum).name}: already stopping; the records are "
                  "kept", file=out, flush=True)

        previous = {s: signal.signal(s, handle) for s in SIGNALS}
        try:
            yield
        finally:
            # once stopping, a signal that lands after these handlers (the last lines the
            # process prints) is answered, never a KeyboardInterrupt traceback
            for sig, handler in previous.items():
                signal.signal(sig, already if self.stopped else handler)
