"""Several replicas of one profile behind vLLM's router: `make serve REPLICAS=n`.

The router listens on PORT (so BASE_URL and every command stay as for one server); replica i
(1-based) listens on PORT+1+i, since PORT+1 stays the bench's embedded compressor's. Each is a
`serve.launcher.Server` with its own log and pid file, so `make stop` stops replicas and router
alike. On the CPU engine each replica is pinned to its own share of the CPUs this process may
use (`taskset -c` and VLLM_CPU_OMP_THREADS_BIND); on a GPU profile each gets its own
`profile.gpus` GPUs (CUDA_VISIBLE_DEVICES). REPLICA_CPUS / REPLICA_CPU_QUOTA (serve.share)
give every replica the same fixed share instead, one server alone included (`server_config`).
Replicas start together and are checked one by one with the serve-time self-check; then the
router starts and is checked with one short request per session (`check_router`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.interrupt import interrupt_on
from compaction_bench.serve.endpoints import ServerEndpoints
from compaction_bench.serve.hardware import detect_gpus
from compaction_bench.serve.launcher import Server, ServerConfig, check_port
from compaction_bench.serve.router import Router, RouterConfig, routed_counts
from compaction_bench.serve.share import NO_SHARE, HostShare, cpu_list, host_share, share_cpus


class ReplicaError(SuiteError):
    """Replicas that cannot be laid out or did not answer as they should."""


def cpu_shares(replicas: int, cpus: Sequence[int]) -> list[tuple[int, ...]]:
    """The CPUs split into `replicas` contiguous, disjoint shares (the first ones get one more
    where they do not divide); refused when there are fewer CPUs than replicas."""
    ordered = sorted(cpus)
    if replicas > len(ordered):
        raise ReplicaError(f"{replicas} replicas need at least {replicas} CPUs, one each; this "
                           f"process may use {len(ordered)} ({cpu_list(tuple(ordered))}): use "
                           f"REPLICAS={len(ordered)} or fewer")
    size, extra = divmod(len(ordered), replicas)
    shares, start = [], 0
    for i in range(replicas):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(ordered[start:end]))
        start = end
    return shares


def gpu_shares(replicas: int, per_replica: int, available: int) -> list[tuple[int, ...]]:
    """GPU indices per replica: `per_replica` each, disjoint; refused when they do not fit."""
    if replicas * per_replica > available:
        raise ReplicaError(f"{replicas} replicas of a {per_replica}-GPU profile need "
                           f"{replicas * per_replica} GPUs; this machine has {available}: use "
                           f"REPLICAS={max(1, available // per_replica)} or fewer")
    return [tuple(range(i * per_replica, (i + 1) * per_replica)) for i in range(replicas)]


def replica_configs(base: ServerConfig, replicas: int, cpus: Sequence[int] | None = None,
                    share: HostShare = NO_SHARE) -> list[ServerConfig]:
    """One server config per replica: port PORT+1+i (PORT+1 is the bench's embedded
    compressor's), its own CPUs (CPU engine, or any engine under REPLICA_CPUS) or GPUs (CUDA),
    and the share's quota. `cpus`: those this process may use (default: its affinity)."""
    if replicas < 1:
        raise ReplicaError(f"REPLICAS={replicas}: give 1 or more")
    engine = base.profile.engine
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    sets = share_cpus(share, replicas, available)
    configs = [replace(base, port=base.port + i + 2, log_path=None, cpu_quota=share.cpu_quota)
               for i in range(replicas)]
    if sets is not None:  # REPLICA_CPUS: the same share whatever the number of replicas
        configs = [replace(c, cpus=s) for c, s in zip(configs, sets, strict=True)]
    elif engine == "cpu":
        configs = [replace(c, cpus=s) for c, s in zip(configs, cpu_shares(replicas, available),
                                                      strict=True)]
    if engine == "cuda":
        gpus = gpu_shares(replicas, max(1, base.profile.gpus), len(detect_gpus()))
        return [replace(c, gpu_ids=g) for c, g in zip(configs, gpus, strict=True)]
    return configs  # the fake engine: pinned only under REPLICA_CPUS


def server_config(base: ServerConfig, share: HostShare, cpus: Sequence[int] | None = None
                  ) -> ServerConfig:
    """One server (`make serve` without REPLICAS) under `share`: the CPU set and quota replica 1
    of a fleet would get; as it is where no share is given (not pinned)."""
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    sets = share_cpus(share, 1, available)
    return replace(base, cpus=sets[0] if sets else base.cpus, cpu_quota=share.cpu_quota)


@dataclass(frozen=True)
class FleetConfig:
    """`make serve REPLICAS=n ROUTER_POLICY=p`: the base server config (its port is the
    router's), how many replicas, the router's policy."""

    server: ServerConfig
    replicas: int
    policy: str
    share: HostShare = NO_SHARE  # REPLICA_CPUS / REPLICA_CPU_QUOTA; default: as before


class Fleet:
    """The replicas and the router as one thing to start, check and stop."""

    def __init__(self, config: FleetConfig, cpus: Sequence[int] | None = None) -> None:
        self.config = config
        self.servers = [Server(c) for c in replica_configs(config.server, config.replicas,
                                                            cpus, config.share)]
        base = config.server
        self.router = Router(RouterConfig(
            worker_urls=tuple(s.server_url for s in self.servers), policy=config.policy,
            host=base.host, port=base.port, ready_timeout_s=60.0))
        self.started_monotonic: float | None = None
        self.ready_s: float | None = None  # spawn of the first replica to the router's /health

    @property
    def api_url(self) -> str:
        return self.router.config.server_url + "/v1"

    def replicas(self) -> list[dict[str, Any]]:
        """Each replica's URL, pinning and share of the host, as the router's pid file and
        manifests record them."""
        return [{"url": s.server_url, "cpus": list(s.config.cpus),
                 "gpus": list(s.config.gpu_ids),
                 "host_share": host_share(s.config.cpus, s.config.cpu_quota, s.cgroup)}
                for s in self.servers]

    def start(self) -> None:
        """Start every replica, wait for all to be healthy, then start the router."""
        check_port(self.config.server.host, self.config.server.port)
        self.started_monotonic = time.monotonic()
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_ready()
            self.router.start(replicas=self.replicas())
            self.router.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - self.started_monotonic

    def stop(self) -> None:
        """Stop the router, then every replica (together). Idempotent."""
        self.router.stop()
        threads = [threading.Thread(target=s.stop, daemon=True) for s in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def exited(self) -> tuple[str, int] | None:
        """(a line naming it, its exit code) for the first process of the fleet that has
        exited, or None while all run."""
        for server in self.servers:
            if server.process is not None and server.process.poll() is not None:
                code = server.process.returncode
                return (f"replica {server.server_url} exited with code {code} (log "
                        f"{server.log_path})", code)
        process = self.router.process
        if process is not None and process.poll() is not None:
            return (f"vllm-router exited with code {process.returncode} (log "
                    f"{self.router.log_path})", process.returncode)
        return None


def check_router(fleet: Fleet, model: str, *, sessions: int | None = None,
                 api_key: str | None = None) -> list[str]:
    """Through the router: every replica listed healthy by it, and one short request per
    session (2 x replicas sessions by default) answered; returns the lines to print, with the
    requests each replica finished (its own /metrics) and the router's own count per replica.
    Raises `ReplicaError` naming what failed."""
    from compaction_bench.transport.client import send_once

    urls = [s.server_url for s in fleet.servers]
    n = sessions or 2 * len(urls)
    before = [_finished(u) for u in urls]
    failed = []
    for i in range(n):
        got = send_once(fleet.api_url, {"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": f"Router check {i}: say ok."}]},
            request_id=f"router-check-{i}", session_id=f"router-check-{i}", api_key=api_key,
            read_timeout_s=300.0)
        if not got.record.ok:
            failed.append(f"session {i}: {got.record.error}")
    if failed:
        shown = "; ".join(failed[:3])
        raise ReplicaError(f"requests through the router at {fleet.api_url} failed ({shown}); "
                           f"see {fleet.router.log_path}")
    after = [_finished(u) for u in urls]
    routed = routed_counts(fleet.router.config.prometheus_url)
    lines = [f"router {fleet.router.config.server_url} ({fleet.config.policy}): {n}/{n} "
             "requests answered, one session each"]
    for url, b, a in zip(urls, before, after, strict=True):
        served = "?" if a is None or b is None else f"{a - b:.0f}"
        lines.append(f"  replica {url}: finished {served} (its /metrics), router sent "
                     f"{routed.get(url, 0):.0f} in all")
    return lines


