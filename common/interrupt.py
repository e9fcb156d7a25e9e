"""Signals that stop a foreground command as Ctrl-C does, one way for every command that waits
on its children (`make serve`, one server or a fleet; the bench has its own stop, which also
records why: bench/run/stop.py).

`interrupt_on(SIGTERM, SIGHUP)` turns those signals into KeyboardInterrupt in the process that
entered it, so one `except KeyboardInterrupt` stops the children whatever ended the command, and
restores the previous handlers on the way out. A child forked with Python code to run before its
exec (subprocess's `preexec_fn`) inherits the handlers while that code runs; there they do
nothing, since a KeyboardInterrupt inside a fork hook is printed as an "Exception ignored"
traceback (CI, 2026-12-07).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """While inside, each of `signals` raises KeyboardInterrupt in this process (module
    docstring); off the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a run there has its own
        return
    owner = os.getpid()

    def handle(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == owner:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
