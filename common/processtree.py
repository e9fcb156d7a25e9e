"""Stopping a process and everything it started: one way for every child the suite runs.

The suite starts its children in sessions of their own (`start_new_session=True`): a vLLM
server and its engine processes, the locust master and its workers, the fake engine, an agent's
command in its box, a bench under the fault harness. `stop_tree` stops one as a tree: SIGTERM to
its process group and to every descendant known before the first signal (a descendant that
started a session of its own has left the group but not the tree), a grace period for all of
them to exit, then SIGKILL to whatever is left, and the child reaped, so nothing it started
keeps a port, a GPU or a file open, and no zombie stays behind. A grace of 0 kills at once
(an agent command past its time limit, a bench past the harness's). Processes that a fault row
kills on purpose are not stopped through here: there the signal is the fault being injected.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

import psutil

KILL_WAIT_S = 10.0  # after SIGKILL: only a process stuck in the kernel takes longer
POLL_S = 0.1


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants, as they are now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of `procs` that still run (zombies excluded)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def stop_tree(process: subprocess.Popen[Any] | int, *, grace_s: float = 10.0,
              pgid: int | None = None, kill_wait_s: float = KILL_WAIT_S) -> int | None:
    """Stop `process` and its tree (module docstring); idempotent.

    `process` is our child (then it is reaped and its exit code returned) or the pid of a
    process that is not (a server recorded in a pid file by another shell; None is returned).
    `pgid` is its process group, by default its own pid (it leads the session it was started
    in). The group is signalled even when the process itself has already exited: what it
    started may still run (locust workers outlive their master).
    """
    child = process if isinstance(process, subprocess.Popen) else None
    pid = process.pid if isinstance(process, subprocess.Popen) else process
    group = pid if pgid is None else pgid
    if child is not None and child.returncode is not None:
        # Reaped already: its pid may belong to another process by now, so only its group is
        # signalled, and only while a member runs (the kernel does not reuse the pid of a
        # live process group).
        known = []
        if not group_members(group):
            return child.returncode
    else:
        known = process_tree(pid)
    phases = [(signal.SIGTERM, grace_s)] if grace_s > 0 else []
    for sig, wait_s in [*phases, (signal.SIGKILL, kill_wait_s)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
        for p in _outside(alive(known), group):  # the group's members have it already: a
            with contextlib.suppress(psutil.Error):  # second SIGTERM can cut a clean exit short
                p.send_signal(sig)
        if _gone(child, known, group, time.monotonic() + wait_s):
            break
    if child is None:
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=kill_wait_s)
    return child.returncode


def _outside(procs: list[psutil.Process], group: int) -> list[psutil.Process]:
    """The processes of `procs` that are not in process group `group`."""
    out = []
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) != group:
                out.append(p)
    return out


def _gone(child: subprocess.Popen[Any] | None, known: list[psutil.Process], group: int,
          deadline: float) -> bool:
    """Wait until every known process and the whole group have exited (True) or the deadline
    passes (False), reaping our child as soon as it exits."""
    while True:
        if child is not None:
            child.poll()
        if not alive(known) and not group_members(group):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
