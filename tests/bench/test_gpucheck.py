"""`make gpu-check` (issue 32) through the same code a GPU owner runs, on this GPU-less machine:
against the fake engine (known replies, no model), every step is a named row of gpu-check.md,
the GPU-only steps say "skipped: no GPU" in one line, a failed step does not stop the later
ones, and the exit code says whether any failed. (The fake engine's /metrics never move, so
the self-check fails on it: the row says which check and why.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess


@pytest.mark.e2e
def test_every_step_is_a_named_row_and_gpu_steps_are_skipped_without_a_gpu(
        tmp_path: Path) -> None:
    with FakeProcess(FakeConfig(ttft_ms=2, itl_ms=0.2, cached_tokens=256)) as fake:
        done = subprocess.run(
            [sys.executable, "-m", "compaction_bench", "gpu-check", "profile=cpu-tiny",
             f"base_url={fake.api_url}", "run_id=first-day", "replay_blocks=2",
             "agent_blocks=1"],
            cwd=repo_root(), capture_output=True, text=True, timeout=900, check=False,
            env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    out = tmp_path / "first-day"
    steps = {s["check"]: s for s in json.loads((out / "gpu-check.json").read_text())["steps"]}
    assert list(steps) == ["GPUs", "self-check", "replay", "NVML telemetry", "live agent"]
    assert steps["GPUs"]["status"] == "skipped: no GPU"
    assert steps["NVML telemetry"]["status"] == "skipped: no GPU"
    assert steps["self-check"]["status"] == "fail"  # the fake's counters never move
    assert "/metrics" in steps["self-check"]["detail"]
    assert steps["replay"]["status"] == "pass", steps["replay"]
    assert steps["replay"]["detail"].startswith("6/6 arm attempts complete")  # 3 arms x 2
    assert steps["live agent"]["status"] in ("pass", "fail")  # ran, after a failed step
    assert (out / "first-day-agent" / "arms.jsonl").is_file()
    text = (out / "gpu-check.md").read_text()
    assert text.startswith("# GPU check: cpu-tiny")
    assert all(f"| {name} | {s['status']} |" in text for name, s in steps.items())
    assert done.returncode == 1, done.stderr[-2000:]  # a step failed
    assert f"checklist: {out / 'gpu-check.md'}" in done.stdout
