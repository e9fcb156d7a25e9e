"""What runs beside the blocks: the self-check and the service probe before them, then server
metrics, GPU samplers and the background users with a monitor sampling their state."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.analysis.host import HOST_FILE
from compaction_bench.bench.run.config import (
    BenchConfig,
)
from compaction_bench.bench.run.hostwatch import HostSampler
from compaction_bench.bench.runfolder import (
    write_json,
)
from compaction_bench.common.files import JsonlWriter
from compaction_bench.loadgen.background import BackgroundLoad, ServiceProbe
from compaction_bench.loadgen.metrics import MetricsSampler
from compaction_bench.loadgen.replica_metrics import (
    REPLICA_METRICS,
    ReplicaSampler,
    ReplicaTargets,
)
from compaction_bench.serve.profile import Profile

LOAD_SAMPLE_S = 0.5  # how often the monitor samples the background load's state
# How long the master waits for LOCUST_REMOTE_WORKERS to connect: time for a person to log in
# to each host and start its worker by hand.
REMOTE_WAIT_S = 600.0


class LoadMonitor:
    """Samples the background load's state twice a second into `load.jsonl` (run clock)."""

    def __init__(self, load: BackgroundLoad, path: Path, origin: float) -> None:
        self.load = load
        self.writer = JsonlWriter(path)
        self.origin = origin
        self.block: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(LOAD_SAMPLE_S):
            status = self.load.status()
            now = time.monotonic()
            self.writer.write({
                "t_s": now - self.origin, "block": self.block, "running": status.running,
                "users": status.users, "started": status.started, "answered": status.answered,
                "in_flight": status.in_flight, "done": status.done, "ok": status.ok,
                "errors": status.errors, "unauthorized": status.unauthorized,
                "last_ok_age_s": now - status.last_ok_t if status.last_ok_t else None})

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.writer.close()


@dataclass
class Telemetry:
    sampler: MetricsSampler
    monitor: LoadMonitor | None  # None: the regime has no background users
    host: HostSampler | None = None  # host.jsonl: the host's CPU and the run's own share


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RemoteWorkers:
    """LOCUST_REMOTE_WORKERS workers on other hosts, connecting to LOCUST_MASTER. Their records
    stay on their hosts: the run counts them as missing (`background/remote.jsonl`) until
    `compaction-bench load merge` brings them in (docs/load.md)."""

    count: int
    bind: str  # the address the master listens on, as the user gave it
    port: int
    run_dir: Path

    @property
    def connect(self) -> str:
        """HOST:PORT for the workers: this host's name where the master listens on every
        interface (a worker cannot connect to 0.0.0.0), else the address given."""
        wildcard = self.bind in ("0.0.0.0", "*", "::", "[::]", "")
        return f"{socket.gethostname() if wildcard else self.bind}:{self.port}"

    def settings(self) -> dict[str, Any]:
        return {"remote_workers": self.count, "master_host": self.bind.strip("[]"),
                "master_port": self.port, "workers_wait_s": REMOTE_WAIT_S}

    def wait_line(self) -> str:
        return (f"[bench] background load: waiting up to {REMOTE_WAIT_S:.0f} s for "
                f"{self.count} remote worker(s); start each on its host with: compaction-bench "
                f"load worker master={self.connect} out=/tmp/{self.run_dir.name}-bg-"
                # a folder per start of the load: a resumed run's workers never meet merged ones
                f"{time.strftime('%Y%m%dT%H%M%S')}")

    def unmerged_line(self) -> str:
        return (f"[bench] {self.count} remote worker(s)' background records are on their hosts, "
                f"not in {self.run_dir / 'requests.jsonl'}: copy each worker's out= folder here "
                f"and run: compaction-bench load merge {self.run_dir} DIR... workers="
                f"{self.count}; then make report RUN={self.run_dir.name}")


def remote_workers(config: BenchConfig, run_dir: Path) -> RemoteWorkers | None:
    if not config.locust_remote_workers:
        return None
    assert config.locust_master is not None  # BenchConfig refuses one without the other
    host, _, port = config.locust_master.rpartition(":")
    return RemoteWorkers(config.locust_remote_workers, host, int(port), run_dir)


