"""vLLM's router (`vllm-router`, PyPI, a Rust binary in the wheel) in front of replicas.

The suite never routes by itself: the router picks a replica per request by its policy
(`--policy`), and keys `consistent_hash` on the `X-Session-Id` header the suite's client sends
per agent (transport.request.SESSION_HEADER). It answers `/health` ("All servers healthy" once
every worker is), lists its workers at `/workers`, and exports its own Prometheus counters on a
port of its own (`--prometheus-port`): `vllm_router_processed_requests_total{worker=...}` is how
many requests it sent to each replica. Its `/metrics` on the main port is one replica's, not a
sum, so per-replica figures come from each replica's own `/metrics` (loadgen.metrics).

Checked on vllm-router 0.1.17: a response names no worker (its headers are `x-request-id`
and CORS only), so a request's replica is inferred from the replicas' counters (see
`loadgen.replica_metrics`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from compaction_bench.common.net import DEFAULT_PORT, server_url
from compaction_bench.common.paths import run_state_dir
from compaction_bench.common.processtree import stop_tree
from compaction_bench.serve.errors import EngineUnavailableError, ServerStartError
from compaction_bench.serve.process import (
    pid_file,
    read_pid_files,
    rotate_log,
    still_ours,
    tail,
    write_pid_file,
)
from compaction_bench.serve.routerhash import ROUTING_KEYS, UNSUPPORTED

# the vllm-router 0.1.17 --policy choices the suite offers, each with the request field it routes
# on (serve.routerhash.ROUTING_KEYS, checked against the router); kv_aware is refused
# (routerhash.UNSUPPORTED says why)
ROUTER_POLICIES = tuple(ROUTING_KEYS)
DEFAULT_POLICY = "consistent_hash"  # one agent, one replica: its prefix stays cached


def policy_refusal(policy: str, setting: str = "ROUTER_POLICY") -> str:
    """The one line refusing a policy the suite does not offer (unknown, or unsupported),
    naming the setting it came from."""
    offered = ", ".join(ROUTER_POLICIES)
    if policy in UNSUPPORTED:
        return (f"router policy '{policy}' is not offered: it {UNSUPPORTED[policy]}; use one of "
                f"{offered} ({setting}=...)")
    return f"unknown router policy '{policy}'; use one of {offered} ({setting}=...)"


def offered_policies(value: tuple[str, ...], setting: str) -> tuple[str, ...]:
    """`value` when every policy in it is offered; else ValueError with `policy_refusal`'s
    line (the settings' one check: bench ROUTER_POLICY, plan FLEET_POLICIES, fleet-truth)."""
    if bad := [p for p in value if p not in ROUTER_POLICIES]:
        raise ValueError(policy_refusal(bad[0], setting))
    return value


def routing_key(policy: str) -> str:
    """What the router keys a chat request on under `policy` (the manifest's `routing_key`)."""
    return ROUTING_KEYS.get(policy, "not known (a policy the suite did not check)")


def router_binary() -> str:
    """The `vllm-router` executable of this Python environment (the project's dependency)."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise EngineUnavailableError("vllm-router is not installed in this Python environment; "
                                     "run `make install` (pyproject.toml depends on it)")
    return found


@dataclass(frozen=True)
class RouterConfig:
    """One router: where it listens, the replicas behind it and its policy."""

    worker_urls: tuple[str, ...]
    policy: str = DEFAULT_POLICY
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    metrics_port: int | None = None  # its own Prometheus counters; None: port + 1000
    ready_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(policy_refusal(self.policy))
        if not self.worker_urls:
            raise ValueError("a router needs at least one replica URL")

    @property
    def server_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def prometheus_port(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.port + 1000

    @property
    def prometheus_url(self) -> str:
        """Where the router's own counters are: `<this>/metrics`."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.prometheus_port}"


def router_command(config: RouterConfig, binary: str | None = None) -> list[str]:
    """The router's command line. Retries are off: a request the router re-sent to another
    replica would be measured as one request with the time of two, and double the load."""
    return [binary or router_binary(), "--host", config.host, "--port", str(config.port),
            "--worker-urls", *(server_url(u) for u in config.worker_urls),
            "--policy", config.policy, "--prometheus-host", config.host,
            "--prometheus-port", str(config.prometheus_port), "--disable-retries",
            "--worker-startup-check-interval", "1", "--log-level", "warning"]


class Router:
    """The router's process group (same life cycle as `serve.launcher.Server`: a pid file for
    `make stop`, a log, stop takes the whole tree)."""

    def __init__(self, config: RouterConfig, *, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = log_path or run_state_dir() / f"router-{config.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []
        self.ready_s: float | None = None
        self._log: IO[bytes] | None = None

    def start(self, *, replicas: list[dict[str, object]] | None = None) -> None:
        """Spawn the router; its pid file also lists the replicas (for `bench` to find)."""
        self.command = router_command(self.config)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path)
        self._log = self.log_path.open("wb")
        self._started = time.monotonic()
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        write_pid_file(self.config.port, {
            "pid": self.process.pid, "pgid": self.process.pid, "host": self.config.host,
            "port": self.config.port, "profile": f"router ({self.config.policy})",
            "router": {"policy": self.config.policy, "routing_key": routing_key(self.config.policy),
                       "metrics_url": self.config.prometheus_url,
                       "replicas": replicas or [{"url": u} for u in self.config.worker_urls]},
            "log": str(self.log_path), "started": time.time()})

    def wait_ready(self) -> None:
        """Block until `/health` answers 200 (every replica healthy to the router); raise
        `ServerStartError` quoting its log when it exits or the timeout passes."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + self.config.ready_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self.stop()
                    raise ServerStartError(
                        f"vllm-router exited with code {self.process.returncode} while "
                        f"starting (log {self.log_path}); its last lines:\n{tail(self.log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.config.server_url + "/health").status_code == 200:
                        self.ready_s = time.monotonic() - self._started
                        return
                time.sleep(0.2)
        self.stop()
        raise ServerStartError(
            f"vllm-router did not answer {self.config.server_url}/health within "
            f"{self.config.ready_timeout_s:.0f} s (log {self.log_path}); its last lines:\n"
            f"{tail(self.log_path)}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the router (idempotent)."""
        if self.process is not None:
            stop_tree(self.process, grace_s=timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(FileNotFoundError):
            pid_file(self.config.port).unlink()


def routed_counts(prometheus_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """What the router says it sent to each replica: worker URL -> requests, from its own
    `vllm_router_processed_requests_total` counter ({} when it exports none yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(prometheus_url.rstrip("/") + "/metrics", timeout=timeout_s).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm_router_processed_requests_total":
                worker = sample.labels.get("worker", "").rstrip("/")
                counts[worker] = counts.get(worker, 0.0) + float(sample.value)
    return counts


def local_fleet(port: int) -> tuple[tuple[str, ...], str] | None:
    """(replica server URLs, the router's Prometheus URL) of the router `make serve REPLICAS=n`
    runs on `port` (from its pid file), or None when no live router of ours is there."""
    for _, record in read_pid_files(port):
        router = record.get("router")
        if isinstance(router, dict) and still_ours(record):
            urls = tuple(str(r["url"]) for r in router.get("replicas", []) if r.get("url"))
            return urls, str(router.get("metrics_url") or "")
    return None