def _finished(url: str) -> float | None:
    with ServerEndpoints(url, timeout_s=5.0) as server:
        return server.metrics().get("requests_finished")


def serve_fleet(config: FleetConfig, *, check: Callable[[Server], object] | None = None,
                router_check: Callable[[Fleet], list[str]] | None = None) -> int:
    """`make serve REPLICAS=n`: start the fleet, self-check each replica (`check`) and the
    router (`router_check`), print the banner, and wait; Ctrl-C, SIGTERM or SIGHUP, or any
    process of the fleet exiting, stops them all. Returns the exit code for the CLI."""
    fleet = Fleet(config)
    with interrupt_on(signal.SIGTERM, signal.SIGHUP):
        try:
            names = ", ".join(
                f"{s.server_url} (CPUs {cpu_list(s.config.cpus) or 'any'}"
                + (f", quota {s.config.cpu_quota:g} CPU" if s.config.cpu_quota else "")
                + ")" for s in fleet.servers)
            print(f"== starting {config.replicas} replicas of {config.server.profile.name}: "
                  f"{names}; logs in {fleet.servers[0].log_path.parent} ==", flush=True)
            fleet.start()
            print(f"== replicas and router healthy in {fleet.ready_s:.1f} s ==", flush=True)
            for server in fleet.servers:
                if check is not None:
                    print(f"-- self-check of replica {server.server_url}", flush=True)
                    check(server)
            if router_check is not None:
                for line in router_check(fleet):
                    print(line, flush=True)
            print(f"\n== serving {config.replicas} replicas of {config.server.profile.name} "
                  f"behind vllm-router ({config.policy}) at {fleet.api_url}; Ctrl-C or `make stop` "
                  "stops them all ==", flush=True)
            while (gone := fleet.exited()) is None:
                time.sleep(0.5)
            print(f"== {gone[0]}; stopping the others ==", file=sys.stderr, flush=True)
            fleet.stop()
            return 0 if gone[1] in (0, -signal.SIGTERM) else 1  # `make stop` ends it with SIGTERM
        except KeyboardInterrupt:
            print("\n== stopping the router and the replicas ==", file=sys.stderr, flush=True)
            fleet.stop()
            return 0
        except BaseException:
            fleet.stop()
            raise

