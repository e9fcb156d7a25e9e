"""`make bench ROUTER_POLICY=a,b`: the whole run once per vLLM router policy, each through a
vllm-router the bench starts for it (a free port, retries off) in front of the same replicas
(REPLICA_URLS, or those of `make serve REPLICAS=n` on PORT), stopped after its run, on Ctrl-C
and on any error. Each policy's run is a run folder of its own, `<run-id>-<policy>`, whose
manifest records the router (`router`) and the comparison it belongs to (`routing`), so
`make report` and `RESUME` work per folder; the routing comparison
(`results/<run-id>-routing.md`) is written beside them afterwards by the `compare` the CLI
passes (bench/report/routing.py compare_policies): a document, not the run layer's.

RESUME=<run-id>-<policy> continues that policy's run through a new router of its policy;
RESUME=<run-id> with ROUTER_POLICY=a,b continues each policy's folder that exists and starts
the others.
"""

from __future__ import annotations

import functools
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from compaction_bench.bench.run.config import BenchConfig, BenchError
from compaction_bench.bench.run.session import Compare, RunKind, RunOutcome, Session
from compaction_bench.bench.run.source import SourceKind
from compaction_bench.bench.runfolder import ArmRecord, load_manifest
from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.interrupt import interrupt_on
from compaction_bench.common.net import free_port
from compaction_bench.common.paths import run_state_dir
from compaction_bench.serve.profile import Profile
from compaction_bench.serve.router import Router, RouterConfig, local_fleet, routing_key

RunOne = Callable[[BenchConfig, Callable[[RunKind], RunKind]], RunOutcome]


@dataclass(frozen=True)
class RoutedRuns:
    """What `make bench ROUTER_POLICY=...` did: each policy's outcome, in the order they ran,
    the policies not run (and why), and the comparison written (None when nothing ran)."""

    base: str
    outcomes: dict[str, RunOutcome]
    missing: dict[str, str] = field(default_factory=dict)
    comparison: Path | None = None
    text: str | None = None


class Routed:
    """A run kind (blocks, sweep, search) run through the router of one policy: the kind's own
    work, with the policy in the fingerprint (a RESUME under another policy is another run)
    and the router in the manifest."""

    def __init__(self, inner: RunKind, policy: str, fields: dict[str, Any]) -> None:
        self.inner = inner
        self.name = inner.name
        self.policy = policy
        self.fields = fields

    def adjust(self, config: BenchConfig, profile: Profile, source: SourceKind) -> BenchConfig:
        return self.inner.adjust(config, profile, source)

    def prints(self, config: BenchConfig, profile: Profile) -> dict[str, Any]:
        return {**self.inner.prints(config, profile), "router_policy": self.policy}

    def prepare(self, session: Session) -> dict[str, Any]:
        return {**self.inner.prepare(session), **self.fields}

    def run(self, session: Session) -> tuple[list[ArmRecord], str | None]:
        return self.inner.run(session)


def fleet_replicas(config: BenchConfig) -> tuple[str, ...]:
    """The replicas a per-policy router goes in front of: REPLICA_URLS, else those of the
    router `make serve REPLICAS=n` runs on PORT; one clear line when neither is there."""
    if config.replica_urls:
        return config.replica_urls
    here = (None, f"http://127.0.0.1:{config.port}", f"http://localhost:{config.port}")
    local = local_fleet(config.port) if config.base_url in here else None
    if local is not None and local[0]:
        return local[0]
    raise BenchError(
        f"ROUTER_POLICY={','.join(config.router_policy)} needs the replicas to route to, and "
        f"none are known: start them with `make serve REPLICAS=2` (PORT={config.port}), or give "
        "REPLICA_URLS=http://host:port,... of replicas already running")


