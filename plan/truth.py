"""`make fleet-truth`: the fleet plan checked against fleets whose truth is known.

Fake replicas in engine mode (loadgen/fakeengine.py: slots, a prefill priced per uncached
token, cached tokens discounted by a known amount, decode steps by batch, a prefix cache per
replica) stand in for vLLM, with settings from the command line, so the check is not tuned to
one configuration. The steps:

1. one fake replica, swept (`REGIME=sweep`, replay of the study's records) at `levels`;
2. its plan (plan.planner, with the fleet model of plan.fleetmodel) for every R in `replicas`
   and every policy, the consistent hash over the URLs the fleet will have;
3. R fake replicas behind the real vllm-router of each policy: the true capacity, the largest
   fleet N whose measured SLO quantile (failures as misses, the plan's own rule) meets the
   plan's SLO in seconds, found by measuring sweep levels through the router from the planned N
   outward (up while it holds, down while it misses, then bisecting); every measured level is
   a run folder under `out/runs/` (`R<R>-<policy>-N<N>`, every arm, since the bench pairs each
   arm with clean; one arm's search reuses the levels the other's measured);
4. the table: `policy | replicas | arm | true agents | planned agents | error | SLO held at
   planned N`, error = (planned - true) / true, signed, in Markdown (fleet-truth.md) and JSON.

The engine's capacity model is known exactly, so each fleet's capacity is a property of the
fake engines' rules and the router's real policy; what is measured is how the fleet behaves
under both, with the timing noise of this machine (the fakes sleep, they do not compute).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compaction_bench.common.files import write_json_atomic, write_text_atomic
from compaction_bench.common.markdown import table
from compaction_bench.common.paths import results_dir
from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.settings import PlanError

TRUTH_MD = "fleet-truth.md"
TRUTH_CONFIDENCE = 0.95  # of each measured level's quantile interval (the truth's range)
TRUTH_JSON = "fleet-truth.json"


class TruthConfig(BaseModel):
    """`make fleet-truth` settings (module docstring); every field has its range."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(default_factory=lambda: results_dir() / "fleet-truth",
                      description="folder for the runs and fleet-truth.md/json")
    replicas: tuple[int, ...] = Field(default=(2, 4, 8), description="fleet sizes R")
    policies: tuple[str, ...] = Field(
        default=("round_robin", "consistent_hash", "cache_aware"),
        description="vllm-router policies in front of each fleet")
    arms: tuple[str, ...] = Field(default=("clean", "external"), description="arms replayed")
    # a profile's shared regime needs one user fewer than the slots
    slots: int = Field(default=4, ge=2, le=64, description="the fake engine's sequence slots")
    prefill_ms_per_token: float = Field(default=0.2, gt=0, le=10,
                                        description="prefill cost of an uncached prompt token, ms")
    cache_discount: float = Field(default=1.0, ge=0, le=1, description="a cached token costs "
                                  "(1 - this) x the prefill cost")
    step_ms: float = Field(default=2.0, gt=0, le=100, description="a decode step's base cost, ms")
    step_ms_per_seq: float = Field(default=0.25, ge=0, le=50, description="a decode step's cost "
                                   "per running sequence, ms")
    block_tokens: int = Field(default=16, ge=1, le=1024, description="the prefix cache's block")
    slo: str = Field(default="p90:2x", description="latency target, as make plan's")
    levels: tuple[int, ...] = Field(default=(1, 2, 4, 8),
                                    description="the one-replica sweep's levels")
    min_continuations: int = Field(default=16, ge=4, le=400, description="measured "
                                   "continuations per level at least (fleets: max(this, 2N))")
    records: tuple[str, ...] = Field(default=(), description="replay records (default: the "
                                     "study's)")
    seed: int = Field(default=0, ge=0, description="run and simulator seed")
    port: int = Field(default=18600, ge=1024, le=65000,
                      description="first port of the fake replicas")

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(r < 1 or r > 16 for r in value):
            raise ValueError(f"replicas {list(value)}: each from 1 to 16 (e.g. 2,4,8)")
        return tuple(sorted(set(value)))

    @field_validator("policies")
    @classmethod
    def _policies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from compaction_bench.serve.router import offered_policies

        return offered_policies(value, "POLICIES")

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) < 2 or any(n < 1 for n in value):
            raise ValueError(f"levels {list(value)}: at least two fleet sizes of 1 or more")
        return tuple(sorted(set(value)))


