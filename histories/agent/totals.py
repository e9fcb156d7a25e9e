"""Totals on what one box's commands may take together, where the host allows them: a cgroup of
its own (memory and processes, charged to everything the command starts, tmpfs pages included)
and a sized tmpfs mounted at the workspace (the agent's files cannot pass it; the box's /tmp and
/dev/shm are sized by bwrap, `histories.agent.view`).

Each needs the suite to be root on a host that lets it create cgroups (cgroup v1 memory and
pids controllers, or a cgroup v2 tree that delegates them) and mount tmpfs. Where one is not
possible, it is left out and `describe()` says which totals were in force and why not the
others; the per-process limits (`SandboxLimits`: address space, file size, processes of the
uid) hold on every host.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """The suite's own cgroup path per v1 controller ('' key: the v2 path)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _sweep(base: Path) -> None:
    """Remove empty cgroups left by a suite process that died before closing its boxes (a
    SIGKILLed bench): `compbench-<pid>-<n>` whose pid is gone."""
    with contextlib.suppress(OSError):
        for stale in base.glob("compbench-*-*"):
            pid = stale.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # not empty: its processes still run
                    stale.rmdir()


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Totals:
    """One cgroup per box (memory and pids), created on construction where the host allows."""

    def __init__(self, memory_bytes: int, processes: int) -> None:
        self.folders: list[Path] = []
        self.in_force: dict[str, str] = {}
        self.not_in_force: dict[str, str] = {}
        name = f"compbench-{os.getpid()}-{next(_names)}"
        own = _own_cgroups()
        v2 = (CGROUP_ROOT / "cgroup.controllers").is_file()
        # the first setting of each is the total; the others (swap) are taken where they exist
        wanted = {"memory": ({"memory.max": str(memory_bytes), "memory.swap.max": "0"} if v2
                             else {"memory.limit_in_bytes": str(memory_bytes),
                                   "memory.memsw.limit_in_bytes": str(memory_bytes),
                                   "memory.swappiness": "0"}),
                  "pids": {"pids.max": str(processes)}}
        for controller, settings in wanted.items():
            if not v2 and controller not in own:
                self.not_in_force[controller] = f"no cgroup v1 {controller} controller here"
                continue
            base = CGROUP_ROOT / (own.get("", "/") if v2 else
                                  f"{controller}/{own[controller]}").lstrip("/")
            _sweep(base)
            folder = base / name
            try:
                folder.mkdir(exist_ok=True)
                if folder not in self.folders:
                    self.folders.append(folder)
                first, *rest = settings
                _write(folder / first, settings[first])
                for key in rest:
                    with contextlib.suppress(OSError):
                        _write(folder / key, settings[key])
                self.in_force[controller] = f"cgroup {'v2' if v2 else 'v1'} {first}"
            except OSError as exc:
                self.not_in_force[controller] = (
                    f"the host does not let the suite create a {controller} cgroup under "
                    f"{base} ({exc.strerror}); run the suite as root on a host with cgroup "
                    "v1 controllers or a delegated cgroup v2 tree")

    def attach(self) -> None:
        """Move the calling process into the box's cgroups (in the child, before exec, while
        still root). Async-signal-safe enough for preexec: plain open and write."""
        for folder in self.folders:
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def close(self) -> None:
        """Remove the cgroups (their processes are gone with their PID namespace; the kernel
        may take a moment to let go of the last one)."""
        for folder in self.folders:
            for _ in range(100):
                with contextlib.suppress(OSError, ValueError):  # only the box's own are here
                    for pid in (folder / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.folders = []

    def describe(self) -> dict[str, dict[str, str]]:
        return {"in_force": dict(self.in_force), "not_in_force": dict(self.not_in_force)}


def mount_workspace(path: Path, size_bytes: int, files: int | None = None) -> str | None:
    """Mount a tmpfs of `size_bytes` (and at most `files` inodes) at `path` (an empty folder);
    None when mounted, else why not (the workspace then stays a plain folder)."""
    if os.geteuid() != 0:
        return "mounting a sized tmpfs at the workspace needs root"
    inodes = f",nr_inodes={files}" if files else ""
    done = subprocess.run(["mount", "-t", "tmpfs", "-o",
                           f"size={size_bytes}{inodes},mode=0755,nosuid,nodev",
                           "compbench-workspace",
                           str(path)], capture_output=True, text=True, timeout=30, check=False,
                          start_new_session=True)  # a Ctrl-C of the bench must not cut it
    if done.returncode != 0:
        return f"mount -t tmpfs failed: {done.stderr.strip()[:200]}"
    return None


def unmount_workspace(path: Path) -> None:
    """Unmount what `mount_workspace` mounted (its files go with it)."""
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False,
                   start_new_session=True)  # a Ctrl-C of the bench must not leave it mounted
