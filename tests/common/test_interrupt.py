"""`interrupt_on`: the signals that stop `make serve` (one server or a fleet) as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from compaction_bench.common.interrupt import interrupt_on


def test_a_signal_inside_raises_keyboard_interrupt_and_the_old_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(KeyboardInterrupt, match="SIGHUP"), interrupt_on(signal.SIGTERM,
                                                                        signal.SIGHUP):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)  # the handler runs at the next bytecode, well before this ends
    assert signal.getsignal(signal.SIGHUP) is before


@pytest.mark.e2e
def test_a_child_signalled_before_its_exec_runs_on_without_a_traceback() -> None:
    # preexec_fn runs Python in the forked child with the parent's handlers: a SIGTERM there
    # (a terminal's Ctrl-C reaches the whole process group) must not raise in the child
    with interrupt_on(signal.SIGTERM):
        done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                              text=True, timeout=60, check=False,
                              preexec_fn=lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    assert "Exception ignored" not in done.stderr