def profile_text(config: TruthConfig) -> str:
    """The fake replicas' profile (serve/profiles/fake-fleet.toml with these settings)."""
    args = ["--engine", "steps", "--max-running", str(config.slots),
            "--prefill-ms-per-token", f"{config.prefill_ms_per_token:g}",
            "--cache-discount", f"{config.cache_discount:g}", "--step-ms", f"{config.step_ms:g}",
            "--step-ms-per-seq", f"{config.step_ms_per_seq:g}",
            "--block-tokens", str(config.block_tokens), "--cache-tokens", "0"]
    return "\n".join([
        "# written by make fleet-truth: the fake engine with a known capacity model",
        'name = "fake-fleet-truth"',
        'description = "fake engine replicas for make fleet-truth"', 'engine = "fake"', "",
        "[model]", 'source = "fake"', 'served_names = ["target", "compressor"]',
        'reasoning = "tagged-visible"', "tool_calls = false", "", "[engine_args]",
        f"max_num_seqs = {config.slots}", "max_model_len = 8192",
        f"block_size = {config.block_tokens}", f"extra_args = {json.dumps(args)}", "",
        "[vllm]", 'minimum = "0.25.0"', 'minimum_reason = "no vLLM runs"', 'pinned = "0.32.0"',
        'pinned_reason = "no vLLM runs"', "", "[regimes]",
        f"shared_users = {min(2, config.slots - 1)}", ""])


@dataclass
class TruthRow:
    policy: str
    replicas: int
    arm: str
    true_agents: int | None  # None: beyond the largest fleet tried
    planned_agents: int | None
    error_pct: float | None
    held_at_planned: bool | None
    planned_s: float | None  # the plan's predicted quantile at its N
    measured_at_planned_s: float | None
    slo_s: float
    measured: dict[int, float | None]  # N -> measured quantile (None: missed by failures)
    hit_rate: float | None = None  # the fleet model's later-turn hit rate at the planned N
    # N -> the measured quantile's 95% order-statistic interval (bench.run.boundary.measure)
    intervals: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def truth_range(self) -> tuple[int, int | None]:
        """Where the true capacity lies, as far as the measured levels can tell (module
        docstring): from the largest N whose interval lies wholly under the SLO to one below
        the smallest N whose interval lies wholly above it (None: no such N measured). With a
        p90 of 16-60 continuations per level the measured quantile is itself uncertain, and a
        flat curve near the SLO leaves several fleets that no measurement here can tell apart."""
        under = [n for n, (_, high) in self.intervals.items() if high <= self.slo_s]
        over = [n for n, (low, _) in self.intervals.items() if low > self.slo_s]
        top = min(over) - 1 if over else None
        low = max([n for n in under if top is None or n <= top], default=0)
        return low, top

    @property
    def planned_in_range(self) -> bool | None:
        if self.planned_agents is None:
            return None
        low, high = self.truth_range
        return low <= self.planned_agents and (high is None or self.planned_agents <= high)


class _Servers:
    """Fake replicas through the real launcher (their own process groups and pid files)."""

    def __init__(self, profile: Path, ports: list[int]) -> None:
        from compaction_bench.serve.launcher import Server, ServerConfig
        from compaction_bench.serve.profile import load_profile

        loaded = load_profile(str(profile))
        self.servers = [Server(ServerConfig(profile=loaded, port=p)) for p in ports]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(s.server_url for s in self.servers)

    def __enter__(self) -> _Servers:
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.stop()