def policy_runs(config: BenchConfig) -> tuple[str, list[tuple[str, BenchConfig]]]:
    """(the comparison's base id, each policy with the settings of its own run folder)."""
    results = Path(config.results_dir)
    if config.resume and (results / config.resume / "manifest.json").is_file():
        manifest = load_manifest(results / config.resume / "manifest.json")
        routing, router = manifest.get("routing"), manifest.get("router")
        if not isinstance(routing, dict) or not isinstance(router, dict):
            raise BenchError(f"RESUME={config.resume} is a run on one server, not one policy of "
                             "a routing comparison: drop ROUTER_POLICY to continue it")
        policy = str(router.get("policy"))
        if policy not in config.router_policy:
            raise BenchError(f"RESUME={config.resume} ran under router policy {policy}, not "
                             f"{','.join(config.router_policy)}: drop ROUTER_POLICY to "
                             "continue it under its own")
        return str(routing.get("base")), [(policy, config.model_copy(
            update={"router_policy": (policy,)}))]
    base = config.resume or config.run_id or (
        f"{config.regime}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    plan = []
    for policy in config.router_policy:
        child = f"{base}-{policy}"
        exists = (results / child / "manifest.json").is_file()
        if config.resume is None and (results / child).exists():
            raise BenchError(f"{results / child} exists; pass RESUME={base} (with "
                             f"ROUTER_POLICY={','.join(config.router_policy)}) to continue it")
        plan.append((policy, config.model_copy(update={
            "router_policy": (policy,), "run_id": None if exists else child,
            "resume": child if exists else None})))
    if config.resume and not any(c.resume for _, c in plan):
        raise BenchError(f"cannot resume {config.resume}: no run folder {config.resume} nor "
                         + ", ".join(f"{config.resume}-{p}" for p in config.router_policy)
                         + f" in {results}")
    return base, plan


def sibling_policies(config: BenchConfig, base: str) -> list[str]:
    """Every policy of the comparison `base` whose run folder exists, in its recorded order."""
    results = Path(config.results_dir)
    recorded: list[str] = []
    for path in sorted(results.glob(f"{base}-*/manifest.json")):
        routing = load_manifest(path).get("routing")
        if isinstance(routing, dict) and routing.get("base") == base:
            recorded = [str(p) for p in routing.get("policies") or []]
    return [p for p in recorded if (results / f"{base}-{p}" / "manifest.json").is_file()]


def run_policies(config: BenchConfig, run_one: RunOne, *, compare: Compare | None = None,
                 stream: TextIO = sys.stderr) -> RoutedRuns:
    """Each policy's run in turn through a router of its own, then `compare` writes the
    comparison (the CLI passes it; None: none written). A policy whose run failed or was
    stopped ends the sequence (the replicas may be gone); the rest are named in the comparison
    and continue with RESUME."""
    replicas = fleet_replicas(config)
    base, plan = policy_runs(config)
    outcomes: dict[str, RunOutcome] = {}
    missing: dict[str, str] = {}
    # a router between runs is stopped by `finally`, never orphaned
    with interrupt_on(signal.SIGTERM, signal.SIGHUP):
        _run_each(plan, replicas, base, config, run_one, outcomes, missing, stream)
    policies = sibling_policies(config, base)
    if not policies or compare is None:
        return RoutedRuns(base, outcomes, missing)
    results = Path(config.results_dir)
    missing.update({p: "no run folder" for p in config.router_policy
                    if p not in policies and p not in missing})
    try:
        out, text = compare(base, {p: results / f"{base}-{p}" for p in policies}, missing,
                            config.seed)
    except (OSError, SuiteError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        missing["comparison"] = f"not written: {why.splitlines()[0]}"
        return RoutedRuns(base, outcomes, missing)
    return RoutedRuns(base, outcomes, missing, out, text)


def _run_each(plan: list[tuple[str, BenchConfig]], replicas: tuple[str, ...], base: str,
              config: BenchConfig, run_one: RunOne, outcomes: dict[str, RunOutcome],
              missing: dict[str, str], stream: TextIO) -> None:
    """Each policy's run through a router of its own, filling `outcomes` and `missing`."""
    for policy, child in plan:
        if any(o.exit_code != ExitCode.OK for o in outcomes.values()):
            missing[policy] = "not run: an earlier policy's run ended early"
            continue
        router = Router(RouterConfig(worker_urls=replicas, policy=policy, port=free_port(),
                                     metrics_port=free_port(), ready_timeout_s=120.0),
                        log_path=run_state_dir() / f"router-{base}-{policy}.log")
        print(f"[bench] routing policy {policy}: vllm-router at {router.config.server_url} in "
              f"front of {', '.join(replicas)}", file=stream, flush=True)
        fields: dict[str, Any] = {
            "router": {"policy": policy, "routing_key": routing_key(policy),
                       "url": router.config.server_url, "started_by": "the bench",
                       "metrics_url": router.config.prometheus_url, "replicas": list(replicas),
                       "log": str(router.log_path)},
            "routing": {"base": base, "policies": list(config.router_policy)}}
        try:
            router.start()
            router.wait_ready()
            fields["router"]["ready_s"] = router.ready_s
            routed = child.model_copy(update={
                "base_url": router.config.server_url, "replica_urls": replicas,
                "router_metrics_url": router.config.prometheus_url})
            outcomes[policy] = run_one(routed, functools.partial(Routed, policy=policy,
                                                                  fields=fields))
        finally:
            router.stop()


def routed_outcome(runs: RoutedRuns, results: Path) -> RunOutcome:
    """The runs as one outcome for the CLI: every policy's records, `report` the `RoutedRuns`,
    aborted naming each policy that ended early, the first exit code that is not OK."""
    done = list(runs.outcomes.items())
    aborted = "; ".join(f"{p}: {o.aborted}" for p, o in done if o.aborted)
    codes = [o.exit_code for _, o in done if o.exit_code != ExitCode.OK]
    return RunOutcome(run_dir=done[0][1].run_dir if done else results,
                      records=[r for _, o in done for r in o.records], report=runs,
                      aborted=aborted or None, exit_code=codes[0] if codes else ExitCode.OK)
