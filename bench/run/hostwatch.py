"""Host telemetry with psutil, about every second, into `host.jsonl` (run clock): what the host's
CPUs did, and how much of it was the run's own (bench/analysis/host.py turns it into verdicts).

One line per sample: `t_s` (time.monotonic minus the run's origin), `n_cpus` (the CPUs the run
may use: this process's affinity), `busy_s` (their cumulative busy CPU seconds: everything but
idle, iowait and steal, from psutil.cpu_times), `steal_s` (cumulative steal, null where the
kernel reports none), `own_s` (the CPU seconds of the run's own processes since the first
sample), `own_processes` and `server_pids` (the served model's process-tree roots found on this
host), and `first: true` on a sampler's first line (a resumed run's counters start
afresh). Where psutil cannot read the host's counters the file gets one line
`{"t_s", "telemetry": "off", "reason"}` and nothing is sampled.

The run's own processes: this process and its descendants, plus the process tree of every
process listening on a served port of this host (the server at the run's URL, a router's
replicas, a local compressor), found with psutil.net_connections and looked up again every
`RESOLVE_S`. Their CPU time is read per process (user + system, and children_user +
children_system for the children each has reaped), so a process that ends between two samples
still counts: its parent's reaped-children time rises by its total, of which the part already
counted while it ran is taken off. A process that joins the set after it started (a server
found late) counts from then on, not for its past.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import psutil

from compaction_bench.bench.analysis.host import host_verdict, read_host
from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.periodic import Periodic

SAMPLE_S = 1.0
RESOLVE_S = 5.0  # how often the served ports' listeners are looked up again
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")


@dataclass(frozen=True)
class _Proc:
    self_s: float
    children_s: float
    ppid: int


def local_ports(urls: Iterable[str | None]) -> tuple[int, ...]:
    """The ports of the URLs that name this host (others' servers are not this host's CPU)."""
    ports = set()
    hostnames = {*LOCAL_HOSTS, _hostname()}
    for url in urls:
        if not url:
            continue
        parts = urlsplit(url if "//" in url else f"http://{url}")
        with contextlib.suppress(ValueError):
            if (parts.hostname or "") in hostnames and parts.port:
                ports.add(parts.port)
    return tuple(sorted(ports))


def _hostname() -> str:
    import socket

    return socket.gethostname()


def listeners(ports: Iterable[int]) -> tuple[int, ...]:
    """The pids listening on `ports` on this host (those psutil may see)."""
    wanted = set(ports)
    if not wanted:
        return ()
    found = set()
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet"):
            if (conn.pid and conn.laddr and conn.laddr.port in wanted
                    and conn.status == psutil.CONN_LISTEN):
                found.add(conn.pid)
    return tuple(sorted(found))


def busy_and_steal(cpus: list[int] | None) -> tuple[float, float | None]:
    """(cumulative busy CPU seconds, cumulative steal or None) over `cpus` (None: all)."""
    if cpus is None:
        rows = [psutil.cpu_times()]
    else:
        every = psutil.cpu_times(percpu=True)
        rows = [every[i] for i in cpus if i < len(every)] or [psutil.cpu_times()]
    busy = 0.0
    steal: float | None = 0.0
    for t in rows:
        idle = t.idle + getattr(t, "iowait", 0.0)
        stolen = getattr(t, "steal", None)
        # guest time is already inside user and nice on Linux: not added twice
        total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
        busy += total - idle - (stolen or 0.0)
        steal = None if stolen is None or steal is None else steal + stolen
    return busy, steal


def run_cpus() -> list[int] | None:
    """The CPUs this process may run on, where that is fewer than the host's (else None)."""
    with contextlib.suppress(AttributeError, OSError):
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < (psutil.cpu_count() or len(allowed)):
            return allowed
    return None