def _sweep(config: TruthConfig, profile: Path, base_url: str, run_id: str, arms: tuple[str, ...],
           levels: tuple[int, ...], log: TextIO, replica_urls: tuple[str, ...] = (),
           metrics_url: str | None = None) -> Path:
    """One sweep run through `base_url`, in this process (bench.run.runner), into out/runs."""
    from compaction_bench.bench.run.config import BenchConfig
    from compaction_bench.bench.run.runner import run_bench
    from compaction_bench.bench.run.sweep import finished_cells

    runs = config.out / "runs"
    if (runs / run_id).is_dir():  # measured before: kept whole where every cell is done
        done, _ = finished_cells(runs / run_id)
        if all((arm, n) in done for arm in arms for n in levels):
            return runs / run_id
        # cut short: its router is gone (a new one has another port, so RESUME would refuse
        # the changed BASE_URL); the folder is kept aside, never deleted, and measured again
        aside = runs / f"{run_id}.incomplete-{time.strftime('%Y%m%dT%H%M%S')}"
        (runs / run_id).rename(aside)
        print(f"[fleet-truth] {run_id} was cut short: kept as {aside.name}, measured again",
              file=log, flush=True)
    bench = BenchConfig.model_validate({
        "regime": "sweep", "profile": str(profile), "base_url": base_url,
        "replica_urls": replica_urls, "router_metrics_url": metrics_url, "source": "replay",
        "arms": arms, "records": config.records, "run_id": run_id, "results_dir": str(runs),
        "selfcheck": False, "seed": config.seed, "sweep": {
            "levels": levels, "min_continuations": max(config.min_continuations,
                                                       2 * max(levels))}})
    run_bench(bench, stream=log)
    return runs / run_id


def _quantile_at(run_dir: Path, arm: str, level: int, quantile: float,
                 basis: str) -> tuple[float | None, tuple[float, float]]:
    """The measured SLO quantile of `arm` at `level` (failures ranked as misses; None: missed
    by failures alone), as the plan computes it (plan.capacity), and its 95% order-statistic
    interval (bench.run.boundary.measure, the search's own)."""
    from compaction_bench.bench.run.boundary import measure
    from compaction_bench.plan.capacity import sweep_levels
    from compaction_bench.plan.observations import observe

    for lv in sweep_levels(observe(run_dir)).get(arm, []):
        if lv.level == level:
            found = measure(list(lv.times(basis)), lv.failed, quantile, TRUTH_CONFIDENCE)
            ends = (found.low_s, found.high_s)
            if lv.n == 0 or lv.missed(quantile):
                return None, ends
            return float(hd_quantile(lv.times(basis), lv.rank(quantile))), ends
    raise PlanError(f"{run_dir}: no measured {arm} continuations at N={level}")


def run_truth(config: TruthConfig, log: TextIO) -> list[TruthRow]:
    """Steps 1-4 of the module docstring; returns the rows (also written to out/)."""
    from compaction_bench.common.net import free_port
    from compaction_bench.plan.fleetmodel import plan_fleet
    from compaction_bench.plan.planner import build_plan
    from compaction_bench.plan.settings import PlanConfig
    from compaction_bench.serve.router import Router, RouterConfig

    config.out.mkdir(parents=True, exist_ok=True)
    profile = config.out / "fake-engine.toml"
    write_text_atomic(profile, profile_text(config))
    print(f"[fleet-truth] one fake replica, sweep at N={','.join(map(str, config.levels))}",
          file=log, flush=True)
    with _Servers(profile, [config.port]) as one:
        one_run = _sweep(config, profile, one.urls[0], "one-replica", config.arms,
                         config.levels, log)
    plan_config = PlanConfig(run_dir=one_run, slo=config.slo, plots=False, fleet_replicas=(),
                             seed=config.seed)
    plan = build_plan(plan_config)
    q, basis = plan_config.target.quantile, plan_config.slo_time
    rows: list[TruthRow] = []
    for replicas in config.replicas:
        ports = [config.port + 10 + i for i in range(replicas)]
        with _Servers(profile, ports) as fleet:
            fleet_plan = plan_fleet(plan.observations, plan.capacity, plan_config.model_copy(
                update={"fleet_replicas": (replicas,), "fleet_policies": config.policies,
                        "replica_urls": fleet.urls}))
            assert fleet_plan is not None
            for policy in config.policies:
                router = Router(RouterConfig(worker_urls=fleet.urls, policy=policy,
                                             port=free_port(), metrics_port=free_port()),
                                log_path=config.out / f"router-{replicas}-{policy}.log")
                router.start()
                try:
                    router.wait_ready()
                    for arm in config.arms:
                        cap = plan.capacity.get(arm)
                        row = next((r for r in fleet_plan.rows if r.arm == arm
                                    and r.policy == policy), None)
                        if cap is None or row is None:
                            continue

                        def measure(n: int, arm: str = arm, policy: str = policy,
                                    router: Router = router, replicas: int = replicas
                                    ) -> tuple[float | None, tuple[float, float]]:
                            # every arm at once (the bench pairs them with clean); a level
                            # one arm's search measured serves the other's too
                            run = _sweep(config, profile, router.config.server_url,
                                         f"R{replicas}-{policy}-N{n}", config.arms, (n,), log,
                                         fleet.urls, router.config.prometheus_url)
                            return _quantile_at(run, arm, n, q, basis)

                        rows.append(_search(measure, row, cap.slo_s, replicas, policy, arm,
                                            log))
                finally:
                    router.stop()
    write_truth(config, rows)
    return rows


