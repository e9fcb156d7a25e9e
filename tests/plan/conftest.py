"""Synthetic sweep runs with a known truth, written as real run-folder files by the suite's own
writers (`write_records`, `write_json`, `JsonlWriter`), read back by the planner like any run.

Truth: at level N, postfork time = (a + b N) x exp(sigma Z), Z standard normal, so its
q-quantile is (a + b N) x exp(sigma z_q): a straight line in N, which the planner's PCHIP fit
reproduces exactly, so the only error left is sampling. The compact arm `self` shares each
clean continuation's (level, agent, index) and runs `saving` seconds shorter, saving ~
Normal(saving_mean, saving_sd), with a one-time fork rewrite of `fork_rewrite_s`: its true
break-even is fork_rewrite_s / saving_mean uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    write_json,
    write_records,
)
from compaction_bench.common.files import JsonlWriter
from compaction_bench.transport.request import RequestRecord


@dataclass(frozen=True)
class Truth:
    a: float = 20.0
    b: float = 5.0
    sigma: float = 0.25
    saving_mean: float = 4.0
    saving_sd: float = 3.0
    fork_rewrite_s: float = 6.0
    c: float = 0.0  # a quadratic term: the curve bends up past the measured levels

    def scale(self, n: float) -> float:
        return self.a + self.b * n + self.c * n * n

    def quantile(self, n: float, q: float) -> float:
        return self.scale(n) * float(np.exp(self.sigma * norm.ppf(q)))

    def agents_at(self, slo_s: float, q: float) -> float:
        """The true real-valued N whose q-quantile equals the SLO."""
        target = slo_s / float(np.exp(self.sigma * norm.ppf(q))) - self.a
        if not self.c:
            return target / self.b
        return (-self.b + float(np.sqrt(self.b ** 2 + 4 * self.c * target))) / (2 * self.c)

    @property
    def break_even_uses(self) -> float:
        return self.fork_rewrite_s / self.saving_mean


def write_sweep_run(path: Path, *, seed: int, truth: Truth = Truth(),
                    levels: tuple[int, ...] = (1, 2, 4, 8), per_level: int = 30,
                    max_num_seqs: int | None = 64, requests: bool = False, warmup: bool = True,
                    profile: str = "synthetic", power_w: float | None = None,
                    fail_above_s: float | None = None, gpus: int = 1,
                    arm_names: tuple[str, ...] = ("clean", "self"), inline_rewrite_s: float = 0.0,
                    config: dict[str, Any] | None = None,
                    fail_share: dict[int, float] | None = None,
                    censor_above_s: float | None = None) -> Path:
    """A sweep run folder (module docstring). With `requests`, every continuation gets three
    requests spanning 60% of it (duty 0.6) with 1000 + 500 k prompt tokens. With `power_w`,
    `gpu.jsonl` has two GPUs drawing power_w / 2 each, sampled every second, as NVML lines.
    With `fail_above_s`, a measured continuation whose time would exceed it fails there (the
    arm wall limit: status failed, postfork_s = the limit), so the slowest fail at high N.
    With `inline_rewrite_s`, every measured `self` continuation waits that long for its inline
    rewriting (`rewrite_s`) besides its postfork time. `config` is the manifest's bench config
    (replicas, router policy). `fail_share` {N: share}: that share of level N's measured
    continuations (the first of each arm) fail, whatever their time. With `censor_above_s`, a
    measured continuation whose time would exceed it is stopped there as the arm wall limit
    stops one: status complete, terminal status TimeExceeded, postfork_s = the limit."""
    rng = np.random.default_rng(seed)
    arms: list[ArmRecord] = []
    blocks: list[BlockRecord] = []
    lines: list[RequestRecord] = []
    path.mkdir(parents=True, exist_ok=True)
    cells = JsonlWriter(path / "sweep.jsonl")
    t = 0.0
    for level in levels:
        agents = min(level, per_level)
        per_agent = -(-per_level // agents)
        times = [truth.scale(level) * float(np.exp(truth.sigma * rng.normal()))
                 for _ in range(agents * per_agent)]
        savings = rng.normal(truth.saving_mean, truth.saving_sd, size=len(times))
        for arm in arm_names:
            start = t
            for i in range(agents):
                for k in range(per_agent + (1 if warmup else 0)):
                    phase = "warmup" if warmup and k == 0 else "measured"
                    j = i * per_agent + (k - 1 if warmup else k)
                    base = times[j] if phase == "measured" else truth.a
                    postfork = base - (savings[j] if arm == "self" and phase == "measured"
                                       else 0.0)
                    block = (level * 10_000 + i) * 10_000 + k + 1
                    failed = (fail_above_s is not None and postfork > fail_above_s) or (
                        phase == "measured" and j < (fail_share or {}).get(level, 0.0)
                        * agents * per_agent)
                    postfork = min(postfork, fail_above_s) if failed and fail_above_s else (
                        postfork)
                    censored = (censor_above_s is not None and phase == "measured"
                                and not failed and postfork > censor_above_s)
                    postfork = min(postfork, censor_above_s) if censored and censor_above_s \
                        else postfork
                    arms.append(ArmRecord(
                        regime="sweep", block=block, arm=arm, attempt="original",
                        status="failed" if failed else "complete", postfork_s=postfork,
                        terminal_status="TimeExceeded" if censored else None,
                        rewrite_s=inline_rewrite_s if arm == "self" and phase == "measured"
                        else 0.0,
                        started_s=t, ended_s=t + postfork, level=level, sweep_agent=i,
                        sweep_index=k, sweep_phase=phase,
                        fork_rewrite_s=truth.fork_rewrite_s if arm == "self" else None))
                    blocks.append(BlockRecord("sweep", block, (arm,), t, t + postfork))
                    if requests:
                        for r in range(3):
                            sent = t + postfork * (0.05 + 0.3 * r)
                            lines.append(RequestRecord(
                                request_id=f"{arm}-{block}-{r}", sent_s=sent, status="ok",
                                source=arm, regime="sweep", block=block, end_s=sent + 0.2
                                * postfork, first_token_s=sent + 0.01,
                                prompt_tokens=1000 + 500 * r, cached_tokens=900,
                                completion_tokens=100, labels={
                                    "attempt": "original", "level": level,
                                    "sweep_phase": phase}))
                    t += postfork / agents
            cells.write({"arm": arm, "level": level, "agents": agents, "cell_pass": 1,
                         "status": "done", "started_s": start, "ended_s": t,
                         "measured_window_s": [start, t]})
    cells.close()
    write_json(path / "manifest.json", {
        "run_id": path.name, "task": "synthetic", "arms": list(arm_names), "profile": profile,
        "config": config or {},
        "regime": {"name": "sweep", "max_num_seqs": max_num_seqs},
        "server": {"profile": {"name": profile, "engine": "fake", "gpus": gpus,
                               "engine_args": {"max_num_seqs": max_num_seqs}}},
        "sweep": {"levels": list(levels),
                  "server_cache_config": {"num_gpu_blocks": "100", "block_size": "128"}}})
    write_records(path / "arms.jsonl", arms)
    write_records(path / "blocks.jsonl", blocks)
    if requests:
        write_records(path / "requests.jsonl", lines)
    if power_w is not None:
        with JsonlWriter(path / "gpu.jsonl") as gpu:
            for second in range(int(t) + 2):
                for index in (0, 1):
                    gpu.write({"t_s": float(second), "gpu": index, "name": "NVIDIA H200",
                               "power_w": power_w / 2, "energy_j": None})
    return path


@pytest.fixture
def truth() -> Truth:
    return Truth()


@pytest.fixture
def make_sweep(tmp_path: Path) -> Callable[..., Path]:
    """Factory: make_sweep(name, seed=..., **options) writes a synthetic sweep run folder."""

    def make(name: str = "sweep", **options: Any) -> Path:
        options.setdefault("seed", 0)
        return write_sweep_run(tmp_path / name, **options)

    return make


CHECK_URLS = ["http://127.0.0.1:18402", "http://127.0.0.1:18403"]


@pytest.fixture
def plan_and_check(truth: Truth, make_sweep: Callable[..., Path]
                   ) -> Callable[..., tuple[Any, Path]]:
    """Factory: a one-replica sweep planned at an SLO its truth meets at N = 5.5 (the plan's
    config; `before_plan` may edit the sweep's folder first), and a two-replica round_robin check
    run at twice the planned agents."""

    def make(before_plan: Callable[[Path], object] = lambda _: None) -> tuple[Any, Path]:
        from compaction_bench.plan.planner import build_plan
        from compaction_bench.plan.settings import PlanConfig

        plan_run = make_sweep("plan", seed=1)
        before_plan(plan_run)
        config = PlanConfig(run_dir=plan_run,
                            slo=f"p90:{truth.quantile(5.5, 0.9)}s", bootstrap=200, plots=False)
        agents = build_plan(config).capacity["clean"].agents
        assert agents is not None
        check = make_sweep("fleet-round_robin", seed=2, truth=type(truth)(b=truth.b / 2),
                           levels=(2 * agents,), per_level=60,
                           config={"replica_urls": CHECK_URLS, "router_policy": ["round_robin"]})
        return config, check

    return make
