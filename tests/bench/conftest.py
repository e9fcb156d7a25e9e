"""Synthetic run folders with a known truth, written as real files in the schema-1 format."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    MetricSample,
    RequestRecord,
    write_json,
    write_records,
)

# Regime load: (time to first token in s, background requests per second, requests waiting).
LOAD = {"dedicated": (0.05, 0.0, 0.0), "shared": (0.25, 1.0, 1.0), "overloaded": (2.0, 3.0, 30.0)}


def synthetic_arms(
    rng: np.random.Generator,
    *,
    regimes: Sequence[str],
    blocks: int,
    ratios: dict[str, float],
    noise: float,
) -> list[ArmRecord]:
    """Arm records where arm/clean = ratio * exp(N(0, noise)) per block, so the true median
    paired change of each arm is exactly 100 * (ratio - 1) percent."""
    records = []
    for regime in regimes:
        for block in range(1, blocks + 1):
            clean = 60.0 * float(np.exp(rng.normal(0.0, 0.3)))
            records.append(ArmRecord(regime, block, "clean", "original", "complete", clean,
                                     rewrite_s=0.0, reasoning_tokens=1000, history_tokens=9000))
            for arm, ratio in ratios.items():
                records.append(ArmRecord(
                    regime, block, arm, "original", "complete",
                    clean * ratio * float(np.exp(rng.normal(0.0, noise))),
                    rewrite_s=3.0, reasoning_tokens=int(1000 * ratio), history_tokens=6000,
                ))
    return records


def _requests(
    rng: np.random.Generator, regime: str, block: int, source: str, start: float, length: float
) -> list[RequestRecord]:
    ttft_mean = LOAD[regime][0]
    out, t, i = [], start, 0
    while t < start + length:
        ttft = float(rng.exponential(ttft_mean))
        chunks = tuple(t + ttft + 0.02 * k + float(rng.exponential(0.005)) for k in range(40))
        prompt = 4000 + 300 * i
        out.append(RequestRecord(
            regime=regime, source=source, request_id=f"{regime}-{block}-{source}-{i}",
            sent_s=t + 0.001, status="ok", block=block, intended_send_s=t,
            first_token_s=t + ttft, end_s=chunks[-1], chunk_times_s=chunks,
            prompt_tokens=prompt, cached_tokens=int(prompt * (0.9 if source == "clean" else 0.6)),
            completion_tokens=40,
        ))
        t, i = chunks[-1] + 1.0, i + 1
    return out


def write_synthetic_run(
    path: Path,
    *,
    seed: int = 0,
    regimes: Sequence[str] = ("dedicated", "shared", "overloaded"),
    blocks: int = 6,
    ratios: dict[str, float] | None = None,
    noise: float = 0.1,
    task: str = "demo-task",
    serving: bool = True,
) -> Path:
    """Write a complete run folder; with `serving`, also requests and /metrics samples."""
    rng = np.random.default_rng(seed)
    ratios = ratios if ratios is not None else {"external": 0.8, "self": 0.75}
    arms = synthetic_arms(rng, regimes=regimes, blocks=blocks, ratios=ratios, noise=noise)
    block_records, requests, metrics = [], [], []
    t, hits, queries = 0.0, 0.0, 0.0
    for regime in regimes:
        for block in range(1, blocks + 1):
            own = [a for a in arms if (a.regime, a.block) == (regime, block)]
            order = [a.arm for a in own]
            rng.shuffle(order)
            length = max(a.postfork_s for a in own)
            block_records.append(BlockRecord(regime, block, tuple(order), t, t + length))
            if serving:
                for a in own:
                    requests += _requests(rng, regime, block, a.arm, t, a.postfork_s)
                rate = LOAD[regime][1]
                for k in range(int(rate * length / 10)):
                    requests += _requests(rng, regime, block, "background", t + 10 * k, 5.0)
                for second in range(int(length) + 1):
                    hits, queries = hits + 900.0, queries + 1200.0
                    metrics.append(MetricSample(
                        t_s=t + second, num_requests_running=3 + LOAD[regime][1] * 4,
                        num_requests_waiting=max(0.0, LOAD[regime][2] + float(rng.normal(0, 2))),
                        kv_cache_usage=min(1.0, 0.2 + LOAD[regime][2] / 40),
                        prefix_cache_hits=hits, prefix_cache_queries=queries,
                    ))
            t += length + 5.0
    write_json(path / "manifest.json", {"run_id": path.name, "task": task,
                                        "arms": ["clean", *ratios], "profile": "synthetic"})
    write_records(path / "arms.jsonl", arms)
    write_records(path / "blocks.jsonl", block_records)
    if serving:
        write_records(path / "requests.jsonl", requests)
        write_records(path / "metrics.jsonl", metrics)
    return path


BenchCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def bench_cli() -> BenchCli:
    """`compaction-bench ...` as a user runs it (through the one error handler)."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "compaction_bench", *args],
                              capture_output=True, text=True, timeout=300, check=False)

    return run


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """Factory: make_run(name, **options) writes a synthetic run folder under tmp_path."""

    def make(name: str = "run-a", **options: object) -> Path:
        return write_synthetic_run(tmp_path / name, **options)  # type: ignore[arg-type]

    return make


@pytest.fixture
def arm_generator() -> Callable[..., list[ArmRecord]]:
    """The generator behind make_run, for tests that need many runs in memory."""
    return synthetic_arms


@pytest.fixture(scope="session")
def reported_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic run with serving records, reported once and shared read-only by tests."""
    from compaction_bench.bench.report.run_report import write_report

    run = write_synthetic_run(tmp_path_factory.mktemp("reported") / "run-r", blocks=6)
    write_report(run)
    return run