def _search(measure: Any, planned: Any, slo_s: float, replicas: int, policy: str, arm: str,
            log: TextIO) -> TruthRow:
    """The true capacity by measurement, from the planned N outward (module docstring)."""
    measured: dict[int, float | None] = {}
    intervals: dict[int, tuple[float, float]] = {}

    def held(n: int) -> bool:
        if n not in measured:
            measured[n], intervals[n] = measure(n)
            shown = "missed (failures)" if measured[n] is None else f"{measured[n]:.2f} s"
            print(f"[fleet-truth] {policy} x{replicas} {arm} N={n}: {shown} against the SLO "
                  f"{slo_s:.2f} s", file=log, flush=True)
        value = measured[n]
        return value is not None and value <= slo_s

    most = max(2, 4 * (planned.agents or planned.most))
    start = max(1, planned.agents or 1)
    if held(start):
        good, bad, step = start, None, 1
        while bad is None and good < most:
            nxt = min(most, good + step)
            if held(nxt):
                good, step = nxt, step * 2
            else:
                bad = nxt
    else:
        good, bad, step = 0, start, 1
        while bad - step >= 1:
            nxt = bad - step
            if held(nxt):
                good = nxt
                break
            bad, step = nxt, step * 2
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if held(mid) else (good, mid)
    true = good if bad is not None else None
    plan_n = planned.agents
    error = (None if true in (None, 0) or plan_n is None
             else (plan_n - true) / true * 100)
    at_plan = measured.get(plan_n) if plan_n else None
    return TruthRow(policy=policy, replicas=replicas, arm=arm, true_agents=true,
                    planned_agents=plan_n, error_pct=error,
                    held_at_planned=None if not plan_n else (
                        at_plan is not None and at_plan <= slo_s),
                    planned_s=planned.predicted_s, measured_at_planned_s=at_plan, slo_s=slo_s,
                    measured=dict(sorted(measured.items())), hit_rate=planned.hit_rate,
                    intervals=dict(sorted(intervals.items())))


