"""Where a measurement came from: the checkout's git commit, package versions, the host.

Standard library only, so that scripts which must run with nothing but PyTorch installed (the
GPU device check) can stamp their results the same way the bench stamps its manifests.
Every function returns plain JSON-ready values and never raises: a fact it cannot read is None.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

from compaction_bench.common.paths import repo_root


def git_commit() -> dict[str, Any]:
    """`{"commit": sha or None, "dirty": bool}` of the checkout (tracked files only)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo_root(), capture_output=True,
                                  text=True, check=False, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (None where the OS has none): on a shared
    machine, how busy it was while something was measured."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    """Host name, OS, Python, CPU model, the CPUs this process may run on, the load now."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": sys.version.split()[0], "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "cpus_usable": usable, "load_average": load_average()}
