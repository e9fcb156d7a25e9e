"""Stopping a real process tree (common.processtree.stop_tree): children in the group, a
grandchild that left it, one that ignores SIGTERM, a group that outlives its leader."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from compaction_bench.common.processtree import alive, group_members, stop_tree

pytestmark = pytest.mark.e2e

# The root starts one child in its own group and one in a session of its own that ignores
# SIGTERM, prints their pids, then waits (or, with "exit", leaves them behind and ends).
ROOT = """
import signal, subprocess, sys, time
stay = [sys.executable, "-c", "import time; time.sleep(300)"]
deaf = [sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(300)"]
child = subprocess.Popen(stay)
away = subprocess.Popen(deaf, start_new_session=True, stdout=subprocess.PIPE, text=True)
away.stdout.readline()  # its SIGTERM handler is in place
print(child.pid, away.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(300)
"""


def _start(mode: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    root = subprocess.Popen([sys.executable, "-c", ROOT, mode], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert root.stdout is not None
    pids = [int(p) for p in root.stdout.readline().split()]
    root.stdout.close()  # it writes nothing more
    return root, [psutil.Process(p) for p in pids]


def test_the_whole_tree_goes_sigterm_first_then_sigkill_after_the_grace() -> None:
    root, (child, away) = _start("wait")
    started = time.monotonic()
    code = stop_tree(root, grace_s=1.0)
    took = time.monotonic() - started
    assert code == -signal.SIGTERM  # the root took the SIGTERM
    assert not alive([child, away])  # `away` ignored it and left the group: killed anyway
    assert 1.0 <= took < 15.0  # it waited out the grace for the deaf one
    assert not group_members(root.pid)
    assert stop_tree(root, grace_s=1.0) == code  # idempotent: nothing left to signal


def test_no_grace_kills_at_once() -> None:
    root, procs = _start("wait")
    started = time.monotonic()
    assert stop_tree(root, grace_s=0) == -signal.SIGKILL
    assert not alive(procs) and time.monotonic() - started < 10.0


def test_a_group_that_outlives_its_reaped_leader_is_stopped() -> None:
    root, (child, away) = _start("exit")
    assert root.wait(timeout=60) == 0  # the leader is gone and reaped; its child runs on
    assert alive([child]) and group_members(root.pid)
    assert stop_tree(root, grace_s=2.0) == 0
    assert not alive([child])
    assert alive([away])  # a session of its own and no longer known: left alone...
    stop_tree(away.pid, grace_s=0)  # ...so the test stops it itself, by pid
    assert not alive([away])