class HostSampler:
    """A daemon thread writing one line every `interval_s`; see the module docstring.

    `served` are the URLs whose local listeners (and their trees) are the run's own; `root` the
    process whose tree is the run's (default: this one). `own_pids()` gives the set of the
    latest sample (the GPU sampler reads it to tell the GPU's other processes).
    """

    def __init__(self, path: str | Path, *, origin: float = 0.0, interval_s: float = SAMPLE_S,
                 served: Iterable[str | None] = (), root: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writer = JsonlWriter(path)
        self.origin_s = origin
        self.clock = clock
        self.ports = local_ports(served)
        self.root = root if root is not None else os.getpid()
        self.enabled = False
        self.reason: str | None = None
        self.samples = 0
        self._cpus = run_cpus()
        self._n_cpus = len(self._cpus) if self._cpus else (psutil.cpu_count() or 1)
        self._servers: tuple[int, ...] = ()
        self._resolved_at: float | None = None
        self._prev: dict[tuple[int, float], _Proc] = {}
        self._prev_wall: float | None = None
        self._own_s = 0.0
        self._own_pids: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self.interval_s = interval_s
        self._last_t: float | None = None
        self._beat = Periodic(self._tick, interval_s=interval_s, clock=clock,
                              name="host-sampler")

    def start(self) -> HostSampler:
        try:
            busy_and_steal(self._cpus)
            psutil.Process(self.root).cpu_times()
        except (psutil.Error, OSError, AttributeError) as exc:
            self.reason = f"psutil cannot read the host's CPU counters ({type(exc).__name__}: " \
                f"{exc})"
            self.writer.write({"t_s": self.clock() - self.origin_s, "telemetry": "off",
                               "reason": self.reason})
            return self
        self.enabled = True
        self.sample_once()  # at once: the own set is known before anything reads it
        self._beat.start()
        return self

    def _tick(self) -> None:
        if self._last_t is None or self.clock() - self._last_t >= self.interval_s / 2:
            self.sample_once()

    def own_pids(self) -> frozenset[int]:
        return self._own_pids

    def _roots(self) -> tuple[int, ...]:
        now = self.clock()
        if self.ports and (self._resolved_at is None or now - self._resolved_at >= RESOLVE_S):
            self._servers = listeners(self.ports)
            self._resolved_at = now
        return (self.root, *self._servers)

    def _processes(self) -> dict[tuple[int, float], _Proc]:
        found: dict[tuple[int, float], _Proc] = {}
        for root in self._roots():
            try:
                top = psutil.Process(root)
                tree = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for p in tree:
                try:
                    with p.oneshot():
                        key = (p.pid, p.create_time())
                        if key in found:
                            continue
                        t = p.cpu_times()
                        found[key] = _Proc(t.user + t.system,
                                           t.children_user + t.children_system, p.ppid())
                except psutil.Error:
                    continue
        return found

    def sample_once(self) -> dict[str, Any] | None:
        """Take one sample now and append its line (also called at a block's end, so the
        block's verdict has a sample at its close); None where psutil failed this time."""
        with self._lock:
            try:
                wall = time.time()
                procs = self._processes()
                busy, steal = busy_and_steal(self._cpus)
            except (psutil.Error, OSError):
                return None
            t_s = self.clock() - self.origin_s
            if self._prev_wall is not None:
                self._own_s += own_delta(self._prev, procs, self._prev_wall)
            self._prev, self._prev_wall, self._last_t = procs, wall, self.clock()
            self._own_pids = frozenset(pid for pid, _ in procs)
            row = {"t_s": t_s, "n_cpus": self._n_cpus, "busy_s": busy, "steal_s": steal,
                   "own_s": self._own_s, "own_processes": len(procs),
                   "server_pids": list(self._servers),
                   # this sampler's first line: no interval reaches back past it (a resumed
                   # run's sampler starts its counters afresh)
                   **({"first": True} if self.samples == 0 else {})}
            self.writer.write(row)
            self.samples += 1
            return row

    def stop(self) -> None:
        self._beat.stop()
        if self.enabled:
            self.sample_once()  # the run's last stretch
        self.writer.close()

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def own_delta(prev: dict[tuple[int, float], _Proc], now: dict[tuple[int, float], _Proc],
              prev_wall: float) -> float:
    """The own processes' CPU seconds between two samples (module docstring): each process's
    rise, a new one's whole time (where it started after the earlier sample), and each parent's
    reaped-children rise less what its vanished children had already counted."""
    vanished: dict[int, float] = defaultdict(float)
    for key, gone in prev.items():
        if key not in now:
            vanished[gone.ppid] += gone.self_s + gone.children_s
    delta = 0.0
    for key, cur in now.items():
        old = prev.get(key)
        if old is None:
            if key[1] >= prev_wall - 0.05:  # started since: all of its time is in the interval
                delta += cur.self_s + cur.children_s
            continue
        delta += max(0.0, cur.self_s - old.self_s)
        delta += max(0.0, cur.children_s - old.children_s - vanished.get(key[0], 0.0))
    return delta


def span_host(sampler: HostSampler | None, run_dir: Path, start: float, end: float
              ) -> dict[str, Any]:
    """The host verdict over [start, end] on the run clock, as a block record or a cell's line
    carries it: one more sample first, so the span's last stretch is in it."""
    if sampler is not None and sampler.enabled:
        sampler.sample_once()
    return host_verdict(read_host(run_dir), start, end).to_json()