@contextmanager
def run_telemetry(config: BenchConfig, url: str, run_dir: Path, origin: float, users: int,
               profile: Profile, probe: ServiceProbe | None,
               say: Callable[[str], None] = _say) -> Iterator[Telemetry]:
    """Server metrics and GPU samplers for the whole run; background users when the regime has
    any, living exactly as long as the run (started before the first block and steady before
    it begins), with a monitor sampling them. With LOCUST_REMOTE_WORKERS, `say` tells the user
    how to start them before the wait, and after the load how to merge their records."""
    from compaction_bench.loadgen.background import BackgroundConfig
    from compaction_bench.serve.gpu import GpuSampler
    from compaction_bench.transport.wire import ReplayOptions

    with ExitStack() as stack:
        replicas = replica_targets(config)
        sampler = stack.enter_context(MetricsSampler(
            url, run_dir / "metrics.jsonl", origin=origin,
            replicas=replicas.urls if replicas is not None else ()))
        if replicas is not None:
            stack.enter_context(ReplicaSampler(replicas, run_dir / REPLICA_METRICS,
                                               origin=origin))
        # the run's own processes: this one's tree and the served ports' listeners on this host
        host = stack.enter_context(HostSampler(
            run_dir / HOST_FILE, origin=origin,
            served=(url, config.external_url, *(replicas.urls if replicas else ()))))
        stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin,
                                       own_pids=host.own_pids))
        if not users:
            yield Telemetry(sampler, None, host)
            return
        # Small models without a reasoning field or tool calls get old reasoning and tool
        # calls inline as text, so background prompts keep realistic lengths. Turns whose
        # history recorded no wall time are paced by the server's measured service time.
        replay = ReplayOptions(
            reasoning="keep" if profile.model.reasoning == "native" else "inline",
            tool_calls="keep" if profile.model.tool_calls else "inline",
            measured_ttft_s=probe.ttft_s if probe else None,
            measured_tokens_per_s=probe.tokens_per_s if probe else None,
            max_completion_tokens=config.background_max_tokens)
        remote = remote_workers(config, run_dir)
        if remote is not None:
            # after the load stopped (an ExitStack unwinds last-in first-out)
            stack.callback(say, remote.unmerged_line())
            say(remote.wait_line())
        load = stack.enter_context(BackgroundLoad(BackgroundConfig(
            server_url=url, model=profile.model.target_name, users=users,
            regime=config.regime, out=run_dir / "requests.jsonl", origin=origin,
            workers=config.locust_workers, seed=config.seed, replay=replay,
            **(remote.settings() if remote is not None else {}),
            spawn_rate=max(1.0, users / 10), max_model_len=profile.engine_args.max_model_len,
            state_dir=run_dir / "background", duration_s=None,
            # each background user's cache salt is this run's (the run id and its clock
            # origin, as the arms' salts) plus the user's slot: its own prefix hits, no other
            # user's does, so N users cost what N agents do
            cache_salt=f"{run_dir.name}-{origin:.6f}-bg")))
        # with remote workers, the wait for them comes first (the master's workers_wait_s)
        load.wait_steady(timeout_s=600 + (REMOTE_WAIT_S if remote is not None else 0))
        yield Telemetry(sampler, stack.enter_context(
            LoadMonitor(load, run_dir / "load.jsonl", origin)), host)


def replica_targets(config: BenchConfig) -> ReplicaTargets | None:
    """The replicas whose /metrics the run samples: REPLICA_URLS (a router elsewhere), else
    those of `make serve REPLICAS=n` on PORT when the run measures it; None for one server."""
    from compaction_bench.serve.router import local_fleet

    here = (None, f"http://127.0.0.1:{config.port}", f"http://localhost:{config.port}")
    local = local_fleet(config.port) if config.base_url in here else None
    urls = config.replica_urls or (local[0] if local else ())
    if not urls:
        return None
    return ReplicaTargets(urls, config.router_metrics_url or (local[1] if local else None))


def measured_router(config: BenchConfig) -> dict[str, Any] | None:
    """The manifest's `router` for a run through a router the bench did not start: that of
    `make serve REPLICAS=n` on PORT (its policy from its pid file), or one elsewhere given by
    REPLICA_URLS (its policy not known here); None for a run on one server."""
    from compaction_bench.serve.process import read_pid_files, still_ours
    from compaction_bench.serve.router import local_fleet, routing_key

    targets = replica_targets(config)
    if targets is None:
        return None
    here = (None, f"http://127.0.0.1:{config.port}", f"http://localhost:{config.port}")
    local = local_fleet(config.port) if config.base_url in here else None
    policy, started_by = "not known (a router elsewhere: REPLICA_URLS)", "not the bench"
    if local is not None and local[0] == targets.urls:
        started_by = f"make serve REPLICAS={len(targets.urls)} on port {config.port}"
        for _, record in read_pid_files(config.port):
            router = record.get("router")
            if isinstance(router, dict) and still_ours(record) and router.get("policy"):
                policy = str(router["policy"])
    return {"policy": policy, "routing_key": routing_key(policy),
            "url": config.base_url or f"http://127.0.0.1:{config.port}",
            "replicas": list(targets.urls), "metrics_url": targets.router_metrics_url,
            "started_by": started_by}


def selfcheck(config: BenchConfig, url: str, profile: Profile, run_dir: Path
               ) -> dict[str, Any]:
    """The serve-time self-check before any block (serve.selfcheck): its report goes into the
    manifest; a failure stops the run here, its report kept in `selfcheck.json`."""
    if not config.selfcheck:
        return {"skipped": "SELFCHECK=0 / --no-selfcheck: the server was not checked"}
    import os

    from compaction_bench.serve.selfcheck import SelfCheckError, run_selfcheck

    # Through a router each replica is checked itself: the cache checks repeat a prompt and
    # read /metrics, and a router may send the repeat elsewhere and shows one replica's metrics.
    replicas = replica_targets(config)
    reports: dict[str, Any] = {}
    for target in replicas.urls if replicas is not None else (url,):
        try:
            report = run_selfcheck(target, profile, api_key=os.environ.get("API_KEY") or None)
        except SelfCheckError as exc:
            write_json(run_dir / "selfcheck.json", {**reports, target: exc.report.to_json()}
                       if replicas is not None else exc.report.to_json())
            raise
        reports[target] = report.to_json()
    if replicas is None:
        found: dict[str, Any] = reports[url]
        return found
    # the first replica's report where one server's stands (the replicas share the profile, so
    # its cache config is theirs: the cache-break analysis reads it), every replica's beside it
    return {**reports[replicas.urls[0]], "replicas": reports}


def service_probe(url: str, profile: Profile, users: int) -> ServiceProbe | None:
    """The server's unloaded service time, measured before the background starts (pacing)."""
    if not users:
        return None
    import os

    from compaction_bench.loadgen.background import measure_service

    return measure_service(url, profile.model.target_name, api_key=os.environ.get("API_KEY"))