def truth_markdown(config: TruthConfig, rows: list[TruthRow]) -> str:
    lines = ["# The fleet plan against fleets of known truth (make fleet-truth)", "",
             f"Fake engine: {config.slots} slots, prefill {config.prefill_ms_per_token:g} ms per "
             f"uncached token, cache discount {config.cache_discount:g}, decode step "
             f"{config.step_ms:g} + {config.step_ms_per_seq:g} x B ms, {config.block_tokens}-token "
             f"blocks; one replica swept at N={','.join(map(str, config.levels))} "
             f"(at least {config.min_continuations} continuations per level); SLO {config.slo}. "
             "True agents: the largest fleet whose measured quantile met the SLO through the "
             "real vllm-router (every level measured is in the measured column); error = "
             "(planned - true) / true. The truth's range: from the largest N whose measured "
             f"quantile's {100 * TRUTH_CONFIDENCE:g}% interval lies wholly under the SLO to "
             "one below the smallest N whose interval lies wholly above it (the measurements "
             "cannot tell the fleets inside it apart; open where none lay above).", ""]
    cells = [[r.policy, str(r.replicas), r.arm,
              "-" if r.true_agents is None else str(r.true_agents),
              "-" if r.planned_agents is None else str(r.planned_agents),
              "-" if r.error_pct is None else f"{r.error_pct:+.1f}%",
              "-" if r.held_at_planned is None else ("yes" if r.held_at_planned else "**no**"),
              _range(r), "-" if r.planned_in_range is None else (
                  "yes" if r.planned_in_range else "**no**"),
              _at_planned(r),
              ", ".join(f"{n}: {'miss' if v is None else f'{v:.2f}'}"
                        for n, v in r.measured.items()),
              f"{r.slo_s:.2f}"] for r in rows]
    lines += table(["policy", "replicas", "arm", "true agents", "planned agents", "error",
                    "SLO held at planned N", "truth's range", "planned in it",
                    "quantile s at planned N, predicted / measured (error)",
                    "measured quantile s by N", "SLO s"], cells)
    return "\n".join(lines) + "\n" + _summary(rows)


def quantile_error_pct(row: TruthRow) -> float | None:
    """The fleet model's quantile at the planned N against the one measured there: the
    model's own error, which a capacity in whole agents turns into 0 or 1 agent (a flat curve
    near the SLO makes a few percent an agent)."""
    if not row.planned_s or not row.measured_at_planned_s:
        return None
    return (row.planned_s - row.measured_at_planned_s) / row.measured_at_planned_s * 100


def _at_planned(row: TruthRow) -> str:
    error = quantile_error_pct(row)
    if error is None or row.planned_s is None or row.measured_at_planned_s is None:
        return "-"
    return f"{row.planned_s:.2f} / {row.measured_at_planned_s:.2f} ({error:+.1f}%)"


def _summary(rows: list[TruthRow]) -> str:
    """Counts a reader needs beside the table: the issue's bar and the quantile error."""
    if not rows:
        return ""
    met = sum(within(r) for r in rows)
    above = sum(1 for r in rows if r.error_pct is not None and r.error_pct > 0)
    below = sum(1 for r in rows if r.error_pct is not None and r.error_pct < 0)
    errors = [abs(e) for e in map(quantile_error_pct, rows) if e is not None]
    out = [f"\nWithin 5% of the truth (equal where it is under 20): {met} of {len(rows)}; "
           f"planned above it (the SLO at risk): {above}; below it (GPUs to spare): {below}."]
    if errors:
        out.append(f"The fleet model's quantile at the planned N against the measured: within "
                   f"10% in {sum(e <= 10 for e in errors)} of {len(errors)}, median absolute "
                   f"error {statistics.median(errors):.1f}%, largest {max(errors):.1f}%.")
    return " ".join(out) + "\n"


def _range(row: TruthRow) -> str:
    low, high = row.truth_range
    return f"{low}-{high}" if high is not None else f">= {low}"


def write_truth(config: TruthConfig, rows: list[TruthRow]) -> None:
    write_text_atomic(config.out / TRUTH_MD, truth_markdown(config, rows))
    write_json_atomic(config.out / TRUTH_JSON, {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": json.loads(config.model_dump_json()),
        "rows": [{**asdict(r), "measured": {str(k): v for k, v in r.measured.items()},
                  "intervals": {str(k): list(v) for k, v in r.intervals.items()},
                  "truth_range": list(r.truth_range), "planned_in_range": r.planned_in_range,
                  "quantile_error_pct": quantile_error_pct(r)}
                 for r in rows]})


def within(row: TruthRow, tolerance_pct: float = 5.0) -> bool:
    """The issue's bar: planned within 5% of the truth, or equal where the truth is small
    (under 20, where one agent is more than 5%)."""
    if row.true_agents is None or row.planned_agents is None:
        return False
    if row.true_agents < 20:
        return row.planned_agents == row.true_agents
    return abs(row.planned_agents - row.true_agents) <= math.floor(
        tolerance_pct / 100 * row.true_agents)
