"""Reading a confined command's output while it streams: the first characters kept, a flood
or a command past its deadline killed with its whole tree (its PID namespace with it)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from dataclasses import dataclass

from compaction_bench.common.processtree import stop_tree


@dataclass(frozen=True)
class SandboxResult:
    output: str
    returncode: int
    timed_out: bool
    flooded: bool
    truncated: bool
    total_bytes: int
    duration_s: float


def collect(proc: subprocess.Popen[bytes], *, cap_chars: int, kill_bytes: int, deadline: float,
            started: float) -> SandboxResult:
    """Read `proc`'s merged output until it ends, passes `kill_bytes` or `deadline`; keep the
    first `cap_chars` characters. Never raises for what the command does."""
    assert proc.stdout is not None
    kept = bytearray()
    total, timed_out, flooded = 0, False, False
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None and not _readable(fd):
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        total += len(chunk)
        room = cap_chars * 4 - len(kept)
        if room > 0:
            kept += chunk[:room]
        if total > kill_bytes:
            flooded = True
            break
    # Past its limits there is nothing to save: the command's process group goes at once,
    # and with bwrap or unshare its PID namespace with it (its init dies), so nothing it
    # started survives.
    if timed_out or flooded:
        stop_tree(proc, grace_s=0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if proc.poll() is None:
        stop_tree(proc, grace_s=0)
    proc.stdout.close()
    text = kept.decode("utf-8", "replace")
    truncated = len(text) > cap_chars or total > len(kept)
    text = text[: cap_chars]
    code = -1 if timed_out or flooded else proc.returncode
    return SandboxResult(text, code, timed_out, flooded, truncated, total,
                         time.monotonic() - started)




def _readable(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)
